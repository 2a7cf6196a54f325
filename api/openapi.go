// Package api holds the OpenAPI document of flashsale's HTTP API; the
// binary serves it at GET /openapi.yaml.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document (openapi.yaml), the contract of every
// route, parameter, body and error code of internal/httpapi.
//
//go:embed openapi.yaml
var OpenAPI []byte

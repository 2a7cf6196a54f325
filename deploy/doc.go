// Package deploy holds no code: its tests check the deployment files beside
// it (the Dockerfile at the repository root, the compose files, the HAProxy
// configuration) against the binary, so they cannot drift from it. Its
// dependencies (compose-go) stay out of the flashsale binary.
package deploy

package orderstore

import "errors"

// errTODO is returned by the stubs of mysql_todo_*.go.
var errTODO = errors.New("orderstore: not yet implemented on mysql")

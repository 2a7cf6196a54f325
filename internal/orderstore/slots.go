package orderstore

import "strings"

// IsTooManyConnections reports whether err is the database refusing a
// connection because its connection slots are taken (by this process or
// another client): PostgreSQL's SQLSTATE 53300 ("sorry, too many clients
// already"), MySQL/MariaDB's 1040 (ER_CON_COUNT_ERROR) and 1203
// (ER_TOO_MANY_USER_CONNECTIONS). It is transient too (IsTransient).
func IsTooManyConnections(err error) bool {
	if err == nil {
		return false
	}
	if pgCode(err) == "53300" {
		return true
	}
	if n := mysqlCode(err); n == 1040 || n == 1203 {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "too many clients") || strings.Contains(msg, "Too many connections")
}

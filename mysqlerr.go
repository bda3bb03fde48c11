package dsync

import (
	"errors"
	"slices"

	"github.com/go-sql-driver/mysql"
)

// The MySQL and MariaDB server error numbers that dsync acts on, by the
// server's name for them (ER_...). Compare errors with isErrNo, never
// with a raw number.
const (
	errTooManyConnections    uint16 = 1040 // ER_CON_COUNT_ERROR: the server refuses a new connection
	errUnknownCommand        uint16 = 1047 // ER_UNKNOWN_COM_ERROR: a Galera node not ready for queries refused the statement
	errDupEntry              uint16 = 1062 // ER_DUP_ENTRY: a row with that key exists
	errParse                 uint16 = 1064 // ER_PARSE_ERROR: the server refuses the syntax (MySQL and SET STATEMENT)
	errTableAccessDenied     uint16 = 1142 // ER_TABLEACCESS_DENIED_ERROR: the user lacks a privilege on the table
	errNoSuchTable           uint16 = 1146 // ER_NO_SUCH_TABLE
	errUnknownSystemVariable uint16 = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE: MySQL and @@in_transaction
	errLockWaitTimeout       uint16 = 1205 // ER_LOCK_WAIT_TIMEOUT: rolls back the statement
	errDeadlock              uint16 = 1213 // ER_LOCK_DEADLOCK: a deadlock or Galera certification conflict rolled the transaction back
	errNotSupportedYet       uint16 = 1235 // ER_NOT_SUPPORTED_YET
	errReadOnly              uint16 = 1290 // ER_OPTION_PREVENTS_STATEMENT: a read-only server
)

// isErrNo reports whether err is a server error with one of the numbers.
func isErrNo(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
}

// serverError reports whether err is an error reported by the server (the
// statement reached it, and the connection is usable), whatever its number.
func serverError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me)
}

// retryable reports whether a failed lock statement may simply be tried
// again: a deadlock (1213) rolled it back, a lock wait timeout (1205) ran
// out behind another statement, the server refused a connection (1040,
// too many connections: a waiter tries again paced, see waitFor), or the
// connection failed (the session's keep-alive decides when an outage has
// lasted too long). ErrOtherKind, and other server errors, such as 1290
// (read-only server) or a missing table, are configuration facts and are
// returned to the caller.
func retryable(err error) bool {
	if !serverError(err) {
		return !errors.Is(err, ErrOtherKind) // which no retry changes
	}
	return isErrNo(err, rolledBack...) || isErrNo(err, errTooManyConnections)
}

// rolledBack are the server errors after which a single statement (or
// dsync's own one transaction) had no effect and may simply run again:
// 1213, a deadlock, or on a Galera cluster a certification conflict, which
// rolls back the whole transaction; 1205, a lock wait timeout, which rolls
// back the statement (dsync's statements are one per transaction); 1047, a
// Galera node that is not ready for queries (joining, or cut off from the
// majority), which refused the statement before running it.
var rolledBack = []uint16{errDeadlock, errLockWaitTimeout, errUnknownCommand}

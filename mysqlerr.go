package dsync

import (
	"errors"
	"slices"

	"github.com/go-sql-driver/mysql"
)

// isErrNo reports whether err is a server error with one of the numbers.
func isErrNo(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
}

// retryable reports whether a failed lock statement may simply be tried
// again: a deadlock (1213) rolled it back, a lock wait timeout (1205) ran
// out behind another statement, or the connection failed (the session's
// keep-alive decides when an outage has lasted too long). ErrOtherKind,
// and other server errors, such as 1290 (read-only server) or a missing table, are
// configuration facts and are returned to the caller.
func retryable(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return !errors.Is(err, ErrOtherKind) // which no retry changes
	}
	return slices.Contains(rolledBack, me.Number)
}

// rolledBack are the server errors after which a single statement (or
// dsync's own one transaction) had no effect and may simply run again:
// 1213, a deadlock, or on a Galera cluster a certification conflict, which
// rolls back the whole transaction; 1205, a lock wait timeout, which rolls
// back the statement (dsync's statements are one per transaction); 1047, a
// Galera node that is not ready for queries (joining, or cut off from the
// majority), which refused the statement before running it.
var rolledBack = []uint16{1213, 1205, 1047}

package dsync

import (
	"context"
	"database/sql"

	"github.com/dsynclock/dsync/internal/connpool"
)

// The Mutex row's statements: taking and freeing the lock row.

// How acquireRow tries a lock row.
type rowMode int

const (
	rowFull  rowMode = iota // qLockAcquire, whatever state the row is in
	rowFast                 // qLockAcquireFast: an existing, free, unclaimed row
	rowWoken                // qLockAcquireFast, waiting up to a second for the row lock (briefWaitSQL)
)

// acquireRow makes one attempt to take the lock row for name, with the
// statement mode says: the cheap one for a row that exists and is free (a
// miss then says nothing about the row), or the one that handles every
// state of the row. Neither waits for a transaction holding the row (see
// execNoWait; rowWoken waits a second at most): that counts as held. It
// returns the new fence, or 0 when not taken. Its outcome is unknown when
// the statement failed other than by a server error (the connection
// broke, ctx ended): then the attempt is undone (see undo) before the
// error is returned, so that no row is left held without a holder. A
// name that the queued locks use gives ErrOtherKind.
func (s *Session) acquireRow(ctx context.Context, name string, token int64, mode rowMode) (int64, error) {
	var res sql.Result
	var err error
	switch mode {
	case rowFast:
		res, err = s.execNoWait(ctx, sLockAcquireFast, sLockAcquireFastNoWait, s.id, token, name, s.id)
	case rowWoken:
		res, err = s.execNoWaitN(ctx, sLockAcquireFast, sLockAcquireFastBrief, 0, s.id, token, name, s.id)
	default:
		res, err = s.execNoWait(ctx, sLockAcquire, sLockAcquireNoWait, name, s.id, token, s.id, -s.id, token, s.id)
	}
	if isErrNo(err, 1205) {
		return 0, nil // a transaction holds it (LockTx)
	}
	if err != nil {
		if !connpool.Reusable(err) || ctx.Err() != nil {
			s.undo(ctx, orphan{name: name, token: token})
		}
		return 0, err
	}
	fence, err := res.LastInsertId()
	if fence == otherKind {
		return 0, otherKindError(kindRowQueued) // see "One name, one kind" in queries.go
	}
	return fence, err
}

// noWaitLockWaits is how often execNoWait runs a statement again after it
// met a locked row: a row written by another statement is free again
// within a millisecond or two (see retryRolledBackN's back-off), one held by
// a transaction (Mutex.LockTx) is not.
const noWaitLockWaits = 2

// releaseRow frees the row for name if this acquisition (token) holds it,
// and reports whether it did (and rings the doorbell when sessions wait
// for it).
func (s *Session) releaseRow(ctx context.Context, name string, token int64) (bool, error) {
	return s.free(ctx, orphan{name: name, token: token})
}

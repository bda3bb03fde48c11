package dsync

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

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

// freeRinging frees the Mutex row o as free does, but on the doorbell's
// connection, with the ring in the same statement when sessions wait for
// the row (qLockReleaseRing): a woken waiter's statement is then on its
// way while the release commits, a statement sooner than a ring after the
// release. The goroutine publishes the new generation.
//
// ran is false when the statement had no effect and the caller must free
// o as before, on a pool connection: o is a ticket; the session is ending
// or closing; ctx has ended; the doorbell is not taken, or its connection
// is in use, or was dropped by the server while idle; or the statement
// was not sent, or met the row locked for a second (it waits no longer,
// so that it never holds up the doorbell goroutine). When the statement
// failed otherwise, ran is true with its error, and the connection (with
// its doorbell, which wakes the waiters) is dropped for a new one.
func (s *Session) freeRinging(ctx context.Context, o orphan) (ran bool, res sql.Result, err error) {
	if o.ticket {
		return false, nil, nil
	}
	stmt := s.ringInStmt()
	ran = s.bell.ringIn(ctx, stmt, func(ctx context.Context, st *sql.Stmt, next, cur string) ringResult {
		res, err = retryRolledBackN(ctx, func() (sql.Result, error) {
			return st.ExecContext(ctx, next, next, cur, o.name, s.id, o.token)
		}, 0)
		rang := int64(0)
		if err == nil {
			if n, _ := res.RowsAffected(); n > 0 {
				rang, _ = res.LastInsertId()
			}
		}
		switch {
		case stmt == sLockReleaseRingBrief && s.noWaitRefused(err), isErrNo(err, 1205):
			// Refused syntax, or the row locked for a second: the
			// statement did nothing.
			res, err = nil, nil
			return ringNotRun
		case errors.Is(err, driver.ErrBadConn):
			res, err = nil, nil
			return ringBadConn // nothing was sent
		case err != nil || rang == 1:
			// The statement failed, maybe after it rang, or it rang
			// without taking the next generation.
			return ringBroken
		case rang == 2:
			return ringRang
		}
		return ringNone
	})
	return ran, res, err
}

// ringInStmt is the statement that freeRinging runs on the doorbell's
// connection (qLockReleaseRing, or its variant that waits a second at
// most for the row lock); takeBell prepares it on a new doorbell
// connection.
func (s *Session) ringInStmt() stmtIndex {
	return s.noWait(sLockReleaseRing, sLockReleaseRingBrief)
}

// lockBell reads who a waiter of the Mutex row name waits for (qLockBell):
// that session's doorbell, how long its lease has left in microseconds,
// and the row's fence (0 when the row is missing); sql.ErrNoRows when
// nobody live holds or claimed the row.
func (s *Session) lockBell(ctx context.Context, name string) (ref bellRef, left, fence int64, err error) {
	var id, gen, until sql.NullInt64
	err = s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		return s.query(ctx, c, sLockBell, []any{s.id, name}, &fence, &id, &gen, &until)
	})
	if err == nil && !id.Valid {
		err = sql.ErrNoRows
	}
	return bellRef{id.Int64, gen.Int64}, until.Int64, fence, err
}

// claimRow claims the next hold of the Mutex row name for this session
// for claimFor, or renews its claim (qLockClaim), without waiting for a
// transaction that holds the row, and reports whether the claim is its
// own now.
func (s *Session) claimRow(ctx context.Context, name string, claimFor time.Duration) (bool, error) {
	return s.execNoWaitChanged(ctx, sLockClaim, sLockClaimNoWait, s.id, claimFor.Microseconds(), name, s.id)
}

// unclaimRow drops this session's claim on the next hold of the Mutex row
// name (qLockUnclaim), and reports whether there was one.
func (s *Session) unclaimRow(ctx context.Context, name string) (bool, error) {
	return s.execNoWaitChanged(ctx, sLockUnclaim, sLockUnclaimNoWait, name, s.id)
}

// wantRow says that this session waits for the Mutex row name, for want,
// having waited waited (qLockWant; the longest waiter claims the next
// hold), without waiting for a transaction that holds the row: a 1205
// error then, and the row's wanted_until may not be written.
func (s *Session) wantRow(ctx context.Context, name string, want, waited time.Duration) error {
	w, d := want.Microseconds(), waited.Microseconds()
	_, err := s.execNoWait(ctx, sLockWant, sLockWantNoWait, w, s.id, d, s.id, s.id, w, s.id, d, name)
	return err
}

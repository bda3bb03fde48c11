package dsync

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// The Mutex row's statements: taking and freeing the lock row. They run
// on the session's store and return what they found; the Mutex (mutex.go,
// locktx.go) and the session's free (orphans.go) decide what to undo.

// lockRows runs the Mutex row's statements for one session. NewSession
// makes it once the lease is taken.
type lockRows struct {
	st   *store
	id   int64     // the session's lease id
	bell *doorbell // the session's doorbell, which a release rings
}

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
// returns the new fence, or 0 when not taken. Its outcome is unknown
// (unknown is set, with the error) when the statement failed other than
// by a server error (the connection broke, ctx ended): the row may be
// held without a holder then, and the caller undoes the attempt (see
// undo) before it returns the error. A name that the queued locks use
// gives ErrOtherKind. waited says that the call waited for the lock (said
// so, or claimed it): the hold then keeps the row's wants (see
// qCreateLock).
func (r *lockRows) acquireRow(ctx context.Context, name string, token int64, mode rowMode, waited bool) (fence int64, unknown bool, err error) {
	var res sql.Result
	w := 0 // see qCreateLock, wanted_until
	if waited {
		w = 1
	}
	switch mode {
	case rowFast:
		res, err = r.st.execNoWait(ctx, sLockAcquireFast, sLockAcquireFastNoWait, r.id, token, w, name, r.id)
	case rowWoken:
		res, err = r.st.execNoWaitN(ctx, sLockAcquireFast, sLockAcquireFastBrief, 0, r.id, token, w, name, r.id)
	default:
		res, err = r.st.execNoWait(ctx, sLockAcquire, sLockAcquireNoWait, name, r.id, token, r.id, -r.id, token, w, r.id)
	}
	if isErrNo(err, errLockWaitTimeout) {
		return 0, false, nil // a transaction holds it (LockTx)
	}
	if err != nil {
		return 0, !connpool.Reusable(err) || ctx.Err() != nil, err
	}
	fence, err = res.LastInsertId()
	if kind, ok := otherKindOf(fence); ok {
		return 0, false, otherKindError(kind) // see "One name, one kind" in queries.go
	}
	return fence, false, err
}

// noWaitLockWaits is how often execNoWait runs a statement again after it
// met a locked row: a row written by another statement is free again
// within a millisecond or two (see retryRolledBackN's back-off), one held by
// a transaction (Mutex.LockTx) is not.
const noWaitLockWaits = 2

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
func (r *lockRows) freeRinging(ctx context.Context, o orphan) (ran bool, res sql.Result, err error) {
	if o.ticket {
		return false, nil, nil
	}
	stmt := r.ringInStmt()
	ran = r.bell.ringIn(ctx, stmt, func(ctx context.Context, st *sql.Stmt, next, cur string) ringResult {
		res, err = retryRolledBackN(ctx, func() (sql.Result, error) {
			return st.ExecContext(ctx, next, next, cur, o.name, r.id, o.token)
		}, 0)
		rang := int64(0)
		if err == nil {
			if n, _ := res.RowsAffected(); n > 0 {
				rang, _ = res.LastInsertId()
			}
		}
		switch {
		case stmt == sLockReleaseRingBrief && r.st.noWaitRefused(err), isErrNo(err, errLockWaitTimeout):
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
// most for the row lock); the doorbell (doorbell.take) prepares it on a new
// connection of its own.
func (r *lockRows) ringInStmt() stmtIndex {
	return r.st.noWait(sLockReleaseRing, sLockReleaseRingBrief)
}

// lockBell reads who a waiter of the Mutex row name waits for (qLockBell):
// that session's doorbell, how long its lease has left in microseconds,
// the row's fence (0 when the row is missing), and whether a want is
// recorded since the row was last acquired (wanted), whether that
// session is the claimant, not the holder, and whether this session holds
// the current claim (mine); sql.ErrNoRows when nobody live holds or
// claimed the row.
func (r *lockRows) lockBell(ctx context.Context, name string) (b lockBellRead, err error) {
	var id, gen, until sql.NullInt64
	var claim sql.NullBool
	err = r.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		return r.st.query(ctx, c, sLockBell, []any{r.id, r.id, name}, &b.fence, &id, &gen, &until, &b.wanted, &claim, &b.mine)
	})
	if err == nil && !id.Valid {
		err = sql.ErrNoRows
	}
	b.ref, b.left, b.claimant = bellRef{id: id.Int64, gen: gen.Int64}, until.Int64, claim.Bool
	return b, err
}

// lockBellRead is what lockBell read.
type lockBellRead struct {
	ref      bellRef // the doorbell of the session to wait for
	left     int64   // microseconds its lease has left
	fence    int64   // the row's fence; 0: no row
	wanted   bool    // a want is recorded since the row was last acquired
	claimant bool    // the session to wait for is the claimant, not the holder
	mine     bool    // the current claim is the asking session's
}

// claimRow claims the next hold of the Mutex row name for this session
// for claimFor, having waited waited (the longest waiter wins), or renews
// its claim (qLockClaim), without waiting for a transaction that holds
// the row, and reports whether the claim is its own now.
func (r *lockRows) claimRow(ctx context.Context, name string, claimFor, waited time.Duration) (bool, error) {
	d := waited.Microseconds()
	return r.st.execNoWaitChanged(ctx, sLockClaim, sLockClaimNoWait, r.id, claimFor.Microseconds(), d, name, r.id, d)
}

// unclaimRow drops this session's claim on the next hold of the Mutex row
// name (qLockUnclaim), and reports whether there was one.
func (r *lockRows) unclaimRow(ctx context.Context, name string) (bool, error) {
	return r.st.execNoWaitChanged(ctx, sLockUnclaim, sLockUnclaimNoWait, name, r.id)
}

// wantRow says that this session waits for the Mutex row name, for want,
// having waited waited (qLockWant; the longest waiter claims the next
// hold), without waiting for a transaction that holds the row: a lock
// wait timeout (errLockWaitTimeout) then, and the row's wanted_until may
// not be written.
func (r *lockRows) wantRow(ctx context.Context, name string, want, waited time.Duration) error {
	w, d := want.Microseconds(), waited.Microseconds()
	_, err := r.st.execNoWait(ctx, sLockWant, sLockWantNoWait, w, r.id, d, r.id, r.id, w, r.id, d, name)
	return err
}

// lockTaken reports whether the lock row of name is held by a live session,
// or claimed by a live waiter of another session, now (a plain read: it
// never waits for a transaction's row lock).
func (r *lockRows) lockTaken(ctx context.Context, name string) (bool, error) {
	_, err := r.lockBell(ctx, name)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

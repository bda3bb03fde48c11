package dsync

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/dsynclock/dsync/internal/connpool"
)

// The queue's statements: the per-name row, tickets and the head slot, the
// checks of a ticket's turn and its release. The policy of the queued locks
// (the local line, who polls, what to undo, the wait of createQueueRow) is
// in queue.go: these statements report an outcome that is unknown, and
// the caller undoes it.

// tickets runs the queue's statements for one session. NewSession makes
// it once the lease is taken.
type tickets struct {
	st   *store
	id   int64     // the session's lease id
	bell *doorbell // the session's doorbell, which a release rings
	// records runs the records of when a hold that waited began
	// (granted), after its call has returned.
	records background
	// createRow creates the name's queue row when a statement finds it
	// missing (the session's createQueueRow, which may wait: a wait of
	// the lock call c, see Stats): a semaphore's of limit limit, or a
	// queued lock's (limit 0).
	createRow func(ctx context.Context, c *call, name string, limit int64) error

	// busy holds the names whose last take of the head slot by this
	// session found the lock held or waited for, or whose last enqueue
	// found something ahead: the session's next exclusive Lock of such a
	// name enqueues at once instead of trying the slot first (a statement
	// that writes nothing then, but waits for the per-name row's lock
	// behind the enqueues of the others), and every enqueue of it leaves
	// its marker in the same statement (qTicketInsert), until a take of
	// the slot (a TryLock) succeeds or an enqueue finds nothing ahead. It
	// outlives the name's local state
	// (localQueue), which goes with the last hold and call of the
	// process: under contention every Lock of a session starts anew.
	busy busyNames
}

// busyNames is a set of lock names, bounded: it forgets them all when it
// is full (each one forgotten costs one statement, the slot's take, the
// next time). Safe for concurrent use.
type busyNames struct {
	mu    sync.Mutex
	names map[string]struct{} // guarded by mu
}

// maxBusyNames bounds a busyNames.
const maxBusyNames = 1024

func (b *busyNames) has(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.names[name]
	return ok
}

func (b *busyNames) set(name string, busy bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case !busy:
		delete(b.names, name)
	case b.names == nil || len(b.names) >= maxBusyNames:
		b.names = map[string]struct{}{name: {}}
	default:
		b.names[name] = struct{}{}
	}
}

// takeSlot tries to take the head slot of name for an exclusive hold
// (qQueueTake), creating the name's row when it is missing (see
// insertTicket), and returns the new fence, or 0 when the lock is held or
// tickets wait for it. After an error whose outcome is unknown (unknown
// set) the take may have landed: the caller frees the slot (see undo).
func (t *tickets) takeSlot(ctx context.Context, c *call, name string, token int64) (fence int64, unknown bool, err error) {
	for creates := 0; ; creates++ {
		res, err := t.st.exec(ctx, sQueueTake, -t.id, token, t.id, name)
		var fence int64
		if err == nil {
			fence, err = res.LastInsertId()
		}
		switch {
		case err != nil:
			return 0, !connpool.Reusable(err) || ctx.Err() != nil, err
		case fence == notAtHead:
			return 0, false, nil
		case fence > 0:
			return fence, false, nil
		case creates == maxCreates:
			return 0, false, fmt.Errorf("the row of %q in the queue table vanished %d times as it was created", name, creates)
		}
		if err := t.createRow(ctx, c, name, 0); err != nil {
			return 0, false, err
		}
	}
}

// bindQueueRow makes one attempt of createQueueRow on one connection: it
// reads the kind of the lock row that the queue row of name binds (see
// boundAs), and unless another kind uses it, binds it (with limit, a
// Semaphore's, else 0) and creates the queue row in one transaction. It returns the kind of the row (another kind than
// boundAs's: nothing was written), ErrLimitMismatch when a semaphore of
// another limit uses the name, and a lock wait timeout
// (errLockWaitTimeout) when a transaction holds the lock row.
func (t *tickets) bindQueueRow(ctx context.Context, name string, limit int64) (int, error) {
	row, want := boundAs(name)
	kind := kindRowNone
	mismatch := false
	err := t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		var err error
		if kind, err = t.lockKindOn(ctx, c, row); err != nil || (kind != kindRowNone && kind != want) {
			return err // without a write, and without waiting for a LockTx that holds the row
		}
		if hook := kindReadHook.Load(); hook != nil {
			(*hook)(name)
		}
		for {
			stmt := t.st.noWait(sQueueBind, sQueueBindNoWait)
			bind, err := c.Stmt(ctx, t.st.pool, int(stmt))
			if err != nil {
				return err
			}
			create, err := c.Stmt(ctx, t.st.pool, int(sQueueCreate))
			if err != nil {
				return err
			}
			// No retry after a lock wait timeout: createQueueRow decides.
			_, err = retryRolledBackN(ctx, func() (sql.Result, error) {
				return nil, enqueueTx(ctx, c, func() error {
					res, err := bind.ExecContext(ctx, row, want, limit)
					var bound int64
					if err == nil {
						bound, err = res.LastInsertId()
					}
					if err != nil {
						return err
					}
					if other, ok := otherKindOf(bound); ok {
						kind = other // another kind created the row since the read: nothing was written
						return nil
					}
					if bound == limitMismatch {
						mismatch = true // nothing was written
						return nil
					}
					kind = want
					_, err = create.ExecContext(ctx, name, limit)
					return err
				})
			}, 0)
			if stmt == sQueueBindNoWait && t.st.noWaitRefused(err) {
				continue // the plain statement, from now on
			}
			return err
		}
	})
	if err == nil && mismatch {
		return kind, ErrLimitMismatch
	}
	return kind, err
}

// kindReadHook, when set, runs in bindQueueRow between the read of a
// name's kind and the bind, which is where a Mutex may take a name that a
// queued lock found unbound; tests set it (see export_test.go).
var kindReadHook atomic.Pointer[func(name string)]

// lockKind reads the kind of the name's lock row (qLockKind): kindRowNone
// when it has none.
func (t *tickets) lockKind(ctx context.Context, name string) (int, error) {
	kind := kindRowNone
	err := t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		var err error
		kind, err = t.lockKindOn(ctx, c, name)
		return err
	})
	return kind, err
}

// lockKindOn is lockKind on the connection c.
func (t *tickets) lockKindOn(ctx context.Context, c *connpool.Conn, name string) (int, error) {
	st, err := c.Stmt(ctx, t.st.pool, int(sLockKind))
	if err != nil {
		return kindRowNone, err
	}
	kind := kindRowNone
	if err := st.QueryRowContext(ctx, name).Scan(&kind); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return kindRowNone, err
	}
	return kind, nil
}

// insertTicket inserts a ticket, creating the name's row when it is
// missing, and returns its number and whether the enqueue saw something
// conflicting ahead of it (a live ticket, or the head slot held; see
// qTicketInsert). With mark, a single server's enqueue also leaves the
// waiter's marker behind the nearest conflicting ticket ahead (qTicketInsert);
// without it the insert is qTicketInsertAlone, cheaper where nothing is
// ahead (a waiter then leaves its marker with qTicketWant). On the
// session's doorbell connection, when it is free, the insert takes the
// ticket's own bell instead and leaves no marker, mark or not
// (insertBelled): a waiter behind a ticket without a bell then leaves
// its marker with qTicketWant. After an error whose outcome is unknown (unknown set)
// the ticket may be in the table: the caller removes it (see undo).
//
// The name's row may go at any moment while no ticket of the name exists
// (the sweep deletes free rows, see WithFreeRowAge; so may an operator),
// and even as a ticket is being inserted (the sweep's check for tickets
// reads as of its statement's start). That is harmless: the row holds only
// counters, the line is the ticket table, and every statement that needs
// the row reports a missing one (qTicketInsert and qTicketNumber number no
// ticket, qTicketTake takes nothing); the caller then creates it again,
// seeded above every earlier fence and ticket number (qFenceSeed), and
// runs the statement again. A ticket already in the table keeps its
// number and its place. The row created here has no ticket until the
// insert, so a sweep may delete it again meanwhile; that takes a pass
// marking it and another one the free-row age later, so a few attempts
// suffice.
//
// A semaphore's ticket (wt.mode modeWeighted) is inserted with qSemInsert
// (qSemNumber on a cluster), which leaves its marker only when the ticket
// waits, whatever mark says: "conflicting ahead" then means that the live
// tickets' weights and its own add up to more than the limit.
func (t *tickets) insertTicket(ctx context.Context, c *call, name string, token int64, wt want, mark bool) (ticket int64, ahead, unknown bool, err error) {
	for creates := 0; ; creates++ {
		var number int64 // twice the ticket, plus 1 when something conflicting is ahead
		var err error
		if t.st.galera || clusterEnqueueHook.Load() {
			number, err = t.insertTicketTx(ctx, name, token, wt)
		} else {
			var res sql.Result
			switch {
			case wt.mode == modeWeighted:
				res, err = t.st.exec(ctx, sSemInsert, name, wt.weight, t.id, token, wt.weight, name, wt.limit,
					name, name, wt.limit, name, name, wt.limit, name, wt.weight, wt.limit)
			case t.insertBelled(ctx, &res, &err, name, token, wt):
				// On the doorbell's connection, with the ticket's own
				// doorbell, and no marker: the waiter leaves one
				// (qTicketWant) only if the ticket ahead has no bell.
			case mark:
				res, err = t.st.exec(ctx, sTicketInsert, wt.mode, t.id, token, wt.mode, name, name, wt.mode)
			default:
				res, err = t.st.exec(ctx, sTicketInsertAlone, wt.mode, t.id, token, wt.mode, name)
			}
			if err == nil {
				number, err = res.LastInsertId()
			}
		}
		switch {
		case err != nil:
			// On a cluster a COMMIT that failed otherwise than by a
			// conflict (a node losing quorum) may still have committed.
			return 0, false, !connpool.Reusable(err) || ctx.Err() != nil || (t.st.galera && !isErrNo(err, rolledBack...)), err
		case number > 1:
			return number / 2, number%2 == 1, false, nil
		case creates == maxCreates:
			return 0, false, false, fmt.Errorf("the row of %q in the queue table vanished %d times as it was created", name, creates)
		}
		if err := t.createRow(ctx, c, name, wt.limit); err != nil {
			return 0, false, false, err
		}
	}
}

// insertBelled enqueues with qTicketInsertBell on the session's doorbell
// connection, when it is free (see doorbell.lend), setting *res and *err,
// and reports whether it ran it. The doorbell records the bell taken (see
// doorbell.ticketFreed), so that the ticket's release lets it go; after
// an error from the server it is let go at once (the GET_LOCK outlives a
// statement rolled back). A statement that did not end cleanly drops the
// connection, and its bells with it.
func (t *tickets) insertBelled(ctx context.Context, res *sql.Result, err *error, name string, token int64, wt want) bool {
	bell := ticketBellName(t.id, token)
	ran, e := t.bell.lend(ctx, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, t.st.pool, int(sTicketInsertBell))
		if err != nil {
			return err
		}
		*res, err = retryRolledBackN(ctx, func() (sql.Result, error) {
			return st.ExecContext(ctx, wt.mode, t.id, bell, bell, token, wt.mode, name)
		}, 0)
		took := true // a statement that failed may have taken it, and rolled back
		if err == nil {
			n, _ := (*res).LastInsertId()
			took = n > 1 // 0: no row of the name, so no GET_LOCK ran
		}
		if took {
			t.bell.tookTicketBell(token)
		}
		return err
	})
	if ran {
		*err = e
		if e != nil {
			// No ticket (rolled back), or one of unknown outcome, which
			// dropped the connection and its bells already.
			t.bell.ticketFreed(token, false)
		}
	}
	return ran
}

// clusterEnqueueHook, when set (by tests), makes every session enqueue as
// on a Galera cluster (insertTicketTx), whatever the server.
var clusterEnqueueHook atomic.Bool

// insertTicketTx enqueues on a Galera cluster: the name's counter and the
// ticket in one transaction (see qTicketNumber), run again while a
// certification conflict with another node's enqueue rolls it back. It
// returns qTicketNumber's answer: twice the ticket, plus 1 when something
// conflicting is ahead, or 0 when the per-name row is missing.
func (t *tickets) insertTicketTx(ctx context.Context, name string, token int64, wt want) (int64, error) {
	var number int64
	err := t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		numberStmt, args := sTicketNumber, []any{wt.mode, name}
		if wt.mode == modeWeighted {
			numberStmt, args = sSemNumber, []any{name, wt.weight, name, wt.limit}
		}
		next, err := c.Stmt(ctx, t.st.pool, int(numberStmt))
		if err != nil {
			return err
		}
		add, err := c.Stmt(ctx, t.st.pool, int(sTicketAdd))
		if err != nil {
			return err
		}
		_, err = retryRolledBack(ctx, func() (sql.Result, error) {
			number = 0
			err := enqueueTx(ctx, c, func() error {
				res, err := next.ExecContext(ctx, args...)
				if err == nil {
					number, err = res.LastInsertId()
				}
				if err != nil || number == 0 {
					return err
				}
				_, err = add.ExecContext(ctx, name, number/2, t.id, token, wt.mode, wt.weight)
				return err
			})
			return nil, err
		})
		return err
	})
	return number, err
}

// enqueueTx runs f between BEGIN and COMMIT on c; when f or the COMMIT
// fails with a server error it rolls back (a lock wait timeout rolls back
// only the statement, not the transaction). Other errors leave the
// connection in an unknown state, and withConn's caller discards it.
func enqueueTx(ctx context.Context, c *connpool.Conn, f func() error) error {
	if _, err := c.ExecContext(ctx, "BEGIN"); err != nil {
		return err
	}
	err := f()
	if err == nil {
		_, err = c.ExecContext(ctx, "COMMIT")
		if err == nil {
			return nil
		}
	}
	if connpool.Reusable(err) {
		if _, rerr := c.ExecContext(ctx, "ROLLBACK"); rerr != nil {
			// Not a server error (%v, not %w): the connection, whose
			// transaction may still be open, is discarded, and nothing
			// retries on it.
			return fmt.Errorf("dsync: roll back an enqueue: %v (after %v)", rerr, err)
		}
	}
	return err
}

// checkTicket tells whether w holds the lock. It returns the number of
// conflicting live tickets ahead of it (at least 1 when it only knows there
// are some), and the fence when that is 0 and the ticket is exclusive. The
// first check uses what the enqueue saw (w.ahead): something conflicting
// ahead then is still there or gone now, and nothing conflicting can come
// ahead later, so a reader that saw nothing holds the lock without a
// statement. A later reader's check is a count of the writers ahead
// (readers take no fence, so it writes nothing). An exclusive ticket that
// saw nothing ahead tries to take the lock at once (qTicketTake, which
// writes only when the ticket is at the head); later checks count the
// tickets ahead, reading only, and take the lock when none is left. A
// missing per-name row (the sweep or an operator deleted it, see
// insertTicket) is created again, its fence seeded above every earlier one
// (see qFenceSeed). A semaphore's ticket (modeWeighted) skips the count:
// its take (qSemTake) decides by the weights, and writes only when it
// takes a fence, as an exclusive ticket's does.
func (t *tickets) checkTicket(ctx context.Context, c *call, name string, w *waiter, first bool) (ahead, fence int64, err error) {
	switch {
	case first && w.ahead:
		return 1, 0, nil
	case first && w.mode == modeShared:
		return 0, 0, nil
	}
	// A waiter that a doorbell woke checks with the statements that wait
	// for the release that woke it to commit (see qTicketTakeWoken): the
	// release rang before its commit.
	woken, behind := w.woken, w.behind
	w.woken = false
	switch {
	case w.mode == modeWeighted:
		// The take below decides.
	case woken && w.mode == modeShared:
		ahead, err = t.conflictsWoken(ctx, name, w.ticket, w.mode, behind)
		if err == nil && ahead == 0 {
			t.granted(name, w)
		}
		return ahead, 0, err
	case w.mode == modeShared || (!first && !woken):
		ahead, err = t.conflicts(ctx, name, 0, w.ticket, w.mode)
		if err == nil && ahead == 0 && w.mode == modeShared {
			t.granted(name, w)
		}
		if err != nil || ahead > 0 || w.mode == modeShared {
			return ahead, 0, err
		}
	}
	for creates := 0; ; creates++ {
		var res sql.Result
		var err error
		switch {
		case w.mode == modeWeighted && woken:
			res, err = t.st.exec(ctx, sSemTakeWoken, name, w.ticket, name, w.limit, behind)
		case w.mode == modeWeighted:
			res, err = t.st.exec(ctx, sSemTake, name, w.ticket, name, w.limit)
		case woken:
			res, err = t.st.exec(ctx, sTicketTakeWoken, w.ticket, name, behind)
		default:
			res, err = t.st.exec(ctx, sTicketTake, w.ticket, name)
		}
		if err != nil {
			return 0, 0, err
		}
		r, err := res.LastInsertId()
		switch {
		case err != nil:
			return 0, 0, err
		case r == notAtHead:
			return 1, 0, nil
		case r > 0:
			return 0, r, nil
		case creates == maxCreates:
			return 0, 0, fmt.Errorf("the row of %q in the queue table vanished %d times as it was created", name, creates)
		}
		if err := t.createRow(ctx, c, name, w.limit); err != nil {
			return 0, 0, err
		}
	}
}

// granted records that the shared or weighted ticket of w, which waited,
// holds the lock from now on (qTicketGranted), for ListLocks. The record
// is sent in the background, so that the call returns as soon as its turn
// came: it is a commit, which would add its time to every handoff to a
// reader (about half of it, measured: see docs/DESIGN.md, "Fairness").
// The hold does not depend on it: until it lands, or if it fails (only
// logged), the ticket's held_since stays the time of its insert, earlier
// than the hold's start, which ListLocks reports as for a ticket whose
// turn came before its holder saw it. A release that lands first leaves
// it nothing to update. It runs on a pool connection, never the
// doorbell's, which the hold's release and the session's next enqueue
// would find busy otherwise (one statement more each: a marker, a bell
// let go apart).
func (t *tickets) granted(name string, w *waiter) {
	seq, token := w.ticket, w.token
	t.records.run(func() {
		ctx := context.WithValue(t.st.stopped, poolOnlyKey{}, true)
		if _, err := t.st.exec(ctx, sTicketGranted, name, seq, t.id, token); err != nil {
			t.st.logger.Debug("dsync: record the start of a read hold failed", "lock", name, "err", err)
		}
	})
}

// maxCreates bounds how often one enqueue or turn check creates the name's
// row again (see insertTicket).
const maxCreates = 3

// conflicts counts the live tickets of name between after and before
// (exclusive) that a ticket in mode conflicts with, plus 1 for a live
// holder of the head slot.
func (t *tickets) conflicts(ctx context.Context, name string, after, before int64, mode int) (int64, error) {
	var n int64
	err := t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, t.st.pool, int(sTicketConflicts))
		if err != nil {
			return err
		}
		return st.QueryRowContext(ctx, name, after, before, mode, name).Scan(&n)
	})
	return n, err
}

// conflictsWoken is conflicts (after 0) for a shared waiter that a
// doorbell woke behind ticket behind (0: the head slot's holder): it waits
// for that release to commit before it counts (qTicketConflictsWoken).
func (t *tickets) conflictsWoken(ctx context.Context, name string, before int64, mode int, behind int64) (int64, error) {
	var n int64
	err := t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		return t.st.query(ctx, c, sTicketConflictsWoken, []any{before, mode, name, behind}, &n)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return t.conflicts(ctx, name, 0, before, mode) // no per-name row
	}
	return n, err
}

// freeTicket removes the ticket o names, or frees the head slot (o.seq
// headSlot), if this session's acquisition o.token still has it, and
// reports whether it did (see Session.free). It rings the session's
// doorbell when a waiter waits for it: a marker behind the ticket, or any
// ticket behind the slot.
func (t *tickets) freeTicket(ctx context.Context, o orphan) (bool, error) {
	if o.weight > 0 {
		// A partial Release whose shrink failed (Semaphore.Release): the
		// shrink again, idempotent; the waiters may fit now.
		shrunk, err := t.st.execChanged(ctx, sSemShrink, o.weight, o.name, t.id, o.token, o.weight)
		if shrunk {
			t.bell.ring()
		}
		return shrunk, err
	}
	if o.seq == 0 {
		// An enqueue whose outcome is unknown: no number, so no marker
		// can be found; a waiter behind it wakes within bellWait.
		return t.st.execChanged(ctx, sTicketDelete, o.name, t.id, o.token)
	}
	ran, res, err := t.freeRinging(ctx, o)
	if !ran || (err != nil && ctx.Err() == nil) {
		// Not run on the doorbell's connection, or failed there (the
		// connection went with it): free o on a pool connection. The
		// release is by token: when the statement did commit before it
		// failed, this one frees nothing (and rings, which costs the
		// waiters a check).
		ran = false
		if o.seq == headSlot {
			res, err = t.st.exec(ctx, sQueueRelease, o.name, t.id, o.token)
		} else {
			res, err = t.st.exec(ctx, sTicketRelease, o.name, t.id, o.token, o.seq+markerBase)
		}
	}
	if o.seq != headSlot && err == nil {
		// The ticket is gone (freed now, or before): its own doorbell,
		// if the doorbell's connection holds it, was let go in the
		// statement that ran there, or is let go there now. (After an
		// error the reaper frees the ticket again.)
		t.bell.ticketFreed(o.token, ran)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if ran {
		// It rang in the statement when a waiter waited.
		return err == nil && n > 0, err
	}
	if err == nil && n == 0 && o.seq == headSlot {
		// The slot was not this acquisition's, or the name's row is gone
		// (an operator deleted it with the hold in it): waiters blocked on
		// this session's doorbell for the slot would then wait bellWait,
		// so ring anyway. A ring for nothing costs them one check.
		t.bell.ring()
	}
	if err != nil || n == 0 {
		return false, err
	}
	ring := n > 1 // the ticket and a marker behind it
	if o.seq == headSlot {
		waiting, _ := res.LastInsertId()
		ring = waiting == 1
	}
	if ring {
		t.bell.ring()
	}
	return true, nil
}

// freeRinging frees the ticket or head slot o (not an enqueue of unknown
// outcome) as freeTicket does, but on the doorbell's connection, ringing
// in the same statement when a waiter waits (qQueueReleaseRing,
// qTicketReleaseRing), as lockRows.freeRinging does for a Mutex: the woken
// waiter's check is then on its way while the release commits (it waits
// for that commit, see qTicketTakeWoken), a statement sooner than a ring
// after the release. ran is false when the statement had no effect and
// the caller must free o on a pool connection: as for the Mutex (the
// session ending, ctx ended, the doorbell not taken or its connection in
// use), and also when the ticket or slot was not this acquisition's (the
// plain release then decides, and rings, as before). When the statement
// failed, ran is true with its error, and the connection (with its
// doorbell, which wakes the waiters) is dropped for a new one.
func (t *tickets) freeRinging(ctx context.Context, o orphan) (ran bool, res sql.Result, err error) {
	stmt := sTicketReleaseRing
	if o.seq == headSlot {
		stmt = sQueueReleaseRing
	}
	ran = t.bell.ringIn(ctx, stmt, func(ctx context.Context, st *sql.Stmt, next, cur string) ringResult {
		res, err = retryRolledBackN(ctx, func() (sql.Result, error) {
			if o.seq == headSlot {
				return st.ExecContext(ctx, next, next, cur, o.name, t.id, o.token)
			}
			return st.ExecContext(ctx, o.name, t.id, o.token, ticketBellName(t.id, o.token), o.seq+markerBase, t.id, next, next, cur)
		}, 0)
		switch {
		case errors.Is(err, driver.ErrBadConn):
			res, err = nil, nil
			return ringBadConn // nothing was sent
		case err != nil:
			// It failed, maybe after it rang; or (a ticket) it could
			// not take the next generation and rang nothing (see
			// qTicketReleaseRing).
			return ringBroken
		}
		n, _ := res.RowsAffected()
		switch {
		case n == 0:
			// Not this acquisition's: the plain release decides.
			res = nil
			return ringNotRun
		case o.seq != headSlot && n == 2:
			return ringRang // the ticket and its marker
		case o.seq != headSlot:
			return ringNone
		}
		switch rang, _ := res.LastInsertId(); rang {
		case 2:
			return ringRang
		case 1:
			return ringBroken // rung without taking the next generation
		}
		return ringNone
	})
	return ran, res, err
}

// ticketAhead reads whom waiter w of name waits for (qTicketAhead): the
// number of the nearest conflicting ticket ahead of it (0: none, it waits
// for the head slot's holder), the doorbell of that ticket's or holder's
// session (for a ticket, the next generation when a connection holds it
// already: a ring not yet published), how long its lease has left in
// microseconds, and whether a marker with that holder's token is behind
// the ticket already, so that its release rings (always true for the head
// slot, whose release rings whenever tickets exist); sql.ErrNoRows when
// nothing live is ahead. The read waits for a release of the ticket under
// way. own names the ticket's own doorbell when it is held (see
// qTicketInsertBell; tok 0: it has none, or it is let go, or the head
// slot is ahead). A semaphore's waiter reads whom it waits for with
// qSemAhead, which also tells whether it is the first waiter behind
// several holders (several: see Semaphore, "Waking"); several is false for
// the others, and its tickets have no own doorbells.
func (t *tickets) ticketAhead(ctx context.Context, name string, w *waiter) (seq int64, ref bellRef, left int64, marked, several bool, own bellRef, err error) {
	err = t.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		if w.mode == modeWeighted {
			return t.st.query(ctx, c, sSemAhead, []any{name, w.ticket, name, w.ticket, w.limit,
				name, w.ticket, name, w.ticket, name, w.ticket, w.limit},
				&seq, &ref.id, &ref.gen, &left, &marked, &several)
		}
		return t.st.query(ctx, c, sTicketAhead, []any{name, w.ticket, w.mode, name}, &seq, &ref.id, &ref.gen, &left, &marked, &own.tok)
	})
	if own.tok > 0 {
		own.id = ref.id
	}
	return seq, ref, left, marked, several, own, err
}

// wantTicket leaves a waiter's marker behind ticket seq of name
// (qTicketWant), so that its release rings, and reports whether the
// ticket was still there.
func (t *tickets) wantTicket(ctx context.Context, name string, seq int64) (bool, error) {
	res, err := t.st.exec(ctx, sTicketWant, name, seq)
	if err != nil {
		return false, err
	}
	there, _ := res.LastInsertId()
	return there == 1, nil
}

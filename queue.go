package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync/internal/connpool"
)

// The queued locks (FairMutex, RWMutex) share this machinery: a database
// line of tickets per name (see qCreateTicket) and, per Session and name, a
// local line that keeps the process's goroutines in their arrival order and
// lets only the first of them poll the database.

// Ticket modes, as stored in the mode column.
const (
	modeShared    = 0 // RWMutex reader
	modeExclusive = 1 // FairMutex, RWMutex writer
)

// headSlot is the ticket number that stands for a hold in the head slot
// (see qCreateQueue, qQueueTake) in a localQueue's ticket, a waiter's and an
// orphan's seq; ticket numbers are positive.
const headSlot = -1

// nextInLinePoll is how often a waiter polls when only the holder is ahead
// of it, so that a handoff to another process costs milliseconds, not a
// whole back-off period. A waiter with n tickets ahead polls every n times
// that, or as the session's back-off says when that is sooner.
const nextInLinePoll = 2 * time.Millisecond

// localQueue is the in-process state of one queued lock name in one Session.
type localQueue struct {
	// enq serializes this process's enqueues, so that its tickets are in the
	// order its goroutines arrived (goroutines blocked sending on a channel
	// are served first in, first out).
	enq chan struct{}

	mu   sync.Mutex
	line []*waiter // guarded by mu; local waiters in ticket order; line[0] polls

	hold         // guarded by mu; the exclusive hold of this process, if any
	ticket int64 // guarded by mu; the exclusive hold's ticket number, or headSlot

	// busy says that the last take of the head slot by this process found
	// the lock held or waited for: its next exclusive Lock enqueues at once
	// instead of trying the slot first, until an enqueue finds nothing
	// ahead. Guarded by mu.
	busy bool

	// The shared holds of this process (RWMutex readers), each one ticket
	// that any number of local readers may share. Guarded by mu.
	reads   []*readHold
	rOwners map[uint64]int // read holds per owner
	rAnon   int            // read holds without owner
}

// readHold is one shared ticket held by readers of this process.
type readHold struct {
	ticket, token int64
	count         int // readers sharing it
}

// waiter is a goroutine of this process with a ticket in the line.
type waiter struct {
	ticket, token int64 // ticket is headSlot for a hold in the head slot
	mode          int
	ahead         bool          // the enqueue saw a conflicting hold or ticket ahead
	front         chan struct{} // closed when the waiter is first in the local line
	kick          chan struct{} // a value means: poll now, the line may have moved
}

// enqueue gives the calling goroutine a ticket in mode and a place at the
// end of the local line. An exclusive waiter first tries the head slot
// (qQueueTake) when nothing of this process holds or waits for the lock:
// then it returns a waiter outside the line, with ticket headSlot, that
// holds the lock, and its fence. Without wait an exclusive waiter never
// takes a ticket: it returns nil (not obtained) when the slot is busy.
func (s *Session) enqueue(ctx context.Context, name string, lq *localQueue, mode int, wait bool) (*waiter, int64, error) {
	select {
	case lq.enq <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-s.done:
		return nil, 0, s.Err()
	}
	defer func() { <-lq.enq }()

	token := s.nextToken()
	if mode == modeExclusive {
		// Goroutines of this process enqueue one at a time (lq.enq), so
		// when none holds or waits, none is ahead of this one.
		lq.mu.Lock()
		idle := !lq.held && len(lq.reads) == 0 && len(lq.line) == 0
		try := idle && (!lq.busy || !wait)
		lq.mu.Unlock()
		if try {
			fence, err := s.takeSlot(ctx, name, token)
			if err != nil {
				return nil, 0, err
			}
			if fence > 0 {
				return &waiter{ticket: headSlot, token: token, mode: mode}, fence, nil
			}
			lq.mu.Lock()
			lq.busy = true
			lq.mu.Unlock()
		}
		if !wait {
			return nil, 0, nil // held or waited for: TryLock never takes a ticket
		}
	}
	ticket, ahead, err := s.insertTicket(ctx, name, token, mode)
	if err != nil {
		return nil, 0, err
	}
	w := &waiter{ticket: ticket, token: token, mode: mode, ahead: ahead, front: make(chan struct{}), kick: make(chan struct{}, 1)}
	lq.mu.Lock()
	if !ahead {
		lq.busy = false
	}
	lq.line = append(lq.line, w)
	if len(lq.line) == 1 {
		close(w.front)
	}
	lq.mu.Unlock()
	return w, 0, nil
}

// takeSlot tries to take the head slot of name for an exclusive hold
// (qQueueTake), creating the name's row when it is missing (see
// insertTicket), and returns the new fence, or 0 when the lock is held or
// tickets wait for it. After an error whose outcome is unknown it frees
// the slot if the take landed.
func (s *Session) takeSlot(ctx context.Context, name string, token int64) (int64, error) {
	for creates := 0; ; creates++ {
		res, err := s.exec(ctx, sQueueTake, -s.id, token, s.id, name)
		var fence int64
		if err == nil {
			fence, err = res.LastInsertId()
		}
		switch {
		case err != nil:
			if !connpool.Reusable(err) || ctx.Err() != nil {
				s.undo(ctx, orphan{name: name, token: token, ticket: true, seq: headSlot})
			}
			return 0, err
		case fence == notAtHead:
			return 0, nil
		case fence > 0:
			return fence, nil
		case creates == maxCreates:
			return 0, fmt.Errorf("the row of %q in the queue table vanished %d times as it was created", name, creates)
		}
		if err := s.createQueueRow(ctx, name); err != nil {
			return 0, err
		}
	}
}

// createQueueRow creates the name's queue row (qQueueCreate), unless it
// exists, in one transaction with qQueueBind, which binds the name to the
// queued locks (see "One name, one kind" in queries.go). It returns
// ErrOtherKind when a Mutex uses the name, and creates nothing then.
//
// The bind does not wait for a transaction that holds the lock row (the
// no-wait variant, see noWaitSQL): a Mutex may create the row after the
// read of its kind and hand it to a transaction (Mutex.LockTx), which
// keeps it locked until it ends. After such a lock wait timeout (1205)
// createQueueRow reads the kind again: a Mutex's name gives ErrOtherKind
// at once; else (a write of the row that has not committed yet) it binds
// again after a pause of the session's back-off, never at once.
func (s *Session) createQueueRow(ctx context.Context, name string) error {
	var b backoff.BackOff // made at the first lock wait
	var timer *time.Timer
	for {
		kind, err := s.bindQueueRow(ctx, name)
		if isErrNo(err, 1205) {
			if kind, err = s.lockKind(ctx, name); err == nil && kind != kindRowMutex {
				noteWait(ctx) // this call waits (see Stats)
				if b == nil {
					b = s.opts.newBackOff()
				}
				d := b.NextBackOff()
				if d == backoff.Stop {
					return ErrNotObtained
				}
				if timer == nil {
					timer = time.NewTimer(d)
					defer timer.Stop()
				} else {
					timer.Reset(d)
				}
				select {
				case <-timer.C:
					continue
				case <-ctx.Done():
					return ctx.Err()
				case <-s.done:
					return s.Err()
				}
			}
		}
		if err == nil && kind == kindRowMutex {
			return otherKindError(kindRowMutex)
		}
		return err
	}
}

// bindQueueRow makes one attempt of createQueueRow on one connection: it
// reads the kind of the name's lock row, and unless a Mutex uses the name,
// binds it and creates the queue row in one transaction. It returns the
// kind of the row (kindRowMutex: nothing was written), and 1205 when a
// transaction holds the lock row.
func (s *Session) bindQueueRow(ctx context.Context, name string) (int, error) {
	kind := kindRowNone
	err := s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		var err error
		if kind, err = s.lockKindOn(ctx, c, name); err != nil || kind == kindRowMutex {
			return err // without a write, and without waiting for a LockTx that holds the row
		}
		if hook := kindReadHook.Load(); hook != nil {
			(*hook)(name)
		}
		for {
			stmt := s.noWait(sQueueBind, sQueueBindNoWait)
			bind, err := c.Stmt(ctx, s.pool, int(stmt))
			if err != nil {
				return err
			}
			create, err := c.Stmt(ctx, s.pool, int(sQueueCreate))
			if err != nil {
				return err
			}
			// No retry after a lock wait timeout: createQueueRow decides.
			_, err = retryRolledBackN(ctx, func() (sql.Result, error) {
				return nil, s.enqueueTx(ctx, c, func() error {
					res, err := bind.ExecContext(ctx, name)
					var bound int64
					if err == nil {
						bound, err = res.LastInsertId()
					}
					if err != nil {
						return err
					}
					if bound == otherKind {
						kind = kindRowMutex // a Mutex created the row since the read: nothing was written
						return nil
					}
					kind = kindRowQueued
					_, err = create.ExecContext(ctx, name)
					return err
				})
			}, 0)
			if stmt == sQueueBindNoWait && s.noWaitRefused(err) {
				continue // the plain statement, from now on
			}
			return err
		}
	})
	return kind, err
}

// kindReadHook, when set, runs in bindQueueRow between the read of a
// name's kind and the bind, which is where a Mutex may take a name that a
// queued lock found unbound; tests set it (see export_test.go).
var kindReadHook atomic.Pointer[func(name string)]

// lockKind reads the kind of the name's lock row (qLockKind): kindRowNone
// when it has none.
func (s *Session) lockKind(ctx context.Context, name string) (int, error) {
	kind := kindRowNone
	err := s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		var err error
		kind, err = s.lockKindOn(ctx, c, name)
		return err
	})
	return kind, err
}

// lockKindOn is lockKind on the connection c.
func (s *Session) lockKindOn(ctx context.Context, c *connpool.Conn, name string) (int, error) {
	st, err := c.Stmt(ctx, s.pool, int(sLockKind))
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
// qTicketInsert). After an error whose outcome is unknown it removes the
// ticket.
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
func (s *Session) insertTicket(ctx context.Context, name string, token int64, mode int) (int64, bool, error) {
	for creates := 0; ; creates++ {
		var number int64 // twice the ticket, plus 1 when something conflicting is ahead
		var err error
		if s.galera {
			number, err = s.insertTicketTx(ctx, name, token, mode)
		} else {
			var res sql.Result
			if res, err = s.exec(ctx, sTicketInsert, mode, s.id, token, mode, name); err == nil {
				number, err = res.LastInsertId()
			}
		}
		switch {
		case err != nil:
			// On a cluster a COMMIT that failed otherwise than by a
			// conflict (a node losing quorum) may still have committed.
			if !connpool.Reusable(err) || ctx.Err() != nil || (s.galera && !isErrNo(err, rolledBack...)) {
				s.undo(ctx, orphan{name: name, token: token, ticket: true})
			}
			return 0, false, err
		case number > 1:
			return number / 2, number%2 == 1, nil
		case creates == maxCreates:
			return 0, false, fmt.Errorf("the row of %q in the queue table vanished %d times as it was created", name, creates)
		}
		if err := s.createQueueRow(ctx, name); err != nil {
			return 0, false, err
		}
	}
}

// insertTicketTx enqueues on a Galera cluster: the name's counter and the
// ticket in one transaction (see qTicketNumber), run again while a
// certification conflict with another node's enqueue rolls it back. It
// returns qTicketNumber's answer: twice the ticket, plus 1 when something
// conflicting is ahead, or 0 when the per-name row is missing.
func (s *Session) insertTicketTx(ctx context.Context, name string, token int64, mode int) (int64, error) {
	var number int64
	err := s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		next, err := c.Stmt(ctx, s.pool, int(sTicketNumber))
		if err != nil {
			return err
		}
		add, err := c.Stmt(ctx, s.pool, int(sTicketAdd))
		if err != nil {
			return err
		}
		_, err = retryRolledBack(ctx, func() (sql.Result, error) {
			number = 0
			err := s.enqueueTx(ctx, c, func() error {
				res, err := next.ExecContext(ctx, name, mode, name)
				if err == nil {
					number, err = res.LastInsertId()
				}
				if err != nil || number == 0 {
					return err
				}
				_, err = add.ExecContext(ctx, name, number/2, s.id, token, mode)
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
func (s *Session) enqueueTx(ctx context.Context, c *connpool.Conn, f func() error) error {
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
// (see qFenceSeed).
func (s *Session) checkTicket(ctx context.Context, name string, w *waiter, first bool) (ahead, fence int64, err error) {
	switch {
	case first && w.ahead:
		return 1, 0, nil
	case first && w.mode == modeShared:
		return 0, 0, nil
	}
	if w.mode == modeShared || !first {
		ahead, err = s.conflicts(ctx, name, 0, w.ticket, w.mode)
		if err != nil || ahead > 0 || w.mode == modeShared {
			return ahead, 0, err
		}
	}
	for creates := 0; ; creates++ {
		res, err := s.exec(ctx, sTicketTake, w.ticket, name)
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
		if err := s.createQueueRow(ctx, name); err != nil {
			return 0, 0, err
		}
	}
}

// maxCreates bounds how often one enqueue or turn check creates the name's
// row again (see insertTicket).
const maxCreates = 3

// conflicts counts the live tickets of name between after and before
// (exclusive) that a ticket in mode conflicts with, plus 1 for a live
// holder of the head slot.
func (s *Session) conflicts(ctx context.Context, name string, after, before int64, mode int) (int64, error) {
	var n int64
	err := s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.pool, int(sTicketConflicts))
		if err != nil {
			return err
		}
		return st.QueryRowContext(ctx, name, after, before, mode, name).Scan(&n)
	})
	return n, err
}

// awaitTurn waits until w holds the lock and returns its fence (0 for a
// shared ticket). With wait false it gives up (false, nil) instead of
// waiting.
func (s *Session) awaitTurn(ctx context.Context, name string, lq *localQueue, w *waiter, wait bool) (int64, bool, error) {
	select {
	case <-w.front:
	default:
		if !wait {
			return 0, false, nil
		}
		noteWait(ctx) // goroutines of the process are ahead in the local line
		select {
		case <-w.front:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-s.done:
			return 0, false, s.Err()
		}
	}
	var b backoff.BackOff
	var timer *time.Timer
	var bells bellState // see awaitTicketBell
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for first := true; ; first = false {
		ahead, fence, err := s.checkTicket(ctx, name, w, first)
		switch {
		case err == nil && ahead == 0:
			return fence, true, nil
		case err == nil && !wait:
			return 0, false, nil
		case err != nil && ctx.Err() != nil:
			return 0, false, ctx.Err()
		case err != nil && s.Err() != nil:
			return 0, false, s.Err()
		case err != nil && (!wait || !retryable(err)):
			return 0, false, err
		}
		noteWait(ctx) // this call waits (see Stats)
		if b == nil {
			b = s.opts.newBackOff()
		}
		d := b.NextBackOff()
		if d == backoff.Stop {
			return 0, false, ErrNotObtained
		}
		out := waitPoll
		if err == nil && !lq.heldAgainst(w.mode) {
			out = s.awaitTicketBell(ctx, name, w, &bells)
		}
		switch {
		case out == waitTry:
			// Woken by the doorbell of the ticket ahead, or its wait timed
			// out, or the line moved: check again at once.
			if err := ctx.Err(); err != nil {
				return 0, false, err
			}
			if err := s.Err(); err != nil {
				return 0, false, err
			}
			continue
		case out == waitPace:
			d = bells.nextPace()
		case err == nil:
			// Poll again sooner the closer to the head: every 2ms per
			// holder or waiter ahead, but never slower than the back-off
			// policy says.
			d = min(d, time.Duration(max(ahead, 1))*nextInLinePoll)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		wake := timer.C
		if lq.heldAgainst(w.mode) {
			// A goroutine of this process holds the lock: its Unlock will
			// kick this waiter, so polling meanwhile is wasted work.
			wake = nil
		}
		select {
		case <-wake:
		case <-w.kick:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-s.done:
			return 0, false, s.Err()
		}
	}
}

// leaveLine takes w out of the local line, letting the next waiter poll.
func (lq *localQueue) leaveLine(w *waiter) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	for i, x := range lq.line {
		if x == w {
			lq.line = append(lq.line[:i], lq.line[i+1:]...)
			if i == 0 && len(lq.line) > 0 {
				close(lq.line[0].front)
			}
			return
		}
	}
}

// heldAgainst reports whether this process holds the lock in a way that a
// waiter in mode must wait for.
func (lq *localQueue) heldAgainst(mode int) bool {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return lq.held || (mode == modeExclusive && len(lq.reads) > 0)
}

// kickFront tells the first local waiter to poll now.
func (lq *localQueue) kickFront() {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if len(lq.line) > 0 {
		select {
		case lq.line[0].kick <- struct{}{}:
		default:
		}
	}
}

// acquireTicket enqueues and waits for the lock in mode (or takes the head
// slot, see enqueue). On any failure the ticket or slot is given back
// (removed, or recorded for the keep-alive to remove) and the waiter has
// left the local line. Without wait it returns no waiter and no error when
// the lock was not free.
func (s *Session) acquireTicket(ctx context.Context, name string, lq *localQueue, mode int, wait bool) (*waiter, int64, error) {
	w, fence, err := s.enqueue(ctx, name, lq, mode, wait)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, 0, ctx.Err()
	case err != nil && s.Err() != nil:
		return nil, 0, s.Err()
	case err != nil:
		return nil, 0, err
	case w == nil:
		return nil, 0, nil
	}
	ok := w.ticket == headSlot
	if !ok {
		fence, ok, err = s.awaitTurn(ctx, name, lq, w, wait)
		lq.leaveLine(w)
	}
	if ok {
		// The turn came, but the session may have ended meanwhile (Close,
		// or a lease lost while the check ran): then the hold is worth
		// nothing, and the lock must not be reported held.
		if err = s.Err(); err == nil {
			s.armBell()
			return w, fence, nil
		}
	}
	// Removing the ticket may let the waiter behind this one go first. When
	// ctx has ended the reaper removes it, so the caller returns at once.
	s.undo(ctx, orphan{name: name, token: w.token, ticket: true, seq: w.ticket})
	lq.kickFront()
	return nil, 0, err
}

// deleteTicket removes the ticket (number ticket, of token) of a hold that
// is over, or frees the head slot (ticket headSlot), and rings the
// doorbell when a waiter waits for it; if that fails (ctx ended, or the
// database did not answer) the reaper goroutine removes it at once.
func (s *Session) deleteTicket(ctx context.Context, name string, ticket, token int64) error {
	o := orphan{name: name, token: token, ticket: true, seq: ticket}
	if _, err := s.free(ctx, o); err != nil {
		s.addOrphan(o)
		return err
	}
	return nil
}

// freeTicket removes the ticket o names, or frees the head slot (o.seq
// headSlot), if this session's acquisition o.token still has it, and
// reports whether it did (see Session.free). It rings the session's
// doorbell when a waiter waits for it: a marker behind the ticket, or any
// ticket behind the slot.
func (s *Session) freeTicket(ctx context.Context, o orphan) (bool, error) {
	var res sql.Result
	var err error
	switch o.seq {
	case 0:
		// An enqueue whose outcome is unknown: no number, so no marker
		// can be found; a waiter behind it wakes within bellWait.
		return s.execChanged(ctx, sTicketDelete, o.name, s.id, o.token)
	case headSlot:
		res, err = s.exec(ctx, sQueueRelease, o.name, s.id, o.token)
	default:
		res, err = s.exec(ctx, sTicketRelease, o.name, s.id, o.token, o.seq+markerBase)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err == nil && n == 0 && o.seq == headSlot {
		// The slot was not this acquisition's, or the name's row is gone
		// (an operator deleted it with the hold in it): waiters blocked on
		// this session's doorbell for the slot would then wait bellWait,
		// so ring anyway. A ring for nothing costs them one check.
		s.ringBell()
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
		s.ringBell()
	}
	return true, nil
}

// queued is what FairMutex and RWMutex have in common: a name of a
// session's queued locks.
type queued struct {
	s    *Session
	name string
	err  error // the name's validation error
}

func newQueued(s *Session, name, kind string) queued {
	if s == nil {
		panic("dsync: New" + kind + " with nil Session")
	}
	return queued{s: s, name: name, err: validName(name)}
}

// precheck returns the error that stops a call before it starts.
func (q *queued) precheck(ctx context.Context, op string) error {
	if q.err != nil {
		return q.err
	}
	if err := q.s.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dsync: %s %q: %w", op, q.name, err)
	}
	return nil
}

// lock takes the exclusive hold (FairMutex.Lock, RWMutex.Lock).
func (q *queued) lock(ctx context.Context, wait bool) (ok bool, err error) {
	defer q.s.track(&ctx, kindQueue, "lock", q.name, wait).done(&ok, &err)
	if err := q.precheck(ctx, "lock"); err != nil {
		return false, err
	}
	owner := ownerOf(ctx)
	lq := q.s.queues.ref(q.name)
	lq.mu.Lock()
	switch {
	case lq.reenter(owner):
		lq.mu.Unlock()
		q.s.queues.unref(q.name)
		return true, nil
	case owner != 0 && lq.rOwners[owner] > 0:
		lq.mu.Unlock()
		q.s.queues.unref(q.name)
		return false, fmt.Errorf("dsync: lock %q: %w", q.name, ErrLockUpgrade)
	case !wait && (lq.held || len(lq.reads) > 0 || len(lq.line) > 0):
		lq.mu.Unlock()
		q.s.queues.unref(q.name)
		return false, nil
	}
	lq.mu.Unlock()

	w, fence, err := q.join(ctx, lq, modeExclusive, wait, "lock")
	if w == nil {
		return false, err
	}
	lq.mu.Lock()
	lq.take(owner, fence, w.token)
	lq.ticket = w.ticket
	lq.mu.Unlock()
	return true, nil // the reference now belongs to the hold
}

// join takes a ticket in mode (or the head slot) and waits for its turn.
// Without wait (TryLock, TryRLock) it never jumps the line: TryLock takes
// only the head slot, which is free only while nobody holds or waits;
// TryRLock first makes sure nothing in the line conflicts. When it returns
// no waiter it has dropped the caller's reference to lq.
func (q *queued) join(ctx context.Context, lq *localQueue, mode int, wait bool, op string) (*waiter, int64, error) {
	if !wait && mode == modeShared {
		if n, err := q.s.conflicts(ctx, q.name, 0, math.MaxInt64, mode); err != nil || n > 0 {
			q.s.queues.unref(q.name)
			return nil, 0, q.wrap(op, err)
		}
	}
	w, fence, err := q.s.acquireTicket(ctx, q.name, lq, mode, wait)
	if err != nil || w == nil {
		q.s.queues.unref(q.name)
		return nil, 0, q.wrap(op, err)
	}
	return w, fence, nil
}

// unlock releases one exclusive hold.
func (q *queued) unlock(ctx context.Context) error {
	if q.err != nil {
		return q.err
	}
	lq := q.s.queues.lookup(q.name)
	if lq == nil {
		return q.notHeld("unlock")
	}
	lq.mu.Lock()
	ticket := lq.ticket
	token, err := lq.drop(ownerOf(ctx))
	lq.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotHeld):
		return q.notHeld("unlock")
	case err != nil:
		return fmt.Errorf("dsync: unlock %q: %w", q.name, err)
	case token == 0:
		return nil // holds of the owner remain
	}
	return q.release(ctx, lq, ticket, token, "unlock")
}

// release removes the ticket of a hold that is over and drops its reference.
func (q *queued) release(ctx context.Context, lq *localQueue, ticket, token int64, op string) error {
	defer q.s.queues.unref(q.name)
	if err := q.s.Err(); err != nil {
		return fmt.Errorf("dsync: %s %q: %w", op, q.name, err)
	}
	err := q.s.deleteTicket(ctx, q.name, ticket, token)
	lq.kickFront()
	if err != nil && q.s.Err() != nil {
		return fmt.Errorf("dsync: %s %q: %w", op, q.name, q.s.Err()) // the lock ends with the lease
	}
	if err != nil {
		return fmt.Errorf("dsync: %s %q (the session retries in the background): %w", op, q.name, err)
	}
	return nil
}

// fence returns the fence of the exclusive hold, or 0.
func (q *queued) fence() int64 {
	if q.err != nil || q.s.Err() != nil {
		return 0
	}
	lq := q.s.queues.lookup(q.name)
	if lq == nil {
		return 0
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return lq.fence // 0 when not held
}

func (q *queued) notHeld(op string) error {
	if err := q.s.Err(); err != nil {
		return fmt.Errorf("dsync: %s %q: %w", op, q.name, err)
	}
	return fmt.Errorf("dsync: %s %q: %w", op, q.name, ErrNotHeld)
}

func (q *queued) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("dsync: %s %q: %w", op, q.name, err)
}

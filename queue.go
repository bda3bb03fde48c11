package dsync

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"sync"
	"time"
)

// The queued locks (FairMutex, RWMutex) share this machinery: a database
// line of tickets per name (see qCreateTicket) and, per Session and name, a
// local line that keeps the process's goroutines in their arrival order and
// lets only the first of them poll the database.

// Ticket modes, as stored in the mode column.
const (
	modeShared    = 0 // RWMutex reader
	modeExclusive = 1 // FairMutex, RWMutex writer
	modeWeighted  = 2 // Semaphore: holds by the weights ahead (see qSemTake)
)

// A want is what a waiter asks of the line: a mode, and for a Semaphore's
// ticket (modeWeighted) its weight and the semaphore's limit, which its
// statements check against the name's (see qCreateQueue). The zero
// weight and limit are the queued locks'.
type want struct {
	mode   int
	weight int64 // permits asked for; modeWeighted only
	limit  int64 // the semaphore's limit; modeWeighted only, else 0
}

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

	// release serializes a Semaphore's Releases of the name in this
	// session, so that each counts the permits the one before left.
	release sync.Mutex

	mu   sync.Mutex
	line []*waiter // guarded by mu; local waiters in ticket order; line[0] polls

	hold         // guarded by mu; the exclusive hold of this process, if any
	ticket int64 // guarded by mu; the exclusive hold's ticket number, or headSlot

	// The shared holds of this process (RWMutex readers), each one ticket
	// that any number of local readers may share. Guarded by mu.
	reads []*readHold
	// The Semaphore holds of this process, each one ticket, in the order
	// they were acquired. Guarded by mu.
	permits []*permitHold
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
	want
	ahead  bool          // the enqueue saw a conflicting hold or ticket ahead
	waited bool          // its turn came after a wait (a failed check)
	woken  bool          // a doorbell woke it since its last check (see checkTicket)
	behind int64         // when woken: the ticket it waited behind, 0 the head slot's holder
	front  chan struct{} // closed when the waiter is first in the local line
	kick   chan struct{} // a value means: poll now, the line may have moved
}

// enqueue gives the calling goroutine a ticket in mode and a place at the
// end of the local line. An exclusive waiter first tries the head slot
// (qQueueTake) when nothing of this process holds or waits for the lock:
// then it returns a waiter outside the line, with ticket headSlot, that
// holds the lock, and its fence. Without wait an exclusive waiter never
// takes a ticket: it returns nil (not obtained) when the slot is busy.
func (s *Session) enqueue(ctx context.Context, c *call, name string, lq *localQueue, wt want, wait bool) (*waiter, int64, error) {
	select {
	case lq.enq <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-s.done:
		return nil, 0, s.leaseErr()
	}
	defer func() { <-lq.enq }()

	token := s.nextToken()
	// Goroutines of this process enqueue one at a time (lq.enq), so when
	// none holds or waits, none is ahead of this one.
	lq.mu.Lock()
	idle := !lq.held && len(lq.reads) == 0 && len(lq.line) == 0
	lq.mu.Unlock()
	busy := s.tickets.busy.has(name)
	if wt.mode == modeExclusive {
		if idle && (!wait || !busy) {
			fence, unknown, err := s.tickets.takeSlot(ctx, c, name, token)
			if unknown {
				// The take may have landed: free the slot.
				s.undo(ctx, orphan{name: name, token: token, ticket: true, seq: headSlot})
			}
			if err != nil {
				return nil, 0, err
			}
			if fence > 0 {
				s.tickets.busy.set(name, false)
				return &waiter{ticket: headSlot, token: token, want: wt}, fence, nil
			}
			s.tickets.busy.set(name, true)
			busy = true
		}
		if !wait {
			return nil, 0, nil // held or waited for: TryLock never takes a ticket
		}
	}
	// The marker goes with the enqueue only where something is likely to
	// be ahead: a name found busy, or held or waited for in this process.
	ticket, ahead, unknown, err := s.tickets.insertTicket(ctx, c, name, token, wt, busy || !idle)
	if unknown {
		// The ticket may be in the table: remove it.
		s.undo(ctx, orphan{name: name, token: token, ticket: true})
	}
	if err != nil {
		return nil, 0, err
	}
	w := &waiter{ticket: ticket, token: token, want: wt, ahead: ahead, front: make(chan struct{}), kick: make(chan struct{}, 1)}
	switch {
	case !ahead && busy:
		// Nothing ahead of a writer: the line is free. (Nothing ahead of
		// a reader means only no writer ahead: a writer's Lock may then
		// try the slot in vain once.)
		s.tickets.busy.set(name, false)
	case ahead && !busy:
		s.tickets.busy.set(name, true) // a reader's next enqueue leaves its marker at once
	}
	lq.mu.Lock()
	lq.line = append(lq.line, w)
	if len(lq.line) == 1 {
		close(w.front)
	}
	lq.mu.Unlock()
	return w, 0, nil
}

// createQueueRow creates the name's queue row (qQueueCreate), unless it
// exists, in one transaction with qQueueBind, which binds the lock name of
// the queue key name to its kind (see boundAs), with limit (a Semaphore's,
// else 0; see "One name, one kind" in queries.go). It returns ErrOtherKind
// when another kind uses the name, ErrLimitMismatch when a Semaphore of
// another limit does, and creates nothing then.
//
// The bind does not wait for a transaction that holds the lock row (the
// no-wait variant, see noWaitSQL): a Mutex may create the row after the
// read of its kind and hand it to a transaction (Mutex.LockTx), which
// keeps it locked until it ends. After such a lock wait timeout
// createQueueRow reads the kind again: a Mutex's name gives ErrOtherKind
// at once; else (a write of the row that has not committed yet) it binds
// again after a pause of the session's back-off, never at once; that pause
// is a wait of the lock call c (see Stats).
func (s *Session) createQueueRow(ctx context.Context, c *call, name string, limit int64) error {
	_, err := s.waitFor(ctx, c, true, &waitPolicy{
		try: func(ctx context.Context, _ *waitState) (bool, error) {
			row, want := boundAs(name)
			kind, err := s.tickets.bindQueueRow(ctx, name, limit)
			if isErrNo(err, errLockWaitTimeout) {
				if kind, err = s.tickets.lockKind(ctx, row); err == nil && (kind == kindRowNone || kind == want) {
					return false, nil // bind again after a pause
				}
			}
			if err == nil && kind != want {
				err = otherKindError(kind)
			}
			if err != nil {
				return false, stopWait{err}
			}
			return true, nil
		},
	})
	return err
}

// awaitTurn waits until w holds the lock and returns its fence (0 for a
// shared ticket). With wait false it gives up (false, nil) instead of
// waiting.
func (s *Session) awaitTurn(ctx context.Context, c *call, name string, lq *localQueue, w *waiter, wait bool) (int64, bool, error) {
	select {
	case <-w.front:
	default:
		if !wait {
			return 0, false, nil
		}
		c.noteWait() // goroutines of the process are ahead in the local line
		select {
		case <-w.front:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-s.done:
			return 0, false, s.leaseErr()
		}
	}
	var ahead, fence int64
	ok, err := s.waitFor(ctx, c, wait, &waitPolicy{
		try: func(ctx context.Context, ws *waitState) (bool, error) {
			var err error
			ahead, fence, err = s.tickets.checkTicket(ctx, c, name, w, ws.attempt == 0)
			return ahead == 0, err
		},
		bell: func(ctx context.Context, ws *waitState) waitOutcome {
			w.waited = true
			if lq.heldAgainst(w.mode) {
				return waitPoll
			}
			return s.awaitTicketBell(ctx, name, w, &ws.bells)
		},
		poll: func(_ context.Context, _ *waitState, d time.Duration) time.Duration {
			// Poll again sooner the closer to the head: every 2ms per
			// holder or waiter ahead, but never slower than the back-off
			// policy says.
			return min(d, time.Duration(max(ahead, 1))*nextInLinePoll)
		},
		// A goroutine of this process holds the lock: its Unlock will
		// kick this waiter, so polling meanwhile is wasted work.
		idle: func() bool { return lq.heldAgainst(w.mode) },
		kick: w.kick,
	})
	if !ok {
		return 0, false, err
	}
	return fence, true, nil
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
func (s *Session) acquireTicket(ctx context.Context, c *call, name string, lq *localQueue, wt want, wait bool) (*waiter, int64, error) {
	var w *waiter
	var fence int64
	_, err := s.waitFor(ctx, c, wait, &waitPolicy{
		try: func(ctx context.Context, _ *waitState) (bool, error) {
			var err error
			w, fence, err = s.enqueue(ctx, c, name, lq, wt, wait)
			if err != nil && !isErrNo(err, errTooManyConnections) {
				return false, stopWait{err}
			}
			// A Lock whose enqueue found no connection (1040) tries
			// again, paced (see waitFor).
			return err == nil, err
		},
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, 0, ctx.Err()
	case err != nil && s.leaseErr() != nil:
		return nil, 0, s.leaseErr()
	case err != nil:
		return nil, 0, err
	case w == nil:
		return nil, 0, nil
	}
	ok := w.ticket == headSlot
	if !ok {
		fence, ok, err = s.awaitTurn(ctx, c, name, lq, w, wait)
		lq.leaveLine(w)
	}
	if ok {
		// The turn came, but the session may have ended meanwhile (Close,
		// or a lease lost while the check ran): then the hold is worth
		// nothing, and the lock must not be reported held.
		if err = s.leaseErr(); err == nil {
			s.bell.arm()
			if w.mode == modeWeighted && w.waited {
				// A semaphore's waiter that blocked on this one may fit
				// now as well (its prefix shrank by the release that let
				// this one in): ring, so that it checks (see semaphore.go,
				// "Waking"). And record when this hold began, as a reader
				// that waited does, for ListLocks.
				s.bell.ring()
				s.tickets.granted(name, w)
			}
			return w, fence, nil
		}
	}
	// Removing the ticket may let the waiter behind this one go first. When
	// ctx has ended the reaper removes it, so the caller returns at once.
	s.undo(ctx, orphan{name: name, token: w.token, ticket: true, seq: w.ticket})
	lq.kickFront()
	return nil, 0, err
}

// queued is what FairMutex, RWMutex, Semaphore and Election have in
// common: a line of a session's queued locks.
type queued struct {
	s        *Session // the Session the lock was made with; see on
	name     string   // the line's queue key (see "Queue keys" in queries.go)
	lockName string   // the lock's name, as its errors say it
	err      error    // the name's validation error
}

// newQueued returns the line of the lock called name of kind, whose type
// is typ. It panics if s is nil.
func newQueued(s *Session, kind int, name, typ string) queued {
	if s == nil {
		panic("dsync: New" + typ + " with nil Session")
	}
	valid := validName
	if kind >= firstKeyedKind {
		valid = validKeyedName
	}
	return queued{s: s, name: queueKey(kind, name), lockName: name, err: valid(name)}
}

// on returns q on the lease g of its session (see succession.go): q itself
// but after a lost lease was replaced.
func (q *queued) on(g *Session) *queued {
	if g == q.s {
		return q
	}
	return &queued{s: g, name: q.name, lockName: q.lockName, err: q.err}
}

// precheck returns the error that stops a call before it starts.
func (q *queued) precheck(ctx context.Context, op string) error {
	if q.err != nil {
		return q.err
	}
	if err := q.s.leaseErr(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return opErrorf(err, "%s %q", op, q.lockName)
	}
	return nil
}

// lock takes the exclusive hold (FairMutex.Lock, RWMutex.Lock) on the
// current lease, and again on a new one where a lost lease is replaced
// (see Session.withLease).
func (q *queued) lock(ctx context.Context, wait bool) (bool, error) {
	c := q.s.track(kindQueue, "lock", q.lockName, wait)
	return q.s.withLease(ctx, c, func(g *Session) (bool, error) { return q.on(g).lockOn(ctx, c, wait) })
}

func (q *queued) lockOn(ctx context.Context, c *call, wait bool) (bool, error) {
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
		return false, opErrorf(ErrLockUpgrade, "lock %q", q.lockName)
	case !wait && (lq.held || len(lq.reads) > 0 || len(lq.line) > 0):
		lq.mu.Unlock()
		q.s.queues.unref(q.name)
		return false, nil
	}
	lq.mu.Unlock()

	w, fence, err := q.join(ctx, c, lq, modeExclusive, wait, "lock")
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
func (q *queued) join(ctx context.Context, c *call, lq *localQueue, mode int, wait bool, op string) (*waiter, int64, error) {
	if !wait && mode == modeShared {
		if n, err := q.s.tickets.conflicts(ctx, q.name, 0, math.MaxInt64, mode); err != nil || n > 0 {
			q.s.queues.unref(q.name)
			return nil, 0, q.wrap(op, err)
		}
	}
	w, fence, err := q.s.acquireTicket(ctx, c, q.name, lq, want{mode: mode}, wait)
	if err != nil || w == nil {
		q.s.queues.unref(q.name)
		return nil, 0, q.wrap(op, err)
	}
	return w, fence, nil
}

// unlock releases one exclusive hold, on the lease it was taken under: the
// current one while the hold lasts.
func (q *queued) unlock(ctx context.Context) error { return q.on(q.s.current()).unlockOn(ctx) }

func (q *queued) unlockOn(ctx context.Context) error {
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
		return opErrorf(err, "unlock %q", q.lockName)
	case token == 0:
		return nil // holds of the owner remain
	}
	return q.release(ctx, lq, ticket, token, "unlock")
}

// release removes the ticket of a hold that is over and drops its reference.
func (q *queued) release(ctx context.Context, lq *localQueue, ticket, token int64, op string) error {
	defer q.s.queues.unref(q.name)
	return q.giveBack(ctx, lq, orphan{name: q.name, token: token, ticket: true, seq: ticket}, op)
}

// giveBack frees o, a ticket or the head slot of q's name (or, with a
// weight, shrinks a Semaphore's ticket: see Semaphore.Release), which
// rings the doorbell when a waiter waits for it; if that fails (ctx
// ended, or the database did not answer: the statement may have committed
// or not) the reaper goroutine sends it again at once. op names the call
// in the error.
func (q *queued) giveBack(ctx context.Context, lq *localQueue, o orphan, op string) error {
	if err := q.s.leaseErr(); err != nil {
		return opErrorf(err, "%s %q", op, q.lockName)
	}
	_, err := q.s.free(ctx, o)
	if err != nil {
		q.s.addOrphan(o)
	}
	lq.kickFront()
	if err != nil && q.s.leaseErr() != nil {
		return opErrorf(q.s.leaseErr(), "%s %q", op, q.lockName) // the lock ends with the lease
	}
	if err != nil {
		return opErrorf(err, "%s %q (the session retries in the background)", op, q.lockName)
	}
	return nil
}

// fence returns the fence of the exclusive hold, or 0.
func (q *queued) fence() int64 { return q.on(q.s.current()).fenceOn() }

func (q *queued) fenceOn() int64 {
	if q.err != nil || q.s.leaseErr() != nil {
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
	if err := q.s.leaseErr(); err != nil {
		return opErrorf(err, "%s %q", op, q.lockName)
	}
	return opErrorf(ErrNotHeld, "%s %q", op, q.lockName)
}

func (q *queued) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return opErrorf(err, "%s %q", op, q.lockName)
}

// awaitTicketBell waits for the nearest conflicting ticket ahead of w to
// go, or, with no such ticket ahead, for the head slot's holder to free
// it, and tells the caller's loop what to do next, as awaitBell does. It
// first reads whom w waits for (qTicketAhead). A ticket whose own
// doorbell is held (its enqueue took it, see qTicketInsertBell) is waited
// for on that bell, which its release lets go: a block on a name that
// reads no table (qBellWait), and no marker. Else w blocks on the
// doorbell of the ticket's or the head slot holder's session, which
// their release rings for the marker behind the ticket; w's enqueue
// usually left that marker already (qTicketInsert), and w leaves one
// (qTicketWant) only when the read finds none with the holder's token.
//
// A ticket's bell that woke w once (let go, or gone with its
// connection) is never blocked on again (judge): the ticket's release
// lets it go as it deletes the ticket, so a ticket still there after
// such a wake has lost its bell (its doorbell connection dropped, or its
// release rolled back), and w waits for it on its session's doorbell as
// for a ticket without a bell. Each ticket ahead thus wakes w at once at
// most once; the nearest ticket ahead only changes when tickets ahead
// leave.
func (s *Session) awaitTicketBell(ctx context.Context, name string, w *waiter, st *bellState) waitOutcome {
	if !s.bell.usable() {
		return waitPoll
	}
	s.bell.arm() // waiters behind this one wait on its doorbell (tickets queue behind it)
	seq, ref, left, marked, several, own, err := s.tickets.ticketAhead(ctx, name, w)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		s.logger.Debug("dsync: wait for doorbell failed", "lock", name, "kind", kindQueue, "err", err)
		return waitPace
	}
	if own.tok > 0 && own.id != s.id && !st.woke[own] {
		// Its release lets the bell go before it commits, and the next
		// check waits for that commit (see checkTicket). (A ticket of
		// this session is waited for as before: its release kicks.)
		st.judge(true, own, left, 0)
		out := s.waiters.wait(ctx, s.done, own, left, bellWait, false, st, s.logger, name, kindQueue)
		if out == waitTry {
			w.woken, w.behind = true, seq
		}
		return out
	}
	ref, block, out := st.judge(err == nil, ref, left, 0)
	switch {
	case !block:
		return out
	case ref.id == s.id:
		return waitPace
	case ref.gen == 0:
		return st.unarmedPace(false) // see awaitBell
	}
	if seq != 0 && !marked {
		// A ticket ahead without a marker: leave one, so that its release
		// rings. (The head slot's release rings whenever tickets exist,
		// and this one committed before the slot's holder was read. A
		// marker there already, which the enqueue leaves behind the
		// nearest ticket ahead, makes the release ring: the read waited
		// for a release of that ticket under way, see qTicketAhead.)
		there, err := s.tickets.wantTicket(ctx, name, seq)
		if err != nil {
			s.logger.Debug("dsync: wait for doorbell failed", "lock", name, "kind", kindQueue, "err", err)
			return waitPace
		}
		if !there {
			return waitTry // the ticket ahead went meanwhile
		}
	}
	most := bellWait
	if several {
		// The first waiter of a Semaphore behind several holders: any of
		// them may let it in, and only the one it blocks on rings for it.
		most = semHeadWait
	}
	out = s.waiters.wait(ctx, s.done, ref, left, most, false, st, s.logger, name, kindQueue)
	if out == waitTry {
		// Rung (the release may not have committed yet), or timed out:
		// the next check waits for that release (see checkTicket).
		w.woken, w.behind = true, seq
	}
	return out
}

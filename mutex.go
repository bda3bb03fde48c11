package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// A Mutex is a mutual exclusion lock shared by every process whose
// [Session] reaches the same database and table prefix: at any instant, by
// the database's clock, at most one session holds it. Create it with
// [NewMutex]; the zero value is not usable. A Mutex is safe for concurrent
// use, and any number of Mutex values may name the same lock: within one
// Session they share one in-process state, and goroutines of the process
// queue locally, so only one of them at a time waits on the database.
// Waiters of different sessions are not served in order, but a waiter of
// another session claims the next hold (at once when it waits on the
// holder's doorbell; after 100ms of polling where there are no doorbells,
// 10ms on a Galera cluster), so neither the holder's process (releasing
// and re-acquiring at once) nor faster pollers can overtake it for ever;
// use [FairMutex] for strict order.
//
// Each acquisition gets a fencing token ([Mutex.Fence]) greater than that of
// every earlier acquisition of the name. Hand it to the resources the lock
// protects and have them refuse a smaller one: that is what keeps a holder
// whose lease ran out mid-operation (a long pause) from doing harm.
//
// Without an owner in ctx (see [WithOwner]) a Mutex behaves like
// sync.Mutex: a second Lock waits, and any goroutine may Unlock. With an
// owner it is reentrant for that owner and only that owner may unlock it.
//
// The lock lives as long as its session's lease: when [Session.Done] closes
// the lock may already belong to someone else. A lock taken for a caller's
// transaction ([Mutex.LockTx]) lives as long as the transaction instead.
type Mutex struct {
	s    *Session // the Session NewMutex was given; see on
	name string
	err  error // the name's validation error, returned by every call
}

// NewMutex returns the mutex called name in s's lock space; a name that a
// [FairMutex], [RWMutex] or [Election] uses gives [ErrOtherKind]. Names are exact
// byte strings ("Lock", "lock" and "lock " are three locks), 1 to 255 bytes
// of UTF-8; with another name every method returns [ErrInvalidName].
// NewMutex panics if s is nil, a programmer error.
func NewMutex(s *Session, name string) *Mutex {
	if s == nil {
		panic("dsync: NewMutex with nil Session")
	}
	return &Mutex{s: s, name: name, err: validName(name)}
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// on returns m on the lease g of its session (see succession.go): m itself
// but after a lost lease was replaced.
func (m *Mutex) on(g *Session) *Mutex {
	if g == m.s {
		return m
	}
	return &Mutex{s: g, name: m.name, err: m.err}
}

// Fence returns the fencing token of the current hold of the lock by this
// process through m's session, or 0 when it does not hold it (or the session
// has ended).
func (m *Mutex) Fence() int64 { return m.on(m.s.current()).fence() }

func (m *Mutex) fence() int64 {
	if m.err != nil || m.s.leaseErr() != nil {
		return 0
	}
	l := m.s.locks.lookup(m.name)
	if l == nil {
		return 0
	}
	return l.currentFence()
}

// Lock blocks until the lock is acquired, ctx ends, or the session ends.
// It returns nil when acquired; an error wrapping ctx.Err() when ctx ended
// first; [ErrSessionExpired] or [ErrSessionClosed] when the session ended;
// [ErrInvalidName]; [ErrNotObtained] when the back-off policy gave up;
// [ErrOtherKind], at once, when a FairMutex, RWMutex or Election uses the name; or a
// database error. On error the lock is not held: an acquisition that reached
// the database just as ctx or the session ended is undone (in the
// background when ctx has ended, so Lock returns promptly).
func (m *Mutex) Lock(ctx context.Context) error {
	_, err := m.lock(ctx, true)
	return err
}

// TryLock makes one attempt to acquire the lock without waiting. It returns
// true, nil when acquired; false, nil when another holder has it (another
// session, or another goroutine of this process holding or acquiring it);
// and false with an error as Lock does otherwise. On a session made
// [WithReplaceLostLease] whose lease was lost, it first opens the new
// lease, waiting, bounded by ctx, while the database cannot be reached.
func (m *Mutex) TryLock(ctx context.Context) (bool, error) {
	return m.lock(ctx, false)
}

// lock runs lockOn on the current lease, and again on a new one where a
// lost lease is replaced (see Session.withLease).
func (m *Mutex) lock(ctx context.Context, wait bool) (bool, error) {
	c := m.s.track(kindMutex, "lock", m.name, wait)
	return m.s.withLease(ctx, c, func(g *Session) (bool, error) { return m.on(g).lockOn(ctx, c, wait) })
}

func (m *Mutex) lockOn(ctx context.Context, c *call, wait bool) (bool, error) {
	if m.err != nil {
		return false, m.err
	}
	if err := m.s.leaseErr(); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, opErrorf(err, "lock %q", m.name)
	}
	owner := ownerOf(ctx)
	l := m.s.locks.ref(m.name)
	if l.reenter(owner) {
		m.s.locks.unref(m.name)
		return true, nil
	}
	fence, token, err := m.enterAcquire(ctx, c, l, wait)
	if err != nil || fence == 0 {
		if err != nil {
			err = opErrorf(err, "lock %q", m.name)
		}
		return false, err
	}
	l.mu.Lock()
	l.take(owner, fence, token)
	l.mu.Unlock()
	m.s.bell.arm()
	return true, nil // the reference from ref now belongs to the hold
}

// enterAcquire takes the local lock l (referenced by the caller) and then
// the lock row (see acquire). It returns the fence and token of the
// acquisition; on an error or a zero fence (not acquired) it has left l and
// dropped the caller's reference.
func (m *Mutex) enterAcquire(ctx context.Context, c *call, l *localLock, wait bool) (fence, token int64, err error) {
	entered, err := m.s.enter(ctx, c, l, wait)
	if !entered {
		m.s.locks.unref(m.name)
		return 0, 0, err
	}
	fence, token, err = m.acquire(ctx, c, wait)
	if err == nil && fence > 0 {
		// The row is taken, but the session may have ended while the
		// statement ran (Close, or a lease lost to a slow database): then
		// the row names a lease that is ending or gone, another session may
		// take it at once, and the lock must not be reported held.
		if err = m.s.leaseErr(); err != nil {
			m.s.undo(ctx, orphan{name: m.name, token: token})
		}
	}
	if err != nil || fence == 0 {
		l.leave()
		m.s.locks.unref(m.name)
		return 0, 0, err
	}
	return fence, token, nil
}

// acquire takes the lock row, waiting on the holder's doorbell (see
// doorbell.go), or polling with back-off where there is none, while others
// hold it when wait is set (see waitFor). It returns the fence and token
// of the acquisition, or a zero fence when wait is false and the row is
// held.
func (m *Mutex) acquire(ctx context.Context, c *call, wait bool) (fence, token int64, err error) {
	m.s.acquiring.Add(1)
	defer m.s.acquiring.Add(-1)
	if !wait && m.s.store.noWaitOff.Load() {
		// A TryLock where the server has no statements that do not wait
		// (MySQL; see execNoWait) reads the row first: its statements
		// would wait, up to the lock wait timeout (qSetSession), for a
		// transaction holding the row (LockTx).
		if taken, err := m.s.rows.lockTaken(ctx, m.name); err != nil || taken {
			return 0, 0, err
		}
	}
	mw := &mutexWait{m: m}
	taken, err := m.s.waitFor(ctx, c, wait, &waitPolicy{
		try:      mw.try,
		retrying: mw.retrying,
		bell:     mw.awaitBell,
		poll:     mw.poll,
	})
	if !taken {
		if !mw.claimed.IsZero() || mw.wanted {
			m.unclaim(ctx, mw.wanted)
		}
		return 0, 0, err
	}
	return mw.fence, mw.token, nil
}

// mutexWait is the Mutex's policy in one Lock call's waitFor, and what it
// remembers between attempts beyond waitState.
type mutexWait struct {
	m            *Mutex
	fence, token int64         // the last attempt's
	claimed      time.Time     // when this call last claimed the next hold; zero: no claim of its own
	wanted       bool          // qLockWant was sent: it may have claimed the next hold
	wantedAt     time.Time     // when qLockWant was last sent
	unwanted     bool          // qLockWant met the row locked: no release rings for this waiter (see awaitBell)
	selfHeld     bool          // the row was last seen held by this session itself
	fast         time.Duration // the claimant's last poll delay (see poll); 0: none since its claim
}

// try makes one attempt at the lock row. The first attempt tries the
// cheap statement for a free row; when it misses, the full one decides at
// once, and polls use only the full one. A waiter woken by a doorbell
// tries the cheap one, waiting briefly for the row lock of the release
// that rang (see freeRinging); the next attempt, after the doorbell is
// read again, decides the rest.
func (mw *mutexWait) try(ctx context.Context, w *waitState) (bool, error) {
	m := mw.m
	mw.token = m.s.nextToken()
	mode := rowFull
	switch {
	case w.bells.woken:
		mode = rowWoken
	case w.attempt == 0:
		mode = rowFast
	}
	w.bells.woken = false
	// A call that said it waits, or claimed, may have been read as the
	// claimant by waiters that block on its doorbell: its hold keeps the
	// row's wants (see qCreateLock), so that its release rings for them.
	waited := mw.wanted || !mw.claimed.IsZero()
	fence, unknown, err := m.s.rows.acquireRow(ctx, m.name, mw.token, mode, waited)
	if mode == rowFast && err == nil && fence == 0 {
		fence, unknown, err = m.s.rows.acquireRow(ctx, m.name, mw.token, rowFull, waited)
	}
	if unknown {
		// The attempt may have taken the row: undo it, so that no row is
		// left held without a holder.
		m.s.undo(ctx, orphan{name: m.name, token: mw.token})
	}
	mw.fence = fence
	return fence > 0, err
}

// retrying logs an attempt's retryable error.
func (mw *mutexWait) retrying(err error) {
	mw.m.s.logger.Debug("dsync: acquire failed; retrying", "lock", mw.m.name, "kind", kindMutex, "err", err)
}

// poll returns the delay of a poll without a doorbell: the back-off's d,
// or, once the call has waited starveAfter, while it holds the claim on
// the next hold (so that neither the holder's process nor a faster poller
// takes it first), claimPoll after it claimed and twice the last delay
// after each poll that found the lock still held, up to d: fast for the
// holds that end soon after the claim, and paced, as the back-off is, for
// the long ones. waitFor keeps it all within the polling budget
// (pollBudget), the claims included. (A row this session holds itself,
// under a token it no longer knows, is freed by the reaper: claiming it
// would only poll it faster.)
func (mw *mutexWait) poll(ctx context.Context, w *waitState, d time.Duration) time.Duration {
	if mw.selfHeld || time.Since(w.started) < mw.m.s.starveAfter() {
		return d
	}
	if mw.claimed.IsZero() || time.Since(mw.claimed) >= claimRenew {
		was := !mw.claimed.IsZero()
		w.polls.spend(1)
		if mw.m.claim(ctx, time.Since(w.started)) {
			mw.claimed = time.Now()
			if !was {
				mw.fast = 0 // a new claim: poll fast again
			}
		} else {
			mw.claimed = time.Time{} // another waiter's claim is current
		}
	}
	if mw.claimed.IsZero() {
		// An older waiter's claim is current: it takes the lock next, and
		// this call keeps its budget for when the claim is its own.
		return max(d, unclaimedPoll)
	}
	mw.fast = min(max(2*mw.fast, claimPoll), d)
	return mw.fast
}

// Starving waiters that poll (no doorbell, see doorbell.go; a waiter on a
// doorbell claims the next hold at once): a Lock that has waited
// starveAfter claims the next hold of the lock for claimFor, renewing its
// claim every claimRenew while it waits, and polls from claimPoll on,
// doubling the delay while the lock stays held (see mutexWait.poll). The
// claim bounds how long a waiter can be overtaken by other processes,
// including the holder's own process re-acquiring at once (its node
// commits first on a cluster), to about starveAfter plus one hold. On a
// single server a shorter starveAfter makes claims, and the idle row
// between a release and the claimant's next poll, common under ordinary
// contention, which costs acquisitions; on a Galera cluster, where the
// holder's node wins most races, a short galeraStarveAfter evens out the
// nodes' shares, at some cost in acquisitions (TestGaleraMutexShares). A
// claim lasts claimFor, three renewals, so that a claimant's polls, not
// its renewals, spend its polling budget; a claim left behind by a Lock
// that could not drop it (unclaim) lapses after claimFor, or with its
// session's lease. The measurements behind the values are in
// docs/CONSTANTS.md.
const (
	starveAfter       = 100 * time.Millisecond
	galeraStarveAfter = 10 * time.Millisecond
	claimFor          = 3 * time.Second
	claimRenew        = claimFor / 3
	claimPoll         = 2 * time.Millisecond
	unclaimedPoll     = 250 * time.Millisecond

	unclaimWithin = 250 * time.Millisecond
)

// starveAfter is how long a polling Lock waits before it claims the next
// hold.
func (s *Session) starveAfter() time.Duration {
	if s.store.galera {
		return galeraStarveAfter
	}
	return starveAfter
}

// claim claims the next hold for this session, which has waited waited,
// or renews its claim, and reports whether the claim is its own now. A
// failure only means waiting as before.
func (m *Mutex) claim(ctx context.Context, waited time.Duration) bool {
	ok, err := m.s.rows.claimRow(ctx, m.name, claimFor, waited)
	if err != nil {
		m.s.logger.Debug("dsync: claim failed", "lock", m.name, "kind", kindMutex, "err", err)
	}
	return ok
}

// unclaim drops this session's claim when its Lock gives up without the
// lock, also when ctx has ended (a doorbell waiter's claim is long), within
// unclaimWithin, and rings the session's doorbell when it dropped the
// claim, or when ring is set (a doorbell waiter giving up: an older waiter
// may have taken its claim over meanwhile, so the drop finds none, while
// waiters that read the claim before are still blocked on this session's
// doorbell, waiting for it to take the lock). When that fails, the claim
// lapses after claimFor, or bellWait+2s for a doorbell waiter, or when the
// session's lease ends.
func (m *Mutex) unclaim(ctx context.Context, ring bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unclaimWithin)
	defer cancel()
	dropped, err := m.s.rows.unclaimRow(ctx, m.name)
	if err != nil {
		m.s.logger.Debug("dsync: unclaim failed", "lock", m.name, "kind", kindMutex, "err", err)
	}
	if dropped || ring {
		m.s.bell.ring()
	}
}

// Unlock releases one hold of the lock. With an owner in ctx it undoes one
// Lock of that owner and frees the lock when the last is undone. ctx bounds
// the release statement: when ctx ends first (or had ended), Unlock returns
// an error wrapping ctx.Err(), and the session frees the row in the
// background at once, by this acquisition's token, so it never touches a
// later hold. Pass a ctx without a deadline (context.Background()) to save
// the driver the cost of watching it.
//
// It returns [ErrNotHeld] when this process does not hold the lock
// (wrapped in [ErrReleasedByForce] when [ForceRelease] freed it while this
// session held it), [ErrNotOwner] when it is held by another owner, [ErrSessionExpired] or
// [ErrSessionClosed] when the session has ended (the lock is then gone
// anyway; an Unlock that leaves holds of the owner returns nil, even
// then), ctx's error, or a database error; after either of the last two
// the hold is over in this process and the session frees the row in the
// background.
func (m *Mutex) Unlock(ctx context.Context) error {
	// The lease of a hold stays the current one until the hold is
	// released (see succession.go).
	return m.on(m.s.current()).unlock(ctx)
}

func (m *Mutex) unlock(ctx context.Context) error {
	if m.err != nil {
		return m.err
	}
	l := m.s.locks.lookup(m.name)
	if l == nil {
		return m.notHeld()
	}
	l.mu.Lock()
	if l.held && l.tx != nil {
		l.mu.Unlock()
		return opErrorf(ErrNotOwner, "unlock %q: held by a transaction (LockTx) until it commits or rolls back", m.name)
	}
	token, err := l.drop(ownerOf(ctx))
	l.mu.Unlock()
	switch {
	case errors.Is(err, ErrNotHeld):
		return m.notHeld()
	case err != nil:
		return opErrorf(err, "unlock %q", m.name)
	case token == 0:
		return nil // holds of the owner remain
	}
	defer m.s.locks.unref(m.name)
	defer l.leave() // after the row is free, so the next local holder finds it free

	if err := m.s.leaseErr(); err != nil {
		return opErrorf(err, "unlock %q", m.name)
	}
	freed, err := m.s.free(ctx, orphan{name: m.name, token: token})
	switch {
	case err != nil && m.s.leaseErr() != nil:
		return opErrorf(m.s.leaseErr(), "unlock %q", m.name) // the lock ends with the lease
	case err != nil:
		m.s.addOrphan(orphan{name: m.name, token: token})
		return opErrorf(err, "unlock %q (the session retries in the background)", m.name)
	case !freed:
		if serr := m.s.leaseErr(); serr != nil {
			return opErrorf(serr, "unlock %q", m.name)
		}
		return opErrorf(m.s.whyNotHeld(ctx), "unlock %q", m.name)
	}
	return nil
}

// notHeld returns the error for unlocking a lock that is not held: the
// session's end when it has ended, else ErrNotHeld.
func (m *Mutex) notHeld() error {
	if err := m.s.leaseErr(); err != nil {
		return opErrorf(err, "unlock %q", m.name)
	}
	return opErrorf(ErrNotHeld, "unlock %q", m.name)
}

// whyNotHeld returns the error for a hold whose release found the lock row
// no longer the session's, by asking whether the session's lease is live on
// the server: then the row was released by force (ForceRelease), else taken
// over after the lease lapsed there. When it cannot tell (ctx ended, the
// database failed), it says both.
func (s *Session) whyNotHeld(ctx context.Context) error {
	var live bool
	err := s.store.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		return s.store.query(ctx, c, sLeaseLive, []any{s.id}, &live)
	})
	switch {
	case err != nil:
		return fmt.Errorf("%w: released by force or taken over after the session's lease lapsed", ErrNotHeld)
	case live:
		return fmt.Errorf("%w (ForceRelease, or dsync release --force)", ErrReleasedByForce)
	}
	return fmt.Errorf("%w: taken over after the session's lease lapsed on the server", ErrNotHeld)
}

// claimantBlock is the longest a Mutex waiter blocks on the doorbell of a
// claimant (a waiter that claimed the next hold, while nobody holds the
// lock): it takes the lock within milliseconds, and rings when it releases
// it (see qCreateLock) or gives up; but a claimant whose claim another
// waiter took over, and that is still waiting, rings for nobody. A second
// (no less: MySQL rounds a GET_LOCK timeout to whole seconds, see
// bellWaiter.wait), and each look costs a try, a want and a read.
const claimantBlock = time.Second

// unarmedPolls is how many times a waiter that finds the one it waits for
// without a doorbell polls soon (after claimPoll) before it paces itself
// (see nextPace): a session takes its doorbell right after its first
// acquisition, and a waiter arriving just then would otherwise wait
// paceFloor (see docs/CONSTANTS.md).
const unarmedPolls = 5

// unarmedPace tells a waiter that found the one it waits for without a
// doorbell what to do: poll soon, the first unarmedPolls times, then pace
// itself; but a waiter that holds the claim on the next hold (mine) polls
// every connPace, within the polling budget: it is the one that takes the
// lock next, and every other waiter waits for it (on a *sql.DB with a
// connection limit only a few sessions have doorbells, and a claimant
// pacing up to paceCap made each handoff last up to a second).
func (st *bellState) unarmedPace(mine bool) waitOutcome {
	switch {
	case st.unarmed < unarmedPolls:
		st.unarmed++
		st.soon = true
	case mine:
		st.busy = true
	}
	return waitPace
}

// awaitBell waits for the release of the Mutex row by blocking on its
// holder's doorbell (see doorbell.go), and tells waitFor what to do next
// (see waitOutcome and bellState.judge). Without a doorbell to block on
// (the holder has none, or it is this session, holding the row under a
// token it no longer knows until the reaper frees it; or the session's
// waiting connection blocks for another name, or cannot be had) it paces
// itself, keeping the claim that qLockWant gave it.
func (mw *mutexWait) awaitBell(ctx context.Context, w *waitState) waitOutcome {
	m, s, st := mw.m, mw.m.s, &w.bells
	if !s.bell.usable() {
		return waitPoll
	}
	s.bell.armWaiting() // waiters behind this one wait on its doorbell
	var (
		b    lockBellRead
		err  error
		want = !st.paced || time.Since(mw.wantedAt) >= paceCap
	)
	// (A waiter that paced itself since its last block said so less than
	// paceCap ago, for longer than any block that may follow: nothing to
	// renew, and each of its polls is a try and a read.) A want that an
	// acquisition voided before the read (see qLockBell) is said again,
	// once: it would not make the holder ring.
	for again := 0; again < 2; again++ {
		if want {
			mw.wanted, mw.wantedAt = true, time.Now()
			w.spend(1)
			err := s.rows.wantRow(ctx, m.name, bellWait+2*time.Second, time.Since(w.started))
			mw.unwanted = isErrNo(err, errLockWaitTimeout)
			if err != nil && !mw.unwanted {
				s.logger.Debug("dsync: wait for doorbell failed", "lock", m.name, "kind", kindMutex, "err", err)
				return waitPace
			}
		}
		w.spend(1)
		b, err = s.rows.lockBell(ctx, m.name)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			s.logger.Debug("dsync: wait for doorbell failed", "lock", m.name, "kind", kindMutex, "err", err)
			return waitPace
		}
		if err != nil || b.wanted || mw.unwanted {
			break
		}
		if again == 1 {
			// The lock changed hands twice meanwhile: try it again.
			return waitTry
		}
		want = true
	}
	ref, block, out := st.judge(err == nil, b.ref, b.left, b.fence)
	if !block {
		return out
	}
	mw.selfHeld = ref.id == s.id
	switch {
	case mw.selfHeld:
		return waitPace
	case ref.gen == 0:
		// The holder has no doorbell yet: it takes one right after its
		// first acquisition, within a few milliseconds; or it has none
		// (no connection for one).
		return st.unarmedPace(b.mine)
	}
	most := bellWait
	if mw.unwanted {
		// The row was locked (a LockTx transaction, whose session rings
		// when it ends; or a statement that held it for longer than the
		// no-wait tries): wanted_until may not be written, so a release
		// need not ring. Block no longer than the pace's cap.
		most = paceCap
	}
	if b.claimant {
		// A claimant rings when it gives up, and when it releases the
		// hold it takes (see qCreateLock), but not when another waiter
		// takes its claim over and the lock: a block on it looks again
		// after claimantBlock.
		most = min(most, claimantBlock)
	}
	return s.waiters.wait(ctx, s.done, ref, b.left, most, false, st, s.logger, m.name, kindMutex)
}

package dsync

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// A Semaphore is a weighted semaphore shared by every process whose
// [Session] reaches the same database and table prefix: at most limit
// permits of a name are held at any instant, across all sessions, each
// acquisition taking n of them. It is shaped like
// golang.org/x/sync/semaphore. Create it with [NewSemaphore]; the zero
// value is not usable. A Semaphore is safe for concurrent use.
//
// A Semaphore's permits belong to its session, not to a goroutine or an
// owner ([WithOwner] plays no part): any goroutine may release permits
// that another acquired, as with x/sync's semaphore, and a session
// releases only permits it holds.
//
// # Fairness
//
// Acquisitions are served first come, first served, across processes, in
// the line of tickets described at [FairMutex], which a Semaphore shares:
// every Acquire takes a ticket weighing n, and a ticket holds when the
// weights of the live tickets up to and including it add up to at most
// the limit. So there is no barging: a large request at the head of the
// line is not overtaken by smaller ones behind it, even while enough
// permits for them are free (as in x/sync's semaphore, which explains
// why: a large request could otherwise starve), and [Semaphore.TryAcquire]
// fails rather than overtake a waiter.
//
// # Limit
//
// A name's limit is the limit of the Semaphore whose call first used the
// name (it is stored with the name's row): it stands for as long as the
// name is bound, that is, while any session holds or waits for it, and
// until the clean-up deletes its idle rows ([WithFreeRowAge]). A
// Semaphore of the name with another limit gets [ErrLimitMismatch] from
// every call (from Release, when its session holds permits of the name)
// and holds nothing, nor releases any: two processes never count the same
// permits against different limits. To change a limit, stop every use of
// the name with the old one, and let its rows be cleaned up (or use
// another name).
//
// A name is one lock: while a [Mutex], [FairMutex], [RWMutex] or
// [Election] uses it, the Semaphore's calls return [ErrOtherKind], and
// theirs the same while a Semaphore uses it. [ListLocks] lists each
// acquisition ([KindSemaphore]); [ForceRelease] frees none.
//
// # Sessions and fences
//
// Permits die with their session: a ticket whose lease has ended, by the
// database's clock, holds nothing and is skipped, and the session learns
// of the loss ([Session.Done]) before the database counts its permits as
// free. Each acquisition takes a fencing token ([Semaphore.AcquireFence]),
// strictly increasing per name in the order the acquisitions are granted:
// several holders hold at once, each with its own fence.
//
// # Waking
//
// Waiters block on doorbells (see the package's Waiting section), one
// each. The first waiter in line blocks on the doorbell of the session of
// the oldest holder, the head of the line (with holds of like length,
// granted in order, the first to end); every waiter behind it blocks on
// the waiter just ahead of it. A release rings for the waiter blocked on
// it, and so does a partial [Semaphore.Release]; a waiter granted after
// it waited rings its own doorbell, so that the waiter behind it, which
// may fit as well, checks at once: the permits freed by one release flow
// down the line without a poll. A release by a holder other than the
// oldest does not ring the first waiter's doorbell (a blocked connection
// waits on one doorbell, which only its own session rings), so while more
// than one holder is ahead of it the first waiter blocks for at most a
// second at a time and then checks its turn: it sees any holder's release
// within about a second, at about three statements a second (a check, a
// read of whom to block on, the block) for the first waiter alone; the
// waiters behind it do not poll. When the oldest holder is of the first
// waiter's own session (another of its goroutines holds), the waiter
// cannot block on it (a session never blocks on its own doorbell): its
// session's releases wake it in the process at once, and it sees another
// session's release by polling, 100 ms after its last check at first,
// doubling up to a second: about two statements a second (a check, a
// read of whom to block on) once the pace has grown. Where there are no
// doorbells (a Galera cluster, a *sql.DB with a connection limit below 8)
// waiters poll within the polling budget, as a FairMutex's do.
type Semaphore struct {
	q     queued
	limit int64
}

// NewSemaphore returns the semaphore called name, with limit permits, in
// s's lock space. Names follow the rules of [NewMutex], with at most 254
// bytes; with an invalid one every method returns [ErrInvalidName], and
// with a limit of 0 or less [ErrInvalidLimit]. NewSemaphore panics if s
// is nil.
func NewSemaphore(s *Session, name string, limit int64) *Semaphore {
	m := &Semaphore{q: newQueued(s, kindRowSemaphore, name, "Semaphore"), limit: limit}
	if m.q.err == nil && limit <= 0 {
		m.q.err = fmt.Errorf("%w: %d for %q (want 1 or more)", ErrInvalidLimit, limit, name)
	}
	return m
}

// Name returns the semaphore's name.
func (m *Semaphore) Name() string { return m.q.lockName }

// Limit returns the limit the semaphore was made with.
func (m *Semaphore) Limit() int64 { return m.limit }

// Acquire acquires n permits, blocking until they are granted in their
// turn, ctx ends or the session ends. On failure it returns ctx.Err(), the
// session's error ([ErrSessionExpired], [ErrSessionClosed]),
// [ErrInvalidName], [ErrInvalidLimit], [ErrInvalidPermits] (n of 0 or
// less, or above the limit), [ErrLimitMismatch], [ErrOtherKind] or a
// database error, and holds nothing: its ticket has left the line.
func (m *Semaphore) Acquire(ctx context.Context, n int64) error {
	_, err := m.AcquireFence(ctx, n)
	return err
}

// AcquireFence is [Semaphore.Acquire] that also returns the acquisition's
// fence: strictly greater than the fence of every earlier acquisition of
// the name (see [Mutex.Fence] for what fences are for).
//
// The acquisition, and so its fence, belongs to the session, not to the
// goroutine that made it: [Semaphore.Release], from any goroutine,
// releases the session's latest acquisitions first, so a goroutine that
// goes on with its fence may find that another goroutine's Release has
// ended its acquisition (and left an earlier one, of another fence,
// held). Goroutines that each need their own fence to stay valid until
// they release use a Semaphore on a session each, or release in the
// reverse order of their acquisitions.
func (m *Semaphore) AcquireFence(ctx context.Context, n int64) (int64, error) {
	return m.acquire(ctx, n, true)
}

// TryAcquire acquires n permits only if they are free and nobody waits
// ahead of it: it never overtakes a waiter, and never waits for permits
// (only, as [Mutex.TryLock] says, for a new lease). It returns false, nil
// otherwise, and errors as Acquire does.
func (m *Semaphore) TryAcquire(ctx context.Context, n int64) (bool, error) {
	fence, err := m.acquire(ctx, n, false)
	return fence > 0, err
}

// TryAcquireFence is [Semaphore.TryAcquire] that also returns the
// acquisition's fence (0 when it acquired nothing), as AcquireFence does.
func (m *Semaphore) TryAcquireFence(ctx context.Context, n int64) (int64, error) {
	return m.acquire(ctx, n, false)
}

// Release releases n of the permits this session holds on the name,
// acquired by any of its goroutines, and lets the waiters that fit in. It
// releases the latest acquisitions first; an acquisition released in part
// keeps the rest of its permits, and its fence. It returns
// [ErrInvalidPermits] for n of 0 or less, [ErrLimitMismatch] when the
// session's permits of the name were acquired with another limit (the
// name's), releasing nothing, [ErrReleaseExceedsHeld] (which
// wraps [ErrNotHeld]) when the session holds fewer than n permits of the
// name, releasing nothing then, the session's error when it has ended
// (its permits ended with it), ctx's error or a database error. After
// such an error all n permits are released in this process all the same,
// and the caller must not call Release for them again, which would
// release other permits: a statement that failed may have committed on
// the server or not (a lost reply, ctx ended while it ran), so the
// session sends it again in the background until the database has it
// (the error says so), and until then the database counts them held,
// which only makes others wait; once the session has ended they end with
// it.
func (m *Semaphore) Release(ctx context.Context, n int64) error {
	q := m.q.on(m.q.s.current())
	if err := m.check(n, false); err != nil {
		return opErrorf(err, "release %q", q.lockName)
	}
	lq := q.s.queues.lookup(q.name)
	if lq == nil {
		return m.exceeds(q, n, 0)
	}
	lq.release.Lock() // one Release at a time: each counts from the last
	defer lq.release.Unlock()
	lq.mu.Lock()
	var held int64
	for _, h := range lq.permits {
		held += h.weight
	}
	if len(lq.permits) > 0 && lq.permits[0].limit != m.limit {
		limit := lq.permits[0].limit
		lq.mu.Unlock()
		return opErrorf(ErrLimitMismatch, "release %q: limit %d, the name's %d", q.lockName, m.limit, limit)
	}
	if held < n {
		lq.mu.Unlock()
		return m.exceeds(q, n, held)
	}
	// The latest acquisitions first: a waiter waits for the nearest ticket
	// ahead of it, the latest of this session's that are ahead. The count
	// changes in the process whatever the statements' outcomes: a failed
	// one may have committed, so a retry by the caller could release other
	// permits; the session finishes what failed in the background.
	var gone []*permitHold
	var part *permitHold
	var partWeight int64
	for i, left := len(lq.permits)-1, n; left > 0; i-- {
		h := lq.permits[i]
		if h.weight <= left {
			left -= h.weight
			gone = append(gone, h)
			continue
		}
		part, partWeight, left = h, h.weight-left, 0
	}
	var err error
	if part != nil {
		part.weight = partWeight
		lq.mu.Unlock()
		err = q.shrink(ctx, lq, part, partWeight)
		lq.mu.Lock()
	}
	kept := lq.permits[:0]
	for _, h := range lq.permits {
		if !slices.Contains(gone, h) {
			kept = append(kept, h)
		}
	}
	clear(lq.permits[len(kept):])
	lq.permits = kept
	lq.mu.Unlock()
	for _, h := range gone {
		if rerr := q.release(ctx, lq, h.ticket, h.token, "release"); err == nil {
			err = rerr
		}
	}
	return err
}

// exceeds is Release's error when the session holds only held permits.
func (m *Semaphore) exceeds(q *queued, n, held int64) error {
	if err := q.s.leaseErr(); err != nil {
		return opErrorf(err, "release %q", q.lockName)
	}
	return opErrorf(ErrReleaseExceedsHeld, "release %d permits of %q (%d held)", n, q.lockName, held)
}

// check returns the error of a call for n permits before it starts: the
// name's or limit's, or n out of range (above the limit, to acquire).
func (m *Semaphore) check(n int64, acquire bool) error {
	switch {
	case m.q.err != nil:
		return m.q.err
	case n <= 0 || (acquire && n > m.limit):
		return fmt.Errorf("%w: %d (want 1 to the limit, %d)", ErrInvalidPermits, n, m.limit)
	}
	return nil
}

// acquire takes n permits on the current lease, and again on a new one
// where a lost lease is replaced (see Session.withLease), and returns the
// fence; 0 and no error when, without wait, they were not free.
func (m *Semaphore) acquire(ctx context.Context, n int64, wait bool) (int64, error) {
	if err := m.check(n, true); err != nil {
		if m.q.err == err {
			return 0, err
		}
		return 0, opErrorf(err, "acquire %q", m.q.lockName)
	}
	c := m.q.s.track(kindQueue, "acquire", m.q.lockName, wait)
	var fence int64
	_, err := m.q.s.withLease(ctx, c, func(g *Session) (bool, error) {
		var err error
		fence, err = m.acquireOn(ctx, c, m.q.on(g), n, wait)
		return fence > 0, err
	})
	return fence, err
}

func (m *Semaphore) acquireOn(ctx context.Context, c *call, q *queued, n int64, wait bool) (int64, error) {
	if err := q.precheck(ctx, "acquire"); err != nil {
		return 0, err
	}
	lq := q.s.queues.ref(q.name)
	if !wait {
		lq.mu.Lock()
		behind := len(lq.line) > 0 // goroutines of this process wait: do not overtake them
		lq.mu.Unlock()
		if behind {
			q.s.queues.unref(q.name)
			return 0, nil
		}
	}
	w, fence, err := q.s.acquireTicket(ctx, c, q.name, lq, want{mode: modeWeighted, weight: n, limit: m.limit}, wait)
	if err != nil || w == nil {
		q.s.queues.unref(q.name)
		return 0, q.wrap("acquire", err)
	}
	lq.mu.Lock()
	lq.permits = append(lq.permits, &permitHold{ticket: w.ticket, token: w.token, weight: n, limit: m.limit})
	lq.mu.Unlock()
	return fence, nil // the reference now belongs to the hold
}

// semHeadWait is the longest block of a Semaphore's first waiter on the
// oldest holder's doorbell while more than one holder is ahead of it:
// a release by any of them may let it in, and only the one it blocks on
// rings for it (see "Waking" at Semaphore). So another holder's release
// is seen within about this long (the block, then a take), at the cost of
// about three statements a second for the first waiter alone; the waiters
// behind it block on the waiter ahead without a bound of their own. One
// second is the shortest block GET_LOCK takes (whole seconds).
const semHeadWait = time.Second

// permitHold is one acquisition of a Semaphore's permits by this process:
// one ticket.
type permitHold struct {
	ticket, token int64
	weight        int64 // permits it holds now (Release may take part of them)
	limit         int64 // the name's limit, which its Semaphore had
}

// shrink gives back part of the hold h, which keeps weight permits
// (qSemShrink, see tickets.freeTicket), as release gives back a ticket
// (giveBack): it rings the session's doorbell, as waiters blocked on it
// may fit now, and when it fails the reaper sends it again.
func (q *queued) shrink(ctx context.Context, lq *localQueue, h *permitHold, weight int64) error {
	return q.giveBack(ctx, lq, orphan{name: q.name, token: h.token, ticket: true, seq: h.ticket, weight: weight}, "release")
}

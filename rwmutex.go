package dsync

import (
	"context"
	"math"
)

// An RWMutex is a reader/writer lock shared by every process whose
// [Session] reaches the same database and table prefix: any number of
// readers, in any sessions, or one writer. Create it with [NewRWMutex]; the
// zero value is not usable. An RWMutex is safe for concurrent use.
//
// Waiting follows the tickets of the line described at [FairMutex], whose
// write side an RWMutex is: a writer waits for every earlier ticket; a
// reader waits only for earlier writers. So a waiting writer blocks readers
// that arrive after it (writers do not starve), the readers before it
// finish first, and the readers queued behind a writer all enter together
// when it leaves. As a FairMutex's, an uncontended writer Lock takes the
// line's head slot in one statement, and a session that last found the
// line busy takes a ticket instead, once.
//
// Readers of one process share one database read hold when that is
// correct: a reader that finds its process already holding the read side
// joins that hold if no writer is queued behind it, anywhere; otherwise it
// takes its place in the line.
//
// With an owner in ctx ([WithOwner]), read and write holds are reentrant
// for that owner and only it may release them. A write Lock by an owner that
// holds a read lock returns [ErrLockUpgrade] at once instead of
// deadlocking, and so does an RLock by an owner that holds the write lock
// ([ErrLockDowngrade]). Without an owner, as with sync.RWMutex, any goroutine may
// release a hold, and a second RLock while a writer waits blocks.
type RWMutex struct {
	q queued
}

// NewRWMutex returns the reader/writer lock called name in s's lock space,
// whose write side is the [FairMutex] of that name; a name that a [Mutex]
// or an [Election] uses gives [ErrOtherKind]. Names follow the rules of [NewMutex];
// with an invalid one every method returns [ErrInvalidName]. NewRWMutex
// panics if s is nil.
func NewRWMutex(s *Session, name string) *RWMutex {
	return &RWMutex{q: newQueued(s, kindRowQueued, name, "RWMutex")}
}

// Name returns the lock's name.
func (rw *RWMutex) Name() string { return rw.q.lockName }

// Fence returns the fencing token of this process's current write hold, or
// 0 when it holds none. Read holds have no fence.
func (rw *RWMutex) Fence() int64 { return rw.q.fence() }

// Lock takes the write lock, as [FairMutex.Lock] does.
func (rw *RWMutex) Lock(ctx context.Context) error {
	_, err := rw.q.lock(ctx, true)
	return err
}

// TryLock takes the write lock only if nobody holds either side and nobody
// is waiting; it returns false, nil otherwise. It waits only for a new
// lease, as [Mutex.TryLock] says.
func (rw *RWMutex) TryLock(ctx context.Context) (bool, error) {
	return rw.q.lock(ctx, false)
}

// Unlock releases the write lock, as [FairMutex.Unlock] does.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	return rw.q.unlock(ctx)
}

// RLock takes a read lock, blocking while a writer holds the lock or waits
// ahead of this caller, until ctx ends or the session ends. Errors are as
// for [Mutex.Lock], plus [ErrLockDowngrade] when ctx's owner holds the write
// lock; on error the caller holds nothing.
func (rw *RWMutex) RLock(ctx context.Context) error {
	_, err := rw.q.rlock(ctx, true)
	return err
}

// TryRLock takes a read lock only if no writer holds the lock or waits for
// it; it returns false, nil otherwise, and errors as RLock does. It waits
// only for a new lease, as [Mutex.TryLock] says.
func (rw *RWMutex) TryRLock(ctx context.Context) (bool, error) {
	return rw.q.rlock(ctx, false)
}

// RUnlock releases one read lock. It returns [ErrNotHeld] when this process
// holds no read lock of the name, [ErrNotOwner] when the only read locks
// belong to other owners, [ErrSessionExpired] or [ErrSessionClosed] when the
// session has ended, or a database error. An RUnlock that leaves other read
// locks of the name in the process returns nil, even after the session
// ended: the read hold goes on until the last one's RUnlock.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	return rw.q.runlock(ctx)
}

// rlock takes a read hold, on the current lease, and again on a new one
// where a lost lease is replaced (see Session.withLease).
func (q *queued) rlock(ctx context.Context, wait bool) (bool, error) {
	c := q.s.track(kindQueue, "rlock", q.lockName, wait)
	return q.s.withLease(ctx, c, func(g *Session) (bool, error) { return q.on(g).rlockOn(ctx, c, wait) })
}

// rlockOn takes a read hold: joining one of this process, or with a ticket.
func (q *queued) rlockOn(ctx context.Context, c *call, wait bool) (bool, error) {
	if err := q.precheck(ctx, "rlock"); err != nil {
		return false, err
	}
	owner := ownerOf(ctx)
	lq := q.s.queues.ref(q.name)
	lq.mu.Lock()
	writing := owner != 0 && lq.held && lq.owner == owner
	lq.mu.Unlock()
	if writing {
		q.s.queues.unref(q.name)
		return false, opErrorf(ErrLockDowngrade, "rlock %q", q.lockName)
	}
	joined, err := q.joinRead(ctx, lq, owner)
	if err != nil || joined {
		q.s.queues.unref(q.name)
		return joined, q.wrap("rlock", err)
	}
	if !wait {
		lq.mu.Lock()
		busy := lq.held || len(lq.line) > 0
		lq.mu.Unlock()
		if busy {
			q.s.queues.unref(q.name)
			return false, nil
		}
	}
	w, _, err := q.join(ctx, c, lq, modeShared, wait, "rlock")
	if w == nil {
		return false, err
	}
	lq.mu.Lock()
	lq.reads = append(lq.reads, &readHold{ticket: w.ticket, token: w.token, count: 1})
	q.countReader(lq, owner, 1)
	lq.mu.Unlock()
	return true, nil // the reference now belongs to the hold
}

// joinRead adds the caller to a read hold this process already has, when
// that is correct: the owner's own reentrant read, or any reader when no
// writer, local or remote, is queued behind the hold.
func (q *queued) joinRead(ctx context.Context, lq *localQueue, owner uint64) (bool, error) {
	lq.mu.Lock()
	if len(lq.reads) == 0 || len(lq.line) > 0 {
		lq.mu.Unlock()
		return false, nil
	}
	hold := lq.reads[len(lq.reads)-1]
	if owner != 0 && lq.rOwners[owner] > 0 {
		hold.count++
		q.countReader(lq, owner, 1)
		lq.mu.Unlock()
		return true, nil
	}
	lq.mu.Unlock()

	n, err := q.s.tickets.conflicts(ctx, q.name, hold.ticket, math.MaxInt64, modeShared)
	if err != nil || n > 0 {
		return false, err
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if len(lq.reads) == 0 || lq.reads[len(lq.reads)-1] != hold || len(lq.line) > 0 {
		return false, nil // the hold ended or a local writer queued meanwhile
	}
	hold.count++
	q.countReader(lq, owner, 1)
	return true, nil
}

// countReader adds d to the read holds of owner (0: without owner).
// Called with lq.mu held.
func (q *queued) countReader(lq *localQueue, owner uint64, d int) {
	if owner == 0 {
		lq.rAnon += d
		return
	}
	if lq.rOwners[owner] += d; lq.rOwners[owner] == 0 {
		delete(lq.rOwners, owner)
	}
}

// runlock releases one read hold, on the lease it was taken under.
func (q *queued) runlock(ctx context.Context) error { return q.on(q.s.current()).runlockOn(ctx) }

func (q *queued) runlockOn(ctx context.Context) error {
	if q.err != nil {
		return q.err
	}
	lq := q.s.queues.lookup(q.name)
	if lq == nil {
		return q.notHeld("runlock")
	}
	owner := ownerOf(ctx)
	lq.mu.Lock()
	switch {
	case owner != 0 && lq.rOwners[owner] > 0:
		q.countReader(lq, owner, -1)
	case lq.rAnon > 0:
		q.countReader(lq, 0, -1)
	case len(lq.rOwners) > 0:
		lq.mu.Unlock()
		return opErrorf(ErrNotOwner, "runlock %q", q.lockName)
	default:
		lq.mu.Unlock()
		return q.notHeld("runlock")
	}
	hold := lq.reads[len(lq.reads)-1]
	if hold.count--; hold.count > 0 {
		lq.mu.Unlock()
		return nil // the hold, and its reference, stay for the other readers
	}
	lq.reads = lq.reads[:len(lq.reads)-1]
	lq.mu.Unlock()
	return q.release(ctx, lq, hold.ticket, hold.token, "runlock")
}

package dsync

import "context"

// A FairMutex is a mutual exclusion lock, shared like [Mutex] by every
// process whose [Session] reaches the same database and table prefix, that
// serves waiters strictly first come, first served. Create it with
// [NewFairMutex]; the zero value is not usable. A FairMutex is safe for
// concurrent use. Owners ([WithOwner]), reentrancy and fences behave as for
// Mutex.
//
// FairMutex and [RWMutex] share one lock space: a FairMutex is exactly the
// write side of the RWMutex of the same name. A name is one lock: while a
// [Mutex] or an [Election] uses it (holds it, or held it and its row is
// not cleaned up yet, see [WithFreeRowAge]), the calls that take a
// FairMutex or RWMutex of the name return [ErrOtherKind], and the other
// way round.
//
// # Fairness
//
// Every waiter takes a ticket when it starts waiting, numbered per name in
// the order the database commits the tickets (on a Galera cluster too, see
// docs/OPERATIONS.md, "Running on a cluster"), so the database, not a client's
// clock, decides the order of arrival across all processes and goroutines. The lowest live ticket holds
// the lock; the others wait in ticket order, and no fixed capacity limits
// the line. Within one process, goroutines take their tickets one at a
// time, in the order they called Lock, so no later goroutine overtakes an
// earlier one; and only the first of them waits on the database, as with
// Mutex.
//
// A waiter whose ctx ends leaves the line at once: its ticket is deleted
// (and, should that fail, deleted by the session's keep-alive later). A
// waiter or holder whose session dies keeps its ticket, but a ticket counts
// only while its lease is live, so the line moves on at most one TTL after
// the crash: one dead process never stalls the queue.
//
// Handoff: the first waiter of each process blocks on the doorbell of the
// nearest conflicting ticket ahead of it, whose release wakes it (see the
// package's Waiting section). Where there are no doorbells (a Galera
// cluster, a *sql.DB with a connection limit below 8) it polls the
// database, every 2ms for each conflicting ticket ahead of it (so every
// 2ms when next in line), or sooner when the session's back-off (see
// [WithBackOff]) says so, within the polling budget (a few fast polls, then
// about 12 statements a second). While a goroutine of its own process holds the lock it does not
// wait on the database: that holder's Unlock wakes it at once. The price of
// fairness is throughput: a lock handed over in strict order cannot be
// grabbed by whoever happens to ask at the right moment, and a waiter
// pays a few more statements than a Mutex's (enqueue, check, delete).
// Uncontended, Lock and Unlock are one statement each, as a Mutex's: with
// nobody holding or waiting, Lock takes the head slot of the name's row
// (its fence in the same statement) instead of a ticket, and holds the
// lock ahead of every ticket queued after it. (A session that last found
// the line busy takes a ticket instead, once: its first Lock after the
// contention ends costs one statement more.)
type FairMutex struct {
	q queued
}

// NewFairMutex returns the fair mutex called name in s's lock space, the
// write side of the RWMutex of that name; a name that a [Mutex] uses gives
// [ErrOtherKind].
// Names follow the rules of [NewMutex]; with an invalid one every method
// returns [ErrInvalidName]. NewFairMutex panics if s is nil.
func NewFairMutex(s *Session, name string) *FairMutex {
	return &FairMutex{q: newQueued(s, kindRowQueued, name, "FairMutex")}
}

// Name returns the lock's name.
func (m *FairMutex) Name() string { return m.q.lockName }

// Fence returns the fencing token of this process's current hold of the
// lock, or 0 when it does not hold it. Fences of a name are strictly
// increasing across all its acquisitions (through FairMutex or RWMutex).
func (m *FairMutex) Fence() int64 { return m.q.fence() }

// Lock joins the line and blocks until it is this caller's turn, ctx ends,
// or the session ends. Errors are as for [Mutex.Lock] ([ErrOtherKind] when
// a Mutex uses the name), plus [ErrLockUpgrade] when ctx's owner holds a
// read lock of the name. On error
// the caller is out of the line and holds nothing.
func (m *FairMutex) Lock(ctx context.Context) error {
	_, err := m.q.lock(ctx, true)
	return err
}

// TryLock acquires the lock only if it is free and nobody is waiting for
// it: it never jumps the line. It returns false, nil otherwise, and errors
// as Lock does. It waits only for a new lease, as [Mutex.TryLock] says.
func (m *FairMutex) TryLock(ctx context.Context) (bool, error) {
	return m.q.lock(ctx, false)
}

// Unlock releases one hold of the lock, as [Mutex.Unlock] does, and lets the
// next waiter in. It returns [ErrNotHeld], [ErrNotOwner],
// [ErrSessionExpired], [ErrSessionClosed] or a database error.
func (m *FairMutex) Unlock(ctx context.Context) error {
	return m.q.unlock(ctx)
}

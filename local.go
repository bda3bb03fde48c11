package dsync

import (
	"context"
	"database/sql"
	"sync"
)

// localLock is the in-process layer of one lock name in one Session.
// Goroutines of the process queue on sem; only the goroutine that holds sem
// talks to the database about the name, so N local waiters cost one
// database waiter, and the session never runs two acquisitions of one name
// at once.
type localLock struct {
	// sem holds one value while a goroutine of this process holds the lock
	// or is acquiring it. Sending is locking, so waiting honours ctx.
	sem chan struct{}

	mu   sync.Mutex
	hold // guarded by mu; the database row is held for this process when held
}

// registry holds the in-process state (T) of the lock names in use in one
// Session. A name's state lives while it has references: calls in progress
// and holds. Its methods lock mu, the Session's.
type registry[T any] struct {
	mu      *sync.Mutex
	entries map[string]*registered[T] // guarded by mu
	create  func() *T
	gone    func() // called with mu held after a name's state was forgotten
}

type registered[T any] struct {
	refs  int // guarded by registry.mu
	state *T
}

func newRegistry[T any](mu *sync.Mutex, gone func(), create func() *T) registry[T] {
	return registry[T]{mu: mu, entries: make(map[string]*registered[T]), create: create, gone: gone}
}

// ref returns the state of name, creating it, and counts a reference.
func (r registry[T]) ref(name string) *T {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	if e == nil {
		e = &registered[T]{state: r.create()}
		r.entries[name] = e
	}
	e.refs++
	return e.state
}

// unref drops a reference taken by ref, forgetting the state of name when
// none is left.
func (r registry[T]) unref(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[name]
	if e.refs--; e.refs == 0 {
		delete(r.entries, name)
		r.gone()
	}
}

// lookup returns the state of name, or nil when nothing uses it.
func (r registry[T]) lookup(name string) *T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.entries[name]; e != nil {
		return e.state
	}
	return nil
}

// enter takes the local lock of l: at once when wait is false (reporting
// false when another goroutine has it), otherwise blocking until it is free,
// ctx ends or the session ends. A block is a wait of the lock call c (see
// Stats).
func (s *Session) enter(ctx context.Context, c *call, l *localLock, wait bool) (bool, error) {
	select {
	case l.sem <- struct{}{}:
		return true, nil
	default:
		if !wait {
			return false, nil
		}
	}
	c.noteWait() // another goroutine of the process holds or is acquiring the lock
	select {
	case l.sem <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-s.done:
		return false, s.leaseErr()
	}
}

// leave releases the local lock of l taken by enter.
func (l *localLock) leave() { <-l.sem }

// hold is one exclusive hold of a lock by this process, with its owner and
// reentrancy count. Its user guards it with its own mutex.
type hold struct {
	held  bool
	owner uint64  // owner token of the hold, 0 for none
	count int     // reentrant holds of owner (1 without owner)
	fence int64   // fencing token of the hold
	token int64   // acquisition token of the hold
	tx    *sql.Tx // the transaction holding it (Mutex.LockTx), nil for a Lock
}

// reenter counts one more hold when owner (non-zero) already holds it.
func (h *hold) reenter(owner uint64) bool {
	if owner == 0 || !h.held || h.owner != owner {
		return false
	}
	h.count++
	return true
}

// take records a new hold.
func (h *hold) take(owner uint64, fence, token int64) {
	*h = hold{held: true, owner: owner, count: 1, fence: fence, token: token}
}

// drop undoes one hold by owner (the owner in the caller's context). It
// returns the token to release when that was the last hold, 0 when holds
// remain, or ErrNotHeld or ErrNotOwner.
func (h *hold) drop(owner uint64) (int64, error) {
	switch {
	case !h.held:
		return 0, ErrNotHeld
	case h.owner != 0 && h.owner != owner:
		return 0, ErrNotOwner
	}
	if h.count--; h.count > 0 {
		return 0, nil
	}
	token := h.token
	*h = hold{}
	return token, nil
}

// reenter counts one more hold when owner (non-zero) already holds l.
func (l *localLock) reenter(owner uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hold.reenter(owner)
}

// currentFence returns the fence of the hold, or 0 when not held.
func (l *localLock) currentFence() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fence // 0 when not held
}

package dsync

import (
	"context"
	"sync"
)

// localLock is the in-process layer of one lock name in one Session.
// Goroutines of the process queue on sem; only the goroutine that holds sem
// talks to the database about the name, so N local waiters cost one
// database waiter, and the session never runs two acquisitions of one name
// at once (which lets the acquire statement treat a row held by its own
// session as an orphan it may take over).
type localLock struct {
	// sem holds one value while a goroutine of this process holds the lock
	// or is acquiring it. Sending is locking, so waiting honours ctx.
	sem chan struct{}

	refs int // guarded by Session.mu; calls in progress plus 1 while held

	mu    sync.Mutex
	held  bool   // guarded by mu; the database row is held for this process
	owner uint64 // guarded by mu; owner token of the hold, 0 for none
	count int    // guarded by mu; reentrant holds of owner (1 without owner)
	fence int64  // guarded by mu; fencing token of the hold
	token int64  // guarded by mu; acquisition token of the hold
}

// ref returns the local state of name, creating it, and counts a reference.
func (s *Session) ref(name string) *localLock {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.locks[name]
	if l == nil {
		l = &localLock{sem: make(chan struct{}, 1)}
		s.locks[name] = l
	}
	l.refs++
	return l
}

// unref drops a reference, forgetting the state of name when none is left.
func (s *Session) unref(name string, l *localLock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(s.locks, name)
	}
}

// lookup returns the local state of name, or nil when nothing uses it.
func (s *Session) lookup(name string) *localLock {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.locks[name]
}

// enter takes the local lock of l: at once when wait is false (reporting
// false when another goroutine has it), otherwise blocking until it is free,
// ctx ends or the session ends.
func (s *Session) enter(ctx context.Context, l *localLock, wait bool) (bool, error) {
	if !wait {
		select {
		case l.sem <- struct{}{}:
			return true, nil
		default:
			return false, nil
		}
	}
	select {
	case l.sem <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-s.done:
		return false, s.Err()
	}
}

// leave releases the local lock of l taken by enter.
func (l *localLock) leave() { <-l.sem }

// reenter counts one more hold when owner (non-zero) already holds l.
func (l *localLock) reenter(owner uint64) bool {
	if owner == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held && l.owner == owner {
		l.count++
		return true
	}
	return false
}

// currentFence returns the fence of the hold, or 0 when not held.
func (l *localLock) currentFence() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return 0
	}
	return l.fence
}

package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A session made WithReplaceLostLease is a line of leases, one Session
// each: the Session that NewSession returned is the first, and the one
// whose methods the caller calls; the lock values made on it run each
// call on the current lease's Session (see Session.withLease and the
// lock types' on). A lost lease is replaced only once nothing taken under
// it is held any more: while a hold remains, its lease is the current one,
// so that Done, Err and every call report the loss exactly as without the
// option, and a hold's Unlock always finds the lease it was taken under.

// succession is the line of leases of a Session made WithReplaceLostLease.
type succession struct {
	db    *sql.DB
	opts  options
	stats *counters // shared by every lease of the line

	cur atomic.Pointer[Session] // the current lease's Session; written under mu

	// turn is held by the one goroutine replacing a lost lease, and by
	// Close, so that Close waits for a replacement under way to give up.
	turn chan struct{}

	closing context.Context // ends when Close begins
	stop    context.CancelFunc

	// The pace of the tries to open a new lease is the line's, not a
	// call's (guarded by turn): a caller whose ctx ends hands the pause it
	// reached to the next one, and a new lease lost at once (opening it
	// took most of a TTL) is not replaced at once again.
	pause   time.Duration // the pause after the last try; see replace
	nextTry time.Time     // no try starts before it

	mu     sync.Mutex
	closed bool // guarded by mu; Close has begun
}

func newSuccession(db *sql.DB, o options, first *Session) *succession {
	sc := &succession{db: db, opts: o, stats: first.stats, turn: make(chan struct{}, 1)}
	sc.closing, sc.stop = context.WithCancel(context.Background())
	sc.cur.Store(first)
	return sc
}

// current returns the Session of the current lease: s itself, but for a
// session made WithReplaceLostLease.
func (s *Session) current() *Session {
	if s.line == nil {
		return s
	}
	return s.line.cur.Load()
}

// withLease runs call, a lock call that holds nothing when it fails, on the
// current lease. On a session made WithReplaceLostLease, when call failed
// because its lease was lost, it replaces the lease (see replace) and runs
// call again on the new one, until ctx ends. c counts the lock call (see
// track) from its start to its return, across leases, the wait for a new
// one included.
func (s *Session) withLease(ctx context.Context, c *call, call func(*Session) (bool, error)) (ok bool, err error) {
	defer c.done(&ok, &err)
	for {
		g := s.current()
		ok, err := call(g)
		var final finalError
		if err == nil || s.line == nil || !errors.Is(err, ErrSessionExpired) || ctx.Err() != nil || errors.As(err, &final) {
			return ok, err
		}
		if err := s.line.replace(ctx, c, g, err); err != nil {
			return false, err
		}
	}
}

// finalError marks the error of a lock call that withLease must return
// as it is, even when it wraps ErrSessionExpired: the call failed after it
// left something that a run on a new lease would meet (see takeTx). It
// wraps the error, and says what it says.
type finalError struct{ error }

func (e finalError) Unwrap() error { return e.error }

// Replacement's pace while the database cannot be reached: each try is
// bounded by the TTL (a black-holed network never answers), and the tries
// are replaceFirst apart, then twice as far each time, up to replaceMax
// (the renewal period's cap), so that a long outage costs a connection
// attempt every 2s, not a busy loop, however many calls wait and however
// short their ctx. A try that opened a lease starts the next pause too:
// a lease lost at once is replaced after it. The series starts again from
// replaceFirst once a try is due more than replaceMax ago.
const (
	replaceFirst = 100 * time.Millisecond
	replaceMax   = maxRenewEvery
)

// unusedPoll is how often replace looks again whether the lost lease's
// last call has ended or become a hold, besides being woken when its last
// name goes (a local check, no statement).
const unusedPoll = 50 * time.Millisecond

// replace opens a new lease in place of lost, whose call failed with
// cause (ErrSessionExpired), once nothing taken under lost is held and no
// call on it remains. It returns nil when the current lease is a new one
// (made now or by another call meanwhile); cause when a Lock or RLock hold
// of lost remains (the loss is then reported, as without the option);
// ErrSessionClosed after Close; or, when ctx ends first, an error wrapping
// cause and ctx.Err().
func (sc *succession) replace(ctx context.Context, c *call, lost *Session, cause error) error {
	ended := func() error {
		if sc.closing.Err() != nil {
			return ErrSessionClosed
		}
		return fmt.Errorf("%w (waiting for a new lease: %w)", cause, ctx.Err())
	}
	select {
	case sc.turn <- struct{}{}:
	case <-ctx.Done():
		return ended()
	case <-sc.closing.Done():
		return ErrSessionClosed
	}
	defer func() { <-sc.turn }()
	switch {
	case sc.closing.Err() != nil:
		return ErrSessionClosed
	case sc.cur.Load() != lost:
		return nil // replaced meanwhile
	case !errors.Is(lost.leaseErr(), ErrSessionExpired):
		return cause
	}
	c.noteWait() // for a new lease (see Stats)
	// The calls still running on lost end promptly (they end with its
	// lease), but one may have been granted just before the loss and
	// become a hold: look again now and then.
	for {
		if lost.holding() {
			return cause
		}
		unused := lost.whenUnused()
		if unused == nil {
			break
		}
		if err := sc.sleep(ctx, unusedPoll, unused, ended); err != nil {
			return err
		}
	}
	if time.Since(sc.nextTry) > replaceMax {
		sc.pause = 0 // a new outage, or a lease that lived
	}
	for {
		if d := time.Until(sc.nextTry); d > 0 {
			if err := sc.sleep(ctx, d, nil, ended); err != nil {
				return err
			}
		}
		tctx, cancel := context.WithTimeout(ctx, sc.opts.ttl)
		stopCancel := context.AfterFunc(sc.closing, cancel)
		next, err := startSession(tctx, sc.db, sc.opts, sc.stats)
		stopCancel()
		cancel()
		sc.pause = min(max(2*sc.pause, replaceFirst), replaceMax)
		sc.nextTry = time.Now().Add(sc.pause)
		if err == nil {
			next.txHolds.records = lost.txHolds.records // LockTx again in a transaction finds its hold
			sc.mu.Lock()
			closed := sc.closed
			if !closed {
				sc.cur.Store(next)
			}
			sc.mu.Unlock()
			if closed {
				next.closeLease()
				return ErrSessionClosed
			}
			// The lost lease's goroutines end and its connections go; its
			// row ends on the server, and with it what it may still hold
			// there (an acquisition that landed as it was lost).
			lost.closeLease()
			next.logger.Info("dsync: lost lease replaced", "lost", lost.id)
			return nil
		}
		switch {
		case sc.closing.Err() != nil:
			return ErrSessionClosed
		case ctx.Err() != nil:
			return ended()
		case errors.Is(err, ErrSchemaVersion) || errors.Is(err, ErrInvalidOption):
			return fmt.Errorf("%w (opening a new lease: %w)", cause, err)
		}
		lost.logger.Warn("dsync: opening a new lease failed; retrying", "err", err, "retry_in", sc.pause)
	}
}

// sleep waits d, or until wake (nil: never) is closed, and returns nil;
// or, when ctx ends or Close begins first, ended's error.
func (sc *succession) sleep(ctx context.Context, d time.Duration, wake <-chan struct{}, ended func() error) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
		return ended()
	case <-sc.closing.Done():
		return ended()
	}
	return nil
}

// close is Close of a session made WithReplaceLostLease: no lease is
// opened from now on, a replacement under way gives up, and the current
// lease's Session is closed.
func (sc *succession) close() error {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return ErrSessionClosed
	}
	sc.closed = true
	sc.mu.Unlock()
	sc.stop()
	sc.turn <- struct{}{}
	defer func() { <-sc.turn }()
	return sc.cur.Load().closeLease()
}

// holding reports whether a Lock, RLock or Semaphore hold of this lease
// remains in the process: one that its caller must release, and that its
// release reports lost. (A LockTx hold ends in the process by itself once the
// lease is lost.)
func (s *Session) holding() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.locks.entries {
		l := e.state
		l.mu.Lock()
		held := l.held && l.tx == nil
		l.mu.Unlock()
		if held {
			return true
		}
	}
	for _, e := range s.queues.entries {
		lq := e.state
		lq.mu.Lock()
		held := lq.held || len(lq.reads) > 0 || len(lq.permits) > 0
		lq.mu.Unlock()
		if held {
			return true
		}
	}
	return false
}

// whenUnused returns a channel that is closed when no name of the
// session's is in use any more (no hold, no call), or nil when none is
// now.
func (s *Session) whenUnused() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.locks.entries) == 0 && len(s.queues.entries) == 0 {
		return nil
	}
	if s.unused == nil {
		s.unused = make(chan struct{})
	}
	return s.unused
}

// noteUnused closes unused once the last name went; called with mu held
// whenever a name's state is forgotten (see registry).
func (s *Session) noteUnused() {
	if s.unused != nil && len(s.locks.entries) == 0 && len(s.queues.entries) == 0 {
		close(s.unused)
		s.unused = nil
	}
}

package dsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// A hold is the time between a lock call that succeeded and its release.
// This file turns a hold into what APIs built on holds need: a context
// that ends with it (holdContext, and Do, RDo and Election.Lead, which run
// a function under a hold), and the sync.Locker adapters (Locker,
// RLocker).

// holdContext returns a context derived from parent that is cancelled when
// lease, the Session of the lease a hold was taken on, ends: lost (its
// cause then wraps [ErrSessionExpired]) or closed ([ErrSessionClosed]).
// The lease's Done closes before the server could let anyone else take
// what it holds (the safety margin of lease.safetyMargin), so the context
// ends before anyone else can take the hold over. what names the hold in
// the cause (`hold of "name"`, `leadership of "name"`).
//
// lease must be the hold's own lease: on a session made
// WithReplaceLostLease, s.current() read after the acquisition returned,
// while holding (see Session.Done); the hold keeps its lease the current
// one until it is released.
//
// The context's Err also checks the lease's local deadline, as
// Session.Err does: after a pause of the process past it (SIGSTOP, a VM
// pause), Err reports the loss, and Done is closed, before the keep-alive
// goroutine has run again. The context also ends when parent does, and
// when release is called, which the caller must do when the hold ends; no
// goroutine runs until one of these happens.
func holdContext(parent context.Context, lease *Session, what string) (ctx context.Context, release func()) {
	inner, cancel := context.WithCancelCause(parent)
	h := &holdCtx{Context: inner, lease: lease, cancel: cancel, what: what}
	// stopped ends just after Done closes, with the lease's Err set, and
	// in every way a lease ends (see Session.lose and closeLease).
	stop := context.AfterFunc(lease.stopped, h.lost)
	if lease.leaseErr() != nil {
		h.lost() // ended before the AfterFunc's goroutine would run
	}
	return h, func() {
		stop()
		cancel(nil)
	}
}

// holdCtx is the context of a hold (see holdContext).
type holdCtx struct {
	context.Context // the cancelCtx that cancel ends
	lease           *Session
	cancel          context.CancelCauseFunc
	what            string
}

// lost cancels the context with the end of the lease as its cause.
func (h *holdCtx) lost() {
	if err := h.lease.leaseErr(); err != nil {
		h.cancel(opErrorf(err, "%s", h.what))
	}
}

// Err returns the context's error, after cancelling it when the lease has
// ended, or passed its local deadline meanwhile (see holdContext).
func (h *holdCtx) Err() error {
	if err := h.Context.Err(); err != nil {
		return err
	}
	h.lost()
	return h.Context.Err()
}

// runHeld is Do (op "do"), RDo ("rdo") and Election.Lead ("lead") of the
// lock or election called name: it takes the hold (held: "hold", "read
// hold" or "leadership") with lock(ctx), runs fn with the hold's context,
// and releases the hold with unlock, also when fn panics or calls
// runtime.Goexit. The lease of the hold is s.current() read once the lock
// is held.
func runHeld(ctx context.Context, s *Session, op, held, name string, lock, unlock func(context.Context) error, fn func(context.Context) error) (err error) {
	if fn == nil {
		return opErrorf(fmt.Errorf("%w: nil fn", ErrInvalidOption), "%s %q", op, name)
	}
	if err := lock(ctx); err != nil {
		return err
	}
	hctx, release := holdContext(ctx, s.current(), fmt.Sprintf("%s of %q", held, name))
	defer func() {
		// fn's context ends before the lock is released, so that what fn
		// left running learns the hold's end before anyone else can take
		// the lock. The release survives the caller's cancellation (a Do
		// whose ctx ended never leaves the lock held), bounded by the TTL:
		// when it fails, the session frees the lock in the background.
		release()
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.TTL())
		defer cancel()
		if uerr := unlock(uctx); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(hctx)
}

// Do locks m (as [Mutex.Lock] does, with ctx), runs fn, and unlocks m
// (as [Mutex.Unlock] does), returning fn's error joined with Unlock's.
//
// fn's context is derived from ctx (its values, the owner of [WithOwner]
// included, and its cancellation) and also ends when the hold is lost:
// when the session's lease is lost ([Session.Done] closes), which happens
// before the server can let any other session take the lock, or when the
// session is closed. [context.Cause] of it then wraps [ErrSessionExpired]
// or [ErrSessionClosed]. Its Err also reports a loss the keep-alive has
// not noticed yet, after a pause of the process past the lease's local
// deadline (see [Session.Err]). Stop the work when it ends, and check it
// (or use [Mutex.Fence]) before each write the lock protects. It does not
// end when an operator frees the lock by force ([ForceRelease]): only the
// release learns of that ([ErrReleasedByForce]). It ends as the lock is
// released, before the lock is free.
//
// The release does not depend on ctx: a Do whose ctx is cancelled while
// fn runs still releases the lock at once (within the session's TTL; when
// that fails the session frees it in the background). When fn panics (or
// calls runtime.Goexit), Do releases the lock and the panic goes on.
//
// Do returns Lock's error when it could not lock (fn does not run);
// otherwise fn's error, joined ([errors.Join]) with Unlock's when that
// failed: [ErrSessionExpired] or [ErrSessionClosed] when the session
// ended during fn, and [ErrReleasedByForce] after a [ForceRelease], all
// meaning that the hold was lost, possibly before fn ended; ctx's error
// or a database error when the release failed, which the session then
// retries in the background. A nil fn returns an error wrapping
// [ErrInvalidOption], and locks nothing.
//
// As with Lock, without an owner in ctx a Lock of m inside fn waits for
// ever: the hold is not reentrant.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return runHeld(ctx, m.s, "do", "hold", m.name, m.Lock, m.Unlock, fn)
}

// Do locks m, runs fn and unlocks m, as [Mutex.Do] does.
func (m *FairMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return runHeld(ctx, m.q.s, "do", "hold", m.q.name, m.Lock, m.Unlock, fn)
}

// Do takes the write lock, runs fn and releases it, as [Mutex.Do] does.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return runHeld(ctx, rw.q.s, "do", "hold", rw.q.name, rw.Lock, rw.Unlock, fn)
}

// RDo takes a read lock (RLock), runs fn and releases it (RUnlock), as
// [Mutex.Do] does.
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	return runHeld(ctx, rw.q.s, "rdo", "read hold", rw.q.name, rw.RLock, rw.RUnlock, fn)
}

// Lead campaigns with value (as [Election.Campaign] does, with ctx), runs
// fn while this session leads, and resigns (as [Election.Resign] does),
// returning fn's error joined with the end of the leadership's.
//
// fn's context is derived from ctx and also ends when the leadership is
// lost, with the session's lease: [Session.Done] closes before the server
// can let another campaigner lead, so the context ends before the next
// term can begin, with a cause wrapping [ErrSessionExpired] (or
// [ErrSessionClosed] after Close). Its Err also reports a loss that the
// keep-alive has not noticed yet, as [Mutex.Do]'s does. Check it (or pass
// [Election.Term] as a fencing token) before each write that only the
// leader may make. It ends as the leadership is given up, before the next
// campaigner can lead.
//
// The resignation does not depend on ctx: a Lead whose ctx is cancelled
// while fn runs still resigns at once (within the session's TTL; when that
// fails the session ends the leadership in the background). When fn
// panics (or calls runtime.Goexit), Lead resigns and the panic goes on.
//
// Lead returns Campaign's error when this session did not come to lead
// (fn does not run); otherwise fn's error, joined ([errors.Join]) with an
// error wrapping [ErrSessionExpired] or [ErrSessionClosed] when the
// leadership was lost during fn (possibly before fn ended), or with
// Resign's error when the resignation failed. A nil fn returns an error
// wrapping [ErrInvalidOption], and campaigns for nothing. When this
// Election leads already, Lead runs fn in the current term, and ends it.
func (e *Election) Lead(ctx context.Context, value string, fn func(ctx context.Context) error) error {
	var lease *Session // the term's, once Campaign has returned
	campaign := func(ctx context.Context) error {
		if err := e.Campaign(ctx, value); err != nil {
			return err
		}
		e.mu.Lock()
		lease = e.g
		e.mu.Unlock()
		return nil
	}
	resign := func(ctx context.Context) error {
		// Resign says nothing of a leadership the session's end ended:
		// the lease does.
		err := e.Resign(ctx)
		if lease == nil {
			return err
		}
		if lerr := lease.leaseErr(); lerr != nil && err == nil {
			err = opErrorf(lerr, "lead %q", e.name)
		}
		return err
	}
	return runHeld(ctx, e.q.s, "lead", "leadership", e.name, campaign, resign, fn)
}

// Locker returns a [sync.Locker] whose Lock and Unlock are m's, for APIs
// that take one (sync.Cond, and libraries that guard a resource with a
// Locker).
//
// A sync.Locker returns no error, so the adapter decides:
//   - Lock calls [Mutex.Lock] with context.Background(): it waits as long
//     as it takes, without a deadline, and returns only holding the lock.
//     Any error panics, with an error (a panic value of type error) that
//     wraps Lock's: [ErrSessionExpired] or [ErrSessionClosed] (the session
//     ended before or while it waited), [ErrInvalidName], [ErrOtherKind],
//     [ErrNotObtained] (a [WithBackOff] policy that gives up) or a
//     database error that is not retried.
//   - Unlock calls [Mutex.Unlock] with context.Background(). It panics,
//     with an error wrapping Unlock's, when the release says that the
//     hold was not the caller's or was lost: [ErrNotHeld] (unlock of an
//     unlocked lock, the "unlock of unlocked mutex" of sync.Mutex, which
//     that makes a fatal error; here a panic that recover can stop),
//     [ErrReleasedByForce], [ErrNotOwner], [ErrSessionExpired],
//     [ErrSessionClosed], [ErrInvalidName]. After a database error it
//     does not panic: the hold is over in this process, the session frees
//     the row in the background (see [Mutex.Unlock]), and the error is
//     logged on the session's logger.
//
// The adapter has no owner (see [WithOwner]): it behaves like a
// sync.Mutex, not reentrant (a second Lock by the same goroutine waits
// for ever), and any goroutine may Unlock what any other locked through
// it or through m without an owner; its Unlock of a hold taken with an
// owner panics with ErrNotOwner.
//
// Do not use it where the session can be lost and a panic in Unlock (or
// Lock) is not acceptable, nor where the work under the lock must stop
// when the lease is lost: a Locker cannot tell the work, and the loss
// surfaces only as Unlock's panic, after the work. Use [Mutex.Do] (or
// Lock, [Session.Done] and Unlock) there. A session made
// [WithReplaceLostLease] makes a waiting Lock carry on under a new
// lease, but not a hold: Unlock after its loss still panics.
func (m *Mutex) Locker() sync.Locker {
	return &locker{s: m.s, lock: m.Lock, unlock: m.Unlock, what: "Locker"}
}

// Locker returns a [sync.Locker] whose Lock and Unlock are m's, with the
// rules of [Mutex.Locker].
func (m *FairMutex) Locker() sync.Locker {
	return &locker{s: m.q.s, lock: m.Lock, unlock: m.Unlock, what: "Locker"}
}

// Locker returns a [sync.Locker] whose Lock and Unlock take and release
// the write lock, with the rules of [Mutex.Locker].
func (rw *RWMutex) Locker() sync.Locker {
	return &locker{s: rw.q.s, lock: rw.Lock, unlock: rw.Unlock, what: "Locker"}
}

// RLocker returns a [sync.Locker] whose Lock and Unlock call RLock and
// RUnlock, as sync.RWMutex's RLocker does, with the rules of
// [Mutex.Locker]: readers of any session share the lock, and a writer
// excludes them.
func (rw *RWMutex) RLocker() sync.Locker {
	return &locker{s: rw.q.s, lock: rw.RLock, unlock: rw.RUnlock, what: "RLocker"}
}

// locker is the sync.Locker of a lock's Lock and Unlock (see
// Mutex.Locker).
type locker struct {
	s            *Session // the lock's: its logger reports releases left to the background
	lock, unlock func(context.Context) error
	what         string // Locker or RLocker, in the panics' errors (which name the lock)
}

func (l *locker) Lock() {
	if err := l.lock(context.Background()); err != nil {
		panic(opErrorf(err, "%s.Lock", l.what))
	}
}

func (l *locker) Unlock() {
	err := l.unlock(context.Background())
	for _, lost := range []error{ErrNotHeld, ErrNotOwner, ErrSessionExpired, ErrSessionClosed, ErrInvalidName} {
		if errors.Is(err, lost) {
			panic(opErrorf(err, "%s.Unlock", l.what))
		}
	}
	if err != nil {
		l.s.current().logger.Warn("dsync: Locker's release failed; the session frees the lock in the background", "err", err)
	}
}

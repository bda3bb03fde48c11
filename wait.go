package dsync

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// The one wait loop: every call that waits for a lock (Mutex.Lock, the
// queued locks' turn, the pause of createQueueRow after a lock wait) runs
// waitFor, and supplies its policy in a waitPolicy: what one attempt is,
// what its doorbell wait is, how fast it polls. The loop owns what they
// share: the result of an attempt, the session's back-off (made at the
// first wait, so a call that never waits never makes one), the timer, the
// ends of ctx and of the session, and the checks after a doorbell.

// waitPolicy is what a kind of wait supplies to waitFor. Only try is
// required.
type waitPolicy struct {
	// try makes one attempt: taken when the lock is now held; false and no
	// error when another holds it (waitFor then waits, or gives up
	// without wait); or the attempt's error, which waitFor classifies
	// (ctx, session, retryable), unless it is a stopWait.
	try func(ctx context.Context, w *waitState) (taken bool, err error)
	// retrying, when set, is told of a retryable error before the wait.
	retrying func(err error)
	// bell, when set, waits on a doorbell after an attempt that found the
	// lock held, and tells the loop what to do next (see waitOutcome);
	// unset, the loop polls.
	bell func(ctx context.Context, w *waitState) waitOutcome
	// poll, when set, returns the delay of a poll after an attempt that
	// found the lock held and no doorbell to wait on, given the
	// back-off's d.
	poll func(ctx context.Context, w *waitState, d time.Duration) time.Duration
	// idle, when set, reports that no timer should wake the loop, only
	// kick (a goroutine of this process holds the lock, and its release
	// kicks the waiter).
	idle func() bool
	// kick, when not nil, wakes the loop for its next attempt at once.
	kick <-chan struct{}
}

// waitState is what one call's waiting remembers between attempts.
type waitState struct {
	attempt int       // the attempt about to be made or just made; 0: the first
	started time.Time // when the call first waited; zero until then
	bells   bellState // the doorbell waits' (see doorbell.go)
}

// stopWait is an attempt's error that ends the wait as it is, without
// waitFor's classification of errors.
type stopWait struct{ err error }

func (e stopWait) Error() string { return e.err.Error() }
func (e stopWait) Unwrap() error { return e.err }

// waitFor makes attempts at a lock as p says until one takes it (true,
// nil), or, without wait, one finds it held (false, nil), or ctx ends
// (ctx.Err()), or the session ends (its Err), or the back-off gives up
// ([ErrNotObtained]), or an attempt fails for good (its error). The first
// wait is noted on c, the lock call (see Stats).
func (s *Session) waitFor(ctx context.Context, c *call, wait bool, p *waitPolicy) (bool, error) {
	var w waitState
	var b backoff.BackOff
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for ; ; w.attempt++ {
		taken, err := p.try(ctx, &w)
		var stop stopWait
		switch {
		case err == nil && taken:
			return true, nil
		case err == nil && !wait:
			return false, nil
		case errors.As(err, &stop):
			return false, stop.err
		case err != nil && ctx.Err() != nil:
			return false, ctx.Err()
		case err != nil && s.leaseErr() != nil:
			return false, s.leaseErr()
		case err != nil && (!wait || !retryable(err)):
			return false, err
		case err != nil && p.retrying != nil:
			p.retrying(err)
		}
		c.noteWait() // this call waits (see Stats)
		if b == nil {
			b = s.opts.newBackOff()
			w.started = time.Now()
		}
		d := b.NextBackOff()
		if d == backoff.Stop {
			return false, ErrNotObtained
		}
		out := waitPoll
		switch {
		case err == nil && p.bell != nil:
			out = p.bell(ctx, &w)
		case isErrNo(err, errTooManyConnections):
			// The server refuses connections: try again paced, not at
			// the back-off's pace, which would add a connection attempt
			// every few milliseconds to a server that is full.
			out = waitPace
		}
		switch {
		case out == waitTry:
			// Woken by a doorbell, or its wait timed out, or nothing
			// blocks the lock now: try again at once.
			if err := ctx.Err(); err != nil {
				return false, err
			}
			if err := s.leaseErr(); err != nil {
				return false, err
			}
			continue
		case out == waitPace:
			d = w.bells.nextPace()
		case err == nil && p.poll != nil:
			d = p.poll(ctx, &w, d)
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		wake := timer.C
		if p.idle != nil && p.idle() {
			wake = nil
		}
		select {
		case <-wake:
		case <-p.kick:
		case <-ctx.Done():
			return false, ctx.Err()
		case <-s.done:
			return false, s.leaseErr()
		}
	}
}

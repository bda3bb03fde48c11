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
	polls   pollBudget
	// prompted: the attempt follows a doorbell step that told the loop to
	// try at once (waitTry: rung, or something changed), not a timer:
	// its statements, and those of the doorbell step after it, answer an
	// event and are not polls (see spend).
	prompted bool
}

// spend counts n statements of the attempt in progress, or of its
// doorbell step, against the polling budget, unless they answer an event
// (see prompted): a waiter that blocks on doorbells and is woken by every
// release of a contended lock runs up no debt that would hold back its
// next poll.
func (w *waitState) spend(n int) {
	if !w.prompted {
		w.polls.spend(n)
	}
}

// The polling budget: a waiter that polls (no doorbell to wait on: a
// Galera cluster, a *sql.DB with a connection limit below bellsMinLimit,
// a server that refuses GET_LOCK), or polls at connPace (a doorbell
// waiter with nothing to block on for as long as the lock stays held: a
// claimant whose holder has no doorbell, or a waiter whose session's
// waiting connection blocks for another name; see nextPace), sends its
// polls from a bucket that holds pollBurst and fills at pollRate a
// second, whatever the back-off policy or the pace says. So in any
// second it sends at most pollBurst + pollRate statements, plus those of
// one attempt beyond the first (a claim, or a want and a read of the
// doorbell, are spent before the wait that pays for them): 19 polling,
// a little more pacing (its want is said once a second), and within
// spinBudget with its session's keep-alive (one every 2s at the default
// TTL). The burst is what a waiter has for the moments that matter: the
// first polls of a wait (the lock is often free again within
// milliseconds), and a claimant's first polls after its claim (see
// mutexWait.poll); a waiter that has waited long polls at about
// pollRate, so a lock that falls free is taken within 1/pollRate (83ms),
// 42ms on average (twice that for a paced waiter, whose polls are a try
// and a read each). Statements that answer a doorbell (see
// waitState.prompted) are not polls.
const (
	pollBurst = 6
	pollRate  = 12
)

// pollBudget is one waiting call's bucket of statements (see pollBurst).
// The zero value is full.
type pollBudget struct {
	tokens float64   // statements it may send now; below 1 after a statement it spent ahead
	at     time.Time // when tokens was last brought up to date; zero: never, full
}

// fill brings tokens up to date.
func (b *pollBudget) fill() {
	now := time.Now()
	if b.at.IsZero() {
		b.tokens = pollBurst
	} else {
		b.tokens = min(pollBurst, b.tokens+now.Sub(b.at).Seconds()*pollRate)
	}
	b.at = now
}

// spend counts n statements sent.
func (b *pollBudget) spend(n int) {
	b.fill()
	b.tokens -= float64(n)
}

// delay returns d, or longer: until the bucket holds a statement.
func (b *pollBudget) delay(d time.Duration) time.Duration {
	b.fill()
	if b.tokens >= 1 {
		return d
	}
	return max(d, time.Duration((1-b.tokens)/pollRate*float64(time.Second)))
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
		w.spend(1)
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
			w.prompted = true
			continue
		case out == waitPace:
			d = w.bells.nextPace(&w.polls)
		default:
			// Polling: as the policy says, within the budget.
			if err == nil && p.poll != nil {
				d = p.poll(ctx, &w, d)
			}
			d = w.polls.delay(d)
		}
		w.prompted = false // the next attempt is a poll
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

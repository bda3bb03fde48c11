package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// lockTimeout bounds every single Lock of the scenarios, so that a stuck
// system fails the run instead of hanging it.
const lockTimeout = 2 * time.Minute

// uncontendedResult is one run of the uncontended scenario for one system.
type uncontendedResult struct {
	p50, p99 time.Duration // per Lock+Unlock pair
	rate     float64       // pairs per second, one after another
}

// uncontended times iters Lock+Unlock pairs of one name in one session,
// after a warm-up. For a lock system another session has first waited for
// the name once and stays open (issue 19 §5: what a past wait leaves
// behind, a want or a doorbell, must not cost the uncontended path).
func uncontended(ctx context.Context, sys *system, name string, iters int) (uncontendedResult, error) {
	n := 1
	if sys.exclusive {
		n = 2
	}
	ss, err := openSessions(ctx, sys, n)
	if err != nil {
		return uncontendedResult{}, err
	}
	defer closeSessions(ss)
	l := ss[0].lock(name)
	pair := func() error {
		if err := l.Lock(ctx); err != nil {
			return err
		}
		return l.Unlock(ctx)
	}
	if n == 2 {
		if err := waitedOnce(ctx, l, ss[1].lock(name)); err != nil {
			return uncontendedResult{}, err
		}
	}
	for range max(iters/20, 10) { // warm the connections, rows and statements
		if err := pair(); err != nil {
			return uncontendedResult{}, err
		}
	}
	samples := make([]time.Duration, 0, iters)
	start := time.Now()
	for range iters {
		t := time.Now()
		if err := pair(); err != nil {
			return uncontendedResult{}, err
		}
		samples = append(samples, time.Since(t))
	}
	elapsed := time.Since(start)
	return uncontendedResult{
		p50:  percentile(samples, 50),
		p99:  percentile(samples, 99),
		rate: float64(iters) / elapsed.Seconds(),
	}, nil
}

// contentionResult is one run of the contention scenario.
type contentionResult struct {
	acquisitions int64
	handoffs     int64 // acquisitions whose previous holder was another session
	elapsed      time.Duration
	longestWait  time.Duration // longest time spent in one Lock
	violations   int64         // acquisitions while limit sessions held the lock already
	maxHeld      int32         // most sessions holding the lock at once
}

func (r contentionResult) perSecond(n int64) float64 { return float64(n) / r.elapsed.Seconds() }

// contention has sessions goroutines, each with a session of its own, lock
// one name, check that fewer than limit others hold it, bump a shared
// counter (limit 1: mutual exclusion), hold it for hold (0: not at all)
// and unlock, for d.
func contention(ctx context.Context, sys *system, name string, sessions int, d time.Duration, limit int32, hold time.Duration) (contentionResult, error) {
	ss, err := openSessions(ctx, sys, sessions)
	if err != nil {
		return contentionResult{}, err
	}
	defer closeSessions(ss)
	var (
		holders      atomic.Int32 // sessions inside the critical section: must be at most limit
		maxHeld      atomic.Int32
		lastHolder   atomic.Int32
		violations   atomic.Int64
		acquisitions atomic.Int64
		handoffs     atomic.Int64
		counter      int64 // guarded by the lock under test
		mu           sync.Mutex
		longest      time.Duration // guarded by mu
	)
	lastHolder.Store(-1)
	start := time.Now()
	deadline := start.Add(d)
	errs := make(chan error, sessions)
	for i, s := range ss {
		l := s.lock(name)
		go func() {
			errs <- func() error {
				for time.Now().Before(deadline) {
					lctx, cancel := context.WithTimeout(ctx, lockTimeout)
					t := time.Now()
					err := l.Lock(lctx)
					wait := time.Since(t)
					cancel()
					if err != nil {
						return fmt.Errorf("session %d: Lock: %w", i, err)
					}
					h := holders.Add(1)
					if h > limit {
						violations.Add(1)
					}
					for m := maxHeld.Load(); h > m && !maxHeld.CompareAndSwap(m, h); m = maxHeld.Load() {
					}
					if limit == 1 {
						counter++
					}
					acquisitions.Add(1)
					if prev := lastHolder.Swap(int32(i)); prev >= 0 && prev != int32(i) {
						handoffs.Add(1)
					}
					if hold > 0 {
						time.Sleep(hold)
					}
					holders.Add(-1)
					mu.Lock()
					longest = max(longest, wait)
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						return fmt.Errorf("session %d: Unlock: %w", i, err)
					}
				}
				return nil
			}()
		}()
	}
	var errList []error
	for range ss {
		errList = append(errList, <-errs)
	}
	r := contentionResult{
		acquisitions: acquisitions.Load(),
		handoffs:     handoffs.Load(),
		elapsed:      time.Since(start),
		longestWait:  longest,
		violations:   violations.Load(),
		maxHeld:      maxHeld.Load(),
	}
	if limit == 1 && counter != r.acquisitions {
		// Unsynchronised increments lost: another sign of overlap.
		r.violations += max(r.acquisitions-counter, 1)
	}
	return r, errors.Join(errList...)
}

// waitedOnce has other wait for l once: l holds, other's Lock blocks until
// l lets go, then other lets go.
func waitedOnce(ctx context.Context, l, other locker) error {
	if err := l.Lock(ctx); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, lockTimeout)
		defer cancel()
		if err := other.Lock(lctx); err != nil {
			errc <- err
			return
		}
		errc <- other.Unlock(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // other is waiting by then
	return errors.Join(l.Unlock(ctx), <-errc)
}

// holdingPair opens two sessions of sys, the first holding name: the
// start of both handoff scenarios. done closes the sessions.
func holdingPair(ctx context.Context, sys *system, name string) (holder, waiter locker, done func(), err error) {
	ss, err := openSessions(ctx, sys, 2)
	if err != nil {
		return nil, nil, nil, err
	}
	holder, waiter = writerOf(ss[0], name), ss[1].lock(name)
	if err := holder.Lock(ctx); err != nil {
		closeSessions(ss)
		return nil, nil, nil, err
	}
	return holder, waiter, func() { closeSessions(ss) }, nil
}

// handoff measures, samples times, the time from the holder's Unlock call
// to the return of the Lock of a waiter of another session that was
// already blocked; the two sessions take turns. For a readers system the
// holder is always the writer and the waiter a reader (writer → reader):
// the reader lets go and the writer locks again between samples.
func handoff(ctx context.Context, sys *system, name string, samples int) (p50, p99 time.Duration, err error) {
	holder, waiter, done, err := holdingPair(ctx, sys, name)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	type got struct {
		at  time.Time
		err error
	}
	var d []time.Duration
	for range samples {
		ch := make(chan got, 1)
		go func() {
			lctx, cancel := context.WithTimeout(ctx, lockTimeout)
			defer cancel()
			err := waiter.Lock(lctx)
			ch <- got{time.Now(), err}
		}()
		// A hold of 5-15 ms: the waiter is blocked in Lock by then.
		time.Sleep(5*time.Millisecond + rand.N(10*time.Millisecond))
		t0 := time.Now()
		if err := holder.Unlock(ctx); err != nil {
			<-ch
			return 0, 0, err
		}
		g := <-ch
		if g.err != nil {
			return 0, 0, g.err
		}
		d = append(d, g.at.Sub(t0))
		if sys.readers {
			if err := waiter.Unlock(ctx); err != nil {
				return 0, 0, err
			}
			if err := holder.Lock(ctx); err != nil {
				return 0, 0, err
			}
			continue
		}
		holder, waiter = waiter, holder
	}
	if err := holder.Unlock(ctx); err != nil {
		return 0, 0, err
	}
	return percentile(d, 50), percentile(d, 99), nil
}

// handoffFloor is the handoff scenario's floor: what a handoff of a durable
// row lock costs with no wake-up at all. Two floor sessions (connections)
// take turns: after the same 5-15 ms hold, t0, the holder's DELETE, then
// at once the other's INSERT, t1: two autocommit statements in series,
// each on a connection that sat idle through the hold, as a release and
// the waiter's acquisition are.
func handoffFloor(ctx context.Context, sys *system, name string, samples int) (p50, p99 time.Duration, err error) {
	holder, waiter, done, err := holdingPair(ctx, sys, name)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	var d []time.Duration
	for range samples {
		time.Sleep(5*time.Millisecond + rand.N(10*time.Millisecond))
		t0 := time.Now()
		if err := holder.Unlock(ctx); err != nil {
			return 0, 0, err
		}
		if err := waiter.Lock(ctx); err != nil {
			return 0, 0, err
		}
		d = append(d, time.Since(t0))
		holder, waiter = waiter, holder
	}
	if err := holder.Unlock(ctx); err != nil {
		return 0, 0, err
	}
	return percentile(d, 50), percentile(d, 99), nil
}

// idleResult is one run of the idle-waiter scenario.
type idleResult struct {
	baseline  float64 // statements/s with every session idle and nobody waiting
	waiting   float64 // statements/s with one holder and the waiters blocked
	perWaiter float64 // (waiting - baseline) / waiters
}

// idle counts the statements the server receives while waiters sessions
// wait for a lock held by another session, for d, against a baseline of
// the same sessions idle for d.
func idle(ctx context.Context, sys *system, name string, waiters int, d time.Duration) (idleResult, error) {
	ss, err := openSessions(ctx, sys, waiters+1)
	if err != nil {
		return idleResult{}, err
	}
	defer closeSessions(ss)
	count := func(d time.Duration) (float64, error) { return countStatements(ctx, sys.statements, sys.selfCount, d) }
	time.Sleep(300 * time.Millisecond) // let the sessions' start-up settle
	var r idleResult
	if r.baseline, err = count(d); err != nil {
		return r, err
	}
	holder := writerOf(ss[0], name) // readers wait for a writer
	if err := holder.Lock(ctx); err != nil {
		return r, err
	}
	errs := make(chan error, waiters)
	for _, s := range ss[1:] {
		l := s.lock(name)
		go func() {
			errs <- func() error {
				lctx, cancel := context.WithTimeout(ctx, lockTimeout)
				defer cancel()
				if err := l.Lock(lctx); err != nil {
					return err
				}
				return l.Unlock(ctx)
			}()
		}()
	}
	time.Sleep(500 * time.Millisecond) // the waiters' first attempts are not idle waiting
	r.waiting, err = count(d)
	errList := []error{err, holder.Unlock(ctx)}
	for range waiters {
		errList = append(errList, <-errs)
	}
	r.perWaiter = (r.waiting - r.baseline) / float64(waiters)
	return r, errors.Join(errList...)
}

// countStatements returns the statements/s the server receives in the
// next d, by statements, less the selfCount each call of statements adds.
func countStatements(ctx context.Context, statements func(context.Context) (int64, error), selfCount int64, d time.Duration) (float64, error) {
	c0, err := statements(ctx)
	if err != nil {
		return 0, err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	c1, err := statements(ctx)
	if err != nil {
		return 0, err
	}
	return float64(c1-c0-selfCount) / d.Seconds(), nil
}

// manyResult is one run of the many-locks scenario.
type manyResult struct {
	acquire    time.Duration // to acquire all the locks, one after another
	perSecond  float64       // statements/s received while they are held
	statements int64         // received while they are held
}

// holdMany has one session acquire n locks, then counts the statements the
// server receives while it holds them for d.
func holdMany(ctx context.Context, sys *system, prefix string, n int, d time.Duration) (manyResult, error) {
	ss, err := openSessions(ctx, sys, 1)
	if err != nil {
		return manyResult{}, err
	}
	defer closeSessions(ss)
	locks := make([]locker, n)
	start := time.Now()
	for i := range locks {
		locks[i] = ss[0].lock(fmt.Sprintf("%s-%05d", prefix, i))
		if err := locks[i].Lock(ctx); err != nil {
			return manyResult{}, err
		}
	}
	var r manyResult
	r.acquire = time.Since(start)
	c0, err := sys.statements(ctx)
	if err != nil {
		return r, err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return r, ctx.Err()
	}
	c1, err := sys.statements(ctx)
	if err != nil {
		return r, err
	}
	r.statements = c1 - c0 - sys.selfCount
	r.perSecond = float64(r.statements) / d.Seconds()
	for _, l := range locks {
		if err := l.Unlock(ctx); err != nil {
			return r, err
		}
	}
	return r, nil
}

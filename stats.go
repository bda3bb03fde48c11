package dsync

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Session's lock activity, returned by
// [Session.Stats]. The cumulative figures count from [NewSession], across
// the leases of a session made [WithReplaceLostLease]; Held and Orphans
// are the current lease's.
//
// A call waited when it did not get the lock at its first attempt: in the
// process, another goroutine of the session held or was acquiring the name
// (Mutex), or was ahead of it in the local line (FairMutex, RWMutex); in the
// database, its first statements found the lock held (or its ticket not at
// the head of the line) or failed with an error worth retrying, so that it
// went on to poll; or, on a session made [WithReplaceLostLease], its lease
// was lost and it went on to wait for a new one. TryLock and TryRLock never
// wait, and a reentrant Lock or RLock ([WithOwner]) and an RLock that joins
// a read hold of the process never wait either.
type Stats struct {
	// Held is the number of lock names the session holds now, each name
	// once however many holds (reentrant, or readers sharing a read hold)
	// it has. It is 0 once the session has ended.
	Held int
	// Waiting is the number of Lock and RLock calls (one per goroutine)
	// that are waiting now: they have waited (see above), not returned,
	// and do not hold the lock yet.
	Waiting int
	// Acquisitions counts the Lock, RLock, TryLock and TryRLock calls of
	// every kind of lock that returned holding the lock, reentrant ones and
	// an RLock joining a read hold included.
	Acquisitions int64
	// Contended counts the Acquisitions whose call waited.
	Contended int64
	// WaitTime is the total time, from call to return, of the Lock and
	// RLock calls that waited, whether they ended with the lock or without
	// it (ctx ended, the back-off policy gave up, the session ended).
	WaitTime time.Duration
	// Renewals counts the lease renewals that succeeded.
	Renewals int64
	// RenewalFailures counts the renewals that failed: an error retried
	// later, or the lease found ended on the server. A renewal cut short
	// because the session was closed or lost meanwhile is not counted.
	RenewalFailures int64
	// Orphans is the number of lock rows and tickets the session is still
	// freeing in the background (see [Mutex.Unlock]), including those it
	// is trying to free right now. It is 0 once the session has ended:
	// the end of its lease frees them.
	Orphans int
}

// Stats returns the session's lock statistics. It makes no database call
// and is safe for concurrent use: the cumulative figures are atomic
// counters; Held and Orphans are read under the session's mutex, which
// lock calls hold only for moments, and Held costs one look at each lock
// name the session uses now. The figures are read one by one, not as one
// atomic snapshot, so under load they may be moments apart.
func (s *Session) Stats() Stats {
	s = s.current()
	st := Stats{
		Waiting:         int(s.stats.waiting.Load()),
		Contended:       s.stats.contended.Load(), // before Acquisitions: never more than it
		Acquisitions:    s.stats.acquisitions.Load(),
		WaitTime:        time.Duration(s.stats.waitTime.Load()),
		Renewals:        s.stats.renewals.Load(),
		RenewalFailures: s.stats.renewalFailures.Load(),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return st // ended: nothing held, nothing to free
	}
	st.Orphans = s.reaper.count()
	for _, e := range s.locks.entries {
		l := e.state
		l.mu.Lock()
		if l.held {
			st.Held++
		}
		l.mu.Unlock()
	}
	for _, e := range s.queues.entries {
		lq := e.state
		lq.mu.Lock()
		if lq.held || len(lq.reads) > 0 || len(lq.permits) > 0 {
			st.Held++
		}
		lq.mu.Unlock()
	}
	return st
}

// counters are the cumulative figures of a Session's Stats, and Waiting.
type counters struct {
	waiting         atomic.Int64 // calls that have waited and not returned
	acquisitions    atomic.Int64
	contended       atomic.Int64
	waitTime        atomic.Int64 // nanoseconds
	renewals        atomic.Int64
	renewalFailures atomic.Int64
}

// Kinds of lock, the values of the "kind" attribute of log records (a name
// is one kind's: see "One name, one kind" in queries.go).
const (
	kindMutex    = "mutex"    // Mutex
	kindQueue    = "queue"    // FairMutex and RWMutex
	kindElection = "election" // Election
)

// call is one lock call being counted (see track). The code that waits,
// however deep, is handed the call and says so (noteWait).
type call struct {
	s              *Session
	kind, op, name string    // for the long-wait record
	start          time.Time // when the call began; zero when it cannot wait
	waited         bool      // the call has waited; only its own goroutine touches it
}

// track starts counting a lock call, at the top of the method, which
// hands it to withLease (which counts the outcome, done, when the call
// returns, whatever leases it ran on) and to the code that may wait
// (noteWait):
//
//	c := m.s.track(kindMutex, "lock", m.name, wait)
//	return m.s.withLease(ctx, c, func(g *Session) (bool, error) { return m.on(g).lockOn(ctx, c, wait) })
func (s *Session) track(kind, op, name string, wait bool) *call {
	c := &call{s: s, kind: kind, op: op, name: name}
	if wait {
		c.start = time.Now()
	}
	return c
}

// noteWait records that the lock call c waits: it did not get the lock at
// its first attempt (see Stats). Only the first note of a call counts; on
// a nil call, or one that cannot wait (track without wait), it does
// nothing.
func (c *call) noteWait() {
	if c == nil || c.start.IsZero() || c.waited {
		return
	}
	c.waited = true
	c.s.stats.waiting.Add(1)
}

// done counts the outcome of the call: ok, it returned holding the lock;
// err, the error it returned. A call that waited at least the session's
// TTL is logged (see the package doc's Logging).
func (c *call) done(ok *bool, err *error) {
	st := c.s.stats
	if *ok {
		st.acquisitions.Add(1)
	}
	if !c.waited {
		return
	}
	waited := time.Since(c.start)
	if *ok {
		st.contended.Add(1)
	}
	st.waitTime.Add(int64(waited))
	st.waiting.Add(-1)
	if waited >= c.s.opts.ttl {
		attrs := []any{"lock", c.name, "kind", c.kind, "op", c.op, "waited", waited, "acquired", *ok}
		if *err != nil {
			attrs = append(attrs, "err", *err)
		}
		c.s.current().logger.Warn("dsync: waited long for a lock", attrs...)
	}
}

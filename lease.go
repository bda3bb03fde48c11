package dsync

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// pastDeadline reports whether the lease could have ended on the server.
func (s *Session) pastDeadline() bool {
	return time.Since(s.origin) >= time.Duration(s.deadline.Load())
}

// safetyMargin is how long before the lease could end on the server the
// session gives up on it: room for timer and scheduling delays and for the
// two clocks running at slightly different rates.
func (s *Session) safetyMargin() time.Duration { return s.opts.ttl / 5 }

// renewEvery is how often the lease is renewed: every TTL/3, and at least
// every maxRenewEvery. The session gives up on its lease TTL-TTL/5 after the
// last renewal that succeeded was sent, so a stall of the database (every
// statement waiting, as all commits of a Galera cluster do for about 6s
// until a crashed node is evicted) loses no session when it is shorter
// than 0.8*TTL - renewEvery: 10s for the default TTL of 15s.
func (s *Session) renewEvery() time.Duration { return min(s.opts.ttl/3, maxRenewEvery) }

// maxRenewEvery bounds the renewal period of long TTLs (see renewEvery).
const maxRenewEvery = 2 * time.Second

// keepAlive renews the lease every renewEvery. A renewal sent at local time t
// makes the lease end no earlier than t+TTL on the server (the server reads
// its clock after receiving it), so until t+TTL-margin no other session can
// take this session's locks. Failed renewals are retried until that local
// deadline; past it the session is lost.
func (s *Session) keepAlive() {
	defer close(s.renewer)
	ttl := s.opts.ttl
	lastSent := s.origin
	every := s.renewEvery()
	timer := time.NewTimer(max(time.Until(lastSent.Add(every)), 0))
	defer timer.Stop()
	failures := 0 // renewals failed in a row
	for {
		select {
		case <-s.stopped.Done():
			return
		case <-timer.C:
		}
		deadline := s.origin.Add(time.Duration(s.deadline.Load()))
		if !time.Now().Before(deadline) {
			s.lose(errors.New("renewal deadline passed"))
			return
		}
		ctx, cancel := context.WithDeadline(s.stopped, deadline)
		sent, err := s.renew(ctx)
		cancel()
		switch {
		case err == nil:
			s.stats.renewals.Add(1)
			failures = 0
			lastSent = sent
			s.deadline.Store(int64(sent.Sub(s.origin) + ttl - s.safetyMargin()))
			timer.Reset(max(time.Until(lastSent.Add(every)), 0))
		case errors.Is(err, errLeaseEnded):
			s.stats.renewalFailures.Add(1)
			s.lose(err)
			return
		case s.stopped.Err() != nil:
			return
		default:
			s.stats.renewalFailures.Add(1)
			failures++
			s.logger.Warn("dsync: lease renewal failed; retrying", "err", err, "attempt", failures,
				"deadline_in", time.Until(deadline))
			timer.Reset(min(ttl/10, max(time.Until(deadline), 0)))
		}
	}
}

var errLeaseEnded = errors.New("lease ended on the server")

// renew extends the lease once, on the connection of the lease statements
// (see leaseConn), and returns when the renewal was sent: the lease lasts
// at least TTL from then.
func (s *Session) renew(ctx context.Context) (sent time.Time, err error) {
	err = s.withConn(ctx, true, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.pool, int(sLeaseRenew))
		if err != nil {
			return err
		}
		res, err := retryRolledBack(ctx, func() (sql.Result, error) {
			sent = time.Now()
			return st.ExecContext(ctx, s.opts.ttl.Microseconds(), s.id)
		})
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return errLeaseEnded
		}
		return nil
	})
	return sent, err
}

// leaseConn is a session's own connection for its lease statements (the
// lease insert, then renewals), apart from the connections its locks use:
// whatever lock traffic needs (connections to open, statements to prepare,
// doorbells) never delays a renewal, and a renewal never waits for a
// connection that lock traffic, or another session of the same *sql.DB,
// holds. NewSession opens it and prepares the renewal on it before it
// returns; after a failure that may have left it unusable it is closed, and
// the next renewal opens another. Sessions have one when their *sql.DB has
// no connection limit; on a limited one they renew on the connection that
// the shared pool keeps for renewals instead, so that they do not take a
// connection each of the caller's share.
type leaseConn struct {
	mu sync.Mutex     // held for a use: by start, the keep-alive goroutine, Close
	c  *connpool.Conn // guarded by mu; nil: opened at the next use
}

// ownLeaseConn returns the lease connection of a new session on db, or nil
// when db has a connection limit.
func ownLeaseConn(db *sql.DB) *leaseConn {
	if db.Stats().MaxOpenConnections != 0 {
		return nil
	}
	return &leaseConn{}
}

// use runs f on the connection, opened (and set up as p's are) when there
// is none, and closes it when f's use did not end cleanly.
func (l *leaseConn) use(ctx context.Context, p *connpool.Pool, f func(context.Context, *connpool.Conn) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		c, err := p.Dedicated(ctx)
		if err != nil {
			return err
		}
		l.c = c
	}
	err := f(ctx, l.c)
	if ctx.Err() != nil || !connpool.Reusable(err) {
		l.c.Close() // the driver may have closed it, or a statement may still run on it
		l.c = nil
	}
	return err
}

// close closes the connection, if any; l may be nil.
func (l *leaseConn) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		l.c.Close()
		l.c = nil
	}
}

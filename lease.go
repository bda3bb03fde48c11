package dsync

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// A lease is a session's lease row, as the session sees it: the local
// deadline until which the lease is known to hold, and the keep-alive
// goroutine that renews it. It runs its statements through the session's
// store, and reports the lease lost through the lost func given by the
// session; it never calls into the Session.
type lease struct {
	st     *store
	ttl    time.Duration
	stats  *counters    // the session's: renewals and failures are counted there
	lost   func(error)  // ends the session as lost (Session.lose), with the cause
	logger *slog.Logger // set by the session before keepAlive starts
	id     int64        // the lease id; set by create

	// origin is a reading of the monotonic clock; deadline (nanoseconds
	// after origin) is when the lease could end on the server, less the
	// safety margin. The session reports itself lost from then on, even
	// when the keep-alive goroutine has not run (a paused process).
	origin   time.Time
	deadline atomic.Int64

	exited chan struct{} // closed when the keep-alive goroutine returns
}

// newLease returns the lease of a session that runs its statements on st,
// counts renewals in stats and is told of a loss through lost.
func newLease(st *store, ttl time.Duration, stats *counters, lost func(error)) *lease {
	return &lease{st: st, ttl: ttl, stats: stats, lost: lost, exited: make(chan struct{})}
}

// start creates the missing tables, then the lease row (see create), on
// the connection of the lease statements, which it leaves with the renewal
// prepared, and sets the first deadline. Its errors name the step that
// failed: connect to the database, a step of createTables, or create the
// lease.
func (l *lease) start(ctx context.Context, label string) error {
	connected := false
	err := l.st.withConn(ctx, true, func(ctx context.Context, c *connpool.Conn) error {
		connected = true
		// On a Galera cluster the DDL of sessions creating the tables at
		// once, and the version record, can meet as certification
		// conflicts (1213), which roll a statement back: all of it runs
		// again, and finds what the others created.
		_, err := retryRolledBack(ctx, func() (sql.Result, error) { return nil, createTables(ctx, c, l.st.q) })
		if err != nil {
			return err
		}
		if err := l.create(ctx, c, label); err != nil {
			return opErrorf(err, "create the session's lease in %s", l.st.q.tables[1])
		}
		return nil
	})
	if err != nil && !connected {
		return connectError(err)
	}
	return err
}

// create inserts the lease row, with a new random id, on c (the connection
// of the lease statements, which it leaves with the renewal prepared), and
// sets the first deadline.
func (l *lease) create(ctx context.Context, c *connpool.Conn, label string) error {
	st, err := c.Stmt(ctx, l.st.pool, int(sLeaseInsert))
	if err == nil {
		_, err = c.Stmt(ctx, l.st.pool, int(sLeaseRenew)) // see acquirePool
	}
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		id, err := randomID()
		if err != nil {
			return err
		}
		// The lease can end no earlier than TTL after the insert is
		// sent: the clock starts now, not before the statement was
		// prepared or the connection opened.
		_, err = retryRolledBack(ctx, func() (sql.Result, error) {
			l.origin = time.Now()
			return st.ExecContext(ctx, id, label, l.ttl.Microseconds())
		})
		if err == nil {
			l.id = id
			l.deadline.Store(int64(l.ttl - l.safetyMargin()))
			return nil
		}
		if !isErrNo(err, errDupEntry) || attempt == 9 || ctx.Err() != nil {
			return err
		}
	}
}

// randomID returns a random positive lease id: ids never repeat in
// practice, even after the lease table was emptied or restored.
func randomID() (int64, error) {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])>>1) | 1, nil
}

// deadlineTime returns the local deadline (see Session.Deadline).
func (l *lease) deadlineTime() time.Time {
	return l.origin.Add(time.Duration(l.deadline.Load()))
}

// pastDeadline reports whether the lease could have ended on the server.
func (l *lease) pastDeadline() bool {
	return time.Since(l.origin) >= time.Duration(l.deadline.Load())
}

// safetyMargin is how long before the lease could end on the server the
// session gives up on it: room for timer and scheduling delays and for the
// two clocks running at slightly different rates.
func (l *lease) safetyMargin() time.Duration { return l.ttl / 5 }

// renewEvery is how often the lease is renewed: every TTL/3, and at least
// every maxRenewEvery. The session gives up on its lease TTL-TTL/5 after the
// last renewal that succeeded was sent, so a stall of the database (every
// statement waiting, as all commits of a Galera cluster do until a crashed
// node is evicted; see docs/CONSTANTS.md) loses no session when it is
// shorter than 0.8*TTL - renewEvery: 10s for the default TTL of 15s.
func (l *lease) renewEvery() time.Duration { return min(l.ttl/3, maxRenewEvery) }

// lendable is the longest a lock statement may keep the lease connection
// (see leaseConn.useOpen), so that a renewal it delays is still sent in
// time: half of the time a renewal may come late (the lease holds for
// TTL less the safety margin after a renewal was sent, and the next one
// is due renewEvery after), and no more than lentFor. A statement that
// may wait for a row lock is lent the lease connection only when
// lendable fits two such waits (see leaseConn.useOpen): a TTL of about
// 8.1s or more; under it the lease connection does not wait for row locks
// while lent.
func (l *lease) lendable() time.Duration {
	return min(lentFor, (l.ttl-l.safetyMargin()-l.renewEvery())/2)
}

// maxRenewEvery bounds the renewal period of long TTLs (see renewEvery).
const maxRenewEvery = 2 * time.Second

// keepAlive renews the lease every renewEvery, until stopped ends. A renewal sent at local time t
// makes the lease end no earlier than t+TTL on the server (the server reads
// its clock after receiving it), so until t+TTL-margin no other session can
// take this session's locks. Failed renewals are retried until that local
// deadline; past it the session is lost.
func (l *lease) keepAlive(stopped context.Context) {
	defer close(l.exited)
	ttl := l.ttl
	lastSent := l.origin
	every := l.renewEvery()
	timer := time.NewTimer(max(time.Until(lastSent.Add(every)), 0))
	defer timer.Stop()
	failures := 0 // renewals failed in a row
	for {
		select {
		case <-stopped.Done():
			return
		case <-timer.C:
		}
		deadline := l.deadlineTime()
		if !time.Now().Before(deadline) {
			l.lost(errors.New("renewal deadline passed"))
			return
		}
		ctx, cancel := context.WithDeadline(stopped, deadline)
		sent, err := l.renew(ctx)
		cancel()
		switch {
		case err == nil:
			l.stats.renewals.Add(1)
			failures = 0
			lastSent = sent
			l.deadline.Store(int64(sent.Sub(l.origin) + ttl - l.safetyMargin()))
			timer.Reset(max(time.Until(lastSent.Add(every)), 0))
		case errors.Is(err, errLeaseEnded):
			l.stats.renewalFailures.Add(1)
			l.lost(err)
			return
		case stopped.Err() != nil:
			return
		default:
			l.stats.renewalFailures.Add(1)
			failures++
			l.logger.Warn("dsync: lease renewal failed; retrying", "err", err, "attempt", failures,
				"deadline_in", time.Until(deadline))
			timer.Reset(min(ttl/10, max(time.Until(deadline), 0)))
		}
	}
}

var errLeaseEnded = errors.New("lease ended on the server")

// renew extends the lease once, on the connection of the lease statements
// (see leaseConn), and returns when the renewal was sent: the lease lasts
// at least TTL from then.
func (l *lease) renew(ctx context.Context) (sent time.Time, err error) {
	err = l.st.withConn(ctx, true, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, l.st.pool, int(sLeaseRenew))
		if err != nil {
			return err
		}
		res, err := retryRolledBack(ctx, func() (sql.Result, error) {
			sent = time.Now()
			return st.ExecContext(ctx, l.ttl.Microseconds(), l.id)
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
	// slot holds a token while c is in use: by start, the keep-alive
	// goroutine, Close, or a lock statement (useOpen).
	slot       chan struct{}
	mu         sync.Mutex     // guards leaseWaits and freed
	leaseWaits int            // guarded by mu; lease statements waiting for c: lock statements wait behind them (see useOpen)
	freed      chan struct{}  // guarded by mu; closed when c is let go or leaseWaits drops (lock statements look again)
	c          *connpool.Conn // used only by the one who holds the slot; nil: opened at the next use
	// lendFor is the longest a lock statement may keep the connection
	// (see useOpen); set by the session before its first statement.
	lendFor time.Duration
	// noWaitOff is the store's: the server refused the no-wait variants
	// (MySQL), and takes no lock wait timeout of 0 (see useOpen).
	noWaitOff *atomic.Bool
	// noWait: c's lock wait timeout is 0 (qLentNoWait), not lentLockWait;
	// used only by the one who holds the slot.
	noWait bool
	// lent counts the lock statements run on the connection, cut those
	// of them whose caller's ctx ended meanwhile (for tests).
	lent, cut atomic.Int64
}

// ownLeaseConn returns the lease connection of a new session on db, or nil
// when db has a connection limit.
func ownLeaseConn(db *sql.DB) *leaseConn {
	if db.Stats().MaxOpenConnections != 0 {
		return nil
	}
	return newLeaseConn()
}

// newLeaseConn returns a lease connection, not yet open.
func newLeaseConn() *leaseConn {
	return &leaseConn{slot: make(chan struct{}, 1), freed: make(chan struct{})}
}

// acquire waits until the connection is free, and takes it, or returns
// ctx's error when ctx ends first: a lease statement (lease) before any
// lock statement waiting, so that a renewal waits for one lock statement
// at most.
func (l *leaseConn) acquire(ctx context.Context, lease bool) error {
	if lease {
		l.mu.Lock()
		l.leaseWaits++
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			l.leaseWaits--
			l.wakeLocked()
			l.mu.Unlock()
		}()
		select {
		case l.slot <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		l.mu.Lock()
		if l.leaseWaits == 0 {
			select {
			case l.slot <- struct{}{}:
				l.mu.Unlock()
				return nil
			default:
			}
		}
		freed := l.freed
		l.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wakeLocked has the lock statements waiting look again (l.mu held).
func (l *leaseConn) wakeLocked() {
	close(l.freed)
	l.freed = make(chan struct{})
}

// release gives the connection back.
func (l *leaseConn) release() {
	<-l.slot
	l.mu.Lock()
	l.wakeLocked()
	l.mu.Unlock()
}

// use runs f on the connection, opened (and set up as p's are, with a
// lock wait timeout of lentLockWait: see qLentLockWait) when there is
// none, and closes it when f's use did not end cleanly.
func (l *leaseConn) use(ctx context.Context, p *connpool.Pool, f func(context.Context, *connpool.Conn) error) error {
	if err := l.acquire(ctx, true); err != nil {
		return err
	}
	defer l.release()
	if l.c == nil {
		c, err := p.Dedicated(ctx)
		if err == nil {
			if _, err = c.ExecContext(ctx, qLentLockWait); err != nil {
				c.Close()
			}
		}
		if err != nil {
			return err
		}
		l.c = c
	}
	var err error
	if l.noWait {
		// Lock statements were lent it meanwhile (see useOpen).
		if _, err = l.c.ExecContext(ctx, qLentLockWait); err == nil {
			l.noWait = false
		}
	}
	if err == nil {
		err = f(ctx, l.c)
	}
	if ctx.Err() != nil || !connpool.Reusable(err) {
		l.c.Close() // the driver may have closed it, or a statement may still run on it
		l.c = nil
		l.noWait = false
	}
	return err
}

// useOpen runs f, a lock statement, on the connection when it is open
// (it opens none), after the lease statements waiting for it, and
// reports whether it ran f, or waited for the connection until ctx
// ended; l may be nil. f runs under a ctx detached from ctx (see
// runDetached), ended by stop, or lendFor after it started or lateFor
// after ctx ended: a caller's ctx that ends mid-statement does not close
// the connection, which the next renewal would have to open again, on a
// server that refuses connections. Nor does a row lock: the server ends
// f's wait for one, and f does not run again after it (see
// retryRolledBackN). The connection waits lentLockWait at most
// (qLentLockWait) when that wait fits in lendFor twice over (room for a
// second statement of f, and for the driver and the network); when it
// does not (a TTL under about 8s), it does not wait at all while lent
// (qLentNoWait), and is not lent a statement that waits a second
// whatever the connection's setting (briefKey), nor, on a server that
// takes no wait of 0 (MySQL), one that may wait; useOpen reports then
// that it did not run f, and the caller gets the server's refusal
// (1040), as when the connection is closed.
func (l *leaseConn) useOpen(ctx, stop context.Context, f func(context.Context, *connpool.Conn) error) (bool, error) {
	if l == nil {
		return false, nil
	}
	short := l.lendFor < 2*lentLockWait+lateFor && ctx.Value(noWaitKey{}) == nil
	if short && (ctx.Value(briefKey{}) != nil || l.noWaitOff != nil && l.noWaitOff.Load()) {
		return false, nil
	}
	if err := l.acquire(ctx, false); err != nil {
		return true, err
	}
	defer l.release()
	if l.c == nil {
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return true, err // not sent: the caller gave up meanwhile
	}
	l.lent.Add(1)
	alive := func() bool { return l.c.Alive(context.Background()) }
	err, clean := runDetached(ctx, stop, l.lendFor, alive, func(ctx context.Context) error {
		if short {
			if !l.noWait {
				if _, err := l.c.ExecContext(ctx, qLentNoWait); err != nil {
					return err
				}
				l.noWait = true
			}
			ctx = context.WithValue(ctx, noWaitKey{}, true) // 1205 is retried (retryRolledBackN)
		}
		return f(ctx, l.c)
	})
	if ctx.Err() != nil {
		l.cut.Add(1)
	}
	if !clean {
		l.c.Close() // the driver may have closed it, or a statement may still run on it
		l.c = nil
		l.noWait = false
	}
	return true, err
}

// close closes the connection, if any; l may be nil.
func (l *leaseConn) close() {
	if l == nil {
		return
	}
	l.acquire(context.Background(), true)
	defer l.release()
	if l.c != nil {
		l.c.Close()
		l.c = nil
		l.noWait = false
	}
}

// waiting returns how many lease statements wait for the connection (for
// tests).
func (l *leaseConn) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseWaits
}

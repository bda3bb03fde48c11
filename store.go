package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// A store runs dsync's prepared statements on a session's connections:
// lock statements on the shared pool's, lease statements (priority) on
// the session's own lease connection when it has one. It retries what a
// server error says had no effect, and chooses the statements that do not
// wait for row locks where the server takes them. It knows no lock kind
// and never calls into the Session: what it needs to know of the session
// (when it ends, and why) it is given when made.
type store struct {
	db        *sql.DB
	q         *queries
	pool      *connpool.Pool
	leaseConn *leaseConn  // the session's own connection for its lease statements; nil: they use the pool's reserve (see acquirePool)
	galera    bool        // the database is a Galera cluster node (see qSyncWait)
	waiters   *bellWaiter // the shared pool's waiter side, for sessions on a *sql.DB with a connection limit
	logger    *slog.Logger
	// lend runs a lock statement on the session's doorbell connection
	// when it is free (doorbell.lend), and reports whether it did; set by
	// the session before its first lock statement; nil: none.
	lend      func(context.Context, func(context.Context, *connpool.Conn) error) (bool, error)
	noWaitOff atomic.Bool // the server refused the no-wait statements (see noWait)
	release   sync.Once   // releases the session's share of the pool

	// Set by the session before its first statement.
	stopped context.Context // ends when Close starts or the session is lost
	ended   func() error    // the session's Err: why a statement it cut short failed
}

// newStore returns the store of a new session on db, with its share of the
// shared pool of db and q's tables (see acquirePool), and its own lease
// connection when db has no connection limit (see ownLeaseConn).
func newStore(ctx context.Context, db *sql.DB, q *queries, logger *slog.Logger) (*store, error) {
	sp, err := acquirePool(ctx, db, q)
	if err != nil {
		return nil, err
	}
	st := &store{db: db, q: q, pool: sp.pool, leaseConn: ownLeaseConn(db), galera: sp.galera, waiters: sp.waiters, logger: logger}
	if st.leaseConn != nil {
		st.leaseConn.noWaitOff = &st.noWaitOff
	}
	return st, nil
}

// releasePool releases the session's share of the shared pool, once.
func (s *store) releasePool() {
	s.release.Do(func() { releasePool(s.db, s.q) })
}

// closingKey marks the ctx of Close's own statements, which run after the
// session has ended (its stopped is done), so that withConn runs them under
// that ctx alone. It rides in ctx, not in the store, because the same
// statements (free, undo) run at that moment for other calls, a Lock still
// in flight, which must stay bound to stopped.
type closingKey struct{}

// poolOnlyKey marks the ctx of a background statement that must not take
// the session's doorbell connection (see store.use): one that nobody
// waits for, which would send the lock statements that came meanwhile to
// the pool, off the doorbell's ring path (see tickets.granted).
type poolOnlyKey struct{}

// closingCtx returns the ctx for Close's own statements.
func closingCtx(ctx context.Context) context.Context {
	return context.WithValue(ctx, closingKey{}, true)
}

// withConn runs f on one of the session's connections (priority: a lease
// statement, which runs on the session's own connection when it has one,
// see leaseConn), under a ctx that ends when ctx does or when the session ends
// (closed or lost), so that no call outlives its session even with a
// context.Background() ctx and a database that stopped answering; Close's
// own statements (see closingCtx) run under Close's ctx alone. A connection
// whose use ended with that ctx done is discarded: the driver may have
// closed it, or a statement may still be running on it.
func (s *store) withConn(ctx context.Context, priority bool, f func(context.Context, *connpool.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err // no connection is spent on a call that cannot run
	}
	sctx := ctx
	if ctx.Value(closingKey{}) == nil {
		if ctx.Done() == nil {
			sctx = s.stopped // no allocation on the common path
		} else {
			var cancel context.CancelFunc
			sctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(s.stopped, cancel)()
		}
	}
	err := s.use(sctx, priority, f)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		if serr := s.ended(); serr != nil {
			return serr // the session ended under the statement
		}
	}
	return err
}

// use runs f on a connection from the pool under ctx and puts it back, or,
// for a lease statement, on the session's own connection when it has one,
// or, for a lock statement, on the session's doorbell connection when it
// is free (see doorbell.lend).
func (s *store) use(ctx context.Context, priority bool, f func(context.Context, *connpool.Conn) error) error {
	if priority && s.leaseConn != nil {
		return s.leaseConn.use(ctx, s.pool, f)
	}
	if !priority && s.lend != nil && ctx.Value(poolOnlyKey{}) == nil {
		if ran, err := s.lend(ctx, f); ran {
			return err
		}
	}
	c, err := s.pool.Get(ctx, priority)
	if err != nil && !priority && isErrNo(err, errTooManyConnections) {
		// The server refuses connections (1040): a lock statement runs on
		// the session's lease connection when it is free, so that
		// sessions whose connections the server cannot open still make
		// progress (a renewal waits for one such statement at most; see
		// useOpen). Close's own statements (see closingCtx) are bound by
		// Close's ctx, the others by the session.
		stop := s.stopped
		if ctx.Value(closingKey{}) != nil {
			stop = ctx
		}
		if ran, err := s.leaseConn.useOpen(ctx, stop, f); ran {
			return err
		}
	}
	if err != nil {
		return err
	}
	err = f(ctx, c)
	if cerr := ctx.Err(); cerr != nil {
		s.pool.Put(c, cerr) // discarded: the driver may have closed it
	} else {
		s.pool.Put(c, err)
	}
	return err
}

// lentFor bounds a lock statement lent a connection that must outlive its
// caller's ctx (see runDetached): the session's doorbell connection (the
// lease connection's bound is lendable, no longer). A lent connection
// waits lentLockWait at most for a row lock (qLentLockWait), and a lent
// statement does not run again after a lock wait timeout (see
// retryRolledBackN): so it ends on the server well within lentFor, and
// is cut short (its connection dropped) only when the network or the
// server stopped answering.
const lentFor = 6 * time.Second

// lentLockWait is the lock wait timeout of the connections a session
// lends (qLentLockWait).
const lentLockWait = time.Second

// lentKey marks the ctx of a statement lent a connection (see detach): it
// does not run again after a lock wait timeout (see retryRolledBackN), and
// its caller's loop handles the 1205 as a row held by a transaction.
type lentKey struct{}

// noWaitKey marks the ctx of a statement that does not wait for row locks
// (a no-wait variant; see execNoWaitN): the lease connection is lent to
// such a statement even when a row lock wait would not fit in lendable
// (see leaseConn.useOpen).
type noWaitKey struct{}

// briefKey marks the ctx of a statement that waits a second at most for
// a row lock whatever its connection's lock wait timeout (briefWaitSQL;
// see execNoWaitN): the lease connection is not lent it when such a wait
// would not fit in lendable (see leaseConn.useOpen).
type briefKey struct{}

// errLentCut is the error of a lock statement cut short on a connection
// lent to it (after lentFor, or the lease connection's lendable) while
// its caller's ctx had not ended: the network or the server stopped
// answering.
var errLentCut = errors.New("dsync: lock statement cut short on a connection lent to it")

// lateFor is how long such a statement may run on after its caller's ctx
// ended: far longer than a statement takes that does not wait for a row
// lock, and short enough that a call still returns promptly after its
// ctx ended when the statement never answers (a network gone dark).
const lateFor = 250 * time.Millisecond

// runDetached runs f, a lock statement on a connection lent to it that
// must outlive the caller (the session's doorbell connection, or its lease
// connection: a ctx that ends mid-statement makes the driver close the
// connection), under a ctx that does not end with ctx but lateFor after
// it, or when stop does, or after most (see detach). So a caller's
// deadline that falls mid-statement neither drops the doorbell (its
// waiters would wake for nothing, and on a *sql.DB with a connection
// limit its slot could go to another) nor closes the lease connection
// (which the next renewal would have to open again, on a server that may
// refuse connections). The caller gets ctx's error when ctx ended
// meanwhile, and handles it as after a statement cut short (an
// acquisition is undone, a release retried in the background); a
// statement cut short after most while ctx lasted returns errLentCut.
// clean reports whether the connection may be used again: f's error did
// not break it, and, when the detached ctx ended (the driver closes the
// connection when it ends mid-statement, and may when it ends just after
// one; a retry's back-off may have been cut instead), alive says so.
func runDetached(ctx, stop context.Context, most time.Duration, alive func() bool, f func(context.Context) error) (err error, clean bool) {
	dctx, cancel := detach(ctx, stop, most)
	defer cancel()
	err = f(dctx)
	cut := dctx.Err() != nil
	clean = connpool.Reusable(err) && (!cut || alive())
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case cut && err != nil:
		err = fmt.Errorf("%w after %v: %v", errLentCut, most, err)
	}
	return err, clean
}

// detach returns a ctx with ctx's values, marked as lent (lentKey), that
// ends when stop does, after most, or lateFor after ctx ended (see
// runDetached), and its cancel.
func detach(ctx, stop context.Context, most time.Duration) (context.Context, context.CancelFunc) {
	dctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(ctx), lentKey{}, true), most)
	unhookStop := context.AfterFunc(stop, cancel)
	// The timer is left to fire after cancel: it cancels dctx again.
	unhookCtx := context.AfterFunc(ctx, func() { time.AfterFunc(lateFor, cancel) })
	return dctx, func() { unhookStop(); unhookCtx(); cancel() }
}

// maxRetries bounds the immediate retries of a statement that a deadlock
// (1213) or lock wait timeout (1205) rolled back.
const maxRetries = 10

// exec runs a prepared statement on a session connection. Every statement
// dsync prepares is a single autocommit statement, so one that a deadlock
// (1213) or a lock wait timeout (1205) rolled back may simply run again:
// exec retries those, so they never reach a caller while a retry is safe.
func (s *store) exec(ctx context.Context, stmt stmtIndex, args ...any) (sql.Result, error) {
	return s.execRetrying(ctx, stmt, maxRetries, args...)
}

// execRetrying is exec with at most lockWaits retries after a lock wait
// timeout (see retryRolledBackN).
func (s *store) execRetrying(ctx context.Context, stmt stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	return s.execConn(ctx, false, stmt, lockWaits, args...)
}

// execConn is execRetrying on a connection for lease statements (priority)
// or for lock statements.
func (s *store) execConn(ctx context.Context, priority bool, stmt stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.withConn(ctx, priority, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.pool, int(stmt))
		if err != nil {
			return err
		}
		res, err = retryRolledBackN(ctx, func() (sql.Result, error) { return st.ExecContext(ctx, args...) }, lockWaits)
		return err
	})
	return res, err
}

// retryRolledBack runs a single autocommit statement (or dsync's own one
// transaction) again while a server error says it had no effect (see
// rolledBack: a deadlock or certification conflict, a lock wait timeout, a
// Galera node not ready), up to maxRetries times and while ctx lasts. From
// the second retry on it first waits a random time that doubles each time
// (1ms, 2ms, ... up to 64ms), so that statements that conflicted on a
// cluster do not meet again at once.
func retryRolledBack(ctx context.Context, run func() (sql.Result, error)) (sql.Result, error) {
	return retryRolledBackN(ctx, run, maxRetries)
}

// retryRolledBackN is retryRolledBack with at most lockWaits retries after a
// lock wait timeout (1205), and none for a statement lent a connection
// (lentKey) that may wait for a row lock (not noWaitKey): it returns the
// 1205, so that it holds the connection for one lock wait (lentLockWait)
// at most.
func retryRolledBackN(ctx context.Context, run func() (sql.Result, error), lockWaits int) (sql.Result, error) {
	for attempt := 0; ; attempt++ {
		res, err := run()
		if !isErrNo(err, rolledBack...) || attempt == maxRetries || ctx.Err() != nil {
			return res, err
		}
		if isErrNo(err, errLockWaitTimeout) {
			if lockWaits == 0 || ctx.Value(lentKey{}) != nil && ctx.Value(noWaitKey{}) == nil {
				return res, err
			}
			lockWaits--
		}
		if attempt > 0 {
			d := rand.N(time.Millisecond << min(attempt, 6))
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return res, err
			}
		}
	}
}

// execNoWait runs the variant of a lock row statement that does not wait
// for row locks (see noWaitSQL), or the plain statement on a server that
// refuses the variant, with exec's retries but for lock wait timeouts
// (1205), which it retries noWaitLockWaits times. A 1205 that it returns
// means: a transaction holds the row (Mutex.LockTx), which only its end,
// and the doorbell of the session that handed it over, will change.
// Every statement that a waiter or TryLock writes a lock row with runs
// this way, so that none of them holds a session connection while a
// transaction runs.
func (s *store) execNoWait(ctx context.Context, plain, variant stmtIndex, args ...any) (sql.Result, error) {
	return s.execNoWaitN(ctx, plain, variant, noWaitLockWaits, args...)
}

// execNoWaitN is execNoWait with at most lockWaits retries after a lock
// wait timeout.
func (s *store) execNoWaitN(ctx context.Context, plain, variant stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	for {
		stmt := s.noWait(plain, variant)
		sctx := ctx
		if stmt == variant {
			switch sql := s.q.prepared[variant]; {
			case strings.HasPrefix(sql, noWaitSQL):
				sctx = context.WithValue(ctx, noWaitKey{}, true)
			case strings.HasPrefix(sql, briefWaitSQL):
				sctx = context.WithValue(ctx, briefKey{}, true)
			}
		}
		res, err := s.execRetrying(sctx, stmt, lockWaits, args...)
		if stmt == variant && s.noWaitRefused(err) {
			continue // the plain statement, from now on
		}
		return res, err
	}
}

// execNoWaitChanged runs a statement as execNoWait does and reports whether
// it changed a row.
func (s *store) execNoWaitChanged(ctx context.Context, plain, variant stmtIndex, args ...any) (bool, error) {
	res, err := s.execNoWait(ctx, plain, variant, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// noWait returns the variant of stmt that does not wait for row locks
// (SET STATEMENT innodb_lock_wait_timeout = 0, MariaDB's), or stmt itself
// on a server that refused that syntax (MySQL; see noWaitRefused).
func (s *store) noWait(stmt, variant stmtIndex) stmtIndex {
	if s.noWaitOff.Load() {
		return stmt
	}
	return variant
}

// noWaitRefused reports whether err is the server refusing the syntax of
// the no-wait variants (1064), and then stops using them.
func (s *store) noWaitRefused(err error) bool {
	if !isErrNo(err, errParse) {
		return false
	}
	if !s.noWaitOff.Swap(true) {
		s.logger.Info("dsync: the server refuses SET STATEMENT; TryLock reads the lock row first", "err", err)
	}
	return true
}

// execChanged runs a prepared statement and reports whether it changed a
// row.
func (s *store) execChanged(ctx context.Context, stmt stmtIndex, args ...any) (bool, error) {
	res, err := s.exec(ctx, stmt, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// execOn runs a prepared statement on a connection of the session's own
// keeping (not the pool's).
func (s *store) execOn(ctx context.Context, c *connpool.Conn, stmt stmtIndex, args ...any) (sql.Result, error) {
	st, err := c.Stmt(ctx, s.pool, int(stmt))
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// execCount runs a prepared statement and returns RowsAffected.
func (s *store) execCount(ctx context.Context, stmt stmtIndex, args ...any) (int64, error) {
	res, err := s.exec(ctx, stmt, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// query runs prepared statement stmt on c and scans its one row into dest.
func (s *store) query(ctx context.Context, c *connpool.Conn, stmt stmtIndex, args []any, dest ...any) error {
	st, err := c.Stmt(ctx, s.pool, int(stmt))
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}

// withDedicated runs f on c, a connection of the caller's own keeping,
// under a ctx that also ends with the session, then hands c to put, with
// keep false when the call failed or ended with ctx or the session (put
// then closes it).
func (s *store) withDedicated(ctx context.Context, c *connpool.Conn, put func(c *connpool.Conn, keep bool), f func(context.Context) error) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.stopped, cancel)
	err := f(sctx)
	stop()
	put(c, err == nil && sctx.Err() == nil && s.stopped.Err() == nil)
	return err
}

// listThenDelete lists rows with the plain read list (args; scan reads
// one row), then deletes them one by one with del, and returns how many
// rows del deleted, how many the read listed, and the first error, which
// ends it.
func listThenDelete[T any](ctx context.Context, st *store, list stmtIndex, args []any,
	scan func(*sql.Rows) (T, error), del func(context.Context, T) (int64, error)) (deleted int64, listed int, err error) {
	var found []T
	err = st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		stmt, err := c.Stmt(ctx, st.pool, int(list))
		if err != nil {
			return err
		}
		rows, err := stmt.QueryContext(ctx, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scan(rows)
			if err != nil {
				return err
			}
			found = append(found, r)
		}
		return rows.Err()
	})
	for _, r := range found {
		if err != nil {
			break
		}
		var n int64
		n, err = del(ctx, r)
		deleted += n
	}
	return deleted, len(found), err
}

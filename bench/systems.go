package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"

	"github.com/dsynclock/dsync"
)

// A system is one lock implementation under test (or the floor), on one of
// the servers.
type system struct {
	key       string // short identifier, used in the chart and the tables
	name      string // what it is, for the report
	server    string // "mariadb", "redis", "redis-aof" or "etcd"
	exclusive bool   // mutual exclusion: takes part in contention and handoff
	// readers: a shared (reader) lock; its idle and handoff scenarios wait
	// for a writer of the same name (writerOf).
	readers bool
	// newSession opens one client session: what one process would have.
	newSession func(ctx context.Context) (session, error)
	// statements returns the server's count of statements (commands, RPCs)
	// received so far, for the idle and keep-alive scenarios.
	statements func(ctx context.Context) (int64, error)
	countDesc  string // what statements counts
	selfCount  int64  // how much one call of statements adds to the count
}

// A session is one client's connection to the lock service: a dsync
// Session on a *sql.DB of its own, a MariaDB connection, a redis client or
// an etcd client with its concurrency.Session.
type session interface {
	// lock returns the lock called name in this session.
	lock(name string) locker
	close() error
}

// A locker is one lock of one session. Lock blocks until it is held, or
// returns ctx's error; Unlock releases it.
type locker interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// lockFuncs adapts a pair of functions to locker.
type lockFuncs struct{ lockF, unlockF func(context.Context) error }

func (l lockFuncs) Lock(ctx context.Context) error   { return l.lockF(ctx) }
func (l lockFuncs) Unlock(ctx context.Context) error { return l.unlockF(ctx) }

// env is what the systems need from the running servers.
type env struct {
	srv      *servers
	monitor  *sql.DB         // for SHOW GLOBAL STATUS and table sizes; not a lock client
	redisMon []*redis.Client // one per redis server, for INFO
	etcdRPCs atomic.Int64    // unary RPCs sent by the benchmark's etcd clients
	prefix   string          // dsync table prefix of this run
}

// questions returns MariaDB's global Questions counter: statements sent by
// clients (the SHOW itself counts one).
func (e *env) questions(ctx context.Context) (int64, error) {
	var name string
	var n int64
	err := e.monitor.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n)
	return n, err
}

// redisCommands returns redis server i's total_commands_processed (the INFO
// itself counts one).
func (e *env) redisCommands(i int) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		info, err := e.redisMon[i].Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		var n int64
		_, err = fmt.Sscan(infoField(info, "total_commands_processed"), &n)
		return n, err
	}
}

// systems returns every system, floor first.
func (e *env) systems() []*system {
	dsn := e.srv.mysqlDSN()
	maria := "MariaDB `Questions` (SHOW GLOBAL STATUS)"
	list := []*system{
		{key: "floor", name: "floor: prepared `INSERT` + `DELETE`", server: "mariadb",
			newSession: func(ctx context.Context) (session, error) { return newFloorSession(ctx, dsn, e.prefix) }},
		{key: "get_lock", name: "MariaDB `GET_LOCK` / `RELEASE_LOCK`", server: "mariadb", exclusive: true,
			newSession: func(ctx context.Context) (session, error) { return newGetLockSession(ctx, dsn) }},
	}
	for _, k := range []struct {
		key, kind, name string
		exclusive       bool
		maxOpen         int // SetMaxOpenConns of each session's *sql.DB; 0: no limit
	}{
		{"mutex", "mutex", "dsync `Mutex`", true, 0},
		{"mutex-cap8", "mutex", "dsync `Mutex`, `SetMaxOpenConns(8)`", true, 8},
		{"mutex-cap32", "mutex", "dsync `Mutex`, `SetMaxOpenConns(32)`", true, 32},
		{"fair", "fair", "dsync `FairMutex`", true, 0},
		{"fair-cap8", "fair", "dsync `FairMutex`, `SetMaxOpenConns(8)`", true, 8},
		{"fair-cap32", "fair", "dsync `FairMutex`, `SetMaxOpenConns(32)`", true, 32},
		{"rw-writer", "rw-writer", "dsync `RWMutex` writer (`Lock`)", true, 0},
		{"rw-writer-cap8", "rw-writer", "dsync `RWMutex` writer (`Lock`), `SetMaxOpenConns(8)`", true, 8},
		{"rw-reader", "rw-reader", "dsync `RWMutex` reader (`RLock`)", false, 0},
		{"rw-reader-cap8", "rw-reader", "dsync `RWMutex` reader (`RLock`), `SetMaxOpenConns(8)`", false, 8},
	} {
		list = append(list, &system{key: k.key, name: k.name, server: "mariadb", exclusive: k.exclusive, readers: k.kind == "rw-reader",
			newSession: func(ctx context.Context) (session, error) {
				return newDsyncSessionCapped(ctx, dsn, e.prefix, k.kind, k.maxOpen)
			}})
	}
	for i, r := range e.srv.redis {
		for _, retry := range []struct {
			key, name string
			opts      []redsync.Option
		}{
			{"redsync", "redsync, default retry (50–250 ms)", nil},
			{"redsync-1ms", "redsync, `WithRetryDelay(1ms)`", []redsync.Option{redsync.WithRetryDelay(time.Millisecond)}},
		} {
			key, name := retry.key, retry.name
			if r.label == "redis-aof" {
				key += "-aof"
				name += ", appendfsync always"
			}
			addr, opts := r.addr, retry.opts
			list = append(list, &system{key: key, name: name, server: r.label, exclusive: true,
				newSession: func(ctx context.Context) (session, error) { return newRedsyncSession(ctx, addr, opts) },
				statements: e.redisCommands(i), countDesc: "redis `total_commands_processed` (INFO)", selfCount: 1})
		}
	}
	list = append(list, &system{key: "etcd", name: "etcd `concurrency.Mutex`", server: "etcd", exclusive: true,
		newSession: func(ctx context.Context) (session, error) { return newEtcdSession(ctx, e.srv.etcdURL, &e.etcdRPCs) },
		statements: func(context.Context) (int64, error) { return e.etcdRPCs.Load(), nil },
		countDesc:  "unary gRPC calls sent by the clients (streams: lease keep-alives, watches, not counted)"})
	for _, s := range list {
		if s.server == "mariadb" {
			s.statements, s.countDesc, s.selfCount = e.questions, maria, 1
		}
	}
	return list
}

// dsyncSession is a dsync Session on a *sql.DB of its own, as a separate
// process would have.
type dsyncSession struct {
	db    *sql.DB
	s     *dsync.Session
	kind  string
	limit int64 // of the "semaphore" kind's Semaphores
}

func openDB(dsn string) (*sql.DB, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(8)
	return db, nil
}

func newDsyncSession(ctx context.Context, dsn, prefix, kind string, opts ...dsync.Option) (*dsyncSession, error) {
	return newDsyncSessionCapped(ctx, dsn, prefix, kind, 0, opts...)
}

// newDsyncSessionCapped is newDsyncSession on a *sql.DB limited to maxOpen
// connections (0: no limit), as production pools are.
func newDsyncSessionCapped(ctx context.Context, dsn, prefix, kind string, maxOpen int, opts ...dsync.Option) (*dsyncSession, error) {
	db, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxOpen)
	s, err := dsync.NewSession(ctx, db, append([]dsync.Option{dsync.WithTablePrefix(prefix)}, opts...)...)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &dsyncSession{db: db, s: s, kind: kind}, nil
}

func (d *dsyncSession) lock(name string) locker {
	switch d.kind {
	case "fair":
		return dsync.NewFairMutex(d.s, name)
	case "rw-writer":
		return dsync.NewRWMutex(d.s, name)
	case "rw-reader":
		rw := dsync.NewRWMutex(d.s, name)
		return lockFuncs{rw.RLock, rw.RUnlock}
	case "semaphore": // one permit of limit
		m := dsync.NewSemaphore(d.s, name, d.limit)
		return lockFuncs{
			func(ctx context.Context) error { return m.Acquire(ctx, 1) },
			func(ctx context.Context) error { return m.Release(ctx, 1) },
		}
	default:
		return dsync.NewMutex(d.s, name)
	}
}

func (d *dsyncSession) close() error {
	err := d.s.Close()
	return errors.Join(err, d.db.Close())
}

// floorSession runs the floor: an autocommit INSERT and DELETE of one row,
// each a statement prepared once on one connection.
type floorSession struct {
	db       *sql.DB
	conn     *sql.Conn
	ins, del *sql.Stmt
}

func newFloorSession(ctx context.Context, dsn, prefix string) (_ *floorSession, err error) {
	db, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	f := &floorSession{db: db}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	table := prefix + "floor"
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+table+
		" (name VARBINARY(255) NOT NULL PRIMARY KEY, holder BIGINT NOT NULL) ENGINE=InnoDB"); err != nil {
		return nil, err
	}
	if f.conn, err = db.Conn(ctx); err != nil {
		return nil, err
	}
	if f.ins, err = f.conn.PrepareContext(ctx, "INSERT INTO "+table+" (name, holder) VALUES (?, ?)"); err != nil {
		return nil, err
	}
	if f.del, err = f.conn.PrepareContext(ctx, "DELETE FROM "+table+" WHERE name = ? AND holder = ?"); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *floorSession) lock(name string) locker {
	return lockFuncs{
		func(ctx context.Context) error { _, err := f.ins.ExecContext(ctx, name, 1); return err },
		func(ctx context.Context) error { _, err := f.del.ExecContext(ctx, name, 1); return err },
	}
}

func (f *floorSession) close() error {
	for _, s := range []*sql.Stmt{f.ins, f.del} {
		if s != nil {
			s.Close()
		}
	}
	if f.conn != nil {
		f.conn.Close()
	}
	return f.db.Close()
}

// getLockSession holds MariaDB user-level locks on one connection, with
// prepared GET_LOCK and RELEASE_LOCK statements.
type getLockSession struct {
	db           *sql.DB
	conn         *sql.Conn
	get, release *sql.Stmt
}

func newGetLockSession(ctx context.Context, dsn string) (_ *getLockSession, err error) {
	db, err := openDB(dsn)
	if err != nil {
		return nil, err
	}
	g := &getLockSession{db: db}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if g.conn, err = db.Conn(ctx); err != nil {
		return nil, err
	}
	if g.get, err = g.conn.PrepareContext(ctx, "SELECT GET_LOCK(?, 600)"); err != nil {
		return nil, err
	}
	if g.release, err = g.conn.PrepareContext(ctx, "SELECT RELEASE_LOCK(?)"); err != nil {
		return nil, err
	}
	return g, nil
}

func (g *getLockSession) lock(name string) locker {
	return lockFuncs{
		func(ctx context.Context) error {
			var got sql.NullInt64
			if err := g.get.QueryRowContext(ctx, name).Scan(&got); err != nil {
				return err
			}
			if got.Int64 != 1 {
				return fmt.Errorf("GET_LOCK(%q) returned %v", name, got)
			}
			return nil
		},
		func(ctx context.Context) error {
			var released sql.NullInt64
			if err := g.release.QueryRowContext(ctx, name).Scan(&released); err != nil {
				return err
			}
			if released.Int64 != 1 {
				return fmt.Errorf("RELEASE_LOCK(%q) returned %v", name, released)
			}
			return nil
		},
	}
}

func (g *getLockSession) close() error {
	for _, s := range []*sql.Stmt{g.get, g.release} {
		if s != nil {
			s.Close()
		}
	}
	if g.conn != nil {
		g.conn.Close()
	}
	return g.db.Close()
}

// redsyncSession is one redis client (its own connection pool) with a
// redsync instance over it.
type redsyncSession struct {
	c    *redis.Client
	rs   *redsync.Redsync
	opts []redsync.Option
}

func newRedsyncSession(ctx context.Context, addr string, opts []redsync.Option) (*redsyncSession, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, err
	}
	return &redsyncSession{c: c, rs: redsync.New(goredis.NewPool(c)), opts: opts}, nil
}

func (r *redsyncSession) lock(name string) locker {
	m := r.rs.NewMutex(name, r.opts...)
	return lockFuncs{
		func(ctx context.Context) error {
			// redsync gives up after its tries (32): a caller that must have
			// the lock tries again, as here.
			for {
				err := m.LockContext(ctx)
				if err == nil {
					return nil
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				var taken *redsync.ErrTaken
				var nodeTaken *redsync.ErrNodeTaken
				if !errors.Is(err, redsync.ErrFailed) && !errors.As(err, &taken) && !errors.As(err, &nodeTaken) {
					return err
				}
			}
		},
		func(ctx context.Context) error {
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("redsync: unlock of %q not applied", m.Name())
			}
			return err
		},
	}
}

func (r *redsyncSession) close() error { return r.c.Close() }

// etcdSession is one etcd client with a concurrency.Session (a lease kept
// alive in the background). rpcs counts the unary calls it sends.
type etcdSession struct {
	c *clientv3.Client
	s *concurrency.Session
}

func newEtcdSession(ctx context.Context, endpoint string, rpcs *atomic.Int64, opts ...concurrency.SessionOption) (*etcdSession, error) {
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		rpcs.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)},
	})
	if err != nil {
		return nil, err
	}
	s, err := concurrency.NewSession(c, append([]concurrency.SessionOption{concurrency.WithContext(ctx)}, opts...)...)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &etcdSession{c: c, s: s}, nil
}

func (e *etcdSession) lock(name string) locker {
	return concurrency.NewMutex(e.s, "/bench/"+strings.ReplaceAll(name, "/", "_"))
}

func (e *etcdSession) close() error {
	err := e.s.Close()
	return errors.Join(err, e.c.Close())
}

// openSessions opens n sessions of sys; on error it closes those opened.
func openSessions(ctx context.Context, sys *system, n int) ([]session, error) {
	return openAll(ctx, sys.key, n, sys.newSession)
}

// openAll opens n sessions with open; on error it closes those opened.
func openAll[S interface{ close() error }](ctx context.Context, key string, n int, open func(context.Context) (S, error)) ([]S, error) {
	var out []S
	for range n {
		s, err := open(ctx)
		if err != nil {
			closeSessions(out)
			return nil, fmt.Errorf("%s: new session: %w", key, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// writerOf returns the lock that excludes s's lock(name): for a readers
// system the RWMutex's writer side, else lock(name) itself.
func writerOf(s session, name string) locker {
	if ds, ok := s.(*dsyncSession); ok && ds.kind == "rw-reader" {
		return dsync.NewRWMutex(ds.s, name)
	}
	return s.lock(name)
}

func closeSessions[S interface{ close() error }](ss []S) {
	for _, s := range ss {
		if err := s.close(); err != nil {
			logf("closing a session: %v", err)
		}
	}
}

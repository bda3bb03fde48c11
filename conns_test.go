package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// userDSN creates a server user of the test's own, allowed everything in
// the test database, and returns a DSN of the test database for it, so
// that the connections of a *sql.DB opened with it can be counted on the
// server (information_schema.PROCESSLIST, by user). The user is dropped
// when the test ends.
func userDSN(t *testing.T, admin *sql.DB, dsn, user string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", user),
		fmt.Sprintf("GRANT ALL ON `%s`.* TO '%s'@'%%'", cfg.DBName, user),
	} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { admin.Exec(fmt.Sprintf("DROP USER '%s'@'%%'", user)) })
	cfg.User, cfg.Passwd = user, "pw"
	return cfg.FormatDSN()
}

// userConns returns how many connections user has open on the server.
func userConns(t *testing.T, admin *sql.DB, user string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?", user).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSessionConnections counts on the server the connections of one
// session, on a *sql.DB of its own (as one process would have), without a
// connection limit and with a limit of 8: at most 2 at rest (after
// NewSession, and after it has held locks: its lease's and its
// doorbell's, on which it runs its lock statements; the pool closes what
// it does not use), and at most one more while its goroutines wait for 4
// names another session holds (the one it blocks on). Each waiter gets its
// lock once the names are free. (It kept up to 5 at rest and 6 while
// waiting: the pool's connections for lock statements stayed open.)
func TestSessionConnections(t *testing.T) {
	const names = 4
	ctx := context.Background()
	admin := dbtest.Open(t)
	for i, limit := range []int{0, 8} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			t.Parallel()
			user := fmt.Sprintf("conns%d_%d", i, time.Now().UnixNano()%1e9)
			db := dbtest.OpenDSN(t, userDSN(t, admin, dbtest.DSN(), user))
			db.SetMaxOpenConns(limit)
			s := sessionOn(t, db, dsync.WithTTL(2*time.Second))
			rest := func(when string) {
				t.Helper()
				// The pool closes a connection idle for a second, and so
				// does the waiter side.
				n := 0
				for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
					if n = userConns(t, admin, user); n <= 2 {
						break
					}
				}
				if n > 2 {
					t.Errorf("connections of a session at rest %s: got %d; want at most 2", when, n)
				}
			}
			rest("after NewSession")
			base := lockName(t)
			for i := range names {
				m := dsync.NewMutex(s, fmt.Sprintf("%s/own%d", base, i))
				mustLock(t, m, ctx)
				mustUnlock(t, m, ctx)
			}
			rest("after holding locks")

			release := waitOnHeld(t, newSession(t), s, base, names)
			time.Sleep(1200 * time.Millisecond) // the waiters settle, the pool closes what it does not use
			most := 0
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				most = max(most, userConns(t, admin, user))
			}
			t.Logf("connections while %d names waited: at most %d", names, most)
			if most > 3 {
				t.Errorf("connections of a session whose goroutines wait for %d names: got at most %d; want at most 3", names, most)
			}
			for _, err := range release() {
				t.Error(err)
			}
			rest("after waiting")
		})
	}
}

// TestManySessionsAtMaxConnections runs 50 sessions, each on a *sql.DB of
// its own without a connection limit (as 50 processes would), whose
// goroutines each wait for the same 4 names another session holds,
// against a dedicated server at its default max_connections, 151. Every
// NewSession, Lock and Unlock succeeds (none gets 1040), every waiter gets
// its lock once the names are free, and no session loses its lease. (It
// took about 9 connections a session: 60 such sessions left 42 NewSession
// and 4 Lock calls with 1040.)
func TestManySessionsAtMaxConnections(t *testing.T) {
	slowTest(t)
	const (
		sessions = 50
		names    = 4
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, t, "--max-connections=151")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE many"); err != nil {
		t.Fatal(err)
	}
	status := func(name string) int64 {
		t.Helper()
		var n int64
		if err := admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	open := func() *dsync.Session {
		t.Helper()
		s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, srv.DSN("many")), dsync.WithTTL(3*time.Second))
		if err != nil {
			t.Fatalf("NewSession: got %v; want nil", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	holder := open()
	base := lockName(t)
	var held []*dsync.Mutex
	for i := range names {
		m := dsync.NewMutex(holder, fmt.Sprintf("%s/%d", base, i))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
	}
	ss := []*dsync.Session{holder}
	for range sessions {
		ss = append(ss, open())
	}
	t.Logf("server connections with %d sessions at rest: %d", len(ss), status("Threads_connected"))
	lockCtx, lockCancel := context.WithTimeout(ctx, time.Minute)
	defer lockCancel()
	errs := make(chan error, sessions*names)
	for _, s := range ss[1:] {
		for i := range names {
			go func() {
				m := dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i))
				err := m.Lock(lockCtx)
				if err == nil {
					err = m.Unlock(lockCtx)
				}
				errs <- err
			}()
		}
	}
	time.Sleep(2 * time.Second) // the waiters settle
	t.Logf("server connections while %d sessions waited for %d names each: %d (max_connections 151; refused so far: %d)",
		sessions, names, status("Threads_connected"), status("Connection_errors_max_connections"))
	for _, m := range held {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range sessions * names {
		if err := <-errs; err != nil {
			t.Errorf("Lock and Unlock of a waiter: got %v; want nil", err)
		}
	}
	for i, s := range ss {
		if err := s.Err(); err != nil {
			t.Errorf("session %d: Err %v; want nil", i, err)
		}
	}
}

// TestLeaseConnLentAtMaxConnections: on a server that refuses connections
// (1040), a session's lock statements run on its lease connection, and
// TryLock and Lock calls whose deadlines end while theirs run there leave
// the lease connection open: no renewal fails (the lease connection was
// closed with the statement, and the next renewal, which had to open
// another, got 1040). It first checks that statements ran there and that
// callers' deadlines ended mid-statement.
func TestLeaseConnLentAtMaxConnections(t *testing.T) {
	slowTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, t, "--max-connections=20")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE lent"); err != nil {
		t.Fatal(err)
	}
	open := func() *dsync.Session {
		t.Helper()
		s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, srv.DSN("lent")), dsync.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	holder, s := open(), open()
	name := lockName(t)
	mustLock(t, dsync.NewMutex(holder, name), ctx)
	for end := time.Now().Add(5 * time.Second); dsync.PoolOpen(s) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the session's pool keeps %d idle connections after 5s", dsync.PoolOpen(s))
		}
	}
	fillServer(ctx, t, srv.DSN("lent"))
	before := s.Stats().RenewalFailures
	end := time.Now().Add(3 * time.Second)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			m := dsync.NewMutex(s, name)
			for i := 0; time.Now().Before(end); i++ {
				// Deadlines of 0.1 to 2ms: many end while a statement runs.
				cctx, cancel := context.WithTimeout(ctx, time.Duration(100+(i*7+g*13)%1900)*time.Microsecond)
				if g%2 == 0 {
					m.TryLock(cctx)
				} else {
					m.Lock(cctx)
				}
				cancel()
			}
		}()
	}
	for range 4 {
		<-done
	}
	lent, cut := dsync.LeaseConnLent(s)
	t.Logf("lock statements on the lease connection: %d, %d of them with the caller's deadline ended meanwhile", lent, cut)
	if lent == 0 || cut == 0 {
		t.Fatalf("the fault did not happen: lock statements on the lease connection %d, cut by the caller %d; want both above 0", lent, cut)
	}
	time.Sleep(time.Second) // renewals after the last cut
	if got := s.Stats().RenewalFailures - before; got != 0 {
		t.Errorf("RenewalFailures: got %d; want 0", got)
	}
	if err := s.Err(); err != nil {
		t.Errorf("session: Err %v; want nil", err)
	}
}

// fillServer takes every connection the server of dsn has left, and, as
// other processes would, each one that a session lets go, until the test
// ends.
func fillServer(ctx context.Context, t *testing.T, dsn string) {
	t.Helper()
	filler := dbtest.OpenDSN(t, dsn)
	var conns []*sql.Conn
	fill := func() error {
		for {
			c, err := filler.Conn(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil // the test is ending: its ctx cut the dial
				}
				if !strings.Contains(err.Error(), "1040") {
					return fmt.Errorf("filling the server: got %v; want 1040 at last", err)
				}
				return nil
			}
			conns = append(conns, c)
		}
	}
	if err := fill(); err != nil {
		t.Fatal(err)
	}
	stopFill, filled := make(chan struct{}), make(chan error, 1)
	go func() {
		var err error
		for err == nil {
			select {
			case <-stopFill:
				filled <- nil
				return
			case <-time.After(5 * time.Millisecond):
			}
			err = fill()
		}
		filled <- err
	}()
	t.Cleanup(func() {
		close(stopFill)
		if err := <-filled; err != nil {
			t.Error(err)
		}
		for _, c := range conns {
			c.Close()
		}
	})
}

// TestLentRowLockKeepsLeaseConn: on a server that refuses connections
// (1040), a release lent the session's lease connection that meets a row
// lock (a transaction holds the name's row) is ended by the server
// (1205, the lease connection's lock wait timeout of a second), not cut
// by the client, which closed the lease connection: the next renewal got
// 1040 and the session was lost. It first checks that the release ran on
// the lease connection (the doorbell's was busy with another release
// behind the same transaction). Neither Unlock, given no deadline,
// returns context.DeadlineExceeded. With a TTL of 9s the lease connection
// waits a second for the row; with 3s (lendable 0.7s) it does not wait
// while lent, and waits again for its renewals.
func TestLentRowLockKeepsLeaseConn(t *testing.T) {
	slowTest(t)
	for _, ttl := range []time.Duration{9 * time.Second, 3 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) { testLentRowLockKeepsLeaseConn(t, ttl) })
	}
}

func testLentRowLockKeepsLeaseConn(t *testing.T, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, t, "--max-connections=20")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE lent"); err != nil {
		t.Fatal(err)
	}
	s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, srv.DSN("lent")), dsync.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	base := lockName(t)
	ma, mb, mc := dsync.NewMutex(s, base+"/a"), dsync.NewMutex(s, base+"/b"), dsync.NewMutex(s, base+"/c")
	mustLock(t, ma, ctx)
	mustLock(t, mb, ctx)
	adb := dbtest.OpenDSN(t, srv.DSN("lent"))
	adb.SetMaxOpenConns(1)
	awaitBellOf(t, adb, s.ID())
	for end := time.Now().Add(5 * time.Second); dsync.PoolOpen(s) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the session's pool keeps %d idle connections after 5s", dsync.PoolOpen(s))
		}
	}
	tx, err := dbtest.OpenDSN(t, srv.DSN("lent")).BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, n := range []string{ma.Name(), mb.Name()} {
		if _, err := tx.ExecContext(ctx, "SELECT name FROM dsync_lock WHERE name = ? FOR UPDATE", n); err != nil {
			t.Fatal(err)
		}
	}
	fillServer(ctx, t, srv.DSN("lent"))
	before := s.Stats()
	ua, ub := make(chan error, 1), make(chan error, 1)
	go func() { ua <- ma.Unlock(context.Background()) }() // on the doorbell connection
	time.Sleep(100 * time.Millisecond)
	lent0, _ := dsync.LeaseConnLent(s)
	go func() { ub <- mb.Unlock(context.Background()) }() // on the lease connection
	time.Sleep(100 * time.Millisecond)
	lent1, _ := dsync.LeaseConnLent(s)
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Millisecond)
	tl := time.Now()
	ok, err := mc.TryLock(cctx)
	ccancel()
	t.Logf("TryLock (20ms deadline) behind the release on the lease connection: %v, %v after %v", ok, err, time.Since(tl).Round(time.Millisecond))
	if ok {
		mc.Unlock(ctx)
	}
	errA, errB := <-ua, <-ub
	t.Logf("Unlock a: %v; Unlock b: %v", errA, errB)
	if lent1 == lent0 {
		t.Fatalf("the fault did not happen: no lock statement ran on the lease connection (Unlock b: %v)", errB)
	}
	for _, err := range []error{errA, errB} {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Unlock(context.Background()): %v; want no context.DeadlineExceeded", err)
		}
	}
	// Two renewals after the release: the first one needs the lease
	// connection back.
	for end := time.Now().Add(10 * time.Second); s.Stats().Renewals < before.Renewals+2 && s.Err() == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("renewals: %d in 10s; want 2", s.Stats().Renewals-before.Renewals)
		}
	}
	if got := s.Stats().RenewalFailures - before.RenewalFailures; got != 0 {
		t.Errorf("RenewalFailures: got %d; want 0", got)
	}
	if err := s.Err(); err != nil {
		t.Errorf("session: Err %v; want nil", err)
	}
}

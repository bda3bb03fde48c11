package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// TestSlowLinkLockRightAfterNewSession puts 500ms of latency each way (a
// round trip of TTL/3, TTL 3s) between two sessions of one *sql.DB and the
// server. The second session starts through the slow link and locks right
// after NewSession returns, then unlocks and locks again: whatever its
// start and its first Lock need (connections to open, statements to
// prepare, a doorbell) must delay neither session's renewals, so both are
// live 3 TTLs after it started. Each session renews on a connection of its
// own; the first used to lose its lease while the second's NewSession held
// the connection the sessions shared for renewals.
func TestSlowLinkLockRightAfterNewSession(t *testing.T) {
	slowTest(t)
	t.Parallel() // waits on latency: beside the other such tests, after the statement-counting ones
	const ttl = 3 * time.Second
	const latency = 500 * time.Millisecond
	p, dsn := dbtest.FaultProxy(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(faultLogWriter{t}, nil))
	db := dbtest.OpenDSN(t, dsn)
	first, err := dsync.NewSession(ctx, db, dsync.WithTTL(ttl), dsync.WithLogger(logger.With("session", "first")))
	if err != nil {
		t.Fatalf("NewSession: got %v; want nil", err)
	}
	t.Cleanup(func() { first.Close() })

	p.SetLatency(latency)
	begin := time.Now()
	s, err := dsync.NewSession(ctx, db, dsync.WithTTL(ttl), dsync.WithLogger(logger.With("session", "second")))
	if err != nil {
		t.Fatalf("NewSession through the slow link: got %v; want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	started := time.Now()
	// The fault: every round trip of the new session took 2×latency.
	if took := started.Sub(begin); took < 4*2*latency {
		t.Fatalf("NewSession through the slow link took %v; want at least 4 round trips of %v (the latency did not apply)", took, 2*latency)
	}
	t.Logf("NewSession took %v through the slow link", started.Sub(begin))

	m := dsync.NewMutex(s, lockName(t))
	for i := range 2 {
		if err := m.Lock(ctx); err != nil {
			t.Fatalf("Lock %d, %v after NewSession: got %v; want nil", i, time.Since(started), err)
		}
		t.Logf("Lock %d returned %v after NewSession", i, time.Since(started))
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock %d, %v after NewSession: got %v; want nil", i, time.Since(started), err)
		}
	}
	wait := time.NewTimer(time.Until(started.Add(3 * ttl)))
	defer wait.Stop()
	select {
	case <-first.Done():
		t.Fatalf("first session: Done closed %v after the second's NewSession returned (Err %v); want open", time.Since(started), first.Err())
	case <-s.Done():
		t.Fatalf("Done closed %v after NewSession returned (Err %v); want open", time.Since(started), s.Err())
	case <-wait.C:
	}
	for i, x := range []*dsync.Session{first, s} {
		if err := x.Err(); err != nil {
			t.Fatalf("session %d: Err %v after the second's NewSession: got %v; want nil", i, time.Since(started), err)
		}
	}
}

// TestMaxConnectionsKeepsLeases runs sessions, each on a *sql.DB of its
// own without a connection limit, against a dedicated server that allows
// 20 connections (each takes one for its lease, the holder three), and has
// them all wait for a lock another session holds, so that their waiters
// want more connections than the server allows. The fault is proven by
// the server's count of connections it refused (1040). The outcome: no
// Lock returns 1040 (a waiter that cannot have a connection polls, within
// the polling budget, instead of blocking on a doorbell, and one whose
// statement cannot have one tries again, paced), every Lock gets the lock
// once it is free, and no session loses its lease, since renewals need no
// new connection. (Lock returned 1040 at once before.)
func TestMaxConnectionsKeepsLeases(t *testing.T) {
	slowTest(t)
	const (
		ttl      = time.Second
		sessions = 12
		held     = 2 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, t, "--max-connections=20")
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE maxconn"); err != nil {
		t.Fatal(err)
	}
	refusals := func() int64 {
		var name string
		var n int64
		if err := admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Connection_errors_max_connections'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	open := func() *dsync.Session {
		t.Helper()
		s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, srv.DSN("maxconn")), dsync.WithTTL(ttl))
		if err != nil {
			t.Fatalf("NewSession: got %v; want nil", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	holder := open()
	name := lockName(t)
	hm := dsync.NewMutex(holder, name)
	if err := hm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ss := []*dsync.Session{holder}
	for range sessions {
		ss = append(ss, open())
	}
	refused0 := refusals()

	lockCtx, lockCancel := context.WithTimeout(ctx, 30*time.Second)
	defer lockCancel()
	results := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := dsync.NewMutex(s, name)
			err := m.Lock(lockCtx)
			if err == nil {
				err = m.Unlock(lockCtx)
			}
			results[i+1] = err
		}()
	}
	time.Sleep(held / 2) // the waiters settle
	q0, from := serverQuestions(t, admin), time.Now()
	time.Sleep(held / 2)
	checkRate(t, admin, q0, from, sessions)
	if err := hm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	refused := refusals() - refused0
	t.Logf("connections the server refused (1040) while %d sessions waited: %d", sessions, refused)
	// The fault: the server refused connections.
	if refused == 0 {
		t.Fatalf("connections refused: got 0; want some (the server did not run out of connections)")
	}
	for i, err := range results[1:] {
		if err != nil {
			t.Errorf("session %d: Lock and Unlock of a name held %v, on a server out of connections: got %v; want nil", i+1, held, err)
		}
	}
	for i, s := range ss {
		if err := s.Err(); err != nil {
			t.Errorf("session %d after waiters wanted more connections than the server allows: Err %v; want nil", i, err)
		}
	}
}

// BenchmarkMaxConnections measures what happens at the server's default
// max_connections, 151 (a dedicated server; the tests' servers allow
// 500): 200 sessions, each on a
// *sql.DB of its own without a connection limit, start, and each calls
// Lock, with a ctx of 4 TTLs, for one of 10 names another session holds.
// It reports how many NewSession calls and Locks the server refused
// (1040), how many Locks waited until their ctx ended, and how many
// sessions were lost (docs/OPERATIONS.md, Connections). Run it with
// go test -run '^$' -bench MaxConnections -benchtime 1x .
func BenchmarkMaxConnections(b *testing.B) {
	const (
		ttl      = 3 * time.Second
		sessions = 200
		names    = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, b, "--max-connections=151")
	for i := 0; i < b.N; i++ {
		db := fmt.Sprintf("maxconn%d", i)
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+db); err != nil {
			b.Fatal(err)
		}
		var all []*dsync.Session
		holder, err := dsync.NewSession(ctx, dbtest.OpenDSN(b, srv.DSN(db)), dsync.WithTTL(ttl))
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, holder)
		for n := range names {
			if err := dsync.NewMutex(holder, fmt.Sprint("n", n)).Lock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		refusedNew := 0
		var ss []*dsync.Session
		for range sessions {
			s, err := dsync.NewSession(ctx, dbtest.OpenDSN(b, srv.DSN(db)), dsync.WithTTL(ttl))
			if err != nil {
				if !isErrNo1040(err) {
					b.Fatalf("NewSession: got %v; want nil or 1040", err)
				}
				refusedNew++
				continue
			}
			ss = append(ss, s)
		}
		all = append(all, ss...)
		lockCtx, lockCancel := context.WithTimeout(ctx, 4*ttl)
		var refusedLock, waited atomic.Int64
		var wg sync.WaitGroup
		for i, s := range ss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch err := dsync.NewMutex(s, fmt.Sprint("n", i%names)).Lock(lockCtx); {
				case isErrNo1040(err):
					refusedLock.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					waited.Add(1)
				default:
					b.Errorf("Lock: got %v; want 1040 or ctx's error", err)
				}
			}()
		}
		wg.Wait()
		lockCancel()
		lost := 0
		for _, s := range all {
			if s.Err() != nil {
				lost++
			}
			s.Close()
		}
		b.ReportMetric(float64(len(ss)), "started")
		b.ReportMetric(float64(refusedNew), "NewSession-1040")
		b.ReportMetric(float64(refusedLock.Load()), "Lock-1040")
		b.ReportMetric(float64(waited.Load()), "Lock-waited")
		b.ReportMetric(float64(lost), "lost")
	}
}

// isErrNo1040 reports whether err wraps the server's 1040 (too many
// connections).
func isErrNo1040(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1040
}

// dedicatedServer starts a throwaway server of the test's own with extra
// mariadbd arguments, stopped when the test ends, and returns it with a
// *sql.DB of one connection on it, without a database.
func dedicatedServer(ctx context.Context, tb testing.TB, args ...string) (*mariadb.Server, *sql.DB) {
	tb.Helper()
	srv, err := mariadb.StartWith(ctx, mariadb.Config{Args: args})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Stop() })
	admin := dbtest.OpenDSN(tb, srv.DSN(""))
	admin.SetMaxOpenConns(1)
	return srv, admin
}

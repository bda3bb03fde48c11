package dsync_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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
	const ttl = 3 * time.Second
	const latency = 500 * time.Millisecond
	p, dsn := newFaultProxy(t)
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
// them all wait for a lock another session holds,
// so that their waiters want more connections than the server allows. The
// documented outcome: a Lock that cannot have a connection returns an
// error wrapping the server's 1040 at once, the others wait until their
// ctx ends, and no session loses its lease, since renewals need no new
// connection.
func TestMaxConnectionsKeepsLeases(t *testing.T) {
	const (
		ttl      = time.Second
		sessions = 12
		wait     = 3 * ttl
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := mariadb.StartWith(ctx, mariadb.Config{Args: []string{"--max-connections=20"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	admin := dbtest.OpenDSN(t, srv.DSN(""))
	admin.SetMaxOpenConns(1)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE maxconn"); err != nil {
		t.Fatal(err)
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
	if err := dsync.NewMutex(holder, name).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ss := []*dsync.Session{holder}
	for range sessions {
		ss = append(ss, open())
	}

	lockCtx, lockCancel := context.WithTimeout(ctx, wait)
	defer lockCancel()
	results := make([]error, len(ss))
	var wg sync.WaitGroup
	for i, s := range ss[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i+1] = dsync.NewMutex(s, name).Lock(lockCtx)
		}()
	}
	wg.Wait()
	refused, waited := 0, 0
	for i, err := range results[1:] {
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && me.Number == 1040:
			refused++
		case errors.Is(err, context.DeadlineExceeded):
			waited++
		default:
			t.Errorf("session %d: Lock of a held name: got %v; want an error wrapping 1040 or ctx's", i+1, err)
		}
	}
	t.Logf("of %d Locks: %d refused a connection (1040), %d waited %v", sessions, refused, waited, wait)
	// The fault: the server refused connections.
	if refused == 0 {
		t.Fatalf("Locks that got 1040: got 0; want some (the server did not run out of connections)")
	}
	for i, s := range ss {
		if err := s.Err(); err != nil {
			t.Errorf("session %d after %v of waiters wanting more connections than the server allows: Err %v; want nil", i, wait, err)
		}
	}
}

package dsync_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// Budgets of TestWaitersDoNotSpinOnFaults, as docs/DESIGN.md's section on
// waiting states them: a waiter that cannot block on a doorbell sends at
// most 20 statements a second (it polls with a pace from 100ms up to a
// second, paceFloor and paceCap),
// and takes a lock within that second once the lock is free.
const (
	spinBudget = 20.0                    // statements per second per waiter, keep-alives included
	takeBound  = 1500 * time.Millisecond // the poll cap (1s) and the noise of a busy 2-core machine
)

// spinWaiters are waiters of one lock in sessions of their own, each on a
// *sql.DB of its own; each takes the lock once and lets it go.
type spinWaiters struct {
	first chan time.Time // when the first of them took the lock
	errs  chan error     // one per waiter
	n     int
}

// startSpinWaiters starts n waiters of the Mutex name on dsn, with TTL ttl,
// and returns once each has begun to wait.
func startSpinWaiters(t *testing.T, dsn, name string, n int, ttl time.Duration) *spinWaiters {
	return startSpinWaitersOf(t, mutexOps, dsn, name, n, ttl)
}

// startSpinWaitersOf is startSpinWaiters for the lock that ops makes.
func startSpinWaitersOf(t *testing.T, ops func(*dsync.Session, string) (lock, unlock func(context.Context) error), dsn, name string, n int, ttl time.Duration) *spinWaiters {
	t.Helper()
	w := &spinWaiters{first: make(chan time.Time, 1), errs: make(chan error, n), n: n}
	var once sync.Once
	for range n {
		s, err := dsync.NewSession(context.Background(), dbtest.OpenDSN(t, dsn), dsync.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		lock, unlock := ops(s, name)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := lock(ctx)
			if err == nil {
				once.Do(func() { w.first <- time.Now() })
				time.Sleep(time.Millisecond)
				err = unlock(ctx)
			}
			w.errs <- err
		}()
	}
	time.Sleep(500 * time.Millisecond) // they settle on the doorbells
	return w
}

// wait waits for every waiter and fails the test for each error.
func (w *spinWaiters) wait(t *testing.T) {
	t.Helper()
	for range w.n {
		if err := <-w.errs; err != nil {
			t.Errorf("waiter: %v", err)
		}
	}
}

// firstTaken returns when the first waiter took the lock, failing the test
// when none did within limit.
func (w *spinWaiters) firstTaken(t *testing.T, limit time.Duration) time.Time {
	t.Helper()
	select {
	case at := <-w.first:
		return at
	case <-time.After(limit):
		t.Fatalf("no waiter took the lock within %v", limit)
		return time.Time{}
	}
}

// takenWithin fails the test unless a waiter took the lock within
// takeBound of freed, when the lock fell free (or was made free); what
// says how.
func (w *spinWaiters) takenWithin(t *testing.T, freed time.Time, what string) {
	t.Helper()
	took := w.firstTaken(t, 10*time.Second).Sub(freed)
	t.Logf("taken %v after %s", took.Round(time.Millisecond), what)
	if took > takeBound {
		t.Errorf("taken %v after %s; want within %v", took.Round(time.Millisecond), what, takeBound)
	}
}

// serverQuestions returns the count of statements the server of db has
// received.
func serverQuestions(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	return globalStatus(t, db, "Questions")
}

// globalStatus returns the server's counter called variable (SHOW GLOBAL
// STATUS; SHOW takes no placeholder, and variable is a constant of the
// tests), read through db.
func globalStatus(t *testing.T, db *sql.DB, variable string) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE '"+variable+"'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkRate fails the test when the statements the server received since
// q0, at from, exceed spinBudget per waiter and second.
func checkRate(t *testing.T, db *sql.DB, q0 int64, from time.Time, waiters int) {
	t.Helper()
	n := serverQuestions(t, db) - q0 - 1
	d := time.Since(from)
	rate := float64(n) / float64(waiters) / d.Seconds()
	t.Logf("%d statements in %v: %.1f/s per waiter", n, d.Round(time.Millisecond), rate)
	if rate > spinBudget {
		t.Errorf("statements per waiter: got %.1f/s; want at most %.0f/s", rate, spinBudget)
	}
}

// checkRateFor waits d and then checks the statements of that time as
// checkRate does.
func checkRateFor(t *testing.T, db *sql.DB, d time.Duration, waiters int) {
	t.Helper()
	q0, from := serverQuestions(t, db), time.Now()
	time.Sleep(d)
	checkRate(t, db, q0, from, waiters)
}

// lockInBackground takes the lock with m in a goroutine (failing the test
// when that fails within 20s) and lets it go again; the channel tells when
// it took it.
func lockInBackground(t *testing.T, m *dsync.Mutex) <-chan time.Time {
	got := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := m.Lock(ctx); err != nil {
			t.Error(err)
			got <- time.Time{}
			return
		}
		at := time.Now()
		if err := m.Unlock(ctx); err != nil {
			t.Error(err)
		}
		got <- at
	}()
	return got
}

// bellOf returns the server's id of the connection holding the current
// doorbell of the session with lease id, or 0 when none does.
func bellOf(t *testing.T, db *sql.DB, id int64) int64 {
	t.Helper()
	var conn sql.NullInt64
	if err := db.QueryRow("SELECT IS_USED_LOCK(CONCAT('dsync:', LOWER(HEX(id)), ':', LOWER(HEX(bell)))) FROM dsync_lease WHERE id = ?", id).Scan(&conn); err != nil {
		t.Fatal(err)
	}
	return conn.Int64
}

// awaitBellOf waits until the session with lease id holds a doorbell and
// returns its connection.
func awaitBellOf(t *testing.T, db *sql.DB, id int64) int64 {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if c := bellOf(t, db, id); c != 0 {
			return c
		}
		if time.Now().After(end) {
			t.Fatalf("session %d has no doorbell after 5s", id)
		}
	}
}

// killConn kills the server's connection conn (KILL CONNECTION) and
// waits until it has gone (awaitGone): the fault of a connection cut on
// the server's side.
func killConn(t *testing.T, db *sql.DB, conn int64) {
	t.Helper()
	if _, err := db.Exec("KILL CONNECTION " + strconv.FormatInt(conn, 10)); err != nil {
		t.Fatal(err)
	}
	awaitGone(t, db, conn)
}

// awaitGone waits until the server's connection conn has gone.
func awaitGone(t *testing.T, db *sql.DB, conn int64) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var left int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", conn).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("connection %d still there after 5s", conn)
		}
	}
}

// TestWaitersDoNotSpinOnFaults runs, with 8 waiting sessions each, every
// fault after which a waiter used to find its doorbell free at once while
// nothing had changed (and retried at once, thousands of statements a
// second), or never rung: a dead holder, a holder's doorbell connection
// killed, a dead claimant, a LockTx hold whose session ended, ForceRelease
// and a server restart. It checks that each waiter stays within the
// polling budget (spinBudget) through the fault, and that the lock is taken
// within takeBound once it is free. It runs on a server of its own, which
// it restarts.
func TestWaitersDoNotSpinOnFaults(t *testing.T) {
	slowTest(t) // about 18 s of faults and waiting
	const (
		waiters = 8
		short   = 2 * time.Second  // TTL of the sessions that die
		long    = 10 * time.Second // TTL of the others: longer than a restart, and than a doorbell wait of a few seconds
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := mariadb.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	if _, err := dbtest.OpenDSN(t, srv.DSN("")).ExecContext(ctx, "CREATE DATABASE spin_test"); err != nil {
		t.Fatal(err)
	}
	dsn := srv.DSN("spin_test")
	db := dbtest.OpenDSN(t, dsn)
	session := func(t *testing.T, ttl time.Duration) *dsync.Session {
		s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, dsn), dsync.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	held := func(t *testing.T, name string) int64 {
		var holder int64
		if err := db.QueryRow("SELECT holder FROM dsync_lock WHERE name = ?", name).Scan(&holder); err != nil {
			t.Fatal(err)
		}
		return holder
	}
	// hold takes the Mutex name in a session (TTL long) that has its
	// doorbell.
	hold := func(t *testing.T, name string) (*dsync.Session, *dsync.Mutex) {
		h := session(t, long)
		m := dsync.NewMutex(h, name)
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		awaitBellOf(t, db, h.ID())
		return h, m
	}
	unlock := func(t *testing.T, m *dsync.Mutex) time.Time {
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}

	for _, kind := range []struct {
		name, child string
		ops         func(*dsync.Session, string) (lock, unlock func(context.Context) error)
		holder      string // how to read the holder's lease id
	}{
		{"Mutex", "", mutexOps, "SELECT holder FROM dsync_lock WHERE name = ?"},
		{"FairMutex", "fair", fairOps, "SELECT holder FROM dsync_queue WHERE name = ?"},
	} {
		t.Run("dead holder/"+kind.name, func(t *testing.T) {
			name := lockName(t)
			holder := startChild(t, childConfig{Role: "hold", DSN: dsn, Name: name, TTL: short, Kind: kind.child})
			expectLine(t, holder.out, "locked")
			var id int64
			if err := db.QueryRow(kind.holder, name).Scan(&id); err != nil {
				t.Fatal(err)
			}
			conn := awaitBellOf(t, db, id)
			w := startSpinWaitersOf(t, kind.ops, dsn, name, waiters, long)
			q0, from := serverQuestions(t, db), time.Now()
			if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			awaitGone(t, db, conn)
			var lease int
			if err := db.QueryRow("SELECT COUNT(*) FROM dsync_lease WHERE id = ? AND expires_at > UTC_TIMESTAMP(6)", id).Scan(&lease); err != nil || lease != 1 {
				t.Fatalf("the dead holder's live leases: got %d (%v); want 1 (its lease lives on)", lease, err)
			}
			first := w.firstTaken(t, short+takeBound)
			checkRate(t, db, q0, from, waiters)
			w.wait(t)
			t.Logf("taken %v after the kill (TTL %v)", first.Sub(from).Round(time.Millisecond), short)
		})
	}

	t.Run("doorbell connection killed", func(t *testing.T) {
		name := lockName(t)
		h, m := hold(t, name)
		conn := bellOf(t, db, h.ID())
		w := startSpinWaiters(t, dsn, name, waiters, long)
		q0, from := serverQuestions(t, db), time.Now()
		killConn(t, db, conn)
		time.Sleep(2 * time.Second)
		checkRate(t, db, q0, from, waiters)
		w.takenWithin(t, unlock(t, m), "the Unlock")
		w.wait(t)
	})

	t.Run("dead claimant", func(t *testing.T) {
		name := lockName(t)
		_, m := hold(t, name)
		claimant := startChild(t, childConfig{Role: "wait", DSN: dsn, Name: name, TTL: short})
		line, err := claimant.out.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		cid, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		if err != nil {
			t.Fatalf("claimant said %q", line)
		}
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var waiter int64
			if err := db.QueryRow("SELECT waiter FROM dsync_lock WHERE name = ? AND claimed_until > UTC_TIMESTAMP(6)", name).Scan(&waiter); err != nil && err != sql.ErrNoRows {
				t.Fatal(err)
			}
			if waiter == cid && bellOf(t, db, cid) != 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatal("the claimant never claimed the next hold")
			}
		}
		conn := bellOf(t, db, cid)
		w := startSpinWaiters(t, dsn, name, waiters, long)
		if err := claimant.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		awaitGone(t, db, conn)
		killed := time.Now()
		q0, from := serverQuestions(t, db), time.Now()
		unlock(t, m)
		first := w.firstTaken(t, short+takeBound)
		checkRate(t, db, q0, from, waiters)
		if took := first.Sub(killed); took > short+takeBound {
			t.Errorf("taken %v after the claimant died; want within its TTL and %v", took, takeBound)
		}
		w.wait(t)
	})

	t.Run("LockTx outliving its session", func(t *testing.T) {
		name := lockName(t)
		h := session(t, long)
		tx, err := dbtest.OpenDSN(t, dsn).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := dsync.NewMutex(h, name).LockTx(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		var leases int
		if err := db.QueryRow("SELECT COUNT(*) FROM dsync_lease WHERE id = ?", h.ID()).Scan(&leases); err != nil || leases != 0 {
			t.Fatalf("lease rows of the closed session: got %d (%v); want 0", leases, err)
		}
		w := startSpinWaiters(t, dsn, name, waiters, long)
		checkRateFor(t, db, 2*time.Second, waiters)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		w.takenWithin(t, time.Now(), "the commit")
		w.wait(t)
	})

	t.Run("ForceRelease", func(t *testing.T) {
		name := lockName(t)
		hold(t, name)
		w := startSpinWaiters(t, dsn, name, waiters, long)
		checkRateFor(t, db, time.Second, waiters)
		called := time.Now()
		if freed, err := dsync.ForceRelease(ctx, db, "dsync_", name); !freed || err != nil {
			t.Fatalf("ForceRelease: got %v, %v; want true, nil", freed, err)
		}
		w.takenWithin(t, called, "ForceRelease was called")
		w.wait(t)
	})

	t.Run("server restart", func(t *testing.T) {
		name := lockName(t)
		h, m := hold(t, name)
		w := startSpinWaiters(t, dsn, name, waiters, long)
		srv.Kill()
		if err := srv.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if got := held(t, name); got != h.ID() {
			t.Fatalf("holder after the restart: got %d; want %d", got, h.ID())
		}
		checkRateFor(t, db, 2*time.Second, waiters)
		if err := h.Err(); err != nil {
			t.Fatalf("holder's session: %v", err)
		}
		w.takenWithin(t, unlock(t, m), "the Unlock")
		w.wait(t)
	})
}

// TestWaiterBlocksBrieflyWhenNotWanted: a waiter whose qLockWant meets the
// lock row locked (three no-wait tries) has not written wanted_until, so
// the holder's release does not ring; it must not sleep through the free
// lock until its doorbell wait ends (8 s), but take it within the poll
// cap.
func TestWaiterBlocksBrieflyWhenNotWanted(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	name := lockName(t)
	db := dbtest.Open(t)
	h := newSession(t, dsync.WithTTL(10*time.Second))
	holder := dsync.NewMutex(h, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitBellOf(t, db, h.ID())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT holder FROM dsync_lock WHERE name = ? FOR UPDATE", name); err != nil {
		t.Fatal(err)
	}
	got := lockInBackground(t, dsync.NewMutex(newSession(t, dsync.WithTTL(10*time.Second)), name))
	awaitStatement(t, db, "SELECT IF(GET_LOCK(%", 5*time.Second, "the waiter never blocked on the holder's doorbell")
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var wanted bool
	if err := db.QueryRow("SELECT wanted_until > UTC_TIMESTAMP(6) FROM dsync_lock WHERE name = ?", name).Scan(&wanted); err != nil {
		t.Fatal(err)
	}
	if wanted {
		t.Fatal("wanted_until is current: the waiter's qLockWant landed; want it to have met the row locked")
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	at := <-got
	if took := at.Sub(freed); took > takeBound {
		t.Errorf("taken %v after the release that did not ring; want within %v", took.Round(time.Millisecond), takeBound)
	}
}

// TestClaimantGivingUpRings: a waiter blocked on the doorbell of a claimant
// (no live holder, the claim current) is woken when that claimant gives
// up, also when its claim was taken over meanwhile (by an older waiter,
// which took the lock and let it go), so that it does not sleep through
// the free lock until its doorbell wait ends.
func TestClaimantGivingUpRings(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	db := dbtest.Open(t)
	opt := dsync.WithTTL(10 * time.Second)
	h, a, o := newSession(t, opt), newSession(t, opt), newSession(t, opt)
	if err := dsync.NewMutex(h, name).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitBellOf(t, db, h.ID())
	actx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	aDone := make(chan error, 1)
	go func() { aDone <- dsync.NewMutex(a, name).Lock(actx) }()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiter int64
		if err := db.QueryRow("SELECT waiter FROM dsync_lock WHERE name = ?", name).Scan(&waiter); err != nil {
			t.Fatal(err)
		}
		if waiter == a.ID() && bellOf(t, db, a.ID()) != 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the first waiter never claimed the next hold")
		}
	}
	// The holder's hold ends without a ring (as if its lease had ended):
	// the claimant, blocked on the holder's doorbell, does not notice.
	if _, err := db.Exec("UPDATE dsync_lock SET holder = 0, token = 0 WHERE name = ?", name); err != nil {
		t.Fatal(err)
	}
	got := lockInBackground(t, dsync.NewMutex(newSession(t, opt), name))
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var blocked int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IF(GET_LOCK(%' AND STATE = 'User lock'").Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked >= 2 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the second waiter never blocked on the claimant's doorbell")
		}
	}
	// An older waiter takes the claim over, takes the lock and lets it go.
	if _, err := db.Exec("UPDATE dsync_lock SET waiter = ?, claimed_until = UTC_TIMESTAMP(6) + INTERVAL 10 SECOND, waiter_since = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE name = ?", o.ID(), name); err != nil {
		t.Fatal(err)
	}
	older := dsync.NewMutex(o, name)
	if ok, err := older.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock of the older waiter: got %v, %v; want true, nil", ok, err)
	}
	if err := older.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	giveUp()
	if err := <-aDone; err == nil {
		t.Fatal("the claimant's Lock: got nil; want its ctx's error")
	}
	freed := time.Now()
	at := <-got
	if took := at.Sub(freed); took > takeBound {
		t.Errorf("taken %v after the claimant gave up; want within %v", took.Round(time.Millisecond), takeBound)
	}
}

package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// awaitStatement waits until a statement whose text is LIKE pattern is
// running on the server, as seen in the process list (InnoDB's INNODB_TRX
// does not always show its query or LOCK WAIT state), and fails the test
// with failure when none is within limit.
func awaitStatement(t *testing.T, db *sql.DB, pattern string, limit time.Duration, failure string) {
	t.Helper()
	for end := time.Now().Add(limit); ; time.Sleep(time.Millisecond) {
		var running int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?", pattern).Scan(&running); err != nil {
			t.Fatal(err)
		}
		if running > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatal(failure)
		}
	}
}

// questions returns the server's count of statements received so far.
func questions(t *testing.T) int64 {
	t.Helper()
	var name string
	var n int64
	if err := dbtest.Open(t).QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitKinds are the lock kinds whose waiters block on doorbells: a holder
// and its waiters in other sessions, each made from a session and a name.
var waitKinds = []struct {
	name           string
	holder, waiter func(*dsync.Session, string) (lock, unlock func(context.Context) error)
}{
	{"Mutex", mutexOps, mutexOps},
	{"FairMutex", fairOps, fairOps},
	{"RWMutex writer, readers waiting", writerOps, readerOps},
	{"RWMutex reader, writers waiting", readerOps, writerOps},
	{"Semaphore", semOps, semOps},
}

// semOps are the acquisition and release of the one permit of a Semaphore
// of limit 1.
func semOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewSemaphore(s, name, 1)
	return func(ctx context.Context) error { return m.Acquire(ctx, 1) },
		func(ctx context.Context) error { return m.Release(ctx, 1) }
}

func mutexOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewMutex(s, name)
	return m.Lock, m.Unlock
}

func fairOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewFairMutex(s, name)
	return m.Lock, m.Unlock
}

func writerOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewRWMutex(s, name)
	return m.Lock, m.Unlock
}

func readerOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewRWMutex(s, name)
	return m.RLock, m.RUnlock
}

// TestWaiterDoesNotPoll checks that waiters in other sessions block on the
// holder's doorbell instead of polling: while one session holds the lock
// for 2 s, 4 waiting sessions send fewer than one statement a second each
// (beyond what as many sessions send idle, measured once for all kinds),
// and each gets the lock once it is released.
func TestWaiterDoesNotPoll(t *testing.T) {
	slowTest(t)
	const waiters, hold = 4, 2 * time.Second
	idle := idleStatements(t, waiters+1, hold)
	for _, kind := range waitKinds {
		t.Run(kind.name, func(t *testing.T) {
			name := lockName(t)
			ctx := context.Background()
			lock, unlock := kind.holder(newSession(t), name)
			var sessions []*dsync.Session
			for range waiters {
				sessions = append(sessions, sessionOn(t, dbtest.Open(t)))
			}
			if err := lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := make(chan error, waiters)
			for _, s := range sessions {
				wlock, wunlock := kind.waiter(s, name)
				go func() {
					err := wlock(ctx)
					if err == nil {
						err = wunlock(ctx)
					}
					got <- err
				}()
			}
			time.Sleep(time.Second) // the waiters settle on the doorbells
			q := questions(t)
			time.Sleep(hold)
			waiting := questions(t) - q - 1 // less the first questions call's own statement
			perWaiter := float64(waiting-idle) / waiters / hold.Seconds()
			t.Logf("statements in %v: %d idle, %d with %d waiters (%.2f/s per waiter)", hold, idle, waiting, waiters, perWaiter)
			if perWaiter >= 1 {
				t.Errorf("got %.2f statements/s per waiting session; want fewer than 1", perWaiter)
			}
			if err := unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for range waiters {
				if err := <-got; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// idleStatements returns how many statements the server answers in d
// while n new sessions (each on its own *sql.DB) only keep their leases,
// the baseline of TestWaiterDoesNotPoll. The sessions are closed before it
// returns. (No purge falls in a counted window: see TestMain.)
func idleStatements(t *testing.T, n int, d time.Duration) int64 {
	t.Helper()
	var sessions []*dsync.Session
	for range n {
		s, err := dsync.NewSession(context.Background(), dbtest.Open(t))
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	q := questions(t)
	time.Sleep(d)
	idle := questions(t) - q - 1 // less the first questions call's own statement
	for _, s := range sessions {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return idle
}

// TestMutexClaimDroppedWhenWaiterGivesUp checks that a waiter that claimed
// the next hold and then gave up (its ctx ended) lets others take the lock
// at once, and so does a waiter whose session ended.
func TestMutexClaimDroppedWhenWaiterGivesUp(t *testing.T) {
	for _, how := range []string{"ctx", "close"} {
		t.Run(how, func(t *testing.T) {
			name := lockName(t)
			ctx := context.Background()
			a := dsync.NewMutex(newSession(t), name)
			ws, err := dsync.NewSession(ctx, dbtest.Open(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			c := dsync.NewMutex(newSession(t), name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			waited := make(chan error, 1)
			go func() { waited <- dsync.NewMutex(ws, name).Lock(wctx) }()
			// The waiter claims the next hold: c cannot take the row even
			// when it is free, until the waiter gives up.
			time.Sleep(300 * time.Millisecond)
			switch how {
			case "ctx":
				cancel()
				if err := <-waited; !errors.Is(err, context.Canceled) {
					t.Fatalf("waiter: got %v; want context.Canceled", err)
				}
			case "close":
				ws.Close()
				if err := <-waited; !errors.Is(err, dsync.ErrSessionClosed) {
					t.Fatalf("waiter: got %v; want ErrSessionClosed", err)
				}
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			ok, err := c.TryLock(ctx)
			if err != nil || !ok {
				t.Fatalf("TryLock after the waiter gave up: got %v, %v; want true, nil", ok, err)
			}
			if err := c.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMutexClaimantTakesNext checks the claim that keeps a waiter of
// another session from being overtaken: once a waiter has claimed the next
// hold, the releasing session cannot take the lock back before it.
func TestMutexClaimantTakesNext(t *testing.T) {
	name := lockName(t)
	ctx := context.Background()
	a := dsync.NewMutex(newSession(t), name)
	b := dsync.NewMutex(newSession(t), name)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx) }()
	time.Sleep(300 * time.Millisecond) // b waits, and claims
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ok, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		// a took the row before b's claim could count: not allowed.
		t.Fatal("the releasing session took the lock back before the waiter that claimed it")
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// wakeBound is how soon a waiter must get a lock freed by a path other
// than a plain release for the test to count it as woken, not as a waiter
// that gave up on a doorbell that never rang (bellWait, 8 s) and tried
// again: far above a wake-up (milliseconds), far below bellWait.
const wakeBound = 3 * time.Second

// TestDoorbellRungByEveryRelease checks the paths that free a lock others
// wait for other than a plain Unlock: each must ring, so the waiter gets
// the lock at once rather than after its doorbell wait times out.
func TestDoorbellRungByEveryRelease(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	t.Run("Mutex Unlock with ctx ended (the reaper frees the row)", func(t *testing.T) {
		name := lockName(t)
		a := dsync.NewMutex(newSession(t), name)
		b := dsync.NewMutex(newSession(t), name)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- b.Lock(ctx) }()
		time.Sleep(500 * time.Millisecond) // b blocks on a's doorbell
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if err := a.Unlock(ended); !errors.Is(err, context.Canceled) {
			t.Fatalf("Unlock with an ended ctx: got %v; want context.Canceled", err)
		}
		freed := time.Now()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if took := time.Since(freed); took > wakeBound {
			t.Errorf("waiter got the lock %v after the release; want within %v", took, wakeBound)
		}
		b.Unlock(ctx)
	})
	t.Run("FairMutex waiter ahead gives up", func(t *testing.T) {
		name := lockName(t)
		a := dsync.NewFairMutex(newSession(t), name)
		b := dsync.NewFairMutex(newSession(t), name)
		c := dsync.NewFairMutex(newSession(t), name)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		bctx, bcancel := context.WithCancel(ctx)
		bgot := make(chan error, 1)
		go func() { bgot <- b.Lock(bctx) }()
		time.Sleep(300 * time.Millisecond)
		cgot := make(chan error, 1)
		go func() { cgot <- c.Lock(ctx) }()
		time.Sleep(300 * time.Millisecond) // c blocks on b's doorbell
		bcancel()
		if err := <-bgot; !errors.Is(err, context.Canceled) {
			t.Fatalf("b: got %v; want context.Canceled", err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		freed := time.Now()
		if err := <-cgot; err != nil {
			t.Fatal(err)
		}
		if took := time.Since(freed); took > wakeBound {
			t.Errorf("c got the lock %v after a's Unlock; want within %v", took, wakeBound)
		}
		c.Unlock(ctx)
	})
}

// TestTicketReleaseFindsMarkerBeingWritten plays the race between a
// waiter leaving its marker behind a ticket (which locks the ticket, then
// inserts the marker) and the ticket's release: the release waits for the
// ticket's row lock, and must then delete the marker too (and ring).
func TestTicketReleaseFindsMarkerBeingWritten(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	s := newSession(t)
	m := dsync.NewFairMutex(s, name)
	lockQueued(t, m) // a hold with a ticket, not the head slot
	db := dbtest.Open(t)
	var ticket int64
	if err := db.QueryRow("SELECT seq FROM dsync_ticket WHERE name = ? AND holder = ?", name, s.ID()).Scan(&ticket); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT seq FROM dsync_ticket WHERE name = ? AND seq = ? FOR UPDATE", name, ticket); err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- m.Unlock(ctx) }()
	awaitStatement(t, db, "DELETE FROM %dsync_ticket%WHERE name%", 5*time.Second, "the release never waited for the ticket's row lock")
	const markerBase = 1 << 62
	// The marker as qTicketWant writes it: its token names the session
	// whose ticket it waits behind.
	if _, err := tx.Exec("INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, 0, ?, 0)", name, ticket+markerBase, s.ID()); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	var left int
	if err := db.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ?", name).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("rows of the name after the release: got %d; want 0 (the marker written during it deleted too)", left)
	}
}

// TestLockOnRowHeldByItselfDoesNotSpin: a row held by the waiting session
// itself under a token it no longer knows (an acquisition that landed after
// it was given up, until the reaper frees it) has no doorbell to wait on;
// Lock polls it instead of retrying without pause.
func TestLockOnRowHeldByItselfDoesNotSpin(t *testing.T) {
	slowTest(t)
	s := newSession(t)
	name := lockName(t)
	ctx := context.Background()
	warm := dsync.NewMutex(s, name+"/warm")
	if err := warm.Lock(ctx); err != nil { // arms the session's doorbell
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	db := dbtest.Open(t)
	if _, err := db.Exec("INSERT INTO dsync_lock (name, holder, token, fence) VALUES (?, ?, 999999, 1)", name, s.ID()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	q := questions(t)
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := dsync.NewMutex(s, name).Lock(lctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a row the session holds under an unknown token: got %v; want context.DeadlineExceeded", err)
	}
	n := questions(t) - q
	t.Logf("statements in 1s: %d", n)
	if n > 100 {
		t.Errorf("statements while waiting 1s: got %d; want at most 100 (polling with back-off, not a busy loop)", n)
	}
}

// doorbellConn returns the server's id of the connection that holds
// session s's current doorbell, read from its lease row, or 0 when none
// does.
func doorbellConn(t *testing.T, db *sql.DB, s *dsync.Session) int64 {
	t.Helper()
	var gen int64
	if err := db.QueryRow("SELECT bell FROM dsync_lease WHERE id = ?", s.ID()).Scan(&gen); err != nil {
		t.Fatal(err)
	}
	var conn sql.NullInt64
	if err := db.QueryRow("SELECT IS_USED_LOCK(?)", fmt.Sprintf("dsync:%x:%x", s.ID(), gen)).Scan(&conn); err != nil {
		t.Fatal(err)
	}
	return conn.Int64
}

// TestUnlockAfterDoorbellConnectionKilled checks that a release, which
// rings the doorbell in its own statement on the doorbell's connection,
// still succeeds when the server has dropped that connection while it was
// idle (wait_timeout, KILL), and that the waiter then gets the lock.
func TestUnlockAfterDoorbellConnectionKilled(t *testing.T) {
	name := lockName(t)
	ctx := context.Background()
	db := dbtest.Open(t)
	a, b := newSession(t), newSession(t)
	holder, waiter := dsync.NewMutex(a, name), dsync.NewMutex(b, name)
	for round := range 3 {
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := waiter.Lock(wctx)
			if err == nil {
				err = waiter.Unlock(ctx)
			}
			got <- err
		}()
		awaitStatement(t, db, "SELECT IF(GET_LOCK(%", 5*time.Second, "the waiter never blocked on the holder's doorbell")
		conn := doorbellConn(t, db, a)
		if conn == 0 {
			t.Fatalf("round %d: no connection holds the holder's doorbell", round)
		}
		killConn(t, db, conn) // the fault happened: the doorbell is free, its connection gone
		if err := holder.Unlock(ctx); err != nil {
			t.Fatalf("round %d: Unlock after the doorbell's connection was killed: %v", round, err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: waiter: %v", round, err)
		}
	}
}

// TestReleaseRingWithBinaryLog checks that with the server's binary log on,
// a release that rings its doorbell in its own statement is logged as rows:
// a replica must never run its GET_LOCK, and keep the lock it takes. (The
// server refuses STATEMENT format for dsync's READ COMMITTED connections.)
// The handoffs between two sessions happen all the same.
func TestReleaseRingWithBinaryLog(t *testing.T) {
	slowTest(t)
	for _, format := range []string{"MIXED", "ROW"} {
		t.Run(format, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			dstStart.Lock() // see dstStart
			srv, err := mariadb.StartWith(ctx, mariadb.Config{Args: []string{"--log-bin=binlog", "--server-id=1", "--binlog-format=" + format}})
			dstStart.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Stop() })
			admin := dbtest.OpenDSN(t, srv.DSN(""))
			if _, err := admin.ExecContext(ctx, "CREATE DATABASE bl"); err != nil {
				t.Fatal(err)
			}
			db := dbtest.OpenDSN(t, srv.DSN("bl"))
			name := lockName(t)
			a, b := sessionOn(t, db), sessionOn(t, dbtest.OpenDSN(t, srv.DSN("bl")))
			holder, waiter := dsync.NewMutex(a, name), dsync.NewMutex(b, name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			const handoffs = 6
			for i := range handoffs {
				got := make(chan error, 1)
				go func() { got <- waiter.Lock(ctx) }()
				awaitStatement(t, admin, "SELECT IF(GET_LOCK(%", 10*time.Second, "the waiter never blocked on the holder's doorbell")
				if err := holder.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("handoff %d: %v", i, err)
				}
				holder, waiter = waiter, holder
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			rows, err := admin.QueryContext(ctx, "SHOW BINLOG EVENTS IN 'binlog.000001'")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			cols, _ := rows.Columns()
			var events, rang int
			for rows.Next() {
				vals := make([]sql.RawBytes, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				// Log_name, Pos, Event_type, Server_id, End_log_pos, Info.
				// Annotate_rows events only show the statement that made
				// the row events after them; replicas do not run them.
				kind, info := string(vals[2]), string(vals[len(vals)-1])
				if kind == "Annotate_rows" && strings.Contains(info, "GET_LOCK") {
					rang++ // a release that rang in its own statement
				}
				if kind != "Query" {
					continue
				}
				if strings.Contains(strings.ToUpper(info), "GET_LOCK") {
					t.Errorf("binary log event %s: %s", kind, info)
				}
				events++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if events == 0 {
				t.Error("no Query events in the binary log: is it on?")
			}
			if rang == 0 {
				t.Errorf("no release rang in its own statement in %d handoffs", handoffs)
			}
		})
	}
}

// TestUnlockWithEndedCtxKeepsDoorbell checks that an Unlock whose ctx has
// ended (a deferred Unlock after a deadline) leaves the session's doorbell
// alone: its connection is not dropped, and the waiters blocked on it for
// another lock of the session are not woken for nothing.
func TestUnlockWithEndedCtxKeepsDoorbell(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	a, b := newSession(t), newSession(t)
	name := lockName(t)
	waited, other := dsync.NewMutex(a, name), dsync.NewMutex(a, name+"/other")
	if err := waited.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		w := dsync.NewMutex(b, name)
		err := w.Lock(ctx)
		if err == nil {
			err = w.Unlock(ctx)
		}
		got <- err
	}()
	awaitStatement(t, db, "SELECT IF(GET_LOCK(%", 5*time.Second, "the waiter never blocked on the holder's doorbell")
	before := doorbellConn(t, db, a)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := other.Unlock(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock with an ended ctx: got %v; want an error wrapping context.Canceled", err)
	}
	time.Sleep(100 * time.Millisecond)
	if after := doorbellConn(t, db, a); after != before || before == 0 {
		t.Fatalf("connection holding the doorbell: got %d after the Unlock, %d before; want the same", after, before)
	}
	awaitStatement(t, db, "SELECT IF(GET_LOCK(%", time.Second, "the waiter is no longer blocked on the doorbell")
	if err := waited.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestShortLeaseWaitKeepsNoConnection: a waiter whose holder's lease has
// less than a second left sleeps it out without a statement (MySQL's
// GET_LOCK takes whole seconds). At the shortest TTL every wait is such a
// wait; once the waiter has the lock, none of its doorbell-wait
// connections may still count as in use (each one kept would be a server
// connection open for the session's life, and after 8 the session's
// waiters could no longer block on a doorbell).
func TestShortLeaseWaitKeepsNoConnection(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	holder := newSession(t, dsync.WithTTL(time.Second))
	waiter := newSession(t)
	name := lockName(t)
	mh, mw := dsync.NewMutex(holder, name), dsync.NewMutex(waiter, name)
	if err := mh.Lock(ctx); err != nil {
		t.Fatalf("holder Lock: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		got <- mw.Lock(lctx)
	}()
	time.Sleep(2500 * time.Millisecond) // two or three waits on the holder's doorbell
	if err := mh.Unlock(ctx); err != nil {
		t.Fatalf("holder Unlock: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter Lock: %v", err)
	}
	if n := dsync.BellWaitConnsInUse(waiter); n != 0 {
		t.Errorf("doorbell-wait connections in use after the wait: got %d; want 0", n)
	}
	if err := mw.Unlock(ctx); err != nil {
		t.Fatalf("waiter Unlock: %v", err)
	}
}

// TestStatementDeadlineKeepsDoorbell: a lock statement of a holder's
// session that runs on its doorbell's connection, and whose caller's
// deadline ends while it runs, leaves the doorbell alone: its connection
// is not dropped (which woke every waiter of the session's locks for
// nothing, and on a capped pool could cost the doorbell its slot). An
// Unlock behind a transaction that holds the lock row, with a deadline
// that ends during the release on the doorbell's connection: the release
// that rings in its own statement (it waits a second for the row lock),
// or, after that, the plain release lent the connection. It first checks
// that the statement ran there when the deadline passed.
func TestStatementDeadlineKeepsDoorbell(t *testing.T) {
	slowTest(t)
	for _, tc := range []struct {
		what     string
		deadline time.Duration
		pattern  string
	}{
		{"ringing release", 300 * time.Millisecond, "%LAST_INSERT_ID(IF(wanted_until%"},
		{"lent release", 1500 * time.Millisecond, "%LAST_INSERT_ID(wanted_until >%"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx := context.Background()
			db := dbtest.Open(t)
			a := newSession(t)
			m := dsync.NewMutex(a, lockName(t))
			mustLock(t, m, ctx)
			bell := awaitBellOf(t, db, a.ID())
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if _, err := tx.Exec("SELECT name FROM dsync_lock WHERE name = ? FOR UPDATE", m.Name()); err != nil {
				t.Fatal(err)
			}
			uctx, cancel := context.WithTimeout(ctx, tc.deadline)
			defer cancel()
			got := make(chan error, 1)
			go func() { got <- m.Unlock(uctx) }()
			<-uctx.Done()
			time.Sleep(50 * time.Millisecond)
			var running int
			if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE ?", bell, tc.pattern).Scan(&running); err != nil {
				t.Fatal(err)
			}
			if running == 0 {
				t.Fatalf("the fault did not happen: no release on the doorbell's connection %d when the deadline passed", bell)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := <-got; !errors.Is(err, context.DeadlineExceeded) && err != nil {
				t.Errorf("Unlock: got %v; want nil or an error wrapping context.DeadlineExceeded", err)
			}
			for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if after := doorbellConn(t, db, a); after != bell {
					t.Fatalf("connection holding the doorbell: got %d after the Unlock, %d before; want the same", after, bell)
				}
			}
		})
	}
}

// TestDeadHolderTakenAtLeaseEnd: a holder whose connections all close at
// once (its process died) frees its doorbell with them, and its waiter,
// which has nothing left to block on, paces its polls; a paced poll lands
// just after the dead lease's end, not up to a pace's cap (a second)
// later. The connections close (the holder's fault proxy is closed) when
// the holder's lease has 1.6s left, so that the waiter's paces (100ms,
// doubling to 1s: polls 0.1, 0.3, 0.7, 1.5 and 2.5s after the close) put
// the unbounded poll 0.9s after the lease's end. The waiter takes the lock
// after the lease's end, by the server's clock (held_since against
// expires_at; for a queued lock's ticket, the start of its hold as
// ListLocks reads it), within 600ms of it, sending no more statements than a
// polling waiter's budget (spinBudget) meanwhile.
func TestDeadHolderTakenAtLeaseEnd(t *testing.T) {
	slowTest(t)
	const ttl = 2 * time.Second
	const cutLeft = 1600 * time.Millisecond // the lease time left when the connections close
	const lateBound = 600 * time.Millisecond
	admin := dbtest.Open(t)
	for _, kind := range []struct {
		name string
		ops  func(*dsync.Session, string) (lock, unlock func(context.Context) error)
	}{{"Mutex", mutexOps}, {"FairMutex", fairOps}, {"Semaphore", semOps}} {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			name := lockName(t)
			p, dsn := dbtest.FaultProxy(t)
			h := faultSession(t, dbtest.OpenDSN(t, dsn), ttl)
			hlock, _ := kind.ops(h, name)
			if err := hlock(ctx); err != nil {
				t.Fatal(err)
			}
			awaitBellOf(t, admin, h.ID())
			w := sessionOn(t, dbtest.Open(t))
			wlock, wunlock := kind.ops(w, name)
			got := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				got <- wlock(ctx)
			}()
			left := func() time.Duration {
				var us int64
				if err := admin.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM dsync_lease WHERE id = ?", h.ID()).Scan(&us); err != nil {
					t.Fatal(err)
				}
				return time.Duration(us) * time.Microsecond
			}
			// Just after a renewal (every ttl/3), wait until the lease
			// has cutLeft left: the next renewal is ttl/3 after the last.
			time.Sleep(300 * time.Millisecond) // the waiter blocks on the holder's doorbell
			for l := left(); l < ttl-50*time.Millisecond; l = left() {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(left() - cutLeft)
			q0, from := serverQuestions(t, admin), time.Now()
			p.Close() // the holder's connections close, and no new one opens
			if err := <-got; err != nil {
				t.Fatalf("the waiter's lock after the holder died: %v", err)
			}
			checkRate(t, admin, q0, from, 1)
			// When the hold began, on the server's clock. A Semaphore's
			// waiter records it after Acquire has returned (see
			// tickets.granted): until then it reads as the ticket's
			// insert, before the lease's end, so a negative figure is
			// read again, for up to 2s; a hold that really began before
			// the lease's end stays negative.
			var after int64
			for deadline := time.Now().Add(2 * time.Second); ; {
				if err := admin.QueryRow(`SELECT TIMESTAMPDIFF(MICROSECOND, l.expires_at, h.held_since)
FROM dsync_lease l, (SELECT held_since FROM dsync_lock WHERE holder = ?
  UNION ALL SELECT IF(t.mode = 1, GREATEST(t.held_since, q.held_since), t.held_since)
  FROM dsync_ticket t JOIN dsync_queue q ON q.name = t.name WHERE t.holder = ? AND t.seq < 1 << 62) h
WHERE l.id = ?`, w.ID(), w.ID(), h.ID()).Scan(&after); err != nil {
					t.Fatal(err)
				}
				if after >= 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			late := time.Duration(after) * time.Microsecond
			t.Logf("taken %v after the dead holder's lease ended (%v after its connections closed)", late, time.Since(from).Round(time.Millisecond))
			if late < 0 {
				t.Fatalf("taken %v before the dead holder's lease ended; want after", -late)
			}
			if late > lateBound {
				t.Errorf("taken %v after the dead holder's lease ended; want within %v (a paced poll lands just after the lease's end)", late, lateBound)
			}
			if err := wunlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

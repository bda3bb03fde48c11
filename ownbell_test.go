package dsync_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// ownBellHolderSQL reads which connection holds the own doorbell of the
// live ticket of name held by a lease (named as ticketBellName names it:
// dsynct:<lease id>:<token>, in hex). Args: name, lease id.
const ownBellHolderSQL = "SELECT IS_USED_LOCK(CONCAT('dsynct:', LOWER(HEX(holder)), ':', LOWER(HEX(token))))" +
	" FROM dsync_ticket WHERE name = ? AND holder = ?"

// TestOwnBellGoneNoSpin checks a waiter behind a ticket whose own
// doorbell went without the ticket's release (its session's doorbell
// connection was killed, as when the session's process dies): the
// waiters blocked on it wake, find the ticket still there, and wait for
// it on its session's doorbell instead, within the polling budget, never
// blocking on that free bell again; the holder's Unlock still hands the
// lock over at once. It first proves that the holder's ticket has its own
// doorbell, held by its session's doorbell connection, and that the kill
// let it go.
func TestOwnBellGoneNoSpin(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	db := dbtest.Open(t)
	const waiters = 4
	sh, h, bell := holdByBelledTicket(t, db, name)

	w := startSpinWaitersOf(t, fairOps, dbtest.DSN(), name, waiters, time.Minute)
	killConn(t, db, bell)
	var holderConn sql.NullInt64
	if err := db.QueryRow(ownBellHolderSQL, name, sh.ID()).Scan(&holderConn); err != nil {
		t.Fatal(err)
	}
	if holderConn.Valid {
		t.Fatalf("the held ticket's own doorbell after the kill: held by connection %d; want free", holderConn.Int64)
	}
	checkRateFor(t, db, 1500*time.Millisecond, waiters)
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w.takenWithin(t, time.Now(), "the Unlock")
	w.wait(t)
}

// TestOwnBellFlickerNoSpin checks the rule that a waiter never blocks
// again on a ticket's own doorbell that woke it once: a bell found held
// after its ticket lost it (here another connection takes and lets go the
// name, again and again, after the holder's doorbell connection was
// killed) is a hint that nothing backs, and a waiter that blocked on it at
// each take would wake at each let-go, check, read and block again: a
// spin (68.7-69.3 statements a second per waiter with the rule taken
// out, against a budget of 20). The waiters must stay within the polling
// budget, and take the lock within takeBound of the holder's Unlock (with
// the holder's doorbell connection gone they pace). It first proves the
// fault: the other connection took the bell over and over while the
// waiters waited.
func TestOwnBellFlickerNoSpin(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	db := dbtest.Open(t)
	const waiters = 4
	sh, h, bell := holdByBelledTicket(t, db, name)
	var token int64
	if err := db.QueryRow("SELECT token FROM dsync_ticket WHERE name = ? AND holder = ?", name, sh.ID()).Scan(&token); err != nil {
		t.Fatal(err)
	}
	bellName := fmt.Sprintf("dsynct:%x:%x", sh.ID(), token)
	killConn(t, db, bell)

	// The flicker: a connection of its own holds the bell 10ms, lets it
	// go, and takes it again as soon as it can (a waiter blocked on it
	// takes it and lets it go first).
	rogue, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	take, err := rogue.PrepareContext(ctx, "SELECT GET_LOCK(?, 1)")
	if err != nil {
		t.Fatal(err)
	}
	defer take.Close()
	letGo, err := rogue.PrepareContext(ctx, "SELECT RELEASE_LOCK(?)")
	if err != nil {
		t.Fatal(err)
	}
	defer letGo.Close()
	var sent, took atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var got sql.NullInt64
			if err := take.QueryRowContext(ctx, bellName).Scan(&got); err != nil {
				t.Error(err)
				return
			}
			sent.Add(1)
			if got.Int64 == 1 {
				took.Add(1)
			}
			time.Sleep(10 * time.Millisecond)
			if err := letGo.QueryRowContext(ctx, bellName).Scan(&got); err != nil {
				t.Error(err)
				return
			}
			sent.Add(1)
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()
	time.Sleep(100 * time.Millisecond) // the bell is held when the waiters first read

	w := startSpinWaitersOf(t, fairOps, dbtest.DSN(), name, waiters, time.Minute)
	q0, from := serverQuestions(t, db), time.Now()
	took0 := took.Load()
	sent0 := sent.Load()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-done
	if n := took.Load() - took0; n < 10 {
		t.Fatalf("the other connection took the bell %d times in 1.5s; want at least 10 (the fault)", n)
	}
	checkRate(t, db, q0+sent.Load()-sent0, from, waiters)
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w.takenWithin(t, time.Now(), "the Unlock")
	w.wait(t)
}

// TestOwnBellCancelledAhead checks a waiter whose nearest ticket ahead
// leaves the line without being granted (its Lock's ctx ends): the
// waiter, blocked on that ticket's own doorbell, wakes, and then waits for
// the holder ahead of it, whose Unlock hands the lock over at once.
func TestOwnBellCancelledAhead(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	open := func() *dsync.FairMutex {
		s := newSession(t, dsync.WithTTL(time.Minute))
		warm := dsync.NewFairMutex(s, name+"-warm") // its doorbell, for its enqueue
		if err := warm.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := warm.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		return dsync.NewFairMutex(s, name)
	}
	m1, m2, m3 := open(), open(), open()
	if err := m1.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	got2 := lockAsync(ctx2, m2)
	time.Sleep(300 * time.Millisecond) // m2 enqueues and waits
	got3 := lockAsync(ctx, m3)
	time.Sleep(300 * time.Millisecond) // m3 enqueues behind m2 and blocks on its ticket's bell
	cancel2()
	if err := <-got2; err == nil {
		t.Fatal("m2 took the lock while m1 held it")
	}
	time.Sleep(300 * time.Millisecond) // m3 wakes and waits for m1
	notReturned(t, got3, "m1 held the lock")
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	if err := <-got3; err != nil {
		t.Fatal(err)
	}
	took := time.Since(freed)
	t.Logf("m3 took the lock %v after m1's Unlock", took.Round(time.Millisecond))
	if took > takeBound {
		t.Errorf("m3 took the lock %v after m1's Unlock; want well before bellWait (8s)", took.Round(time.Millisecond))
	}
	if err := m3.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// holdByBelledTicket has a new session hold name by a ticket that has its
// own doorbell, and returns the session, its FairMutex of name and its
// doorbell's connection id. It proves that the doorbell's connection
// holds the ticket's bell. The session holds a lock first, so that it has
// its doorbell when it enqueues; it enqueues behind another session's
// hold of the head slot, and holds by its ticket once that lets go.
func holdByBelledTicket(t *testing.T, db *sql.DB, name string) (*dsync.Session, *dsync.FairMutex, int64) {
	t.Helper()
	ctx := context.Background()
	sh := newSession(t, dsync.WithTTL(time.Minute))
	warm := dsync.NewFairMutex(sh, name+"-warm")
	if err := warm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	bell := awaitBellOf(t, db, sh.ID())
	m0 := dsync.NewFairMutex(newSession(t, dsync.WithTTL(time.Minute)), name)
	if err := m0.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	h := dsync.NewFairMutex(sh, name)
	got := lockAsync(ctx, h)
	awaitTicketOf(t, db, sh, name)
	if err := m0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	var holderConn sql.NullInt64
	if err := db.QueryRow(ownBellHolderSQL, name, sh.ID()).Scan(&holderConn); err != nil {
		t.Fatal(err)
	}
	if holderConn.Int64 != bell {
		t.Fatalf("the held ticket's own doorbell: held by connection %v; want the session's doorbell connection %d", holderConn, bell)
	}
	return sh, h, bell
}

// blockedWaiters starts n FairMutex waiters of name, each in a session
// of its own, and waits until n connections block in GET_LOCK (a
// doorbell). Their results come on the returned channel.
func blockedWaiters(t *testing.T, db *sql.DB, name string, n int) chan error {
	t.Helper()
	ctx := context.Background()
	var before int
	if err := db.QueryRow(userLockWaitsSQL).Scan(&before); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, n)
	for range n {
		m := dsync.NewFairMutex(newSession(t, dsync.WithTTL(time.Minute)), name)
		go func() {
			err := m.Lock(ctx)
			if err == nil {
				err = m.Unlock(ctx)
			}
			got <- err
		}()
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var blocked int
		if err := db.QueryRow(userLockWaitsSQL).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked >= before+n {
			return got
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d waiters blocked in GET_LOCK after 5s", blocked-before, n)
		}
	}
}

// userLockWaitsSQL counts the connections that wait in GET_LOCK.
const userLockWaitsSQL = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'"

// TestOwnBellBlockHoldsNoTable checks that waiters blocked on a ticket's
// own doorbell hold no metadata lock on dsync's tables: an ALTER TABLE of
// the ticket table on another connection, with a lock wait timeout of 2s
// (qUpgradeFrom6's is 5s), completes while they wait. A block that read
// the ticket and lease tables in its statement kept a metadata lock on
// them for as long as it waited (up to 8s), and the ALTER, and every
// statement on the table behind it, waited for it.
func TestOwnBellBlockHoldsNoTable(t *testing.T) {
	ctx := context.Background()
	db, _, h, got := belledLine(t, 2)
	time.Sleep(200 * time.Millisecond) // well into their blocks

	var comment string
	if err := db.QueryRow("SELECT TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'dsync_ticket'").Scan(&comment); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 2"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = conn.ExecContext(ctx, "ALTER TABLE dsync_ticket COMMENT = 'probe'")
	t.Logf("ALTER TABLE of the ticket table while 2 waiters block: %v after %v", err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Errorf("ALTER TABLE of the ticket table while waiters block on a ticket's doorbell: got %v; want it done", err)
	}
	if _, err := conn.ExecContext(ctx, "ALTER TABLE dsync_ticket COMMENT = '"+strings.ReplaceAll(comment, "'", "''")+"'"); err != nil {
		t.Fatal(err)
	}
	notReturned(t, got, "the holder held the lock")
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
}

// TestOwnBellUnlockDoorbellBusy checks the release of a ticket with its
// own doorbell while the session's doorbell connection is busy (here its
// mutex held, as while the doorbell goroutine opens a new connection):
// Unlock returns within its ctx, on another connection, and the doorbell
// lets the bell go once free, which wakes the waiter behind the ticket.
func TestOwnBellUnlockDoorbellBusy(t *testing.T) {
	ctx := context.Background()
	_, sh, h, got := belledLine(t, 1)

	unlockBell := dsync.LockDoorbell(sh)
	t.Cleanup(unlockBell) // before the sessions close
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	unlocked := make(chan error, 1)
	go func() { unlocked <- h.Unlock(uctx) }()
	select {
	case err := <-unlocked:
		if took := time.Since(start); err != nil {
			t.Fatalf("Unlock with the doorbell busy: got %v after %v; want nil", err, took.Round(time.Millisecond))
		}
	case <-time.After(3 * time.Second):
		unlockBell()
		err := <-unlocked
		t.Fatalf("Unlock with the doorbell busy: returned %v only after the doorbell was free, %v after it began; want within its ctx (1s)", err, time.Since(start).Round(time.Millisecond))
	}
	took := time.Since(start)
	time.Sleep(time.Second) // the waiter stays blocked on the bell: nothing let it go
	notReturned(t, got, "the bell was held")
	freed := time.Now()
	unlockBell()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	woke := time.Since(freed)
	t.Logf("Unlock took %v; the waiter took the lock %v after the doorbell was free", took.Round(time.Millisecond), woke.Round(time.Millisecond))
	if woke > takeBound {
		t.Errorf("the waiter took the lock %v after the doorbell was free; want well before bellWait (8s)", woke.Round(time.Millisecond))
	}
}

// awaitTicketOf waits until session s has a ticket in the line of name.
func awaitTicketOf(t *testing.T, db *sql.DB, s *dsync.Session, name string) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?", name, s.ID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("tickets of session %d: got %d; want 1", s.ID(), n)
		}
	}
}

// notReturned fails t when the Lock call whose result comes on got has
// returned: what holds the lock.
func notReturned(t *testing.T, got chan error, what string) {
	t.Helper()
	select {
	case err := <-got:
		t.Fatalf("a waiter returned (%v) while %s", err, what)
	default:
	}
}

// belledLine has a session hold a new name by a ticket with its own
// doorbell (holdByBelledTicket) and n waiters block behind it
// (blockedWaiters), and returns a connection pool of the test's
// database, the holder's session and FairMutex, and the waiters' results.
func belledLine(t *testing.T, n int) (*sql.DB, *dsync.Session, *dsync.FairMutex, chan error) {
	t.Helper()
	name := lockName(t)
	db := dbtest.Open(t)
	sh, h, _ := holdByBelledTicket(t, db, name)
	return db, sh, h, blockedWaiters(t, db, name, n)
}

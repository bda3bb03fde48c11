package dsync_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// ownBellHolderSQL reads which connection holds the own doorbell of the
// live ticket of name held by a lease (ptd19 prototype: the name is made
// as ticketBellPre/ticketBellEnd make it in queries.go). Args: name, lease
// id.
const ownBellHolderSQL = "SELECT IS_USED_LOCK(CONCAT('dsynct:', MD5(CONCAT_WS(':', DATABASE(), '`dsync_ticket`', name, seq, holder, token))))" +
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

	// The holder's session holds a lock first, so that it has its
	// doorbell when it enqueues.
	sh := newSession(t, dsync.WithTTL(time.Minute))
	warm := dsync.NewFairMutex(sh, name+"-warm")
	if err := warm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	bell := awaitBellOf(t, db, sh.ID())

	// A ticket for the holder: it enqueues behind a holder of the slot,
	// and holds by its ticket once that lets go.
	m0 := dsync.NewFairMutex(newSession(t, dsync.WithTTL(time.Minute)), name)
	if err := m0.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	h := dsync.NewFairMutex(sh, name)
	got := lockAsync(ctx, h)
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?", name, sh.ID()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the holder's ticket is not in the table after 5s")
		}
	}
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

	w := startSpinWaitersOf(t, fairOps, dbtest.DSN(), name, waiters, time.Minute)
	if _, err := db.Exec("KILL CONNECTION " + strconv.FormatInt(bell, 10)); err != nil {
		t.Fatal(err)
	}
	awaitGone(t, db, bell)
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
	select {
	case err := <-got3:
		t.Fatalf("m3 got the lock while m1 held it (%v)", err)
	default:
	}
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

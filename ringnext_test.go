package dsync_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestTicketReleaseRingNextTaken plays the release of a ticket, with a
// waiter's marker behind it, on the doorbell's connection while another
// connection holds the doorbell's next generation, so that the release
// cannot take it (review finding 4). The waiter must still get the lock,
// and the releaser's doorbell must be whole again soon after: the
// generation its lease row publishes held by its session. Before, the
// statement let the current generation go, could not take the next one,
// and reported a release without a ring: the lease row went on
// publishing a generation that nobody held (new waiters found it free at
// once and paced) until the next ring.
func TestTicketReleaseRingNextTaken(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	first, holder, waiter := newSession(t), newSession(t), newSession(t)
	m0, m1, m2 := dsync.NewFairMutex(first, name), dsync.NewFairMutex(holder, name), dsync.NewFairMutex(waiter, name)
	if err := m0.Lock(ctx); err != nil { // the head slot: the next Lock takes a ticket
		t.Fatal(err)
	}
	got1 := lockAsync(ctx, m1)
	waitRows(t, db, 10*time.Second, 1, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?`, name, holder.ID())
	if err := m0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got1; err != nil {
		t.Fatalf("holder's Lock: %v", err)
	}
	gen := func() int64 {
		return int64(countRows(t, db, `SELECT bell FROM dsync_lease WHERE id = ?`, holder.ID()))
	}
	waitRows(t, db, 10*time.Second, 1, `SELECT bell > 0 FROM dsync_lease WHERE id = ?`, holder.ID())
	got2 := lockAsync(ctx, m2)
	// The waiter's marker; then it blocks on the holder's doorbell.
	waitRows(t, db, 10*time.Second, 1, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = 0`, name)
	time.Sleep(100 * time.Millisecond)

	// Another connection takes the holder's next generation.
	cur := gen()
	rogue, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rogue.Close() })
	var took int64
	if err := rogue.QueryRowContext(ctx, `SELECT GET_LOCK(?, 0)`, bellName(holder.ID(), cur+1)).Scan(&took); err != nil || took != 1 {
		t.Fatalf("take the next generation: %d, %v", took, err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got2:
		if err != nil {
			t.Fatalf("waiter's Lock: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiter did not get the lock within 15s")
	}
	// The fault happened: the release could not take the next generation.
	var user int64
	if err := rogue.QueryRowContext(ctx, `SELECT IS_USED_LOCK(?) = CONNECTION_ID()`, bellName(holder.ID(), cur+1)).Scan(&user); err != nil || user != 1 {
		t.Fatalf("the next generation left the other connection: %d, %v", user, err)
	}
	// The guarantee: the generation published is held by the holder's
	// session (its doorbell taken again), within a few seconds.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := gen()
		var held int64
		if err := db.QueryRow(`SELECT COALESCE(IS_USED_LOCK(?), 0) NOT IN (0, ?)`, bellName(holder.ID(), g), connID(t, rogue)).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holder's published doorbell generation %d (was %d) is not held after 5s", g, cur)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// bellName is dsync's GET_LOCK name of a doorbell generation (doorbell.go).
func bellName(id, gen int64) string { return fmt.Sprintf("dsync:%x:%x", id, gen) }

// connID returns c's CONNECTION_ID().
func connID(t *testing.T, c *sql.Conn) int64 {
	t.Helper()
	var id int64
	if err := c.QueryRowContext(context.Background(), `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// lockAsync runs m.Lock, bounded by 20 s, in a goroutine of its own, and
// returns the channel its error comes on.
func lockAsync(ctx context.Context, m *dsync.FairMutex) chan error {
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		got <- m.Lock(lctx)
	}()
	return got
}

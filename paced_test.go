package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// waitPaced has s wait for the Mutex name in a goroutine until the test
// ends (the lock is held by another session) and returns at once.
func waitPaced(t *testing.T, s *dsync.Session, name string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dsync.NewMutex(s, name).Lock(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err == nil {
			t.Errorf("Lock of %q held by another session: got nil; want ctx's error", name)
		}
	})
}

// TestPacedWaiterWithinBudget: a Mutex waiter that has nothing to block on
// while the lock stays held polls within the polling budget (spinBudget
// statements a second, the keep-alives of every session in the test
// included; it sent a try, a want and a read every connPace, about 27 a
// second): (a) one session, on a *sql.DB without a connection limit,
// waiting for two names held by two other sessions, whose one waiting
// connection blocks on one of the two doorbells; (b) the claimant of a
// name whose holder has no doorbell, as the second holder session of a
// *sql.DB limited to 8 connections has none (its doorbell share is one
// doorbell and the waiting connection).
func TestPacedWaiterWithinBudget(t *testing.T) {
	slowTest(t)
	const window = 2 * time.Second
	ctx := context.Background()
	admin := dbtest.Open(t)
	t.Run("one session, two names, two holders", func(t *testing.T) {
		h1, h2 := newSession(t), newSession(t)
		n1, n2 := lockName(t)+"/a", lockName(t)+"/b"
		mustLock(t, dsync.NewMutex(h1, n1), ctx)
		mustLock(t, dsync.NewMutex(h2, n2), ctx)
		awaitBellOf(t, admin, h1.ID())
		awaitBellOf(t, admin, h2.ID())
		w := newSession(t)
		waitPaced(t, w, n1)
		waitPaced(t, w, n2)
		time.Sleep(time.Second) // one blocks, the other settles on its pace
		if n := dsync.BellWaitConnsInUse(w); n != 1 {
			t.Fatalf("waiting connections in use: got %d; want 1 (one name blocks, the other cannot)", n)
		}
		checkRateFor(t, admin, window, 1)
	})
	t.Run("claimant, holder without a doorbell", func(t *testing.T) {
		hdb := cappedDB(t, 8)
		h1, h2 := sessionOn(t, hdb), sessionOn(t, hdb)
		n1, n2 := lockName(t)+"/a", lockName(t)+"/b"
		mustLock(t, dsync.NewMutex(h1, n1), ctx)
		awaitBellOf(t, admin, h1.ID())
		mustLock(t, dsync.NewMutex(h2, n2), ctx)
		w := sessionOn(t, cappedDB(t, 8))
		waitPaced(t, w, n2)
		time.Sleep(time.Second) // it claims, and settles on its pace
		if c := bellOf(t, admin, h2.ID()); c != 0 {
			t.Fatalf("the second holder of the capped *sql.DB has a doorbell (connection %d); want none", c)
		}
		checkRateFor(t, admin, window, 1)
	})
}

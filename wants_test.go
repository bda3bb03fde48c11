package dsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestMutexUncontendedAfterWaitTwoStatements checks that an uncontended
// Lock+Unlock of a Mutex sends two statements (every dsync statement is a
// prepared one) also right after another session waited for the name and
// took it, with doorbells on, on a *sql.DB without a connection limit and
// on ones limited to 8 and 32: the wait left no ring, publish or other
// statement on the uncontended path (issue 19 §5: every release rang the
// doorbell and published its next generation, 3 statements a pair, for
// the 10s that the waiter had said it waited). The count is global to
// the server: a few tries, and the fewest counts.
func TestMutexUncontendedAfterWaitTwoStatements(t *testing.T) {
	ctx := context.Background()
	admin := dbtest.Open(t)
	for _, limit := range []int{0, 8, 32} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			s := sessionOn(t, cappedDB(t, limit), dsync.WithTTL(time.Minute))
			name := lockName(t)
			m, other := dsync.NewMutex(s, name), dsync.NewMutex(newSession(t), name)
			mustLock(t, m, ctx)
			got := make(chan error, 1)
			go func() { got <- other.Lock(ctx) }()
			time.Sleep(200 * time.Millisecond) // it waits, on m's session's doorbell
			mustUnlock(t, m, ctx)
			if err := <-got; err != nil {
				t.Fatalf("Lock of the other session: got %v; want nil", err)
			}
			mustUnlock(t, other, ctx)
			const n = 20
			cycle := func() {
				mustLock(t, m, ctx)
				mustUnlock(t, m, ctx)
			}
			cycle()
			if fewest := fewestStatements(t, admin, n, cycle, 2*n); fewest != 2*n {
				t.Errorf("statements for %d uncontended Lock+Unlock after another session waited: got %d; want %d", n, fewest, 2*n)
			}
		})
	}
}

// TestWaiterOnSupersededClaimant: a waiter that found the lock free but
// claimed by another session blocks on that claimant's doorbell; when the
// claimant neither takes the lock nor gives up (another waiter took its
// claim over, and the lock, and it waits on), nothing rings for the
// waiter, so it looks again within claimantBlock (a second) instead of
// blocking for bellWait (8s). The test writes the claim into the row
// directly, proves that the waiter blocks on the claimant's doorbell, then
// voids the claim as a takeover would, and has the claimant's session
// take and release the lock with a call that never waited (its release
// rings for nobody). The waiter gets the lock within 3s (it took 8s).
func TestWaiterOnSupersededClaimant(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	admin := dbtest.Open(t)
	claimant, waiter := newSession(t), newSession(t)
	name := lockName(t)
	own := dsync.NewMutex(claimant, name+"/own")
	mustLock(t, own, ctx) // the claimant takes its doorbell
	mustUnlock(t, own, ctx)
	bell := awaitBellOf(t, admin, claimant.ID())
	if _, err := admin.Exec(`INSERT INTO dsync_lock (name, holder, token, fence, waiter, claimed_until, waiter_since, wanted_until)
VALUES (?, 0, 0, 1, ?, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)`,
		name, claimant.ID()); err != nil {
		t.Fatal(err)
	}
	got := lockInBackground(t, dsync.NewMutex(waiter, name))
	// The fault's ground: the waiter blocks on the claimant's doorbell.
	blocked := false
	for end := time.Now().Add(5 * time.Second); !blocked && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var n int
		if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IF(GET_LOCK(%'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		blocked = n > 0
	}
	if !blocked {
		t.Fatalf("the waiter never blocked on a doorbell (the claimant's is held by connection %d)", bell)
	}
	if _, err := admin.Exec("UPDATE dsync_lock SET waiter = -1 WHERE name = ?", name); err != nil {
		t.Fatal(err)
	}
	m := dsync.NewMutex(claimant, name)
	mustLock(t, m, ctx)
	mustUnlock(t, m, ctx)
	released := time.Now()
	at := <-got
	if at.IsZero() {
		return // Lock failed: reported
	}
	t.Logf("the waiter got the lock %v after the claimant's session released it", at.Sub(released))
	if d := at.Sub(released); d > 3*time.Second {
		t.Errorf("waiter blocked on a superseded claimant got the lock %v after it was released; want within 3s (claimantBlock)", d)
	}
}

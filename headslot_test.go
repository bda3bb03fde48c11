package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// Tests of the queued locks' two-statement paths: the head slot of an
// exclusive hold taken while the line is empty (qQueueTake), and a
// reader's enqueue that tells it holds the lock.

// lockQueued makes m's Lock go through the line (a ticket) rather than the
// head slot: another session holds the lock while m enqueues.
func lockQueued(t *testing.T, m *dsync.FairMutex) {
	t.Helper()
	ctx := context.Background()
	other := dsync.NewFairMutex(newSession(t), m.Name())
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }()
	waitTickets(t, dbtest.Open(t), m.Name(), 2)
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// stmtExecutes returns the server's count of prepared statements executed.
func stmtExecutes(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Com_stmt_execute'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// fewestStatements runs cycle n times, counting the statements the server
// of db executed meanwhile, up to 5 times or until a count is want; it
// returns the fewest count. The count is global to the server: another
// client's statements can only add to it.
func fewestStatements(t *testing.T, db *sql.DB, n int, cycle func(), want int64) int64 {
	t.Helper()
	fewest := int64(-1)
	for try := 0; try < 5 && fewest != want; try++ {
		before := stmtExecutes(t, db)
		for range n {
			cycle()
		}
		if d := stmtExecutes(t, db) - before; fewest < 0 || d < fewest {
			fewest = d
		}
	}
	return fewest
}

// TestQueuedUncontendedTwoStatements checks that an uncontended Lock+Unlock
// of a FairMutex, and of either side of an RWMutex, sends exactly two
// statements (every dsync statement is a prepared one), and so does a
// Mutex's. The count is global to the server, so other traffic (a lease
// renewal) can only add: a few tries, and the fewest counts. The code
// before the head slot sent three. (A name's kind, see ErrOtherKind, is
// checked only when its rows are created: the first cycle.)
func TestQueuedUncontendedTwoStatements(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s := newSession(t, dsync.WithTTL(time.Minute), dsync.WithFreeRowAge(0))
	fair := dsync.NewFairMutex(s, lockName(t)+"/fair")
	rw := dsync.NewRWMutex(s, lockName(t)+"/rw")
	mu := dsync.NewMutex(s, lockName(t)+"/mutex")
	kinds := []struct {
		name         string
		lock, unlock func(context.Context) error
	}{
		{"Mutex", mu.Lock, mu.Unlock},
		{"FairMutex", fair.Lock, fair.Unlock},
		{"RWMutex writer", rw.Lock, rw.Unlock},
		{"RWMutex reader", rw.RLock, rw.RUnlock},
	}
	const n = 20
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			cycle := func() {
				if err := k.lock(ctx); err != nil {
					t.Fatalf("Lock: got %v; want <nil>", err)
				}
				if err := k.unlock(ctx); err != nil {
					t.Fatalf("Unlock: got %v; want <nil>", err)
				}
			}
			cycle() // creates the rows, prepares the statements
			if fewest := fewestStatements(t, db, n, cycle, 2*n); fewest != 2*n {
				t.Errorf("statements for %d uncontended Lock+Unlock: got %d; want %d", n, fewest, 2*n)
			}
		})
	}
}

// TestHeadSlotHoldsAgainstAll takes a FairMutex in the head slot (no
// ticket) and checks that every other way in sees it held: TryLock and
// TryRLock of other sessions, and a blocking writer and reader, which get
// the lock only after the Unlock, in order, with fences above the slot's.
func TestHeadSlotHoldsAgainstAll(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	s := newSession(t)
	m := dsync.NewFairMutex(s, name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var holder, tickets int64
	if err := db.QueryRow("SELECT holder, (SELECT COUNT(*) FROM dsync_ticket WHERE name = ?) FROM dsync_queue WHERE name = ?",
		name, name).Scan(&holder, &tickets); err != nil {
		t.Fatal(err)
	}
	if holder != s.ID() || tickets != 0 {
		t.Fatalf("uncontended Lock: got head slot holder %d and %d tickets; want %d and 0", holder, tickets, s.ID())
	}
	other := newSession(t)
	wantTryLock(t, "TryLock of a FairMutex held in the head slot", dsync.NewFairMutex(other, name), false)
	wantTryLock(t, "TryLock of an RWMutex held in the head slot", dsync.NewRWMutex(other, name), false)
	if ok, err := dsync.NewRWMutex(other, name).TryRLock(ctx); ok || err != nil {
		t.Fatalf("TryRLock of a lock held in the head slot: got %v, %v; want false, nil", ok, err)
	}

	w := dsync.NewRWMutex(other, name)
	r := dsync.NewRWMutex(newSession(t), name)
	order := make(chan string, 2)
	errc := make(chan error, 2)
	go func() {
		if err := w.Lock(ctx); err != nil {
			errc <- err
			return
		}
		order <- "writer"
		time.Sleep(50 * time.Millisecond)
		errc <- w.Unlock(ctx)
	}()
	waitTickets(t, db, name, 2)
	go func() {
		if err := r.RLock(ctx); err != nil {
			errc <- err
			return
		}
		order <- "reader"
		errc <- r.RUnlock(ctx)
	}()
	waitTickets(t, db, name, 3)
	select {
	case who := <-order:
		t.Fatalf("%s got the lock while the head slot was held", who)
	case <-time.After(300 * time.Millisecond):
	}
	fence := m.Fence()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if first, second := <-order, <-order; first != "writer" || second != "reader" {
		t.Errorf("order after the slot's Unlock: got %s, %s; want writer, reader", first, second)
	}
	wantTryLock(t, "TryLock after all left", m, true)
	if f := m.Fence(); f <= fence {
		t.Errorf("fence after the slot's hold: got %d; want above %d", f, fence)
	}
	unlockNow(t, "Unlock", m)
}

// TestHeadSlotTakeSeesTicketCommittedWhileWaiting plays the race between
// an enqueue and a take of the head slot: the take waits for the name's
// row behind a transaction that inserts a live ticket, and must see that
// ticket once it gets the row (were the line read before the wait, both
// would hold the lock).
func TestHeadSlotTakeSeesTicketCommittedWhileWaiting(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	m := dsync.NewFairMutex(newSession(t), name)
	if err := m.Lock(ctx); err != nil { // creates the name's row
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitsForTicketCommittedMeanwhile(t, name, "Lock", m.Lock, "UPDATE %dsync_queue%SET%holder = IF%",
		"SELECT name FROM dsync_queue WHERE name = ? FOR UPDATE", "1")
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClusterEnqueueSeesTicketCommittedWhileWaiting plays the race of two
// enqueues on a Galera cluster (qTicketNumber, run here on a single
// server, where InnoDB behaves the same): a reader's enqueue waits for the
// name's row behind a transaction that enqueues a writer, and once it gets
// the row it must see the writer's ticket ahead of its own. Were the
// line read before the wait, the reader would number its ticket after the
// writer's yet see nothing ahead, and hold the lock with the writer
// (TestGaleraRWMutexWriterVsReaders: a reader and a writer at once).
func TestClusterEnqueueSeesTicketCommittedWhileWaiting(t *testing.T) {
	defer dsync.EnqueueAsOnCluster()()
	ctx := context.Background()
	name := lockName(t)
	rw := dsync.NewRWMutex(newSession(t), name)
	if err := rw.RLock(ctx); err != nil { // creates the name's row
		t.Fatal(err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitsForTicketCommittedMeanwhile(t, name, "RLock", rw.RLock, "UPDATE %dsync_queue%SET seq = LAST_INSERT_ID%",
		"UPDATE dsync_queue SET seq = seq + 1 WHERE name = ?", "seq")
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitsForTicketCommittedMeanwhile runs lock (op names it) while a
// transaction that holds name's row in the queue table (taken by take, a
// statement whose one arg is the name) inserts a live exclusive ticket
// numbered seq (an expression on that row). Once lock's statement (like
// stmt in the process list) waits for the row, the transaction commits:
// lock must go on waiting, and return nil once the planted ticket is gone.
func waitsForTicketCommittedMeanwhile(t *testing.T, name, op string, lock func(context.Context) error, stmt, take, seq string) {
	t.Helper()
	ctx := context.Background()
	db := dbtest.Open(t)
	ahead := newSession(t) // the live lease of the planted ticket
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(take, name); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO dsync_ticket (name, seq, holder, token, mode) SELECT name, "+seq+", ?, -1, 1 FROM dsync_queue WHERE name = ?",
		ahead.ID(), name); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { locked <- lock(lctx) }()
	awaitStatement(t, db, stmt, 10*time.Second, op+" never waited for the name's row")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		t.Fatalf("%s with a live ticket ahead: got %v; want it to wait", op, err)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := db.Exec("DELETE FROM dsync_ticket WHERE name = ? AND holder = ?", name, ahead.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatalf("%s after the ticket ahead left: got %v; want <nil>", op, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s after the ticket ahead left: still waiting after 30s", op)
	}
}

// TestQueuedExclusionMixed runs goroutines of several sessions that take
// one name as FairMutex writers (blocking and TryLock) and RWMutex writers
// and readers, so that holds in the head slot, holds by ticket and readers
// entering with their enqueue alone interleave. No writer may ever overlap
// another hold, and the writers' fences, in lock order, must increase.
func TestQueuedExclusionMixed(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	const sessions, goroutines, rounds = 3, 3, 12
	var (
		writers, readers atomic.Int32
		violations       atomic.Int32
		mu               sync.Mutex
		lastFence        int64
		fenceErrs        []string
		tryHits          atomic.Int32
	)
	write := func(fence int64) {
		if writers.Add(1) != 1 || readers.Load() != 0 {
			violations.Add(1)
		}
		mu.Lock()
		if fence <= lastFence {
			fenceErrs = append(fenceErrs, fmt.Sprintf("fence %d after %d", fence, lastFence))
		}
		lastFence = fence
		mu.Unlock()
		time.Sleep(time.Millisecond)
		writers.Add(-1)
	}
	read := func() {
		readers.Add(1)
		if writers.Load() != 0 {
			violations.Add(1)
		}
		time.Sleep(time.Millisecond)
		readers.Add(-1)
	}
	var wg sync.WaitGroup
	errc := make(chan error, sessions*goroutines)
	for i := 0; i < sessions; i++ {
		s := newSession(t)
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fm := dsync.NewFairMutex(s, name)
				rw := dsync.NewRWMutex(s, name)
				for r := 0; r < rounds; r++ {
					var err error
					switch (i + g + r) % 4 {
					case 0:
						if err = fm.Lock(ctx); err == nil {
							write(fm.Fence())
							err = fm.Unlock(ctx)
						}
					case 1:
						if err = rw.Lock(ctx); err == nil {
							write(rw.Fence())
							err = rw.Unlock(ctx)
						}
					case 2:
						if err = rw.RLock(ctx); err == nil {
							read()
							err = rw.RUnlock(ctx)
						}
					case 3:
						var ok bool
						if ok, err = fm.TryLock(ctx); ok {
							tryHits.Add(1)
							write(fm.Fence())
							err = fm.Unlock(ctx)
						}
					}
					if err != nil {
						errc <- err
						return
					}
					if r%3 == 0 {
						time.Sleep(5 * time.Millisecond) // let the line empty now and then
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if v := violations.Load(); v != 0 {
		t.Errorf("got %d overlapping holds; want 0", v)
	}
	if len(fenceErrs) > 0 {
		t.Errorf("fences not strictly increasing: %v", fenceErrs)
	}
	t.Logf("TryLock succeeded %d times", tryHits.Load())
}

// TestHeadSlotHolderLeaseEnds ends the lease of a session that holds a
// FairMutex in the head slot, as a crash would (its keep-alive then finds
// the lease gone): a waiter of another session gets the lock, with a
// higher fence, and the old holder's Unlock fails without freeing it.
func TestHeadSlotHolderLeaseEnds(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	s := newSession(t, dsync.WithTTL(2*time.Second))
	m := dsync.NewFairMutex(s, name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	fence := m.Fence()
	w := dsync.NewFairMutex(newSession(t), name)
	locked := make(chan error, 1)
	go func() { locked <- w.Lock(ctx) }()
	waitTickets(t, db, name, 2)
	if _, err := db.Exec("UPDATE dsync_lease SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", s.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatalf("Lock after the slot holder's lease ended: got %v; want <nil>", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Lock after the slot holder's lease ended: still waiting after 30s")
	}
	if f := w.Fence(); f <= fence {
		t.Errorf("fence after the dead holder: got %d; want above %d", f, fence)
	}
	select {
	case <-s.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the session whose lease ended never reported it")
	}
	if err := m.Unlock(ctx); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("Unlock by the holder whose lease ended: got %v; want ErrSessionExpired", err)
	}
	wantTryLock(t, "TryLock by a third session while the waiter holds", dsync.NewFairMutex(newSession(t), name), false)
	unlockNow(t, "Unlock", w)
}

// TestContendedLockEnqueuesAtOnce: a session whose take of the head slot
// found the lock held, and that then held the lock and let it go (which
// forgets its local state of the name), enqueues at once on its next Lock
// while the line is busy, instead of trying the slot first: that take
// would write nothing and only wait for the per-name row behind the
// others' enqueues, a statement per contended Lock. A transaction holding
// the per-name row shows which statement the Lock sends first.
func TestContendedLockEnqueuesAtOnce(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	b := dsync.NewFairMutex(newSession(t), name)
	lockQueued(t, b) // b's take of the slot found it held: b holds a ticket
	a := dsync.NewFairMutex(newSession(t), name)
	got := make(chan error, 1)
	go func() { got <- a.Lock(ctx) }()
	waitTickets(t, db, name, 2)
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT fence FROM dsync_queue WHERE name = ? FOR UPDATE", name); err != nil {
		t.Fatal(err)
	}
	go func() { got <- b.Lock(ctx) }()
	awaitStatement(t, db, "INSERT INTO %dsync_ticket%SELECT q.name%", 5*time.Second,
		"b's Lock did not enqueue within 5s (it tried the head slot first)")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitTickets(t, db, name, 2)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

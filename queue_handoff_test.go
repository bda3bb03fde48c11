package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestWokenCheckWaitsForRelease plays a queued handoff whose release rang
// before it committed (a head slot's release rings inside its UPDATE): a
// waiter woken then must not read the line as it was before the release.
// A transaction stands for the release: it frees the head slot (or deletes
// the ticket ahead) and commits 300ms later, while the woken waiter's
// check runs. The check must wait for that commit and then find the lock
// free: a writer takes it, with a fence above the released hold's, and a
// reader counts nothing ahead. A plain check (the code before) read the
// hold as still there, and the waiter went back to a doorbell that had
// already rung.
func TestWokenCheckWaitsForRelease(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	db := dbtest.Open(t)
	for _, c := range []struct {
		name      string
		exclusive bool
		slot      bool // the release frees the head slot; else it deletes a ticket ahead
	}{
		{"writer behind the head slot", true, true},
		{"reader behind the head slot", false, true},
		{"writer behind a ticket", true, false},
		{"reader behind a ticket", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := lockName(t)
			holder := newSession(t)
			waiting := newSession(t)
			m := dsync.NewFairMutex(holder, name)
			if err := m.Lock(ctx); err != nil { // the head slot
				t.Fatal(err)
			}
			held := m.Fence()
			var next int64
			if err := db.QueryRow(`SELECT seq + 1 FROM dsync_queue WHERE name = ?`, name).Scan(&next); err != nil {
				t.Fatal(err)
			}
			behind := int64(0)
			release, args := `UPDATE dsync_queue SET holder = 0, token = 0 WHERE name = ?`, []any{name}
			if !c.slot {
				// A ticket of the holder's session ahead, released instead.
				behind, next = next, next+1
				if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, 99, 1)`,
					name, behind, holder.ID()); err != nil {
					t.Fatal(err)
				}
				if _, err := db.Exec(release, args...); err != nil {
					t.Fatal(err)
				}
				release, args = `DELETE FROM dsync_ticket WHERE name = ? AND seq = ?`, []any{name, behind}
			}
			mode := 1
			if !c.exclusive {
				mode = 0
			}
			if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, 98, ?)`,
				name, next, waiting.ID(), mode); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Exec(`DELETE FROM dsync_ticket WHERE name = ?`, name) })

			committed := releaseCommitsLater(t, db, release, args...)
			ahead, fence, err := dsync.CheckWoken(ctx, waiting, name, next, c.exclusive, behind)
			if cerr := <-committed; cerr != nil {
				t.Fatal(cerr)
			}
			if err != nil {
				t.Fatal(err)
			}
			if ahead != 0 {
				t.Fatalf("conflicting holds and tickets ahead after the release: got %d; want 0", ahead)
			}
			if c.exclusive && fence <= held {
				t.Errorf("fence taken: got %d; want above the released hold's %d", fence, held)
			}
		})
	}
}

// releaseCommitsLater runs release (a statement that stands for a lock's
// release) in a transaction and commits it 300ms later, in the background:
// the returned channel gives the commit's error. Meanwhile the release's
// row locks are held, as those of a release that rang inside its
// statement and has not committed yet.
func releaseCommitsLater(t *testing.T, db *sql.DB, release string, args ...any) <-chan error {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(release, args...); err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		committed <- tx.Commit()
	}()
	return committed
}

// TestAheadReadWaitsForRelease plays the release of the ticket a waiter
// waits behind, with the marker the waiter's enqueue left behind it,
// running while the waiter reads whom it waits for: the release has
// deleted the ticket and the marker (and rung, inside its statement) but
// not committed. The read must wait for that commit and not report the
// released ticket, marked: the waiter would skip its own marker and block
// on a doorbell that already rang, until bellWait. A plain read (the code
// before) reported it.
func TestAheadReadWaitsForRelease(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	holder, waiting := newSession(t), newSession(t)
	m := dsync.NewFairMutex(holder, name)
	if err := m.Lock(ctx); err != nil { // creates the rows; the head slot
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var ahead int64
	if err := db.QueryRow(`SELECT seq + 1 FROM dsync_queue WHERE name = ?`, name).Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	const markerBase = 1 << 62
	for _, row := range [][]any{
		{name, ahead, holder.ID(), 99, 1},             // the holder's ticket
		{name, ahead + 1, waiting.ID(), 98, 1},        // the waiter's
		{name, ahead + markerBase, 0, holder.ID(), 0}, // the waiter's marker behind the holder's ticket
	} {
		if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, ?, ?)`, row...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { db.Exec(`DELETE FROM dsync_ticket WHERE name = ?`, name) })
	seq, marked, err := dsync.TicketAhead(ctx, waiting, name, ahead+1, true)
	if err != nil || seq != ahead || !marked {
		t.Fatalf("read before the release: ticket %d, marked %v, %v; want %d, marked", seq, marked, err, ahead)
	}

	committed := releaseCommitsLater(t, db, `DELETE FROM dsync_ticket WHERE name = ? AND seq IN (?, ?)`, name, ahead, ahead+markerBase)
	start := time.Now()
	seq, marked, err = dsync.TicketAhead(ctx, waiting, name, ahead+1, true)
	waited := time.Since(start)
	if cerr := <-committed; cerr != nil {
		t.Fatal(cerr)
	}
	if err == nil && seq == ahead {
		t.Fatalf("read during the release: the released ticket %d (marked %v) after %v; want the read to wait for the release's commit", seq, marked, waited)
	}
	if !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("read during the release: ticket %d, %v; want nothing ahead (sql.ErrNoRows)", seq, err)
	}
}

// TestQueuedHandoffStatements counts the statements the server runs for
// a handoff of a FairMutex, and of an RWMutex from writer to writer and
// between a writer and a reader, between two sessions that take turns: the
// holder unlocks while the other session's Lock is blocked on its
// doorbell. A handoff costs the waiter's enqueue (its ticket, which takes
// the ticket's own doorbell, in one statement), the read of whom it waits
// for, its block on the holder ticket's own doorbell, the release, which
// lets that bell go in its own statement (qTicketReleaseRing), and the
// woken waiter's take in one statement (qTicketTakeWoken): 5 in all (5.5
// on average between a writer and a reader: a reader's woken check only
// reads, and a reader that waited then records when its hold began,
// qTicketGranted, for ListLocks). Before the tickets' own doorbells the
// enqueue left a marker behind the ticket ahead, the release rang the
// session's doorbell for it, and the releaser published its next
// generation: 6; the code before that left the marker in a statement of
// its own: 8 (and 10 before that, when the release rang after it and the
// line was counted before the take). The count is global to the server,
// so other traffic (a lease renewal) can only add: a few tries, and the
// fewest counts.
func TestQueuedHandoffStatements(t *testing.T) {
	slowTest(t)
	ctx := context.Background()
	db := dbtest.Open(t)
	type lockFuncs struct{ lock, unlock func(context.Context) error }
	kinds := []struct {
		name   string
		most   int64 // statements for two handoffs, there and back
		locker func(s *dsync.Session, name string, i int) lockFuncs
	}{
		{"FairMutex", 11, func(s *dsync.Session, name string, _ int) lockFuncs {
			m := dsync.NewFairMutex(s, name)
			return lockFuncs{m.Lock, m.Unlock}
		}},
		{"RWMutex writer to writer", 11, func(s *dsync.Session, name string, _ int) lockFuncs {
			m := dsync.NewRWMutex(s, name)
			return lockFuncs{m.Lock, m.Unlock}
		}},
		{"RWMutex writer to reader", 12, func(s *dsync.Session, name string, i int) lockFuncs {
			m := dsync.NewRWMutex(s, name)
			if i == 1 {
				return lockFuncs{m.RLock, m.RUnlock}
			}
			return lockFuncs{m.Lock, m.Unlock}
		}},
	}
	const n = 10
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			name := lockName(t)
			a := k.locker(newSession(t, dsync.WithTTL(time.Minute)), name, 0)
			b := k.locker(newSession(t, dsync.WithTTL(time.Minute)), name, 1)
			handoff := func(holder, waiter lockFuncs) {
				got := make(chan error, 1)
				go func() { got <- waiter.lock(ctx) }()
				time.Sleep(20 * time.Millisecond) // the waiter blocks on the holder's doorbell
				if err := holder.unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
			}
			if err := a.lock(ctx); err != nil {
				t.Fatal(err)
			}
			// Warm up: rows, doorbells, prepared statements, the line
			// of tickets (a first handoff leaves the head slot).
			handoff(a, b)
			handoff(b, a)
			fewest := int64(-1)
			for try := 0; try < 3; try++ {
				before := stmtExecutes(t, db)
				for i := 0; i < n; i++ {
					// a holds; the sessions take turns (writer to reader,
					// then reader to writer, in that case).
					handoff(a, b)
					handoff(b, a)
				}
				if d := stmtExecutes(t, db) - before; fewest < 0 || d < fewest {
					fewest = d
				}
			}
			if fewest > k.most*n {
				t.Errorf("statements for %d handoffs: got %d; want at most %d", 2*n, fewest, k.most*n)
			}
			if err := a.unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStaleMarkerRings leaves a marker behind a ticket number that a
// waiter will wait behind, as an earlier holder of that number left it
// (the sweep purged its crashed holder's ticket, or an enqueue of unknown
// outcome was undone, and ticket numbers come again once the line
// empties): its token names another lease, so the release of the new
// holder of the number does not ring for it. A waiter that enqueues
// behind that ticket must still be woken by its release: its enqueue
// (single server) or its marker statement (the cluster's enqueue leaves
// none) makes the marker its own, and its read does not take a marker
// for another holder as its own. Before, the enqueue kept the old token,
// the read reported the ticket marked, the waiter left no marker, and it
// slept until bellWait (8 s) after the release. The holders keep the
// default TTL: the block also ends with the holder's lease, so a short one
// would hide the missed ring.
func TestStaleMarkerRings(t *testing.T) {
	slowTest(t)
	for _, c := range []struct {
		name    string
		cluster bool
	}{{"enqueue", false}, {"cluster enqueue", true}} {
		t.Run(c.name, func(t *testing.T) {
			if c.cluster {
				defer dsync.EnqueueAsOnCluster()()
			}
			ctx := context.Background()
			db := dbtest.Open(t)
			name := lockName(t)
			first, holder, waiting := newSession(t), newSession(t), newSession(t)
			m0, m1, mw := dsync.NewFairMutex(first, name), dsync.NewFairMutex(holder, name), dsync.NewFairMutex(waiting, name)
			if err := m0.Lock(ctx); err != nil { // the head slot: the next Locks take tickets
				t.Fatal(err)
			}
			got1 := lockAsync(ctx, m1)
			waitRows(t, db, 10*time.Second, 1, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?`, name, holder.ID())
			var ticket int64
			if err := db.QueryRow(`SELECT seq FROM dsync_ticket WHERE name = ? AND holder = ?`, name, holder.ID()).Scan(&ticket); err != nil {
				t.Fatal(err)
			}
			// The stale marker: its token is a lease that does not hold the ticket.
			const markerBase = 1 << 62
			if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, 0, ?, 0)`, name, ticket+markerBase, first.ID()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Exec(`DELETE FROM dsync_ticket WHERE name = ?`, name) })
			gotw := lockAsync(ctx, mw)
			waitRows(t, db, 10*time.Second, 1, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?`, name, waiting.ID())
			time.Sleep(300 * time.Millisecond) // the waiter blocks on the holder's doorbell
			if err := m0.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got1; err != nil {
				t.Fatalf("holder's Lock: %v", err)
			}
			time.Sleep(300 * time.Millisecond) // the waiter is blocked on the holder's doorbell again, if it woke
			start := time.Now()
			if err := m1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-gotw; err != nil {
				t.Fatalf("waiter's Lock: %v", err)
			}
			// Well below bellWait (8 s), far above a handoff (milliseconds).
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("got the lock %v after the holder's Unlock; want well before bellWait (8s): the release did not ring", took.Round(time.Millisecond))
			}
			if err := mw.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEnqueueDuplicateTicketFails makes the single-server enqueue number
// a ticket that another session holds already, as a numbering that read a
// stale MAX would (review L2): a transaction inserts that ticket without
// the per-name row's lock and commits while the enqueue, which did not see
// it, waits on its key. The enqueue must fail, not take the other
// session's ticket for its own (its marker's ON DUPLICATE KEY UPDATE also
// covers the ticket row; a plain insert failed with 1062). Before, the
// update wrote the waiter's token into the other session's ticket.
func TestEnqueueDuplicateTicketFails(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	first, other, waiting := newSession(t), newSession(t), newSession(t)
	if err := dsync.NewFairMutex(first, name).Lock(ctx); err != nil { // the head slot: the next Lock takes a ticket
		t.Fatal(err)
	}
	var ticket int64
	if err := db.QueryRow(`SELECT seq + 1 FROM dsync_queue WHERE name = ?`, name).Scan(&ticket); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	const token = 77
	if _, err := tx.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, ?, 1)`, name, ticket, other.ID(), token); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(`DELETE FROM dsync_ticket WHERE name = ?`, name) })
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		got <- dsync.NewFairMutex(waiting, name).Lock(lctx)
	}()
	// The fault: the enqueue waits on the uncommitted ticket's key. (The
	// server refreshes INNODB_TRX only when it was not read for 0.1 s.)
	for waits := 0; waits == 0; {
		time.Sleep(200 * time.Millisecond)
		waits = countRows(t, db, `SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' AND LEFT(trx_query, 11) = 'INSERT INTO'`)
		select {
		case err := <-got:
			t.Fatalf("Lock returned before the duplicate ticket committed: %v", err)
		default:
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	err = <-got
	var holder, gotToken int64
	if err := db.QueryRow(`SELECT holder, token FROM dsync_ticket WHERE name = ? AND seq = ?`, name, ticket).Scan(&holder, &gotToken); err != nil {
		t.Fatal(err)
	}
	if holder != other.ID() || gotToken != token {
		t.Fatalf("ticket %d after the enqueue: holder %d, token %d; want holder %d, token %d (the enqueue took it for its own)", ticket, holder, gotToken, other.ID(), token)
	}
	if err == nil {
		t.Fatalf("Lock: nil; want an error (ticket %d is another session's)", ticket)
	}
	t.Logf("Lock: %v", err)
}

// TestReadHandoffDoesNotWaitForItsRecord: a reader that waited records
// when its hold began (for ListLocks) after RLock has returned, not on the
// handoff's path, where the record's commit cost a writer → reader handoff
// about a third of its time. Another transaction keeps the reader's
// ticket row locked, so that the record cannot land: RLock must return
// while the record still waits for the row, and the record must land
// once the row is free (Held is then the age of the hold, not of the
// wait).
func TestReadHandoffDoesNotWaitForItsRecord(t *testing.T) {
	ctx := context.Background()
	db, prefix, a, b := twoSessions(t, "rec", "writer", "reader")
	tickets := prefix + "ticket"
	name := lockName(t)
	w, r := dsync.NewRWMutex(a, name), dsync.NewRWMutex(b, name)
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- r.RLock(ctx) }()
	waitRows(t, db, 10*time.Second, 1, "SELECT COUNT(*) FROM "+tickets+" WHERE name = ? AND holder = ?", name, b.ID())
	time.Sleep(300 * time.Millisecond) // the reader's wait, which Held must not count

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var seq int64
	if err := tx.QueryRow("SELECT seq FROM "+tickets+" WHERE name = ? AND holder = ? FOR UPDATE", name, b.ID()).Scan(&seq); err != nil {
		t.Fatalf("lock the reader's ticket row: %v", err)
	}
	unlocked := time.Now()
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("RLock: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RLock did not return within 10s of the writer's Unlock")
	}
	returned := time.Since(unlocked)
	// RLock has returned; the record must still wait for the row (the
	// session's lock wait timeout is 5s): the handoff did not wait for it.
	// Where RLock waited for it, it failed (lock wait timeout) first.
	deadline := time.Now().Add(3 * time.Second)
	for {
		var waiting int
		if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE info LIKE 'UPDATE %` + tickets + `% SET held_since = UTC_TIMESTAMP(6) WHERE%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record of the hold's start waits for the reader's ticket row (seq %d) after RLock returned (%v after the Unlock): RLock waited for it", seq, returned)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitForLocks(t, db, prefix, "the reader's hold, held since the writer's Unlock", func(ls []dsync.LockInfo) bool {
		return len(ls) == 1 && ls[0].Kind == dsync.KindRead && ls[0].Held < time.Since(unlocked)+heldSlack
	})
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

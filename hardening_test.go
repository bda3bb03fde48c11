package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// freshPrefix returns a table prefix no other test uses.
func freshPrefix(tag string) string { return fmt.Sprintf("%s%08x_", tag, rand.Uint32()) }

// TestLeaseIDsNeverRepeat strands lock rows of crashed holders 1..100 and
// sends the lease table's AUTO_INCREMENT (if it has one) back to 1, as a
// MySQL 5.7 restart, a TRUNCATE or a restored backup does: new sessions
// must get ids of their own, and take the stranded locks.
func TestLeaseIDsNeverRepeat(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("leaseid")
	lease, lock := "`"+prefix+"lease`", "`"+prefix+"lock`"
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil { // creates the tables
		t.Fatalf("Close: got %v; want <nil>", err)
	}

	const crashed = 100
	base := lockName(t)
	var values []string
	var args []any
	for id := 1; id <= crashed; id++ {
		values = append(values, "(?, ?, 1, 10)")
		args = append(args, fmt.Sprintf("%s/%d", base, id), id)
	}
	for _, q := range []string{
		"INSERT INTO " + lock + " (name, holder, token, fence) VALUES " + strings.Join(values, ", "),
		"DELETE FROM " + lease + " WHERE id BETWEEN 1 AND 100",
		"TRUNCATE TABLE " + lease, // sends an AUTO_INCREMENT back to 1
	} {
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
		args = nil
	}

	const sessions = 5
	seen := make(map[int64]bool)
	for i := range sessions {
		s := sessionOn(t, db, dsync.WithTablePrefix(prefix))
		id := s.ID()
		if id >= 1 && id <= crashed {
			t.Errorf("session %d: got lease id %d; want one outside 1..%d (the crashed holders')", i, id, crashed)
		}
		if seen[id] {
			t.Errorf("session %d: got lease id %d again; want ids distinct", i, id)
		}
		seen[id] = true
		// Session i takes the lock stranded by holder i+1: the id the
		// session would have had, had the AUTO_INCREMENT been its source.
		m := dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i+1))
		ctx, cancel := context.WithTimeout(bg, 3*time.Second)
		err := m.Lock(ctx)
		cancel()
		if err != nil {
			t.Errorf("session %d (id %d): Lock of the lock stranded by holder %d: got %v; want <nil>", i, id, i+1, err)
			continue
		}
		if got := m.Fence(); got != 11 {
			t.Errorf("session %d: fence: got %d; want 11", i, got)
		}
		mustUnlock(t, m, bg)
	}
}

// ddlCounts returns the server's counts of CREATE, ALTER and DROP TABLE
// statements.
func ddlCounts(t *testing.T, db *sql.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_create_table', 'Com_alter_table', 'Com_drop_table')")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	counts := make(map[string]int64)
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		counts[strings.ToLower(name)] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(counts) != 3 {
		t.Fatalf("DDL counters: got %v; want 3", counts)
	}
	return counts
}

// TestNewSessionRunsNoDDLWhenTablesExist proves that NewSession creates the
// tables when they are missing, runs no DDL at all when they exist, and
// that many processes starting at once on a fresh prefix all succeed. (No
// test of this package runs in parallel with it, so the server's counters
// move only by what it does.)
func TestNewSessionRunsNoDDLWhenTablesExist(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("ddl")
	tables := func(prefix string) int {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
			prefix+"%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	before := ddlCounts(t, db)
	sessionOn(t, db, dsync.WithTablePrefix(prefix))
	after := ddlCounts(t, db)
	if got := after["com_create_table"] - before["com_create_table"]; got < 6 {
		t.Errorf("CREATE TABLE statements of the first NewSession on a fresh prefix: got %d; want at least 6", got)
	}
	if got := tables(prefix); got != 7 {
		t.Errorf("tables of the fresh prefix: got %d; want 7", got)
	}

	for i := range 5 {
		s, err := dsync.NewSession(context.Background(), db, dsync.WithTablePrefix(prefix))
		if err != nil {
			t.Fatalf("NewSession %d: got %v; want <nil>", i, err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: got %v; want <nil>", err)
		}
	}
	if got := ddlCounts(t, db); !maps.Equal(got, after) {
		t.Errorf("DDL counters across 5 NewSession with the tables present: got %v; want %v (unchanged)", got, after)
	}

	// 40 processes (each its own *sql.DB) start at once on a fresh prefix.
	const starters = 40
	fresh := freshPrefix("ddl")
	dbs := make([]*sql.DB, starters)
	for i := range dbs {
		dbs[i] = dbtest.Open(t)
	}
	errs := make([]error, starters)
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := dsync.NewSession(ctx, db, dsync.WithTablePrefix(fresh))
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent NewSession %d of %d on a fresh prefix: got %v; want <nil>", i+1, starters, err)
		}
	}
	if got := tables(fresh); got != 7 {
		t.Errorf("tables of the prefix created concurrently: got %d; want 7", got)
	}
}

// TestConcurrentReadersNeverSeeDeadlocks has readers of six sessions and a
// writer share one RWMutex, every call returning nil; then it forces a
// deadlock (1213) on a reader's ticket delete, which RUnlock must retry
// rather than return (a ticket left behind blocks writers).
func TestConcurrentReadersNeverSeeDeadlocks(t *testing.T) {
	const sessions, perSession, iterations, writes = 6, 2, 40, 20
	bg := context.Background()
	name := lockName(t)
	admin := dbtest.Open(t)
	deadlocks := func() int64 { return globalStatus(t, admin, "Innodb_deadlocks") }
	var readers, writers, overlaps atomic.Int32
	var wg sync.WaitGroup
	call := func(what string, f func(context.Context) error) bool {
		ctx, cancel := context.WithTimeout(bg, 30*time.Second)
		defer cancel()
		if err := f(ctx); err != nil {
			t.Errorf("%s: got %v; want <nil>", what, err)
			return false
		}
		return true
	}
	for range sessions {
		s := newSession(t)
		for range perSession {
			rw := dsync.NewRWMutex(s, name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range iterations {
					if !call("RLock", rw.RLock) {
						return
					}
					if readers.Add(1); writers.Load() != 0 {
						overlaps.Add(1)
					}
					readers.Add(-1)
					if !call("RUnlock", rw.RUnlock) {
						return
					}
				}
			}()
		}
	}
	w := dsync.NewRWMutex(newSession(t), name)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range writes {
			if !call("Lock", w.Lock) {
				return
			}
			if writers.Add(1); readers.Load() != 0 {
				overlaps.Add(1)
			}
			writers.Add(-1)
			if !call("Unlock", w.Unlock) {
				return
			}
		}
	}()
	wg.Wait()
	if got := overlaps.Load(); got != 0 {
		t.Errorf("a writer inside with readers: got %d times; want 0", got)
	}

	// Now a deadlock for sure: another transaction holds the primary key
	// of a reader's ticket, the reader's RUnlock (deleting the ticket
	// through name_ticket_idx) waits for it, and the transaction then asks
	// for the index entry the delete holds. InnoDB rolls back the lighter
	// transaction, the delete (the other one has written rows); RUnlock
	// must retry it and return nil once the transaction has ended.
	before := deadlocks()
	reader := dsync.NewRWMutex(newSession(t), name+"/forced")
	if !call("RLock", reader.RLock) {
		return
	}
	var ticket int64
	if err := admin.QueryRow("SELECT seq FROM dsync_ticket WHERE name = ?", reader.Name()).Scan(&ticket); err != nil {
		t.Fatal(err)
	}
	tx, err := admin.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var values []string
	var args []any
	for i := range 200 {
		values = append(values, "(?)")
		args = append(args, fmt.Sprintf("%s/weight/%d", name, i))
	}
	if _, err := tx.Exec("INSERT INTO dsync_lock (name) VALUES "+strings.Join(values, ", "), args...); err != nil {
		t.Fatal(err)
	}
	// An uncommitted ticket right behind the reader's (of no lease, so
	// dead): the delete locks the reader's ticket, then waits for this one
	// as it scans the name's tickets.
	if _, err := tx.Exec("INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, 0, 0, 1)",
		reader.Name(), ticket+1); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- reader.RUnlock(bg) }()
	// The delete, seen in the process list; the deadlock count checked
	// below proves the delete really waited.
	awaitStatement(t, admin, "DELETE FROM %dsync_ticket%WHERE name%", 5*time.Second, "RUnlock's delete never waited for the ticket's row")
	if _, err := tx.Exec("SELECT seq FROM dsync_ticket WHERE name = ? AND seq = ? FOR UPDATE", reader.Name(), ticket); err != nil {
		t.Fatalf("the other transaction's locking read: got %v; want <nil> (the delete the deadlock's victim)", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Errorf("RUnlock whose delete was a deadlock's victim: got %v; want <nil>", err)
	}
	if got := deadlocks() - before; got < 1 {
		t.Errorf("InnoDB deadlocks: got %d; want at least 1 (the test proves nothing)", got)
	}
	var left int
	if err := admin.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND seq = ?", reader.Name(), ticket).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("the reader's ticket after RUnlock: got %d rows; want 0", left)
	}
}

// TestDefaultBackOffStartsAt2ms checks the default polling policy against
// its documentation (2ms doubling to 100ms, ±50% jitter, no time limit),
// and that a waiter in another session therefore gets a released lock
// within milliseconds, not half a second.
func TestDefaultBackOffStartsAt2ms(t *testing.T) {
	bg := context.Background()
	sa, sb := newSession(t), newSession(t)
	b := dsync.NewBackOff(sa)
	interval := 2 * time.Millisecond
	for i := range 20 {
		d := b.NextBackOff()
		lo, hi := interval/2, interval*3/2+time.Millisecond/10
		if d < lo || d > hi {
			t.Fatalf("wait %d: got %v; want %v to %v (interval %v ±50%%)", i+1, d, lo, hi, interval)
		}
		interval = min(2*interval, 100*time.Millisecond)
	}

	// Handoff to a waiter in another session, 10 times.
	name := lockName(t)
	a, w := dsync.NewMutex(sa, name), dsync.NewMutex(sb, name)
	const rounds = 10
	var latencies []time.Duration
	for i := range rounds {
		mustLock(t, a, bg)
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			err := w.Lock(ctx)
			got <- time.Now()
			errc <- err
		}()
		for end := time.Now().Add(5 * time.Second); dsync.Acquiring(sb) == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the waiter never reached the database")
			}
		}
		time.Sleep(20 * time.Millisecond) // the waiter is between polls now
		released := time.Now()
		mustUnlock(t, a, bg)
		at := <-got
		if err := <-errc; err != nil {
			t.Fatalf("round %d: waiter's Lock: got %v; want <nil>", i+1, err)
		}
		latency := at.Sub(released)
		if latency > time.Second {
			t.Errorf("round %d: waiter's Lock returned %v after Unlock; want within 1s", i+1, latency)
		}
		latencies = append(latencies, latency)
		mustUnlock(t, w, bg)
	}
	slices.Sort(latencies)
	t.Logf("Unlock to the waiter's Lock: %v", latencies)
	// The old policy's first wait was 250-750ms, its median handoff ~500ms.
	if median := latencies[rounds/2]; median > 150*time.Millisecond {
		t.Errorf("median handoff to a waiting session: got %v; want at most 150ms", median)
	}
}

// TestMissingRowsDoNotResetFences deletes a name's lock row (Mutex) and
// queue row (FairMutex), as an operator might: fences must go on
// increasing, and a waiter must still get the lock.
func TestMissingRowsDoNotResetFences(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	t.Run("Mutex", func(t *testing.T) {
		name := lockName(t)
		m := dsync.NewMutex(newSession(t), name)
		var last int64
		for range 3 {
			mustLock(t, m, bg)
			last = m.Fence()
			mustUnlock(t, m, bg)
		}
		if _, err := db.Exec("DELETE FROM dsync_lock WHERE name = ?", name); err != nil {
			t.Fatal(err)
		}
		mustLock(t, m, bg)
		if got := m.Fence(); got <= last {
			t.Errorf("fence after the row was deleted: got %d; want > %d", got, last)
		}
		mustUnlock(t, m, bg)
	})
	t.Run("FairMutex", func(t *testing.T) {
		name := lockName(t)
		a, b := dsync.NewFairMutex(newSession(t), name), dsync.NewFairMutex(newSession(t), name)
		lockWithin(t, "A Lock", a, 5*time.Second)
		fa := a.Fence()
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(bg, 10*time.Second)
			defer cancel()
			errc <- b.Lock(ctx)
		}()
		waitTickets(t, db, name, 2)
		if _, err := db.Exec("DELETE FROM dsync_queue WHERE name = ?", name); err != nil {
			t.Fatal(err)
		}
		unlockNow(t, "A Unlock", a)
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("B's Lock after the queue row was deleted: got %v; want <nil>", err)
			}
		case <-time.After(5 * time.Second):
			<-errc
			t.Fatal("B's Lock after the queue row was deleted: still waiting after 5s; want the lock")
		}
		if got := b.Fence(); got <= fa {
			t.Errorf("B's fence: got %d; want > %d (A's)", got, fa)
		}
		unlockNow(t, "B Unlock", b)
	})
}

// TestRLockByWriteOwnerFailsAtOnce proves that an owner holding the write
// side of an RWMutex gets ErrLockDowngrade from RLock and TryRLock at once
// (waiting would deadlock), and keeps its write lock.
func TestRLockByWriteOwnerFailsAtOnce(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	rw := dsync.NewRWMutex(newSession(t), name)
	other := dsync.NewRWMutex(newSession(t), name)
	owner := dsync.WithOwner(bg)
	if err := rw.Lock(owner); err != nil {
		t.Fatalf("Lock: got %v; want <nil>", err)
	}
	ctx, cancel := context.WithTimeout(owner, 10*time.Second)
	defer cancel()
	start := time.Now()
	err := rw.RLock(ctx)
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("RLock by the write owner returned after %v; want within 1s", elapsed)
	}
	if !errors.Is(err, dsync.ErrLockDowngrade) {
		t.Fatalf("RLock by the write owner: got %v; want %v", err, dsync.ErrLockDowngrade)
	}
	start = time.Now()
	ok, err := rw.TryRLock(ctx)
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("TryRLock by the write owner returned after %v; want within 1s", elapsed)
	}
	if ok || !errors.Is(err, dsync.ErrLockDowngrade) {
		t.Fatalf("TryRLock by the write owner: got %v, %v; want false, %v", ok, err, dsync.ErrLockDowngrade)
	}
	if got := rw.Fence(); got <= 0 {
		t.Errorf("Fence of the write hold: got %d; want > 0", got)
	}
	wantTryLock(t, "another session's TryLock", other, false)
	if err := rw.Unlock(owner); err != nil {
		t.Fatalf("Unlock: got %v; want <nil>", err)
	}
	wantTryLock(t, "another session's TryLock after Unlock", other, true)
	unlockNow(t, "Unlock", other)
}

// TestErrChecksDeadlineWithoutKeepAlive moves the session's local deadline
// into the past, as a long pause of the process would, while the keep-alive
// goroutine sleeps (TTL 1 minute): Err, Done, Fence, Lock and Unlock must
// report the loss at once, by themselves.
func TestErrChecksDeadlineWithoutKeepAlive(t *testing.T) {
	bg := context.Background()
	s := newSession(t, dsync.WithTTL(time.Minute))
	name := lockName(t)
	m := dsync.NewMutex(s, name)
	mustLock(t, m, bg)
	if m.Fence() <= 0 {
		t.Fatalf("Fence: got %d; want > 0", m.Fence())
	}

	dsync.ExpireLocally(s)
	if err := s.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Err past the deadline: got %v; want %v", err, dsync.ErrSessionExpired)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done past the deadline: got open; want closed")
	}
	if got := m.Fence(); got != 0 {
		t.Errorf("Fence of the hold past the deadline: got %d; want 0", got)
	}
	if err := dsync.NewMutex(s, name+"/other").Lock(bg); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("Lock past the deadline: got %v; want %v", err, dsync.ErrSessionExpired)
	}
	if ok, err := dsync.NewMutex(s, name+"/other").TryLock(bg); ok || !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("TryLock past the deadline: got %v, %v; want false, %v", ok, err, dsync.ErrSessionExpired)
	}
	if err := m.Unlock(bg); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("Unlock past the deadline: got %v; want %v", err, dsync.ErrSessionExpired)
	}
}

// TestLockInFlightWhenSessionEnds has a Lock wait (polling without pause,
// so that a statement is nearly always on the wire) while its session is
// closed and, just after Close started, the holder releases: the Lock must
// return ErrSessionClosed, never nil, and leave the lock free.
func TestLockInFlightWhenSessionEnds(t *testing.T) {
	type lock interface {
		fencedLock
		tryLocker
	}
	tests := []struct {
		name    string
		new     func(*dsync.Session, string) lock
		waiting func(t *testing.T, db *sql.DB, s *dsync.Session, name string)
	}{
		{"Mutex", func(s *dsync.Session, n string) lock { return dsync.NewMutex(s, n) },
			func(t *testing.T, _ *sql.DB, s *dsync.Session, _ string) {
				for end := time.Now().Add(5 * time.Second); dsync.Acquiring(s) == 0; time.Sleep(time.Millisecond) {
					if time.Now().After(end) {
						t.Fatal("the waiter never reached the database")
					}
				}
			}},
		{"FairMutex", func(s *dsync.Session, n string) lock { return dsync.NewFairMutex(s, n) },
			awaitTicketOf},
	}
	noPause := func() backoff.BackOff { return &backoff.ZeroBackOff{} }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := context.Background()
			db := dbtest.Open(t)
			name := lockName(t)
			holder := tt.new(newSession(t), name)
			third := tt.new(newSession(t), name)
			for round := range 20 {
				lockWithin(t, "holder's Lock", holder, 5*time.Second)
				ws := sessionOn(t, db, dsync.WithBackOff(noPause))
				w := tt.new(ws, name)
				errc := make(chan error, 1)
				go func() {
					ctx, cancel := context.WithTimeout(bg, 10*time.Second)
					defer cancel()
					errc <- w.Lock(ctx)
				}()
				tt.waiting(t, db, ws, name)
				closed := make(chan error, 1)
				go func() { closed <- ws.Close() }()
				<-ws.Done()
				unlockNow(t, "holder's Unlock", holder)
				if err := <-errc; !errors.Is(err, dsync.ErrSessionClosed) {
					t.Errorf("round %d: Lock waiting when Close was called: got %v; want %v", round+1, err, dsync.ErrSessionClosed)
				}
				if err := <-closed; err != nil {
					t.Fatalf("round %d: Close: got %v; want <nil>", round+1, err)
				}
				if got := w.Fence(); got != 0 {
					t.Errorf("round %d: Fence after Close: got %d; want 0", round+1, got)
				}
				wantTryLock(t, fmt.Sprintf("round %d: third session's TryLock", round+1), third, true)
				unlockNow(t, "third session's Unlock", third)
			}
		})
	}
}

// TestLockWaitingForConnectionWhenSessionEnds: Locks blocked waiting for one
// of the session's connections when the session is closed return at once
// (they used to wait until their ctx ended, or forever without one).
func TestLockWaitingForConnectionWhenSessionEnds(t *testing.T) {
	bg := context.Background()
	other := newSession(t)
	base := lockName(t)
	const names = 4
	for i := range names {
		mustLock(t, dsync.NewMutex(other, fmt.Sprintf("%s/%d", base, i)), bg)
	}
	stuck := 0
	for round := range 10 {
		db := dbtest.Open(t)
		db.SetMaxOpenConns(4) // the session keeps 1 connection
		s, err := dsync.NewSession(bg, db, dsync.WithBackOff(func() backoff.BackOff { return &backoff.ZeroBackOff{} }))
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, names)
		for i := range names {
			go func() {
				ctx, cancel := context.WithTimeout(bg, 20*time.Second)
				defer cancel()
				errc <- dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i)).Lock(ctx)
			}()
		}
		time.Sleep(20 * time.Millisecond)
		s.Close()
		start := time.Now()
		for range names {
			err := <-errc
			if d := time.Since(start); d > 2*time.Second {
				stuck++
				t.Errorf("round %d: Lock returned %v only %v after Close returned", round, err, d)
			}
		}
		db.Close()
	}
	t.Logf("stuck rounds: %d", stuck)
}

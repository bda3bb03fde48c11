package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// The tests of the clean-up of free rows (WithFreeRowAge). Each uses a
// table prefix of its own, so its sweeper meets no other test's rows and
// its row counts are its own.

// countRows returns the result of a COUNT(*) query.
func countRows(t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitRows waits until the COUNT(*) query returns want, and fails the test
// when it has not within limit.
func waitRows(t *testing.T, db *sql.DB, limit time.Duration, want int, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		got := countRows(t, db, query, args...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %v: got %d after %v; want %d", query, args, got, limit, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitPasses waits until s has run n more sweep passes than it had at from.
func waitPasses(t *testing.T, s *dsync.Session, from, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for dsync.SweepPasses(s) < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("sweep passes: got %d after 30s; want %d", dsync.SweepPasses(s)-from, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sweepLock is what the sweep tests need of Mutex, FairMutex and the
// write side of RWMutex.
type sweepLock interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Fence() int64
}

// TestSweepDeletesFreeRows locks a few thousand names once each (Mutex,
// FairMutex, RWMutex read and write) and checks that the sweep deletes
// their rows, and a row whose holder's lease is gone, but none of the rows
// of a held lock, of a lock with a waiter queued, or of a read-held lock;
// and that a row freed last goes no sooner than the age after its Unlock.
func TestSweepDeletesFreeRows(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("sweep")
	const age = 2 * time.Second
	sweeper := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(age, 100*time.Millisecond))
	holder := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	other := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	lockTable, queueTable := "`"+prefix+"lock`", "`"+prefix+"queue`"

	// Rows that must stay.
	held := dsync.NewMutex(holder, "keep/mutex")
	lockWithin(t, "Lock of the held Mutex", held, 10*time.Second)
	fair := dsync.NewFairMutex(holder, "keep/fair")
	lockWithin(t, "Lock of the held FairMutex", fair, 10*time.Second)
	reader := dsync.NewRWMutex(holder, "keep/read")
	if err := reader.RLock(bg); err != nil {
		t.Fatalf("RLock: got %v; want <nil>", err)
	}
	waitCtx, stopWaiting := context.WithCancel(bg)
	waited := make(chan error, 1)
	go func() { waited <- dsync.NewFairMutex(other, "keep/fair").Lock(waitCtx) }()
	defer func() {
		stopWaiting()
		<-waited
	}()

	// A row whose holder's lease is gone (a crashed process, its lease
	// purged) is free, and goes.
	crashed := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	lockWithin(t, "Lock by the crashed session", dsync.NewMutex(crashed, "gone/crashed"), 10*time.Second)
	if _, err := db.Exec("DELETE FROM `"+prefix+"lease` WHERE id = ?", crashed.ID()); err != nil {
		t.Fatal(err)
	}

	// The bulk: names locked once each, by a few goroutines.
	const mutexes, fairs, reads, writes = 1200, 400, 400, 400
	type job struct {
		kind string
		i    int
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				ctx, cancel := context.WithTimeout(bg, 10*time.Second)
				name := fmt.Sprintf("bulk/%s/%05d", j.kind, j.i)
				var err error
				switch j.kind {
				case "mutex":
					m := dsync.NewMutex(sweeper, name)
					if err = m.Lock(ctx); err == nil {
						err = m.Unlock(ctx)
					}
				case "fair":
					m := dsync.NewFairMutex(sweeper, name)
					if err = m.Lock(ctx); err == nil {
						err = m.Unlock(ctx)
					}
				case "read":
					m := dsync.NewRWMutex(sweeper, name)
					if err = m.RLock(ctx); err == nil {
						err = m.RUnlock(ctx)
					}
				case "write":
					m := dsync.NewRWMutex(sweeper, name)
					if err = m.Lock(ctx); err == nil {
						err = m.Unlock(ctx)
					}
				}
				cancel()
				if err != nil {
					select {
					case errs <- fmt.Errorf("%s: %w", name, err):
					default:
					}
				}
			}
		}()
	}
	start := time.Now()
	for kind, n := range map[string]int{"mutex": mutexes, "fair": fairs, "read": reads, "write": writes} {
		for i := range n {
			jobs <- job{kind, i}
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("lock and unlock a bulk name: got %v; want <nil>", err)
	}
	t.Logf("%d names locked once each in %v", mutexes+fairs+reads+writes, time.Since(start))

	// The rows of one Mutex and one FairMutex freed last.
	lastFreed := make(map[string]time.Time)
	for _, l := range []sweepLock{dsync.NewMutex(sweeper, "last/mutex"), dsync.NewFairMutex(sweeper, "last/fair")} {
		lockWithin(t, "Lock", l, 10*time.Second)
		lastFreed[l.(interface{ Name() string }).Name()] = time.Now() // before the row is freed
		unlockNow(t, "Unlock", l)
	}

	limit := 4*age + 20*time.Second // generous: the box is shared
	waitRows(t, db, limit, 0, "SELECT COUNT(*) FROM "+lockTable+" WHERE name LIKE 'bulk/%' OR name = 'gone/crashed'")
	waitRows(t, db, limit, 0, "SELECT COUNT(*) FROM "+queueTable+" WHERE name LIKE 'bulk/%'")
	for name, freed := range lastFreed {
		table := lockTable
		if name == "last/fair" {
			table = queueTable
		}
		for countRows(t, db, "SELECT COUNT(*) FROM "+table+" WHERE name = ?", name) > 0 {
			if time.Since(freed) > limit {
				t.Fatalf("row of %s: still there %v after its Unlock; want it deleted", name, limit)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if gone := time.Since(freed); gone < age {
			t.Errorf("row of %s: deleted %v after its Unlock began; want no sooner than the age, %v", name, gone, age)
		} else {
			t.Logf("row of %s: deleted %v after its Unlock began (age %v)", name, gone, age)
		}
	}

	// The kept rows are there, held as they were.
	var holderID int64
	if err := db.QueryRow("SELECT holder FROM " + lockTable + " WHERE name = 'keep/mutex'").Scan(&holderID); err != nil {
		t.Fatalf("row of the held Mutex: got %v; want it kept", err)
	}
	if holderID != holder.ID() {
		t.Errorf("holder of the held Mutex's row: got %d; want %d", holderID, holder.ID())
	}
	for _, name := range []string{"keep/fair", "keep/read"} {
		if n := countRows(t, db, "SELECT COUNT(*) FROM "+queueTable+" WHERE name = ?", name); n != 1 {
			t.Errorf("queue row of %s: got %d rows; want 1 (kept)", name, n)
		}
	}
	wantTryLock(t, "TryLock of the held Mutex by another session", dsync.NewMutex(other, "keep/mutex"), false)
	wantTryLock(t, "TryLock of the read-held RWMutex by another session", dsync.NewRWMutex(other, "keep/read"), false)
	if n := dsync.SweepPasses(sweeper); n < 2 {
		t.Errorf("sweep passes of the sweeping session: got %d; want at least 2", n)
	}
	unlockNow(t, "Unlock of the held Mutex", held)
	unlockNow(t, "Unlock of the held FairMutex", fair)
	if err := reader.RUnlock(bg); err != nil {
		t.Errorf("RUnlock: got %v; want <nil>", err)
	}
}

// TestSweepFencesAcrossDeletion locks names several times, lets the sweep
// delete their rows (counting them to prove it), and locks them again: the
// new fence must be above every earlier one, for Mutex, FairMutex and the
// RWMutex writer. A second round first moves a row's fence far above the
// database's clock (as a node whose clock runs ahead would seed it): the
// fence recorded before the delete, not the clock, must carry the next
// fence above it.
func TestSweepFencesAcrossDeletion(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	db := dbtest.Open(t)
	prefix := freshPrefix("sweepfence")
	s := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(300*time.Millisecond, 50*time.Millisecond))
	tables := map[string]string{"Mutex": "`" + prefix + "lock`", "FairMutex": "`" + prefix + "queue`", "RWMutex": "`" + prefix + "queue`"}
	locks := map[string]func(name string) sweepLock{
		"Mutex":     func(name string) sweepLock { return dsync.NewMutex(s, name) },
		"FairMutex": func(name string) sweepLock { return dsync.NewFairMutex(s, name) },
		"RWMutex":   func(name string) sweepLock { return dsync.NewRWMutex(s, name) },
	}
	for kind, newLock := range locks {
		t.Run(kind, func(t *testing.T) {
			table := tables[kind]
			name := lockName(t)
			l := newLock(name)
			var last int64
			for round, ahead := range []int64{0, 1e12} { // 1e12µs: 11.6 days
				for range 3 {
					lockWithin(t, "Lock", l, 10*time.Second)
					if f := l.Fence(); f <= last {
						t.Fatalf("round %d: fence %d; want above %d", round, f, last)
					}
					last = l.Fence()
					unlockNow(t, "Unlock", l)
				}
				if ahead > 0 {
					last += ahead
					if _, err := db.Exec("UPDATE "+table+" SET fence = ? WHERE name = ?", last, name); err != nil {
						t.Fatal(err)
					}
				}
				waitRows(t, db, 30*time.Second, 0, "SELECT COUNT(*) FROM "+table+" WHERE name = ?", name)
				lockWithin(t, "Lock after the row was deleted", l, 10*time.Second)
				if f := l.Fence(); f <= last {
					t.Errorf("round %d: fence after the row was deleted: got %d; want above %d", round, f, last)
				} else {
					t.Logf("round %d: fence %d after the row was deleted, last before %d", round, f, last)
				}
				last = l.Fence()
				unlockNow(t, "Unlock", l)
			}
		})
	}
}

// TestSweepKeepsLiveHolder holds a Mutex, a FairMutex and an RWMutex's
// write side through many passes of a sweep with a tiny age: their rows
// stay, with their holder and fence, and another session cannot take them;
// once unlocked they go.
func TestSweepKeepsLiveHolder(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("sweeplive")
	sweeper := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(20*time.Millisecond, 10*time.Millisecond))
	holder := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	other := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	lockTable, queueTable := "`"+prefix+"lock`", "`"+prefix+"queue`"

	m, f, w := dsync.NewMutex(holder, "live/mutex"), dsync.NewFairMutex(holder, "live/fair"), dsync.NewRWMutex(holder, "live/rw")
	held := []sweepLock{m, f, w}
	fences := make([]int64, len(held))
	for i, l := range held {
		lockWithin(t, "Lock", l, 10*time.Second)
		fences[i] = l.Fence()
	}
	waitPasses(t, sweeper, dsync.SweepPasses(sweeper), 20)

	var holderID, fence int64
	if err := db.QueryRow("SELECT holder, fence FROM "+lockTable+" WHERE name = 'live/mutex'").Scan(&holderID, &fence); err != nil {
		t.Fatalf("row of the held Mutex: got %v; want it kept", err)
	}
	if holderID != holder.ID() || fence != fences[0] {
		t.Errorf("row of the held Mutex: got holder %d, fence %d; want %d, %d", holderID, fence, holder.ID(), fences[0])
	}
	for i, name := range []string{"live/fair", "live/rw"} {
		if err := db.QueryRow("SELECT fence FROM "+queueTable+" WHERE name = ?", name).Scan(&fence); err != nil {
			t.Fatalf("queue row of %s: got %v; want it kept", name, err)
		}
		if fence != fences[i+1] {
			t.Errorf("queue row of %s: got fence %d; want %d", name, fence, fences[i+1])
		}
	}
	wantTryLock(t, "TryLock of the held Mutex by another session", dsync.NewMutex(other, "live/mutex"), false)
	wantTryLock(t, "TryLock of the held FairMutex by another session", dsync.NewFairMutex(other, "live/fair"), false)
	wantTryLock(t, "TryLock of the held RWMutex by another session", dsync.NewRWMutex(other, "live/rw"), false)
	for i, l := range held {
		if got := l.Fence(); got != fences[i] {
			t.Errorf("Fence of hold %d: got %d; want %d", i, got, fences[i])
		}
		unlockNow(t, "Unlock after the passes", l)
	}
	// Now free, the rows go: the sweep could have deleted them all along.
	waitRows(t, db, 30*time.Second, 0, "SELECT COUNT(*) FROM "+lockTable+" WHERE name LIKE 'live/%'")
	waitRows(t, db, 30*time.Second, 0, "SELECT COUNT(*) FROM "+queueTable+" WHERE name LIKE 'live/%'")
}

// TestSweepRaces runs goroutines of three sessions, all sweeping with a
// tiny age, that lock and unlock a few names of every kind for a few
// seconds with pauses, so that rows are deleted and created again under
// the traffic: no two holders may ever overlap, and the fences of each
// name, in lock order, must increase strictly. A name touched every 300ms
// proves that rows were deleted meanwhile (its fence jumps each time its
// row is created again).
func TestSweepRaces(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("sweeprace")
	var sessions []*dsync.Session
	for range 3 {
		sessions = append(sessions, sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(30*time.Millisecond, 10*time.Millisecond)))
	}

	type name struct {
		kind, name string
		mu         sync.Mutex // guards fences
		fences     []int64    // in lock order
		holders    atomic.Int32
		readers    atomic.Int32
	}
	var names []*name
	for i := range 3 {
		names = append(names, &name{kind: "Mutex", name: fmt.Sprintf("race/mutex/%d", i)})
	}
	for i := range 2 {
		names = append(names, &name{kind: "FairMutex", name: fmt.Sprintf("race/fair/%d", i)})
	}
	names = append(names, &name{kind: "RWMutex", name: "race/rw"})
	cold := &name{kind: "Mutex", name: "race/cold"}

	var overlaps atomic.Int32
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	exclusive := func(n *name, l sweepLock) {
		if n.holders.Add(1) != 1 || n.readers.Load() != 0 {
			overlaps.Add(1)
		}
		n.mu.Lock()
		n.fences = append(n.fences, l.Fence())
		n.mu.Unlock()
		time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
		n.holders.Add(-1)
	}
	end := time.Now().Add(4 * time.Second)
	var wg sync.WaitGroup
	for w := range 6 {
		s := sessions[w%len(sessions)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && failed.Load() == nil {
				n := names[rand.N(len(names))]
				ctx, cancel := context.WithTimeout(bg, 20*time.Second)
				var err error
				switch {
				case n.kind == "Mutex":
					l := dsync.NewMutex(s, n.name)
					if err = l.Lock(ctx); err == nil {
						exclusive(n, l)
						err = l.Unlock(ctx)
					}
				case n.kind == "FairMutex":
					l := dsync.NewFairMutex(s, n.name)
					if err = l.Lock(ctx); err == nil {
						exclusive(n, l)
						err = l.Unlock(ctx)
					}
				case rand.N(3) == 0: // the RWMutex's writer
					l := dsync.NewRWMutex(s, n.name)
					if err = l.Lock(ctx); err == nil {
						exclusive(n, l)
						err = l.Unlock(ctx)
					}
				default: // its readers
					l := dsync.NewRWMutex(s, n.name)
					if err = l.RLock(ctx); err == nil {
						n.readers.Add(1)
						if n.holders.Load() != 0 {
							overlaps.Add(1)
						}
						time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
						n.readers.Add(-1)
						err = l.RUnlock(ctx)
					}
				}
				cancel()
				if err != nil {
					fail(fmt.Errorf("%s %s: %w", n.kind, n.name, err))
					return
				}
				time.Sleep(time.Duration(rand.N(60)) * time.Millisecond)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		l := dsync.NewMutex(sessions[0], cold.name)
		for time.Now().Before(end) && failed.Load() == nil {
			ctx, cancel := context.WithTimeout(bg, 20*time.Second)
			err := l.Lock(ctx)
			if err == nil {
				exclusive(cold, l)
				err = l.Unlock(ctx)
			}
			cancel()
			if err != nil {
				fail(fmt.Errorf("Mutex %s: %w", cold.name, err))
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("lock and unlock under the sweep: got %v; want <nil>", *err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("holders overlapping: got %d; want 0", n)
	}
	for _, n := range append(names, cold) {
		recreated := 0
		for i := 1; i < len(n.fences); i++ {
			if n.fences[i] <= n.fences[i-1] {
				t.Errorf("%s %s: fence %d after %d (acquisitions %d and %d); want strictly increasing",
					n.kind, n.name, n.fences[i], n.fences[i-1], i-1, i)
			}
			if n.fences[i] > n.fences[i-1]+1 {
				recreated++ // only a row created anew skips fences
			}
		}
		t.Logf("%s %s: %d acquisitions, row created again %d times", n.kind, n.name, len(n.fences), recreated)
		if n == cold && recreated == 0 {
			t.Errorf("%s: row never created again in %d acquisitions 300ms apart; want the sweep to delete it between them",
				n.name, len(n.fences))
		}
	}
	var passes int64
	for _, s := range sessions {
		passes += dsync.SweepPasses(s)
	}
	t.Logf("sweep passes: %d", passes)
}

// TestFreeRowAgeZero checks that a session made WithFreeRowAge(0) deletes
// nothing, not even rows marked free long ago, and that a sweeping session
// would have deleted them.
func TestFreeRowAgeZero(t *testing.T) {
	slowTest(t)
	db := dbtest.Open(t)
	prefix := freshPrefix("sweepoff")
	s := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	lockTable := "`" + prefix + "lock`"
	for i := range 10 {
		m := dsync.NewMutex(s, fmt.Sprintf("off/%d", i))
		lockWithin(t, "Lock", m, 10*time.Second)
		unlockNow(t, "Unlock", m)
	}
	// As a sweep would have marked them two hours ago.
	if _, err := db.Exec("UPDATE " + lockTable + " SET idle_since = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, idle_fence = fence"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := countRows(t, db, "SELECT COUNT(*) FROM "+lockTable); n != 10 {
		t.Errorf("rows after 1s with clean-up off: got %d; want 10", n)
	}
	if n := dsync.SweepPasses(s); n != 0 {
		t.Errorf("sweep passes with clean-up off: got %d; want 0", n)
	}
	sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(time.Hour, 50*time.Millisecond))
	waitRows(t, db, 30*time.Second, 0, "SELECT COUNT(*) FROM "+lockTable)
}

// TestFreeRowAgeInvalid checks that NewSession refuses a negative age, or
// one between 0 and 1s, with an error that says so.
func TestFreeRowAgeInvalid(t *testing.T) {
	db := dbtest.Open(t)
	for _, age := range []time.Duration{-time.Second, -1, time.Millisecond, time.Second - 1} {
		s, err := dsync.NewSession(context.Background(), db, dsync.WithFreeRowAge(age))
		if s != nil {
			s.Close()
		}
		if !errors.Is(err, dsync.ErrInvalidOption) || !strings.Contains(err.Error(), "free-row age") {
			t.Errorf("NewSession WithFreeRowAge(%v): got %v; want ErrInvalidOption naming the free-row age", age, err)
		}
	}
}

// TestSweepElection runs two sweeping sessions on the same tables for 3s:
// the election lets at most one pass start per interval between them (each
// asks four times per interval), and some passes run.
func TestSweepElection(t *testing.T) {
	slowTest(t)
	db := dbtest.Open(t)
	prefix := freshPrefix("sweepelect")
	const every, window = 200 * time.Millisecond, 3 * time.Second
	a := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(time.Hour, every))
	b := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithSweep(time.Hour, every))
	fromA, fromB := dsync.SweepPasses(a), dsync.SweepPasses(b)
	time.Sleep(window)
	passA, passB := dsync.SweepPasses(a)-fromA, dsync.SweepPasses(b)-fromB
	t.Logf("passes in %v, interval %v: %d and %d", window, every, passA, passB)
	if most := int64(window/every) + 2; passA+passB > most {
		t.Errorf("passes of two sessions in %v: got %d + %d; want at most %d, one per interval", window, passA, passB, most)
	}
	if passA+passB < 3 {
		t.Errorf("passes of two sessions in %v: got %d + %d; want at least 3", window, passA, passB)
	}
}

// TestPurge runs the reaper's purge (every 10 minutes in a session) on
// rows written by hand: it deletes a lease that ended over an hour ago,
// the tickets of leases that are gone (that one's too) and a marker whose
// ticket is gone, and keeps a live session's ticket, a marker behind it,
// and a lease that ended minutes ago with its ticket.
func TestPurge(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("purge")
	s := sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	const markerBase = 1 << 62
	gone, old, recent := s.ID()+1_000_001, s.ID()+1_000_002, s.ID()+1_000_003
	for _, l := range []struct {
		id  int64
		ago string
	}{{old, "2 HOUR"}, {recent, "10 MINUTE"}} {
		if _, err := db.ExecContext(bg, "INSERT INTO `"+prefix+"lease` (id, label, created_at, expires_at) VALUES (?, 'test', UTC_TIMESTAMP(6) - INTERVAL 3 HOUR, UTC_TIMESTAMP(6) - INTERVAL "+l.ago+")", l.id); err != nil {
			t.Fatal(err)
		}
	}
	type ticket struct {
		name   string
		seq    int64
		holder int64
	}
	all := []ticket{
		{"gone", 1, gone}, {"gone", 2, gone}, // a lease row that is gone
		{"old", 1, old},                                  // a lease that ended over an hour ago
		{"marker", markerBase + 5, 0},                    // a marker whose ticket is gone
		{"live", 1, s.ID()}, {"live", markerBase + 1, 0}, // a live ticket and its marker
		{"recent", 1, recent}, // a lease that ended minutes ago
	}
	for _, tk := range all {
		if _, err := db.ExecContext(bg, "INSERT INTO `"+prefix+"ticket` (name, seq, holder, token, mode) VALUES (?, ?, ?, 1, 0)", tk.name, tk.seq, tk.holder); err != nil {
			t.Fatal(err)
		}
	}
	dsync.Purge(s)
	rows, err := db.QueryContext(bg, "SELECT name, seq, holder FROM `"+prefix+"ticket` ORDER BY name, seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []ticket
	for rows.Next() {
		var tk ticket
		if err := rows.Scan(&tk.name, &tk.seq, &tk.holder); err != nil {
			t.Fatal(err)
		}
		left = append(left, tk)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []ticket{{"live", 1, s.ID()}, {"live", markerBase + 1, 0}, {"recent", 1, recent}}
	if !slices.Equal(left, want) {
		t.Errorf("tickets after the purge: got %v; want %v", left, want)
	}
	var oldLeft, recentLeft int
	if err := db.QueryRowContext(bg, "SELECT SUM(id = ?), SUM(id = ?) FROM `"+prefix+"lease`", old, recent).Scan(&oldLeft, &recentLeft); err != nil {
		t.Fatal(err)
	}
	if oldLeft != 0 || recentLeft != 1 {
		t.Errorf("leases after the purge: got %d of the one that ended over an hour ago, %d of the recent one; want 0 and 1", oldLeft, recentLeft)
	}
}

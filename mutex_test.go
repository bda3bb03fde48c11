package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

func TestMain(m *testing.M) {
	// Every session's first purge (reaper.purge, at a random moment of its
	// first minute; then every 10 minutes) is put off by an hour, in the
	// child processes too: the tests that count the server's statements
	// over a few seconds (idleStatements, checkRate) would count one as
	// polling (a connection's settings, a delete, a read, and a delete per
	// orphaned ticket, of which earlier tests leave many). TestPurge runs
	// the purge itself.
	dsync.PurgeLater()
	if child := os.Getenv(childEnv); child != "" {
		os.Exit(runChild(child))
	}
	stop, err := dbtest.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { stop() }))
}

// newSession returns a session on the test database, closed when the test ends.
func newSession(t testing.TB, opts ...dsync.Option) *dsync.Session {
	t.Helper()
	s, err := dsync.NewSession(context.Background(), dbtest.Open(t), opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// slowTest skips t under -short. make test runs every test; make
// test-oldest-go, which runs the suite again with the oldest Go release the
// module supports, passes -short to leave out these slowest ones (each
// takes from 1 to 35 seconds, mostly waiting), so that CI stays within its
// time budget.
func slowTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow; make test runs it (without -short)")
	}
}

// lockName returns a lock name unique to the test.
func lockName(t testing.TB) string { return t.Name() + "/" + fmt.Sprint(time.Now().UnixNano()) }

func TestMutexLockUnlock(t *testing.T) {
	ctx := context.Background()
	s1, s2 := newSession(t), newSession(t)
	name := lockName(t)
	m1, m2 := dsync.NewMutex(s1, name), dsync.NewMutex(s2, name)

	if err := m1.Lock(ctx); err != nil {
		t.Fatalf("Lock: got %v; want nil", err)
	}
	f1 := m1.Fence()
	if f1 <= 0 {
		t.Fatalf("Fence: got %d; want > 0", f1)
	}
	if ok, err := m2.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while held elsewhere: got %v, %v; want false, nil", ok, err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
	if got := m1.Fence(); got != 0 {
		t.Fatalf("Fence after Unlock: got %d; want 0", got)
	}
	if ok, err := m2.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after Unlock: got %v, %v; want true, nil", ok, err)
	}
	if f2 := m2.Fence(); f2 <= f1 {
		t.Fatalf("second fence: got %d; want > %d", f2, f1)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
	if err := m2.Unlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("second Unlock: got %v; want ErrNotHeld", err)
	}
}

func TestMutexOwnerReentrant(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	m := dsync.NewMutex(newSession(t), name)
	other := dsync.NewMutex(newSession(t), name)
	owner := dsync.WithOwner(bg)

	mustLock(t, m, owner)
	fence := m.Fence()
	mustLock(t, m, owner) // reentrant: returns at once
	if got := m.Fence(); got != fence {
		t.Fatalf("Fence after reentrant Lock: got %d; want %d", got, fence)
	}
	mustUnlock(t, m, owner)
	if ok, err := other.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock after 1 of 2 Unlocks: got %v, %v; want false, nil", ok, err)
	}
	mustUnlock(t, m, owner)
	if ok, err := other.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock after 2 of 2 Unlocks: got %v, %v; want true, nil", ok, err)
	}
	mustUnlock(t, other, bg)
	if err := m.Unlock(owner); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("third Unlock: got %v; want ErrNotHeld", err)
	}
}

func TestMutexWithoutOwnerAnyGoroutineUnlocks(t *testing.T) {
	bg := context.Background()
	s := newSession(t)
	m := dsync.NewMutex(s, lockName(t))
	mustLock(t, m, bg)
	// Like sync.Mutex: the lock is not tied to a goroutine, and any context
	// (even one with an owner) may unlock it.
	errc := make(chan error)
	go func() { errc <- m.Unlock(dsync.WithOwner(bg)) }()
	if err := <-errc; err != nil {
		t.Fatalf("Unlock from another goroutine: got %v; want nil", err)
	}
	// Two Mutex values with one name in one session are one lock.
	twin := dsync.NewMutex(s, m.Name())
	mustLock(t, twin, bg)
	if ok, err := m.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock of the twin: got %v, %v; want false, nil", ok, err)
	}
	mustUnlock(t, m, bg)
}

// TestMutexLocalWaitersShareOneDatabaseWaiter has 8 goroutines of one
// session wait for a lock another session holds: one of them waits on the
// database, the others in the process; all get it in turn.
func TestMutexLocalWaitersShareOneDatabaseWaiter(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	holder := dsync.NewMutex(newSession(t), name)
	mustLock(t, holder, bg)

	s := newSession(t)
	const waiters = 8
	var inside, maxInside atomic.Int32
	errc := make(chan error, waiters)
	for i := 0; i < waiters; i++ {
		go func() {
			m := dsync.NewMutex(s, name)
			if err := m.Lock(bg); err != nil {
				errc <- err
				return
			}
			n := inside.Add(1)
			for old := maxInside.Load(); n > old && !maxInside.CompareAndSwap(old, n); old = maxInside.Load() {
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			errc <- m.Unlock(bg)
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for dsync.Acquiring(s) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let every waiter reach its wait
	if got := dsync.Acquiring(s); got != 1 {
		t.Fatalf("goroutines waiting on the database: got %d; want 1", got)
	}
	mustUnlock(t, holder, bg)
	for i := 0; i < waiters; i++ {
		if err := <-errc; err != nil {
			t.Fatalf("waiter: %v", err)
		}
	}
	if got := maxInside.Load(); got != 1 {
		t.Fatalf("goroutines inside the critical section at once: got %d; want 1", got)
	}
}

// TestAcquireStatementCases drives the one-statement acquire through every
// state of an existing row by editing the tables directly.
func TestAcquireStatementCases(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	other := newSession(t)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	type row struct{ holder, token, fence int64 }
	read := func(name string) row {
		t.Helper()
		var r row
		if err := db.QueryRow("SELECT holder, token, fence FROM dsync_lock WHERE name = ?", name).Scan(&r.holder, &r.token, &r.fence); err != nil {
			t.Fatal(err)
		}
		return r
	}
	const dead = 1<<40 + 1
	exec("INSERT INTO dsync_lease (id, label, created_at, expires_at) VALUES (?, 'dead', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)", dead)

	tests := []struct {
		name   string
		holder int64 // holder to write into the row before the attempt; -1: no row
		want   bool
	}{
		{"no row", -1, true},
		{"free row", 0, true},
		{"held by a live session", other.ID(), false},
		{"held by an ended lease", dead, true},
		{"held by a deleted lease", 1 << 40, true},
		// An attempt that landed late: freed by the session in the background
		// (by its token), never taken over, so it cannot overwrite a later hold.
		{"held by this session with an unknown token", s.ID(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := lockName(t)
			const oldFence, oldToken = 41, 7
			if tt.holder >= 0 {
				exec("INSERT INTO dsync_lock (name, holder, token, fence) VALUES (?, ?, ?, ?)", name, tt.holder, oldToken, oldFence)
			}
			m := dsync.NewMutex(s, name)
			var seed int64 // a new row's fence is at least the server's UTC clock in µs
			if err := db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").Scan(&seed); err != nil {
				t.Fatal(err)
			}
			ok, err := m.TryLock(bg)
			if ok != tt.want || err != nil {
				t.Fatalf("TryLock: got %v, %v; want %v, nil", ok, err, tt.want)
			}
			got := read(name)
			switch {
			case tt.want && tt.holder < 0:
				if got.holder != s.ID() || got.fence < seed || m.Fence() != got.fence {
					t.Fatalf("row %+v, Fence %d; want holder %d, fence ≥ %d (the clock seed)", got, m.Fence(), s.ID(), seed)
				}
			case tt.want:
				if got.holder != s.ID() || got.fence != oldFence+1 || m.Fence() != oldFence+1 || got.token == oldToken {
					t.Fatalf("row %+v, Fence %d; want holder %d, fence %d, a new token", got, m.Fence(), s.ID(), oldFence+1)
				}
			default:
				if want := (row{tt.holder, oldToken, oldFence}); got != want || m.Fence() != 0 {
					t.Fatalf("row %+v, Fence %d; want unchanged %+v, Fence 0", got, m.Fence(), want)
				}
			}
			if ok {
				mustUnlock(t, m, bg)
				if got := read(name); got.holder != 0 || got.fence < 1 {
					t.Fatalf("row after Unlock: %+v; want free, fence kept", got)
				}
			}
		})
	}
}

func TestLockNamesAreExactBytes(t *testing.T) {
	bg := context.Background()
	s, other := newSession(t), newSession(t)
	base := lockName(t)
	names := []string{base + "Lock", base + "lock", base + "lock ", base + "löck", base + "lo\u0308ck"}
	for _, n := range names {
		mustLock(t, dsync.NewMutex(s, n), bg)
	}
	for _, n := range names {
		m := dsync.NewMutex(other, n)
		if ok, err := m.TryLock(bg); ok || err != nil {
			t.Fatalf("TryLock(%q) while held: got %v, %v; want false, nil", n, ok, err)
		}
		mustUnlock(t, dsync.NewMutex(s, n), bg)
		if ok, err := m.TryLock(bg); !ok || err != nil {
			t.Fatalf("TryLock(%q) after Unlock: got %v, %v; want true, nil", n, ok, err)
		}
		mustUnlock(t, m, bg)
	}
}

// fencedLock is what the cancellation test needs of a Mutex or FairMutex.
type fencedLock interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Fence() int64
}

// TestLockCancelledMidAcquire cancels Lock at random moments, many of them
// while a statement is on the wire. Whatever happened, a failed Lock must
// hold nothing and leave nothing behind for good: another session gets the
// lock.
func TestLockCancelledMidAcquire(t *testing.T) {
	slowTest(t)
	tests := []struct {
		name string
		step time.Duration // deadlines are 0, step, 2*step, ... 39*step
		new  func(*dsync.Session, string) fencedLock
	}{
		{"Mutex", 25 * time.Microsecond, func(s *dsync.Session, n string) fencedLock { return dsync.NewMutex(s, n) }},
		{"FairMutex", 40 * time.Microsecond, func(s *dsync.Session, n string) fencedLock { return dsync.NewFairMutex(s, n) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bg := context.Background()
			name := lockName(t)
			m := tt.new(newSession(t, dsync.WithTTL(time.Second)), name)
			failed := 0
			for i := 0; i < 200; i++ {
				ctx, cancel := context.WithTimeout(bg, time.Duration(i%40)*tt.step)
				err := m.Lock(ctx)
				cancel()
				if err == nil {
					if err := m.Unlock(bg); err != nil {
						t.Fatalf("Unlock: %v", err)
					}
					continue
				}
				failed++
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Lock: got %v; want DeadlineExceeded", err)
				}
				if f := m.Fence(); f != 0 {
					t.Fatalf("Fence after failed Lock: got %d; want 0", f)
				}
			}
			t.Logf("%d of 200 Lock calls ended by their deadline", failed)
			if failed == 0 {
				t.Fatal("no Lock call was cancelled; the test proves nothing")
			}
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			other := tt.new(newSession(t), name)
			if err := other.Lock(ctx); err != nil {
				t.Fatalf("Lock by another session: %v", err)
			}
			if err := other.Unlock(bg); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCloseReleasesLocks(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	s, err := dsync.NewSession(bg, dbtest.Open(t))
	if err != nil {
		t.Fatal(err)
	}
	mustLock(t, dsync.NewMutex(s, name), bg)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if err := s.Err(); !errors.Is(err, dsync.ErrSessionClosed) {
		t.Fatalf("Err: got %v; want ErrSessionClosed", err)
	}
	if ok, err := dsync.NewMutex(newSession(t), name).TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock after the holder closed: got %v, %v; want true, nil", ok, err)
	}
}

// TestKeepAliveHoldsPastTTL holds a lock for three TTLs: the keep-alive must
// keep it.
func TestKeepAliveHoldsPastTTL(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	name := lockName(t)
	s := newSession(t, dsync.WithTTL(time.Second))
	m := dsync.NewMutex(s, name)
	mustLock(t, m, bg)
	time.Sleep(3 * time.Second)
	if err := s.Err(); err != nil {
		t.Fatalf("Err after 3 TTLs: got %v; want nil", err)
	}
	if ok, err := dsync.NewMutex(newSession(t), name).TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock by another session: got %v, %v; want false, nil", ok, err)
	}
	mustUnlock(t, m, bg)
}

// TestMutexNoSessionStarved has three sessions (each on its own *sql.DB,
// as three processes would be) take one Mutex in a loop, two goroutines
// each, for 3s: each session must get at least 15% of the acquisitions.
// (On one server the sessions' polls are alike and share well even without
// the claims of starving waiters; the Galera test of the same, where the
// holder's node commits first, is the one that needs them.)
func TestMutexNoSessionStarved(t *testing.T) {
	slowTest(t)
	const sessions, goroutines = 3, 2
	name := lockName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var holders atomic.Int32
	counts := make([]atomic.Int64, sessions)
	var wg sync.WaitGroup
	errs := make(chan error, sessions*goroutines)
	for i := range sessions {
		m := dsync.NewMutex(sessionOn(t, dbtest.Open(t)), name)
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if err := m.Lock(ctx); err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
					if holders.Add(1) != 1 {
						errs <- errors.New("two holders at once")
					}
					counts[i].Add(1)
					holders.Add(-1)
					if err := m.Unlock(context.Background()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var total int64
	for i := range counts {
		total += counts[i].Load()
	}
	for i := range counts {
		n := counts[i].Load()
		t.Logf("session %d: %d of %d acquisitions (%.0f%%)", i, n, total, 100*float64(n)/float64(total))
		if total == 0 || float64(n) < 0.15*float64(total) {
			t.Errorf("session %d: got %d of %d acquisitions; want at least 15%%", i, n, total)
		}
	}
}

package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// Tests of "one name, one lock": a Mutex (Lock or LockTx) and the queued
// locks (FairMutex, RWMutex) of one name exclude each other, the loser
// getting ErrOtherKind.

// kindLocker takes a lock of one kind on a session and returns the
// function that ends the hold.
type kindLocker struct {
	kind   string
	mutex  bool // a Mutex (Lock or LockTx), else a queued lock
	lockOn func(ctx context.Context, s *dsync.Session, db *sql.DB, name string) (end func() error, err error)
}

var kindLockers = map[string]kindLocker{
	"Mutex.Lock": {"Mutex.Lock", true, func(ctx context.Context, s *dsync.Session, _ *sql.DB, name string) (func() error, error) {
		m := dsync.NewMutex(s, name)
		return func() error { return m.Unlock(ctx) }, m.Lock(ctx)
	}},
	"Mutex.LockTx": {"Mutex.LockTx", true, func(ctx context.Context, s *dsync.Session, db *sql.DB, name string) (func() error, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		if err := dsync.NewMutex(s, name).LockTx(ctx, tx); err != nil {
			tx.Rollback()
			return nil, err
		}
		return tx.Commit, nil
	}},
	"FairMutex.Lock": {"FairMutex.Lock", false, func(ctx context.Context, s *dsync.Session, _ *sql.DB, name string) (func() error, error) {
		m := dsync.NewFairMutex(s, name)
		return func() error { return m.Unlock(ctx) }, m.Lock(ctx)
	}},
	"RWMutex.RLock": {"RWMutex.RLock", false, func(ctx context.Context, s *dsync.Session, _ *sql.DB, name string) (func() error, error) {
		rw := dsync.NewRWMutex(s, name)
		return func() error { return rw.RUnlock(ctx) }, rw.RLock(ctx)
	}},
}

// TestKindsRace has two sessions, on *sql.DBs of their own, lock one name
// at the same instant with different kinds (a Mutex's Lock or LockTx
// against a FairMutex's Lock or an RWMutex's RLock), over many rounds: on
// a fresh name, and on an idle name that one of the two kinds used before.
// In every round exactly one holds (never both at once), and the other
// gets ErrOtherKind at once; on an idle name the kind that used it wins.
// The code before this rule gave the two kinds separate lock spaces: both
// held.
func TestKindsRace(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	db1, db2 := dbtest.Open(t), dbtest.Open(t)
	s1, s2 := sessionOn(t, db1), sessionOn(t, db2)
	const freshRounds, idleRounds = 25, 2
	const hold = 10 * time.Millisecond
	pairs := [][2]string{
		{"Mutex.Lock", "FairMutex.Lock"},
		{"Mutex.Lock", "RWMutex.RLock"},
		{"Mutex.LockTx", "FairMutex.Lock"},
		{"Mutex.LockTx", "RWMutex.RLock"},
	}
	var overlaps, rounds atomic.Int64
	var winsMu sync.Mutex
	wins := make(map[string]int) // fresh rounds won, per kind
	for _, pair := range pairs {
		a, b := kindLockers[pair[0]], kindLockers[pair[1]]
		for _, state := range []string{"fresh", "idle " + a.kind, "idle " + b.kind} {
			t.Run(a.kind+" vs "+b.kind+", "+state, func(t *testing.T) {
				n := freshRounds
				if state != "fresh" {
					n = idleRounds
				}
				for r := range n {
					name := fmt.Sprintf("%s/%d", lockName(t), r)
					var bound *kindLocker // the kind that used the name before
					switch state {
					case "idle " + a.kind:
						bound = &a
					case "idle " + b.kind:
						bound = &b
					}
					if bound != nil {
						end, err := bound.lockOn(bg, s1, db1, name)
						if err != nil {
							t.Fatalf("round %d: %s before the race: %v", r, bound.kind, err)
						}
						if err := end(); err != nil {
							t.Fatalf("round %d: end of %s before the race: %v", r, bound.kind, err)
						}
					}
					// Each kind on either session in turn.
					sides := [2]struct {
						l  kindLocker
						s  *dsync.Session
						db *sql.DB
					}{{a, s1, db1}, {b, s2, db2}}
					if r%2 == 1 {
						sides[0].s, sides[0].db, sides[1].s, sides[1].db = s2, db2, s1, db1
					}
					var holders atomic.Int64
					var errs [2]error
					var wg sync.WaitGroup
					start := make(chan struct{})
					for i, side := range sides {
						wg.Add(1)
						go func() {
							defer wg.Done()
							ctx, cancel := context.WithTimeout(bg, 10*time.Second)
							defer cancel()
							<-start
							time.Sleep(rand.N(2 * time.Millisecond)) // now one side first, now the other
							end, err := side.l.lockOn(ctx, side.s, side.db, name)
							errs[i] = err
							if err != nil {
								return
							}
							if holders.Add(1) > 1 {
								overlaps.Add(1)
							}
							time.Sleep(hold)
							holders.Add(-1)
							if err := end(); err != nil {
								t.Errorf("round %d: end of %s: %v", r, side.l.kind, err)
							}
						}()
					}
					close(start)
					wg.Wait()
					rounds.Add(1)
					won := -1
					for i, err := range errs {
						switch {
						case err == nil && won >= 0:
							t.Errorf("round %d: %s and %s both held %q; want one of them to get ErrOtherKind", r, a.kind, b.kind, name)
						case err == nil:
							won = i
						case !errors.Is(err, dsync.ErrOtherKind):
							t.Errorf("round %d: %s: got %v; want nil or ErrOtherKind", r, sides[i].l.kind, err)
						}
					}
					switch {
					case won < 0:
						t.Errorf("round %d: neither %s nor %s held (%v; %v)", r, a.kind, b.kind, errs[0], errs[1])
					case bound != nil && sides[won].l.kind != bound.kind:
						t.Errorf("round %d: %s held the idle name of %s; want %s to get ErrOtherKind", r, sides[won].l.kind, bound.kind, sides[won].l.kind)
					case bound == nil:
						winsMu.Lock()
						wins[sides[won].l.kind]++
						winsMu.Unlock()
					}
				}
			})
		}
	}
	t.Logf("%d rounds, %d overlaps; fresh names won by %v", rounds.Load(), overlaps.Load(), wins)
	if n := overlaps.Load(); n != 0 {
		t.Errorf("rounds in which both kinds held the name at once: got %d; want 0", n)
	}
}

// TestKindsUnboundBySweep: a name stays bound to its kind while its rows
// exist, and is free for the other kind once the clean-up has deleted
// them: for a queued lock, its queue row first, then its lock row, a pass
// later. The fences go on rising across the kinds.
func TestKindsUnboundBySweep(t *testing.T) {
	bg := context.Background()
	prefix := privatePrefix("kinds")
	db := dbtest.Open(t)
	s := newSession(t, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	name := lockName(t)
	rows := func() (lock, queue int) {
		t.Helper()
		for _, c := range []struct {
			table string
			n     *int
		}{{"lock", &lock}, {"queue", &queue}} {
			if err := db.QueryRow("SELECT COUNT(*) FROM `"+prefix+c.table+"` WHERE name = ?", name).Scan(c.n); err != nil {
				t.Fatal(err)
			}
		}
		return lock, queue
	}
	// sweepUntil runs passes until the name has no lock row, checking
	// before each that the other kind is refused.
	sweepUntil := func(other func() error, otherKind string) (passes []string) {
		t.Helper()
		for range 12 {
			l, q := rows()
			passes = append(passes, fmt.Sprintf("lock %d queue %d", l, q))
			if l == 0 && q == 0 {
				return passes
			}
			if err := other(); !errors.Is(err, dsync.ErrOtherKind) {
				t.Fatalf("%s with rows %v: got %v; want ErrOtherKind", otherKind, passes[len(passes)-1], err)
			}
			time.Sleep(2 * time.Millisecond)
			dsync.SweepPass(s, time.Millisecond)
		}
		t.Fatalf("rows of %q after 12 passes: %v; want none", name, passes)
		return nil
	}

	f, m := dsync.NewFairMutex(s, name), dsync.NewMutex(s, name)
	if err := f.Lock(bg); err != nil {
		t.Fatal(err)
	}
	fairFence := f.Fence()
	if err := f.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	passes := sweepUntil(func() error { _, err := m.TryLock(bg); return err }, "Mutex.TryLock")
	if want := "lock 1 queue 0"; !slices.Contains(passes, want) {
		t.Errorf("rows through the passes: %v; want the queue row gone before the lock row (%q)", passes, want)
	}
	t.Logf("FairMutex's rows through the passes: %v", passes)
	mustLock(t, m, bg)
	if got := m.Fence(); got <= fairFence {
		t.Errorf("Mutex fence after the FairMutex's rows went: got %d; want > %d", got, fairFence)
	}
	mutexFence := m.Fence()
	mustUnlock(t, m, bg)

	sweepUntil(func() error { _, err := f.TryLock(bg); return err }, "FairMutex.TryLock")
	if err := f.Lock(bg); err != nil {
		t.Fatal(err)
	}
	if got := f.Fence(); got <= mutexFence {
		t.Errorf("FairMutex fence after the Mutex's row went: got %d; want > %d", got, mutexFence)
	}
	if err := f.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestKindsLockTxInBind has a Mutex take a fresh name and hand it to a
// transaction (LockTx), which keeps the lock row locked, in the window
// between a queued lock's read of the name's kind (none yet) and its bind
// of the name. The queued lock gets ErrOtherKind at once. Before, the bind
// waited for the transaction's row lock, innodb_lock_wait_timeout (5s) at
// a time, ten times over, and then returned 1205: the ctx of 4s ran out.
func TestKindsLockTxInBind(t *testing.T) {
	bg := context.Background()
	db1, db2 := dbtest.Open(t), dbtest.Open(t)
	s1, s2 := sessionOn(t, db1), sessionOn(t, db2)
	queued := []struct {
		kind string
		lock func(ctx context.Context, name string) error
	}{
		{"FairMutex.Lock", func(ctx context.Context, name string) error { return dsync.NewFairMutex(s1, name).Lock(ctx) }},
		{"FairMutex.TryLock", func(ctx context.Context, name string) error {
			_, err := dsync.NewFairMutex(s1, name).TryLock(ctx)
			return err
		}},
		{"RWMutex.RLock", func(ctx context.Context, name string) error { return dsync.NewRWMutex(s1, name).RLock(ctx) }},
	}
	for _, q := range queued {
		t.Run(q.kind, func(t *testing.T) {
			name := lockName(t)
			var txErr error
			var taken atomic.Bool
			t.Cleanup(dsync.AfterKindRead(func(n string) {
				if n != name || taken.Swap(true) {
					return
				}
				tx, err := db2.BeginTx(bg, nil)
				if err != nil {
					txErr = err
					return
				}
				t.Cleanup(func() { tx.Rollback() })
				txErr = dsync.NewMutex(s2, name).LockTx(bg, tx)
			}))
			ctx, cancel := context.WithTimeout(bg, 4*time.Second)
			defer cancel()
			err := q.lock(ctx, name)
			if !taken.Load() || txErr != nil {
				t.Fatalf("LockTx in the window after the read of the kind: ran %v, %v; want it to hold the name", taken.Load(), txErr)
			}
			if !errors.Is(err, dsync.ErrOtherKind) {
				t.Fatalf("%s of a name that a LockTx transaction holds: got %v; want ErrOtherKind", q.kind, err)
			}
		})
	}
}

// TestKindsBindPaused has a queued lock meet a lock row that a transaction
// is writing (an insert not yet committed, whose kind it cannot read): it
// binds again after a pause of the back-off, never at once, and gets
// ErrOtherKind once the row commits as a Mutex's.
func TestKindsBindPaused(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := sessionOn(t, db)
	name := lockName(t)
	var binds atomic.Int64
	t.Cleanup(dsync.AfterKindRead(func(n string) {
		if n == name {
			binds.Add(1)
		}
	}))
	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO dsync_lock (name, kind, fence) VALUES (?, 0, 1)", name); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 20*time.Second)
		defer cancel()
		errc <- dsync.NewFairMutex(s, name).Lock(ctx)
	}()
	const held = 500 * time.Millisecond
	time.Sleep(held)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, dsync.ErrOtherKind) {
		t.Errorf("FairMutex.Lock after the row committed as a Mutex's: got %v; want ErrOtherKind", err)
	}
	// The default back-off pauses 2ms, doubling up to 100ms: about 10
	// binds in held. A bind again at once would make thousands.
	n := binds.Load()
	t.Logf("binds while a transaction wrote the row for %v: %d", held, n)
	if n < 2 || n > 50 {
		t.Errorf("binds while a transaction wrote the row for %v: got %d; want 2 to 50", held, n)
	}
}

package dsync_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// BenchmarkBaselineInsertDelete is the floor for a durable row lock: an
// autocommit INSERT and DELETE of one row, each a statement prepared once on
// a dedicated connection (one round trip each), on the same server.
func BenchmarkBaselineInsertDelete(b *testing.B) {
	ctx := context.Background()
	db := dbtest.Open(b)
	table := fmt.Sprintf("baseline_%d", time.Now().UnixNano())
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (name VARBINARY(255) NOT NULL PRIMARY KEY, holder BIGINT NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ins, err := conn.PrepareContext(ctx, "INSERT INTO "+table+" (name, holder) VALUES (?, ?)")
	if err != nil {
		b.Fatal(err)
	}
	defer ins.Close()
	del, err := conn.PrepareContext(ctx, "DELETE FROM "+table+" WHERE name = ? AND holder = ?")
	if err != nil {
		b.Fatal(err)
	}
	defer del.Close()
	name := lockName(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ins.ExecContext(ctx, name, 1); err != nil {
			b.Fatal(err)
		}
		if _, err := del.ExecContext(ctx, name, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMutexUncontended is Lock+Unlock of a lock nobody else wants.
func BenchmarkMutexUncontended(b *testing.B) {
	ctx := context.Background()
	m := dsync.NewMutex(newSession(b), lockName(b))
	mustLock(b, m, ctx) // warm the connection and the row
	mustUnlock(b, m, ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := m.Lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMutexContended4Procs has 4 OS processes of 4 goroutines each
// lock and unlock one Mutex; one op is one acquisition, and handoffs/s
// counts acquisitions per second over all processes.
func BenchmarkMutexContended4Procs(b *testing.B) {
	const procs, goroutines = 4, 4
	name := lockName(b)
	per := (b.N + procs*goroutines - 1) / (procs * goroutines)
	var children []*child
	for p := 0; p < procs; p++ {
		c := startChild(b, childConfig{Role: "churn", Name: name, Goroutines: goroutines, Iterations: per})
		expectLine(b, c.out, "ready")
		children = append(children, c)
	}
	b.ResetTimer()
	start := time.Now()
	for _, c := range children {
		if _, err := c.in.Write([]byte("go\n")); err != nil {
			b.Fatal(err)
		}
	}
	for i, c := range children {
		if err := c.Wait(); err != nil {
			b.Fatalf("child %d: %v", i, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(per*procs*goroutines)/time.Since(start).Seconds(), "handoffs/s")
}

// BenchmarkFairMutexUncontended is FairMutex Lock+Unlock with no other
// waiter.
func BenchmarkFairMutexUncontended(b *testing.B) {
	m := dsync.NewFairMutex(newSession(b), lockName(b))
	benchLockUnlock(b, m.Lock, m.Unlock)
}

// BenchmarkRWMutexUncontendedWrite is RWMutex Lock+Unlock with no other
// waiter.
func BenchmarkRWMutexUncontendedWrite(b *testing.B) {
	rw := dsync.NewRWMutex(newSession(b), lockName(b))
	benchLockUnlock(b, rw.Lock, rw.Unlock)
}

// BenchmarkRWMutexUncontendedRead is RWMutex RLock+RUnlock with no other
// waiter.
func BenchmarkRWMutexUncontendedRead(b *testing.B) {
	rw := dsync.NewRWMutex(newSession(b), lockName(b))
	benchLockUnlock(b, rw.RLock, rw.RUnlock)
}

func benchLockUnlock(b *testing.B, lock, unlock func(context.Context) error) {
	ctx := context.Background()
	if err := lock(ctx); err != nil { // warm the connection and the rows
		b.Fatal(err)
	}
	if err := unlock(ctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := lock(ctx); err != nil {
			b.Fatal(err)
		}
		if err := unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFairMutexHandoff8 passes a FairMutex around 8 waiters, each with
// a session of its own (so every handoff goes through the database, as
// between processes). handoff-p50-ms and handoff-p99-ms measure from the
// moment the holder calls Unlock to the moment the next waiter's Lock
// returns.
func BenchmarkFairMutexHandoff8(b *testing.B) {
	name := lockName(b)
	benchHandoff(b, func(s *dsync.Session) (func(context.Context) error, func(context.Context) error) {
		m := dsync.NewFairMutex(s, name)
		return m.Lock, m.Unlock
	})
}

// BenchmarkMutexHandoff8 is BenchmarkFairMutexHandoff8 for a Mutex, whose
// waiters poll with back-off instead of queueing: the next holder is often
// the goroutine that just released it (its fast path wins the race), which
// is what makes a Mutex quick to hand over and unfair.
func BenchmarkMutexHandoff8(b *testing.B) {
	name := lockName(b)
	benchHandoff(b, func(s *dsync.Session) (func(context.Context) error, func(context.Context) error) {
		m := dsync.NewMutex(s, name)
		return m.Lock, m.Unlock
	})
}

func benchHandoff(b *testing.B, newLock func(*dsync.Session) (lock, unlock func(context.Context) error)) {
	const waiters = 8
	ctx := context.Background()
	type pair struct{ lock, unlock func(context.Context) error }
	var locks []pair
	for i := 0; i < waiters; i++ {
		l, u := newLock(newSession(b))
		locks = append(locks, pair{l, u})
	}
	var (
		mu          sync.Mutex
		remaining   = b.N
		lastRelease time.Time
		samples     []time.Duration
	)
	b.ResetTimer()
	var g errgroup.Group
	for _, p := range locks {
		g.Go(func() error {
			for {
				if err := p.lock(ctx); err != nil {
					return err
				}
				now := time.Now()
				mu.Lock()
				if !lastRelease.IsZero() {
					samples = append(samples, now.Sub(lastRelease))
				}
				done := remaining <= 0
				remaining--
				lastRelease = time.Now()
				mu.Unlock()
				if err := p.unlock(ctx); err != nil {
					return err
				}
				if done {
					return nil
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if len(samples) > 0 {
		slices.Sort(samples)
		b.ReportMetric(float64(samples[len(samples)/2].Microseconds())/1000, "handoff-p50-ms")
		b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds())/1000, "handoff-p99-ms")
	}
}

// BenchmarkMutexContended4Sessions has 4 sessions (each on its own
// *sql.DB, as 4 processes would be) loop Lock+Unlock on one Mutex, and
// reports the share of acquisitions that changed hands between sessions,
// the longest wait in Lock, and the handoff latency (a release by one
// session until another returns from Lock).
func BenchmarkMutexContended4Sessions(b *testing.B) {
	const sessions = 4
	ctx := context.Background()
	name := lockName(b)
	var mus []*dsync.Mutex
	for i := 0; i < sessions; i++ {
		mus = append(mus, dsync.NewMutex(newSession(b), name))
	}
	var (
		mu          sync.Mutex
		remaining   = b.N
		last        = -1
		lastRelease time.Time
		changed     int
		longest     time.Duration
		handoffs    []time.Duration
		holders     atomic.Int32
		violations  atomic.Int32
	)
	b.ResetTimer()
	var g errgroup.Group
	for i, m := range mus {
		g.Go(func() error {
			for {
				start := time.Now()
				if err := m.Lock(ctx); err != nil {
					return err
				}
				now := time.Now()
				if holders.Add(1) != 1 {
					violations.Add(1)
				}
				mu.Lock()
				longest = max(longest, now.Sub(start))
				if last != -1 && last != i {
					changed++
					handoffs = append(handoffs, now.Sub(lastRelease))
				}
				last = i
				done := remaining <= 0
				remaining--
				mu.Unlock()
				holders.Add(-1)
				mu.Lock()
				lastRelease = time.Now()
				mu.Unlock()
				if err := m.Unlock(ctx); err != nil {
					return err
				}
				if done {
					return nil
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if v := violations.Load(); v != 0 {
		b.Fatalf("%d violations: two holders at once", v)
	}
	b.ReportMetric(float64(changed)/float64(b.N), "changed-hands")
	b.ReportMetric(float64(longest.Microseconds())/1000, "longest-wait-ms")
	if len(handoffs) > 0 {
		slices.Sort(handoffs)
		b.ReportMetric(float64(handoffs[len(handoffs)/2].Microseconds())/1000, "handoff-p50-ms")
		b.ReportMetric(float64(handoffs[len(handoffs)*99/100].Microseconds())/1000, "handoff-p99-ms")
	}
}

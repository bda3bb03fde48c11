package dsync_test

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"slices"
	"strings"
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
	ins, del := floorStatements(b, dbtest.Open(b))
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

// floorStatements creates a table of the floor's own (see
// BenchmarkBaselineInsertDelete) and returns its INSERT and DELETE, each
// prepared once on a connection of db's that it keeps, closed when b
// ends.
func floorStatements(b *testing.B, db *sql.DB) (ins, del *sql.Stmt) {
	b.Helper()
	ctx := context.Background()
	table := fmt.Sprintf("floor_%d", time.Now().UnixNano())
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (name VARBINARY(255) NOT NULL PRIMARY KEY, holder BIGINT NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ins, err = conn.PrepareContext(ctx, "INSERT INTO "+table+" (name, holder) VALUES (?, ?)")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ins.Close() })
	del, err = conn.PrepareContext(ctx, "DELETE FROM "+table+" WHERE name = ? AND holder = ?")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { del.Close() })
	return ins, del
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

var sweepRows = flag.Int("sweeprows", 100_000, "free lock rows each sweep benchmark op cleans up")

// fillLockRows inserts n free lock rows, 'user/0' to 'user/<n-1>', into the
// lock table of prefix, with one statement: the cross join of as many
// digit tables as n has digits.
func fillLockRows(b *testing.B, db *sql.DB, prefix string, n int) {
	b.Helper()
	digits, numbers := []string{}, []string{}
	for i, scale := 0, 1; scale < n; i, scale = i+1, scale*10 {
		digits = append(digits, fmt.Sprintf("(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 "+
			"UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d%d", i))
		numbers = append(numbers, fmt.Sprintf("%d * d%d.d", scale, i))
	}
	fill := fmt.Sprintf("INSERT INTO `%slock` (name, fence) SELECT CONCAT('user/', n), 1 FROM (SELECT %s AS n FROM %s) x WHERE n < ?",
		prefix, strings.Join(numbers, " + "), strings.Join(digits, " CROSS JOIN "))
	if _, err := db.Exec(fill, n); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSweep measures the clean-up of free rows (WithFreeRowAge): each
// op fills a fresh lock table with -sweeprows free rows (untimed), then runs
// one pass that marks them all and one that deletes them all. It reports
// the seconds of each pass, which grow with the rows (a pass walks the whole
// table), e.g. go test -run '^$' -bench '^BenchmarkSweep$' -benchtime 1x . -args -sweeprows 1000000.
func BenchmarkSweep(b *testing.B) {
	db := dbtest.Open(b)
	prefix := freshPrefix("bsweep")
	s := newSession(b, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	n := *sweepRows
	var mark, del time.Duration
	ops := 0
	for b.Loop() {
		ops++
		b.StopTimer()
		fillLockRows(b, db, prefix, n)
		b.StartTimer()
		start := time.Now()
		_, marked := dsync.SweepPass(s, time.Hour)
		mark += time.Since(start)
		start = time.Now()
		deleted, _ := dsync.SweepPass(s, 0)
		del += time.Since(start)
		if marked != int64(n) || deleted != int64(n) {
			b.Fatalf("rows marked, deleted: got %d, %d; want %d, %d", marked, deleted, n, n)
		}
	}
	b.ReportMetric(mark.Seconds()/float64(ops), "s/mark-pass")
	b.ReportMetric(del.Seconds()/float64(ops), "s/delete-pass")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkMutexDuringSweep measures what the clean-up costs lock traffic:
// a goroutine locks and unlocks a Mutex whose row lies amid -sweeprows free
// rows of the same table, through a session of its own, first for as long
// as the passes will take with nothing else running (idle), then while one
// pass marks all the rows and another deletes them (sweep). It reports the
// 50th and 99th percentile and the longest Lock+Unlock of each phase.
func BenchmarkMutexDuringSweep(b *testing.B) {
	ctx := context.Background()
	db := dbtest.Open(b)
	prefix := freshPrefix("bsweeplock")
	sweeper := newSession(b, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0))
	// 'user/5hot' sorts amid the filled names, between 'user/59..9' and 'user/6'.
	m := dsync.NewMutex(newSession(b, dsync.WithTablePrefix(prefix), dsync.WithFreeRowAge(0)), "user/5hot")
	measure := func(stop <-chan struct{}) []time.Duration {
		var took []time.Duration
		for {
			select {
			case <-stop:
				return took
			default:
			}
			start := time.Now()
			mustLock(b, m, ctx)
			mustUnlock(b, m, ctx)
			took = append(took, time.Since(start))
		}
	}
	var idle, sweep []time.Duration
	for b.Loop() {
		b.StopTimer()
		fillLockRows(b, db, prefix, *sweepRows)
		b.StartTimer()
		stop, done := make(chan struct{}), make(chan []time.Duration)
		go func() { done <- measure(stop) }()
		start := time.Now()
		dsync.SweepPass(sweeper, time.Hour)
		dsync.SweepPass(sweeper, 0)
		took := time.Since(start)
		close(stop)
		sweep = append(sweep, <-done...)
		b.StopTimer()
		stop = make(chan struct{})
		go func() { done <- measure(stop) }()
		time.Sleep(took)
		close(stop)
		idle = append(idle, <-done...)
		b.StartTimer()
	}
	for _, phase := range []struct {
		name string
		took []time.Duration
	}{{"idle", idle}, {"sweep", sweep}} {
		slices.Sort(phase.took)
		n := len(phase.took)
		b.ReportMetric(float64(phase.took[n/2].Microseconds())/1000, phase.name+"-p50-ms")
		b.ReportMetric(float64(phase.took[n*99/100].Microseconds())/1000, phase.name+"-p99-ms")
		b.ReportMetric(float64(phase.took[n-1].Microseconds())/1000, phase.name+"-max-ms")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkMutexUncontendedBeside is the uncontended Mutex in the harness
// of issue 19 §5, for each pool (no connection limit, SetMaxOpenConns(8)
// and (32)): one session locks and unlocks a name nobody else uses, after
// another session once waited for it and took it (try: "wait"), or only
// failed a TryLock on it ("trylock"), in blocks of 100 pairs interleaved
// with blocks of 100 pairs of the floor (BenchmarkBaselineInsertDelete's
// INSERT and DELETE on a connection of their own), so that both see the
// same load. It reports the median over the ops of the Mutex's block time
// over the floor's (x-floor), and both times per pair; an op is one block
// of each. Run it with
// go test -run '^$' -bench MutexUncontendedBeside -benchtime 20x .
func BenchmarkMutexUncontendedBeside(b *testing.B) {
	const block = 100
	ctx := context.Background()
	ins, del := floorStatements(b, dbtest.Open(b))
	for _, try := range []string{"wait", "trylock"} {
		for _, limit := range []int{0, 8, 32} {
			b.Run(fmt.Sprintf("%s/limit=%d", try, limit), func(b *testing.B) {
				db := dbtest.Open(b)
				db.SetMaxOpenConns(limit)
				s, err := dsync.NewSession(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				name := lockName(b)
				m, other := dsync.NewMutex(s, name), dsync.NewMutex(newSession(b), name)
				mustLock(b, m, ctx)
				if try == "wait" {
					got := make(chan error, 1)
					go func() { got <- other.Lock(ctx) }()
					time.Sleep(100 * time.Millisecond) // it waits
					mustUnlock(b, m, ctx)
					if err := <-got; err != nil {
						b.Fatal(err)
					}
					mustUnlock(b, other, ctx)
				} else {
					if ok, err := other.TryLock(ctx); ok || err != nil {
						b.Fatalf("TryLock of a held lock: got %v, %v; want false, nil", ok, err)
					}
					mustUnlock(b, m, ctx)
				}
				for range block { // warm the connections
					mustLock(b, m, ctx)
					mustUnlock(b, m, ctx)
				}
				var mutex, floor time.Duration
				var ratios []float64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					for range block {
						if err := m.Lock(ctx); err != nil {
							b.Fatal(err)
						}
						if err := m.Unlock(ctx); err != nil {
							b.Fatal(err)
						}
					}
					t1 := time.Now()
					for range block {
						if _, err := ins.ExecContext(ctx, name, 1); err != nil {
							b.Fatal(err)
						}
						if _, err := del.ExecContext(ctx, name, 1); err != nil {
							b.Fatal(err)
						}
					}
					t2 := time.Now()
					mutex += t1.Sub(t0)
					floor += t2.Sub(t1)
					ratios = append(ratios, float64(t1.Sub(t0))/float64(t2.Sub(t1)))
				}
				b.StopTimer()
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "x-floor")
				b.ReportMetric(float64(mutex.Microseconds())/float64(b.N*block), "mutex-us/pair")
				b.ReportMetric(float64(floor.Microseconds())/float64(b.N*block), "floor-us/pair")
			})
		}
	}
}

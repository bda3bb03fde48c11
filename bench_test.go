package dsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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

package dsync_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestFairMutexFIFOAcrossProcesses queues 9 waiters from 3 OS processes
// behind a held lock, each confirmed in the line before the next starts,
// and checks they acquire in exactly that order; then again with a waiter
// in the middle cancelling.
func TestFairMutexFIFOAcrossProcesses(t *testing.T) {
	for _, cancelled := range []int{-1, 4} {
		t.Run(fmt.Sprintf("cancel=%d", cancelled), func(t *testing.T) {
			const waiters = 9
			bg := context.Background()
			db := dbtest.Open(t)
			name := lockName(t)
			table := orderLog(t, db)
			var drivers []*driver
			for p := 0; p < 3; p++ {
				drivers = append(drivers, startDriver(t, childConfig{Name: name, Table: table, Kind: "fair"}))
			}
			holder := dsync.NewFairMutex(newSession(t), name)
			if err := holder.Lock(bg); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < waiters; i++ {
				drivers[i%3].send(t, "pass "+strconv.Itoa(i))
				waitTickets(t, db, name, i+2)
			}
			var want []string
			for i := 0; i < waiters; i++ {
				if i != cancelled {
					want = append(want, strconv.Itoa(i))
				}
			}
			if cancelled >= 0 {
				d := drivers[cancelled%3]
				d.send(t, "cancel "+strconv.Itoa(cancelled))
				d.expect(t, "cancelled "+strconv.Itoa(cancelled), 5*time.Second)
				waitTickets(t, db, name, waiters)
			}
			if err := holder.Unlock(bg); err != nil {
				t.Fatal(err)
			}
			for _, id := range want {
				drivers[mustAtoi(t, id)%3].expect(t, "done "+id, 10*time.Second)
			}
			if got := readLog(t, db, table); !slices.Equal(got, want) {
				t.Fatalf("acquisition order: got %v; want %v", got, want)
			}
			waitTickets(t, db, name, 0)
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFairMutexKilledProcessesDoNotStall kills a queued waiter, then a
// holder, with SIGKILL; each time the line moves on within TTL + 1s.
func TestFairMutexKilledProcessesDoNotStall(t *testing.T) {
	slowTest(t)
	const ttl = time.Second
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	table := orderLog(t, db)
	doomed := startDriver(t, childConfig{Name: name, Table: table, Kind: "fair", TTL: ttl})
	survivor := startDriver(t, childConfig{Name: name, Table: table, Kind: "fair", TTL: ttl})

	holder := dsync.NewFairMutex(newSession(t), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatal(err)
	}
	doomed.send(t, "lock 1") // queued, then killed
	waitTickets(t, db, name, 2)
	survivor.send(t, "lock 2")
	waitTickets(t, db, name, 3)
	if err := doomed.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := holder.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	survivor.expect(t, "acquired 2", ttl+time.Second)
	t.Logf("waiter behind a killed waiter acquired %v after the kill", time.Since(killed))

	// Now the holder dies.
	next := dsync.NewFairMutex(newSession(t), name)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		errc <- next.Lock(ctx)
	}()
	waitTickets(t, db, name, 3) // dead waiter's ticket, holder's, next's
	if err := survivor.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = time.Now()
	if err := <-errc; err != nil {
		t.Fatalf("Lock after the holder died: %v", err)
	}
	if took := time.Since(killed); took > ttl+time.Second {
		t.Fatalf("lock free %v after the holder was killed; want at most %v", took, ttl+time.Second)
	}
	if err := next.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexReadersOverlapAcrossProcesses has 3 processes hold the read
// side at once, and a writer wait for all of them.
func TestRWMutexReadersOverlapAcrossProcesses(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	table := orderLog(t, db)
	var readers []*driver
	for p := 0; p < 3; p++ {
		d := startDriver(t, childConfig{Name: name, Table: table, Kind: "rw"})
		d.send(t, "rlock "+strconv.Itoa(p))
		d.expect(t, "acquired "+strconv.Itoa(p), 10*time.Second)
		readers = append(readers, d)
	}
	// All three hold the read side now (none has been told to release).
	writer := dsync.NewRWMutex(newSession(t), name)
	if ok, err := writer.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock with 3 readers: got %v, %v; want false, nil", ok, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- writer.Lock(bg) }()
	for p, d := range readers {
		select {
		case err := <-errc:
			t.Fatalf("writer got the lock while %d readers held it (%v)", 3-p, err)
		case <-time.After(100 * time.Millisecond):
		}
		d.send(t, "release "+strconv.Itoa(p))
		d.expect(t, "released "+strconv.Itoa(p), 5*time.Second)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if f := writer.Fence(); f <= 0 {
		t.Fatalf("writer Fence: got %d; want > 0", f)
	}
	if err := writer.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestRWMutexReaderAfterWaitingWriter: a reader that arrives after a
// waiting writer enters only after that writer.
func TestRWMutexReaderAfterWaitingWriter(t *testing.T) {
	db := dbtest.Open(t)
	name := lockName(t)
	table := orderLog(t, db)
	first := startDriver(t, childConfig{Name: name, Table: table, Kind: "rw"})
	writer := startDriver(t, childConfig{Name: name, Table: table, Kind: "rw"})
	late := startDriver(t, childConfig{Name: name, Table: table, Kind: "rw"})

	first.send(t, "rlock r1")
	first.expect(t, "acquired r1", 10*time.Second)
	writer.send(t, "lock w")
	waitTickets(t, db, name, 2)
	late.send(t, "rlock r2")
	waitTickets(t, db, name, 3)
	late.quiet(t, 300*time.Millisecond) // a reader holds, but a writer waits
	first.send(t, "release r1")
	first.expect(t, "released r1", 5*time.Second)
	writer.expect(t, "acquired w", 5*time.Second)
	late.quiet(t, 300*time.Millisecond)
	writer.send(t, "release w")
	writer.expect(t, "released w", 5*time.Second)
	late.expect(t, "acquired r2", 5*time.Second)
	late.send(t, "release r2")
	late.expect(t, "released r2", 5*time.Second)
	if got, want := readLog(t, db, table), []string{"r1", "w", "r2"}; !slices.Equal(got, want) {
		t.Fatalf("acquisition order: got %v; want %v", got, want)
	}
}

// TestRWMutexCheckerAcrossProcesses runs over 2,000 random reads and
// writes from 3 processes x 4 goroutines; a checker row proves that no
// reader overlapped a writer and no two writers overlapped, and that
// readers did overlap.
func TestRWMutexCheckerAcrossProcesses(t *testing.T) {
	slowTest(t)
	const procs, goroutines, iterations = 3, 4, 170
	db := dbtest.Open(t)
	name := lockName(t)
	table := fmt.Sprintf("rwcheck_%d", time.Now().UnixNano())
	for _, q := range []string{
		"CREATE TABLE " + table + " (id INT PRIMARY KEY, readers INT NOT NULL, writers INT NOT NULL, max_readers INT NOT NULL, ops INT NOT NULL, writes INT NOT NULL, violations INT NOT NULL)",
		"INSERT INTO " + table + " VALUES (1, 0, 0, 0, 0, 0, 0)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var children []*child
	for p := 0; p < procs; p++ {
		children = append(children, startChild(t, childConfig{Role: "rwcheck", Name: name, Table: table, Goroutines: goroutines, Iterations: iterations}))
	}
	for i, c := range children {
		if err := c.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	var ops, writes, maxReaders, violations int
	if err := db.QueryRow("SELECT ops, writes, max_readers, violations FROM "+table+" WHERE id = 1").Scan(&ops, &writes, &maxReaders, &violations); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d operations (%d writes), at most %d readers at once", ops, writes, maxReaders)
	if want := procs * goroutines * iterations; ops != want {
		t.Fatalf("operations: got %d; want %d", ops, want)
	}
	if violations != 0 {
		t.Fatalf("violations: got %d; want 0", violations)
	}
	if writes == 0 || maxReaders < 2 {
		t.Fatalf("writes %d, max readers %d: the run did not exercise both sides", writes, maxReaders)
	}
}

package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestMutexAcrossProcesses has 4 OS processes of 4 goroutines each do
// read-modify-write increments of one counter row under one Mutex, through
// connections other than the lock's. Lost updates would leave the counter
// short; the fences logged in commit order must be strictly increasing.
func TestMutexAcrossProcesses(t *testing.T) {
	slowTest(t)
	const procs, goroutines, iterations = 4, 4, 15
	ctx := context.Background()
	db := dbtest.Open(t)
	table := fmt.Sprintf("counter_%d", time.Now().UnixNano())
	for _, q := range []string{
		"CREATE TABLE " + table + " (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO " + table + " VALUES (1, 0)",
		"CREATE TABLE " + table + "_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL, value BIGINT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	name := lockName(t)
	var cmds []*child
	for p := 0; p < procs; p++ {
		cmds = append(cmds, startChild(t, childConfig{Role: "counter", Name: name, Table: table, Goroutines: goroutines, Iterations: iterations}))
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}

	const want = procs * goroutines * iterations
	var got int64
	if err := db.QueryRowContext(ctx, "SELECT value FROM "+table+" WHERE id = 1").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("counter: got %d; want %d", got, want)
	}
	rows, err := db.QueryContext(ctx, "SELECT fence, value FROM "+table+"_log ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n, lastFence, lastValue int64
	for rows.Next() {
		var fence, value int64
		if err := rows.Scan(&fence, &value); err != nil {
			t.Fatal(err)
		}
		if fence <= lastFence || value != lastValue+1 {
			t.Fatalf("log row %d: fence %d after %d, value %d after %d; want both increasing (value by 1)", n, fence, lastFence, value, lastValue)
		}
		n, lastFence, lastValue = n+1, fence, value
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("log rows: got %d; want %d", n, want)
	}
}

// TestCrashedHolderFreedAfterTTL kills a holding process with SIGKILL and
// expects another session to get the lock within TTL + 1s.
func TestCrashedHolderFreedAfterTTL(t *testing.T) {
	slowTest(t)
	const ttl = time.Second
	name := lockName(t)
	holder := startChild(t, childConfig{Role: "hold", Name: name, TTL: ttl})
	expectLine(t, holder.out, "locked")

	m := dsync.NewMutex(newSession(t), name)
	ctx := context.Background()
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the child holds it: got %v, %v; want false, nil", ok, err)
	}
	fence := func() int64 {
		var f int64
		if err := dbtest.Open(t).QueryRow("SELECT fence FROM dsync_lock WHERE name = ?", name).Scan(&f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	crashedFence := fence()
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("Lock after the holder died: %v", err)
	}
	if took := time.Since(killed); took > ttl+time.Second {
		t.Fatalf("lock free %v after the kill; want at most %v", took, ttl+time.Second)
	}
	if got := m.Fence(); got <= crashedFence {
		t.Fatalf("Fence after takeover: got %d; want > %d, the crashed holder's", got, crashedFence)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseLossSignalledBeforeTakeover cuts a holder off from the server and
// checks that its Done closes (with ErrSessionExpired) before another
// session acquires the lock.
func TestLeaseLossSignalledBeforeTakeover(t *testing.T) {
	slowTest(t)
	const ttl = time.Second
	p, dsn := dbtest.FaultProxy(t)
	cut, err := dsync.NewSession(context.Background(), dbtest.OpenDSN(t, dsn), dsync.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	ctx := context.Background()
	held := dsync.NewMutex(cut, name)
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	other := dsync.NewMutex(newSession(t), name)
	p.Cut(true)
	cutAt := time.Now()

	acquired := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := other.Lock(ctx); err != nil {
			t.Errorf("other.Lock: %v", err)
			close(acquired)
			return
		}
		acquired <- time.Now()
	}()

	var doneAt time.Time
	select {
	case <-cut.Done():
		doneAt = time.Now()
	case at := <-acquired:
		t.Fatalf("another session acquired the lock %v after the cut, before Done closed", at.Sub(cutAt))
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close within 10s of the cut")
	}
	if err := cut.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Err: got %v; want ErrSessionExpired", err)
	}
	at, ok := <-acquired
	if !ok {
		t.FailNow()
	}
	if !doneAt.Before(at) {
		t.Fatalf("Done closed at +%v, the other session acquired at +%v; want Done first", doneAt.Sub(cutAt), at.Sub(cutAt))
	}
	t.Logf("Done closed %v after the cut; the other session acquired %v after the cut", doneAt.Sub(cutAt), at.Sub(cutAt))

	if err := held.Unlock(ctx); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Unlock after lease loss: got %v; want ErrSessionExpired", err)
	}
	if err := held.Lock(ctx); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Lock after lease loss: got %v; want ErrSessionExpired", err)
	}
	start := time.Now()
	_ = cut.Close() // the server is unreachable: it must still return
	if took := time.Since(start); took > 2*ttl {
		t.Fatalf("Close with the server unreachable took %v; want at most about one TTL (%v)", took, ttl)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

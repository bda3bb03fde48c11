//go:build galera

// Tests against a 3-node MariaDB Galera cluster (multi-primary), started by
// scripts/galera.sh: make test-galera runs them. They use the public API
// only; each opens one *sql.DB per node on a database of its own and checks
// mutual exclusion, fences, fairness and session survival across nodes.
// Without a running cluster they fail, saying how to start one.

package dsync_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
)

// galeraScript runs the throwaway cluster; DSYNC_GALERA_DIR (inherited by
// the script) says where it lives.
const galeraScript = "scripts/galera.sh"

// galeraNodes is the cluster's size.
const galeraNodes = 3

// galeraDB is one test's database on the cluster.
type galeraDB struct {
	name string              // database name, dsync_galera_<random>
	base [galeraNodes]string // each node's DSN without a database
	dsn  [galeraNodes]string // each node's DSN selecting the database
	db   [galeraNodes]*sql.DB
}

// goCounted runs f in a goroutine that wg counts: sync.WaitGroup.Go, which
// needs Go 1.25 (the module supports Go 1.24).
func goCounted(wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		f()
	}()
}

// galeraRun runs scripts/galera.sh with args and returns its standard output,
// failing the test with everything it printed when it fails.
func galeraRun(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command("bash", append([]string{galeraScript}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s\n(start a cluster with `bash %s start`, or run `make test-galera`)",
			galeraScript, strings.Join(args, " "), err, out, stderr.String(), galeraScript)
	}
	return strings.TrimSpace(string(out))
}

// newGaleraDB checks that the cluster has 3 Synced nodes, creates a database
// of the test's own on it, dropped when the test ends, and opens one
// *sql.DB per node on it, closed when the test ends.
func newGaleraDB(t *testing.T) *galeraDB {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	g := &galeraDB{name: "dsync_galera_" + hex.EncodeToString(b[:])}
	for i := range galeraNodes {
		base := galeraRun(t, "dsn", fmt.Sprint(i+1))
		cfg, err := mysql.ParseDSN(base)
		if err != nil {
			t.Fatalf("DSN of node %d, %q: %v", i+1, base, err)
		}
		g.base[i] = cfg.FormatDSN()
		cfg.DBName = g.name
		g.dsn[i] = cfg.FormatDSN()
	}
	for i := range galeraNodes {
		size, state, err := galeraState(ctx, g.base[i])
		if err != nil || size != galeraNodes || state != "Synced" {
			t.Fatalf("node %d: cluster size %d, state %q, %v; want %d, Synced (is the cluster up? bash %s status)",
				i+1, size, state, err, galeraNodes, galeraScript)
		}
	}
	if err := galeraExec(ctx, g.base[0], "CREATE DATABASE "+g.name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		for i := range galeraNodes { // any node that is up will do
			if err = galeraExec(ctx, g.base[i], "DROP DATABASE IF EXISTS "+g.name); err == nil {
				return
			}
		}
		t.Errorf("drop database %s: %v", g.name, err)
	})
	for i := range galeraNodes {
		db, err := sql.Open("mysql", g.dsn[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		g.db[i] = db
	}
	g.settle(t)
	return g
}

// galeraExec runs one statement on a connection pool of its own, closed
// before it returns.
func galeraExec(ctx context.Context, dsn, query string, args ...any) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query, args...)
	return err
}

// galeraState returns a node's wsrep_cluster_size and
// wsrep_local_state_comment.
func galeraState(ctx context.Context, dsn string) (size int, state string, err error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return 0, "", err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "+
		"WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE', 'WSREP_LOCAL_STATE_COMMENT')")
	if err != nil {
		return 0, "", err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return 0, "", err
		}
		switch strings.ToUpper(k) {
		case "WSREP_CLUSTER_SIZE":
			fmt.Sscan(v, &size)
		case "WSREP_LOCAL_STATE_COMMENT":
			state = v
		}
	}
	return size, state, rows.Err()
}

// openSynced returns a connection pool on node i's database whose reads
// wait until the node has applied everything the cluster committed before
// them (wsrep_sync_wait=1).
func (g *galeraDB) openSynced(i int) (*sql.DB, error) {
	return openSyncWait(g.dsn[i])
}

// openSyncWait opens dsn with causal reads (wsrep_sync_wait).
func openSyncWait(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.Params = map[string]string{"wsrep_sync_wait": "1"}
	return sql.Open("mysql", cfg.FormatDSN())
}

// synced is openSynced for a test: the pool is closed when the test ends.
func (g *galeraDB) synced(t testing.TB, i int) *sql.DB {
	t.Helper()
	db, err := g.openSynced(i)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// settle waits until every node has applied what the cluster committed so
// far (DDL included), with one causal read per node, on a connection to
// no database: one to the test's database fails (1049) on a node that
// has not applied its CREATE DATABASE yet.
func (g *galeraDB) settle(t testing.TB) {
	t.Helper()
	for i := range galeraNodes {
		db, err := openSyncWait(g.base[i])
		if err != nil {
			t.Fatal(err)
		}
		var n int
		err = db.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", g.name).Scan(&n)
		db.Close()
		if err != nil || n != 1 {
			t.Fatalf("node %d: database %s: got %d, %v; want it there", i+1, g.name, n, err)
		}
	}
}

// exec runs DDL or setup statements on node 1 and waits until every node
// has applied them.
func (g *galeraDB) exec(t testing.TB, queries ...string) {
	t.Helper()
	for _, q := range queries {
		if _, err := g.db[0].Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	g.settle(t)
}

// session returns a new session on node i (0-based), closed when the test
// ends.
func (g *galeraDB) session(t testing.TB, i int, opts ...dsync.Option) *dsync.Session {
	t.Helper()
	s, err := dsync.NewSession(context.Background(), g.db[i], opts...)
	if err != nil {
		t.Fatalf("NewSession on node %d: %v", i+1, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// overlapDetector counts critical sections entered while another holder in
// a conflicting mode had not yet left: proof of two holders at once,
// since a holder leaves before it calls Unlock.
type overlapDetector struct {
	writers, readers atomic.Int32
	overlaps         atomic.Int64
	maxHolders       atomic.Int32 // most exclusive holders seen at once
}

// enter records an exclusive (write) hold.
func (d *overlapDetector) enter() {
	w := d.writers.Add(1)
	if w > 1 || d.readers.Load() > 0 {
		d.overlaps.Add(1)
	}
	for {
		m := d.maxHolders.Load()
		if w <= m || d.maxHolders.CompareAndSwap(m, w) {
			break
		}
	}
}

// leave ends an exclusive hold.
func (d *overlapDetector) leave() { d.writers.Add(-1) }

// rEnter records a shared (read) hold.
func (d *overlapDetector) rEnter() {
	d.readers.Add(1)
	if d.writers.Load() > 0 {
		d.overlaps.Add(1)
	}
}

// rLeave ends a shared hold.
func (d *overlapDetector) rLeave() { d.readers.Add(-1) }

// fenceLog records fences in acquisition order (appended under the lock).
type fenceLog struct {
	mu     sync.Mutex
	fences []int64 // guarded by mu
}

func (f *fenceLog) add(fence int64) {
	f.mu.Lock()
	f.fences = append(f.fences, fence)
	f.mu.Unlock()
}

// decreases returns how many fences were not greater than the one before,
// and the first such pair.
func (f *fenceLog) decreases() (n int, first string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 1; i < len(f.fences); i++ {
		if f.fences[i] <= f.fences[i-1] {
			if n == 0 {
				first = fmt.Sprintf("acquisition %d got fence %d after %d", i, f.fences[i], f.fences[i-1])
			}
			n++
		}
	}
	return n, first
}

// errorLog collects the errors of concurrent workers.
type errorLog struct {
	mu   sync.Mutex
	errs []string // guarded by mu
}

func (e *errorLog) add(format string, args ...any) {
	e.mu.Lock()
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

func (e *errorLog) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.errs)
}

// String returns the number of errors and the first few.
func (e *errorLog) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	show := e.errs[:min(len(e.errs), 10)]
	return fmt.Sprintf("%d errors: %s", len(e.errs), strings.Join(show, "; "))
}

// percentile returns the p-th percentile (0..100) of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p/100))]
}

// TestGaleraMutexCounterProcesses runs one worker process per node, each
// incrementing a counter row by read-modify-write under one Mutex through
// its own node. Lost updates would leave the counter short on some node;
// the fences, in counter order, must be strictly increasing.
func TestGaleraMutexCounterProcesses(t *testing.T) {
	const goroutines, iterations = 2, 40
	g := newGaleraDB(t)
	table := g.name + ".counter"
	g.exec(t,
		"CREATE TABLE "+table+" (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO "+table+" VALUES (1, 0)",
		"CREATE TABLE "+table+"_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL, value BIGINT NOT NULL)")
	name := lockName(t)
	start := time.Now()
	var children []*child
	for i := range galeraNodes {
		children = append(children, startChild(t, childConfig{Role: "counter", DSN: g.dsn[i], Name: name,
			Table: table, Goroutines: goroutines, Iterations: iterations}))
	}
	for i, c := range children {
		if err := c.Wait(); err != nil {
			t.Errorf("worker process on node %d: %v", i+1, err)
		}
	}
	took := time.Since(start)
	const want = galeraNodes * goroutines * iterations
	t.Logf("%d increments by %d processes (one per node, %d goroutines each) in %v: %.0f holds/s",
		want, galeraNodes, goroutines, took.Round(time.Millisecond), want/took.Seconds())
	if t.Failed() {
		t.FailNow()
	}
	for i := range galeraNodes {
		db := g.synced(t, i)
		var got int64
		if err := db.QueryRow("SELECT value FROM " + table + " WHERE id = 1").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("node %d: counter: got %d; want %d", i+1, got, want)
		}
		// AUTO_INCREMENT is interleaved by node, so seq is not commit
		// order: the counter value is.
		rows, err := db.Query("SELECT fence, value FROM " + table + "_log ORDER BY value")
		if err != nil {
			t.Fatal(err)
		}
		var n, lastFence int64
		for rows.Next() {
			var fence, value int64
			if err := rows.Scan(&fence, &value); err != nil {
				t.Fatal(err)
			}
			if value != n+1 || fence <= lastFence {
				t.Errorf("node %d: log row %d: value %d, fence %d after %d; want value %d and a greater fence", i+1, n, value, fence, lastFence, n+1)
				break
			}
			n, lastFence = value, fence
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("node %d: log rows 1..%d; want 1..%d", i+1, n, want)
		}
	}
}

// TestGaleraFairMutexFIFO has a holder on node 1 and waiters arriving 300ms
// apart on nodes 2, 3, 1, 2, 3, 1, 2, each in its own session; once the
// holder unlocks they must acquire in arrival order, one at a time, with
// increasing fences.
func TestGaleraFairMutexFIFO(t *testing.T) {
	const gap, hold = 300 * time.Millisecond, 20 * time.Millisecond
	nodes := []int{1, 2, 0, 1, 2, 0, 1} // 0-based: nodes 2, 3, 1, 2, 3, 1, 2
	g := newGaleraDB(t)
	name := lockName(t)
	ctx := context.Background()
	holder := dsync.NewFairMutex(g.session(t, 0), name)
	waiters := make([]*dsync.FairMutex, len(nodes))
	for i, n := range nodes {
		waiters[i] = dsync.NewFairMutex(g.session(t, n), name)
	}
	if err := holder.Lock(ctx); err != nil {
		t.Fatalf("holder Lock: %v", err)
	}
	var det overlapDetector
	det.enter()
	var fences fenceLog
	fences.add(holder.Fence())

	var (
		mu       sync.Mutex
		order    []int       // waiter indices in acquisition order; guarded by mu
		acquired []time.Time // when each Lock returned, in acquisition order
		released []time.Time // when each holder called Unlock; [0] is the first holder's
		errs     errorLog
		wg       sync.WaitGroup
	)
	lockCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for i, m := range waiters {
		goCounted(&wg, func() {
			time.Sleep(time.Duration(i) * gap)
			if err := m.Lock(lockCtx); err != nil {
				errs.add("waiter %d (node %d) Lock: %v", i, nodes[i]+1, err)
				return
			}
			det.enter()
			fences.add(m.Fence())
			mu.Lock()
			order = append(order, i)
			acquired = append(acquired, time.Now())
			mu.Unlock()
			time.Sleep(hold)
			det.leave()
			mu.Lock()
			released = append(released, time.Now())
			mu.Unlock()
			if err := m.Unlock(ctx); err != nil {
				errs.add("waiter %d (node %d) Unlock: %v", i, nodes[i]+1, err)
			}
		})
	}
	time.Sleep(time.Duration(len(waiters)) * gap)
	det.leave()
	mu.Lock()
	released = append(released, time.Now())
	mu.Unlock()
	if err := holder.Unlock(ctx); err != nil {
		errs.add("holder Unlock: %v", err)
	}
	wg.Wait()

	var handoffs []time.Duration
	for k := range acquired {
		handoffs = append(handoffs, acquired[k].Sub(released[k]))
	}
	t.Logf("acquisition order %v (want 0..%d); handoff from Unlock to the next Lock returning: p50 %v, max %v; overlaps %d",
		order, len(waiters)-1, percentile(slices.Clone(handoffs), 50).Round(10*time.Microsecond),
		percentile(slices.Clone(handoffs), 100).Round(10*time.Microsecond), det.overlaps.Load())
	if errs.len() > 0 {
		t.Errorf("%v", &errs)
	}
	if n := det.overlaps.Load(); n != 0 {
		t.Errorf("overlaps: got %d; want 0", n)
	}
	if want := []int{0, 1, 2, 3, 4, 5, 6}; !slices.Equal(order, want) {
		t.Errorf("acquisition order: got %v; want %v (arrival order)", order, want)
	}
	if n, first := fences.decreases(); n != 0 {
		t.Errorf("fences not increasing in acquisition order: %d times, first: %s", n, first)
	}
}

// simultaneousHold is how long each holder of a simultaneous round holds
// the lock. The detector sees two holders only when the second Lock
// returns before the first holder leaves: with 2ms holds it missed most of
// the double grants of the library before the Galera fix (0 to 3 overlaps
// in 100 rounds, so a run could pass), with 20ms it saw 3 to 12 in each of
// five runs, for about 5s more per test.
const simultaneousHold = 20 * time.Millisecond

// simultaneousRounds runs rounds in which one goroutine per node calls its
// lock function at the same instant (a barrier), holds for hold and
// unlocks. role(round, node) returns the lock and unlock of that node in
// that round and whether it is a read hold. It returns the overlaps seen,
// the fences of write holds in acquisition order, and the errors. It stops
// early after 10 errors or when a round does not finish within a minute.
func simultaneousRounds(t *testing.T, rounds int, hold time.Duration,
	role func(round, node int) (lock, unlock func(context.Context) error, fence func() int64, read bool),
) (*overlapDetector, *fenceLog, *errorLog, time.Duration) {
	var (
		det    = &overlapDetector{}
		fences = &fenceLog{}
		errs   = &errorLog{}
	)
	ctx := context.Background()
	start := time.Now()
	for r := range rounds {
		roundCtx, cancel := context.WithTimeout(ctx, time.Minute)
		var ready, done sync.WaitGroup
		barrier := make(chan struct{})
		for n := range galeraNodes {
			lock, unlock, fence, read := role(r, n)
			ready.Add(1)
			goCounted(&done, func() {
				ready.Done()
				<-barrier
				if err := lock(roundCtx); err != nil {
					errs.add("round %d node %d lock: %v", r, n+1, err)
					return
				}
				if read {
					det.rEnter()
					time.Sleep(hold)
					det.rLeave()
				} else {
					det.enter()
					fences.add(fence())
					time.Sleep(hold)
					det.leave()
				}
				if err := unlock(ctx); err != nil {
					errs.add("round %d node %d unlock: %v", r, n+1, err)
				}
			})
		}
		ready.Wait()
		close(barrier)
		done.Wait()
		timedOut := roundCtx.Err() != nil
		cancel()
		if timedOut || errs.len() >= 10 {
			t.Errorf("stopped after round %d of %d (round timed out: %v)", r+1, rounds, timedOut)
			break
		}
	}
	return det, fences, errs, time.Since(start)
}

// TestGaleraFairMutexSimultaneous has one FairMutex waiter per node, each
// in its own session, call Lock at the same instant, 100 times: never two
// holders, and fences strictly increasing in acquisition order.
func TestGaleraFairMutexSimultaneous(t *testing.T) {
	const rounds = 100
	g := newGaleraDB(t)
	name := lockName(t)
	var locks [galeraNodes]*dsync.FairMutex
	for n := range galeraNodes {
		locks[n] = dsync.NewFairMutex(g.session(t, n), name)
	}
	det, fences, errs, took := simultaneousRounds(t, rounds, simultaneousHold, func(_, n int) (func(context.Context) error, func(context.Context) error, func() int64, bool) {
		return locks[n].Lock, locks[n].Unlock, locks[n].Fence, false
	})
	holds := len(fences.fences)
	t.Logf("%d rounds x %d nodes: %d holds in %v (%.1f holds/s), overlaps %d (most holders at once %d), %d errors",
		rounds, galeraNodes, holds, took.Round(time.Millisecond), float64(holds)/took.Seconds(),
		det.overlaps.Load(), det.maxHolders.Load(), errs.len())
	if n := det.overlaps.Load(); n != 0 {
		t.Errorf("overlaps: got %d; want 0", n)
	}
	if n, first := fences.decreases(); n != 0 {
		t.Errorf("fences not increasing in acquisition order: %d times, first: %s", n, first)
	}
	if errs.len() > 0 {
		t.Errorf("%v", errs)
	}
}

// TestGaleraRWMutexWriterVsReaders has, in each of 100 rounds, a writer on
// one node (node 1, 2, 3 in turn) and a reader on each other node, each in
// its own session, call Lock or RLock at the same instant: never a reader
// while a writer holds, never two writers, and writer fences strictly
// increasing.
func TestGaleraRWMutexWriterVsReaders(t *testing.T) {
	const rounds = 100
	g := newGaleraDB(t)
	name := lockName(t)
	var locks [galeraNodes]*dsync.RWMutex
	for n := range galeraNodes {
		locks[n] = dsync.NewRWMutex(g.session(t, n), name)
	}
	det, fences, errs, took := simultaneousRounds(t, rounds, simultaneousHold, func(r, n int) (func(context.Context) error, func(context.Context) error, func() int64, bool) {
		if r%galeraNodes == n {
			return locks[n].Lock, locks[n].Unlock, locks[n].Fence, false
		}
		return locks[n].RLock, locks[n].RUnlock, nil, true
	})
	t.Logf("%d rounds of 1 writer + %d readers on different nodes in %v, overlaps %d, %d errors",
		rounds, galeraNodes-1, took.Round(time.Millisecond), det.overlaps.Load(), errs.len())
	if n := det.overlaps.Load(); n != 0 {
		t.Errorf("overlaps (a reader or writer while a writer held): got %d; want 0", n)
	}
	if n, first := fences.decreases(); n != 0 {
		t.Errorf("writer fences not increasing in acquisition order: %d times, first: %s", n, first)
	}
	if errs.len() > 0 {
		t.Errorf("%v", errs)
	}
}

// TestGaleraMutexShares has all three nodes contend for one Mutex for 10s,
// two goroutines per node sharing the node's session: no node is starved
// (no Lock waits longer than maxWait, which the claims of starving waiters
// bound), each node gets at least minShare of the acquisitions, with no
// overlap and increasing fences. The shares themselves are a timing figure
// that follows the servers (docs/OPERATIONS.md, Measured on a cluster,
// has them with their command): minShare only catches a node shut out, as one was before claims
// (0 of 3,046 acquisitions).
func TestGaleraMutexShares(t *testing.T) {
	const (
		perNode  = 2
		duration = 10 * time.Second
		minShare = 0.10
		maxWait  = 2 * time.Second
	)
	g := newGaleraDB(t)
	name := lockName(t)
	var (
		det    overlapDetector
		fences fenceLog
		errs   errorLog
		counts [galeraNodes]atomic.Int64
		waited [galeraNodes]atomic.Int64 // longest Lock, in ns
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), duration+time.Minute)
	defer cancel()
	var mutexes [galeraNodes]*dsync.Mutex
	for n := range galeraNodes {
		mutexes[n] = dsync.NewMutex(g.session(t, n), name)
	}
	start := time.Now()
	end := start.Add(duration)
	for n := range galeraNodes {
		for range perNode {
			goCounted(&wg, func() {
				m := mutexes[n]
				for time.Now().Before(end) && errs.len() < 10 {
					called := time.Now()
					if err := m.Lock(ctx); err != nil {
						errs.add("node %d Lock: %v", n+1, err)
						continue
					}
					for w := int64(time.Since(called)); ; {
						old := waited[n].Load()
						if w <= old || waited[n].CompareAndSwap(old, w) {
							break
						}
					}
					det.enter()
					fences.add(m.Fence())
					counts[n].Add(1)
					det.leave()
					if err := m.Unlock(ctx); err != nil {
						errs.add("node %d Unlock: %v", n+1, err)
					}
				}
			})
		}
	}
	wg.Wait()
	took := time.Since(start)
	var total int64
	for n := range galeraNodes {
		total += counts[n].Load()
	}
	var report []string
	for n := range galeraNodes {
		c := counts[n].Load()
		report = append(report, fmt.Sprintf("node %d: %d (%.1f%%, %.0f holds/s, longest Lock %v)", n+1, c,
			100*float64(c)/float64(max(total, 1)), float64(c)/took.Seconds(),
			time.Duration(waited[n].Load()).Round(time.Millisecond)))
	}
	t.Logf("%d acquisitions in %v (%.0f holds/s): %s; overlaps %d",
		total, took.Round(time.Millisecond), float64(total)/took.Seconds(), strings.Join(report, ", "), det.overlaps.Load())
	if n := det.overlaps.Load(); n != 0 {
		t.Errorf("overlaps: got %d; want 0", n)
	}
	if n, first := fences.decreases(); n != 0 {
		t.Errorf("fences not increasing in acquisition order: %d times, first: %s", n, first)
	}
	if errs.len() > 0 {
		t.Errorf("%v", &errs)
	}
	for n := range galeraNodes {
		if share := float64(counts[n].Load()) / float64(max(total, 1)); share < minShare {
			t.Errorf("node %d: %.1f%% of the acquisitions; want at least %.0f%%", n+1, 100*share, 100*minShare)
		}
		if w := time.Duration(waited[n].Load()); w > maxWait {
			t.Errorf("node %d: a Lock waited %v; want at most %v (starved)", n+1, w, maxWait)
		}
	}
}

// TestGaleraConcurrentNewSessions starts 9 sessions at once, 3 per node,
// each through a *sql.DB of its own as separate processes would, each
// taking and releasing a Mutex at once: 10 rounds on a table prefix with no
// tables yet (a new one each round, so the sessions create the tables
// while the others already lock), then 10 rounds on the tables the first
// round created while one session per node keeps locking a Mutex and a
// FairMutex. Every NewSession, lock, unlock and Close must succeed.
func TestGaleraConcurrentNewSessions(t *testing.T) {
	const rounds, perNode = 10, 3
	g := newGaleraDB(t)
	ctx := context.Background()
	var (
		errs      errorLog
		mu        sync.Mutex
		latencies = map[bool][]time.Duration{} // NewSession latencies by "tables existed"; guarded by mu
	)
	prefixOf := func(r int) string { return fmt.Sprintf("g%08x_%d_", time.Now().UnixNano()&0xffffffff, r) }
	oneRound := func(phase string, r int, prefix string, existing bool) {
		var wg sync.WaitGroup
		barrier := make(chan struct{})
		for i := range galeraNodes * perNode {
			n := i % galeraNodes
			db, err := sql.Open("mysql", g.dsn[n])
			if err != nil {
				t.Fatal(err)
			}
			goCounted(&wg, func() {
				defer db.Close()
				<-barrier
				start := time.Now()
				s, err := dsync.NewSession(ctx, db, dsync.WithTablePrefix(prefix))
				if err != nil {
					errs.add("%s round %d node %d NewSession: %v", phase, r, n+1, err)
					return
				}
				mu.Lock()
				latencies[existing] = append(latencies[existing], time.Since(start))
				mu.Unlock()
				m := dsync.NewMutex(s, fmt.Sprintf("%s/new/%d/%d", t.Name(), r, i))
				if err := m.Lock(ctx); err != nil {
					errs.add("%s round %d node %d Lock: %v", phase, r, n+1, err)
				} else if err := m.Unlock(ctx); err != nil {
					errs.add("%s round %d node %d Unlock: %v", phase, r, n+1, err)
				}
				if err := s.Close(); err != nil {
					errs.add("%s round %d node %d Close: %v", phase, r, n+1, err)
				}
			})
		}
		close(barrier)
		wg.Wait()
	}

	var prefix string
	for r := range rounds { // each on an empty prefix: the sessions create the tables
		p := prefixOf(r)
		if r == 0 {
			prefix = p
		}
		oneRound("empty-prefix", r, p, false)
	}
	emptyErrs := errs.len()

	// One session per node locks a Mutex and a FairMutex in a loop while
	// the rounds on existing tables start their sessions.
	stop := make(chan struct{})
	var background sync.WaitGroup
	var backgroundPairs atomic.Int64
	for n := range galeraNodes {
		s := g.session(t, n, dsync.WithTablePrefix(prefix))
		m := dsync.NewMutex(s, t.Name()+"/mutex")
		f := dsync.NewFairMutex(s, t.Name()+"/fair")
		goCounted(&background, func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				lockCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if err := m.Lock(lockCtx); err != nil {
					errs.add("background node %d Mutex Lock: %v", n+1, err)
				} else if err := m.Unlock(ctx); err != nil {
					errs.add("background node %d Mutex Unlock: %v", n+1, err)
				}
				if err := f.Lock(lockCtx); err != nil {
					errs.add("background node %d FairMutex Lock: %v", n+1, err)
				} else if err := f.Unlock(ctx); err != nil {
					errs.add("background node %d FairMutex Unlock: %v", n+1, err)
				}
				cancel()
				backgroundPairs.Add(2)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	start := time.Now()
	for r := range rounds {
		oneRound("existing-tables", r, prefix, true)
	}
	close(stop)
	background.Wait()
	took := time.Since(start)

	for _, existing := range []bool{false, true} {
		ls := latencies[existing]
		what := "on empty prefixes"
		if existing {
			what = "on existing tables"
		}
		t.Logf("%d rounds of %d concurrent NewSessions (%d per node) %s: %d started, NewSession p50 %v, max %v",
			rounds, galeraNodes*perNode, perNode, what, len(ls),
			percentile(slices.Clone(ls), 50).Round(100*time.Microsecond), percentile(slices.Clone(ls), 100).Round(100*time.Microsecond))
	}
	t.Logf("errors: %d on empty prefixes, %d on existing tables; background lock+unlock pairs meanwhile: %d in %v",
		emptyErrs, errs.len()-emptyErrs, backgroundPairs.Load(), took.Round(time.Millisecond))
	if errs.len() > 0 {
		t.Errorf("%v", &errs)
	}
}

// probe records the latency of small commits on one node, every 50ms: the
// longest one tells how long a commit stalls.
type probe struct {
	maxLatency time.Duration // guarded by mu
	maxAt      time.Time     // when the longest commit started; guarded by mu
	commits    int           // guarded by mu
	errs       int           // guarded by mu
	lastErr    error         // guarded by mu
	mu         sync.Mutex
}

// run inserts a row into table through db every 50ms until stop closes.
func (p *probe) run(db *sql.DB, table string, node int, stop <-chan struct{}) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		_, err := db.ExecContext(ctx, "INSERT INTO "+table+" (node) VALUES (?)", node)
		took := time.Since(start)
		cancel()
		p.mu.Lock()
		if err != nil {
			p.errs++
			p.lastErr = err
		} else {
			p.commits++
		}
		if took > p.maxLatency {
			p.maxLatency, p.maxAt = took, start
		}
		p.mu.Unlock()
	}
}

// outcome is what became of one increment in TestGaleraNodeKilledUnderLoad.
type outcome int

const (
	committed  outcome = iota // COMMIT returned OK
	rolledBack                // failed before COMMIT: not applied
	unknown                   // COMMIT failed: applied or not
)

// TestGaleraNodeKilledUnderLoad has one worker per node take a Mutex in a
// loop, with the default TTL, and increment a counter in a transaction
// under it; then node 3 is SIGKILLed while its worker holds the lock, the
// worst case. The survivors must take over no sooner than node 3's session
// learns it lost its lease (Done), keep acquiring (no gap longer than
// TTL + 2s), never overlap, keep their sessions through the cluster's
// commit stall, and see strictly increasing fences; after node 3 rejoins,
// every node's counter must equal the number of increments that committed.
// It reports how long commits stalled on the survivors.
func TestGaleraNodeKilledUnderLoad(t *testing.T) {
	const (
		victim    = 2                // node 3, 0-based
		warmUp    = 3 * time.Second  // load on all nodes before the kill
		holdWait  = 20 * time.Second // most time for node 3 to get the lock after warmUp
		afterKill = 22 * time.Second
		maxGap    = dsync.DefaultTTL + 2*time.Second
	)
	g := newGaleraDB(t)
	table := g.name + ".counter"
	g.exec(t,
		"CREATE TABLE "+table+" (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO "+table+" VALUES (1, 0)",
		"CREATE TABLE "+table+"_log (op BIGINT PRIMARY KEY, node INT NOT NULL, fence BIGINT NOT NULL, value BIGINT NOT NULL)",
		"CREATE TABLE "+g.name+".probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, node INT NOT NULL)")
	name := lockName(t)
	var sessions [galeraNodes]*dsync.Session
	for n := range galeraNodes {
		sessions[n] = g.session(t, n) // default TTL
	}

	var (
		det      overlapDetector
		fences   fenceLog
		errs     errorLog // survivors' errors, and the victim's before the kill
		mu       sync.Mutex
		acquired [galeraNodes][]time.Time               // guarded by mu
		results  = map[int64]outcome{}                  // op -> outcome; guarded by mu
		killedAt atomic.Pointer[time.Time]              // set just before the kill
		victimEr string                                 // the victim's first error after the kill; guarded by mu
		doneAt   [galeraNodes]atomic.Pointer[time.Time] // when each session's Done closed
		wg       sync.WaitGroup

		holdForKill atomic.Bool           // the victim's next hold waits for the kill
		holding     = make(chan struct{}) // closed by the victim holding with holdForKill set
		heldFence   atomic.Int64          // the fence of that hold
	)
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	for n := range galeraNodes {
		goCounted(&wg, func() {
			select {
			case <-sessions[n].Done():
				now := time.Now()
				doneAt[n].Store(&now)
			case <-runCtx.Done():
			}
		})
	}
	increment := func(n int, op, fence int64) (outcome, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tx, err := g.db[n].BeginTx(ctx, nil)
		if err != nil {
			return rolledBack, err
		}
		var v int64
		err = tx.QueryRowContext(ctx, "SELECT value FROM "+table+" WHERE id = 1").Scan(&v)
		if err == nil {
			_, err = tx.ExecContext(ctx, "UPDATE "+table+" SET value = ? WHERE id = 1", v+1)
		}
		if err == nil {
			_, err = tx.ExecContext(ctx, "INSERT INTO "+table+"_log (op, node, fence, value) VALUES (?, ?, ?, ?)", op, n+1, fence, v+1)
		}
		if err != nil {
			_ = tx.Rollback()
			return rolledBack, err
		}
		if err := tx.Commit(); err != nil {
			return unknown, err
		}
		return committed, nil
	}
	for n := range galeraNodes {
		goCounted(&wg, func() {
			m := dsync.NewMutex(sessions[n], name)
			afterKill := func() bool { return n == victim && killedAt.Load() != nil }
			fail := func(format string, args ...any) bool {
				if afterKill() {
					mu.Lock()
					victimEr = fmt.Sprintf(format, args...)
					mu.Unlock()
					return true // the victim stops at its first error after the kill
				}
				errs.add("node %d: "+format, append([]any{n + 1}, args...)...)
				return errs.len() >= 20
			}
			for op := int64(n+1) * 1_000_000; runCtx.Err() == nil; op++ {
				if err := m.Lock(runCtx); err != nil {
					if runCtx.Err() != nil {
						return
					}
					if fail("Lock: %v", err) {
						return
					}
					continue
				}
				det.enter()
				fence := m.Fence()
				fences.add(fence)
				mu.Lock()
				acquired[n] = append(acquired[n], time.Now())
				mu.Unlock()
				res, err := increment(n, op, fence)
				mu.Lock()
				results[op] = res
				mu.Unlock()
				if n == victim && err == nil && holdForKill.CompareAndSwap(true, false) {
					// Hold on across the kill. The hold ends, as far as this
					// process knows, when the session says its lease is
					// lost: a survivor acquiring before that is an overlap.
					heldFence.Store(fence)
					close(holding)
					select {
					case <-sessions[n].Done():
					case <-runCtx.Done():
					}
				}
				det.leave()
				stop := false
				if err != nil {
					stop = fail("increment: %v", err)
				}
				if err := m.Unlock(context.Background()); err != nil {
					stop = fail("Unlock: %v", err) || stop
				}
				if stop {
					return
				}
			}
		})
	}
	probes := [galeraNodes - 1]probe{}
	probeStop := make(chan struct{})
	for n := range galeraNodes - 1 {
		goCounted(&wg, func() { probes[n].run(g.db[n], g.name+".probe", n+1, probeStop) })
	}

	time.Sleep(warmUp)
	holdForKill.Store(true)
	victimHeld := true
	select {
	case <-holding:
	case <-time.After(holdWait):
		victimHeld = false
		t.Errorf("node 3's worker did not get the lock within %v (while the others did): killing it under load instead", holdWait)
	}
	mu.Lock()
	before := [galeraNodes]int{len(acquired[0]), len(acquired[1]), len(acquired[2])}
	mu.Unlock()
	now := time.Now()
	killedAt.Store(&now)
	galeraRun(t, "kill", fmt.Sprint(victim+1))
	restarted := false
	t.Cleanup(func() {
		if !restarted { // leave a whole cluster to the tests that follow
			galeraRun(t, "restart", fmt.Sprint(victim+1))
		}
	})
	// Prove the fault: node 3 refuses connections, and the survivors
	// evict it from the cluster.
	if err := galeraExec(context.Background(), g.base[victim]+"?timeout=2s", "SELECT 1"); err == nil {
		t.Error("node 3 still answers after the kill")
	}
	var evicted time.Duration
	for deadline := now.Add(afterKill); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if size, _, err := galeraState(context.Background(), g.base[0]); err == nil && size == galeraNodes-1 {
			evicted = time.Since(now)
			break
		}
	}
	if evicted == 0 {
		t.Errorf("node 1 still counts %d nodes %v after node 3 was killed", galeraNodes, afterKill)
	}
	time.Sleep(time.Until(now.Add(afterKill)))
	stopRun()
	close(probeStop)
	wg.Wait()
	end := time.Now()

	// The survivors' longest stretch without an acquisition, from their last
	// acquisition before the kill to the end of the load.
	mu.Lock()
	var survivors []time.Time
	for n := range galeraNodes {
		if n != victim {
			survivors = append(survivors, acquired[n]...)
		}
	}
	slices.SortFunc(survivors, func(a, b time.Time) int { return a.Compare(b) })
	from := now
	for _, at := range survivors {
		if at.Before(now) {
			from = at
		}
	}
	var gap time.Duration
	var gapStart time.Time
	last := from
	for _, at := range append(survivors, end) {
		if at.Before(from) {
			continue
		}
		if d := at.Sub(last); d > gap {
			gap, gapStart = d, last
		}
		last = at
	}
	var takeover time.Time // the survivors' first acquisition after the kill
	for _, at := range survivors {
		if at.After(now) {
			takeover = at
			break
		}
	}
	var after [galeraNodes]int
	for n := range galeraNodes {
		after[n] = len(acquired[n]) - before[n]
	}
	var ok, uncertain int64
	for _, res := range results {
		switch res {
		case committed:
			ok++
		case unknown:
			uncertain++
		}
	}
	victimErr := victimEr
	mu.Unlock()

	t.Logf("acquisitions before the kill (%v): %v; after (%v): %v; node 3 evicted %v after the kill; "+
		"survivors' longest gap without an acquisition %v, starting %v after the kill (limit %v); overlaps %d",
		warmUp, before, afterKill, after, evicted.Round(time.Millisecond), gap.Round(time.Millisecond),
		gapStart.Sub(now).Round(time.Millisecond), maxGap, det.overlaps.Load())
	for n := range probes {
		p := &probes[n]
		t.Logf("commit stall on node %d: longest 50ms-probe commit took %v, starting %v after the kill (%d commits, %d errors, last %v)",
			n+1, p.maxLatency.Round(time.Millisecond), p.maxAt.Sub(now).Round(time.Millisecond), p.commits, p.errs, p.lastErr)
	}
	for n := range galeraNodes {
		if at := doneAt[n].Load(); at != nil {
			t.Logf("node %d: session Done closed %v after the kill (Err: %v)", n+1, at.Sub(now).Round(time.Millisecond), sessions[n].Err())
		}
	}
	t.Logf("node 3's worker stopped on: %s", victimErr)
	victimDone := doneAt[victim].Load()
	if victimHeld {
		switch {
		case takeover.IsZero():
			t.Errorf("the survivors never took over the lock node 3 held (fence %d) when it died", heldFence.Load())
		case victimDone == nil:
			t.Errorf("the survivors took the lock node 3 held %v after the kill, and node 3's session never learnt it had lost its lease",
				takeover.Sub(now).Round(time.Millisecond))
		default:
			t.Logf("node 3 held the lock (fence %d) when it died; its session's Done closed %v after the kill, the survivors took over %v after the kill",
				heldFence.Load(), victimDone.Sub(now).Round(time.Millisecond), takeover.Sub(now).Round(time.Millisecond))
			if takeover.Before(*victimDone) {
				t.Errorf("the survivors took the lock %v before node 3's session learnt it had lost its lease; want Done first",
					victimDone.Sub(takeover).Round(time.Millisecond))
			}
		}
	}

	if n := det.overlaps.Load(); n != 0 {
		t.Errorf("overlaps: got %d; want 0", n)
	}
	if n, first := fences.decreases(); n != 0 {
		t.Errorf("fences not increasing in acquisition order: %d times, first: %s", n, first)
	}
	if errs.len() > 0 {
		t.Errorf("%v", &errs)
	}
	for n := range galeraNodes {
		if n == victim {
			continue
		}
		if err := sessions[n].Err(); err != nil || doneAt[n].Load() != nil {
			t.Errorf("node %d: session lost (Err %v); want it live through the stall with TTL %v", n+1, err, dsync.DefaultTTL)
		}
		if after[n] == 0 {
			t.Errorf("node %d: no acquisition after the kill", n+1)
		}
	}
	if gap > maxGap {
		t.Errorf("survivors went %v without an acquisition; want at most %v (TTL + 2s)", gap, maxGap)
	}

	start := time.Now()
	galeraRun(t, "restart", fmt.Sprint(victim+1))
	restarted = true
	t.Logf("node 3 rejoined and all nodes Synced %v after the restart began", time.Since(start).Round(time.Millisecond))

	// The counter on every node equals the increments that committed, plus
	// those whose COMMIT failed but landed (the log says which).
	for n := range galeraNodes {
		db := g.synced(t, n)
		var value, logged, landedUnknown, missing int64
		if err := db.QueryRow("SELECT value FROM " + table + " WHERE id = 1").Scan(&value); err != nil {
			t.Fatalf("node %d: %v", n+1, err)
		}
		rows, err := db.Query("SELECT op, value FROM " + table + "_log ORDER BY value")
		if err != nil {
			t.Fatalf("node %d: %v", n+1, err)
		}
		seen := map[int64]bool{}
		for rows.Next() {
			var op, v int64
			if err := rows.Scan(&op, &v); err != nil {
				t.Fatal(err)
			}
			logged++
			if v != logged {
				t.Errorf("node %d: log row %d has value %d; want %d (a lost or doubled update)", n+1, logged, v, logged)
			}
			seen[op] = true
			mu.Lock()
			res, known := results[op]
			mu.Unlock()
			switch {
			case !known || res == rolledBack:
				t.Errorf("node %d: op %d is logged but its transaction failed before COMMIT", n+1, op)
			case res == unknown:
				landedUnknown++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		for op, res := range results {
			if res == committed && !seen[op] {
				missing++
			}
		}
		mu.Unlock()
		t.Logf("node %d: counter %d, log rows %d, committed increments %d, of which missing %d, plus %d of %d with an unknown outcome",
			n+1, value, logged, ok, missing, landedUnknown, uncertain)
		if value != logged || value != ok+landedUnknown || missing != 0 {
			t.Errorf("node %d: counter %d; want %d (committed %d + landed unknown %d), log rows %d, committed but missing %d",
				n+1, value, ok+landedUnknown, ok, landedUnknown, logged, missing)
		}
	}
}

// TestGaleraSweep runs the clean-up of free rows on every node (a session
// per node, each sweeping with the smallest age, 1s) while two goroutines
// per node lock and unlock a Mutex, a FairMutex and an RWMutex (write and
// read) with pauses of up to 3s, so that rows are deleted through one node
// while another node locks them. No two holders may overlap, the fences of
// each name must increase in acquisition order, a Mutex touched every 5s,
// through each node in turn, must have its row deleted between touches (its
// fence jumps when its row is created again), and once the traffic stops
// the tables must empty.
func TestGaleraSweep(t *testing.T) {
	const duration = 15 * time.Second
	g := newGaleraDB(t)
	var sessions [galeraNodes]*dsync.Session
	for n := range galeraNodes {
		sessions[n] = g.session(t, n, dsync.WithFreeRowAge(time.Second))
	}
	type named struct {
		det    overlapDetector
		fences fenceLog
	}
	mutex, fair, rw, cold := &named{}, &named{}, &named{}, &named{}
	base := lockName(t)
	var errs errorLog
	ctx, cancel := context.WithTimeout(context.Background(), duration+time.Minute)
	defer cancel()
	exclusive := func(what *named, fence int64) {
		what.det.enter()
		what.fences.add(fence)
		time.Sleep(time.Duration(mrand.N(5000)) * time.Microsecond)
		what.det.leave()
	}
	end := time.Now().Add(duration)
	var wg sync.WaitGroup
	for n := range galeraNodes {
		s := sessions[n]
		for range 2 {
			goCounted(&wg, func() {
				for time.Now().Before(end) && errs.len() < 10 {
					var err error
					switch mrand.N(4) {
					case 0:
						m := dsync.NewMutex(s, base+"/mutex")
						if err = m.Lock(ctx); err == nil {
							exclusive(mutex, m.Fence())
							err = m.Unlock(ctx)
						}
					case 1:
						m := dsync.NewFairMutex(s, base+"/fair")
						if err = m.Lock(ctx); err == nil {
							exclusive(fair, m.Fence())
							err = m.Unlock(ctx)
						}
					case 2:
						m := dsync.NewRWMutex(s, base+"/rw")
						if err = m.Lock(ctx); err == nil {
							exclusive(rw, m.Fence())
							err = m.Unlock(ctx)
						}
					default:
						m := dsync.NewRWMutex(s, base+"/rw")
						if err = m.RLock(ctx); err == nil {
							rw.det.rEnter()
							time.Sleep(time.Duration(mrand.N(5000)) * time.Microsecond)
							rw.det.rLeave()
							err = m.RUnlock(ctx)
						}
					}
					if err != nil {
						errs.add("node %d: %v", n+1, err)
					}
					time.Sleep(time.Duration(mrand.N(3000)) * time.Millisecond)
				}
			})
		}
	}
	goCounted(&wg, func() {
		for i := 0; time.Now().Before(end) && errs.len() < 10; i++ {
			m := dsync.NewMutex(sessions[i%galeraNodes], base+"/cold")
			err := m.Lock(ctx)
			if err == nil {
				exclusive(cold, m.Fence())
				err = m.Unlock(ctx)
			}
			if err != nil {
				errs.add("node %d, cold: %v", i%galeraNodes+1, err)
			}
			time.Sleep(5 * time.Second)
		}
	})
	wg.Wait()
	if errs.len() > 0 {
		t.Errorf("%v", &errs)
	}
	for name, what := range map[string]*named{"Mutex": mutex, "FairMutex": fair, "RWMutex": rw, "cold Mutex": cold} {
		if n := what.det.overlaps.Load(); n != 0 {
			t.Errorf("%s: overlaps: got %d; want 0", name, n)
		}
		if n, first := what.fences.decreases(); n != 0 {
			t.Errorf("%s: fences not increasing in acquisition order: %d times, first: %s", name, n, first)
		}
		recreated := 0
		for i := 1; i < len(what.fences.fences); i++ {
			if what.fences.fences[i] > what.fences.fences[i-1]+1 {
				recreated++ // only a row created anew skips fences
			}
		}
		t.Logf("%s: %d exclusive acquisitions, row created again %d times", name, len(what.fences.fences), recreated)
		if what == cold && recreated == 0 {
			t.Errorf("cold Mutex: row never created again in %d acquisitions 5s apart; want the sweep to delete it between them",
				len(what.fences.fences))
		}
	}
	db := g.synced(t, 0)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var rows int
		if err := db.QueryRow("SELECT (SELECT COUNT(*) FROM dsync_lock) + (SELECT COUNT(*) FROM dsync_queue)").Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock and queue rows 30s after the traffic stopped: got %d; want 0", rows)
		}
	}
}

// TestGaleraLockTxUnsupported: LockTx and TryLockTx refuse a cluster with
// errors.ErrUnsupported (row locks are per node there), and Lock and TryLock
// of the name still work after the refusal.
func TestGaleraLockTxUnsupported(t *testing.T) {
	g := newGaleraDB(t)
	ctx := context.Background()
	s := g.session(t, 0)
	m := dsync.NewMutex(s, "locktx")
	tx, err := g.db[0].BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := m.LockTx(ctx, tx); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("LockTx on a cluster: got %v; want errors.ErrUnsupported", err)
	}
	if ok, err := m.TryLockTx(ctx, tx); ok || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("TryLockTx on a cluster: got %v, %v; want false, errors.ErrUnsupported", ok, err)
	}
	if ok, err := m.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after the refusals: got %v, %v; want true, nil", ok, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGaleraKindsRace has, in each of 60 rounds, a Mutex.Lock on one node
// and a FairMutex.Lock or an RWMutex.RLock on another, each in its own
// session, lock one new name at the same instant: the two kinds' creations
// of the name's rows write one row (the lock table's, by primary key), so
// certification lets one through and the other gets ErrOtherKind. Never
// both hold.
func TestGaleraKindsRace(t *testing.T) {
	const rounds = 60
	const hold = 20 * time.Millisecond
	g := newGaleraDB(t)
	bg := context.Background()
	var sessions [galeraNodes]*dsync.Session
	for n := range galeraNodes {
		sessions[n] = g.session(t, n)
	}
	var overlaps atomic.Int64
	errs := &errorLog{}
	wins := make(map[string]int)
	certFailures := func() (n int64) { // the cluster's, summed over the nodes
		for i := range galeraNodes {
			var name string
			var v int64
			if err := g.db[i].QueryRow("SHOW GLOBAL STATUS LIKE 'wsrep_local_cert_failures'").Scan(&name, &v); err != nil {
				t.Fatal(err)
			}
			n += v
		}
		return n
	}
	certBefore := certFailures()
	for r := range rounds {
		name := fmt.Sprintf("%s/%d", lockName(t), r)
		mutexNode, queuedNode := r%galeraNodes, (r+1)%galeraNodes
		m := dsync.NewMutex(sessions[mutexNode], name)
		rw := dsync.NewRWMutex(sessions[queuedNode], name)
		type side struct {
			kind         string
			lock, unlock func(context.Context) error
		}
		sides := [2]side{{"Mutex.Lock", m.Lock, m.Unlock}, {"FairMutex.Lock", rw.Lock, rw.Unlock}}
		if r%2 == 1 {
			sides[1] = side{"RWMutex.RLock", rw.RLock, rw.RUnlock}
		}
		var holders atomic.Int64
		var got [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, sd := range sides {
			goCounted(&wg, func() {
				ctx, cancel := context.WithTimeout(bg, 20*time.Second)
				defer cancel()
				<-start
				if i == 0 {
					// The queued side runs a statement or two before it
					// writes the lock row: let either side be first.
					time.Sleep(mrand.N(2 * time.Millisecond))
				}
				if got[i] = sd.lock(ctx); got[i] != nil {
					return
				}
				if holders.Add(1) > 1 {
					overlaps.Add(1)
				}
				time.Sleep(hold)
				holders.Add(-1)
				if err := sd.unlock(bg); err != nil {
					errs.add("round %d: %s unlock: %v", r, sd.kind, err)
				}
			})
		}
		close(start)
		wg.Wait()
		switch {
		case got[0] == nil && got[1] == nil:
			errs.add("round %d: %s and %s both held %q", r, sides[0].kind, sides[1].kind, name)
		case got[0] == nil && errors.Is(got[1], dsync.ErrOtherKind):
			wins[sides[0].kind]++
		case got[1] == nil && errors.Is(got[0], dsync.ErrOtherKind):
			wins[sides[1].kind]++
		default:
			errs.add("round %d: %s: %v; %s: %v; want one nil, the other ErrOtherKind", r, sides[0].kind, got[0], sides[1].kind, got[1])
		}
	}
	t.Logf("%d rounds, a Mutex and a queued lock on two nodes: won by %v, overlaps %d, %d errors, %d certification failures in the cluster meanwhile",
		rounds, wins, overlaps.Load(), errs.len(), certFailures()-certBefore)
	if n := overlaps.Load(); n != 0 {
		t.Errorf("overlaps: got %d; want 0", n)
	}
	if errs.len() > 0 {
		t.Errorf("%v", errs)
	}
}

// galeraQuestions returns the statements node i has received from its
// clients (Questions; the writes it applies for the other nodes are not
// counted).
func (g *galeraDB) questions(t testing.TB, i int) int64 {
	t.Helper()
	var name string
	var n int64
	if err := g.db[i].QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		t.Fatalf("node %d: %v", i+1, err)
	}
	return n
}

// TestGaleraWaiterStatements: on a cluster waiters poll (GET_LOCK, the
// doorbells' wake-up, is per node there), and each stays within the
// polling budget, spinBudget statements a second, keep-alives included:
// the waiter that claimed the next hold (a Mutex) or is next in line (a
// FairMutex) as well as the one behind it. The holder is on node 1, the
// first waiter on node 2, the second (which comes 300ms later) on node 3,
// each alone on its node, so each node's count of its clients' statements
// is one waiter's. Once the holder lets go, each waiter gets the lock.
func TestGaleraWaiterStatements(t *testing.T) {
	const window = 2 * time.Second
	g := newGaleraDB(t)
	kinds := []struct {
		name string
		ops  func(*dsync.Session, string) (lock, unlock func(context.Context) error)
	}{{"Mutex", mutexOps}, {"FairMutex", fairOps}}
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			name := lockName(t)
			lock, unlock := kind.ops(g.session(t, 0), name)
			if err := lock(ctx); err != nil {
				t.Fatal(err)
			}
			type result struct {
				node int
				at   time.Time
				err  error
			}
			got := make(chan result, 2)
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for _, node := range []int{1, 2} {
				wlock, wunlock := kind.ops(g.session(t, node), name)
				go func() {
					err := wlock(lctx)
					r := result{node: node, at: time.Now(), err: err}
					if err == nil {
						err = wunlock(ctx)
					}
					got <- r
				}()
				time.Sleep(300 * time.Millisecond) // the first has claimed, or is next in line
			}
			time.Sleep(300 * time.Millisecond)
			var q0 [galeraNodes]int64
			for i := 1; i < galeraNodes; i++ {
				q0[i] = g.questions(t, i)
			}
			from := time.Now()
			time.Sleep(window)
			var rate [galeraNodes]float64
			for i := 1; i < galeraNodes; i++ {
				// Less the first count's own statement.
				rate[i] = float64(g.questions(t, i)-q0[i]-1) / time.Since(from).Seconds()
			}
			freed := time.Now()
			if err := unlock(ctx); err != nil {
				t.Fatal(err)
			}
			var handoff [galeraNodes]time.Duration
			for range 2 {
				r := <-got
				if r.err != nil {
					t.Errorf("waiter on node %d: %v", r.node+1, r.err)
					continue
				}
				handoff[r.node] = r.at.Sub(freed)
			}
			t.Logf("statements a second: first waiter (node 2) %.1f, second (node 3) %.1f; after the release they held the lock %v and %v later",
				rate[1], rate[2], handoff[1].Round(100*time.Microsecond), handoff[2].Round(100*time.Microsecond))
			for i := 1; i < galeraNodes; i++ {
				if rate[i] > spinBudget {
					t.Errorf("waiter on node %d: %.1f statements a second; want at most %.0f", i+1, rate[i], spinBudget)
				}
			}
		})
	}
}

// TestGaleraMutexHandoff hands a Mutex from node to node (1, 2, 3, 1, ...),
// each holder holding it for hold while the next waits, and logs the
// handoff (from Unlock to the waiter's Lock returning) for a short and a
// long hold: the figures of docs/OPERATIONS.md (Measured on a cluster).
// It asserts only that the holds never overlap and the fences increase.
func TestGaleraMutexHandoff(t *testing.T) {
	const rounds = 20
	g := newGaleraDB(t)
	var sessions [galeraNodes]*dsync.Session
	for n := range galeraNodes {
		sessions[n] = g.session(t, n)
	}
	ctx := context.Background()
	for _, hold := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond} {
		t.Run(fmt.Sprint(hold), func(t *testing.T) {
			name := lockName(t)
			var m [galeraNodes]*dsync.Mutex
			for n := range galeraNodes {
				m[n] = dsync.NewMutex(sessions[n], name)
			}
			if err := m[0].Lock(ctx); err != nil {
				t.Fatal(err)
			}
			var fences fenceLog
			fences.add(m[0].Fence())
			var handoffs []time.Duration
			cur := 0
			for r := range rounds {
				next := (cur + 1) % galeraNodes
				taken := make(chan error, 1)
				var at time.Time
				go func() {
					lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					err := m[next].Lock(lctx)
					at = time.Now()
					taken <- err
				}()
				time.Sleep(hold)
				freed := time.Now()
				if err := m[cur].Unlock(ctx); err != nil {
					t.Fatalf("round %d: node %d Unlock: %v", r, cur+1, err)
				}
				if err := <-taken; err != nil {
					t.Fatalf("round %d: node %d Lock: %v", r, next+1, err)
				}
				handoffs = append(handoffs, at.Sub(freed))
				fences.add(m[next].Fence())
				cur = next
			}
			if err := m[cur].Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d handoffs between nodes after %v holds: p50 %v, p90 %v, max %v", rounds, hold,
				percentile(slices.Clone(handoffs), 50).Round(100*time.Microsecond),
				percentile(slices.Clone(handoffs), 90).Round(100*time.Microsecond),
				percentile(slices.Clone(handoffs), 100).Round(100*time.Microsecond))
			if n, first := fences.decreases(); n != 0 {
				t.Errorf("fences not increasing in acquisition order: %d times, first: %s", n, first)
			}
		})
	}
}

// TestGaleraElection campaigns from the three nodes for a few rounds: one
// leader at a time (the overlap detector), terms strictly increasing, and
// every node's Leader and an observer on another node agree with the
// leader's own term and value, in order.
func TestGaleraElection(t *testing.T) {
	const rounds = 6
	g := newGaleraDB(t)
	name := lockName(t)
	ctx := context.Background()
	var es [galeraNodes]*dsync.Election
	var ids [galeraNodes]int64
	for i := range galeraNodes {
		s := g.session(t, i)
		es[i], ids[i] = dsync.NewElection(s, name), s.ID()
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	observed := dsync.NewElection(g.session(t, 1), name).Observe(octx)
	var det overlapDetector
	var errs errorLog
	var wg sync.WaitGroup
	terms := make(chan dsync.Leader, rounds*galeraNodes)
	for i, e := range es {
		goCounted(&wg, func() {
			for r := range rounds / galeraNodes {
				value := fmt.Sprintf("node%d-%d", i+1, r)
				if err := e.Campaign(ctx, value); err != nil {
					errs.add("node %d Campaign: %v", i+1, err)
					return
				}
				det.enter()
				l := dsync.Leader{Value: value, Session: ids[i], Term: e.Term()}
				for j, other := range es {
					if got, err := other.Leader(ctx); err != nil || got != l {
						errs.add("node %d's Leader while node %d leads: got %+v, %v; want %+v", j+1, i+1, got, err, l)
					}
				}
				terms <- l
				time.Sleep(50 * time.Millisecond)
				det.leave()
				if err := e.Resign(ctx); err != nil {
					errs.add("node %d Resign: %v", i+1, err)
				}
			}
		})
	}
	wg.Wait()
	close(terms)
	if errs.len() > 0 {
		t.Fatal(errs.String())
	}
	if n := det.overlaps.Load(); n > 0 {
		t.Fatalf("overlapping leaders: %d; want none", n)
	}
	var leaders []dsync.Leader
	for l := range terms {
		leaders = append(leaders, l)
	}
	for i := 1; i < len(leaders); i++ {
		if leaders[i].Term <= leaders[i-1].Term {
			t.Fatalf("terms in leading order: %+v; want strictly increasing", leaders)
		}
	}
	cancel()
	var last int64
	for l := range observed {
		if l.Term <= last || !slices.Contains(leaders, l) {
			t.Fatalf("observed %+v after term %d; want a later leader among %+v", l, last, leaders)
		}
		last = l.Term
	}
}

// TestGaleraSemaphore has two sessions on each of the three nodes acquire
// 1 or 2 permits of one Semaphore of limit 3 for a few rounds each: never
// more than 3 permits held at once (counted in the process while held),
// and every grant has a fence of its own.
func TestGaleraSemaphore(t *testing.T) {
	const limit, rounds = 3, 4
	g := newGaleraDB(t)
	name := lockName(t)
	ctx := context.Background()
	var held, most atomic.Int64
	var errs errorLog
	var wg sync.WaitGroup
	var mu sync.Mutex
	fences := map[int64]bool{}
	for i := range 2 * galeraNodes {
		m := dsync.NewSemaphore(g.session(t, i%galeraNodes), name, limit)
		goCounted(&wg, func() {
			for r := range rounds {
				n := int64(1 + (i+r)%2)
				fence, err := m.AcquireFence(ctx, n)
				if err != nil {
					errs.add("session %d on node %d: Acquire(%d): %v", i, i%galeraNodes+1, n, err)
					return
				}
				h := held.Add(n)
				for {
					if old := most.Load(); h <= old || most.CompareAndSwap(old, h) {
						break
					}
				}
				mu.Lock()
				if fences[fence] {
					errs.add("fence %d granted twice", fence)
				}
				fences[fence] = true
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				held.Add(-n)
				if err := m.Release(ctx, n); err != nil {
					errs.add("session %d on node %d: Release(%d): %v", i, i%galeraNodes+1, n, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if errs.len() > 0 {
		t.Fatal(errs.String())
	}
	t.Logf("%d grants, at most %d permits held at once", len(fences), most.Load())
	if most.Load() > limit {
		t.Fatalf("permits held at once: at most %d; want no more than the limit, %d", most.Load(), limit)
	}
	if len(fences) != 2*galeraNodes*rounds {
		t.Fatalf("fences: %d distinct; want one per grant, %d", len(fences), 2*galeraNodes*rounds)
	}
}

package dsync_test

import (
	"context"
	"database/sql"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// restartWorker is one worker of TestDatabaseKilledAndRestarted: a *sql.DB
// and a Session of its own (a new one whenever the last was lost), doing
// locked read-modify-write increments of one counter.
type restartWorker struct {
	id int
	db *sql.DB

	acked    atomic.Int64 // increments whose commit returned nil
	unknown  atomic.Int64 // commits that returned an error: landed or not
	sessions atomic.Int64 // sessions opened
	lost     atomic.Int64 // sessions that ended with an error (lost, not closed by the worker)
	firstNew atomic.Int64 // UnixNano of the first acknowledged increment on the restarted server; 0: none yet
}

// restartShared is what the workers share.
type restartShared struct {
	name     string // the lock
	ttl      time.Duration
	holders  atomic.Int32 // workers that hold the lock (between Lock and Unlock)
	overlaps atomic.Int64 // writes made while another worker held the lock too
	epoch    atomic.Int32 // 0 before the kill, 1 once the restart began
	onNew    atomic.Int64 // UnixNano when the restart began: acks after it are on the new server
}

// run does increments until ctx ends.
func (w *restartWorker) run(ctx context.Context, sh *restartShared) {
	var s *dsync.Session
	var m *dsync.Mutex
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	drop := func() {
		if s.Err() != nil {
			w.lost.Add(1)
		}
		s.Close()
		s = nil
	}
	for ctx.Err() == nil {
		if s == nil {
			startCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			s, err = dsync.NewSession(startCtx, w.db, dsync.WithTTL(sh.ttl))
			cancel()
			if err != nil {
				s = nil // the server is down: try again shortly
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			w.sessions.Add(1)
			m = dsync.NewMutex(s, sh.name)
		}
		lockCtx, cancel := context.WithTimeout(ctx, 3*sh.ttl)
		err := m.Lock(lockCtx)
		cancel()
		if err != nil {
			if s.Err() != nil {
				drop()
			}
			continue
		}
		fence := m.Fence()
		sh.holders.Add(1)
		w.increment(s, sh, fence)
		sh.holders.Add(-1)
		unlockCtx, cancel := context.WithTimeout(context.Background(), sh.ttl)
		_ = m.Unlock(unlockCtx) // may fail while the server is down; the lease then ends
		cancel()
		if s.Err() != nil {
			drop()
		}
	}
}

// increment reads the counter and writes it plus one, with the fence in the
// log, in one transaction, as a careful holder does: it writes only while
// its session is live. It counts the commit as acknowledged when Commit
// returned nil, of unknown outcome when Commit returned an error.
func (w *restartWorker) increment(s *dsync.Session, sh *restartShared, fence int64) {
	ctx, cancel := context.WithTimeout(context.Background(), sh.ttl/2)
	defer cancel()
	epoch := sh.epoch.Load()
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer tx.Rollback()
	var value int64
	if err := tx.QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&value); err != nil {
		return
	}
	if s.Err() != nil {
		return // the lock may be someone else's now
	}
	if sh.holders.Load() > 1 {
		sh.overlaps.Add(1)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE counter SET value = ? WHERE id = 1", value+1); err != nil {
		return
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO fence_log (fence, worker, value, epoch) VALUES (?, ?, ?, ?)",
		fence, w.id, value+1, epoch); err != nil {
		return
	}
	if err := tx.Commit(); err != nil {
		w.unknown.Add(1)
		return
	}
	w.acked.Add(1)
	if on := sh.onNew.Load(); on != 0 {
		w.firstNew.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// TestDatabaseKilledAndRestarted has 4 workers, each with a session of its
// own (TTL 2s), do locked read-modify-write increments of a counter while
// the database is SIGKILLed and restarted on the same data directory. Every
// acknowledged commit survives, no increment is lost to two holders at
// once, fences stay strictly increasing across the restart, and every
// worker is back to work within TTL+5s of the restart.
func TestDatabaseKilledAndRestarted(t *testing.T) {
	slowTest(t)
	const (
		workers  = 4
		ttl      = 2 * time.Second
		progress = ttl + 5*time.Second // bound on each worker's first increment after the restart
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, err := mariadb.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	admin := dbtest.OpenDSN(t, srv.DSN(""))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE restart_test"); err != nil {
		t.Fatal(err)
	}
	db := dbtest.OpenDSN(t, srv.DSN("restart_test"))
	for _, q := range []string{
		"CREATE TABLE counter (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO counter VALUES (1, 0)",
		// seq numbers the commits in commit order (the increments are
		// serialised by the counter row); epoch is 0 before the kill, 1 after.
		"CREATE TABLE fence_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL, worker INT NOT NULL, value BIGINT NOT NULL, epoch INT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	sh := &restartShared{name: lockName(t), ttl: ttl}
	ws := make([]*restartWorker, workers)
	loadCtx, stopLoad := context.WithCancel(context.Background())
	for i := range ws {
		ws[i] = &restartWorker{id: i, db: dbtest.OpenDSN(t, srv.DSN("restart_test"))}
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { stopLoad(); wg.Wait() }) // before the DBs close and the server stops
	for i := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); ws[i].run(loadCtx, sh) }()
	}
	acked := func() (n int64) {
		for _, w := range ws {
			n += w.acked.Load()
		}
		return n
	}

	// Load for 2s, until every worker has made increments.
	time.Sleep(2 * time.Second)
	for _, w := range ws {
		if w.acked.Load() == 0 {
			t.Fatalf("worker %d before the kill: got 0 increments; want some", w.id)
		}
	}

	srv.Kill()
	killedAt := time.Now()
	ackedAtKill := acked()
	pingCtx, pingCancel := context.WithTimeout(ctx, time.Second)
	err = db.PingContext(pingCtx)
	pingCancel()
	if err == nil {
		t.Fatal("Ping after Kill: got nil; want an error (the server is gone)")
	}
	t.Logf("killed after %d acknowledged increments; Ping then: %v", ackedAtKill, err)

	time.Sleep(time.Second)
	logBefore, _ := os.ReadFile(srv.ErrorLog())
	sh.epoch.Store(1)
	sh.onNew.Store(time.Now().UnixNano())
	began := time.Now()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	logAfter, _ := os.ReadFile(srv.ErrorLog())
	recovery := regexp.MustCompile(`(?m)^.*crash recovery.*$`).Find(logAfter[len(logBefore):])
	if recovery == nil {
		t.Fatalf("error log after the restart: got no crash recovery; want InnoDB's crash recovery\n%s", logAfter[len(logBefore):])
	}
	var survived int64
	if err := db.QueryRowContext(ctx, "SELECT value FROM counter WHERE id = 1").Scan(&survived); err != nil {
		t.Fatalf("counter after the restart: %v", err)
	}
	if survived < ackedAtKill {
		t.Fatalf("counter after the restart: got %d; want at least the %d increments acknowledged before the kill", survived, ackedAtKill)
	}
	t.Logf("down %v, restart took %v; log: %s; counter after it: %d", began.Sub(killedAt).Round(time.Millisecond),
		restartedAt.Sub(began).Round(time.Millisecond), recovery, survived)

	// Load until every worker has made an increment on the new server.
	deadline := time.NewTimer(progress + 3*time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-deadline.C:
			waiting = false
		case <-tick.C:
			waiting = false
			for _, w := range ws {
				if w.firstNew.Load() == 0 {
					waiting = true
				}
			}
		}
	}
	stopLoad()
	wg.Wait()

	var worst time.Duration
	for _, w := range ws {
		first := w.firstNew.Load()
		if first == 0 {
			t.Errorf("worker %d: got no increment within %v of the restart; want one", w.id, progress+3*time.Second)
			continue
		}
		took := max(time.Unix(0, first).Sub(restartedAt), 0)
		worst = max(worst, took)
		if took > progress {
			t.Errorf("worker %d: first increment %v after the restart; want within %v", w.id, took, progress)
		}
		t.Logf("worker %d: %d acknowledged, %d unknown, %d sessions (%d lost); first increment %v after the restart",
			w.id, w.acked.Load(), w.unknown.Load(), w.sessions.Load(), w.lost.Load(), took.Round(time.Millisecond))
	}

	var counter int64
	if err := db.QueryRow("SELECT value FROM counter WHERE id = 1").Scan(&counter); err != nil {
		t.Fatal(err)
	}
	var unknown int64
	for _, w := range ws {
		unknown += w.unknown.Load()
	}
	total := acked()
	if counter < total || counter > total+unknown {
		t.Errorf("counter: got %d; want %d acknowledged increments (up to %d more from commits of unknown outcome)", counter, total, unknown)
	}
	if n := sh.overlaps.Load(); n != 0 {
		t.Errorf("writes while another worker held the lock: got %d; want 0", n)
	}

	// The log in commit order: values 1, 2, 3... (no lost update) and
	// fences strictly increasing, across the restart too.
	rows, err := db.Query("SELECT fence, value, epoch FROM fence_log ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n, lastFence, before, after, fenceAtKill, fenceAfter int64
	for rows.Next() {
		var fence, value int64
		var epoch int
		if err := rows.Scan(&fence, &value, &epoch); err != nil {
			t.Fatal(err)
		}
		n++
		if fence <= lastFence {
			t.Errorf("log row %d (epoch %d): got fence %d after %d; want strictly increasing", n, epoch, fence, lastFence)
		}
		if value != n {
			t.Errorf("log row %d: got value %d; want %d", n, value, n)
		}
		if epoch == 0 {
			before, fenceAtKill = before+1, fence
		} else {
			if after == 0 {
				fenceAfter = fence
			}
			after++
		}
		lastFence = fence
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != counter {
		t.Errorf("log rows: got %d; want %d, the counter", n, counter)
	}
	if before == 0 || after == 0 {
		t.Errorf("log rows before and after the restart: got %d and %d; want some of each", before, after)
	}
	t.Logf("acknowledged %d, unknown outcome %d, counter %d, overlaps %d; log rows %d before the kill (last fence %d), %d after the restart (first fence %d); slowest worker back %v after the restart",
		total, unknown, counter, sh.overlaps.Load(), before, fenceAtKill, after, fenceAfter, worst.Round(time.Millisecond))
}

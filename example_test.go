package dsync_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// dsn is the test database in these examples; in a program it is your own,
// such as "app:secret@tcp(db.internal:3306)/app".
var dsn = dbtest.DSN

func ExampleMutex_Lock() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db, dsync.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close() // frees whatever the session still holds

	if err := nightlyReport(ctx, session); err != nil {
		log.Fatal(err)
	}
	// Output: running the report with fence > 0: true
}

// nightlyReport runs the report while it holds the lock "nightly-report",
// and returns Unlock's error with its own: ErrSessionExpired from Unlock
// means the lease was lost, possibly before the work ended.
func nightlyReport(ctx context.Context, session *dsync.Session) (err error) {
	m := dsync.NewMutex(session, "nightly-report")
	lockCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.Lock(lockCtx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("another process has been running the report for 30s: %w", err)
		}
		return err
	}
	defer func() { err = errors.Join(err, m.Unlock(ctx)) }()

	fmt.Println("running the report with fence > 0:", m.Fence() > 0)
	return nil
}

func ExampleMutex_TryLock() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	a, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := dsync.NewSession(ctx, db) // as if in another process
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if ok, err := dsync.NewMutex(a, "cache-warmer").TryLock(ctx); err != nil || !ok {
		log.Fatal(ok, err)
	}
	ok, err := dsync.NewMutex(b, "cache-warmer").TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("second process got it:", ok)
	// Output: second process got it: false
}

// A lock taken with an owner in the context is reentrant for that owner and
// only that owner may unlock it.
func ExampleWithOwner() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	session, err := dsync.NewSession(context.Background(), db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	m := dsync.NewMutex(session, "account-42")

	ctx := dsync.WithOwner(context.Background())
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil { // a nested call by the same owner
		log.Fatal(err)
	}
	err = m.Unlock(dsync.WithOwner(context.Background())) // somebody else
	fmt.Println("stranger:", errors.Is(err, dsync.ErrNotOwner))
	fmt.Println("owner:", m.Unlock(ctx), m.Unlock(ctx))
	err = m.Unlock(ctx)
	fmt.Println("once more:", errors.Is(err, dsync.ErrNotHeld))
	// Output:
	// stranger: true
	// owner: <nil> <nil>
	// once more: true
}

// Long work under a lock watches Session.Done: when the lease is lost the
// lock may already belong to another process, so the work must stop.
func ExampleSession_Done() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	m := dsync.NewMutex(session, "migration")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}

	// Stop the work when the session ends, here because of the Close below.
	work, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		<-session.Done()
		stop()
	}()
	session.Close()

	<-work.Done()
	switch err := session.Err(); {
	case errors.Is(err, dsync.ErrSessionExpired):
		fmt.Println("lease lost: abandon the batch, another process may be running it")
	case errors.Is(err, dsync.ErrSessionClosed):
		fmt.Println("session closed")
	}
	// Output: session closed
}

// Do holds the lock while fn runs, and fn's context ends when the hold is
// lost (the session's lease, before any other process could take the
// lock) or the caller's ctx ends: check it before each write the lock
// protects. Do releases the lock even when ctx was cancelled or fn panics.
func ExampleMutex_Do() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	m := dsync.NewMutex(session, "invoice-run")
	err = m.Do(ctx, func(ctx context.Context) error {
		for batch := 1; batch <= 3; batch++ {
			if ctx.Err() != nil {
				return context.Cause(ctx) // wraps ErrSessionExpired when the hold was lost
			}
			fmt.Println("invoicing batch", batch)
		}
		return nil
	})
	switch {
	case errors.Is(err, dsync.ErrSessionExpired):
		fmt.Println("the hold was lost: another process may be running the invoices")
	case err != nil:
		log.Fatal(err)
	}
	// Output:
	// invoicing batch 1
	// invoicing batch 2
	// invoicing batch 3
}

// cacheRefresher refreshes a cache under whatever sync.Locker it is
// given: a sync.Mutex for one process, a dsync Locker for all of them.
type cacheRefresher struct {
	mu        sync.Locker
	refreshes int
}

func (c *cacheRefresher) refresh() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshes++
}

// Locker adapts a Mutex to code that takes a sync.Locker. Its Lock waits
// without a deadline, and it panics where the Mutex would return an error
// such as ErrSessionExpired (see Mutex.Locker): use Do where the work
// must stop when the session is lost.
func ExampleMutex_Locker() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	session, err := dsync.NewSession(context.Background(), db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	c := &cacheRefresher{mu: dsync.NewMutex(session, "cache-refresh").Locker()}
	c.refresh()
	fmt.Println("refreshes:", c.refreshes)
	// Output: refreshes: 1
}

// A session's statistics published with expvar: GET /debug/vars on a
// server using http.DefaultServeMux shows them as JSON. expvar.Publish
// panics on a name already taken, so this one names the session.
func ExampleSession_Stats() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	name := fmt.Sprintf("dsync_session_%d", session.ID())
	expvar.Publish(name, expvar.Func(func() any { return session.Stats() }))

	m := dsync.NewMutex(session, "stats-example")
	for range 2 {
		if err := m.Lock(ctx); err != nil {
			log.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
	}

	// What /debug/vars shows under that name.
	var published dsync.Stats
	if err := json.Unmarshal([]byte(expvar.Get(name).String()), &published); err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquisitions:", published.Acquisitions, "held:", published.Held)
	// Output: acquisitions: 2 held: 0
}

// The fence of each acquisition is strictly greater than any before it, so
// a resource that remembers the highest fence it has seen can refuse a
// write from a holder whose lease ran out during a long pause.
func ExampleMutex_Fence() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_balance
		(id INT PRIMARY KEY, amount BIGINT NOT NULL, fence BIGINT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT IGNORE INTO example_balance VALUES (1, 100, 0)`); err != nil {
		log.Fatal(err)
	}
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	m := dsync.NewMutex(session, "balance-1")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := m.Unlock(ctx); err != nil {
			log.Print(err) // ErrSessionExpired: the fence below is what protected the write
		}
	}()

	// The write carries the fence and only lands if no later holder wrote.
	res, err := db.ExecContext(ctx,
		`UPDATE example_balance SET amount = amount + 10, fence = ? WHERE id = 1 AND fence < ?`,
		m.Fence(), m.Fence())
	if err != nil {
		log.Fatal(err)
	}
	n, _ := res.RowsAffected()
	fmt.Println("write accepted:", n == 1)
	// Output: write accepted: true
}

// A FairMutex serves waiters in the order the database saw them arrive,
// across all processes.
func ExampleFairMutex() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	printer := dsync.NewFairMutex(session, "printer")
	if err := printer.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	// Three jobs queue up while the printer is busy; each waits its turn.
	var wg sync.WaitGroup
	order := make(chan int, 3)
	for job := 1; job <= 3; job++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := dsync.NewFairMutex(session, "printer")
			if err := m.Lock(ctx); err != nil {
				log.Print(err)
				return
			}
			order <- job
			if err := m.Unlock(ctx); err != nil {
				log.Print(err)
			}
		}()
		time.Sleep(20 * time.Millisecond) // job 1 arrives first, then 2, then 3
	}
	if err := printer.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	close(order)
	for job := range order {
		fmt.Println("printed job", job)
	}
	// Output:
	// printed job 1
	// printed job 2
	// printed job 3
}

// Many readers, or one writer, across processes; a waiting writer holds
// back readers that arrive after it.
func ExampleRWMutex() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	config := dsync.NewRWMutex(session, "config")

	// Readers.
	if err := config.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	ok, err := config.TryLock(ctx)
	fmt.Println("writer while reading:", ok, err)
	if err := config.RUnlock(ctx); err != nil {
		log.Fatal(err)
	}

	// The writer, with an owner: upgrading a read lock is refused at once.
	owner := dsync.WithOwner(ctx)
	if err := config.RLock(owner); err != nil {
		log.Fatal(err)
	}
	err = config.Lock(owner)
	fmt.Println("upgrade refused:", errors.Is(err, dsync.ErrLockUpgrade))
	if err := config.RUnlock(owner); err != nil {
		log.Fatal(err)
	}
	if err := config.Lock(owner); err != nil {
		log.Fatal(err)
	}
	fmt.Println("writing with a fence:", config.Fence() > 0)
	if err := config.Unlock(owner); err != nil {
		log.Fatal(err)
	}
	// Output:
	// writer while reading: false <nil>
	// upgrade refused: true
	// writing with a fence: true
}

// A lock taken for a transaction is released by its COMMIT or ROLLBACK, so
// the writes and the release commit together.
func ExampleMutex_LockTx() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_stock
		(sku VARCHAR(32) PRIMARY KEY, units INT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `REPLACE INTO example_stock VALUES ('sku-1', 5)`); err != nil {
		log.Fatal(err)
	}
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() // after an error; a no-op after Commit
	if err := dsync.NewMutex(session, "stock/sku-1").LockTx(ctx, tx); err != nil {
		log.Fatal(err) // roll tx back (the deferred Rollback does)
	}
	// Read after LockTx: at REPEATABLE READ the transaction's snapshot is
	// taken at its first read, which then sees the previous holder's commit.
	var units int
	if err := tx.QueryRowContext(ctx, `SELECT units FROM example_stock WHERE sku = 'sku-1'`).Scan(&units); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE example_stock SET units = ? WHERE sku = 'sku-1'`, units-1); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // releases the lock
		log.Fatal(err)
	}
	fmt.Println("units left:", units-1)
	// Output: units left: 4
}

// At most two exports run at once across every process that shares the
// database; each holder gets a fence of its own for the storage it writes.
func ExampleSemaphore() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	exports := dsync.NewSemaphore(session, "exports", 2)
	var running, most atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fence, err := exports.AcquireFence(ctx, 1)
			if err != nil {
				log.Print(err)
				return
			}
			defer func() {
				if err := exports.Release(ctx, 1); err != nil {
					log.Print(err)
				}
			}()
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			_ = fence // ... export, handing fence to the storage ...
			time.Sleep(20 * time.Millisecond)
			running.Add(-1)
		}()
	}
	wg.Wait()
	fmt.Println("never more than 2 exports at once:", most.Load() <= 2)
	// Output: never more than 2 exports at once: true
}

// One leader among replicas: each campaigns, the leader does the work
// until it resigns (or its session ends: watch Done), and the others wait
// in line. Observe follows the leaders.
func ExampleElection() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	a, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := dsync.NewSession(ctx, db) // as if in another process
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	ea, eb := dsync.NewElection(a, "scheduler"), dsync.NewElection(b, "scheduler")
	if err := ea.Campaign(ctx, "replica-a"); err != nil {
		log.Fatal(err)
	}
	leader, err := eb.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Value, "term > 0:", leader.Term > 0)

	observeCtx, stopObserving := context.WithCancel(ctx)
	changes := eb.Observe(observeCtx)
	fmt.Println("observed:", (<-changes).Value)

	won := make(chan error, 1)
	go func() { won <- eb.Campaign(ctx, "replica-b") }() // waits in line
	// ... replica a works while a.Done() is open, then steps down ...
	if err := ea.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	if err := <-won; err != nil {
		log.Fatal(err)
	}
	fmt.Println("observed:", (<-changes).Value)
	fmt.Println("a later term:", eb.Term() > leader.Term)

	stopObserving()
	for range changes { // closed once the observer has stopped
	}
	if err := eb.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// leader: replica-a term > 0: true
	// observed: replica-a
	// observed: replica-b
	// a later term: true
}

// Lead runs the leader's work while this session leads: its context ends
// when the leadership is lost (with the session's lease, before another
// replica can lead) or the caller's ctx ends, and Lead resigns when the
// work returns, letting the next campaigner in.
func ExampleElection_Lead() {
	db, err := sql.Open("mysql", dsn())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()

	e := dsync.NewElection(session, "report-scheduler")
	err = e.Lead(ctx, "replica-a", func(ctx context.Context) error {
		for step := 1; step <= 2; step++ {
			if ctx.Err() != nil {
				return context.Cause(ctx) // wraps ErrSessionExpired when the leadership was lost
			}
			fmt.Println("report step", step, "term > 0:", e.Term() > 0)
		}
		return nil
	})
	switch {
	case errors.Is(err, dsync.ErrSessionExpired):
		fmt.Println("the leadership was lost: another replica may lead")
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("leading after Lead:", e.Term() != 0)
	// Output:
	// report step 1 term > 0: true
	// report step 2 term > 0: true
	// leading after Lead: false
}

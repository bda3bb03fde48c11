package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// dsnWithConfig returns the test database's DSN changed by edit (nil: the
// DSN as it is).
func dsnWithConfig(t *testing.T, edit func(*mysql.Config)) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = make(map[string]string)
	}
	if edit != nil {
		edit(cfg)
	}
	return cfg.FormatDSN()
}

// openDB opens a pool on dsn limited to maxOpen connections (0: no limit),
// closed when the test ends.
func openDB(t *testing.T, dsn string, maxOpen int) *sql.DB {
	t.Helper()
	db := dbtest.OpenDSN(t, dsn)
	db.SetMaxOpenConns(maxOpen)
	return db
}

// sessionOn returns a session on db, closed when the test ends.
func sessionOn(t *testing.T, db *sql.DB, opts ...dsync.Option) *dsync.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, db, opts...)
	if err != nil {
		t.Fatalf("NewSession: got %v; want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// isolationVar returns the name of the isolation system variable the server
// knows: transaction_isolation (MySQL 8, MariaDB 11.1+) or tx_isolation
// (MySQL 5.7, MariaDB 10.x).
func isolationVar(t *testing.T, db *sql.DB) string {
	t.Helper()
	var v string
	if err := db.QueryRow("SELECT @@transaction_isolation").Scan(&v); err == nil {
		return "transaction_isolation"
	}
	if err := db.QueryRow("SELECT @@tx_isolation").Scan(&v); err != nil {
		t.Fatalf("neither transaction_isolation nor tx_isolation: %v", err)
	}
	return "tx_isolation"
}

// tryLocker is what the exclusion checks need of every lock type.
type tryLocker interface {
	TryLock(context.Context) (bool, error)
}

// wantTryLock makes one TryLock (bounded, so that a statement stuck behind
// an uncommitted row fails the test instead of hanging it) and checks its
// outcome.
func wantTryLock(t *testing.T, what string, l tryLocker, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := l.TryLock(ctx)
	if ok != want || err != nil {
		t.Fatalf("%s: got %v, %v; want %v, <nil>", what, ok, err, want)
	}
}

// lockWithin locks l with a bounded ctx.
func lockWithin(t *testing.T, what string, l fencedLock, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := l.Lock(ctx); err != nil {
		t.Fatalf("%s: got %v; want <nil>", what, err)
	}
}

// unlockNow unlocks l and checks it returned nil.
func unlockNow(t *testing.T, what string, l fencedLock) {
	t.Helper()
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatalf("%s: got %v; want <nil>", what, err)
	}
}

// TestExclusionUnderDSNSettings runs the core exclusion check with sessions
// whose *sql.DB comes from DSNs set the way users set them: connection
// time zones, MariaDB's SIMULTANEOUS_ASSIGNMENT, autocommit off,
// SERIALIZABLE, the driver's clientFoundRows and interpolateParams, a small
// pool, and all of them at once. No setting may let two sessions hold a
// lock, keep a dead holder's lock, lose a lease silently or repeat a fence.
func TestExclusionUnderDSNSettings(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	iso := isolationVar(t, dbtest.Open(t))
	timeZone := func(tz string) func(*mysql.Config) {
		return func(c *mysql.Config) { c.Params["time_zone"] = "'" + tz + "'" }
	}
	simultaneous := func(c *mysql.Config) {
		c.Params["sql_mode"] = "'STRICT_TRANS_TABLES,SIMULTANEOUS_ASSIGNMENT'"
	}
	noAutocommit := func(c *mysql.Config) { c.Params["autocommit"] = "0" }
	serializable := func(c *mysql.Config) { c.Params[iso] = "'SERIALIZABLE'" }
	foundRows := func(c *mysql.Config) { c.ClientFoundRows = true }
	interpolate := func(c *mysql.Config) { c.InterpolateParams = true }
	all := func(tz string) func(*mysql.Config) {
		return func(c *mysql.Config) {
			for _, f := range []func(*mysql.Config){timeZone(tz), simultaneous, noAutocommit, serializable, foundRows, interpolate} {
				f(c)
			}
		}
	}

	tests := []struct {
		name    string
		a, b    func(*mysql.Config) // DSN edits of the two sides; nil: default
		maxOpen int                 // SetMaxOpenConns of both sides; 0: no limit
	}{
		{"time_zone +01:00 vs default", timeZone("+01:00"), nil, 0},
		// MariaDB accepts offsets up to +13:00 (MySQL 8 up to +14:00).
		{"time_zone -11:00 vs +13:00", timeZone("-11:00"), timeZone("+13:00"), 0},
		{"sql_mode SIMULTANEOUS_ASSIGNMENT", simultaneous, simultaneous, 0},
		{"autocommit=0", noAutocommit, noAutocommit, 0},
		{iso + " SERIALIZABLE", serializable, serializable, 0},
		{"clientFoundRows=true", foundRows, foundRows, 0},
		{"interpolateParams=true", interpolate, interpolate, 0},
		{"SetMaxOpenConns(2)", nil, nil, 2},
		{"all at once", all("+13:00"), all("-11:00"), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkExclusion(t, dsnWithConfig(t, tt.a), dsnWithConfig(t, tt.b), tt.maxOpen)
		})
	}
}

// checkExclusion is the core exclusion check: sessions A (on dsnA) and B
// (on dsnB, as is a third session C), each on a *sql.DB limited to maxOpen
// connections.
func checkExclusion(t *testing.T, dsnA, dsnB string, maxOpen int) {
	admin := dbtest.Open(t) // default settings: how everyone else sees the rows
	const ttl = time.Second
	dbA, dbB := openDB(t, dsnA, maxOpen), openDB(t, dsnB, maxOpen)
	a := sessionOn(t, dbA, dsync.WithTTL(ttl))
	b := sessionOn(t, dbB, dsync.WithTTL(ttl))
	c := sessionOn(t, dbB)
	base := lockName(t)

	// (a) A held lock is held for everyone, in both directions, and as the
	// server sees it; a lock row naming an ended lease is free, and taking it
	// over leaves it held for everyone else.
	held := base + "/held"
	ma, mb := dsync.NewMutex(a, held), dsync.NewMutex(b, held)
	lockWithin(t, "A Lock", ma, 10*time.Second)
	if got := heldBy(t, admin, held); got != a.ID() {
		t.Fatalf("holder seen by another connection after A's Lock: got %d; want %d (A)", got, a.ID())
	}
	wantTryLock(t, "B TryLock while A holds", mb, false)
	unlockNow(t, "A Unlock", ma)
	lockWithin(t, "B Lock", mb, 10*time.Second)
	if got := heldBy(t, admin, held); got != b.ID() {
		t.Fatalf("holder seen by another connection after B's Lock: got %d; want %d (B)", got, b.ID())
	}
	wantTryLock(t, "A TryLock while B holds", ma, false)
	unlockNow(t, "B Unlock", mb)

	dead := base + "/dead"
	deadLease := 1<<52 + rand.Int64N(1<<50)
	if _, err := admin.Exec(`INSERT INTO dsync_lease (id, label, created_at, expires_at)
		VALUES (?, 'ended', UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)`, deadLease); err != nil {
		t.Fatal(err)
	}
	const oldFence = 41
	if _, err := admin.Exec("INSERT INTO dsync_lock (name, holder, token, fence) VALUES (?, ?, 7, ?)", dead, deadLease, oldFence); err != nil {
		t.Fatal(err)
	}
	md := dsync.NewMutex(a, dead)
	wantTryLock(t, "A TryLock of a row held by an ended lease", md, true)
	if got := md.Fence(); got != oldFence+1 {
		t.Fatalf("fence after the takeover: got %d; want %d", got, oldFence+1)
	}
	if got := heldBy(t, admin, dead); got != a.ID() {
		t.Fatalf("holder after the takeover: got %d; want %d (A)", got, a.ID())
	}
	wantTryLock(t, "B TryLock after A's takeover", dsync.NewMutex(b, dead), false)
	wantTryLock(t, "third session's TryLock after A's takeover", dsync.NewMutex(c, dead), false)
	unlockNow(t, "A Unlock after the takeover", md)

	// (b) A holds for 2.5 TTLs: its lease is renewed (and committed), B
	// never gets the lock, and A's session stays live.
	long := base + "/long"
	ml, mlb := dsync.NewMutex(a, long), dsync.NewMutex(b, long)
	lockWithin(t, "A Lock", ml, 10*time.Second)
	for end := time.Now().Add(5 * ttl / 2); time.Now().Before(end); time.Sleep(ttl / 4) {
		wantTryLock(t, "B TryLock while A holds for 2.5 TTLs", mlb, false)
		if err := a.Err(); err != nil {
			t.Fatalf("A's Err while holding: got %v; want <nil>", err)
		}
		if got := heldBy(t, admin, long); got != a.ID() {
			t.Fatalf("live holder seen by another connection: got %d; want %d (A)", got, a.ID())
		}
	}
	unlockNow(t, "A Unlock after 2.5 TTLs", ml)
	wantTryLock(t, "B TryLock after A's Unlock", mlb, true)
	unlockNow(t, "B Unlock", mlb)

	// (c) Goroutines of two sessions contend for a Mutex, a FairMutex and
	// an RWMutex (writers and readers).
	ca, cb := sessionOn(t, dbA), sessionOn(t, dbB)
	names := [3]string{base + "/mutex", base + "/fair", base + "/rw"}
	newLocks := func(s *dsync.Session) [3]fencedLock {
		return [3]fencedLock{dsync.NewMutex(s, names[0]), dsync.NewFairMutex(s, names[1]), dsync.NewRWMutex(s, names[2])}
	}
	records := contend(t, []*dsync.Session{ca, cb}, newLocks, names[2])
	if t.Failed() {
		return
	}

	// (d) Fences never repeat across a reconnect: A's session ends, a new
	// one on a new *sql.DB of the same DSN takes every lock again.
	if err := ca.Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	again := newLocks(sessionOn(t, openDB(t, dsnA, maxOpen)))
	for i, l := range again {
		lockWithin(t, "Lock after reconnect of "+names[i], l, 10*time.Second)
		if got, last := l.Fence(), records[i].last(); got <= last {
			t.Fatalf("fence of %s after reconnect: got %d; want > %d", names[i], got, last)
		}
		unlockNow(t, "Unlock after reconnect", l)
	}
}

// holdRecord watches one lock from inside its critical sections.
type holdRecord struct {
	inside   atomic.Int32 // exclusive holders (Mutex, FairMutex, RWMutex writer)
	readers  atomic.Int32 // RWMutex readers
	overlaps atomic.Int32 // times a holder found a conflicting holder inside

	mu     sync.Mutex
	fences []int64 // guarded by mu; in acquisition order
}

func (r *holdRecord) last() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fences[len(r.fences)-1]
}

// contend has writers (3 per session) take and release each of the three
// locks newLocks returns, and readers (2 per session) the read side of the
// RWMutex rw, and checks exclusion and fence order.
func contend(t *testing.T, sessions []*dsync.Session, newLocks func(*dsync.Session) [3]fencedLock, rw string) [3]*holdRecord {
	const writers, readers, iterations = 3, 2, 30
	bg := context.Background()
	records := [3]*holdRecord{{}, {}, {}}
	var wg sync.WaitGroup
	lockFor := func(l fencedLock) error {
		ctx, cancel := context.WithTimeout(bg, 30*time.Second)
		defer cancel()
		return l.Lock(ctx)
	}
	for _, s := range sessions {
		for w := 0; w < writers; w++ {
			for i, l := range newLocks(s) {
				r := records[i]
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < iterations; n++ {
						if err := lockFor(l); err != nil {
							t.Errorf("Lock of lock %d: got %v; want <nil>", i, err)
							return
						}
						if r.inside.Add(1) != 1 || r.readers.Load() != 0 {
							r.overlaps.Add(1)
						}
						r.mu.Lock()
						r.fences = append(r.fences, l.Fence())
						r.mu.Unlock()
						runtime.Gosched()
						r.inside.Add(-1)
						if err := l.Unlock(bg); err != nil {
							t.Errorf("Unlock of lock %d: got %v; want <nil>", i, err)
							return
						}
					}
				}()
			}
		}
		for range readers {
			m := dsync.NewRWMutex(s, rw)
			r := records[2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < iterations; n++ {
					ctx, cancel := context.WithTimeout(bg, 30*time.Second)
					err := m.RLock(ctx)
					cancel()
					if err != nil {
						t.Errorf("RLock: got %v; want <nil>", err)
						return
					}
					if r.readers.Add(1); r.inside.Load() != 0 {
						r.overlaps.Add(1)
					}
					runtime.Gosched()
					r.readers.Add(-1)
					if err := m.RUnlock(bg); err != nil {
						t.Errorf("RUnlock: got %v; want <nil>", err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	for i, r := range records {
		if got := r.overlaps.Load(); got != 0 {
			t.Errorf("lock %d: conflicting holders inside at once: got %d times; want 0", i, got)
		}
		if got, want := len(r.fences), writers*iterations*len(sessions); got != want {
			t.Errorf("lock %d: acquisitions: got %d; want %d", i, got, want)
			continue
		}
		for n, f := range r.fences {
			if f <= 0 || (n > 0 && f <= r.fences[n-1]) {
				t.Errorf("lock %d: fence %d of %d: got %d after %d; want > 0 and strictly increasing", i, n, len(r.fences), f, r.fences[max(n-1, 0)])
				break
			}
		}
	}
	return records
}

// connSettings are the session settings the caller's work depends on.
type connSettings struct {
	isolation, sqlMode, timeZone string
	autocommit                   int
}

func (c connSettings) String() string {
	return fmt.Sprintf("{isolation %s, sql_mode %q, time_zone %s, autocommit %d}", c.isolation, c.sqlMode, c.timeZone, c.autocommit)
}

func settingsOf(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, iso string) (connSettings, error) {
	var s connSettings
	err := q.QueryRowContext(ctx, "SELECT @@"+iso+", @@sql_mode, @@time_zone, @@autocommit").
		Scan(&s.isolation, &s.sqlMode, &s.timeZone, &s.autocommit)
	return s, err
}

// TestCallerConnectionsUntouched proves that nothing dsync sets on a
// connection (READ COMMITTED, sql_mode, time_zone, autocommit) reaches the
// caller's own connections, while a session is live and after it closed.
func TestCallerConnectionsUntouched(t *testing.T) {
	bg := context.Background()
	const limit = 8
	ref := dbtest.Open(t)
	iso := isolationVar(t, ref)
	want, err := settingsOf(bg, ref, iso)
	if err != nil {
		t.Fatal(err)
	}
	if want.isolation != "REPEATABLE-READ" {
		t.Fatalf("server default isolation: got %s; want REPEATABLE-READ", want.isolation)
	}

	db := openDB(t, dbtest.DSN(), limit)
	s := sessionOn(t, db)
	other := newSession(t) // holds the lock the cancelled Locks below want
	name := lockName(t)
	// Work on every path: locks of every kind, more of them at once than
	// the session keeps connections, and Locks cancelled mid-acquire (their
	// connections are discarded).
	var wg sync.WaitGroup
	for i := range limit {
		var l fencedLock
		switch n := fmt.Sprintf("%s/%d", name, i); i % 3 {
		case 0:
			l = dsync.NewMutex(s, n)
		case 1:
			l = dsync.NewFairMutex(s, n)
		default:
			l = dsync.NewRWMutex(s, n)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				if err := l.Lock(bg); err != nil {
					t.Errorf("Lock: got %v; want <nil>", err)
					return
				}
				if err := l.Unlock(bg); err != nil {
					t.Errorf("Unlock: got %v; want <nil>", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	busy := name + "/busy"
	mustLock(t, dsync.NewMutex(other, busy), bg)
	for i := range 20 {
		ctx, cancel := context.WithTimeout(bg, time.Duration(i)*200*time.Microsecond)
		err := dsync.NewMutex(s, busy).Lock(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock of a held lock with a short ctx: got %v; want %v", err, context.DeadlineExceeded)
		}
	}
	if t.Failed() {
		return
	}

	check := func(phase string, atLeast int) {
		t.Helper()
		var conns []*sql.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for len(conns) < limit {
			ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
			c, err := db.Conn(ctx)
			cancel()
			if err != nil {
				break
			}
			conns = append(conns, c)
		}
		if len(conns) < atLeast {
			t.Errorf("%s: caller connections at once: got %d; want at least %d", phase, len(conns), atLeast)
		}
		for i, c := range conns {
			got, err := settingsOf(bg, c, iso)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: caller connection %d of %d: got %v; want %v", phase, i+1, len(conns), got, want)
			}
		}
	}
	// The sessions of a pool limited to 8 keep a quarter of it.
	check("session live", limit-limit/4)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	check("session closed", limit)
}

// TestSmallPool proves that a pool of 2 connections is enough for a session
// and its caller: Lock works, the caller's own queries run while another
// session of the pool waits, and a pool of 1 is refused at once.
func TestSmallPool(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	db := openDB(t, dbtest.DSN(), 2)
	s1, s2 := sessionOn(t, db), sessionOn(t, db)
	name := lockName(t)
	holder, waiter := dsync.NewMutex(s1, name), dsync.NewMutex(s2, name)
	lockWithin(t, "Lock on a pool of 2", holder, 5*time.Second)

	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 3*time.Second)
		defer cancel()
		errc <- waiter.Lock(ctx)
	}()
	for end := time.Now().Add(3 * time.Second); dsync.Acquiring(s2) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the waiter never reached the database")
		}
	}
	for i := range 5 {
		ctx, cancel := context.WithTimeout(bg, 2*time.Second)
		var one int
		err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		cancel()
		if err != nil {
			t.Fatalf("caller's SELECT 1 number %d while a Lock waits: got %v; want <nil>", i+1, err)
		}
		select {
		case err := <-errc:
			t.Fatalf("waiter's Lock returned while the lock was held: got %v; want it still waiting", err)
		default:
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-errc; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiter's Lock: got %v; want %v", err, context.DeadlineExceeded)
	}
	unlockNow(t, "Unlock", holder)

	one := openDB(t, dbtest.DSN(), 1)
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, one)
	if s != nil {
		s.Close()
	}
	if !errors.Is(err, dsync.ErrInvalidOption) {
		t.Fatalf("NewSession on a pool of 1: got %v; want %v", err, dsync.ErrInvalidOption)
	}
}

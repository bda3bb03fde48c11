package dsync_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// cappedDB returns a *sql.DB on the test database limited to limit
// connections, closed when the test ends.
func cappedDB(t *testing.T, limit int) *sql.DB {
	t.Helper()
	db := dbtest.Open(t)
	db.SetMaxOpenConns(limit)
	return db
}

// lockOnce takes a lock with lock, within 30s of ctx, lets it go with
// unlock, and sends the first error, or nil, to got.
func lockOnce(ctx context.Context, lock, unlock func(context.Context) error, got chan<- error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := lock(lctx)
	if err == nil {
		err = unlock(lctx)
	}
	got <- err
}

// TestCappedPoolWaitersDoNotPoll: on *sql.DBs limited to 8 connections,
// as production pools are, waiters of every kind block on the holder's
// doorbell instead of polling. For each kind a holder and two waiters, all
// at once, each session on a capped *sql.DB of its own; the waiters send
// fewer than one statement a second each beyond what the same sessions
// send idle (they polled at 70-140 a second), and each gets the lock once
// it is released.
func TestCappedPoolWaitersDoNotPoll(t *testing.T) {
	slowTest(t)
	const (
		waitersPer = 2
		window     = 2 * time.Second
	)
	ctx := context.Background()
	type setup struct {
		name           string
		lock, unlock   func(context.Context) error
		waiterSessions []*dsync.Session
		kind           int
	}
	var sets []*setup
	for i, kind := range waitKinds {
		st := &setup{name: lockName(t), kind: i}
		st.lock, st.unlock = kind.holder(sessionOn(t, cappedDB(t, 8)), st.name)
		for range waitersPer {
			st.waiterSessions = append(st.waiterSessions, sessionOn(t, cappedDB(t, 8)))
		}
		sets = append(sets, st)
	}
	q := questions(t)
	time.Sleep(window)
	idle := questions(t) - q - 1 // less the first questions call's own statement

	got := make(chan error, len(sets)*waitersPer)
	for _, st := range sets {
		if err := st.lock(ctx); err != nil {
			t.Fatal(err)
		}
		for _, s := range st.waiterSessions {
			wlock, wunlock := waitKinds[st.kind].waiter(s, st.name)
			go lockOnce(ctx, wlock, wunlock, got)
		}
	}
	time.Sleep(time.Second) // the waiters settle on the doorbells
	q = questions(t)
	time.Sleep(window)
	waiting := questions(t) - q - 1
	waiters := len(sets) * waitersPer
	perWaiter := float64(waiting-idle) / float64(waiters) / window.Seconds()
	t.Logf("statements in %v: %d idle, %d with %d waiters (%.2f/s per waiter)", window, idle, waiting, waiters, perWaiter)
	if perWaiter >= 1 {
		t.Errorf("got %.2f statements/s per waiter on capped pools; want fewer than 1", perWaiter)
	}
	for _, st := range sets {
		if err := st.unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range waiters {
		if err := <-got; err != nil {
			t.Error(err)
		}
	}
}

// TestCappedPoolServesCaller: 20 waiters (4 sessions on one *sql.DB
// limited to 8 connections, 5 names each, all held by another session)
// never take more connections than the limit, the caller's own queries on
// that *sql.DB still get through while they wait, and the waiters stay
// within the polling budget (spinBudget per waiter; with polling they sent
// far more).
func TestCappedPoolServesCaller(t *testing.T) {
	slowTest(t)
	const (
		limit    = 8
		sessions = 4
		names    = 5
		window   = 2 * time.Second
	)
	ctx := context.Background()
	db := cappedDB(t, limit)
	holder := newSession(t)
	base := lockName(t)
	for i := range sessions * names {
		mustLock(t, dsync.NewMutex(holder, fmt.Sprintf("%s/%d", base, i)), ctx)
	}
	var ss []*dsync.Session
	for range sessions {
		ss = append(ss, sessionOn(t, db))
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i, s := range ss {
		for j := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Until the test ends: ctx's error.
				_ = dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i*names+j)).Lock(wctx)
			}()
		}
	}
	time.Sleep(time.Second) // the waiters settle

	q0, from := serverQuestions(t, dbtest.Open(t)), time.Now()
	var took []time.Duration
	maxOpen := 0
	for time.Since(from) < window {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		var one int
		err := db.QueryRowContext(qctx, "SELECT 1").Scan(&one)
		cancel()
		if err != nil {
			t.Fatalf("caller's SELECT 1 while dsync waits on its pool: %v", err)
		}
		took = append(took, time.Since(start))
		maxOpen = max(maxOpen, db.Stats().OpenConnections)
		time.Sleep(5 * time.Millisecond)
	}
	// Less the caller's own statements.
	checkRate(t, dbtest.Open(t), q0+int64(len(took)), from, sessions*names)
	slices.Sort(took)
	t.Logf("caller's SELECT 1: %d, p50 %v, p99 %v, max %v; most connections open %d",
		len(took), took[len(took)/2], took[len(took)*99/100], took[len(took)-1], maxOpen)
	if maxOpen > limit {
		t.Errorf("connections open on the *sql.DB: got %d; want at most %d", maxOpen, limit)
	}
	stop()
	wg.Wait()
}

// TestSessionWaitsOnOneConnection: a session whose goroutines wait for 4
// names blocks on one connection, however many names it waits for (it
// took one per name, up to 8), on a *sql.DB without a connection limit
// and on one limited to 8; the waiters stay within the polling budget and
// each gets its lock once it is free.
func TestSessionWaitsOnOneConnection(t *testing.T) {
	slowTest(t)
	const names = 4
	for _, limit := range []int{0, 8} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			admin := dbtest.Open(t)
			s := sessionOn(t, cappedDB(t, limit))
			release := waitOnHeld(t, newSession(t), s, lockName(t), names)
			time.Sleep(500 * time.Millisecond) // the waiters settle
			q0, from := serverQuestions(t, admin), time.Now()
			most, samples := 0, int64(0)
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				samples++
				var blocked int
				if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IF(GET_LOCK(%'").Scan(&blocked); err != nil {
					t.Fatal(err)
				}
				most = max(most, blocked)
			}
			// Less the samples' own statements.
			checkRate(t, admin, q0+samples, from, names)
			t.Logf("connections blocked on doorbells while %d names waited: at most %d", names, most)
			if most != 1 {
				t.Errorf("connections blocked on doorbells: got at most %d; want 1", most)
			}
			for _, err := range release() {
				t.Error(err)
			}
		})
	}
}

// waitOnHeld has holder lock the Mutexes base/0 to base/n-1 and one
// goroutine of s per name wait for it (Lock, then Unlock, within 20s).
// release unlocks them and returns the errors of the waiters' Lock and
// Unlock once each has ended.
func waitOnHeld(t *testing.T, holder, s *dsync.Session, base string, n int) (release func() []error) {
	t.Helper()
	ctx := context.Background()
	var held []*dsync.Mutex
	for i := range n {
		m := dsync.NewMutex(holder, fmt.Sprintf("%s/%d", base, i))
		mustLock(t, m, ctx)
		held = append(held, m)
	}
	got := make(chan error, n)
	for i := range n {
		go func() {
			lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			m := dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i))
			err := m.Lock(lctx)
			if err == nil {
				err = m.Unlock(lctx)
			}
			got <- err
		}()
	}
	return func() []error {
		t.Helper()
		for _, m := range held {
			mustUnlock(t, m, ctx)
		}
		var errs []error
		for range n {
			if err := <-got; err != nil {
				errs = append(errs, fmt.Errorf("a waiter's Lock and Unlock of a name that was released: got %w; want nil", err))
			}
		}
		return errs
	}
}

// TestCappedBelowBellsWaitersWithinBudget: on *sql.DBs limited to fewer
// connections than doorbells need (4, below bellsMinLimit's 8), waiters
// poll, and stay within the polling budget (spinBudget per waiter,
// keep-alives included): the Mutex waiter that claimed the next hold (it
// polled every 2ms, about 500 statements a second) and the FairMutex
// waiter next in line (likewise) as well as the ones behind them. Each
// gets the lock once it is released.
func TestCappedBelowBellsWaitersWithinBudget(t *testing.T) {
	slowTest(t)
	const (
		limit      = 4
		waitersPer = 2
		window     = 2 * time.Second
	)
	ctx := context.Background()
	admin := dbtest.Open(t)
	holder := newSession(t)
	got := make(chan error, 2*waitersPer)
	var unlocks []func(context.Context) error
	for _, ops := range []func(*dsync.Session, string) (func(context.Context) error, func(context.Context) error){mutexOps, fairOps} {
		name := lockName(t)
		lock, unlock := ops(holder, name)
		if err := lock(ctx); err != nil {
			t.Fatal(err)
		}
		unlocks = append(unlocks, unlock)
		for range waitersPer {
			wlock, wunlock := ops(sessionOn(t, cappedDB(t, limit)), name)
			go lockOnce(ctx, wlock, wunlock, got)
			time.Sleep(200 * time.Millisecond) // the first claims, or is next in line
		}
	}
	time.Sleep(200 * time.Millisecond)
	checkRateFor(t, admin, window, 2*waitersPer)
	for _, unlock := range unlocks {
		if err := unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 * waitersPer {
		if err := <-got; err != nil {
			t.Error(err)
		}
	}
}

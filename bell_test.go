package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// questions returns the server's count of statements received so far.
func questions(t *testing.T) int64 {
	t.Helper()
	var name string
	var n int64
	if err := dbtest.Open(t).QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitKinds are the lock kinds whose waiters block on doorbells: a holder
// and its waiters in other sessions, each made from a session and a name.
var waitKinds = []struct {
	name           string
	holder, waiter func(*dsync.Session, string) (lock, unlock func(context.Context) error)
}{
	{"Mutex", mutexOps, mutexOps},
	{"FairMutex", fairOps, fairOps},
	{"RWMutex writer, readers waiting", writerOps, readerOps},
	{"RWMutex reader, writers waiting", readerOps, writerOps},
}

func mutexOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewMutex(s, name)
	return m.Lock, m.Unlock
}

func fairOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewFairMutex(s, name)
	return m.Lock, m.Unlock
}

func writerOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewRWMutex(s, name)
	return m.Lock, m.Unlock
}

func readerOps(s *dsync.Session, name string) (func(context.Context) error, func(context.Context) error) {
	m := dsync.NewRWMutex(s, name)
	return m.RLock, m.RUnlock
}

// TestWaiterDoesNotPoll checks that waiters in other sessions block on the
// holder's doorbell instead of polling: while one session holds the lock
// for 3 s, 4 waiting sessions send fewer than one statement a second each
// (beyond what the same sessions send idle), and each gets the lock once
// it is released.
func TestWaiterDoesNotPoll(t *testing.T) {
	for _, kind := range waitKinds {
		t.Run(kind.name, func(t *testing.T) {
			const waiters, hold = 4, 3 * time.Second
			name := lockName(t)
			ctx := context.Background()
			lock, unlock := kind.holder(newSession(t), name)
			var sessions []*dsync.Session
			for range waiters {
				sessions = append(sessions, sessionOn(t, dbtest.Open(t)))
			}
			q := questions(t)
			time.Sleep(hold)
			idle := questions(t) - q - 1 // less the first questions call's own statement

			if err := lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := make(chan error, waiters)
			for _, s := range sessions {
				wlock, wunlock := kind.waiter(s, name)
				go func() {
					err := wlock(ctx)
					if err == nil {
						err = wunlock(ctx)
					}
					got <- err
				}()
			}
			time.Sleep(time.Second) // the waiters settle on the doorbells
			q = questions(t)
			time.Sleep(hold)
			waiting := questions(t) - q - 1
			perWaiter := float64(waiting-idle) / waiters / hold.Seconds()
			t.Logf("statements in %v: %d idle, %d with %d waiters (%.2f/s per waiter)", hold, idle, waiting, waiters, perWaiter)
			if perWaiter >= 1 {
				t.Errorf("got %.2f statements/s per waiting session; want fewer than 1", perWaiter)
			}
			if err := unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for range waiters {
				if err := <-got; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestMutexClaimDroppedWhenWaiterGivesUp checks that a waiter that claimed
// the next hold and then gave up (its ctx ended) lets others take the lock
// at once, and so does a waiter whose session ended.
func TestMutexClaimDroppedWhenWaiterGivesUp(t *testing.T) {
	for _, how := range []string{"ctx", "close"} {
		t.Run(how, func(t *testing.T) {
			name := lockName(t)
			ctx := context.Background()
			a := dsync.NewMutex(newSession(t), name)
			ws, err := dsync.NewSession(ctx, dbtest.Open(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			c := dsync.NewMutex(newSession(t), name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			waited := make(chan error, 1)
			go func() { waited <- dsync.NewMutex(ws, name).Lock(wctx) }()
			// The waiter claims the next hold: c cannot take the row even
			// when it is free, until the waiter gives up.
			time.Sleep(300 * time.Millisecond)
			switch how {
			case "ctx":
				cancel()
				if err := <-waited; !errors.Is(err, context.Canceled) {
					t.Fatalf("waiter: got %v; want context.Canceled", err)
				}
			case "close":
				ws.Close()
				if err := <-waited; !errors.Is(err, dsync.ErrSessionClosed) {
					t.Fatalf("waiter: got %v; want ErrSessionClosed", err)
				}
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			ok, err := c.TryLock(ctx)
			if err != nil || !ok {
				t.Fatalf("TryLock after the waiter gave up: got %v, %v; want true, nil", ok, err)
			}
			if err := c.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMutexClaimantTakesNext checks the claim that keeps a waiter of
// another session from being overtaken: once a waiter has claimed the next
// hold, the releasing session cannot take the lock back before it.
func TestMutexClaimantTakesNext(t *testing.T) {
	name := lockName(t)
	ctx := context.Background()
	a := dsync.NewMutex(newSession(t), name)
	b := dsync.NewMutex(newSession(t), name)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx) }()
	time.Sleep(300 * time.Millisecond) // b waits, and claims
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ok, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		// a took the row before b's claim could count: not allowed.
		t.Fatal("the releasing session took the lock back before the waiter that claimed it")
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

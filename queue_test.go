package dsync_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestQueuedMisuse extends the misuse table to FairMutex and RWMutex: every
// wrong use returns the documented sentinel and leaves no ticket behind.
func TestQueuedMisuse(t *testing.T) {
	bg := context.Background()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	stop := func() backoff.BackOff { return &backoff.StopBackOff{} }
	deadline := func() context.Context {
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	tests := []struct {
		name string
		f    func(t *testing.T, s *dsync.Session, name string) error
		want error
	}{
		{"FairMutex Unlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewFairMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"FairMutex Unlock twice", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewFairMutex(s, name)
			must(t, m.Lock(bg))
			must(t, m.Unlock(bg))
			return m.Unlock(bg)
		}, dsync.ErrNotHeld},
		{"FairMutex Unlock by another owner", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewFairMutex(s, name)
			owner := dsync.WithOwner(bg)
			must(t, m.Lock(owner))
			defer func() { must(t, m.Unlock(owner)) }()
			return m.Unlock(dsync.WithOwner(bg))
		}, dsync.ErrNotOwner},
		{"FairMutex Unlock without owner of an owned lock", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewFairMutex(s, name)
			owner := dsync.WithOwner(bg)
			must(t, m.Lock(owner))
			must(t, m.Lock(owner)) // reentrant
			defer func() { must(t, m.Unlock(owner)); must(t, m.Unlock(owner)) }()
			return m.Unlock(bg)
		}, dsync.ErrNotOwner},
		{"FairMutex Lock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			return dsync.NewFairMutex(s, name).Lock(bg)
		}, dsync.ErrSessionClosed},
		{"FairMutex Unlock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewFairMutex(s, name)
			must(t, m.Lock(bg))
			s.Close()
			return m.Unlock(bg)
		}, dsync.ErrSessionClosed},
		{"FairMutex Lock with cancelled ctx", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewFairMutex(s, name).Lock(cancelled)
		}, context.Canceled},
		{"FairMutex Lock queued until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			must(t, dsync.NewFairMutex(newSession(t), name).Lock(bg))
			return dsync.NewFairMutex(s, name).Lock(deadline())
		}, context.DeadlineExceeded},
		{"FairMutex Lock queued locally until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewFairMutex(s, name)
			must(t, m.Lock(bg))
			defer func() { must(t, m.Unlock(bg)) }()
			return dsync.NewFairMutex(s, name).Lock(deadline())
		}, context.DeadlineExceeded},
		{"FairMutex back-off gives up", func(t *testing.T, _ *dsync.Session, name string) error {
			must(t, dsync.NewFairMutex(newSession(t), name).Lock(bg))
			return dsync.NewFairMutex(newSession(t, dsync.WithBackOff(stop)), name).Lock(bg)
		}, dsync.ErrNotObtained},
		{"FairMutex invalid name", func(t *testing.T, s *dsync.Session, _ string) error {
			_, err := dsync.NewFairMutex(s, strings.Repeat("n", 256)).TryLock(bg)
			return err
		}, dsync.ErrInvalidName},
		{"RWMutex RUnlock without read hold", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewRWMutex(s, name).RUnlock(bg)
		}, dsync.ErrNotHeld},
		{"RWMutex RUnlock while write-locked", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			must(t, rw.Lock(bg))
			defer func() { must(t, rw.Unlock(bg)) }()
			return rw.RUnlock(bg)
		}, dsync.ErrNotHeld},
		{"RWMutex Unlock while read-locked", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			must(t, rw.RLock(bg))
			defer func() { must(t, rw.RUnlock(bg)) }()
			return rw.Unlock(bg)
		}, dsync.ErrNotHeld},
		{"RWMutex RUnlock by another owner", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			owner := dsync.WithOwner(bg)
			must(t, rw.RLock(owner))
			defer func() { must(t, rw.RUnlock(owner)) }()
			return rw.RUnlock(dsync.WithOwner(bg))
		}, dsync.ErrNotOwner},
		{"RWMutex upgrade", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			owner := dsync.WithOwner(bg)
			must(t, rw.RLock(owner))
			defer func() { must(t, rw.RUnlock(owner)) }()
			return rw.Lock(owner)
		}, dsync.ErrLockUpgrade},
		{"RWMutex upgrade through TryLock", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			owner := dsync.WithOwner(bg)
			must(t, rw.RLock(owner))
			defer func() { must(t, rw.RUnlock(owner)) }()
			_, err := rw.TryLock(owner)
			return err
		}, dsync.ErrLockUpgrade},
		{"RWMutex RLock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			return dsync.NewRWMutex(s, name).RLock(bg)
		}, dsync.ErrSessionClosed},
		{"RWMutex RUnlock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			rw := dsync.NewRWMutex(s, name)
			must(t, rw.RLock(bg))
			s.Close()
			return rw.RUnlock(bg)
		}, dsync.ErrSessionClosed},
		{"RWMutex TryRLock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			_, err := dsync.NewRWMutex(s, name).TryRLock(bg)
			return err
		}, dsync.ErrSessionClosed},
		{"RWMutex RLock with cancelled ctx", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewRWMutex(s, name).RLock(cancelled)
		}, context.Canceled},
		{"RWMutex RLock behind a writer until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			must(t, dsync.NewRWMutex(newSession(t), name).Lock(bg))
			return dsync.NewRWMutex(s, name).RLock(deadline())
		}, context.DeadlineExceeded},
		{"RWMutex Lock behind a reader until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			must(t, dsync.NewRWMutex(newSession(t), name).RLock(bg))
			return dsync.NewRWMutex(s, name).Lock(deadline())
		}, context.DeadlineExceeded},
		{"RWMutex invalid name", func(t *testing.T, s *dsync.Session, _ string) error {
			return dsync.NewRWMutex(s, "").RLock(bg)
		}, dsync.ErrInvalidName},
	}
	db := dbtest.Open(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSession(t)
			name := lockName(t)
			err := tt.f(t, s, name)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v; want %v", err, tt.want)
			}
			// A waiter whose ctx ended returns at once and leaves removing
			// its ticket to the session's reaper, which does so promptly.
			var left int
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if err := db.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?", name, s.ID()).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left == 0 || time.Now().After(end) {
					break
				}
			}
			if left != 0 {
				t.Fatalf("tickets of this session left after 5s: got %d; want 0", left)
			}
		})
	}
}

func TestRWMutexLocalReadersShareOneHold(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	name := lockName(t)
	rw := dsync.NewRWMutex(s, name)
	for i := 0; i < 5; i++ {
		if err := rw.RLock(bg); err != nil {
			t.Fatal(err)
		}
	}
	var tickets int
	if err := db.QueryRow("SELECT COUNT(*) FROM dsync_ticket WHERE name = ?", name).Scan(&tickets); err != nil {
		t.Fatal(err)
	}
	if tickets != 1 {
		t.Fatalf("tickets for 5 local readers: got %d; want 1", tickets)
	}
	other := dsync.NewRWMutex(newSession(t), name)
	if ok, err := other.TryRLock(bg); !ok || err != nil {
		t.Fatalf("TryRLock by another session: got %v, %v; want true, nil", ok, err)
	}
	if ok, err := other.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock while read-locked: got %v, %v; want false, nil", ok, err)
	}
	if err := other.RUnlock(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := rw.RUnlock(bg); err != nil {
			t.Fatalf("RUnlock %d: %v", i, err)
		}
	}
	if err := rw.RUnlock(bg); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("sixth RUnlock: got %v; want ErrNotHeld", err)
	}
	waitTickets(t, db, name, 0)
	if ok, err := other.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock when free: got %v, %v; want true, nil", ok, err)
	}
	if err := other.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestFairMutexTryLockDoesNotJumpTheLine: with the lock free but a waiter
// queued (a process stopped with SIGSTOP while it waits), TryLock says
// false; the waiter gets the lock once it runs again.
func TestFairMutexTryLockDoesNotJumpTheLine(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	holder := dsync.NewFairMutex(newSession(t), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatal(err)
	}
	waiter := startDriver(t, childConfig{Name: name, Table: orderLog(t, db), Kind: "fair"})
	waiter.send(t, "lock 1")
	waitTickets(t, db, name, 2)
	if err := waiter.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer waiter.Process.Signal(syscall.SIGCONT)
	if err := holder.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	if ok, err := dsync.NewFairMutex(newSession(t), name).TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock with a waiter queued: got %v, %v; want false, nil", ok, err)
	}
	if err := waiter.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waiter.expect(t, "acquired 1", 5*time.Second)
	waiter.send(t, "release 1")
	waiter.expect(t, "released 1", 5*time.Second)
}

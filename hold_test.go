package dsync_test

// Tests of hold.go: Do's context ends with the hold, before anyone else
// can take the lock; Do always releases; the sync.Locker adapters and
// their panics.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/faultproxy"
)

// doLock is what the locks with Do (and the Election with Lead) have in
// common, for the table tests.
type doLock struct {
	do      func(context.Context, func(context.Context) error) error
	tryLock func(context.Context) (bool, error) // another session's write TryLock of the name
	unlock  func(context.Context) error         // its Unlock
}

// doLocks returns the Do of each lock kind on s, with a write lock of the
// same kind and name in another session.
func doLocks(t *testing.T, s *dsync.Session, name string) map[string]doLock {
	other := newSession(t)
	m, fm, rw := dsync.NewMutex(other, name+"/m"), dsync.NewFairMutex(other, name+"/f"), dsync.NewRWMutex(other, name+"/rw")
	orw := dsync.NewRWMutex(other, name+"/r")
	oe := dsync.NewElection(other, name+"/e")
	e := dsync.NewElection(s, name+"/e")
	return map[string]doLock{
		"Election.Lead": {
			func(ctx context.Context, fn func(context.Context) error) error { return e.Lead(ctx, "v", fn) },
			func(ctx context.Context) (bool, error) { return oe.TryCampaign(ctx, "other") },
			oe.Resign,
		},
		"Mutex.Do":     {dsync.NewMutex(s, name+"/m").Do, m.TryLock, m.Unlock},
		"FairMutex.Do": {dsync.NewFairMutex(s, name+"/f").Do, fm.TryLock, fm.Unlock},
		"RWMutex.Do":   {dsync.NewRWMutex(s, name+"/rw").Do, rw.TryLock, rw.Unlock},
		"RWMutex.RDo":  {dsync.NewRWMutex(s, name+"/r").RDo, orw.TryLock, orw.Unlock},
	}
}

// TestDo runs fn under each kind of hold: another session cannot take
// the lock while fn runs, fn's error comes back as it is, and the lock is
// free once Do returns.
func TestDo(t *testing.T) {
	bg := context.Background()
	s := newSession(t)
	errWork := errors.New("the work failed")
	for kind, l := range doLocks(t, s, lockName(t)) {
		t.Run(kind, func(t *testing.T) {
			ran := false
			err := l.do(bg, func(ctx context.Context) error {
				ran = true
				if ok, err := l.tryLock(bg); ok || err != nil {
					t.Errorf("another session's TryLock while fn runs: got %v, %v; want false, nil", ok, err)
				}
				if err := ctx.Err(); err != nil {
					t.Errorf("fn's ctx while held: got %v; want nil", err)
				}
				return errWork
			})
			if !ran {
				t.Fatal("fn did not run")
			}
			if err != errWork {
				t.Fatalf("Do: got %v; want fn's error itself", err)
			}
			takesAtOnce(t, "after Do", l.tryLock, l.unlock)
		})
	}
}

// TestDoReleases ends Do in the ways that could leave the lock behind:
// the caller's ctx cancelled while fn runs (fn's ctx ends with it, and Do
// still releases the lock itself: no release error, nothing left to the
// background), and a panic in fn (Do releases the lock and the panic goes
// on, with its value). Another session takes the lock at once after each.
func TestDoReleases(t *testing.T) {
	bg := context.Background()
	boom := errors.New("boom")
	tests := []struct {
		name string
		do   func(t *testing.T, m *dsync.Mutex)
	}{
		{"caller cancelled", func(t *testing.T, m *dsync.Mutex) {
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			err := m.Do(ctx, func(ctx context.Context) error {
				cancel()
				<-ctx.Done()
				return ctx.Err()
			})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Do: got %v; want fn's context.Canceled", err)
			}
			if strings.Contains(err.Error(), "unlock") {
				t.Fatalf("Do: got %q; want no release error (the release must not use the cancelled ctx)", err)
			}
		}},
		{"fn panics", func(t *testing.T, m *dsync.Mutex) {
			defer func() {
				if r := recover(); r != boom {
					t.Fatalf("recovered: got %v; want fn's panic value", r)
				}
			}()
			m.Do(bg, func(context.Context) error { panic(boom) })
			t.Fatal("Do returned; want fn's panic")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := lockName(t)
			other := dsync.NewMutex(newSession(t), name)
			tt.do(t, dsync.NewMutex(newSession(t), name))
			takesAtOnce(t, "after Do", other.TryLock, other.Unlock)
		})
	}
}

// takesAtOnce checks that another session's TryLock takes the lock (then
// releases it).
func takesAtOnce(t *testing.T, when string, tryLock func(context.Context) (bool, error), unlock func(context.Context) error) {
	t.Helper()
	if ok, err := tryLock(context.Background()); !ok || err != nil {
		t.Fatalf("another session's TryLock %s: got %v, %v; want true, nil", when, ok, err)
	}
	if err := unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDoContextEndsBeforeTakeover cuts the network under a session whose
// Do (or Election.Lead) runs fn: fn's ctx must end, with a cause wrapping
// ErrSessionExpired, before another session acquires the lock (or leads),
// and Do must report the loss.
func TestDoContextEndsBeforeTakeover(t *testing.T) {
	type doFunc = func(context.Context, func(context.Context) error) error
	tests := []struct {
		name string
		// do is the Do on the session that is cut; take and release are
		// another session's lock and unlock of the same name.
		setup func(cut, other *dsync.Session, name string) (do doFunc, take, release func(context.Context) error)
	}{
		{"Mutex.Do", func(cut, other *dsync.Session, name string) (doFunc, func(context.Context) error, func(context.Context) error) {
			m := dsync.NewMutex(other, name)
			return dsync.NewMutex(cut, name).Do, m.Lock, m.Unlock
		}},
		{"Election.Lead", func(cut, other *dsync.Session, name string) (doFunc, func(context.Context) error, func(context.Context) error) {
			e := dsync.NewElection(cut, name)
			o := dsync.NewElection(other, name)
			return func(ctx context.Context, fn func(context.Context) error) error { return e.Lead(ctx, "cut", fn) },
				func(ctx context.Context) error { return o.Campaign(ctx, "other") }, o.Resign
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dsn := dbtest.FaultProxy(t)
			cut := faultSession(t, dbtest.OpenDSN(t, dsn), time.Second)
			do, take, release := tt.setup(cut, newSession(t), lockName(t))
			doEndsBeforeTakeover(t, p, cut, do, take, release)
		})
	}
}

// doEndsBeforeTakeover is TestDoContextEndsBeforeTakeover with do, a Do on
// the session cut, which p's connections carry, and take and release,
// another session's lock and unlock of the same name.
func doEndsBeforeTakeover(t *testing.T, p *faultproxy.Proxy, cut *dsync.Session, do func(context.Context, func(context.Context) error) error, take, release func(context.Context) error) {
	bg := context.Background()

	held := make(chan context.Context, 1)
	type ending struct {
		at    time.Time
		cause error
	}
	ended := make(chan ending, 1)
	doErr := make(chan error, 1)
	go func() {
		doErr <- do(bg, func(ctx context.Context) error {
			held <- ctx
			<-ctx.Done()
			ended <- ending{time.Now(), context.Cause(ctx)}
			return context.Cause(ctx)
		})
	}()
	var fnCtx context.Context
	select {
	case fnCtx = <-held:
	case err := <-doErr:
		t.Fatalf("Do before fn ran: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Do: fn not running after 10s")
	}

	p.Cut(true)
	cutAt := time.Now()
	type acquisition struct {
		at       time.Time
		err      error
		fnCtxEnd bool // fn's ctx had ended when Lock returned
	}
	acquired := make(chan acquisition, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		err := take(ctx)
		a := acquisition{at: time.Now(), err: err}
		select {
		case <-fnCtx.Done():
			a.fnCtxEnd = true
		default:
		}
		acquired <- a
	}()

	var end ending
	select {
	case end = <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("fn's ctx still open 10s after the cut")
	}
	a := <-acquired
	if a.err != nil {
		t.Fatalf("other session's Lock: %v", a.err)
	}
	// The fault happened: bytes were dropped, and the session was lost.
	if st := p.Stats(); st.Dropped == 0 {
		t.Fatalf("bytes dropped by the cut: got %d; want some (the fault did not happen)", st.Dropped)
	}
	if err := cut.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("cut session's Err: got %v; want ErrSessionExpired", err)
	}
	t.Logf("fn's ctx ended %v after the cut; the other session acquired %v after the cut",
		end.at.Sub(cutAt), a.at.Sub(cutAt))
	if !errors.Is(end.cause, dsync.ErrSessionExpired) {
		t.Errorf("cause of fn's ctx: got %v; want ErrSessionExpired", end.cause)
	}
	if !a.fnCtxEnd || !end.at.Before(a.at) {
		t.Errorf("fn's ctx ended at +%v (ended when the other's Lock returned: %v), the other session acquired at +%v; want fn's ctx first",
			end.at.Sub(cutAt), a.fnCtxEnd, a.at.Sub(cutAt))
	}
	select {
	case err := <-doErr:
		if !errors.Is(err, dsync.ErrSessionExpired) {
			t.Errorf("Do: got %v; want ErrSessionExpired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do still running 5s after fn returned")
	}
	if err := release(bg); err != nil {
		t.Fatal(err)
	}
}

// TestDoContextEndsWithClose closes the session while fn runs: fn's ctx
// ends with a cause wrapping ErrSessionClosed, and Do reports it.
func TestDoContextEndsWithClose(t *testing.T) {
	s := newSession(t)
	closed := make(chan error, 1)
	var cause error
	err := dsync.NewMutex(s, lockName(t)).Do(context.Background(), func(ctx context.Context) error {
		go func() { closed <- s.Close() }()
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(5 * time.Second):
		}
		return cause
	})
	if !errors.Is(cause, dsync.ErrSessionClosed) {
		t.Fatalf("cause of fn's ctx after Close: got %v; want ErrSessionClosed", cause)
	}
	if !errors.Is(err, dsync.ErrSessionClosed) {
		t.Fatalf("Do: got %v; want ErrSessionClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestDoContextSeesPausedLease moves the local deadline of the hold's
// lease into the past, as a pause of the process past it would, on a
// session made WithReplaceLostLease: Err of fn's ctx reports the loss at
// once, before the keep-alive goroutine has run, its Done is closed, and
// its cause wraps ErrSessionExpired.
func TestDoContextSeesPausedLease(t *testing.T) {
	s := newSession(t, dsync.WithReplaceLostLease())
	var err, cause error
	done := false
	dsync.NewMutex(s, lockName(t)).Do(context.Background(), func(ctx context.Context) error {
		if err := ctx.Err(); err != nil {
			t.Errorf("fn's ctx before the pause: got %v; want nil", err)
		}
		dsync.ExpireLocally(s)
		err, done, cause = ctx.Err(), isClosed(ctx.Done(), 0), context.Cause(ctx)
		return nil
	})
	if err == nil || !done || !errors.Is(cause, dsync.ErrSessionExpired) {
		t.Fatalf("fn's ctx right after the lease's deadline passed: got Err %v, Done closed %v, cause %v; want an error, true, ErrSessionExpired",
			err, done, cause)
	}
}

// TestLockerAcrossSessions has two sessions take turns through their
// Lockers: never both inside at once. Then a sync.Cond waits on one.
func TestLockerAcrossSessions(t *testing.T) {
	name := lockName(t)
	var inside, overlaps, turns atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		l := dsync.NewMutex(newSession(t), name).Locker()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				l.Lock()
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				turns.Add(1)
				l.Unlock()
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 || turns.Load() != 20 {
		t.Fatalf("two sessions' Lockers: got %d overlaps in %d turns; want 0 in 20", overlaps.Load(), turns.Load())
	}

	l := dsync.NewMutex(newSession(t), name).Locker()
	c := sync.NewCond(l)
	var ready atomic.Bool
	woke := make(chan struct{})
	go func() {
		defer close(woke)
		l.Lock()
		for !ready.Load() {
			c.Wait()
		}
		l.Unlock()
	}()
	l.Lock()
	ready.Store(true)
	c.Broadcast()
	l.Unlock()
	select {
	case <-woke:
	case <-time.After(10 * time.Second):
		t.Fatal("sync.Cond on a Locker: the waiter did not wake within 10s")
	}
}

// TestRLocker takes read holds through the RLockers of two sessions at
// once; a writer of a third cannot take the lock until both are released.
func TestRLocker(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	r1 := dsync.NewRWMutex(newSession(t), name).RLocker()
	r2 := dsync.NewRWMutex(newSession(t), name).RLocker()
	w := dsync.NewRWMutex(newSession(t), name)
	r1.Lock()
	within(t, "second reader's RLocker.Lock", 10*time.Second, func() error { r2.Lock(); return nil })
	if ok, err := w.TryLock(bg); ok || err != nil {
		t.Fatalf("writer's TryLock while two readers hold: got %v, %v; want false, nil", ok, err)
	}
	r1.Unlock()
	r2.Unlock()
	if ok, err := w.TryLock(bg); !ok || err != nil {
		t.Fatalf("writer's TryLock after the readers left: got %v, %v; want true, nil", ok, err)
	}
	if err := w.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestLockerPanics is the table of what the Lockers panic with: an error
// wrapping the documented sentinel, with the dsync: prefix once.
func TestLockerPanics(t *testing.T) {
	tests := []struct {
		name string
		f    func(t *testing.T, s *dsync.Session, name string)
		want error
	}{
		{"Lock on a closed session", func(t *testing.T, s *dsync.Session, name string) {
			s.Close()
			dsync.NewMutex(s, name).Locker().Lock()
		}, dsync.ErrSessionClosed},
		{"Unlock after Close", func(t *testing.T, s *dsync.Session, name string) {
			l := dsync.NewMutex(s, name).Locker()
			l.Lock()
			s.Close()
			l.Unlock()
		}, dsync.ErrSessionClosed},
		{"Unlock never locked", func(t *testing.T, s *dsync.Session, name string) {
			dsync.NewMutex(s, name).Locker().Unlock()
		}, dsync.ErrNotHeld},
		{"Unlock of a hold with an owner", func(t *testing.T, s *dsync.Session, name string) {
			m, owner := dsync.NewMutex(s, name), dsync.WithOwner(context.Background())
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			m.Locker().Unlock()
		}, dsync.ErrNotOwner},
		{"Lock of an invalid name", func(t *testing.T, s *dsync.Session, _ string) {
			dsync.NewFairMutex(s, "").Locker().Lock()
		}, dsync.ErrInvalidName},
		{"RLocker Unlock never locked", func(t *testing.T, s *dsync.Session, name string) {
			dsync.NewRWMutex(s, name).RLocker().Unlock()
		}, dsync.ErrNotHeld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r any
			func() {
				defer func() { r = recover() }()
				tt.f(t, newSession(t), lockName(t))
			}()
			err, ok := r.(error)
			if !ok || !errors.Is(err, tt.want) {
				t.Fatalf("panic: got %v; want an error wrapping %v", r, tt.want)
			}
			if n := strings.Count(err.Error(), "dsync:"); n != 1 {
				t.Errorf("got %q (dsync: %d times); want dsync: once", err, n)
			}
		})
	}
}

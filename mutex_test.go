package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

func TestMain(m *testing.M) {
	if child := os.Getenv(childEnv); child != "" {
		os.Exit(runChild(child))
	}
	stop, err := dbtest.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { stop() }))
}

// newSession returns a session on the test database, closed when the test ends.
func newSession(t testing.TB, opts ...dsync.Option) *dsync.Session {
	t.Helper()
	s, err := dsync.NewSession(context.Background(), dbtest.Open(t), opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// lockName returns a lock name unique to the test.
func lockName(t testing.TB) string { return t.Name() + "/" + fmt.Sprint(time.Now().UnixNano()) }

func TestMutexLockUnlock(t *testing.T) {
	ctx := context.Background()
	s1, s2 := newSession(t), newSession(t)
	name := lockName(t)
	m1, m2 := dsync.NewMutex(s1, name), dsync.NewMutex(s2, name)

	if err := m1.Lock(ctx); err != nil {
		t.Fatalf("Lock: got %v; want nil", err)
	}
	f1 := m1.Fence()
	if f1 <= 0 {
		t.Fatalf("Fence: got %d; want > 0", f1)
	}
	if ok, err := m2.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while held elsewhere: got %v, %v; want false, nil", ok, err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
	if got := m1.Fence(); got != 0 {
		t.Fatalf("Fence after Unlock: got %d; want 0", got)
	}
	if ok, err := m2.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after Unlock: got %v, %v; want true, nil", ok, err)
	}
	if f2 := m2.Fence(); f2 <= f1 {
		t.Fatalf("second fence: got %d; want > %d", f2, f1)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
	if err := m2.Unlock(ctx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("second Unlock: got %v; want ErrNotHeld", err)
	}
}

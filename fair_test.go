package dsync_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
)

func TestFairMutexBasics(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	a := dsync.NewFairMutex(newSession(t), name)
	b := dsync.NewFairMutex(newSession(t), name)
	if err := a.Lock(bg); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	f1 := a.Fence()
	if f1 <= 0 {
		t.Fatalf("Fence: got %d; want > 0", f1)
	}
	if ok, err := b.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock while held: got %v, %v; want false, nil", ok, err)
	}
	if err := a.Unlock(bg); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if ok, err := b.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock when free: got %v, %v; want true, nil", ok, err)
	}
	if f2 := b.Fence(); f2 <= f1 {
		t.Fatalf("second fence: got %d; want > %d", f2, f1)
	}
	if err := b.Unlock(bg); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if err := b.Unlock(bg); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("second Unlock: got %v; want ErrNotHeld", err)
	}
}

// TestFairMutexLocalOrder has goroutines of one process arrive one after
// another while the lock is held elsewhere; they must get it in that order.
func TestFairMutexLocalOrder(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	holder := dsync.NewFairMutex(newSession(t), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatal(err)
	}
	s := newSession(t)
	const n = 6
	order := make(chan int, n)
	errc := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			m := dsync.NewFairMutex(s, name)
			if err := m.Lock(bg); err != nil {
				errc <- err
				return
			}
			order <- i
			errc <- m.Unlock(bg)
		}()
		time.Sleep(50 * time.Millisecond) // arrive one after another
	}
	if err := holder.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for want := 0; want < n; want++ {
		if got := <-order; got != want {
			t.Fatalf("acquisition %d: got goroutine %d; want %d", want, got, want)
		}
	}
}

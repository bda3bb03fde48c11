package dsync

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLeaseConnWaitEndsWithCtx: a lock statement that waits for the
// lease connection (held by another statement) returns with its ctx's
// error when its ctx ends, and a renewal waiting meanwhile still takes
// the connection before the lock statements.
func TestLeaseConnWaitEndsWithCtx(t *testing.T) {
	l := newLeaseConn()
	l.lendFor = time.Minute
	if err := l.acquire(context.Background(), false); err != nil { // a statement in progress
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.useOpen(ctx, context.Background(), nil)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("useOpen: %v; want context.DeadlineExceeded", err)
		}
	case <-time.After(10 * time.Second):
		l.release()
		<-done
		t.Fatal("useOpen still waits for the lease connection 10s after its ctx ended")
	}
	renewed := make(chan error, 1)
	go func() { renewed <- l.acquire(context.Background(), true) }()
	for l.waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	lock := make(chan error, 1)
	go func() { lock <- l.acquire(lctx, false) }()
	l.release()
	if err := <-renewed; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lock:
		t.Fatalf("a lock statement took the connection before the renewal let it go (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.release()
	if err := <-lock; err != nil {
		t.Fatal(err)
	}
	l.release()
}

package dsync_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestSessionDeadline: Deadline is TTL-TTL/5 after the lease was created,
// moves later with each renewal, stops moving once renewals fail (a proxy
// cuts the network), and Done closes no earlier than the last Deadline,
// which then stays where it was.
func TestSessionDeadline(t *testing.T) {
	slowTest(t)
	const ttl = time.Second
	p, dsn := dbtest.FaultProxy(t)
	before := time.Now()
	s := faultSession(t, openDB(t, dsn, 0), ttl)
	after := time.Now()
	margin := ttl / 5
	if d := s.Deadline(); d.Before(before.Add(ttl-margin)) || d.After(after.Add(ttl-margin)) {
		t.Fatalf("Deadline after NewSession: got %v after the call began; want between %v and %v",
			d.Sub(before), ttl-margin, after.Sub(before)+ttl-margin)
	}

	first := s.Deadline()
	for give := time.Now().Add(10 * ttl); !s.Deadline().After(first); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(give) {
			t.Fatalf("Deadline still %v after the session began, %v later; want a renewal to move it",
				first.Sub(before), 10*ttl)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Err after a renewal: got %v; want nil", err)
	}

	before2 := p.Stats()
	p.Cut(true)
	cut := time.Now()
	last := s.Deadline()
	if left := time.Until(last); left > ttl-margin {
		t.Fatalf("Deadline at the cut: %v ahead; want at most TTL-TTL/5 = %v", left, ttl-margin)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * ttl):
		t.Fatalf("Done still open %v after the cut", 10*ttl)
	}
	closed := time.Now()
	if p.Stats().Dropped == before2.Dropped {
		t.Fatalf("proxy: no byte dropped after the cut; the fault did not happen")
	}
	// A renewal sent before the cut may have landed after Deadline was
	// read: the last Deadline is the one to compare with.
	final := s.Deadline()
	if final.Before(last) {
		t.Errorf("Deadline went back: got %v; want at least %v", final.Sub(cut), last.Sub(cut))
	}
	if closed.Before(final) {
		t.Errorf("Done closed %v after the cut, before the Deadline (%v after it)", closed.Sub(cut), final.Sub(cut))
	}
	time.Sleep(ttl / 10)
	if got := s.Deadline(); !got.Equal(final) {
		t.Errorf("Deadline after the loss: moved from %v to %v after the cut", final.Sub(cut), got.Sub(cut))
	}
	if err := s.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("Err after Done closed: got %v; want ErrSessionExpired", err)
	}
}

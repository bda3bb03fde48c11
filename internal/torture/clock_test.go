//go:build linux

package torture

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The clock nemesis: the server runs under libfaketime with its fake time
// read from a file (mariadb.Config.FakeTimeFile), re-read about every
// second, and a clock fault writes a new offset to it. Only the steps that
// dsync's design tolerates are drawn: backward by any amount (leases then
// last longer on the server than their sessions think, which only keeps
// others out), and forward by at most TTL/10, at most once per 2 TTLs. A
// forward step eats into the safety margin (a session gives up on its
// lease TTL/5 before it could end on the server); a step beyond the margin
// ends leases on the server before their sessions know, an early expiry
// the design allows (a clock that jumps ahead by more than TTL/5 is
// outside dsync's guarantees, see docs/VERIFICATION.md), which the checker
// would report as two holders. The offset is never restored with a big
// forward step, for the same reason.
const (
	nemClock     = "clock"      // step the server's clock by Dur (signed)
	nemClockSeen = "clock-seen" // the server's UTC_TIMESTAMP(6) minus the machine's clock, Dur, once the step shows
)

// clockStep draws a clock fault's step: forward by TTL/40 to TTL/10 when
// the last forward step is at least 2 TTLs before at, else backward by
// TTL/2 to 5 TTLs.
func clockStep(rng *rand.Rand, ttl, at time.Duration, lastForward *time.Duration) time.Duration {
	if rng.IntN(2) == 0 && at-*lastForward >= 2*ttl {
		*lastForward = at
		return ttl/40 + time.Duration(rng.Int64N(int64(ttl/10-ttl/40)))
	}
	return -(ttl/2 + time.Duration(rng.Int64N(int64(ttl*5-ttl/2))))
}

// clockFile creates the server's libfaketime file, at offset 0.
func clockFile(dir string) (string, error) {
	path := filepath.Join(dir, "faketime")
	return path, os.WriteFile(path, []byte("+0\n"), 0o644)
}

// serverOffset returns the server's UTC_TIMESTAMP(6) minus this machine's
// clock at the middle of the query, and how long the query took.
func (h *harness) serverOffset(ctx context.Context) (off, rtt time.Duration, err error) {
	var us int64
	before := time.Now()
	err = h.admin.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").Scan(&us)
	after := time.Now()
	rtt = after.Sub(before)
	return time.UnixMicro(us).Sub(before.Add(rtt / 2)), rtt, err
}

// stepClock moves the server's clock by step (the file holds the sum of
// the steps so far) and waits until the server's clock shows it, which it
// records as a clock-seen event: the proof that the fault happened. A step
// not seen within 5 s fails the run.
func (h *harness) stepClock(ctx context.Context, step time.Duration) {
	h.clockOffset += step
	s := strconv.FormatFloat(h.clockOffset.Seconds(), 'f', 3, 64)
	if h.clockOffset >= 0 {
		s = "+" + s
	}
	if err := os.WriteFile(h.clockPath, []byte(s+"\n"), 0o644); err != nil {
		h.t.Fatalf("clock: %v", err)
	}
	var off time.Duration
	for end := now() + int64(5*time.Second); now() < end; time.Sleep(50 * time.Millisecond) {
		o, rtt, err := h.serverOffset(ctx)
		if err != nil {
			continue
		}
		off = o
		if d := off - h.clockBase - h.clockOffset; d.Abs() <= 20*time.Millisecond+rtt {
			h.record(Event{Proc: -1, G: -1, Type: "event", TS: now(), Op: nemClockSeen, Dur: int64(off)})
			return
		}
	}
	h.t.Errorf("clock: the server's clock is %v off the machine's %v after a step to %v; want %v",
		off.Round(time.Millisecond), 5*time.Second, h.clockOffset, (h.clockBase + h.clockOffset).Round(time.Millisecond))
}

// clockLine is a clock event's line in the printed schedule.
func clockLine(e Event, start int64) string {
	t := float64(e.TS-start) / 1e9
	if e.Op == nemClock {
		return fmt.Sprintf("  %8.3fs %-8s step %+v\n", t, e.Op, time.Duration(e.Dur).Round(time.Millisecond))
	}
	return fmt.Sprintf("  %8.3fs %-8s the server's UTC_TIMESTAMP(6) is %+v off the machine's clock\n", t, e.Op, time.Duration(e.Dur).Round(time.Millisecond))
}

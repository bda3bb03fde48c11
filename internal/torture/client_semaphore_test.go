//go:build linux

package torture

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/dsynclock/dsync"
)

// semName is the semaphore every client acquires, with semLimit permits.
const (
	semName  = "s0"
	semLimit = 3
)

// semHold is one acquisition a goroutine holds: its fence and permits.
type semHold struct{ fence, n int64 }

// semaphore acquires 1 or 2 permits of semName (Acquire with a deadline of
// 50 ms-3 s, one time in four 1-20 ms, or TryAcquire), reads the line
// (semLook), and while it holds does the work of a hold (held: checks and
// register writes with the latest acquisition's fence); one time in four
// it acquires one more permit while holding 1, one time in three it
// releases part of what it holds and holds on, and then it releases the
// rest. A Release that fails ends the goroutine's use of its permits:
// they may be held still (they end with the session) or not.
//
// A Semaphore's permits belong to the session, and Release gives back the
// session's latest acquisitions first, whichever goroutine made them: so
// that the permits a goroutine releases are its own, one goroutine of a
// process at a time uses the semaphore (the others pick another
// operation), and it releases at most what it holds.
func (c *client) semaphore(g int, rng *rand.Rand, base context.Context, s *dsync.Session) {
	if !c.semMu.TryLock() {
		return
	}
	defer c.semMu.Unlock()
	m := dsync.NewSemaphore(s, semName, semLimit)
	var holds []semHold // oldest first
	total := func() int64 {
		var n int64
		for _, h := range holds {
			n += h.n
		}
		return n
	}
	if !c.semAcquire(g, rng, base, s, m, 1+int64(rng.IntN(2)), &holds) {
		return
	}
	for {
		if !c.held(g, rng, s, semName, false, holds[len(holds)-1].fence) {
			return
		}
		switch more := now() < c.until; {
		case more && total() == 1 && rng.IntN(4) == 0:
			c.semAcquire(g, rng, base, s, m, 1, &holds)
			continue
		case more && total() > 1 && rng.IntN(3) == 0:
			if !c.semRelease(g, rng, base, m, 1+int64(rng.IntN(int(total()-1))), &holds) {
				return
			}
			c.semLook(g, s, holds)
			continue
		}
		c.semRelease(g, rng, base, m, total(), &holds)
		return
	}
}

// semAcquire acquires n permits, or tries to, and records the call; on
// success it appends the acquisition to holds and reads the line.
func (c *client) semAcquire(g int, rng *rand.Rand, base context.Context, s *dsync.Session, m *dsync.Semaphore, n int64, holds *[]semHold) bool {
	op, acquire := opSemAcquire, m.AcquireFence
	if rng.IntN(4) == 0 {
		op, acquire = opSemTry, m.TryAcquireFence
	}
	min, max := 50*time.Millisecond, 3*time.Second
	if rng.IntN(4) == 0 {
		min, max = time.Millisecond, 20*time.Millisecond
	}
	ctx, cancel := deadline(rng, base, min, max)
	id := c.rec.call(g, Event{Op: op, Name: semName, N: n, Sess: s.ID()})
	fence, err := acquire(ctx, n)
	cancel()
	e := result(Event{Op: op, Name: semName, N: n, Sess: s.ID()}, err)
	if err == nil && fence == 0 {
		e.Res = "fail" // TryAcquire: not free, or a waiter ahead
	}
	e.Fence = fence
	c.rec.ret(g, id, e)
	if e.Res != "ok" {
		return false
	}
	*holds = append(*holds, semHold{fence: fence, n: n})
	c.semLook(g, s, *holds)
	return true
}

// semRelease releases n of the permits in holds, the latest acquisitions
// first (as Release does), with a deadline of 1-5 ms one time in five.
// It returns false when Release failed.
func (c *client) semRelease(g int, rng *rand.Rand, base context.Context, m *dsync.Semaphore, n int64, holds *[]semHold) bool {
	ctx, cancel := base, context.CancelFunc(func() {})
	if rng.IntN(5) == 0 {
		ctx, cancel = deadline(rng, base, time.Millisecond, 5*time.Millisecond)
	}
	defer cancel()
	id := c.rec.call(g, Event{Op: opSemRelease, Name: semName, N: n})
	err := m.Release(ctx, n)
	c.rec.ret(g, id, result(Event{Op: opSemRelease, Name: semName, N: n}, err))
	if err != nil {
		*holds = nil
		return false
	}
	for left := n; left > 0; {
		last := &(*holds)[len(*holds)-1]
		if last.n > left {
			last.n -= left
			break
		}
		left -= last.n
		*holds = (*holds)[:len(*holds)-1]
	}
	return true
}

// semLineQuery reads the live tickets of a semaphore's line, in order:
// dsync_ticket's rows (documented in docs/OPERATIONS.md: a Semaphore's
// are kept under its name with the byte 0xFE before it) whose lease has
// not ended on the database's clock, markers left out (their numbers
// start at 2^62).
const semLineQuery = `SELECT t.seq, t.holder, t.weight FROM dsync_ticket t JOIN dsync_lease l ON l.id = t.holder
WHERE t.name = CONCAT(CHAR(254), ?) AND t.seq < 4611686018427387904 AND l.expires_at > UTC_TIMESTAMP(6) ORDER BY t.seq`

// semLook reads the semaphore's line right after an acquisition or a
// partial release returned, in one statement, and records it (Value:
// "seq:holder:weight ..."; Seq: the session's latest ticket, the latest
// acquisition's; N: the permits the goroutine holds): that ticket took,
// so the live tickets up to and including it weigh at most the limit,
// then and as long as it holds, and the session's tickets weigh at least
// what the goroutine holds (see checkSemLines).
func (c *client) semLook(g int, s *dsync.Session, holds []semHold) {
	sess := s.ID()
	id := c.rec.call(g, Event{Op: opSemLook, Name: semName, Sess: sess})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	e := Event{Op: opSemLook, Name: semName, Sess: sess}
	for _, h := range holds {
		e.N += h.n
	}
	rows, err := c.regDB.QueryContext(ctx, semLineQuery, semName)
	if err != nil {
		c.rec.ret(g, id, result(e, err))
		return
	}
	defer rows.Close()
	var line []string
	for rows.Next() {
		var seq, holder, weight int64
		if err := rows.Scan(&seq, &holder, &weight); err != nil {
			c.rec.ret(g, id, result(e, err))
			return
		}
		line = append(line, fmt.Sprintf("%d:%d:%d", seq, holder, weight))
		if holder == sess {
			e.Seq = seq
		}
	}
	e.Value = strings.Join(line, " ")
	c.rec.ret(g, id, result(e, rows.Err()))
}

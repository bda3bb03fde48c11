//go:build linux

package torture

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// semState is the model's state of the semaphore semName: the permits
// each client holds, the greatest fence granted, and the fenced register.
// It is comparable, as porcupine's default equality wants.
type semState struct {
	Held      string // ",client:permits," for each client that holds, by client
	LastFence int64  // greatest fence granted so far
	RegFence  int64  // greatest fence landed in the register
}

// permits returns the clients' permits in s, by client.
func (s semState) permits() map[int]int64 {
	out := map[int]int64{}
	for _, f := range strings.Split(strings.Trim(s.Held, ","), ",") {
		c, n, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		ci, _ := strconv.Atoi(c)
		ni, _ := strconv.ParseInt(n, 10, 64)
		out[ci] = ni
	}
	return out
}

// withPermits returns s's Held with client c holding n permits.
func (s semState) withPermits(c int, n int64) string {
	p := s.permits()
	p[c] = n
	var ids []int
	for id, k := range p {
		if k > 0 {
			ids = append(ids, id)
		}
	}
	return clientList(ids, func(id int) string { return fmt.Sprintf("%d:%d", id, p[id]) })
}

// semStep is the sequential specification of a semaphore of semLimit
// permits with a fenced register: an acquisition of N permits is legal
// only when the permits held add up to at most the limit with it, and
// with a fence above every fence granted before; a release only of
// permits the client holds; a check only while the client holds the
// permits it counts (N); writes of the register as for a lock.
func semStep(st interface{}, in interface{}, _ interface{}) (bool, interface{}) {
	s := st.(semState)
	o := in.(mop)
	p := s.permits()
	switch o.Kind {
	case kAcquire:
		var total int64
		for _, n := range p {
			total += n
		}
		if o.N <= 0 || total+o.N > semLimit || (o.Fence != 0 && o.Fence <= s.LastFence) {
			return false, s
		}
		s.Held = s.withPermits(o.Client, p[o.Client]+o.N)
		s.LastFence = max(s.LastFence, o.Fence)
		return true, s
	case kRelease:
		if o.N <= 0 || p[o.Client] < o.N {
			return false, s
		}
		s.Held = s.withPermits(o.Client, p[o.Client]-o.N)
		return true, s
	case kCheck:
		return o.N > 0 && p[o.Client] == o.N, s
	case kWrite:
		ok, reg := writeStep(s.RegFence, o)
		s.RegFence = reg
		return ok, s
	}
	return false, s
}

// semModel is the porcupine model of the semaphore semName.
var semModel = porcupine.Model{
	Init:              func() interface{} { return semState{} },
	Step:              semStep,
	DescribeOperation: describeOp,
	DescribeState: func(st interface{}) string {
		s := st.(semState)
		return fmt.Sprintf("permits %q (limit %d) fence %d register %d", s.Held, semLimit, s.LastFence, s.RegFence)
	},
}

// walkSemaphore turns one semaphore operation of client c (call, with
// its ret) into model operations; endHold ends the client's hold of all
// the permits it holds (see walk). A client's hold is the permits it
// holds, from its first acquisition to the release of the last; its
// acquisitions and releases carry their permits (N), its checks the
// permits it counts. A Release that failed may have released the permits
// or not (it says which only in its text): the goroutine stops using
// them, and the hold ends, as a lock's after a failed Unlock, between its
// last proof and the earliest time its session surely ended.
// Acquisitions that failed or had no reply are left out, as a lock's.
func (b *builder) walkSemaphore(c int, pi procInc, holds map[string]*hold, call, ret Event, d string, endHold func(h *hold, call, ret int64, d string)) {
	h := holds[call.Name]
	if h != nil && !h.sem {
		h = nil
	}
	switch call.Op {
	case opSemAcquire, opSemTry:
		if ret.Res != "ok" {
			return
		}
		d += fmt.Sprintf(" %d permits, session %d", call.N, ret.Sess)
		if h == nil {
			b.groups++
			h = &hold{name: call.Name, sem: true, sess: ret.Sess, group: b.groups}
			holds[call.Name] = h
		}
		b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kAcquire, Client: c, N: call.N, Fence: ret.Fence, Group: h.group, Desc: d})
		h.permits += call.N
		h.confirm = call.TS
	case opSemRelease:
		if h == nil {
			return
		}
		d += fmt.Sprintf(" %d of %d permits", call.N, h.permits)
		if ret.Res != "ok" {
			endHold(h, h.confirm, b.bound(pi, h.sess, call.TS), d)
			return
		}
		b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kRelease, Client: c, N: call.N, Group: h.group, Desc: d})
		if h.permits -= call.N; h.permits <= 0 {
			delete(holds, call.Name)
		}
	case opSemLook:
		if ret.Res == "ok" {
			b.semLooks = append(b.semLooks, semLook{client: c, call: call.TS, ret: ret.TS, sess: ret.Sess, seq: ret.Seq, held: ret.N, line: ret.Value})
		}
	}
}

// semLook is a read of the semaphore's line right after an acquisition
// or a partial release returned (see semLook in client_semaphore_test.go).
type semLook struct {
	client    int
	call, ret int64
	sess, seq int64  // the session and its latest ticket, the latest acquisition's (0: none live)
	held      int64  // the permits the client holds
	line      string // "seq:holder:weight ..."
}

// semClockSlack is added to the backward steps of the server's clock,
// summed, and the TTL, to bound how long after a step back a lease that
// had ended may be live again on the server's clock (a look counts it).
const semClockSlack = 7 * time.Second

// checkSemLines checks what the Semaphore's line promises (its "no
// barging" and limit, on the database's side): a ticket holds when the
// weights of the live tickets up to and including it add up to at most
// the limit, tickets ahead of it only go or shrink, and later ones are
// numbered behind it, so once a ticket took its permits, the live
// tickets up to it weigh at most the limit for as long as it is live.
// Each look, made right after an acquisition or a partial release
// returned, read the live line in one statement: the line up to the
// session's latest ticket (the latest acquisition's) must weigh at most
// the limit, and the session's tickets at least the permits the client
// holds (else the database counts free permits that a holder holds). A ticket
// that took while an earlier one did not fit (overtaking it), or that
// took beyond the limit, fails. (A step back of the server's clock makes
// leases that had ended live again, whose tickets then count in the line
// though their sessions hold nothing: in looks within the sum of the
// backward steps plus the TTL and semClockSlack after one, the tickets
// of leases lost at some time (lostAt, before or after the look: a lease
// that lives again after a step had ended there, so its session saw Done
// before, or was killed), are left out.) Looks that
// find no live ticket of the session (its lease ended meanwhile) prove
// nothing.
func (b *builder) checkSemLines() []anomaly {
	var out []anomaly
	for _, l := range b.semLooks {
		if l.seq == 0 {
			b.semLooksSkipped++
			continue
		}
		afterStep := slices.ContainsFunc(b.clockBack, func(w [2]int64) bool { return l.call >= w[0] && l.call <= w[1] })
		if afterStep {
			b.semLooksAfterStep++
		}
		var prefix int64
		for _, f := range strings.Fields(l.line) {
			var seq, holder, weight int64
			if _, err := fmt.Sscanf(f, "%d:%d:%d", &seq, &holder, &weight); err != nil || seq > l.seq || (afterStep && b.everLost(holder)) {
				continue
			}
			prefix += weight
		}
		var own int64
		for _, f := range strings.Fields(l.line) {
			var seq, holder, weight int64
			if _, err := fmt.Sscanf(f, "%d:%d:%d", &seq, &holder, &weight); err == nil && holder == l.sess {
				own += weight
			}
		}
		if own < l.held {
			out = append(out, anomaly{name: semName, check: "line", result: porcupine.Illegal, first: l.call, last: l.call, text: fmt.Sprintf(
				"Semaphore line: client %d holds %d permits, and its session's (%d) live tickets weigh %d at %d (seq:holder:weight: %s)",
				l.client, l.held, l.sess, own, l.call, l.line)})
		}
		if prefix > semLimit {
			out = append(out, anomaly{name: semName, check: "line", result: porcupine.Illegal, first: l.call, last: l.call, text: fmt.Sprintf(
				"Semaphore line: client %d's acquisition (session %d, ticket %d) returned before %d, and the live tickets up to it weigh %d > %d at %d (seq:holder:weight: %s)",
				l.client, l.sess, l.seq, l.call, prefix, semLimit, l.call, l.line)})
		}
	}
	return out
}

// everLost reports whether the history shows session sess's lease lost at
// some time (see lostAts).
func (b *builder) everLost(sess int64) bool {
	_, lost := b.lostAt[sess]
	return lost
}

// clockBacks fills clockBack from the history's backward steps of the
// server's clock (see checkSemLines).
func (b *builder) clockBacks(events []Event) {
	var back int64
	for _, e := range events {
		if e.Proc == -1 && e.Op == nemClock && e.Dur < 0 {
			back -= e.Dur
			b.clockBack = append(b.clockBack, [2]int64{e.TS, e.TS + back + int64(b.ttl) + int64(semClockSlack)})
		}
	}
}

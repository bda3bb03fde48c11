//go:build linux

package torture

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// never is the return time of an operation whose effect may come at any
// later point (porcupine: an operation open to the end of the history).
const never = math.MaxInt64

// The kinds of model operations.
const (
	kAcquire = "acquire" // the client takes the lock (exclusive or shared) with a fence
	kRelease = "release" // the client's hold ends
	kCheck   = "check"   // the client still holds (Session.Err() was nil while it held)
	kWrite   = "write"   // a write of the fenced register landed or was refused
)

// mop is a model operation: porcupine's Input. Output is unused.
type mop struct {
	Kind   string
	Client int   // the client: one goroutine of one incarnation of a process
	Shared bool  // acquire, release, check: the read side of an RWMutex
	Fence  int64 // acquire: the hold's fence (0: not known); write: the fence written
	Landed bool  // write: it landed (else the database refused it)
	Group  int   // the hold (or lone write) the operation belongs to; the step ignores it
	Desc   string

	// Elections (see electionStep): Fence is the term.
	Sess    int64  // acquire, read: the leader's session (0: not known)
	Value   string // acquire, proclaim, maybe, read: the leader's value
	Phantom bool   // acquire: a Campaign that failed or had no reply, seen leading by a read
	Idx     int    // proclaim, maybe: the Proclaim's place in its term (1: the first)

	// Semaphores (see semStep).
	N int64 // acquire, release: the permits taken or given back; check: the permits the client counts
}

// lockState is the model's state of one lock name: who holds it, the
// greatest fence granted, and the greatest fence the register holds.
// It is comparable, as porcupine's default equality wants.
type lockState struct {
	Holder    int    // exclusive holder's client, or -1
	Readers   string // the shared holders, as ",a,b," with a < b
	LastFence int64  // greatest fence granted so far
	RegFence  int64  // greatest fence landed in the register
}

func (s lockState) hasReader(c int) bool {
	return strings.Contains(s.Readers, ","+strconv.Itoa(c)+",")
}

func (s lockState) withReader(c int, add bool) string {
	var ids []int
	for _, f := range strings.Split(strings.Trim(s.Readers, ","), ",") {
		if n, err := strconv.Atoi(f); err == nil && n != c {
			ids = append(ids, n)
		}
	}
	if add {
		ids = append(ids, c)
	}
	return clientList(ids, strconv.Itoa)
}

// clientList encodes clients for a comparable model state: ",a,b," with
// a < b, each client written by item; "" for none.
func clientList(ids []int, item func(int) string) string {
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	var b strings.Builder
	for _, id := range ids {
		b.WriteString("," + item(id))
	}
	return b.String() + ","
}

// step is the sequential specification of a lock with a fenced register:
// an exclusive acquire is legal only when nobody holds the lock and its
// fence is above every fence granted before; a shared acquire only when no
// one holds it exclusively; a release and a check only by a holder; a
// landed write only with a fence above the register's, a refused one only
// with a fence at or below it.
func step(st interface{}, in interface{}, _ interface{}) (bool, interface{}) {
	s := st.(lockState)
	o := in.(mop)
	switch o.Kind {
	case kAcquire:
		if o.Shared {
			if s.Holder != -1 || s.hasReader(o.Client) {
				return false, s
			}
			s.Readers = s.withReader(o.Client, true)
			return true, s
		}
		if s.Holder != -1 || s.Readers != "" || (o.Fence != 0 && o.Fence <= s.LastFence) {
			return false, s
		}
		s.Holder = o.Client
		s.LastFence = max(s.LastFence, o.Fence)
		return true, s
	case kRelease:
		if o.Shared {
			if !s.hasReader(o.Client) {
				return false, s
			}
			s.Readers = s.withReader(o.Client, false)
			return true, s
		}
		if s.Holder != o.Client {
			return false, s
		}
		s.Holder = -1
		return true, s
	case kCheck:
		if o.Shared {
			return s.hasReader(o.Client), s
		}
		return s.Holder == o.Client, s
	case kWrite:
		ok, reg := writeStep(s.RegFence, o)
		s.RegFence = reg
		return ok, s
	}
	return false, s
}

// writeStep is the fenced register's step, with reg the greatest fence
// it holds: a landed write is legal only with a fence above it (and
// becomes it), a refused one only with a fence at or below it.
func writeStep(reg int64, o mop) (bool, int64) {
	if o.Landed {
		return o.Fence > reg, max(reg, o.Fence)
	}
	return o.Fence <= reg, reg
}

// describeOp is the models' DescribeOperation.
func describeOp(in, _ interface{}) string { return in.(mop).Desc }

// lockModel is the porcupine model of one lock name; histories are
// partitioned by name before they are checked.
var lockModel = porcupine.Model{
	Init:              func() interface{} { return lockState{Holder: -1} },
	Step:              step,
	DescribeOperation: describeOp,
	DescribeState: func(st interface{}) string {
		s := st.(lockState)
		return fmt.Sprintf("holder %d readers %q fence %d register %d", s.Holder, s.Readers, s.LastFence, s.RegFence)
	},
}

// procInc names one incarnation of a client process.
type procInc struct{ proc, inc int }

// clientKey names one client: a goroutine of an incarnation.
type clientKey struct{ proc, inc, g int }

// hold is a client's hold of a lock as the history shows it.
type hold struct {
	name    string
	shared  bool
	tx      bool   // a LockTx hold: it ends with its transaction, not with the lease
	sess    int64  // the session it was taken with
	confirm int64  // the call time of the last operation that proved it held
	group   int    // its model operations' Group
	txWrite *Event // a LockTx hold's write that landed in the transaction, not yet committed

	// A leadership (an Election's Campaign that returned nil).
	elect bool
	term  int64                 // its term (0: not known)
	idx   int                   // Proclaims sent in it so far
	maybe []porcupine.Operation // its failed Proclaims, not added yet: they may land until the next Proclaim that returns nil

	// A Semaphore's permits that the client holds.
	sem     bool
	permits int64
}

// builder turns a history into model operations per lock name.
type builder struct {
	ttl     time.Duration
	logKeys map[string]bool // keys of the register writes that landed (the log table)
	clients map[clientKey]int
	parts   map[string][]porcupine.Operation
	sessEnd map[int64]int64   // session -> the earliest time it is known to have ended
	procEnd map[procInc]int64 // incarnation -> the time it was killed, plus TTL and slack
	fairOps []fairOp
	groups  int // Groups given out

	// Elections: when the database surely counts a lease no longer
	// (dbBound), the leaders seen by value, the values sent, and the
	// observers' deliveries.
	dbEnd         map[int64]int64
	procDBEnd     map[procInc]int64
	seen          map[string]leaderSeen
	values        map[string]valueSent
	observed      map[observerKey][]delivery
	observerOrder []observerKey
	revivedReads  int             // leader reads left out: a lost lease's, after a backward step of the clock (see walkElection)
	lostAt        map[int64]int64 // session -> when its lease was first seen lost (Done, a lost Close, its process killed)

	// Semaphores: the looks at the line, those without the session's
	// ticket and those after a backward step of the server's clock, the
	// and the windows after such a step.
	semLooks          []semLook
	semLooksSkipped   int
	semLooksAfterStep int
	clockBack         [][2]int64

	complete int // operations with a ret
	unknown  int // operations without one (their process was killed)
}

// fairOp is a FairMutex.Lock that returned nil, with the tickets its
// waiter was seen holding.
type fairOp struct {
	name    string
	client  int
	call    int64
	ret     int64
	tickets []ticketSeen
}

type ticketSeen struct {
	seq  int64
	sess int64 // the lease id the look asked for
	at   int64 // call time of the look that saw it
}

// killSlack is added to a killed process's kill time plus TTL to bound when
// its lease has ended on the server: a renewal sent just before the kill
// may reach the server late (the fault proxy's latency), and the server
// may be restarting.
const killSlack = 5 * time.Second

func (b *builder) client(k clientKey) int {
	if id, ok := b.clients[k]; ok {
		return id
	}
	id := len(b.clients)
	b.clients[k] = id
	return id
}

func (b *builder) add(name string, call, ret int64, client int, o mop) {
	if o.Group == 0 {
		b.groups++
		o.Group = b.groups
	}
	if ret < call {
		ret = call
	}
	b.parts[name] = append(b.parts[name], porcupine.Operation{ClientId: client, Input: o, Call: call, Return: ret})
}

// bound returns the earliest time by which a hold of session sess taken by
// incarnation pi has surely ended, or never.
func (b *builder) bound(pi procInc, sess int64, after int64) int64 {
	end := int64(never)
	if t, ok := b.sessEnd[sess]; ok && t >= after {
		end = t
	}
	if t, ok := b.procEnd[pi]; ok && t >= after {
		end = min(end, t)
	}
	return end
}

// build reads the history and fills parts.
func build(events []Event, ttl time.Duration, logKeys map[string]bool) *builder {
	b := &builder{
		ttl:     ttl,
		logKeys: logKeys,
		clients: map[clientKey]int{},
		parts:   map[string][]porcupine.Operation{},
		sessEnd: map[int64]int64{},
		procEnd: map[procInc]int64{},

		dbEnd:     map[int64]int64{},
		procDBEnd: map[procInc]int64{},
		seen:      map[string]leaderSeen{},
		values:    map[string]valueSent{},
		observed:  map[observerKey][]delivery{},
	}
	b.dbEnds(events)
	b.seenLeaders(events)
	b.clockBacks(events)
	b.lostAt = lostAts(events)
	// Session ends and kills first: releases refer to them.
	perClient := map[clientKey][]Event{}
	var order []clientKey
	for _, e := range events {
		switch {
		case e.Proc == -1 && e.Op == nemKill:
			b.procEnd[procInc{e.G, e.Inc}] = e.TS + int64(ttl) + int64(killSlack)
			continue
		case e.Proc == -1:
			continue
		case e.Op == opDone && e.Type == "event":
			if t, ok := b.sessEnd[e.Sess]; !ok || e.TS < t {
				b.sessEnd[e.Sess] = e.TS
			}
			continue
		case e.Op == opClose && e.Type != "call" && e.Res == "ok":
			if t, ok := b.sessEnd[e.Sess]; !ok || e.TS < t {
				b.sessEnd[e.Sess] = e.TS
			}
			continue
		}
		if e.G < 0 {
			continue
		}
		k := clientKey{e.Proc, e.Inc, e.G}
		if _, ok := perClient[k]; !ok {
			order = append(order, k)
		}
		perClient[k] = append(perClient[k], e)
	}
	for _, k := range order {
		b.walk(k, perClient[k])
	}
	b.groupReads()
	return b
}

// walk turns one client's events, in its program order, into model
// operations.
func (b *builder) walk(k clientKey, evs []Event) {
	c := b.client(k)
	pi := procInc{k.proc, k.inc}
	holds := map[string]*hold{}
	pending := map[int64]*Event{} // the calls awaiting their ret
	var fair *fairOp              // the FairMutex.Lock in progress
	desc := func(e Event, r *Event) string {
		s := fmt.Sprintf("p%d.%d g%d %s %s", k.proc, k.inc, k.g, e.Op, e.Name)
		if r != nil {
			s += " -> " + r.Res
			if r.Fence != 0 {
				s += fmt.Sprintf(" fence %d", r.Fence)
			}
			if e.Fence != 0 && r.Fence == 0 {
				s += fmt.Sprintf(" fence %d", e.Fence)
			}
			if r.Err != "" {
				s += " (" + r.Err + ")"
			}
		} else {
			s += " -> no reply"
		}
		return s
	}
	endHold := func(h *hold, call, ret int64, d string) {
		if h.elect {
			// The session stops leading by ret; the database may count
			// it a while longer.
			b.add(h.name, call, ret, c, mop{Kind: kLose, Client: c, Fence: h.term, Group: h.group, Desc: d})
			b.add(h.name, call, b.dbBound(pi, h.sess, call), c, mop{Kind: kRelease, Client: c, Fence: h.term, Group: h.group, Desc: d + " (in the database)"})
			b.flushMaybe(h, never)
		} else {
			b.add(h.name, call, ret, c, mop{Kind: kRelease, Client: c, Shared: h.shared, N: h.permits, Group: h.group, Desc: d})
		}
		delete(holds, h.name)
	}
	for i := range evs {
		e := evs[i]
		switch e.Type {
		case "call":
			pending[e.ID] = &evs[i]
			if e.Op == opFairLock {
				fair = &fairOp{name: e.Name, client: c, call: e.TS}
			}
			continue
		case "event":
			continue
		}
		p := pending[e.ID]
		if p == nil {
			continue
		}
		call := *p
		delete(pending, e.ID)
		b.complete++
		d := desc(call, &e)
		switch call.Op {
		case opTicket:
			if fair != nil && e.Seq != 0 {
				fair.tickets = append(fair.tickets, ticketSeen{seq: e.Seq, sess: e.Sess, at: call.TS})
			}
		case opLock, opTryLock, opLockTx, opFairLock, opRLock, opWLock:
			if call.Op == opFairLock {
				if fair != nil && e.Res == "ok" {
					fair.ret = e.TS
					// Only the tickets of the lease the hold is on: with
					// WithReplaceLostLease a waiting Lock goes on under a
					// new lease, and the lost one's ticket is dead.
					fair.tickets = slices.DeleteFunc(fair.tickets, func(t ticketSeen) bool { return t.sess != e.Sess })
					b.fairOps = append(b.fairOps, *fair)
				}
				fair = nil
			}
			if e.Res != "ok" {
				continue
			}
			shared := call.Op == opRLock
			b.groups++
			b.add(call.Name, call.TS, e.TS, c, mop{Kind: kAcquire, Client: c, Shared: shared, Fence: e.Fence, Group: b.groups, Desc: d})
			holds[call.Name] = &hold{name: call.Name, shared: shared, tx: call.Op == opLockTx, sess: e.Sess, confirm: call.TS, group: b.groups}
		case opCampaign, opProclaim, opResign, opLeader, opObserved:
			b.walkElection(k, c, pi, holds, call, e, d, endHold)
		case opSemAcquire, opSemTry, opSemRelease, opSemLook:
			b.walkSemaphore(c, pi, holds, call, e, d, endHold)
		case opCheck:
			h := holds[call.Name]
			if h == nil {
				continue
			}
			if e.Res == "ok" {
				b.add(call.Name, call.TS, e.TS, c, mop{Kind: kCheck, Client: c, Shared: h.shared, N: h.permits, Group: h.group, Desc: d})
				h.confirm = call.TS
			} else {
				// Err() said the lease is gone: the hold ended before.
				endHold(h, h.confirm, e.TS, d)
			}
		case opWrite:
			h := holds[call.Name]
			grp := 0
			if h != nil {
				grp = h.group
			}
			if h != nil && h.tx {
				// Written in the LockTx transaction: it lands with the commit.
				switch e.Res {
				case "landed", "unknown":
					w := call
					w.Res = e.Res
					h.txWrite = &w
				case "refused":
					b.add(call.Name, call.TS, e.TS, c, mop{Kind: kWrite, Client: c, Group: grp, Fence: call.Fence, Desc: d})
				}
				continue
			}
			switch e.Res {
			case "landed":
				b.add(call.Name, call.TS, e.TS, c, mop{Kind: kWrite, Client: c, Group: grp, Fence: call.Fence, Landed: true, Desc: d})
			case "refused":
				b.add(call.Name, call.TS, e.TS, c, mop{Kind: kWrite, Client: c, Group: grp, Fence: call.Fence, Desc: d})
			default:
				if b.logKeys[call.Key] {
					b.add(call.Name, call.TS, never, c, mop{Kind: kWrite, Client: c, Group: grp, Fence: call.Fence, Landed: true, Desc: d + " (landed: in the log)"})
				}
			}
		case opUnlock, opRUnlock:
			h := holds[call.Name]
			if h == nil || h.tx {
				continue
			}
			if e.Res == "ok" {
				endHold(h, call.TS, e.TS, d)
			} else {
				endHold(h, h.confirm, b.bound(pi, h.sess, call.TS), d)
			}
		case opCommit, opRollback, opRTS:
			h := holds[call.Name]
			if h == nil || !h.tx {
				continue
			}
			w := h.txWrite
			switch {
			case call.Op == opRTS:
				// The hold ends in the database at once; the session frees
				// the lock row in the background.
				endHold(h, call.TS, b.bound(pi, h.sess, call.TS), d)
			case e.Res == "ok":
				if call.Op == opCommit && w != nil && w.Res == "landed" {
					b.add(call.Name, call.TS, e.TS, c, mop{Kind: kWrite, Client: c, Group: h.group, Fence: w.Fence, Landed: true, Desc: fmt.Sprintf("p%d.%d g%d write %s fence %d, landed in the transaction (committed)", k.proc, k.inc, k.g, w.Name, w.Fence)})
				}
				endHold(h, call.TS, e.TS, d)
			default:
				if w != nil && b.logKeys[w.Key] {
					b.add(call.Name, call.TS, never, c, mop{Kind: kWrite, Client: c, Group: h.group, Fence: w.Fence, Landed: true, Desc: desc(*w, nil) + " (landed: in the log)"})
				}
				endHold(h, call.TS, never, d)
			}
		}
	}
	for _, p := range pending {
		if p.Op == opTicket || p.Op == opSemLook {
			continue
		}
		b.unknown++
		b.pendingElection(c, pi, holds, *p, desc(*p, nil))
		if p.Op == opCampaign || p.Op == opProclaim {
			continue
		}
		// The process died in a call. An acquire whose outcome is unknown
		// is left out: had it taken the lock, it would have held it until
		// the lease ended, which keeps others out but never lets two hold.
		if p.Op == opWrite && b.logKeys[p.Key] {
			if h := holds[p.Name]; h == nil || !h.tx {
				grp := 0
				if h != nil {
					grp = h.group
				}
				b.add(p.Name, p.TS, never, c, mop{Kind: kWrite, Client: c, Fence: p.Fence, Landed: true, Group: grp, Desc: desc(*p, nil) + " (landed: in the log)"})
			}
		}
	}
	for _, h := range holds {
		end := int64(never)
		if !h.tx {
			end = b.bound(pi, h.sess, h.confirm)
		} else if h.txWrite != nil && b.logKeys[h.txWrite.Key] {
			b.add(h.name, h.confirm, never, c, mop{Kind: kWrite, Client: c, Group: h.group, Fence: h.txWrite.Fence, Landed: true, Desc: desc(*h.txWrite, nil) + " (landed: in the log)"})
		}
		endHold(h, h.confirm, end, fmt.Sprintf("p%d.%d g%d end of hold of %s (no release seen)", k.proc, k.inc, k.g, h.name))
	}
}

// anomaly is a lock name whose history no order makes legal, a broken
// FairMutex or Observe order, or a Semaphore's line over its limit.
type anomaly struct {
	name   string
	check  string // "linearizability", "fifo", "observe" or "line"
	result porcupine.CheckResult
	text   string // the smallest illegal sub-history, or the FIFO pair
	info   porcupine.LinearizationInfo
	ops    []porcupine.Operation
	first  int64 // the call time of the earliest operation of text
	last   int64 // the call time of its latest: the history is illegal from then on
}

// check checks every partition, the FairMutex and Observe orders and the
// Semaphore's lines, and returns the anomalies and the partitions whose
// check timed out.
func (b *builder) check(timeout time.Duration, t0 int64) (anomalies []anomaly, timedOut []string) {
	names := make([]string, 0, len(b.parts))
	for n := range b.parts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ops := b.parts[n]
		res, info := porcupine.CheckOperationsVerbose(modelFor(n), ops, timeout)
		switch res {
		case porcupine.Ok:
		case porcupine.Unknown:
			timedOut = append(timedOut, n)
		default:
			text, first, last := smallest(modelFor(n), ops, t0)
			anomalies = append(anomalies, anomaly{name: n, check: "linearizability", result: res, text: text, info: info, ops: ops, first: first, last: last})
		}
	}
	anomalies = append(anomalies, b.checkFIFO()...)
	anomalies = append(anomalies, b.checkObserve()...)
	anomalies = append(anomalies, b.checkSemLines()...)
	return anomalies, timedOut
}

// smallest cuts an illegal history down to a small illegal sub-history:
// it drops whole holds (an acquire with its checks, writes and release)
// and lone writes, in halves, then quarters, down to one at a time, as
// long as what is left stays illegal, then single checks and refused
// writes. Dropping a hold never makes a legal
// history illegal, but for a refused write whose refusal the dropped hold's
// write explained: the result is a diagnosis; the verdict is the whole
// partition's. Times are seconds since t0.
func smallest(model porcupine.Model, ops []porcupine.Operation, t0 int64) (text string, first, last int64) {
	groups := map[int][]porcupine.Operation{}
	var ids []int
	for _, o := range ops {
		g := o.Input.(mop).Group
		if _, ok := groups[g]; !ok {
			ids = append(ids, g)
		}
		groups[g] = append(groups[g], o)
	}
	illegal := func(keep []int) bool {
		var h []porcupine.Operation
		for _, g := range keep {
			h = append(h, groups[g]...)
		}
		return porcupine.CheckOperationsTimeout(model, h, 5*time.Second) == porcupine.Illegal
	}
	for size := max(len(ids)/2, 1); ; size /= 2 {
		for i := 0; i < len(ids); {
			end := min(i+size, len(ids))
			rest := append(slices.Clone(ids[:i]), ids[end:]...)
			if len(rest) > 0 && illegal(rest) {
				ids = rest
			} else {
				i = end
			}
		}
		if size == 1 {
			break
		}
	}
	var h []porcupine.Operation
	for _, g := range ids {
		h = append(h, groups[g]...)
	}
	// Then single checks and refused writes, whose removal only makes a
	// history easier to order.
	for i := 0; i < len(h); {
		o := h[i].Input.(mop)
		// A check whose call opens its hold's release is kept: it is why
		// the release cannot come sooner.
		opens := slices.ContainsFunc(h, func(r porcupine.Operation) bool {
			ro := r.Input.(mop)
			return ro.Kind == kRelease && ro.Group == o.Group && r.Call == h[i].Call
		})
		if (o.Kind == kCheck && !opens) || (o.Kind == kWrite && !o.Landed) {
			rest := append(slices.Clone(h[:i]), h[i+1:]...)
			if porcupine.CheckOperationsTimeout(model, rest, 5*time.Second) == porcupine.Illegal {
				h = rest
				continue
			}
		}
		i++
	}
	sort.SliceStable(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	first = h[0].Call
	last = h[len(h)-1].Call
	var b strings.Builder
	fmt.Fprintf(&b, "%d of its %d operations are illegal on their own (seconds since the start; never: may take effect at any later time):\n", len(h), len(ops))
	for _, o := range h {
		ret := "      never"
		if o.Return != never {
			ret = fmt.Sprintf("%11.6f", float64(o.Return-t0)/1e9)
		}
		fmt.Fprintf(&b, "  [%11.6f, %s] %-7s %s\n", float64(o.Call-t0)/1e9, ret, o.Input.(mop).Kind, o.Input.(mop).Desc)
	}
	return b.String(), first, last
}

// checkFIFO checks what FairMutex promises about order: a waiter's ticket
// is granted only when no live ticket of the name with a smaller number
// waits. Observable consequence, checked here: FairMutex.Lock calls A and B
// of one name by different clients both returned nil; B's waiter was seen
// holding ticket sB and A's ticket sA < sB; and A's ticket was seen both
// before B's Lock returned and still waiting after (so B was granted while
// A's earlier ticket waited). Seen before matters: a number comes again
// once every ticket above it is gone (qTicketInsert numbers a ticket above
// the name's highest live one), so a ticket A took after B's hold and line
// ended may carry a number below B's. A ticket seen while B's ticket
// existed (B's holds until its Unlock, after its Lock returned) and
// numbered below it was taken before it. A's Lock returned nil later, so its session's
// lease was live throughout (without WithReplaceLostLease a lost lease
// makes Lock fail; with it, only tickets of the lease Lock returned on
// count) and its ticket was live: B overtook a live waiter.
func (b *builder) checkFIFO() []anomaly {
	var out []anomaly
	byName := map[string][]fairOp{}
	for _, f := range b.fairOps {
		byName[f.name] = append(byName[f.name], f)
	}
	for name, ops := range byName {
		for _, a := range ops {
			for _, tA := range a.tickets {
				for _, bb := range ops {
					if bb.client == a.client || tA.at <= bb.ret || !slices.ContainsFunc(a.tickets, func(t ticketSeen) bool {
						return t.seq == tA.seq && t.at <= bb.ret
					}) {
						continue
					}
					for _, tB := range bb.tickets {
						if tB.seq > tA.seq {
							out = append(out, anomaly{name: name, check: "fifo", result: porcupine.Illegal, first: bb.ret, last: tA.at, text: fmt.Sprintf(
								"FairMutex order: client %d's Lock (ticket %d) returned at %d, while client %d's earlier ticket %d was seen waiting at %d (its Lock returned nil at %d)",
								bb.client, tB.seq, bb.ret, a.client, tA.seq, tA.at, a.ret)})
							break
						}
					}
				}
			}
		}
	}
	return out
}

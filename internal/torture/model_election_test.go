//go:build linux

package torture

import (
	"fmt"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The kinds of model operations of an election, besides kAcquire (a
// Campaign that led: Fence the term, Sess and Value the leader's),
// kRelease (the hold ends in the database: nobody leads from then on),
// kCheck and kWrite, which mean what they mean for a lock.
const (
	kLose      = "lose"      // the leader's session stops leading (its lease ended for the client); the database may count it a while longer
	kProclaim  = "proclaim"  // a Proclaim that returned nil: the value is Value from then on
	kMaybe     = "maybe"     // a Proclaim that failed otherwise (or had no reply): it may have set Value, if its hold still led
	kNotLeader = "notleader" // a Proclaim that returned ErrNotLeader
	kRead      = "read"      // Leader() returned (Sess, Fence, Value), or Observe delivered it
	kNoLeader  = "noleader"  // Leader() returned ErrNoLeader
)

// electSlack is added to the time a lease was seen lost (Done) or its
// process killed, plus the TTL (three TTLs after Done: a renewal sent just
// before the loss may land late), to bound when the database stops
// counting it live: what the leader reads report depends on the
// database's view, not the client's. It covers the fault proxy's latency,
// a server restart and a Galera cluster's commit stall after a node fault
// (about 6 s); backward steps of the server's clock are added to it.
const electSlack = 10 * time.Second

// electionState is the model's state of an election: the leader as the
// database counts it (Holder, with its session, term and value), whether
// its session still counts itself the leader (Active: a lease ends for
// the client before it ends in the database), the greatest term granted,
// and the fenced register. It is comparable, as porcupine's default
// equality wants.
type electionState struct {
	Holder   int    // the leading client, or -1
	Sess     int64  // the leader's session (0: not known)
	Term     int64  // its term (0: not known)
	Value    string // its value
	Ver      int    // the place of the value in the term (0: the Campaign's, n: the n-th Proclaim's)
	Active   bool   // its session has not seen its lease end
	LastTerm int64  // greatest term granted so far
	RegFence int64  // greatest fence landed in the register
}

// leads reports whether client c leads with term in s, as the database
// counts it.
func (s electionState) leads(c int, term int64) bool {
	return s.Holder == c && (term == 0 || s.Term == 0 || s.Term == term)
}

// electionStep is the sequential specification of an election: a
// Campaign leads only when nobody leads, with a term above every term
// granted before (an exclusive lock whose fence is the term); a Leader()
// read returns the leader's session, term and latest value, and
// ErrNoLeader only when nobody leads; a Proclaim that returned nil
// changes the value while its hold leads, and ErrNotLeader comes only
// when the caller does not lead (in the database, or for its session);
// checks come only while the leader's session leads; writes of the
// register as for a lock.
func electionStep(st interface{}, in interface{}, _ interface{}) (bool, interface{}) {
	s := st.(electionState)
	o := in.(mop)
	switch o.Kind {
	case kAcquire:
		if s.Holder != -1 || (o.Fence != 0 && o.Fence <= s.LastTerm) {
			return false, s
		}
		s.Holder, s.Sess, s.Term, s.Value, s.Ver, s.Active = o.Client, o.Sess, o.Fence, o.Value, 0, !o.Phantom
		s.LastTerm = max(s.LastTerm, o.Fence)
		return true, s
	case kRelease:
		if !s.leads(o.Client, o.Fence) {
			return false, s
		}
		return true, electionState{Holder: -1, LastTerm: s.LastTerm, RegFence: s.RegFence}
	case kLose:
		if !s.leads(o.Client, o.Fence) {
			return false, s
		}
		s.Active = false
		return true, s
	case kCheck:
		return s.Holder == o.Client && s.Active, s
	case kProclaim:
		if !s.leads(o.Client, o.Fence) {
			return false, s
		}
		s.Value, s.Ver = o.Value, max(s.Ver, o.Idx)
		return true, s
	case kMaybe:
		// A Proclaim the client gave up on never lands after a later one.
		if s.leads(o.Client, o.Fence) && o.Idx > s.Ver {
			s.Value, s.Ver = o.Value, o.Idx
		}
		return true, s
	case kNotLeader:
		return !(s.leads(o.Client, o.Fence) && s.Active), s
	case kRead:
		ok := s.Holder != -1 && (s.Sess == 0 || s.Sess == o.Sess) && (s.Term == 0 || s.Term == o.Fence) && s.Value == o.Value
		return ok, s
	case kNoLeader:
		return s.Holder == -1, s
	case kWrite:
		ok, reg := writeStep(s.RegFence, o)
		s.RegFence = reg
		return ok, s
	}
	return false, s
}

// electionModel is the porcupine model of the election electName.
var electionModel = porcupine.Model{
	Init:              func() interface{} { return electionState{Holder: -1} },
	Step:              electionStep,
	DescribeOperation: describeOp,
	DescribeState: func(st interface{}) string {
		s := st.(electionState)
		return fmt.Sprintf("leader %d session %d term %d value %q (#%d) active %v; last term %d register %d",
			s.Holder, s.Sess, s.Term, s.Value, s.Ver, s.Active, s.LastTerm, s.RegFence)
	},
}

// modelFor returns the model of the lock name's partition.
func modelFor(name string) porcupine.Model {
	switch name {
	case electName:
		return electionModel
	case semName:
		return semModel
	}
	return lockModel
}

// leaderSeen is a leader that a Leader() read returned or an observer
// delivered.
type leaderSeen struct {
	sess, term int64
}

// valueSent is what the history says of a value a Campaign or Proclaim
// sent: the leadership it was for (its session and term, 0 where not
// known), and its place in that leadership (0: the Campaign's, n: the
// n-th Proclaim's).
type valueSent struct {
	sess, term int64
	idx        int
}

// delivery is one Leader an observer delivered.
type delivery struct {
	sess, term int64
	value      string
	at         int64 // when the receiver had it
}

// dbBound returns the earliest time by which the database surely counts
// no hold of session sess, taken by incarnation pi, after after: the
// session closed while its lease was live (Close deleted the lease), or
// the lease seen lost or the process killed, plus its TTL and slack; or
// never.
func (b *builder) dbBound(pi procInc, sess int64, after int64) int64 {
	end := int64(never)
	if t, ok := b.dbEnd[sess]; ok && sess != 0 && t >= after {
		end = t
	}
	if t, ok := b.procDBEnd[pi]; ok && t >= after {
		end = min(end, t)
	}
	return end
}

// dbEnds fills dbEnd and procDBEnd from the history's session ends and
// kills (see dbBound).
func (b *builder) dbEnds(events []Event) {
	var back int64 // the backward steps of the server's clock, summed
	for _, e := range events {
		if e.Proc == -1 && e.Op == nemClock && e.Dur < 0 {
			back -= e.Dur
		}
	}
	late := int64(b.ttl) + int64(electSlack) + back
	end := func(sess, t int64) {
		if old, ok := b.dbEnd[sess]; !ok || t < old {
			b.dbEnd[sess] = t
		}
	}
	for _, e := range events {
		switch {
		case e.Proc == -1 && e.Op == nemKill:
			b.procDBEnd[procInc{e.G, e.Inc}] = e.TS + late
		case e.Proc == -1:
		case e.Op == opDone && e.Type == "event":
			end(e.Sess, e.TS+2*int64(b.ttl)+late)
		case e.Op == opClose && e.Type != "call" && e.Res == "ok" && !e.Lost:
			end(e.Sess, e.TS)
		}
	}
}

// lostAts returns when each session's lease was first seen lost, by its
// session (Done, or a Close that found it lost) or by the kill of its
// process incarnation.
func lostAts(events []Event) map[int64]int64 {
	at := map[int64]int64{}
	lost := func(sess, t int64) {
		if old, ok := at[sess]; !ok || t < old {
			at[sess] = t
		}
	}
	killedAt := map[procInc]int64{}
	byProc := map[procInc][]int64{}
	for _, e := range events {
		switch {
		case e.Proc == -1 && e.Op == nemKill:
			if _, ok := killedAt[procInc{e.G, e.Inc}]; !ok {
				killedAt[procInc{e.G, e.Inc}] = e.TS
			}
		case e.Proc == -1 || e.Sess == 0:
		case e.Op == opDone, e.Op == opClose && e.Lost:
			lost(e.Sess, e.TS)
		default:
			pi := procInc{e.Proc, e.Inc}
			byProc[pi] = append(byProc[pi], e.Sess)
		}
	}
	for pi, ids := range byProc {
		if t, ok := killedAt[pi]; ok {
			for _, id := range ids {
				lost(id, t)
			}
		}
	}
	return at
}

// seenLeaders collects the leaders the reads and observers saw, by value.
func (b *builder) seenLeaders(events []Event) {
	for _, e := range events {
		if e.Type == "ret" && e.Res == "ok" && (e.Op == opLeader || e.Op == opObserved) {
			b.seen[e.Value] = leaderSeen{sess: e.Leader, term: e.Fence}
		}
	}
}

// checkObserve checks what Observe promises of each observer's
// deliveries: each has a greater (term, place of its value in the term)
// than the one before, so no stale leader comes after a newer one, and
// each is a leadership the history shows: its value was sent by a
// Campaign (that led, or failed or had no reply: it may have led a
// moment) or a Proclaim, with the session and term the history gives it,
// where known. (That each was the leader at some instant while the
// observer read it, the model checks: deliveries are reads.)
func (b *builder) checkObserve() []anomaly {
	var out []anomaly
	for _, k := range b.observerOrder {
		seq := b.observed[k]
		var prevTerm int64
		prevIdx := -1
		for i, d := range seq {
			bad := ""
			v, ok := b.values[d.value]
			switch {
			case !ok:
				bad = "a value no Campaign or Proclaim of the history sent"
			case v.sess != 0 && v.sess != d.sess:
				bad = fmt.Sprintf("its value was sent on session %d", v.sess)
			case v.term != 0 && v.term != d.term:
				bad = fmt.Sprintf("its value was sent in term %d", v.term)
			case i > 0 && (d.term < prevTerm || d.term == prevTerm && v.idx <= prevIdx):
				bad = fmt.Sprintf("after term %d value #%d of that term (stale or repeated)", prevTerm, prevIdx)
			}
			if bad != "" {
				out = append(out, anomaly{name: electName, check: "observe", result: porcupine.Illegal, first: seq[0].at, last: d.at, text: fmt.Sprintf(
					"Observe order: observer p%d.%d #%d delivered (session %d, term %d, value %q) at %d: %s",
					k.proc, k.inc, k.n, d.sess, d.term, d.value, d.at, bad)})
				break
			}
			prevTerm, prevIdx = d.term, v.idx
		}
	}
	return out
}

// observerKey names one Observe call: its process incarnation and number.
type observerKey struct {
	proc, inc int
	n         int64
}

// walkElection turns one election operation of client c (call, with its
// ret) into model operations; endHold ends a leadership (see walk).
func (b *builder) walkElection(k clientKey, c int, pi procInc, holds map[string]*hold, call, ret Event, d string, endHold func(h *hold, call, ret int64, d string)) {
	h := holds[call.Name]
	if h != nil && !h.elect {
		h = nil
	}
	switch call.Op {
	case opCampaign:
		// ret.Sess is 0 when the session's lease changed during the call.
		b.values[call.Value] = valueSent{sess: ret.Sess, term: ret.Fence}
		if ret.Res != "ok" {
			b.phantom(c, pi, call, ret.TS, d)
			return
		}
		b.groups++
		d += fmt.Sprintf(" session %d value %q", ret.Sess, call.Value)
		b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kAcquire, Client: c, Fence: ret.Fence, Sess: ret.Sess, Value: call.Value, Group: b.groups, Desc: d})
		holds[call.Name] = &hold{name: call.Name, elect: true, sess: ret.Sess, term: ret.Fence, confirm: call.TS, group: b.groups}
	case opProclaim:
		if h == nil {
			return
		}
		h.idx++
		b.values[call.Value] = valueSent{sess: h.sess, term: h.term, idx: h.idx}
		d += fmt.Sprintf(" value %q", call.Value)
		o := mop{Client: c, Fence: h.term, Value: call.Value, Idx: h.idx, Group: h.group, Desc: d}
		switch ret.Res {
		case "ok":
			o.Kind = kProclaim
			b.flushMaybe(h, ret.TS)
			b.add(call.Name, call.TS, ret.TS, c, o)
		case "notleader":
			o.Kind = kNotLeader
			b.add(call.Name, call.TS, ret.TS, c, o)
		default:
			o.Kind = kMaybe
			h.maybe = append(h.maybe, porcupine.Operation{ClientId: c, Input: o, Call: call.TS})
		}
	case opResign:
		if h == nil {
			return
		}
		if ret.Res == "ok" && !ret.Lost {
			// Released in the database on a live lease.
			b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kRelease, Client: c, Fence: h.term, Group: h.group, Desc: d})
			b.flushMaybe(h, never)
			delete(holds, call.Name)
			return
		}
		endHold(h, h.confirm, ret.TS, d)
	case opLeader, opObserved:
		switch ret.Res {
		case "ok":
			d += fmt.Sprintf(": session %d term %d value %q", ret.Leader, ret.Fence, ret.Value)
			// A backward step of the server's clock makes a lease that
			// had ended there live again until it ends again: a leader
			// whose lease was lost may be read as leading once more,
			// which the model, whose leadership ends once, cannot take.
			// Such reads of a lost lease that may have read after a
			// step (their call to ret meets its window) are left out
			// (docs/DESIGN.md "Elections": what a clock step does).
			// (Lost before the read returned: a lease ends on the
			// server after its session sees Done, or is killed.)
			if at, lost := b.lostAt[ret.Leader]; lost && at <= ret.TS &&
				slices.ContainsFunc(b.clockBack, func(w [2]int64) bool { return ret.TS >= w[0] && call.TS <= w[1] }) {
				b.revivedReads++
				break
			}
			b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kRead, Client: c, Sess: ret.Leader, Fence: ret.Fence, Value: ret.Value, Desc: d})
		case "noleader":
			b.add(call.Name, call.TS, ret.TS, c, mop{Kind: kNoLeader, Client: c, Desc: d})
		}
		if call.Op == opObserved && ret.Res == "ok" {
			ok := observerKey{k.proc, k.inc, call.Seq}
			if _, ok2 := b.observed[ok]; !ok2 {
				b.observerOrder = append(b.observerOrder, ok)
			}
			b.observed[ok] = append(b.observed[ok], delivery{sess: ret.Leader, term: ret.Fence, value: ret.Value, at: ret.TS})
		}
	}
}

// pendingElection handles an election operation whose process died before
// its reply: a Campaign may have led (phantom), a Proclaim may have
// landed.
func (b *builder) pendingElection(c int, pi procInc, holds map[string]*hold, call Event, d string) {
	switch call.Op {
	case opCampaign:
		b.values[call.Value] = valueSent{}
		b.phantom(c, pi, call, never, d)
	case opProclaim:
		h := holds[call.Name]
		if h == nil || !h.elect {
			return
		}
		h.idx++
		b.values[call.Value] = valueSent{sess: h.sess, term: h.term, idx: h.idx}
		h.maybe = append(h.maybe, porcupine.Operation{ClientId: c, Call: call.TS,
			Input: mop{Kind: kMaybe, Client: c, Fence: h.term, Value: call.Value, Idx: h.idx, Group: h.group, Desc: d + fmt.Sprintf(" value %q", call.Value)}})
	}
}

// phantom adds the leadership of a Campaign that failed (returned at ret)
// or had no reply (ret never), when a read saw it lead: it took the lock
// and recorded itself before it gave up (its ctx ended between the two
// statements, or after the record), and gave the hold back before it
// returned, or left it to its session. Unseen, it is left out: it only
// kept the others out a while.
func (b *builder) phantom(c int, pi procInc, call Event, ret int64, d string) {
	l, ok := b.seen[call.Value]
	if !ok {
		return
	}
	b.groups++
	d += fmt.Sprintf(" value %q, seen leading with session %d term %d", call.Value, l.sess, l.term)
	b.add(call.Name, call.TS, ret, c, mop{Kind: kAcquire, Client: c, Fence: l.term, Sess: l.sess, Value: call.Value, Phantom: true, Group: b.groups, Desc: d})
	b.add(call.Name, call.TS, b.dbBound(pi, l.sess, call.TS), c, mop{Kind: kRelease, Client: c, Fence: l.term, Group: b.groups, Desc: d + " (its end)"})
}

// flushMaybe adds a leadership's failed Proclaims, which may land until
// ret: a Proclaim the client gave up on never lands after a later one.
func (b *builder) flushMaybe(h *hold, ret int64) {
	for _, o := range h.maybe {
		b.add(h.name, o.Call, ret, o.ClientId, o.Input.(mop))
	}
	h.maybe = nil
}

// groupReads puts each read of the election into the Group of the
// operation that set the value it read (a Campaign, a Proclaim), so that
// smallest drops a leadership with the reads that saw it: a read without
// its leadership is illegal whatever else happened.
func (b *builder) groupReads() {
	ops := b.parts[electName]
	setBy := map[string]int{}
	for _, o := range ops {
		if m := o.Input.(mop); m.Value != "" && m.Kind != kRead {
			setBy[m.Value] = m.Group
		}
	}
	for i, o := range ops {
		if m := o.Input.(mop); m.Kind == kRead {
			if g, ok := setBy[m.Value]; ok {
				m.Group = g
				ops[i].Input = m
			}
		}
	}
}

//go:build linux

package torture

import (
	"strings"
	"testing"
	"time"
)

// ev builds one client's call and ret (ret at ts+1; no ret when res is "").
func ev(proc, g int, id int64, ts int64, op, name, res string, fence, sess int64) []Event {
	out := []Event{{Proc: proc, G: g, ID: id, Type: "call", TS: ts, Op: op, Name: name, Fence: fence}}
	if op == opWrite {
		fence = 0
	}
	if res != "" {
		out = append(out, Event{Proc: proc, G: g, ID: id, Type: "ret", TS: ts + 1, Op: op, Name: name, Res: res, Fence: fence, Sess: sess})
	}
	return out
}

func history(parts ...[]Event) []Event {
	var out []Event
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// checkHistory checks events and fails t unless the anomalies found
// mention illegal ("": none found).
func checkHistory(t *testing.T, events []Event, ttl time.Duration, logKeys map[string]bool, illegal string) {
	t.Helper()
	b := build(events, ttl, logKeys)
	anomalies, timedOut := b.check(10*time.Second, 0)
	if len(timedOut) > 0 {
		t.Fatalf("timed out: %v", timedOut)
	}
	var got []string
	for _, a := range anomalies {
		got = append(got, a.name+": "+a.text)
	}
	switch {
	case illegal == "" && len(got) > 0:
		t.Fatalf("got anomalies %q; want none", got)
	case illegal != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), illegal)):
		t.Fatalf("got anomalies %q; want one mentioning %q", got, illegal)
	}
}

// TestModel checks the checker on small histories, legal and not.
func TestModel(t *testing.T) {
	const ttl = time.Second
	done := func(sess, ts int64) []Event {
		return []Event{{Proc: 0, G: -1, Type: "event", TS: ts, Op: opDone, Sess: sess}}
	}
	for _, tc := range []struct {
		name    string
		events  []Event
		logKeys map[string]bool
		illegal string // the anomaly's text contains this; "" for legal
	}{
		{"one holder after another", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 10, opCheck, "m", "ok", 0, 0), ev(0, 0, 3, 20, opUnlock, "m", "ok", 0, 0),
			ev(1, 0, 1, 20, opLock, "m", "ok", 6, 2), ev(1, 0, 2, 30, opCheck, "m", "ok", 0, 0), ev(1, 0, 3, 40, opUnlock, "m", "ok", 0, 0),
		), nil, ""},
		{"two holders", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 10, opCheck, "m", "ok", 0, 0), ev(0, 0, 3, 20, opUnlock, "m", "ok", 0, 0),
			ev(1, 0, 1, 3, opLock, "m", "ok", 6, 2), ev(1, 0, 2, 30, opUnlock, "m", "ok", 0, 0),
		), nil, "lock"},
		{"fence not above the last", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 20, opUnlock, "m", "ok", 0, 0),
			ev(1, 0, 1, 30, opLock, "m", "ok", 5, 2), ev(1, 0, 2, 40, opUnlock, "m", "ok", 0, 0),
		), nil, "lock"},
		{"taken over after the holder's Done", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 10, opCheck, "m", "ok", 0, 0), done(1, 50), ev(0, 0, 3, 60, opUnlock, "m", "fail", 0, 0),
			ev(1, 0, 1, 20, opLock, "m", "ok", 6, 2), ev(1, 0, 2, 70, opUnlock, "m", "ok", 0, 0),
		), nil, ""},
		{"taken over while the holder's check says held", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 30, opCheck, "m", "ok", 0, 0), done(1, 50),
			ev(1, 0, 1, 20, opLock, "m", "ok", 6, 2), ev(1, 0, 2, 22, opUnlock, "m", "ok", 0, 0),
		), nil, "check"},
		{"a stale holder's write refused after a newer one landed", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), done(1, 10), ev(0, 0, 2, 40, opWrite, "m", "refused", 5, 0),
			ev(1, 0, 1, 20, opLock, "m", "ok", 6, 2), ev(1, 0, 2, 30, opWrite, "m", "landed", 6, 0), ev(1, 0, 3, 50, opUnlock, "m", "ok", 0, 0),
		), nil, ""},
		{"a write refused with no greater fence written", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 5, 1), ev(0, 0, 2, 10, opWrite, "m", "refused", 5, 0), ev(0, 0, 3, 20, opUnlock, "m", "ok", 0, 0),
		), nil, "write"},
		{"a stale write refused after a write with a lost reply that landed (the log says)", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 4, 1), done(1, 10), ev(0, 0, 2, 40, opWrite, "m", "refused", 4, 0),
			ev(1, 0, 1, 20, opLock, "m", "ok", 5, 2), append(ev(1, 0, 2, 25, opWrite, "m", "", 5, 0), Event{Proc: 1, G: 0, ID: 2, Type: "ret", TS: 26, Op: opWrite, Name: "m", Res: "unknown"}), ev(1, 0, 3, 50, opUnlock, "m", "ok", 0, 0),
		), map[string]bool{"": true}, ""},
		{"a stale write refused after a write with a lost reply that did not land", history(
			ev(0, 0, 1, 0, opLock, "m", "ok", 4, 1), done(1, 10), ev(0, 0, 2, 40, opWrite, "m", "refused", 4, 0),
			ev(1, 0, 1, 20, opLock, "m", "ok", 5, 2), append(ev(1, 0, 2, 25, opWrite, "m", "", 5, 0), Event{Proc: 1, G: 0, ID: 2, Type: "ret", TS: 26, Op: opWrite, Name: "m", Res: "unknown"}), ev(1, 0, 3, 50, opUnlock, "m", "ok", 0, 0),
		), nil, "write"},
		{"readers together, no writer with them", history(
			ev(0, 0, 1, 0, opRLock, "rw", "ok", 0, 1), ev(0, 0, 2, 10, opCheck, "rw", "ok", 0, 0), ev(0, 0, 3, 30, opRUnlock, "rw", "ok", 0, 0),
			ev(1, 0, 1, 0, opRLock, "rw", "ok", 0, 2), ev(1, 0, 2, 10, opCheck, "rw", "ok", 0, 0), ev(1, 0, 3, 30, opRUnlock, "rw", "ok", 0, 0),
			ev(2, 0, 1, 5, opWLock, "rw", "ok", 9, 3), ev(2, 0, 2, 40, opUnlock, "rw", "ok", 0, 0),
		), nil, "rw"},
		{"FairMutex: a later ticket granted while an earlier one waits", history(
			ev(0, 0, 1, 0, opFairLock, "f", "", 0, 0)[:1], ev(0, 0, 2, 10, opTicket, "f", "ok", 0, 1), ev(0, 0, 3, 100, opTicket, "f", "ok", 0, 1),
			[]Event{{Proc: 0, G: 0, ID: 1, Type: "ret", TS: 200, Op: opFairLock, Name: "f", Res: "ok", Fence: 8, Sess: 1}}, ev(0, 0, 4, 210, opUnlock, "f", "ok", 0, 0),
			ev(1, 0, 1, 20, opFairLock, "f", "", 0, 0)[:1], ev(1, 0, 2, 30, opTicket, "f", "ok", 0, 2),
			[]Event{{Proc: 1, G: 0, ID: 1, Type: "ret", TS: 50, Op: opFairLock, Name: "f", Res: "ok", Fence: 7, Sess: 2}}, ev(1, 0, 3, 60, opUnlock, "f", "ok", 0, 0),
		), nil, "FairMutex order"},
		{"FairMutex: a lower ticket number after the line emptied", history(
			ev(1, 0, 1, 20, opFairLock, "f", "", 0, 0)[:1], ev(1, 0, 2, 30, opTicket, "f", "ok", 0, 2),
			[]Event{{Proc: 1, G: 0, ID: 1, Type: "ret", TS: 50, Op: opFairLock, Name: "f", Res: "ok", Fence: 7, Sess: 2}}, ev(1, 0, 3, 60, opUnlock, "f", "ok", 0, 0),
			ev(0, 0, 1, 70, opFairLock, "f", "", 0, 0)[:1], ev(0, 0, 2, 80, opTicket, "f", "ok", 0, 1), ev(0, 0, 3, 100, opTicket, "f", "ok", 0, 1),
			[]Event{{Proc: 0, G: 0, ID: 1, Type: "ret", TS: 200, Op: opFairLock, Name: "f", Res: "ok", Fence: 8, Sess: 1}}, ev(0, 0, 4, 210, opUnlock, "f", "ok", 0, 0),
		), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Ticket numbers: client 0's is 1, client 1's is 2.
			for i := range tc.events {
				if tc.events[i].Op == opTicket && tc.events[i].Type == "ret" {
					tc.events[i].Seq = int64(tc.events[i].Proc) + 1
				}
			}
			checkHistory(t, tc.events, ttl, tc.logKeys, tc.illegal)
		})
	}
}

// eop builds an election operation of process proc's goroutine 0 (ret at
// ts+1; no ret when res is ""): value is the call's (campaign, proclaim)
// or the leader read (leader, observed, with leader its session); term
// the ret's Fence; sess the ret's session (campaign). res "lost" is a
// Resign that returned nil on an ended lease.
func eop(proc int, id, ts int64, op, res string, term, sess int64, value string, leader int64) []Event {
	g := 0
	if op == opObserved {
		g = gObserver
	}
	call := Event{Proc: proc, G: g, ID: id, Type: "call", TS: ts, Op: op, Name: electName, Seq: 1}
	ret := Event{Proc: proc, G: g, ID: id, Type: "ret", TS: ts + 1, Op: op, Name: electName, Res: res, Fence: term, Sess: sess, Seq: 1}
	switch op {
	case opCampaign, opProclaim:
		call.Value = value
	default:
		ret.Value, ret.Leader = value, leader
	}
	if res == "lost" {
		ret.Res, ret.Lost = "ok", true
	}
	if res == "" {
		return []Event{call}
	}
	return []Event{call, ret}
}

// retAt is op (a call and its ret) with the ret at ts.
func retAt(op []Event, ts int64) []Event {
	op[1].TS = ts
	return op
}

// doneEvent is process proc's session sess seen lost (Done) at ts.
func doneEvent(proc int, sess, ts int64) []Event {
	return []Event{{Proc: proc, G: -1, Type: "event", TS: ts, Op: opDone, Sess: sess}}
}

// TestModelElection checks the election's model and the Observe check on
// small histories, a legal and an illegal one for each rule.
func TestModelElection(t *testing.T) {
	const ttl = time.Second
	done := doneEvent
	kill := func(proc int, ts int64) []Event {
		return []Event{{Proc: -1, G: proc, Type: "event", TS: ts, Op: nemKill}}
	}
	check := func(proc int, id, ts int64) []Event { return ev(proc, 0, id, ts, opCheck, electName, "ok", 0, 0) }
	// One term after another, read by another client in each state.
	rounds := history(
		eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(1, 1, 10, opLeader, "ok", 5, 0, "a", 1),
		eop(0, 2, 20, opProclaim, "ok", 0, 0, "b", 0), eop(1, 2, 30, opLeader, "ok", 5, 0, "b", 1),
		eop(0, 3, 40, opResign, "ok", 0, 0, "", 0), eop(1, 3, 50, opLeader, "noleader", 0, 0, "", 0),
		eop(1, 4, 60, opCampaign, "ok", 6, 2, "c", 0), eop(0, 4, 70, opLeader, "ok", 6, 0, "c", 2),
		eop(1, 5, 80, opResign, "ok", 0, 0, "", 0),
	)
	for _, tc := range []struct {
		name    string
		events  []Event
		illegal string // the anomaly's text contains this; "" for legal
	}{
		{"leaders one after another, read in each state", rounds, ""},
		{"two leaders at once", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), check(0, 2, 30), eop(0, 3, 40, opResign, "ok", 0, 0, "", 0),
			eop(1, 1, 10, opCampaign, "ok", 6, 2, "c", 0), eop(1, 2, 50, opResign, "ok", 0, 0, "", 0),
		), "campaign"},
		{"a term not above the last", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opResign, "ok", 0, 0, "", 0),
			eop(1, 1, 20, opCampaign, "ok", 5, 2, "c", 0), eop(1, 2, 30, opResign, "ok", 0, 0, "", 0),
		), "campaign"},
		{"a resigned leader read after the next one leads", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opResign, "ok", 0, 0, "", 0),
			eop(1, 1, 20, opCampaign, "ok", 6, 2, "c", 0), eop(2, 1, 30, opLeader, "ok", 5, 0, "a", 1), eop(1, 2, 40, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"the leader read with another term", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(1, 1, 10, opLeader, "ok", 4, 0, "a", 1), eop(0, 2, 20, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"the leader read with another session", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(1, 1, 10, opLeader, "ok", 5, 0, "a", 9), eop(0, 2, 20, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"the value before a Proclaim that returned read after it", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opProclaim, "ok", 0, 0, "b", 0),
			eop(1, 1, 20, opLeader, "ok", 5, 0, "a", 1), eop(0, 3, 30, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"ErrNoLeader while a leader's checks prove it leads", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), check(0, 2, 10), eop(1, 1, 20, opLeader, "noleader", 0, 0, "", 0),
			check(0, 3, 30), eop(0, 4, 40, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"ErrNotLeader after the leader's lease was seen lost", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 15), eop(0, 2, 20, opProclaim, "notleader", 0, 0, "b", 0),
			eop(0, 3, 30, opResign, "lost", 0, 0, "", 0),
		), ""},
		{"ErrNotLeader while the leader's checks prove it leads", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), check(0, 2, 10), eop(0, 3, 20, opProclaim, "notleader", 0, 0, "b", 0),
			check(0, 4, 30), eop(0, 5, 40, opResign, "ok", 0, 0, "", 0),
		), "proclaim"},
		{"a leader read after its lease was seen lost, before the database ends it", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 10), eop(0, 2, 15, opResign, "lost", 0, 0, "", 0),
			eop(1, 1, 20, opLeader, "ok", 5, 0, "a", 1),
		), ""},
		{"a lost leader read again after a step back of the clock (its lease lives again there)", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 10), eop(0, 2, 15, opResign, "lost", 0, 0, "", 0),
			eop(1, 1, 20, opLeader, "noleader", 0, 0, "", 0),
			[]Event{{Proc: -1, G: -1, Type: "event", TS: 30, Op: nemClock, Dur: -int64(time.Second)}},
			eop(1, 2, 40, opLeader, "ok", 5, 0, "a", 1),
		), ""},
		{"a lost leader read again, the read under way as the clock steps back", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 10), eop(0, 2, 15, opResign, "lost", 0, 0, "", 0),
			eop(1, 1, 20, opLeader, "noleader", 0, 0, "", 0),
			[]Event{{Proc: -1, G: -1, Type: "event", TS: 30, Op: nemClock, Dur: -int64(time.Second)}},
			retAt(eop(1, 2, 25, opLeader, "ok", 5, 0, "a", 1), 31),
		), ""},
		{"a resigned leader read again after a step back of the clock (its lease never lost)", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opResign, "ok", 0, 0, "", 0),
			[]Event{{Proc: -1, G: -1, Type: "event", TS: 20, Op: nemClock, Dur: -int64(time.Second)}},
			eop(1, 1, 30, opLeader, "ok", 5, 0, "a", 1), done(0, 1, 40),
		), "leader"},
		{"a lost leader read again after ErrNoLeader, with no step of the clock", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 10), eop(0, 2, 15, opResign, "lost", 0, 0, "", 0),
			eop(1, 1, 20, opLeader, "noleader", 0, 0, "", 0), eop(1, 2, 40, opLeader, "ok", 5, 0, "a", 1),
		), "leader"},
		{"a killed leader read when the database has surely ended its lease", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), kill(0, 10),
			eop(1, 1, 10+int64(ttl+electSlack)+int64(time.Second), opLeader, "ok", 5, 0, "a", 1),
		), "leader"},
		{"a failed Campaign read leading (it led a moment)", history(
			eop(0, 1, 0, opCampaign, "fail", 0, 1, "x", 0), eop(1, 1, 5, opLeader, "ok", 7, 0, "x", 1),
			eop(2, 1, 20, opCampaign, "ok", 8, 3, "c", 0), eop(2, 2, 30, opResign, "ok", 0, 0, "", 0),
		), ""},
		{"a value no Campaign sent read leading", history(
			eop(0, 1, 0, opCampaign, "fail", 0, 1, "x", 0), eop(1, 1, 5, opLeader, "ok", 7, 0, "z", 1),
		), "leader"},
		{"a failed Proclaim read landed, and not landed", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opProclaim, "fail", 0, 0, "b", 0),
			eop(1, 1, 20, opLeader, "ok", 5, 0, "a", 1), eop(1, 2, 30, opLeader, "ok", 5, 0, "b", 1), eop(0, 3, 40, opResign, "ok", 0, 0, "", 0),
		), ""},
		{"a failed Proclaim read landed after a later one returned", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), eop(0, 2, 10, opProclaim, "fail", 0, 0, "b", 0),
			eop(0, 3, 20, opProclaim, "ok", 0, 0, "c", 0), eop(1, 1, 30, opLeader, "ok", 5, 0, "b", 1), eop(0, 4, 40, opResign, "ok", 0, 0, "", 0),
		), "leader"},
		{"a stale term's write landed after a newer one's", history(
			eop(0, 1, 0, opCampaign, "ok", 5, 1, "a", 0), done(0, 1, 10),
			eop(1, 1, 20, opCampaign, "ok", 6, 2, "c", 0), ev(1, 0, 2, 30, opWrite, electName, "landed", 6, 0), eop(1, 3, 40, opResign, "ok", 0, 0, "", 0),
			ev(0, 0, 2, 50, opWrite, electName, "landed", 5, 0),
		), "write"},
		{"Observe: every change in order", history(rounds,
			eop(2, 1, 0, opObserved, "ok", 5, 0, "a", 1), eop(2, 2, 25, opObserved, "ok", 5, 0, "b", 1), eop(2, 3, 60, opObserved, "ok", 6, 0, "c", 2),
		), ""},
		{"Observe: an older term after a newer", history(rounds,
			eop(2, 1, 0, opObserved, "ok", 6, 0, "c", 2)[:1], eop(2, 2, 0, opObserved, "ok", 5, 0, "a", 1)[:1],
			[]Event{{Proc: 2, G: gObserver, ID: 1, Type: "ret", TS: 100, Op: opObserved, Name: electName, Res: "ok", Fence: 6, Value: "c", Leader: 2, Seq: 1},
				{Proc: 2, G: gObserver, ID: 2, Type: "ret", TS: 101, Op: opObserved, Name: electName, Res: "ok", Fence: 5, Value: "a", Leader: 1, Seq: 1}},
		), "Observe order"},
		{"Observe: an older value of a term after a newer", history(rounds,
			eop(2, 1, 0, opObserved, "ok", 5, 0, "b", 1)[:1], eop(2, 2, 0, opObserved, "ok", 5, 0, "a", 1)[:1],
			[]Event{{Proc: 2, G: gObserver, ID: 1, Type: "ret", TS: 100, Op: opObserved, Name: electName, Res: "ok", Fence: 5, Value: "b", Leader: 1, Seq: 1},
				{Proc: 2, G: gObserver, ID: 2, Type: "ret", TS: 101, Op: opObserved, Name: electName, Res: "ok", Fence: 5, Value: "a", Leader: 1, Seq: 1}},
		), "Observe order"},
		{"Observe: a value no Campaign or Proclaim sent", history(rounds,
			eop(2, 1, 0, opObserved, "ok", 5, 0, "zz", 1),
		), "Observe order"},
		{"Observe: a leader with another session than its Campaign's", history(
			eop(0, 1, 0, opCampaign, "fail", 0, 1, "x", 0), eop(1, 1, 5, opObserved, "ok", 7, 0, "x", 9),
		), "Observe order"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkHistory(t, tc.events, ttl, nil, tc.illegal)
		})
	}
}

// sop builds a semaphore operation of process proc's goroutine 0 (ret at
// ts+1; no ret when res is ""): n permits asked for or given back (for a
// look: the line, in line, and sess's latest ticket seq), fence and sess
// the ret's.
func sop(proc int, id, ts int64, op, res string, n, fence, sess int64) []Event {
	call := Event{Proc: proc, ID: id, Type: "call", TS: ts, Op: op, Name: semName, N: n, Sess: sess}
	ret := Event{Proc: proc, ID: id, Type: "ret", TS: ts + 1, Op: op, Name: semName, Res: res, N: n, Fence: fence, Sess: sess}
	if res == "" {
		return []Event{call}
	}
	return []Event{call, ret}
}

// look builds a read of the semaphore's line by process proc (see
// semLook): line as "seq:holder:weight ...", seq the session's latest
// ticket; the client holds 1 permit.
func look(proc int, id, ts int64, sess, seq int64, line string) []Event {
	return lookHeld(proc, id, ts, sess, seq, 1, line)
}

// lookHeld is look by a client that holds held permits.
func lookHeld(proc int, id, ts int64, sess, seq, held int64, line string) []Event {
	return []Event{
		{Proc: proc, ID: id, Type: "call", TS: ts, Op: opSemLook, Name: semName, Sess: sess},
		{Proc: proc, ID: id, Type: "ret", TS: ts + 1, Op: opSemLook, Name: semName, Res: "ok", Sess: sess, Seq: seq, N: held, Value: line},
	}
}

// TestModelSemaphore checks the semaphore's model (limit semLimit, 3) and
// its line check on small histories, a legal and an illegal one for each
// rule.
func TestModelSemaphore(t *testing.T) {
	const ttl = time.Second
	done := doneEvent
	check := func(proc int, id, ts int64) []Event { return ev(proc, 0, id, ts, opCheck, semName, "ok", 0, 0) }
	for _, tc := range []struct {
		name    string
		events  []Event
		logKeys map[string]bool
		illegal string // the anomaly's text contains this; "" for legal
	}{
		// held ≤ limit
		{"2 and 1 permits held together", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), check(0, 2, 10), check(0, 3, 30), sop(0, 4, 40, opSemRelease, "ok", 2, 0, 1),
			sop(1, 1, 5, opSemTry, "ok", 1, 6, 2), check(1, 2, 20), sop(1, 3, 50, opSemRelease, "ok", 1, 0, 2),
		), nil, ""},
		{"2 and 2 permits held together", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), check(0, 2, 10), check(0, 3, 30), sop(0, 4, 40, opSemRelease, "ok", 2, 0, 1),
			sop(1, 1, 5, opSemAcquire, "ok", 2, 6, 2), check(1, 2, 20), sop(1, 3, 50, opSemRelease, "ok", 2, 0, 2),
		), nil, "semacquire"},
		{"a second acquisition while holding, within the limit", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 10, opSemAcquire, "ok", 1, 7, 1), check(0, 3, 20), sop(0, 4, 40, opSemRelease, "ok", 2, 0, 1),
			sop(1, 1, 5, opSemAcquire, "ok", 1, 6, 2), check(1, 2, 30), sop(1, 3, 50, opSemRelease, "ok", 1, 0, 2),
		), nil, ""},
		{"a second acquisition while holding, beyond the limit", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 10, opSemAcquire, "ok", 2, 7, 1), check(0, 3, 20), sop(0, 4, 40, opSemRelease, "ok", 3, 0, 1),
			sop(1, 1, 5, opSemAcquire, "ok", 1, 6, 2), check(1, 2, 30), sop(1, 3, 50, opSemRelease, "ok", 1, 0, 2),
		), nil, "semacquire"},
		// releases only of permits held
		{"a partial release, then the rest", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), sop(0, 2, 10, opSemRelease, "ok", 1, 0, 1), check(0, 3, 20), sop(0, 4, 30, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 12, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 40, opSemRelease, "ok", 2, 0, 2),
		), nil, ""},
		{"a release of more permits than held", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 10, opSemRelease, "ok", 2, 0, 1),
		), nil, "semrelease"},
		// a lost session holds nothing from the end of its lease
		{"permits taken over after the holder's Done", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), check(0, 2, 10), done(0, 1, 50), ev(0, 0, 3, 60, opCheck, semName, "fail", 0, 0),
			sop(1, 1, 20, opSemAcquire, "ok", 2, 6, 2), check(1, 2, 30), sop(1, 3, 70, opSemRelease, "ok", 2, 0, 2),
		), nil, ""},
		{"permits taken over while the holder's check says held", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), check(0, 2, 30), done(0, 1, 50),
			sop(1, 1, 20, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 22, opSemRelease, "ok", 2, 0, 2),
		), nil, "check"},
		// a Release that failed may or may not have released
		{"a failed Release's permits taken before the session ended", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), sop(0, 2, 10, opSemRelease, "fail", 2, 0, 1), done(0, 1, 50),
			sop(1, 1, 20, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 30, opSemRelease, "ok", 2, 0, 2),
		), nil, ""},
		{"a failed Release's permits taken before its holder's last check", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), check(0, 2, 20), sop(0, 3, 30, opSemRelease, "fail", 2, 0, 1),
			sop(1, 1, 10, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 15, opSemRelease, "ok", 2, 0, 2),
		), nil, "check"},
		// fences strictly increasing
		{"holders together, each with its own fence", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(1, 1, 0, opSemAcquire, "ok", 1, 6, 2),
			sop(0, 2, 10, opSemRelease, "ok", 1, 0, 1), sop(1, 2, 10, opSemRelease, "ok", 1, 0, 2),
		), nil, ""},
		{"holders together with one fence", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(1, 1, 0, opSemAcquire, "ok", 1, 5, 2),
			sop(0, 2, 10, opSemRelease, "ok", 1, 0, 1), sop(1, 2, 10, opSemRelease, "ok", 1, 0, 2),
		), nil, "semacquire"},
		{"a later grant with a smaller fence", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 10, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 20, opSemAcquire, "ok", 1, 4, 2), sop(1, 2, 30, opSemRelease, "ok", 1, 0, 2),
		), nil, "semacquire"},
		// the fenced register
		{"a stale holder's write refused after a newer one landed", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), done(0, 1, 10), ev(0, 0, 2, 40, opWrite, semName, "refused", 5, 0),
			sop(1, 1, 20, opSemAcquire, "ok", 2, 6, 2), ev(1, 0, 2, 30, opWrite, semName, "landed", 6, 0), sop(1, 3, 50, opSemRelease, "ok", 2, 0, 2),
		), nil, ""},
		{"a stale holder's write landed after a newer one", history(
			sop(0, 1, 0, opSemAcquire, "ok", 2, 5, 1), done(0, 1, 10), ev(0, 0, 2, 40, opWrite, semName, "landed", 5, 0),
			sop(1, 1, 20, opSemAcquire, "ok", 2, 6, 2), ev(1, 0, 2, 30, opWrite, semName, "landed", 6, 0), sop(1, 3, 50, opSemRelease, "ok", 2, 0, 2),
		), nil, "write"},
		// the line: a ticket that took weighs, with those ahead, at most the limit
		{"line: a grant behind tickets that fit", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 20, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 0, opSemAcquire, "ok", 2, 6, 2), look(1, 2, 5, 2, 8, "7:1:1 8:2:2 9:3:2"), sop(1, 3, 20, opSemRelease, "ok", 2, 0, 2),
		), nil, ""},
		{"line: a grant past a waiter that does not fit", history(
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 20, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 0, opSemAcquire, "ok", 1, 6, 2), look(1, 2, 5, 2, 9, "7:1:1 8:3:2 9:2:1"), sop(1, 3, 20, opSemRelease, "ok", 1, 0, 2),
		), nil, "Semaphore line"},
		{"line: the session's tickets weigh what its client holds, after a partial release", history(
			sop(1, 1, 0, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 5, opSemRelease, "ok", 1, 0, 2),
			lookHeld(1, 3, 10, 2, 8, 1, "7:1:1 8:2:1"), sop(1, 4, 20, opSemRelease, "ok", 1, 0, 2),
		), nil, ""},
		{"line: the session's tickets weigh less than its client holds", history(
			sop(1, 1, 0, opSemAcquire, "ok", 2, 6, 2), sop(1, 2, 5, opSemRelease, "ok", 1, 0, 2),
			lookHeld(1, 3, 10, 2, 8, 1, "7:1:1 8:2:0"), sop(1, 4, 20, opSemRelease, "ok", 1, 0, 2),
		), nil, "Semaphore line"},
		{"line: a lost lease's ticket ahead, after a step back of the clock", history(
			[]Event{{Proc: -1, G: -1, Type: "event", TS: 2, Op: nemClock, Dur: -int64(time.Second)}}, done(2, 3, 100),
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 20, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 0, opSemAcquire, "ok", 1, 6, 2), look(1, 2, 5, 2, 9, "7:1:1 8:3:2 9:2:1"), sop(1, 3, 20, opSemRelease, "ok", 1, 0, 2),
		), nil, ""},
		{"line: a live lease's ticket ahead, after a step back of the clock", history(
			[]Event{{Proc: -1, G: -1, Type: "event", TS: 2, Op: nemClock, Dur: -int64(time.Second)}}, done(2, 3, 100),
			sop(0, 1, 0, opSemAcquire, "ok", 1, 5, 1), sop(0, 2, 20, opSemRelease, "ok", 1, 0, 1),
			sop(1, 1, 0, opSemAcquire, "ok", 1, 6, 2), look(1, 2, 5, 2, 9, "7:1:1 8:4:2 9:2:1"), sop(1, 3, 20, opSemRelease, "ok", 1, 0, 2),
		), nil, "Semaphore line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkHistory(t, tc.events, ttl, tc.logKeys, tc.illegal)
		})
	}
}

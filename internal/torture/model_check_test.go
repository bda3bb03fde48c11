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
			b := build(tc.events, ttl, tc.logKeys)
			anomalies, timedOut := b.check(10*time.Second, 0)
			if len(timedOut) > 0 {
				t.Fatalf("timed out: %v", timedOut)
			}
			var got []string
			for _, a := range anomalies {
				got = append(got, a.name+": "+a.text)
			}
			switch {
			case tc.illegal == "" && len(got) > 0:
				t.Fatalf("got anomalies %q; want none", got)
			case tc.illegal != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), tc.illegal)):
				t.Fatalf("got anomalies %q; want one mentioning %q", got, tc.illegal)
			}
		})
	}
}

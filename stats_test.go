package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// logRecord is one record a captureHandler received, with the attributes
// of the logger (With) and of the record, by key.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]slog.Value
	keys  []string // every key in order, repeats included
}

func (r logRecord) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", r.level, r.msg)
	for _, k := range r.keys {
		fmt.Fprintf(&b, " %s=%v", k, r.attrs[k])
	}
	return b.String()
}

// captureLog holds the records of the loggers made by newCaptureLogger.
type captureLog struct {
	mu      sync.Mutex
	records []logRecord
}

// captureHandler is a slog.Handler that keeps every record, at every level,
// in a captureLog.
type captureHandler struct {
	log   *captureLog
	attrs []slog.Attr
}

// newCaptureLogger returns a logger whose records go to the returned log.
func newCaptureLogger() (*slog.Logger, *captureLog) {
	l := &captureLog{}
	return slog.New(&captureHandler{log: l}), l
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: make(map[string]slog.Value)}
	add := func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve()
		rec.keys = append(rec.keys, a.Key)
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.log.mu.Lock()
	h.log.records = append(h.log.records, rec)
	h.log.mu.Unlock()
	return nil
}

func (h *captureHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &captureHandler{log: h.log, attrs: append(slices.Clip(h.attrs), attrs...)}
}

// WithGroup is not supported: dsync logs no groups, and a record in a group
// would show up with keys that no test expects.
func (h *captureHandler) WithGroup(name string) slog.Handler {
	return &captureHandler{log: h.log, attrs: append(slices.Clip(h.attrs), slog.String("group?", name))}
}

// find returns the records with message msg.
func (l *captureLog) find(msg string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []logRecord
	for _, r := range l.records {
		if r.msg == msg {
			found = append(found, r)
		}
	}
	return found
}

// all returns every record so far.
func (l *captureLog) all() []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.records)
}

// checkRecord checks that r has exactly the keys of want, each once, of the
// kinds want says, and that its session attribute is id.
func checkRecord(t *testing.T, r logRecord, level slog.Level, id int64, want map[string]slog.Kind) {
	t.Helper()
	if r.level != level {
		t.Errorf("record %v: level got %v; want %v", r, r.level, level)
	}
	wantKeys := slices.Sorted(maps.Keys(want))
	if got := slices.Sorted(slices.Values(r.keys)); !slices.Equal(got, wantKeys) {
		t.Errorf("record %v: keys got %v; want %v, each once", r, got, wantKeys)
	}
	for k, kind := range want {
		if v, ok := r.attrs[k]; ok && v.Kind() != kind {
			t.Errorf("record %v: %s is a %v; want a %v", r, k, v.Kind(), kind)
		}
	}
	if v := r.attrs["session"]; v.Kind() != slog.KindInt64 || v.Int64() != id {
		t.Errorf("record %v: session got %v; want %d", r, v, id)
	}
}

// The attributes of the records, by key (see the package doc's Logging).
var (
	longWaitKeys = map[string]slog.Kind{"session": slog.KindInt64, "lock": slog.KindString, "kind": slog.KindString,
		"op": slog.KindString, "waited": slog.KindDuration, "acquired": slog.KindBool}
	renewalFailedKeys = map[string]slog.Kind{"session": slog.KindInt64, "err": slog.KindAny, "attempt": slog.KindInt64,
		"deadline_in": slog.KindDuration}
	sessionLostKeys = map[string]slog.Kind{"session": slog.KindInt64, "err": slog.KindAny}
	orphanFreedKeys = map[string]slog.Kind{"session": slog.KindInt64, "lock": slog.KindString, "kind": slog.KindString,
		"token": slog.KindInt64, "age": slog.KindDuration}
)

const (
	msgLongWait      = "dsync: waited long for a lock"
	msgRenewalFailed = "dsync: lease renewal failed; retrying"
	msgSessionLost   = "dsync: session lost; its locks may belong to others now"
	msgOrphanFreed   = "dsync: orphan freed"
)

// statsWant are the figures of a Stats that a scripted step knows exactly.
type statsWant struct {
	held, waiting, orphans  int
	acquisitions, contended int64
}

// checkStats compares the exact figures of s's Stats with want and returns
// the Stats.
func checkStats(t *testing.T, step string, s *dsync.Session, want statsWant) dsync.Stats {
	t.Helper()
	st := s.Stats()
	got := statsWant{held: st.Held, waiting: st.Waiting, orphans: st.Orphans, acquisitions: st.Acquisitions, contended: st.Contended}
	if got != want {
		t.Fatalf("%s: Stats got %+v; want %+v (all: %+v)", step, got, want, st)
	}
	return st
}

// awaitWaiting waits until s has n calls waiting, within 10s.
func awaitWaiting(t *testing.T, s *dsync.Session, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := s.Stats().Waiting
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Stats().Waiting after 10s: got %d; want %d", got, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// timedCall is the outcome of a call run in the background, and how long
// it took from before the call to after it.
type timedCall struct {
	err  error
	took time.Duration
}

// goTimed runs f in a goroutine and returns a channel for its outcome.
func goTimed(f func() error) <-chan timedCall {
	c := make(chan timedCall, 1)
	go func() {
		start := time.Now()
		err := f()
		c <- timedCall{err, time.Since(start)}
	}()
	return c
}

// receive returns the outcome of a background call, failing the test when
// it has not come within 10s.
func receive(t *testing.T, what string, c <-chan timedCall) timedCall {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no return within 10s", what)
		return timedCall{}
	}
}

// TestStatsScripted runs a scripted sequence of calls of every kind on one
// session and checks the exact figures of Stats after each step.
func TestStatsScripted(t *testing.T) {
	bg := context.Background()
	logger, logs := newCaptureLogger()
	s := newSession(t, dsync.WithLogger(logger))
	o := newSession(t) // the other process
	name := lockName(t)
	m, om := dsync.NewMutex(s, name), dsync.NewMutex(o, name)
	orphans := 0 // see the Lock given up
	check := func(step string, want statsWant) dsync.Stats {
		t.Helper()
		want.orphans = orphans
		return checkStats(t, step, s, want)
	}

	check("new session", statsWant{})
	if st := s.Stats(); st.WaitTime != 0 || st.RenewalFailures != 0 {
		t.Fatalf("new session: WaitTime, RenewalFailures got %v, %d; want 0, 0", st.WaitTime, st.RenewalFailures)
	}

	// Uncontended Lock, TryLock success, TryLock failure.
	mustLock(t, m, bg)
	check("Lock", statsWant{held: 1, acquisitions: 1})
	mustUnlock(t, m, bg)
	check("Unlock", statsWant{acquisitions: 1})
	if ok, err := m.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock: got %v, %v; want true, nil", ok, err)
	}
	check("TryLock", statsWant{held: 1, acquisitions: 2})
	mustUnlock(t, m, bg)
	mustLock(t, om, bg)
	if ok, err := m.TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock while the other session holds: got %v, %v; want false, nil", ok, err)
	}
	check("TryLock failed", statsWant{acquisitions: 2})
	mustUnlock(t, om, bg)

	// Reentrant Locks of an owner count once each.
	owner := dsync.WithOwner(bg)
	mustLock(t, m, owner)
	mustLock(t, m, owner)
	check("reentrant Lock", statsWant{held: 1, acquisitions: 4})
	mustUnlock(t, m, owner)
	mustUnlock(t, m, owner)
	if st := check("no wait yet", statsWant{acquisitions: 4}); st.WaitTime != 0 {
		t.Fatalf("no wait yet: WaitTime got %v; want 0", st.WaitTime)
	}

	// A Lock that waits for another session.
	mustLock(t, om, bg)
	lock := goTimed(func() error { return m.Lock(bg) })
	awaitWaiting(t, s, 1)
	check("Lock waiting for another session", statsWant{waiting: 1, acquisitions: 4})
	mustUnlock(t, om, bg)
	r := receive(t, "contended Lock", lock)
	if r.err != nil {
		t.Fatalf("contended Lock: got %v; want nil", r.err)
	}
	st := check("contended Lock", statsWant{held: 1, acquisitions: 5, contended: 1})
	if st.WaitTime <= 0 || st.WaitTime > r.took {
		t.Fatalf("contended Lock: WaitTime got %v; want > 0 and at most the call's %v", st.WaitTime, r.took)
	}
	mustUnlock(t, m, bg)

	// A Lock that gives up when its ctx ends: WaitTime grows, nothing else.
	mustLock(t, om, bg)
	before := s.Stats().WaitTime
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	r = receive(t, "Lock with a 200ms ctx", goTimed(func() error { return m.Lock(ctx) }))
	cancel()
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("Lock with a 200ms ctx: got %v; want an error wrapping context.DeadlineExceeded", r.err)
	}
	// When ctx ended during an acquisition statement, the session undoes
	// it in the background: an orphan, kept for a minute since the row was
	// not taken (see TestStatsOrphans).
	if orphans = s.Stats().Orphans; orphans > 1 {
		t.Fatalf("Orphans after a Lock given up: got %d; want 0 or 1", orphans)
	}
	st = check("Lock given up", statsWant{acquisitions: 5, contended: 1})
	if grew := st.WaitTime - before; grew <= 0 || grew > r.took {
		t.Fatalf("Lock given up: WaitTime grew by %v; want > 0 and at most the call's %v", grew, r.took)
	}
	mustUnlock(t, om, bg)

	// A Lock that waits for another goroutine of the same session.
	mustLock(t, m, bg)
	m2 := dsync.NewMutex(s, name)
	lock = goTimed(func() error { return m2.Lock(bg) })
	awaitWaiting(t, s, 1)
	check("Lock waiting in the process", statsWant{held: 1, waiting: 1, acquisitions: 6, contended: 1})
	mustUnlock(t, m, bg)
	if r := receive(t, "Lock waiting in the process", lock); r.err != nil {
		t.Fatalf("Lock waiting in the process: got %v; want nil", r.err)
	}
	check("Lock after a local wait", statsWant{held: 1, acquisitions: 7, contended: 2})
	mustUnlock(t, m2, bg)

	// RWMutex: a read hold that a second reader joins is one held name.
	rw := dsync.NewRWMutex(s, name+"/rw")
	for i := range 2 {
		if err := rw.RLock(bg); err != nil {
			t.Fatalf("RLock %d: got %v; want nil", i+1, err)
		}
	}
	check("two RLocks", statsWant{held: 1, acquisitions: 9, contended: 2})
	for i := range 2 {
		if err := rw.RUnlock(bg); err != nil {
			t.Fatalf("RUnlock %d: got %v; want nil", i+1, err)
		}
	}
	if ok, err := rw.TryRLock(bg); !ok || err != nil {
		t.Fatalf("TryRLock: got %v, %v; want true, nil", ok, err)
	}
	check("TryRLock", statsWant{held: 1, acquisitions: 10, contended: 2})
	if err := rw.RUnlock(bg); err != nil {
		t.Fatal(err)
	}

	// A Mutex and a FairMutex are two held locks.
	f := dsync.NewFairMutex(s, name+"/fair")
	mustLock(t, m, bg)
	if err := f.Lock(bg); err != nil {
		t.Fatalf("FairMutex Lock: got %v; want nil", err)
	}
	check("Mutex and FairMutex", statsWant{held: 2, acquisitions: 12, contended: 2})
	mustUnlock(t, m, bg)
	if err := f.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.TryLock(bg); !ok || err != nil {
		t.Fatalf("FairMutex TryLock: got %v, %v; want true, nil", ok, err)
	}
	check("FairMutex TryLock", statsWant{held: 1, acquisitions: 13, contended: 2})
	if err := f.Unlock(bg); err != nil {
		t.Fatal(err)
	}

	// A FairMutex Lock and an RLock that wait for the other session.
	of, orw := dsync.NewFairMutex(o, name+"/fair"), dsync.NewRWMutex(o, name+"/rw")
	for _, c := range []struct {
		what         string
		hold, unhold func(context.Context) error
		wait         func(context.Context) error
		release      func(context.Context) error
	}{
		{"FairMutex Lock", of.Lock, of.Unlock, f.Lock, f.Unlock},
		{"RLock", orw.Lock, orw.Unlock, rw.RLock, rw.RUnlock},
	} {
		acq := s.Stats().Acquisitions
		cont := s.Stats().Contended
		if err := c.hold(bg); err != nil {
			t.Fatalf("the other session's lock for %s: %v", c.what, err)
		}
		call := goTimed(func() error { return c.wait(bg) })
		awaitWaiting(t, s, 1)
		check(c.what+" waiting", statsWant{waiting: 1, acquisitions: acq, contended: cont})
		if err := c.unhold(bg); err != nil {
			t.Fatal(err)
		}
		if r := receive(t, c.what, call); r.err != nil {
			t.Fatalf("%s: got %v; want nil", c.what, r.err)
		}
		check(c.what+" after waiting", statsWant{held: 1, acquisitions: acq + 1, contended: cont + 1})
		if err := c.release(bg); err != nil {
			t.Fatal(err)
		}
	}
	check("end", statsWant{acquisitions: 15, contended: 4})
	// No wait here came near the TTL (15s).
	if got := logs.find(msgLongWait); len(got) != 0 {
		t.Fatalf("long-wait records with waits far below the TTL: got %v; want none", got)
	}
	s.Close()
	orphans = 0 // the end of the lease frees them
	check("closed", statsWant{acquisitions: 15, contended: 4})
}

// TestStatsHeldEndsWithSession: a closed session holds nothing, whatever its
// holds were.
func TestStatsHeldEndsWithSession(t *testing.T) {
	bg := context.Background()
	s := newSession(t)
	name := lockName(t)
	mustLock(t, dsync.NewMutex(s, name), bg)
	if err := dsync.NewFairMutex(s, name+"/fair").Lock(bg); err != nil {
		t.Fatal(err)
	}
	if err := dsync.NewRWMutex(s, name+"/rw").RLock(bg); err != nil {
		t.Fatal(err)
	}
	checkStats(t, "three holds", s, statsWant{held: 3, acquisitions: 3})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkStats(t, "closed with three holds", s, statsWant{acquisitions: 3})
}

// TestStatsRenewals: a session of TTL 1s renews every 333ms, and Stats
// counts the renewals.
func TestStatsRenewals(t *testing.T) {
	slowTest(t)
	s := newSession(t, dsync.WithTTL(time.Second))
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Renewals < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("Renewals of a TTL 1s session after 10s: got %d; want at least 3", s.Stats().Renewals)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := s.Stats(); st.RenewalFailures != 0 {
		t.Fatalf("RenewalFailures: got %d; want 0 (%+v)", st.RenewalFailures, st)
	}
}

// TestStatsRenewalFailures cuts the network under a session: its renewal
// fails, it is lost, and Stats and the log say so.
func TestStatsRenewalFailures(t *testing.T) {
	slowTest(t)
	const ttl = 3 * time.Second
	p, dsn := dbtest.FaultProxy(t)
	logger, logs := newCaptureLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, dsn), dsync.WithTTL(ttl), dsync.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	mustLock(t, dsync.NewMutex(s, lockName(t)), ctx)
	before := s.Stats()
	if before.RenewalFailures != 0 {
		t.Fatalf("RenewalFailures before the cut: got %d; want 0", before.RenewalFailures)
	}

	p.Cut(true)
	select {
	case <-s.Done():
	case <-time.After(ttl + 10*time.Second):
		t.Fatalf("session still live %v after the cut", ttl+10*time.Second)
	}
	if err := s.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Err after the cut: got %v; want ErrSessionExpired", err)
	}
	st := s.Stats()
	if st.RenewalFailures < 1 {
		t.Fatalf("RenewalFailures after the cut: got %d; want at least 1", st.RenewalFailures)
	}
	if st.Held != 0 {
		t.Fatalf("Held of the lost session: got %d; want 0", st.Held)
	}

	failed := logs.find(msgRenewalFailed)
	if int64(len(failed)) != st.RenewalFailures {
		t.Fatalf("renewal-failed records: got %d (%v); want %d, one per failure", len(failed), failed, st.RenewalFailures)
	}
	for i, r := range failed {
		checkRecord(t, r, slog.LevelWarn, s.ID(), renewalFailedKeys)
		if got := r.attrs["attempt"].Int64(); got != int64(i+1) {
			t.Errorf("renewal-failed record %d: attempt got %d; want %d", i+1, got, i+1)
		}
	}
	lost := logs.find(msgSessionLost)
	if len(lost) != 1 {
		t.Fatalf("session-lost records: got %v; want one", lost)
	}
	checkRecord(t, lost[0], slog.LevelError, s.ID(), sessionLostKeys)
}

// TestStatsOrphans: an Unlock whose ctx has ended leaves the row to the
// reaper, an orphan until the reaper frees it; a transaction holding the
// row's lock keeps it from doing so until it ends.
func TestStatsOrphans(t *testing.T) {
	bg := context.Background()
	logger, logs := newCaptureLogger()
	s := newSession(t, dsync.WithTTL(6*time.Second), dsync.WithLogger(logger))
	name := lockName(t)
	m := dsync.NewMutex(s, name)
	mustLock(t, m, bg)

	db := dbtest.Open(t)
	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var holder int64
	if err := tx.QueryRow("SELECT holder FROM dsync_lock WHERE name = ? FOR UPDATE", name).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != s.ID() {
		t.Fatalf("holder of the row: got %d; want %d", holder, s.ID())
	}

	ended, cancel := context.WithCancel(bg)
	cancel()
	if err := m.Unlock(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock with an ended ctx: got %v; want an error wrapping context.Canceled", err)
	}
	checkStats(t, "orphan while its row is locked", s, statsWant{orphans: 1, acquisitions: 1})
	time.Sleep(100 * time.Millisecond) // the reaper is at work, and blocked
	checkStats(t, "orphan 100ms later", s, statsWant{orphans: 1, acquisitions: 1})
	if got := logs.find(msgOrphanFreed); len(got) != 0 {
		t.Fatalf("orphan-freed records while the row is locked: got %v; want none", got)
	}

	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Orphans != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Orphans 10s after the row was unlocked: got %d; want 0", s.Stats().Orphans)
		}
		time.Sleep(5 * time.Millisecond)
	}
	freed := logs.find(msgOrphanFreed)
	if len(freed) != 1 {
		t.Fatalf("orphan-freed records: got %v; want one", freed)
	}
	checkRecord(t, freed[0], slog.LevelInfo, s.ID(), orphanFreedKeys)
	if got, want := freed[0].attrs["lock"].String(), name; got != want {
		t.Errorf("orphan-freed record: lock got %q; want %q", got, want)
	}
	if got := freed[0].attrs["kind"].String(); got != "mutex" {
		t.Errorf("orphan-freed record: kind got %q; want \"mutex\"", got)
	}
	if ok, err := dsync.NewMutex(newSession(t), name).TryLock(bg); !ok || err != nil {
		t.Fatalf("another session's TryLock after the orphan was freed: got %v, %v; want true, nil", ok, err)
	}
}

// TestStatsLongWaitLogged: with a TTL of 1s, a Lock that waited more than
// 1.2s for the lock, and an RLock that gave up after 1.2s, are logged.
func TestStatsLongWaitLogged(t *testing.T) {
	slowTest(t)
	const ttl = time.Second
	bg := context.Background()
	logger, logs := newCaptureLogger()
	s := newSession(t, dsync.WithTTL(ttl), dsync.WithLogger(logger))
	o := newSession(t)
	name := lockName(t)

	om := dsync.NewMutex(o, name)
	mustLock(t, om, bg)
	start := time.Now()
	lock := goTimed(func() error { return dsync.NewMutex(s, name).Lock(bg) })
	awaitWaiting(t, s, 1)
	time.Sleep(time.Until(start.Add(ttl + 200*time.Millisecond)))
	mustUnlock(t, om, bg)
	if r := receive(t, "Lock", lock); r.err != nil {
		t.Fatalf("Lock: got %v; want nil", r.err)
	}

	orw := dsync.NewRWMutex(o, name+"/rw")
	if err := orw.Lock(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, ttl+200*time.Millisecond)
	defer cancel()
	rlock := receive(t, "RLock", goTimed(func() error { return dsync.NewRWMutex(s, name+"/rw").RLock(ctx) }))
	if !errors.Is(rlock.err, context.DeadlineExceeded) {
		t.Fatalf("RLock: got %v; want an error wrapping context.DeadlineExceeded", rlock.err)
	}
	if err := orw.Unlock(bg); err != nil {
		t.Fatal(err)
	}

	got := logs.find(msgLongWait)
	if len(got) != 2 {
		t.Fatalf("long-wait records: got %v; want two", got)
	}
	checkRecord(t, got[0], slog.LevelWarn, s.ID(), longWaitKeys)
	withErr := maps.Clone(longWaitKeys)
	withErr["err"] = slog.KindAny
	checkRecord(t, got[1], slog.LevelWarn, s.ID(), withErr)
	for i, want := range []struct {
		lock, kind, op string
		acquired       bool
	}{{name, "mutex", "lock", true}, {name + "/rw", "queue", "rlock", false}} {
		r := got[i]
		if r.attrs["lock"].String() != want.lock || r.attrs["kind"].String() != want.kind || r.attrs["op"].String() != want.op ||
			r.attrs["acquired"].Bool() != want.acquired {
			t.Errorf("long-wait record %d: got %v; want lock %q, kind %s, op %s, acquired %v", i+1, r, want.lock, want.kind, want.op, want.acquired)
		}
		if w := r.attrs["waited"].Duration(); w < ttl {
			t.Errorf("long-wait record %d: waited got %v; want at least the TTL (%v)", i+1, w, ttl)
		}
	}
	if err, _ := got[1].attrs["err"].Any().(error); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("long-wait record of the RLock: err got %v; want context.DeadlineExceeded", err)
	}
	for _, r := range logs.all() {
		if _, ok := r.attrs["name"]; ok {
			t.Errorf("record %v: key name; want lock", r)
		}
	}
}

// TestStatsConcurrent calls Stats while goroutines lock and unlock, and
// checks the totals (run with -race).
func TestStatsConcurrent(t *testing.T) {
	const workers, rounds = 4, 25
	bg := context.Background()
	s := newSession(t)
	name := lockName(t)
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := dsync.NewMutex(s, fmt.Sprintf("%s/%d", name, i%2))
			f := dsync.NewFairMutex(s, fmt.Sprintf("%s/%d/fair", name, i%2))
			for range rounds {
				for _, l := range []interface {
					Lock(context.Context) error
					Unlock(context.Context) error
				}{m, f} {
					if err := l.Lock(bg); err != nil {
						errc <- err
						return
					}
					if err := l.Unlock(bg); err != nil {
						errc <- err
						return
					}
				}
			}
		}()
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				st := s.Stats()
				if st.Contended > st.Acquisitions || st.Held > 4 || st.Waiting > workers || st.Waiting < 0 {
					t.Errorf("Stats under load: got %+v; want Contended <= Acquisitions, Held <= 4, 0 <= Waiting <= %d", st, workers)
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Acquisitions != workers*rounds*2 || st.Held != 0 || st.Waiting != 0 || st.Contended > st.Acquisitions {
		t.Fatalf("Stats after %d Lock/Unlock pairs: got %+v; want %d acquisitions, nothing held or waiting", workers*rounds*2, st, workers*rounds*2)
	}
	t.Logf("after %d Lock/Unlock pairs: %+v", workers*rounds*2, st)
}

package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// sentinels are the package's sentinel errors: every error a call returns
// for a name or option must wrap one of them (or ctx's error, which these
// tests never let happen).
var sentinels = []error{
	dsync.ErrNotHeld, dsync.ErrNotOwner, dsync.ErrSessionExpired, dsync.ErrSessionClosed,
	dsync.ErrInvalidName, dsync.ErrInvalidOption, dsync.ErrLockUpgrade, dsync.ErrLockDowngrade,
	dsync.ErrNotObtained, dsync.ErrOtherKind,
}

// isSentinel reports whether err wraps one of the package's sentinels.
func isSentinel(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// nameSeeds are the hand-picked odd names: empty, NUL bytes, invalid UTF-8,
// the length limits, SQL metacharacters, emoji, and names that differ only
// in case or a trailing space.
func nameSeeds() []string {
	return []string{
		"", "\x00", "a\x00b", "\xff\xfe", "a\xc3",
		strings.Repeat("n", 255), strings.Repeat("n", 256), strings.Repeat("n", 1000),
		strings.Repeat("é", 127) + "x", // 255 bytes of UTF-8
		strings.Repeat("é", 128),       // 256 bytes of UTF-8
		"'; DROP TABLE dsync_lock; --", `\`, "%", "_", "`", `"`, "' OR '1'='1",
		"🔒", "lock 🔐 ключ 锁",
		"Case", "case", "CASE", "Case ", " Case", "Case\t",
	}
}

// validLockName is the documented rule for names: 1 to 255 bytes of UTF-8.
func validLockName(name string) bool {
	return name != "" && len(name) <= 255 && utf8.ValidString(name)
}

// randomNames returns n random byte strings of 0 to 300 bytes: half are
// uniformly random bytes (almost never UTF-8 past a few bytes), half are
// random runes cut to the length (half of them backed up to a rune
// boundary), so that valid names, and names with a rune cut short at the
// end, are common too.
func randomNames(r *rand.Rand, n int) []string {
	names := make([]string, n)
	for i := range names {
		size := r.IntN(301)
		b := make([]byte, 0, size+4)
		for len(b) < size {
			if i%2 == 0 {
				b = append(b, byte(r.UintN(256)))
				continue
			}
			switch r.IntN(4) {
			case 0:
				b = append(b, byte(r.UintN(128))) // ASCII, control characters and NUL included
			case 1:
				b = utf8.AppendRune(b, rune(0x80+r.IntN(0x800-0x80)))
			case 2:
				b = utf8.AppendRune(b, rune(0x800+r.IntN(0xd800-0x800)))
			default:
				b = utf8.AppendRune(b, rune(0x10000+r.IntN(0x10ffff-0x10000)))
			}
		}
		b = b[:size]
		if i%4 == 3 {
			// Back up to a rune boundary: mostly valid, when short enough.
			for len(b) > 0 && !utf8.Valid(b) {
				b = b[:len(b)-1]
			}
		}
		names[i] = string(b)
	}
	return names
}

// privatePrefix returns a table prefix of the test's own, so that the odd
// names it locks ("%", "_", ...) meet no other test's rows.
func privatePrefix(tag string) string {
	return fmt.Sprintf("%s%x_", tag, time.Now().UnixNano()&0xffffffffff)
}

// bounded runs f on a goroutine of its own and returns what it returns. It
// fails the test when f panics, or when f has not returned within limit
// (f's ctx bounds it well below that).
func bounded[T any](t testing.TB, what string, limit time.Duration, f func() T) T {
	t.Helper()
	type result struct {
		v     T
		panic any
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			r.panic = recover()
			done <- r
		}()
		r.v = f()
	}()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.panic != nil {
			t.Fatalf("%s: got panic %v; want no panic", what, r.panic)
		}
		return r.v
	case <-timer.C:
		t.Fatalf("%s: got no return after %v; want a return within its ctx", what, limit)
		panic("unreachable")
	}
}

// tried is what a TryLock returns.
type tried struct {
	ok  bool
	err error
}

// nameCallLimit bounds one call (its ctx is callTimeout).
const (
	callTimeout   = 2 * time.Second
	nameCallLimit = 5 * time.Second
)

// checkName runs every method of the three primitives on name and checks
// the results: a valid name locks and unlocks exactly like any other, an
// invalid one makes every call return ErrInvalidName and touches nothing.
// The Mutex runs through s, the queued locks through qs, a session of
// other tables: a name is one lock, so through s they get ErrOtherKind.
func checkName(t *testing.T, s, qs *dsync.Session, name string) {
	t.Helper()
	valid := validLockName(name)
	call := func(what string, f func(ctx context.Context) error) error {
		t.Helper()
		return bounded(t, fmt.Sprintf("%s(%q)", what, name), nameCallLimit, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			return f(ctx)
		})
	}
	try := func(what string, f func(ctx context.Context) (bool, error)) tried {
		t.Helper()
		return bounded(t, fmt.Sprintf("%s(%q)", what, name), nameCallLimit, func() tried {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			ok, err := f(ctx)
			return tried{ok, err}
		})
	}
	want := func(what string, got, want error) {
		t.Helper()
		if got != nil && !isSentinel(got) {
			t.Fatalf("%s(%q): got %v; want nil or a dsync sentinel", what, name, got)
		}
		if !errors.Is(got, want) {
			t.Fatalf("%s(%q): got %v; want %v", what, name, got, want)
		}
	}
	wantTry := func(what string, got tried, wantOK bool, wantErr error) {
		t.Helper()
		want(what, got.err, wantErr)
		if got.ok != wantOK {
			t.Fatalf("%s(%q): got %v, %v; want %v, %v", what, name, got.ok, got.err, wantOK, wantErr)
		}
	}
	wantFence := func(what string, fence int64, held bool) {
		t.Helper()
		if held && fence <= 0 || !held && fence != 0 {
			t.Fatalf("%s(%q).Fence: got %d; want %s", what, name, fence, map[bool]string{true: "> 0", false: "0"}[held])
		}
	}

	if !valid {
		m, f, rw := dsync.NewMutex(s, name), dsync.NewFairMutex(s, name), dsync.NewRWMutex(s, name)
		if m.Name() != name || f.Name() != name || rw.Name() != name {
			t.Fatalf("Name: got %q, %q, %q; want %q", m.Name(), f.Name(), rw.Name(), name)
		}
		bad := dsync.ErrInvalidName
		want("Mutex.Lock", call("Mutex.Lock", m.Lock), bad)
		wantTry("Mutex.TryLock", try("Mutex.TryLock", m.TryLock), false, bad)
		want("Mutex.Unlock", call("Mutex.Unlock", m.Unlock), bad)
		wantFence("Mutex", m.Fence(), false)
		want("FairMutex.Lock", call("FairMutex.Lock", f.Lock), bad)
		wantTry("FairMutex.TryLock", try("FairMutex.TryLock", f.TryLock), false, bad)
		want("FairMutex.Unlock", call("FairMutex.Unlock", f.Unlock), bad)
		wantFence("FairMutex", f.Fence(), false)
		want("RWMutex.Lock", call("RWMutex.Lock", rw.Lock), bad)
		wantTry("RWMutex.TryLock", try("RWMutex.TryLock", rw.TryLock), false, bad)
		want("RWMutex.Unlock", call("RWMutex.Unlock", rw.Unlock), bad)
		want("RWMutex.RLock", call("RWMutex.RLock", rw.RLock), bad)
		wantTry("RWMutex.TryRLock", try("RWMutex.TryRLock", rw.TryRLock), false, bad)
		want("RWMutex.RUnlock", call("RWMutex.RUnlock", rw.RUnlock), bad)
		wantFence("RWMutex", rw.Fence(), false)
		return
	}

	m := dsync.NewMutex(s, name)
	if m.Name() != name {
		t.Fatalf("Mutex.Name: got %q; want %q", m.Name(), name)
	}
	want("Mutex.Lock", call("Mutex.Lock", m.Lock), nil)
	fence := m.Fence()
	wantFence("Mutex", fence, true)
	wantTry("Mutex.TryLock while held", try("Mutex.TryLock", m.TryLock), false, nil)
	want("Mutex.Unlock", call("Mutex.Unlock", m.Unlock), nil)
	wantFence("Mutex after Unlock", m.Fence(), false)
	wantTry("Mutex.TryLock", try("Mutex.TryLock", m.TryLock), true, nil)
	if got := m.Fence(); got <= fence {
		t.Fatalf("Mutex(%q).Fence after TryLock: got %d; want > %d", name, got, fence)
	}
	want("Mutex.Unlock", call("Mutex.Unlock", m.Unlock), nil)
	want("Mutex.Unlock twice", call("Mutex.Unlock", m.Unlock), dsync.ErrNotHeld)
	want("FairMutex.Lock of the Mutex's name", call("FairMutex.Lock", dsync.NewFairMutex(s, name).Lock), dsync.ErrOtherKind)
	want("RWMutex.RLock of the Mutex's name", call("RWMutex.RLock", dsync.NewRWMutex(s, name).RLock), dsync.ErrOtherKind)

	s = qs
	f := dsync.NewFairMutex(s, name)
	if f.Name() != name {
		t.Fatalf("FairMutex.Name: got %q; want %q", f.Name(), name)
	}
	want("FairMutex.Lock", call("FairMutex.Lock", f.Lock), nil)
	fence = f.Fence()
	wantFence("FairMutex", fence, true)
	wantTry("FairMutex.TryLock while held", try("FairMutex.TryLock", f.TryLock), false, nil)
	want("FairMutex.Unlock", call("FairMutex.Unlock", f.Unlock), nil)
	wantFence("FairMutex after Unlock", f.Fence(), false)
	wantTry("FairMutex.TryLock", try("FairMutex.TryLock", f.TryLock), true, nil)
	want("FairMutex.Unlock", call("FairMutex.Unlock", f.Unlock), nil)
	want("FairMutex.Unlock twice", call("FairMutex.Unlock", f.Unlock), dsync.ErrNotHeld)

	// The RWMutex of the name is the FairMutex's lock space: its write side
	// is the lock just released.
	rw := dsync.NewRWMutex(s, name)
	if rw.Name() != name {
		t.Fatalf("RWMutex.Name: got %q; want %q", rw.Name(), name)
	}
	want("RWMutex.RLock", call("RWMutex.RLock", rw.RLock), nil)
	wantTry("RWMutex.TryRLock while read-held", try("RWMutex.TryRLock", rw.TryRLock), true, nil)
	wantTry("RWMutex.TryLock while read-held", try("RWMutex.TryLock", rw.TryLock), false, nil)
	wantFence("RWMutex read-held", rw.Fence(), false)
	want("RWMutex.RUnlock", call("RWMutex.RUnlock", rw.RUnlock), nil)
	want("RWMutex.RUnlock", call("RWMutex.RUnlock", rw.RUnlock), nil)
	want("RWMutex.RUnlock twice", call("RWMutex.RUnlock", rw.RUnlock), dsync.ErrNotHeld)
	want("RWMutex.Lock", call("RWMutex.Lock", rw.Lock), nil)
	wantFence("RWMutex", rw.Fence(), true)
	if got := rw.Fence(); got <= fence {
		t.Fatalf("RWMutex(%q).Fence: got %d; want > %d, the FairMutex's of the same name", name, got, fence)
	}
	wantTry("RWMutex.TryLock while held", try("RWMutex.TryLock", rw.TryLock), false, nil)
	wantTry("RWMutex.TryRLock while write-held", try("RWMutex.TryRLock", rw.TryRLock), false, nil)
	want("RWMutex.Unlock", call("RWMutex.Unlock", rw.Unlock), nil)
	want("RWMutex.Unlock twice", call("RWMutex.Unlock", rw.Unlock), dsync.ErrNotHeld)
}

// TestRandomNamesAndOptions feeds odd and random lock names to every method
// of Mutex, FairMutex and RWMutex, and bad values to every option of
// NewSession. Every call returns nil or a dsync sentinel (ErrInvalidName for
// a bad name, ErrInvalidOption for a bad option), promptly and without a
// panic; valid names, however odd, lock and unlock as exact byte strings;
// locks another session held before are still held after, and the four
// tables are intact.
func TestRandomNamesAndOptions(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	prefix := privatePrefix("names")
	qprefix := privatePrefix("qnames")
	db := dbtest.Open(t)
	s := newSession(t, dsync.WithTablePrefix(prefix))
	qs := newSession(t, dsync.WithTablePrefix(qprefix))
	other := newSession(t, dsync.WithTablePrefix(prefix))

	// Locks another session holds through all of it, one of each kind.
	const sentinelName = "sentinel: held by another session"
	sm := dsync.NewMutex(other, sentinelName)
	sf := dsync.NewFairMutex(other, sentinelName+" (fair)")
	sr := dsync.NewRWMutex(other, sentinelName+" (read)")
	mustLock(t, sm, bg)
	if err := sf.Lock(bg); err != nil {
		t.Fatalf("FairMutex.Lock: got %v; want nil", err)
	}
	if err := sr.RLock(bg); err != nil {
		t.Fatalf("RWMutex.RLock: got %v; want nil", err)
	}
	mFence, fFence := sm.Fence(), sf.Fence()

	const seed = 6
	names := append(nameSeeds(), "'; DROP TABLE `"+prefix+"lock`; --", "'; DROP TABLE "+prefix+"lease; --")
	names = append(names, randomNames(rand.New(rand.NewPCG(seed, seed)), 200)...)
	start := time.Now()
	valid := make(map[string]bool)
	for _, name := range names {
		if validLockName(name) {
			valid[name] = true
		}
		checkName(t, s, qs, name)
	}
	t.Logf("%d names (%d distinct valid ones; random ones from seed %d) through 3 primitives in %v",
		len(names), len(valid), seed, time.Since(start).Round(time.Millisecond))

	// Each valid name made one row in each table it uses, an invalid one none;
	// a queued lock's name has a row in the lock table too (its kind).
	for _, c := range []struct {
		table string
		want  int
	}{{prefix + "lock", len(valid) + 3}, {prefix + "queue", 2}, {qprefix + "lock", len(valid)}, {qprefix + "queue", len(valid)}} {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM `" + c.table + "`").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != c.want {
			t.Fatalf("rows in %s: got %d; want %d (the distinct valid names and the sentinels)", c.table, n, c.want)
		}
	}

	// Valid names are stored as the exact bytes: NUL, case and a trailing
	// space each make another lock, as another session sees.
	for _, name := range []string{"\x00", "a\x00b", "Case", "Case ", "'; DROP TABLE dsync_lock; --"} {
		var stored []byte
		if err := db.QueryRow("SELECT name FROM `"+prefix+"lock` WHERE name = ?", name).Scan(&stored); err != nil {
			t.Fatalf("row of %q: got %v; want the row", name, err)
		}
		if string(stored) != name {
			t.Fatalf("stored name: got %q; want %q", stored, name)
		}
	}
	held := dsync.NewMutex(other, "Case")
	mustLock(t, held, bg)
	for _, name := range []string{"case", "CASE", "Case ", " Case", "Case\t"} {
		m := dsync.NewMutex(s, name)
		if ok, err := m.TryLock(bg); !ok || err != nil {
			t.Fatalf("TryLock(%q) while another session holds %q: got %v, %v; want true, nil", name, "Case", ok, err)
		}
		mustUnlock(t, m, bg)
	}
	mustUnlock(t, held, bg)

	// The other session's locks are untouched, and the tables intact.
	if ok, err := dsync.NewMutex(s, sentinelName).TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock of the Mutex another session holds: got %v, %v; want false, nil", ok, err)
	}
	if ok, err := dsync.NewFairMutex(s, sf.Name()).TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock of the FairMutex another session holds: got %v, %v; want false, nil", ok, err)
	}
	if ok, err := dsync.NewRWMutex(s, sr.Name()).TryLock(bg); ok || err != nil {
		t.Fatalf("TryLock of the RWMutex another session reads: got %v, %v; want false, nil", ok, err)
	}
	if got := sm.Fence(); got != mFence {
		t.Fatalf("sentinel Mutex fence: got %d; want %d", got, mFence)
	}
	if got := sf.Fence(); got != fFence {
		t.Fatalf("sentinel FairMutex fence: got %d; want %d", got, fFence)
	}
	var holder int64
	if err := db.QueryRow("SELECT holder FROM `"+prefix+"lock` WHERE name = ?", sentinelName).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if holder != other.ID() {
		t.Fatalf("sentinel row holder: got %d; want %d", holder, other.ID())
	}
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket", "txlock"} {
		var n int64
		if err := db.QueryRow("SELECT COUNT(*) FROM `" + prefix + table + "`").Scan(&n); err != nil {
			t.Fatalf("table %s%s: got %v; want it intact", prefix, table, err)
		}
		t.Logf("%s%s: %d rows", prefix, table, n)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("session Err: got %v; want nil", err)
	}
	if err := other.Err(); err != nil {
		t.Fatalf("other session Err: got %v; want nil", err)
	}

	t.Run("options", func(t *testing.T) {
		testBadOptions(t, db)
	})
}

// testBadOptions gives NewSession bad option values: each returns an
// error wrapping ErrInvalidOption at once and leaves nothing running
// (goleak, at the end of the run, checks the latter).
func testBadOptions(t *testing.T, db *sql.DB) {
	oneConn := dbtest.Open(t)
	oneConn.SetMaxOpenConns(1)
	tests := []struct {
		name string
		db   *sql.DB
		opts []dsync.Option
	}{
		{"TTL 0", db, []dsync.Option{dsync.WithTTL(0)}},
		{"TTL -1", db, []dsync.Option{dsync.WithTTL(-1)}},
		{"TTL 999ms", db, []dsync.Option{dsync.WithTTL(999 * time.Millisecond)}},
		{"TTL MaxInt64", db, []dsync.Option{dsync.WithTTL(math.MaxInt64)}},
		{"TTL MinInt64", db, []dsync.Option{dsync.WithTTL(math.MinInt64)}},
		{"prefix with a dash", db, []dsync.Option{dsync.WithTablePrefix("bad-prefix")}},
		{"prefix of 33 bytes", db, []dsync.Option{dsync.WithTablePrefix(strings.Repeat("p", 33))}},
		{"prefix with a backquote", db, []dsync.Option{dsync.WithTablePrefix("`x")}},
		{"prefix with NUL", db, []dsync.Option{dsync.WithTablePrefix("x\x00")}},
		{"prefix not UTF-8", db, []dsync.Option{dsync.WithTablePrefix("\xff")}},
		{"nil back-off", db, []dsync.Option{dsync.WithBackOff(nil)}},
		{"nil logger", db, []dsync.Option{dsync.WithLogger(nil)}},
		{"label not UTF-8", db, []dsync.Option{dsync.WithLabel("a\xc3")}},
		{"label of 256 bytes", db, []dsync.Option{dsync.WithLabel(strings.Repeat("l", 256))}},
		{"free-row age -1ns", db, []dsync.Option{dsync.WithFreeRowAge(-1)}},
		{"free-row age 999ms", db, []dsync.Option{dsync.WithFreeRowAge(999 * time.Millisecond)}},
		{"free-row age MinInt64", db, []dsync.Option{dsync.WithFreeRowAge(math.MinInt64)}},
		{"nil Option", db, []dsync.Option{nil}},
		{"nil Option after good ones", db, []dsync.Option{dsync.WithTTL(time.Second), nil}},
		{"good then bad", db, []dsync.Option{dsync.WithLogger(slog.Default()), dsync.WithTTL(0)}},
		{"nil *sql.DB", nil, nil},
		{"*sql.DB with SetMaxOpenConns(1)", oneConn, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			got := bounded(t, "NewSession", 10*time.Second, func() tried {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				s, err := dsync.NewSession(ctx, tt.db, tt.opts...)
				if s != nil {
					s.Close()
				}
				return tried{s != nil, err}
			})
			took := time.Since(start)
			if got.ok || !errors.Is(got.err, dsync.ErrInvalidOption) {
				t.Fatalf("NewSession: got a session %v, %v; want none, an error wrapping %v", got.ok, got.err, dsync.ErrInvalidOption)
			}
			if took > 5*time.Second {
				t.Fatalf("NewSession took %v; want < 5s", took)
			}
		})
	}
	// The boundary values next to the bad ones are accepted.
	for _, opt := range []dsync.Option{dsync.WithTTL(time.Second), dsync.WithTablePrefix(strings.Repeat("p", 32)),
		dsync.WithLabel(strings.Repeat("é", 127) + "x"), dsync.WithBackOff(func() backoff.BackOff { return &backoff.ZeroBackOff{} }),
		dsync.WithFreeRowAge(0), dsync.WithFreeRowAge(time.Second), dsync.WithFreeRowAge(math.MaxInt64)} {
		s, err := dsync.NewSession(context.Background(), db, opt)
		if err != nil {
			t.Fatalf("NewSession with a boundary value: got %v; want nil", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close: got %v; want nil", err)
		}
	}
}

// FuzzLockName checks, for any name, that Mutex.TryLock and Unlock either
// work (a valid name) or return ErrInvalidName, promptly and without a
// panic. The seeds, run by every go test, are the names of
// TestRandomNamesAndOptions.
func FuzzLockName(f *testing.F) {
	for _, name := range nameSeeds() {
		f.Add(name)
	}
	s := newSession(f, dsync.WithTablePrefix(privatePrefix("fuzz")))
	f.Fuzz(func(t *testing.T, name string) {
		m := dsync.NewMutex(s, name)
		got := bounded(t, fmt.Sprintf("TryLock(%q)", name), nameCallLimit, func() tried {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			ok, err := m.TryLock(ctx)
			return tried{ok, err}
		})
		unlock := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			return m.Unlock(ctx)
		}
		if !validLockName(name) {
			if got.ok || !errors.Is(got.err, dsync.ErrInvalidName) {
				t.Fatalf("TryLock(%q): got %v, %v; want false, %v", name, got.ok, got.err, dsync.ErrInvalidName)
			}
			if err := bounded(t, fmt.Sprintf("Unlock(%q)", name), nameCallLimit, unlock); !errors.Is(err, dsync.ErrInvalidName) {
				t.Fatalf("Unlock(%q): got %v; want %v", name, err, dsync.ErrInvalidName)
			}
			return
		}
		if !got.ok || got.err != nil {
			t.Fatalf("TryLock(%q): got %v, %v; want true, nil", name, got.ok, got.err)
		}
		if fence := m.Fence(); fence <= 0 {
			t.Fatalf("Fence(%q): got %d; want > 0", name, fence)
		}
		if err := bounded(t, fmt.Sprintf("Unlock(%q)", name), nameCallLimit, unlock); err != nil {
			t.Fatalf("Unlock(%q): got %v; want nil", name, err)
		}
	})
}

// TestManySessionsSmallPool has 50 sessions share one *sql.DB limited to 8
// connections and contend for one Mutex for about 3×TTL (issue 6, item 6:
// 43 of 51 such sessions used to be lost, their renewals starved of
// connections). No session is lost, each gets the lock, never two at
// once, and the caller's own queries on the pool still get through.
func TestManySessionsSmallPool(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	const (
		sessions = 50
		ttl      = 2 * time.Second
		hold     = 5 * time.Millisecond
		runFor   = 3 * ttl
	)
	db := dbtest.Open(t)
	db.SetMaxOpenConns(8)
	name := lockName(t)
	ss := make([]*dsync.Session, sessions)
	for i := range ss {
		s, err := dsync.NewSession(context.Background(), db, dsync.WithTTL(ttl))
		if err != nil {
			t.Fatalf("NewSession %d on a pool of 8: got %v; want nil", i, err)
		}
		t.Cleanup(func() { s.Close() })
		ss[i] = s
	}

	// The configuration under test: 50 sessions on a pool that allows 8
	// connections in all.
	if got := db.Stats().MaxOpenConnections; got != 8 {
		t.Fatalf("pool limit: got %d; want 8", got)
	}

	var holders, maxHolders atomic.Int32
	acquired := make([]atomic.Int64, sessions)
	errs := make(chan error, sessions)
	start := time.Now()
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := dsync.NewMutex(s, name)
			// At least one round each, then rounds until runFor is over.
			for round := 0; round == 0 || time.Since(start) < runFor; round++ {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := m.Lock(ctx)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("session %d, round %d: Lock: %w", i, round, err)
					return
				}
				n := holders.Add(1)
				for old := maxHolders.Load(); n > old && !maxHolders.CompareAndSwap(old, n); old = maxHolders.Load() {
				}
				acquired[i].Add(1)
				time.Sleep(hold)
				holders.Add(-1)
				if err := m.Unlock(context.Background()); err != nil {
					errs <- fmt.Errorf("session %d, round %d: Unlock: %w", i, round, err)
					return
				}
			}
		}()
	}

	// The caller's own queries on the same pool get through meanwhile.
	var probes int
	var slowest time.Duration
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	// Every Lock is bounded by its 20s ctx: past that, the run hangs.
	hung := time.NewTimer(runFor + 25*time.Second)
	defer hung.Stop()
	for running := true; running; {
		select {
		case <-finished:
			running = false
		case <-hung.C:
			t.Errorf("sessions still locking %v after the start; want all done within %v (each Lock's ctx is 20s)",
				time.Since(start).Round(time.Millisecond), runFor+20*time.Second)
			running = false
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			began := time.Now()
			var one int
			err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
			took := time.Since(began)
			cancel()
			if err != nil {
				t.Errorf("caller's SELECT 1 at +%v: got %v; want 1 within 2s", began.Sub(start).Round(time.Millisecond), err)
			}
			probes++
			slowest = max(slowest, took)
		}
	}
	elapsed := time.Since(start)
	for done := false; !done; {
		select {
		case err := <-errs:
			t.Error(err)
		default:
			done = true
		}
	}

	lost, never := 0, 0
	var total int64
	for i, s := range ss {
		select {
		case <-s.Done():
			lost++
			t.Errorf("session %d: Done closed, Err %v; want it live", i, s.Err())
			continue
		default:
		}
		if err := s.Err(); err != nil {
			lost++
			t.Errorf("session %d: got Err %v; want nil", i, err)
		}
		n := acquired[i].Load()
		total += n
		if n == 0 {
			never++
			t.Errorf("session %d: got 0 acquisitions; want at least 1", i)
		}
	}
	if got := maxHolders.Load(); got > 1 {
		t.Errorf("holders at once: got %d; want at most 1", got)
	}
	st := db.Stats()
	t.Logf("%d sessions on a pool of %d: %d acquisitions in %v (%.0f/s), %d lost, %d never acquired; most holders at once %d; caller's SELECT 1: %d probes, slowest %v; pool: %d open, %d waits (%v waited)",
		sessions, st.MaxOpenConnections, total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(),
		lost, never, maxHolders.Load(), probes, slowest.Round(time.Microsecond), st.OpenConnections, st.WaitCount, st.WaitDuration.Round(time.Millisecond))
}

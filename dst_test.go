package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// dstLocker is one lock of each kind TestLeasesAcrossDaylightSavingChange
// takes: a Mutex, a FairMutex or the write side of an RWMutex.
type dstLocker interface {
	Name() string
	Fence() int64
	Lock(context.Context) error
	TryLock(context.Context) (bool, error)
	Unlock(context.Context) error
}

// dstLocks returns one lock of each kind, named after tag.
func dstLocks(s *dsync.Session, tag string) []dstLocker {
	return []dstLocker{
		dsync.NewMutex(s, tag+"/Mutex"),
		dsync.NewFairMutex(s, tag+"/FairMutex"),
		dsync.NewRWMutex(s, tag+"/RWMutex"),
	}
}

// dstClock reads the server's clock on a connection of db: the UTC time,
// and NOW() minus UTC_TIMESTAMP() (both read at the statement's start, so
// the difference is exactly the connection's zone offset).
func dstClock(ctx context.Context, db *sql.DB) (utc time.Time, offset time.Duration, err error) {
	var micros, seconds int64
	err = db.QueryRowContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
		TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(6), NOW(6))`).Scan(&micros, &seconds)
	return time.UnixMicro(micros), time.Duration(seconds) * time.Second, err
}

// dstDSN returns dsn with its address replaced by addr (unless empty) and
// time_zone set to zone (unless empty) on every connection.
func dstDSN(t *testing.T, dsn, addr, zone string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if addr != "" {
		cfg.Addr = addr
	}
	if zone != "" {
		if cfg.Params == nil {
			cfg.Params = make(map[string]string)
		}
		cfg.Params["time_zone"] = "'" + zone + "'"
	}
	return cfg.FormatDSN()
}

// TestLeasesAcrossDaylightSavingChange runs a server whose system time zone
// is Europe/Berlin (time_zone left at SYSTEM) under a fake clock that
// crosses a daylight saving change, and checks that leases follow the UTC
// clock (issue 6, item 1):
//
//   - session A holds a Mutex, a FairMutex and an RWMutex across the
//     change: until 2×TTL after it, B cannot take them and A stays live
//     (with NOW()-based expiry every lease ended at once at the spring
//     change, and B took them);
//   - session C, the same but cut off from the server (a proxy drops every
//     byte) a second before the change, is lost and its locks go to B
//     within TTL+2s of the cut, after C's Done closed (with NOW()-based
//     expiry a dead holder's locks stayed held an extra hour at the autumn
//     change).
//
// A third run gives A and C the DSN time_zone '+05:30' and B 'SYSTEM'.
func TestLeasesAcrossDaylightSavingChange(t *testing.T) {
	const ttl = 3 * time.Second
	spring := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)  // 02:00 CET becomes 03:00 CEST
	autumn := time.Date(2026, 10, 25, 1, 0, 0, 0, time.UTC) // 03:00 CEST becomes 02:00 CET
	tests := []struct {
		name   string
		change time.Time     // the change, on the UTC clock
		jump   time.Duration // of NOW() against UTC_TIMESTAMP() at the change, on a SYSTEM connection
		zoneA  string        // time_zone in the DSN of A and C; "" leaves the server's (SYSTEM)
		zoneB  string        // the same for B
	}{
		{"spring", spring, time.Hour, "", ""},
		{"autumn", autumn, -time.Hour, "", ""},
		{"spring, A at +05:30, B at SYSTEM", spring, time.Hour, "+05:30", "SYSTEM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each has a server of its own, and mostly waits for its clock
			testLeasesAcrossChange(t, ttl, tt.change, tt.jump, tt.zoneA, tt.zoneB)
		})
	}
}

// dstStart serialises the server starts of the parallel runs: servers
// bootstrapping at once share /tmp as their tmpdir, and a starting mariadbd
// deletes the other's temporary tables there ("Unknown table
// 'mysql.tmp_user_sys'").
var dstStart sync.Mutex

func testLeasesAcrossChange(t *testing.T, ttl time.Duration, change time.Time, jump time.Duration, zoneA, zoneB string) {
	bg := context.Background()
	ctx, cancel := context.WithTimeout(bg, 90*time.Second)
	defer cancel()

	// The fake clock starts 8s before the change when mariadbd starts. It
	// is given in seconds since the epoch (FAKETIME_FMT=%s): the local time
	// "2026-10-25 02:59:52" is ambiguous (it comes twice), and libfaketime
	// takes the second, CET, one, which is after the change.
	dstStart.Lock()
	srv, err := mariadb.StartWith(ctx, mariadb.Config{
		Env:      []string{"TZ=Europe/Berlin", "FAKETIME_FMT=%s"},
		FakeTime: "@" + strconv.FormatInt(change.Add(-8*time.Second).Unix(), 10),
	})
	dstStart.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	admin := dbtest.OpenDSN(t, srv.DSN(""))
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE dst"); err != nil {
		t.Fatal(err)
	}
	dsn := srv.DSN("dst")
	probe := dbtest.OpenDSN(t, dsn) // the server's own zone (SYSTEM)
	utc, offsetBefore, err := dstClock(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	untilChange := change.Sub(utc)
	if untilChange < 3*time.Second || untilChange > 9*time.Second {
		t.Fatalf("server clock %v: got %v before the change; want 3s to 9s", utc, untilChange)
	}
	// The server's clock minus this process's, to place events measured
	// here on the server's UTC clock.
	began := time.Now()
	utc, _, err = dstClock(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	rtt := time.Since(began)
	skew := utc.Sub(began.Add(rtt / 2))

	p, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", srv.Port()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() }) // after the sessions have closed
	dbA := dbtest.OpenDSN(t, dstDSN(t, dsn, "", zoneA))
	dbC := dbtest.OpenDSN(t, dstDSN(t, dsn, p.Addr(), zoneA))
	dbB := dbtest.OpenDSN(t, dstDSN(t, dsn, "", zoneB))
	if zoneA != "" {
		// The DSN's zone is in force on the caller's connections.
		var seconds int64
		if err := dbA.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())").Scan(&seconds); err != nil {
			t.Fatal(err)
		}
		if got, want := time.Duration(seconds)*time.Second, 5*time.Hour+30*time.Minute; got != want {
			t.Fatalf("NOW() - UTC_TIMESTAMP() on A's connections: got %v; want %v", got, want)
		}
	}
	open := func(db *sql.DB) *dsync.Session {
		s, err := dsync.NewSession(ctx, db, dsync.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, c, b := open(dbA), open(dbC), open(dbB)
	live, dead := dstLocks(a, "live"), dstLocks(c, "dead")
	fences := make(map[string]int64)
	for _, l := range append(live, dead...) {
		if err := l.Lock(ctx); err != nil {
			t.Fatalf("Lock %s: got %v; want nil", l.Name(), err)
		}
		fences[l.Name()] = l.Fence()
	}
	livesB, deadsB := dstLocks(b, "live"), dstLocks(b, "dead")
	for _, l := range append(livesB, deadsB...) {
		if ok, err := l.TryLock(ctx); ok || err != nil {
			t.Fatalf("B's TryLock %s before the change: got %v, %v; want false, nil", l.Name(), ok, err)
		}
	}

	// Cut C off a second before the change.
	utc, _, err = dstClock(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(change.Add(-time.Second).Sub(utc))
	p.Cut(true)
	cutAt := time.Now()
	type taken struct {
		name string
		at   time.Time
		err  error
	}
	takes := make(chan taken, len(deadsB))
	for _, l := range deadsB {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 3*ttl)
			defer cancel()
			err := l.Lock(ctx)
			takes <- taken{l.Name(), time.Now(), err}
		}()
	}
	cDoneAt := make(chan time.Time, 1)
	go func() {
		select {
		case <-c.Done():
			cDoneAt <- time.Now()
		case <-ctx.Done():
			cDoneAt <- time.Time{}
		}
	}()
	// Until 2×TTL after the change, B never gets A's locks and A stays
	// live, while the zone offset of NOW() jumps. Violations are recorded
	// (a lock B got is given back) and reported once the jump is proven.
	var polls int
	var violations []string
	offsetAfter := offsetBefore
	for {
		utc, offset, err := dstClock(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if offset != offsetBefore {
			offsetAfter = offset
		}
		if utc.After(change.Add(2 * ttl)) {
			break
		}
		at := utc.Sub(change).Round(time.Millisecond)
		if err := a.Err(); err != nil {
			violations = append(violations, fmt.Sprintf("A's Err at %v from the change: got %v; want nil", at, err))
		}
		for _, l := range livesB {
			ok, err := l.TryLock(ctx)
			if ok || err != nil {
				violations = append(violations, fmt.Sprintf("B's TryLock %s, held by live A, at %v from the change: got %v, %v; want false, nil",
					l.Name(), at, ok, err))
			}
			if ok {
				_ = l.Unlock(ctx)
			}
		}
		polls++
		time.Sleep(200 * time.Millisecond)
	}
	var cDone time.Time
	select {
	case cDone = <-cDoneAt:
	case <-time.After(ttl):
	}

	// The faults: NOW() jumped an hour against UTC; C was cut off.
	if offsetAfter-offsetBefore != jump {
		t.Fatalf("NOW() - UTC_TIMESTAMP() on a SYSTEM connection: got %v before and %v after the change; want a jump of %v",
			offsetBefore, offsetAfter, jump)
	}
	st := p.Stats()
	if st.Dropped == 0 {
		t.Fatalf("bytes the proxy dropped after the cut: got 0; want C's renewals")
	}
	t.Logf("NOW() - UTC_TIMESTAMP(): %v before the change, %v after; %v from start to change; the proxy dropped %d bytes after the cut",
		offsetBefore, offsetAfter, untilChange.Round(time.Millisecond), st.Dropped)

	// (a) A held its locks throughout.
	for i, v := range violations {
		if i == 10 {
			t.Errorf("... and %d more", len(violations)-i)
			break
		}
		t.Error(v)
	}
	if len(violations) == 0 {
		t.Logf("%d polls of B's TryLock on A's locks up to 2×TTL after the change: all false; A's Err nil", polls)
	}

	// (b) C was lost, and its locks went to B after C's Done closed, within
	// TTL+2s of the cut.
	if err := c.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("C's Err: got %v; want %v", err, dsync.ErrSessionExpired)
	}
	if !cDone.IsZero() {
		t.Logf("C's Done closed %v after the cut", cDone.Sub(cutAt).Round(time.Millisecond))
	}
	var took []taken
	for range deadsB {
		tk := <-takes
		if tk.err != nil {
			t.Errorf("B's Lock %s, held by C, cut off: got %v; want nil within %v", tk.name, tk.err, 3*ttl)
			continue
		}
		took = append(took, tk)
		since := tk.at.Sub(cutAt)
		t.Logf("B took %s %v after the cut", tk.name, since.Round(time.Millisecond))
		if since > ttl+2*time.Second {
			t.Errorf("B's Lock %s: got it %v after the cut; want within %v", tk.name, since, ttl+2*time.Second)
		}
		if cDone.IsZero() || tk.at.Before(cDone) {
			t.Errorf("B's Lock %s at %v after the cut: got it before C's Done closed (at %v); want Done first",
				tk.name, since, cDone.Sub(cutAt))
		}
	}
	// By the server's UTC clock, B took them after C's lease ended, and
	// within a second of it.
	var expiresMicros int64
	if err := probe.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) FROM dsync_lease WHERE id = ?",
		c.ID()).Scan(&expiresMicros); err != nil {
		t.Fatalf("C's lease row: %v", err)
	}
	expires := time.UnixMicro(expiresMicros)
	lastRenewal := expires.Add(-ttl)
	t.Logf("C's lease: last renewal %v from the change (cut at %v), ended %v from the change",
		lastRenewal.Sub(change).Round(time.Millisecond), cutAt.Add(skew).Sub(change).Round(time.Millisecond), expires.Sub(change).Round(time.Millisecond))
	for _, tk := range took {
		at := tk.at.Add(skew) // on the server's clock, within rtt/2
		if at.Add(rtt/2 + 5*time.Millisecond).Before(expires) {
			t.Errorf("B's Lock %s at %v from the change: got it %v before C's lease ended; want not before", tk.name,
				at.Sub(change), expires.Sub(at))
		}
		after := at.Sub(lastRenewal)
		if after > ttl+time.Second {
			t.Errorf("B's Lock %s: got it %v after C's last renewal; want within TTL+1s (%v)", tk.name, after, ttl+time.Second)
		}
		t.Logf("B took %s %v after C's last renewal, %v after C's lease ended, by the server's clock",
			tk.name, after.Round(time.Millisecond), at.Sub(expires).Round(time.Millisecond))
	}
	for _, l := range deadsB {
		if got := l.Fence(); got <= fences[l.Name()] {
			t.Errorf("B's fence of %s: got %d; want > %d, C's", l.Name(), got, fences[l.Name()])
		}
	}
}

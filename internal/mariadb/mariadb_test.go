package mariadb_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/mariadb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartStop starts a throwaway server, runs a query on it, stops it and
// checks that nothing is left listening.
func TestStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := mariadb.Start(ctx)
	if errors.Is(err, mariadb.ErrNotInstalled) && os.Getenv("DSYNC_TEST_DSN") != "" {
		// The suite runs on the user's server and never needs this helper.
		t.Skipf("DSYNC_TEST_DSN is set and no MariaDB is installed: %v", err)
	}
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	var one int
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	db.Close()
	if err != nil || one != 1 {
		t.Fatalf("SELECT 1: got %d, %v; want 1, nil", one, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	db, err = sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

// startWith starts a server for t with cfg and stops it when t ends.
func startWith(t *testing.T, cfg mariadb.Config) *mariadb.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := mariadb.StartWith(ctx, cfg)
	if errors.Is(err, mariadb.ErrNotInstalled) && os.Getenv("DSYNC_TEST_DSN") != "" {
		t.Skipf("DSYNC_TEST_DSN is set and no MariaDB is installed: %v", err)
	}
	if err != nil {
		t.Fatalf("StartWith(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s
}

// open returns a connection pool for dsn, closed when t ends.
func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestStartWithBadEnv checks that a malformed Env entry is refused before
// anything starts.
func TestStartWithBadEnv(t *testing.T) {
	s, err := mariadb.StartWith(context.Background(), mariadb.Config{Env: []string{"TZ"}})
	if err == nil {
		s.Stop()
		t.Fatal("StartWith with Env entry \"TZ\": got nil error; want an error")
	}
}

// TestStartWithBadFakeTime checks that a FAKETIME libfaketime cannot parse
// makes StartWith fail with libfaketime's own message.
func TestStartWithBadFakeTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := mariadb.StartWith(ctx, mariadb.Config{FakeTime: "@yesterday"})
	if err == nil {
		s.Stop()
		t.Fatal("StartWith with FakeTime \"@yesterday\": got nil error; want an error")
	}
	t.Logf("StartWith: %v", err)
	if !strings.Contains(err.Error(), "libfaketime") {
		t.Errorf("StartWith with FakeTime \"@yesterday\": got %v; want libfaketime's message", err)
	}
}

// TestKillRestart kills a server holding a committed row, restarts it and
// checks that the row survived (InnoDB crash recovery ran), that the DSN and
// the arguments are unchanged, and that Stop after Kill removes everything.
func TestKillRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startWith(t, mariadb.Config{Args: []string{"--max-connections=77"}})
	dsn := s.DSN("")

	db := open(t, dsn)
	for _, q := range []string{
		"CREATE DATABASE k",
		"CREATE TABLE k.t (id INT PRIMARY KEY) ENGINE=InnoDB",
		"INSERT INTO k.t VALUES (42)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s.Kill()
	s.Kill() // a no-op on a killed server
	dead := open(t, dsn)
	pingCtx, cancelPing := context.WithTimeout(ctx, time.Second)
	err := dead.PingContext(pingCtx)
	cancelPing()
	if err == nil {
		t.Fatal("server still answers after Kill")
	}

	start := time.Now()
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Logf("Restart took %v", time.Since(start))
	if got := s.DSN(""); got != dsn {
		t.Errorf("DSN after Restart: got %q; want %q", got, dsn)
	}
	if err := s.Restart(ctx); err == nil {
		t.Error("Restart of a running server: got nil error; want an error")
	}

	db = open(t, dsn)
	var id, maxConns int
	if err := db.QueryRowContext(ctx, "SELECT id FROM k.t").Scan(&id); err != nil || id != 42 {
		t.Errorf("row after Kill and Restart: got %d, %v; want 42, nil", id, err)
	}
	if err := db.QueryRowContext(ctx, "SELECT @@max_connections").Scan(&maxConns); err != nil || maxConns != 77 {
		t.Errorf("@@max_connections after Restart: got %d, %v; want 77, nil", maxConns, err)
	}
	db.Close()
	log, err := os.ReadFile(s.ErrorLog())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(log, []byte("Starting crash recovery")) {
		t.Errorf("error log after Restart does not show InnoDB crash recovery:\n%s", log)
	}

	s.Kill()
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop after Kill: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(s.ErrorLog())); !os.IsNotExist(err) {
		t.Errorf("temporary directory after Stop: got %v; want it gone", err)
	}
}

// clockSample is one reading of the server's clocks.
type clockSample struct {
	now, utc time.Time // NOW(6) and UTC_TIMESTAMP(6), as wall times in UTC
	zone     string    // @@system_time_zone
	real     time.Time // this process's clock halfway through the query
}

func readClock(ctx context.Context, t *testing.T, db *sql.DB) clockSample {
	t.Helper()
	const layout = "2006-01-02 15:04:05.999999"
	var now, utc string
	var c clockSample
	t0 := time.Now()
	err := db.QueryRowContext(ctx, "SELECT NOW(6), UTC_TIMESTAMP(6), @@system_time_zone").Scan(&now, &utc, &c.zone)
	t1 := time.Now()
	if err != nil {
		t.Fatalf("read clock: %v", err)
	}
	c.real = t0.Add(t1.Sub(t0) / 2)
	if c.now, err = time.Parse(layout, now); err != nil {
		t.Fatal(err)
	}
	if c.utc, err = time.Parse(layout, utc); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFakeTimeDST runs a server in Berlin under a fake clock started ten
// seconds before the spring DST change (2026-03-29 01:00 UTC, when 02:00 CET
// becomes 03:00 CEST) and checks that NOW() jumps an hour ahead while
// UTC_TIMESTAMP() advances in real time; then that Kill and Restart continue
// the fake clock and leave no libfaketime objects in /dev/shm.
func TestFakeTimeDST(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startWith(t, mariadb.Config{
		Env:      []string{"TZ=Europe/Berlin"},
		FakeTime: "@2026-03-29 01:59:50",
	})
	db := open(t, s.DSN(""))

	fakeStart := time.Date(2026, 3, 29, 0, 59, 50, 0, time.UTC)
	change := time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC)
	var samples []clockSample
	for {
		c := readClock(ctx, t, db)
		samples = append(samples, c)
		if c.utc.After(change.Add(2 * time.Second)) {
			break
		}
		if len(samples) > 200 {
			t.Fatalf("UTC_TIMESTAMP still %v after %d samples", c.utc, len(samples))
		}
		time.Sleep(200 * time.Millisecond)
	}
	first, last := samples[0], samples[len(samples)-1]
	t.Logf("first: NOW %v, UTC %v, zone %s", first.now, first.utc, first.zone)
	t.Logf("last:  NOW %v, UTC %v, zone %s (%d samples)", last.now, last.utc, last.zone, len(samples))
	if first.utc.Before(fakeStart) || !first.utc.Before(change) {
		t.Fatalf("first UTC_TIMESTAMP: got %v; want in [%v, %v) (did the server take ten seconds to start?)", first.utc, fakeStart, change)
	}
	for _, c := range samples {
		offset := time.Hour // CET
		if !c.utc.Before(change) {
			offset = 2 * time.Hour // CEST
		}
		if want := c.utc.Add(offset); !c.now.Equal(want) || c.zone != "CET" {
			t.Errorf("at UTC %v: got NOW %v, @@system_time_zone %s; want %v, CET", c.utc, c.now, c.zone, want)
		}
	}
	if first.now.Hour() != 1 || last.now.Hour() != 3 || last.now.Minute() != 0 {
		t.Errorf("NOW went from %v to %v; want from 01:59 to 03:00", first.now, last.now)
	}
	utcAdvance, realAdvance := last.utc.Sub(first.utc), last.real.Sub(first.real)
	if d := utcAdvance - realAdvance; d < -250*time.Millisecond || d > 250*time.Millisecond {
		t.Errorf("UTC_TIMESTAMP advanced %v in %v of real time; want the same", utcAdvance, realAdvance)
	}

	// Kill and Restart: the fake clock continues; the new process sees
	// summer time from the start.
	pidFile := filepath.Join(filepath.Dir(s.ErrorLog()), "mariadb.pid")
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	shm := []string{
		"/dev/shm/sem.faketime_sem_" + string(bytes.TrimSpace(pid)),
		"/dev/shm/faketime_shm_" + string(bytes.TrimSpace(pid)),
	}
	for _, f := range shm {
		if _, err := os.Stat(f); err != nil {
			t.Logf("libfaketime object %s not found before Kill: %v", f, err)
		}
	}
	s.Kill()
	for _, f := range shm {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s after Kill: got %v; want it removed", f, err)
		}
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	c := readClock(ctx, t, db) // the pool's old connections are dead; database/sql retries
	t.Logf("after Restart: NOW %v, UTC %v, zone %s", c.now, c.utc, c.zone)
	utcAdvance, realAdvance = c.utc.Sub(last.utc), c.real.Sub(last.real)
	if d := utcAdvance - realAdvance; d < -250*time.Millisecond || d > 250*time.Millisecond {
		t.Errorf("across Kill and Restart, UTC_TIMESTAMP advanced %v in %v of real time; want the same", utcAdvance, realAdvance)
	}
	if want := c.utc.Add(2 * time.Hour); !c.now.Equal(want) || c.zone != "CEST" {
		t.Errorf("after Restart: got NOW %v, @@system_time_zone %s; want %v, CEST", c.now, c.zone, want)
	}
}

// serverClockOffset returns the server's UTC_TIMESTAMP(6) minus this
// machine's clock at the middle of the query.
func serverClockOffset(ctx context.Context, t *testing.T, db *sql.DB) time.Duration {
	t.Helper()
	var us int64
	before := time.Now()
	if err := db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))").Scan(&us); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	mid := before.Add(after.Sub(before) / 2)
	return time.UnixMicro(us).Sub(mid)
}

// TestFakeTimeFile steps a running server's clock back by writing its
// FakeTimeFile, and checks that the step shows in UTC_TIMESTAMP and lasts
// across a restart.
func TestFakeTimeFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	file := filepath.Join(t.TempDir(), "faketime")
	if err := os.WriteFile(file, []byte("+0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startWith(t, mariadb.Config{FakeTimeFile: file})
	db := open(t, s.DSN(""))
	if off := serverClockOffset(ctx, t, db); off < -time.Second || off > time.Second {
		t.Fatalf("offset at the start: got %v; want about 0", off)
	}
	if err := os.WriteFile(file, []byte("-30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var off time.Duration
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if off = serverClockOffset(ctx, t, db); off < -29*time.Second {
			break
		}
	}
	if off < -31*time.Second || off > -29*time.Second {
		t.Fatalf("offset after writing -30: got %v; want about -30s", off)
	}
	s.Kill()
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if off := serverClockOffset(ctx, t, db); off < -31*time.Second || off > -29*time.Second {
		t.Fatalf("offset after a restart: got %v; want about -30s", off)
	}
	if _, err := mariadb.StartWith(ctx, mariadb.Config{FakeTime: "+1d", FakeTimeFile: file}); err == nil {
		t.Fatal("StartWith with FakeTime and FakeTimeFile: got nil error; want one")
	}
}

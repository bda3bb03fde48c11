package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// holding starts dsync run with flags, whose command writes
// "$DSYNC_SESSION $DSYNC_FENCE" to a file and runs until stop is called;
// it returns once the command runs, with the session and fence.
type holding struct {
	p              *proc
	session, fence int64
	stopFile       string
	infoFile       string // written once the command runs
}

func startHolding(t *testing.T, flags ...string) *holding {
	t.Helper()
	h := startWaiting(t, flags...)
	h.await(t)
	return h
}

// startWaiting starts dsync run as startHolding does, without waiting for
// it to hold the lock: see holds and await.
func startWaiting(t *testing.T, flags ...string) *holding {
	t.Helper()
	dir := t.TempDir()
	info, stop := filepath.Join(dir, "info"), filepath.Join(dir, "stop")
	p := startDsync(t, args([]string{"run"}, flags, []string{"--"},
		script(`echo "$DSYNC_SESSION $DSYNC_FENCE" > INFO.tmp && mv INFO.tmp INFO; while [ ! -e STOP ]; do sleep 0.02; done`,
			"INFO", info, "STOP", stop))...)
	return &holding{p: p, stopFile: stop, infoFile: info}
}

// holds reports whether h's command runs, that is whether it holds the lock.
func (h *holding) holds() bool { return exists(h.infoFile) }

// await waits until h's command runs, and reads its session and fence.
func (h *holding) await(t *testing.T) {
	t.Helper()
	if _, err := fmt.Sscan(waitFile(t, h.infoFile), &h.session, &h.fence); err != nil {
		t.Fatal(err)
	}
}

// stop ends the command and checks that dsync exited 0.
func (h *holding) stop(t *testing.T) result {
	t.Helper()
	if err := os.WriteFile(h.stopFile, []byte("stop"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := h.p.wait(t)
	if r.code != 0 {
		t.Errorf("dsync run: exit status %d; want 0 (stderr %q)", r.code, r.stderr)
	}
	return r
}

// lsJSON runs dsync ls --json and returns its elements for the given names.
func lsJSON(t *testing.T, names ...string) []lockJSON {
	t.Helper()
	r := runDsync(t, "ls", "--json")
	if r.code != 0 {
		t.Fatalf("dsync ls --json: exit status %d (stderr %q)", r.code, r.stderr)
	}
	// Exactly the documented keys, in one array.
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("dsync ls --json: %v in %q", err, r.stdout)
	}
	var all []lockJSON
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		t.Fatal(err)
	}
	keys := []string{"fence", "held_ms", "holder", "kind", "name", "session", "waiters"}
	var out []lockJSON
	for i, l := range all {
		var got []string
		for k := range raw[i] {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, keys) {
			t.Fatalf("dsync ls --json element keys: got %v; want %v", got, keys)
		}
		if slices.Contains(names, l.Name) {
			out = append(out, l)
		}
	}
	return out
}

// TestLs checks dsync ls --json and the table against dsync run holders
// of every kind: a Mutex with a waiter, an RWMutex with two readers and a
// writer waiting, a FairMutex holder.
func TestLs(t *testing.T) {
	mu, rw, fair := lockName(t)+"/mutex", lockName(t)+"/rw", lockName(t)+"/fair"
	m := startHolding(t, "--label", "cli-mutex", mu)
	r1 := startHolding(t, "--read", "--label", "cli-reader-1", rw)
	r2 := startHolding(t, "--read", "--label", "cli-reader-2", rw)
	f := startHolding(t, "--fair", "--label", "cli-fair", fair)
	waitingMutex := startDsync(t, "run", "--label", "cli-mutex-waiter", mu, "--", "true")
	waitingWriter := startDsync(t, "run", "--write", "--label", "cli-writer", rw, "--", "true")
	start := time.Now()

	var locks []lockJSON
	waitFor(t, "ls to show both waiters", func() bool {
		locks = lsJSON(t, mu, rw, fair)
		waiters := 0
		for _, l := range locks {
			if l.Name != fair {
				waiters += l.Waiters
			}
		}
		return len(locks) == 4 && waiters == 3 // the Mutex's, and the writer for each reader
	})
	elapsed := time.Since(start)
	want := []lockJSON{
		{Name: fair, Kind: "write", Holder: "cli-fair", Session: f.session, Fence: f.fence, Waiters: 0},
		{Name: mu, Kind: "mutex", Holder: "cli-mutex", Session: m.session, Fence: m.fence, Waiters: 1},
		{Name: rw, Kind: "read", Holder: "cli-reader-1", Session: r1.session, Fence: 0, Waiters: 1},
		{Name: rw, Kind: "read", Holder: "cli-reader-2", Session: r2.session, Fence: 0, Waiters: 1},
	}
	slices.SortFunc(want, func(a, b lockJSON) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Kind, b.Kind), cmp.Compare(a.Session, b.Session))
	})
	for i, got := range locks {
		if got.HeldMS < elapsed.Milliseconds()-50 {
			t.Errorf("held_ms of %s: got %d; want at least %d, the time since its dsync started", got.Name, got.HeldMS, elapsed.Milliseconds())
		}
		got.HeldMS = 0
		if got != want[i] {
			t.Errorf("ls --json [%d]: got %+v; want %+v", i, got, want[i])
		}
	}
	if m.fence <= 0 || f.fence <= 0 {
		t.Errorf("DSYNC_FENCE of the exclusive holds: got %d, %d; want > 0", m.fence, f.fence)
	}

	// The table: a header and one aligned row per hold.
	r := runDsync(t, "ls")
	if r.code != 0 {
		t.Fatalf("dsync ls: exit status %d (stderr %q)", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	header := lines[0]
	if fields := strings.Fields(header); !slices.Equal(fields, []string{"NAME", "KIND", "HOLDER", "SESSION", "FENCE", "HELD", "WAITERS"}) {
		t.Fatalf("dsync ls header: got %q", header)
	}
	columns := regexp.MustCompile(`\S+`).FindAllStringIndex(header, -1)
	rows := 0
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		if len(fields) != 7 || !slices.Contains([]string{mu, rw, fair}, fields[0]) {
			continue
		}
		rows++
		for i, loc := range regexp.MustCompile(`\S+`).FindAllStringIndex(line, -1) {
			if loc[0] != columns[i][0] {
				t.Errorf("dsync ls: column %d of %q starts at %d; want %d, as in the header %q", i, line, loc[0], columns[i][0], header)
			}
		}
		if s, _ := strconv.ParseInt(fields[3], 10, 64); s != m.session && s != r1.session && s != r2.session && s != f.session {
			t.Errorf("dsync ls row %q: session %s is none of the holders'", line, fields[3])
		}
		// A Mutex's waiters are those the database records: at least 1.
		if want := map[string]string{mu: "1+", rw: "1", fair: "0"}[fields[0]]; fields[6] != want {
			t.Errorf("dsync ls row %q: WAITERS %s; want %s", line, fields[6], want)
		}
	}
	if rows != 4 {
		t.Errorf("dsync ls: got %d rows of the test's locks; want 4:\n%s", rows, r.stdout)
	}

	for _, h := range []*holding{m, r1, r2, f} {
		h.stop(t)
	}
	for _, w := range []*proc{waitingMutex, waitingWriter} {
		if r := w.wait(t); r.code != 0 {
			t.Errorf("waiting dsync: exit status %d; want 0 (stderr %q)", r.code, r.stderr)
		}
	}
	if locks := lsJSON(t, mu, rw, fair); len(locks) != 0 {
		t.Errorf("ls --json after every run ended: got %+v; want none of the test's locks", locks)
	}
	// A prefix without tables is an error, not an empty list.
	if r := runDsync(t, "ls", "--prefix", "nosuch_"); r.code != exitUnavailable || !strings.Contains(r.stderr, "no session used prefix") {
		t.Errorf("dsync ls --prefix nosuch_: got %d, %q; want %d and a hint about the prefix", r.code, r.stderr, exitUnavailable)
	}
}

// TestLsHeldAndWaiters checks dsync ls's HELD and WAITERS: two sessions
// wait for each of a Mutex, a FairMutex and an RWMutex's read side, a
// second long, then get the lock (one of them, or for the readers both):
// the holds' age is at most the time since their lock was released, not
// their sessions' age. And dsync ls --help says what the columns mean.
func TestLsHeldAndWaiters(t *testing.T) {
	mu, fair, rw := lockName(t)+"/mutex", lockName(t)+"/fair", lockName(t)+"/rw"
	holders := []*holding{
		startHolding(t, mu), startHolding(t, "--fair", fair), startHolding(t, "--write", rw),
	}
	started := time.Now() // the waiters' sessions start after this
	waiting := map[string][]*holding{}
	for range 2 {
		waiting[mu] = append(waiting[mu], startWaiting(t, mu))
		waiting[fair] = append(waiting[fair], startWaiting(t, "--fair", fair))
		waiting[rw] = append(waiting[rw], startWaiting(t, "--read", rw))
	}
	want := map[string]int{mu: 1, fair: 2, rw: 2}
	waitFor(t, "ls to show the waiters", func() bool {
		for _, l := range lsJSON(t, mu, fair, rw) {
			if l.Waiters != want[l.Name] {
				return false
			}
		}
		return true
	})
	r := runDsync(t, "ls")
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] == mu && f[6] != "1+" {
			t.Errorf("dsync ls: the Mutex's WAITERS: got %q in %q; want 1+ (at least the claimant)", f[6], line)
		}
	}
	time.Sleep(time.Until(started.Add(1200 * time.Millisecond)))

	released := time.Now() // no waiter's hold began before this
	for _, h := range holders {
		h.stop(t)
	}
	var held []*holding
	waitFor(t, "a waiter of each lock, and both readers, to hold", func() bool {
		held = held[:0]
		for _, name := range []string{mu, fair, rw} {
			for _, h := range waiting[name] {
				if h.holds() {
					held = append(held, h)
				}
			}
		}
		return len(held) == 4
	})
	for _, h := range held {
		h.await(t)
	}
	locks := lsJSON(t, mu, fair, rw)
	upper, sessionAge := time.Since(released), time.Since(started)
	if len(locks) != 4 {
		t.Fatalf("ls --json: got %+v; want 4 holds", locks)
	}
	for _, l := range locks {
		if !slices.ContainsFunc(held, func(h *holding) bool { return h.session == l.Session }) {
			t.Errorf("ls --json: got %+v; want a hold of one of the waiters", l)
		}
		// held_ms is rounded down; the server's and this clock are read at
		// slightly different moments.
		if l.HeldMS > (upper + 20*time.Millisecond).Milliseconds() {
			t.Errorf("held_ms of %s (%s): got %d; want at most %d (since the lock was released), not the session's age, over %d",
				l.Name, l.Kind, l.HeldMS, upper.Milliseconds(), sessionAge.Milliseconds())
		}
	}
	// The second waiters of the Mutex and the FairMutex run their command
	// when the first ones end, and find their stop file there already.
	for _, name := range []string{mu, fair, rw} {
		for _, h := range waiting[name] {
			if err := os.WriteFile(h.stopFile, []byte("stop"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, name := range []string{mu, fair, rw} {
		for _, h := range waiting[name] {
			h.stop(t)
		}
	}

	r = runDsync(t, "ls", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Columns:") || !strings.Contains(r.stdout, "WAITERS") {
		t.Errorf("dsync ls --help: got %d, %q; want 0 and what the columns mean", r.code, r.stdout)
	}
}

// TestSchemaCommand runs the output of dsync schema on the server as it
// is (one multi-statement query, comment included): it must leave the
// tables that NewSession creates, and a session must then work on them.
func TestSchemaCommand(t *testing.T) {
	bg := context.Background()
	applied, created := fmt.Sprintf("cli%d_", time.Now().UnixNano()%1e9), fmt.Sprintf("ns%d_", time.Now().UnixNano()%1e9)
	r := runDsync(t, "schema", "--prefix", applied)
	if r.code != 0 {
		t.Fatalf("dsync schema: exit status %d (stderr %q)", r.code, r.stderr)
	}
	if n := strings.Count(r.stdout, "CREATE TABLE IF NOT EXISTS"); n != 7 {
		t.Errorf("dsync schema: got %d CREATE TABLE statements; want 7:\n%s", n, r.stdout)
	}
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = true
	multi := dbtest.OpenDSN(t, cfg.FormatDSN())
	if _, err := multi.Exec(r.stdout); err != nil {
		t.Fatalf("running the output of dsync schema: %v\n%s", err, r.stdout)
	}
	db := dbtest.Open(t)
	s, err := dsync.NewSession(bg, db, dsync.WithTablePrefix(created))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket", "txlock", "leader"} {
		a, c := showCreate(t, db, applied+table), showCreate(t, db, created+table)
		if strings.ReplaceAll(a, applied, created) != c {
			t.Errorf("table %s: dsync schema made\n%s\nNewSession made\n%s", table, a, c)
		}
	}
	s, err = dsync.NewSession(bg, db, dsync.WithTablePrefix(applied))
	if err != nil {
		t.Fatalf("NewSession on the tables of dsync schema: got %v; want nil", err)
	}
	defer s.Close()
	if ok, err := dsync.NewMutex(s, "x").TryLock(bg); !ok || err != nil {
		t.Errorf("TryLock on the tables of dsync schema: got %v, %v; want true, nil", ok, err)
	}
	// The default prefix.
	if r := runDsync(t, "schema"); r.code != 0 || !strings.Contains(r.stdout, "CREATE TABLE IF NOT EXISTS `dsync_lock`") {
		t.Errorf("dsync schema: got %d, %q; want the tables of prefix dsync_", r.code, r.stdout)
	}
}

// showCreate returns a table's SHOW CREATE TABLE text.
func showCreate(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var name, stmt string
	if err := db.QueryRow("SHOW CREATE TABLE `"+table+"`").Scan(&name, &stmt); err != nil {
		t.Fatalf("SHOW CREATE TABLE %s: %v", table, err)
	}
	return stmt
}

// TestReleaseForce frees a lock held by a running dsync run: another run
// gets it at once with a greater fence while the first command still runs,
// the first dsync reports at its end that the lock was released by force
// and exits 70, and releasing a free lock exits 1.
func TestReleaseForce(t *testing.T) {
	name := lockName(t)
	stuck := startHolding(t, "--label", "stuck-holder", name)
	if r := runDsync(t, "run", "-n", name, "--", "true"); r.code != exitNotObtained {
		t.Fatalf("dsync run -n while held: exit status %d; want %d", r.code, exitNotObtained)
	}
	r := runDsync(t, "release", "--force", name)
	if r.code != 0 {
		t.Fatalf("dsync release --force: exit status %d; want 0 (stderr %q)", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "stuck-holder") || !strings.Contains(r.stderr, "not told") {
		t.Errorf("dsync release --force: stderr %q; want it to name the holder and say it is not told", r.stderr)
	}
	fence := filepath.Join(t.TempDir(), "fence")
	if r := runDsync(t, "run", "-n", name, "--", "sh", "-c", `echo $DSYNC_FENCE > "$0"`, fence); r.code != 0 {
		t.Fatalf("dsync run -n after release --force: exit status %d; want 0 (stderr %q)", r.code, r.stderr)
	}
	var next int64
	if _, err := fmt.Sscan(waitFile(t, fence), &next); err != nil || next <= stuck.fence {
		t.Errorf("fence after release --force: got %d (%v); want > %d, the stuck holder's", next, err, stuck.fence)
	}
	if err := os.WriteFile(stuck.stopFile, []byte("stop"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A lost hold (see TestForcedReleaseIsLostHold).
	if end := stuck.p.wait(t); end.code != exitLeaseLost || !strings.Contains(end.stderr, "released by force") {
		t.Errorf("the stuck dsync: got status %d, stderr %q; want %d and a report that the lock was released by force", end.code, end.stderr, exitLeaseLost)
	}
	if r := runDsync(t, "release", "--force", name); r.code != exitFailure {
		t.Errorf("dsync release --force of a free lock: exit status %d; want %d (stderr %q)", r.code, exitFailure, r.stderr)
	}
}

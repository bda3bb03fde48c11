package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestElectOneLeaderAtATime: dsync elect processes started together run
// their commands one at a time, each with a term (DSYNC_TERM, and
// DSYNC_FENCE) greater than the one before it.
func TestElectOneLeaderAtATime(t *testing.T) {
	const procs = 4
	name := lockName(t)
	log := filepath.Join(t.TempDir(), "log")
	var ps []*proc
	for i := range procs {
		ps = append(ps, startDsync(t, args([]string{"elect", "--value", fmt.Sprint("p", i), name, "--"},
			script(`echo "start $DSYNC_TERM $DSYNC_FENCE" >> LOG; sleep 0.05; echo "end $DSYNC_TERM" >> LOG`, "LOG", log))...))
	}
	for _, p := range ps {
		if r := p.wait(t); r.code != 0 {
			t.Fatalf("exit status: got %d; want 0 (stderr %q)", r.code, r.stderr)
		}
	}
	lines := readLines(t, log)
	if len(lines) != 2*procs {
		t.Fatalf("log: got %d lines; want %d:\n%s", len(lines), 2*procs, strings.Join(lines, "\n"))
	}
	var last int64
	for i := 0; i < len(lines); i += 2 {
		f := strings.Fields(lines[i])
		if len(f) != 3 || f[0] != "start" || f[1] != f[2] || lines[i+1] != "end "+f[1] {
			t.Fatalf("log: leaders overlapped, or DSYNC_TERM is not DSYNC_FENCE, at line %d:\n%s", i+1, strings.Join(lines, "\n"))
		}
		term, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || term <= last {
			t.Fatalf("log: term %q after %d; want a greater one:\n%s", f[1], last, strings.Join(lines, "\n"))
		}
		last = term
	}
}

// TestElectNotObtained: with somebody leading, dsync elect -n exits 75 at
// once and --wait after the wait, without running its command; the
// waiting line names the leader.
func TestElectNotObtained(t *testing.T) {
	name := lockName(t)
	s := newSession(t)
	e := dsync.NewElection(s, name)
	if err := e.Campaign(context.Background(), "the-leader"); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	for _, flags := range [][]string{{"-n"}, {"--wait", "300ms"}} {
		r := runDsync(t, args([]string{"elect"}, flags, []string{name, "--", "touch", ran})...)
		if r.code != exitNotObtained {
			t.Errorf("dsync elect %v: exit status %d; want %d (stderr %q)", flags, r.code, exitNotObtained, r.stderr)
		}
		if exists(ran) {
			t.Fatalf("dsync elect %v ran its command while another led", flags)
		}
		waiting := fmt.Sprintf("dsync: waiting for leadership of %q, led by session %d (%q, term %d)", name, s.ID(), "the-leader", e.Term())
		if flags[0] == "--wait" && !strings.Contains(r.stderr, waiting) {
			t.Errorf("dsync elect %v: stderr %q; want the waiting line to name the leader", flags, r.stderr)
		}
	}
}

// TestElectObserve: dsync elect --observe --json prints the leader and
// then each change (a new leader, a Proclaim) as a JSON line, in order,
// and exits 128+N on signal N.
func TestElectObserve(t *testing.T) {
	bg := context.Background()
	name := lockName(t)
	a := dsync.NewElection(newSession(t), name)
	if err := a.Campaign(bg, "a1"); err != nil {
		t.Fatal(err)
	}
	cmd, _, _ := dsyncCmd("elect", "--observe", "--json", name)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	p := startCmd(t, cmd, nil, nil)
	pw.Close()
	lines := make(chan observedLeader, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var l observedLeader
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("line %q: %v", sc.Text(), err)
				return
			}
			lines <- l
		}
	}()
	next := func(want string) observedLeader {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("dsync elect --observe ended before printing %q", want)
			}
			if l.Value != want {
				t.Fatalf("dsync elect --observe printed %+v; want value %q", l, want)
			}
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("dsync elect --observe printed no line for %q in 20s", want)
		}
		return observedLeader{}
	}
	first := next("a1")
	if first.Term != a.Term() {
		t.Fatalf("first line's term %d; want the leader's %d", first.Term, a.Term())
	}
	if err := a.Proclaim(bg, "a2"); err != nil {
		t.Fatal(err)
	}
	if l := next("a2"); l.Term != first.Term {
		t.Fatalf("after Proclaim: term %d; want %d", l.Term, first.Term)
	}
	b := dsync.NewElection(newSession(t), name)
	campaigned := make(chan error, 1)
	go func() { campaigned <- b.Campaign(bg, "b1") }()
	if err := a.Resign(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-campaigned; err != nil {
		t.Fatal(err)
	}
	if l := next("b1"); l.Term <= first.Term || l.Term != b.Term() {
		t.Fatalf("new leader: term %d; want %d, above %d", l.Term, b.Term(), first.Term)
	}
	p.signal(t, syscall.SIGTERM)
	if r := p.wait(t); r.code != exitSignal+int(syscall.SIGTERM) {
		t.Errorf("exit status after SIGTERM: got %d; want %d", r.code, exitSignal+int(syscall.SIGTERM))
	}
	wg.Wait()
	pr.Close()
}

// TestElectUsage: dsync elect refuses the flags of run's kinds, and
// --observe with a command or the flags of running one.
func TestElectUsage(t *testing.T) {
	for _, a := range [][]string{
		{"elect", "--fair", "x", "--", "true"},
		{"elect", "x"},
		{"elect", "--observe", "x", "--", "true"},
		{"elect", "--observe", "-n", "x"},
		{"elect", "--observe", "-E", "3", "x"},
		{"elect", "--json", "x"},
		{"elect", "--observe"},
	} {
		if r := runDsync(t, a...); r.code != exitUsage {
			t.Errorf("dsync %q: exit status %d; want %d (stderr %q)", a, r.code, exitUsage, r.stderr)
		}
	}
}

// TestElectObserveAcrossLostLease: dsync elect --observe whose lease is
// lost (its connection cut until the lease ends on the server) opens a new
// session and goes on printing leaders: a leader elected after the cut is
// printed. (Before, it said it would observe again, every second, and
// never did: a lost lease is replaced only by a lock call.)
func TestElectObserveAcrossLostLease(t *testing.T) {
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	db := dbtest.Open(t)
	name, label := lockName(t), lockName(t)
	cmd, _, _ := dsyncCmd("elect", "--observe", "--json", "--dsn", dsn, "--ttl", "1s", "--label", label, name)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = pw
	d := startCmd(t, cmd, nil, nil)
	pw.Close()
	lines := make(chan observedLeader, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var l observedLeader
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
	}()
	live := func() (id int64) {
		_ = db.QueryRowContext(bg, "SELECT id FROM dsync_lease WHERE label = ? AND expires_at > UTC_TIMESTAMP(6)", label).Scan(&id)
		return id
	}
	var first int64
	waitFor(t, "the observer's session", func() bool { first = live(); return first != 0 })
	before := p.Stats()
	p.Cut(true)
	waitFor(t, "the observer's lease to end on the server", func() bool { return live() == 0 })
	if p.Stats().Dropped == before.Dropped {
		t.Fatalf("proxy: no byte dropped after the cut; the fault did not happen")
	}
	p.Cut(false)
	waitFor(t, "the observer's new session", func() bool { id := live(); return id != 0 && id != first })
	e := dsync.NewElection(newSession(t), name)
	if err := e.Campaign(bg, "after-the-cut"); err != nil {
		t.Fatal(err)
	}
	select {
	case l, ok := <-lines:
		if !ok || l.Value != "after-the-cut" || l.Term != e.Term() {
			t.Fatalf("after the lost lease: got %+v (open %v); want the new leader at term %d", l, ok, e.Term())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("dsync elect --observe printed nothing in 20s after its lease was lost and replaced")
	}
	d.signal(t, syscall.SIGTERM)
	if r := d.wait(t); r.code != exitSignal+int(syscall.SIGTERM) {
		t.Errorf("exit status after SIGTERM: got %d; want %d", r.code, exitSignal+int(syscall.SIGTERM))
	}
	pr.Close()
}

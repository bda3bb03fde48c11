package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestExitStatusOfCommand: dsync run exits with the command's status.
func TestExitStatusOfCommand(t *testing.T) {
	for _, status := range []int{0, 1, 3, 42, 255} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			r := runDsync(t, "run", lockName(t), "--", "sh", "-c", fmt.Sprintf("exit %d", status))
			if r.code != status {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, status, r.stderr)
			}
		})
	}
}

// TestExitStatusCommandSignalled: 128+N when the command died of signal N.
func TestExitStatusCommandSignalled(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM, syscall.SIGSEGV} {
		t.Run(sig.String(), func(t *testing.T) {
			r := runDsync(t, "run", lockName(t), "--", "sh", "-c", fmt.Sprintf("kill -%d $$", int(sig)))
			if want := 128 + int(sig); r.code != want {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, want, r.stderr)
			}
		})
	}
}

// TestExitStatusNotObtained: 75 (or -E's status) when the lock is taken
// and dsync may not wait (--nonblock, -n, --wait 0) or --wait elapses
// (a duration, or seconds as flock's -w takes them); the command never
// runs.
func TestExitStatusNotObtained(t *testing.T) {
	bg := context.Background()
	s := newSession(t, dsync.WithLabel("test-holder"))
	name, qname := lockName(t), lockName(t)+"/queued"
	if err := dsync.NewMutex(s, name).Lock(bg); err != nil {
		t.Fatal(err)
	}
	if err := dsync.NewFairMutex(s, qname).Lock(bg); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		flags    []string
		atLeast  time.Duration // the run took at least this long
		response string        // in stderr
		code     int           // the exit status, when not exitNotObtained
	}{
		{"nonblock", []string{"--nonblock"}, 0, "taken", 0},
		{"n", []string{"-n"}, 0, "taken", 0},
		{"wait 0", []string{"--wait", "0"}, 0, "taken", 0},
		{"wait", []string{"--wait", "300ms"}, 300 * time.Millisecond, "within --wait 300ms", 0},
		{"w seconds", []string{"-w", "0.3"}, 300 * time.Millisecond, "within --wait 300ms", 0},
		{"E", []string{"-n", "-E", "3"}, 0, "taken", 3},
		{"conflict-exit-code", []string{"--conflict-exit-code", "0", "-w", "0.1"}, 100 * time.Millisecond, "within --wait", exitOK},
		{"fair nonblock", []string{"--fair", "-n"}, 0, "taken", 0},
		{"fair wait", []string{"--fair", "--wait", "300ms"}, 300 * time.Millisecond, "within --wait", 0},
		{"read nonblock", []string{"--read", "-n"}, 0, "taken", 0},
		{"read wait", []string{"--read", "--wait", "300ms"}, 300 * time.Millisecond, "within --wait", 0},
		{"write wait", []string{"--write", "--wait", "300ms"}, 300 * time.Millisecond, "within --wait", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := filepath.Join(t.TempDir(), "ran")
			name := name
			if tt.flags[0] == "--fair" || tt.flags[0] == "--read" || tt.flags[0] == "--write" {
				name = qname
			}
			r := runDsync(t, args([]string{"run"}, tt.flags, []string{name, "--", "touch", ran})...)
			want := exitNotObtained
			if tt.code != 0 || tt.flags[0] == "--conflict-exit-code" {
				want = tt.code
			}
			if r.code != want {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, want, r.stderr)
			}
			if exists(ran) {
				t.Errorf("the command ran without the lock")
			}
			if r.took < tt.atLeast {
				t.Errorf("took %v; want at least %v (the --wait)", r.took, tt.atLeast)
			}
			if !strings.Contains(r.stderr, tt.response) {
				t.Errorf("stderr: got %q; want it to say %q", r.stderr, tt.response)
			}
		})
	}
}

// TestExitStatusOtherKind: 78 when another kind of lock uses the name (a
// Mutex against --fair, --read and --write, and the other way round),
// held or idle, at once whatever --wait says; the command never runs. Two
// dsync runs of different kinds started together: exactly one runs its
// command, the other exits 78. (Before, the kinds were two locks: every
// one of these ran its command.)
func TestExitStatusOtherKind(t *testing.T) {
	bg := context.Background()
	s := newSession(t, dsync.WithLabel("test-holder"))
	name, qname := lockName(t), lockName(t)+"/queued"
	m, f := dsync.NewMutex(s, name), dsync.NewFairMutex(s, qname)
	if err := m.Lock(bg); err != nil {
		t.Fatal(err)
	}
	if err := f.Lock(bg); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, r result, ran string) {
		t.Helper()
		if r.code != exitOtherKind {
			t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, exitOtherKind, r.stderr)
		}
		if exists(ran) {
			t.Errorf("the command ran")
		}
		if !strings.Contains(r.stderr, "another kind of lock") {
			t.Errorf("stderr: got %q; want it to say %q", r.stderr, "another kind of lock")
		}
	}
	for _, held := range []bool{true, false} {
		for _, tt := range []struct {
			name  string
			flags []string
		}{
			{name, []string{"--fair"}},
			{name, []string{"--read"}},
			{name, []string{"--write", "--wait", "10s"}},
			{name, []string{"--fair", "-n"}},
			{qname, nil},
			{qname, []string{"--wait", "10s"}},
			{qname, []string{"-n"}},
		} {
			t.Run(fmt.Sprintf("held %v, %s %v", held, map[bool]string{true: "Mutex", false: "FairMutex"}[tt.name == name], tt.flags), func(t *testing.T) {
				ran := filepath.Join(t.TempDir(), "ran")
				check(t, runDsync(t, args([]string{"run"}, tt.flags, []string{tt.name, "--", "touch", ran})...), ran)
			})
		}
		if !held {
			break
		}
		if err := m.Unlock(bg); err != nil {
			t.Fatal(err)
		}
		if err := f.Unlock(bg); err != nil {
			t.Fatal(err)
		}
	}

	// Two dsync runs of different kinds started together.
	for round, kind := range [][]string{{"--fair"}, {"--read"}, {"--write"}} {
		race := fmt.Sprintf("%s/race/%d", lockName(t), round)
		dir := t.TempDir()
		var ps []*proc
		for i, flags := range [][]string{nil, kind} {
			ps = append(ps, startDsync(t, args([]string{"run"}, flags, []string{race, "--", "touch", filepath.Join(dir, fmt.Sprint(i))})...))
		}
		var codes []int
		for _, p := range ps {
			codes = append(codes, p.wait(t).code)
		}
		ran := 0
		for i, code := range codes {
			switch {
			case code == 0 && exists(filepath.Join(dir, fmt.Sprint(i))):
				ran++
			case code != exitOtherKind:
				t.Errorf("race %v: exit status %d; want 0 or %d", kind, code, exitOtherKind)
			}
		}
		if ran != 1 {
			t.Errorf("race of a Mutex and %v on one name: %d commands ran (exit statuses %v); want 1, the other exiting %d", kind, ran, codes, exitOtherKind)
		}
	}
}

// TestExitStatusLeaseLost cuts the network between dsync and the database
// while the command runs: the session is lost, dsync sends the command
// SIGTERM (its trap writes a marker) and exits 70; a command that ignores
// SIGTERM gets SIGKILL after --grace. Another session then gets the lock.
func TestExitStatusLeaseLost(t *testing.T) {
	tests := []struct {
		name   string
		script string // writes its pid to READY once running
		marker bool   // whether it writes TERM to MARKER
	}{
		{"SIGTERM", `trap 'echo TERM > MARKER; exit 0' TERM; echo $$ > READY; while :; do sleep 0.05; done`, true},
		{"SIGKILL after grace", `trap '' TERM; echo $$ > READY; while :; do sleep 0.05; done`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, dsn := dbtest.FaultProxy(t)
			dir := t.TempDir()
			ready, marker := filepath.Join(dir, "ready"), filepath.Join(dir, "marker")
			name := lockName(t)
			d := startDsync(t, args([]string{"run", "--dsn", dsn, "--ttl", "2s", "--grace", "0.5s", name, "--"},
				script(tt.script, "READY", ready, "MARKER", marker))...)
			pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, ready)))
			if err != nil {
				t.Fatal(err)
			}
			before := p.Stats()
			p.Cut(true)
			r := d.wait(t)
			if p.Stats().Dropped == before.Dropped {
				t.Fatalf("proxy: no byte dropped after the cut; the fault did not happen")
			}
			t.Logf("dsync exited %v after it started: %q", r.took, r.stderr)
			if r.code != exitLeaseLost {
				t.Errorf("exit status: got %d; want %d", r.code, exitLeaseLost)
			}
			if !strings.Contains(r.stderr, "lost") {
				t.Errorf("stderr: got %q; want it to say the lease was lost", r.stderr)
			}
			if got, _ := os.ReadFile(marker); tt.marker && strings.TrimSpace(string(got)) != "TERM" {
				t.Errorf("the command's SIGTERM trap: got marker %q; want TERM", got)
			}
			if tt.marker == false && !strings.Contains(r.stderr, "SIGKILL") {
				t.Errorf("stderr: got %q; want it to say SIGKILL was sent", r.stderr)
			}
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("the command (pid %d) after dsync exited: got %v; want it gone (ESRCH)", pid, err)
			}
			// The lease ended on the server: another session takes the lock.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := dsync.NewMutex(newSession(t), name).Lock(ctx); err != nil {
				t.Errorf("Lock by another session after the lease was lost: got %v; want nil", err)
			}
		})
	}
}

// TestWaitAcrossLostLease: a dsync run waiting for a lock whose network is
// cut for longer than its TTL loses its session, says so, opens a new one
// once the network is back, and runs its command when the holder releases
// the lock, under the new session (it used to exit 69).
func TestWaitAcrossLostLease(t *testing.T) {
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	db := dbtest.Open(t)
	name, label := lockName(t), lockName(t)
	holder := dsync.NewMutex(newSession(t), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	d := startDsync(t, args([]string{"run", "--dsn", dsn, "--ttl", "1s", "--label", label, name, "--"},
		script(`echo "$DSYNC_SESSION" > OUT`, "OUT", out))...)
	// leases returns the ids of the lease rows of dsync's sessions, and
	// whether each lives on the server.
	leases := func() map[int64]bool {
		rows, err := db.QueryContext(bg, "SELECT id, expires_at > UTC_TIMESTAMP(6) FROM dsync_lease WHERE label = ?", label)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		ids := map[int64]bool{}
		for rows.Next() {
			var id int64
			var live bool
			if err := rows.Scan(&id, &live); err != nil {
				t.Fatal(err)
			}
			ids[id] = live
		}
		return ids
	}
	var first int64
	waitFor(t, "dsync's session", func() bool {
		for id := range leases() {
			first = id
		}
		return first != 0
	})
	time.Sleep(300 * time.Millisecond) // dsync waits in Lock

	before := p.Stats()
	p.Cut(true)
	waitFor(t, "dsync's lease to end on the server", func() bool { return !leases()[first] })
	if p.Stats().Dropped == before.Dropped {
		t.Fatalf("proxy: no byte dropped after the cut; the fault did not happen")
	}
	p.Cut(false)
	var second int64
	waitFor(t, "dsync's new session", func() bool {
		for id, live := range leases() {
			if id != first && live {
				second = id
			}
		}
		return second != 0
	})
	select {
	case r := <-d.done:
		d.done <- r
		t.Fatalf("dsync exited while the lock was held: status %d, stderr %q", r.code, r.stderr)
	default:
	}
	if err := holder.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	r := d.wait(t)
	t.Logf("dsync exited %v after it started: %q", r.took, r.stderr)
	if r.code != 0 {
		t.Fatalf("exit status: got %d; want 0, the command run under the new session (stderr %q)", r.code, r.stderr)
	}
	if got := strings.TrimSpace(waitFile(t, out)); got != strconv.FormatInt(second, 10) {
		t.Errorf("DSYNC_SESSION of the command: got %s; want %d, the new session (lost: %d)", got, second, first)
	}
	for _, want := range []string{fmt.Sprintf("session %d lost while waiting", first), fmt.Sprintf("new session %d", second)} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr: got %q; want it to say %q", r.stderr, want)
		}
	}
}

// TestCommandDeadBeforeNextHolder: when a dsync run loses its lease, its
// command and the command's process group are dead before the lock can
// pass to another holder, whatever the command does with SIGTERM. The
// first dsync (TTL 2s, default --grace) runs a command whose SIGTERM trap
// takes 4s, or one that leaves such a process running in its group as it
// exits 0 (which holds the lock too, see TestLockHeldUntilGroupEnds); a
// second dsync waits for the same lock; a proxy cuts the first's network.
// The second's command, once it runs, records whether any process of the
// first's group still exists; the trap records when it got SIGTERM and
// whether it finished.
func TestCommandDeadBeforeNextHolder(t *testing.T) {
	const trapped = `trap 'echo term >> LOG; sleep 4; echo late >> LOG; exit 0' TERM; echo $$ > READY; while :; do sleep 0.05; done`
	for _, tt := range []struct {
		name   string
		script string // writes the command's pid, its group's id, to READY
	}{
		{"command", trapped},
		// $$ in the subshell is the command's pid.
		{"background job of an ended command", `(` + trapped + `) >/dev/null 2>&1 & exit 0`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, dsn := dbtest.FaultProxy(t)
			dir := t.TempDir()
			ready, log := filepath.Join(dir, "ready"), filepath.Join(dir, "log")
			name := lockName(t)
			first := startDsync(t, args([]string{"run", "--dsn", dsn, "--ttl", "2s", name, "--"},
				script(tt.script, "READY", ready, "LOG", log))...)
			pgid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, ready)))
			if err != nil {
				t.Fatal(err)
			}
			second := startDsync(t, args([]string{"run", name, "--"},
				script(`if kill -0 -PGID 2>/dev/null; then echo 'start: the first group lives' >> LOG; else echo start >> LOG; fi`,
					"PGID", strconv.Itoa(pgid), "LOG", log))...)
			before := p.Stats()
			p.Cut(true)
			r1, r2 := first.wait(t), second.wait(t)
			if p.Stats().Dropped == before.Dropped {
				t.Fatalf("proxy: no byte dropped after the cut; the fault did not happen")
			}
			t.Logf("first dsync: exited %v after it started: %q", r1.took, r1.stderr)
			if r1.code != exitLeaseLost || !strings.Contains(r1.stderr, "lost") {
				t.Fatalf("first dsync: got status %d, stderr %q; want %d and the lease lost", r1.code, r1.stderr, exitLeaseLost)
			}
			if r2.code != 0 {
				t.Fatalf("second dsync: got status %d; want 0, its command run (stderr %q)", r2.code, r2.stderr)
			}
			// term: the first command got SIGTERM; start: the second command ran
			// with the first's group gone; never late (the trap outlived the lease).
			if got := readLines(t, log); !slices.Equal(got, []string{"term", "start"}) {
				t.Errorf("log: got %q; want [term start]: SIGTERM, then the next holder with every process of the first command dead", got)
			}
			if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("the first command's group (%d) after both dsyncs exited: got %v; want it gone (ESRCH)", pgid, err)
			}
		})
	}
}

// TestExitStatusDatabaseUnusable: 69 when the database cannot be used:
// a DSN that does not parse, a port that refuses, a server that accepts
// but never answers (within --connect-timeout), a database that does not
// exist. The command never runs. The message says "dsync:" once, though
// the library's error says it too.
func TestExitStatusDatabaseUnusable(t *testing.T) {
	refused := func() string { // a port nothing listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		silent.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = "no_such_database"
	noDB := cfg.FormatDSN()

	tests := []struct {
		name string
		dsn  string
	}{
		{"DSN does not parse", "root@tcp(127.0.0.1:3306)no-slash"},
		{"port refuses", "root@tcp(" + refused + ")/x"},
		{"server never answers", "root@tcp(" + silent.Addr().String() + ")/x"},
		{"no such database", noDB},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := filepath.Join(t.TempDir(), "ran")
			for _, cmd := range [][]string{
				{"run", "--connect-timeout", "1s", "--dsn", tt.dsn, lockName(t), "--", "touch", ran},
				{"ls", "--connect-timeout", "1s", "--dsn", tt.dsn},
				{"release", "--force", "--connect-timeout", "1s", "--dsn", tt.dsn, lockName(t)},
			} {
				r := runDsync(t, cmd...)
				if r.code != exitUnavailable {
					t.Errorf("dsync %s: exit status: got %d; want %d (stderr %q)", cmd[0], r.code, exitUnavailable, r.stderr)
				}
				if !strings.Contains(r.stderr, "database unusable") || strings.Count(r.stderr, "dsync:") != 1 {
					t.Errorf("dsync %s: stderr: got %q; want it to say the database is unusable, with one dsync: prefix", cmd[0], r.stderr)
				}
			}
			if exists(ran) {
				t.Errorf("the command ran")
			}
		})
	}
	if len(accepted) == 0 {
		t.Errorf("the silent server accepted no connection: that case was not tested")
	}
}

// TestExitStatusUsage: 64 and one line on stderr for bad command lines,
// including no DSN at all: the problem, with the "dsync" prefix once, and
// where the command's usage is; 0 and the usage on stdout for help (the
// command's own for "dsync COMMAND --help").
func TestExitStatusUsage(t *testing.T) {
	name := lockName(t)
	tests := []struct {
		name string
		args []string
		env  string // DSYNC_DSN, when not the test database's
	}{
		{"no command", nil, ""},
		{"unknown command", []string{"lock", name}, ""},
		{"run: unknown flag", []string{"run", "--frobnicate", name, "--", "true"}, ""},
		{"run: no name", []string{"run"}, ""},
		{"run: no command", []string{"run", name}, ""},
		{"run: no command after --", []string{"run", name, "--"}, ""},
		{"run: flag after the name", []string{"run", name, "--ttl", "5s", "--", "true"}, ""},
		{"run: two kinds", []string{"run", "--fair", "--read", name, "--", "true"}, ""},
		{"run: wait and nonblock", []string{"run", "--wait", "1s", "-n", name, "--", "true"}, ""},
		{"run: negative wait", []string{"run", "--wait", "-1s", name, "--", "true"}, ""},
		{"run: negative wait seconds", []string{"run", "-w", "-0.5", name, "--", "true"}, ""},
		{"run: garbage wait", []string{"run", "-w", "soon", name, "--", "true"}, ""},
		{"run: wait seconds overflow", []string{"run", "--wait", "1e300", name, "--", "true"}, ""},
		{"run: -E not a status", []string{"run", "-E", "256", name, "--", "true"}, ""},
		{"run: -E not a number", []string{"run", "-E", "x", name, "--", "true"}, ""},
		{"run: negative grace", []string{"run", "--grace", "-1s", name, "--", "true"}, ""},
		{"run: grace above TTL/4", []string{"run", "--ttl", "2s", "--grace", "501ms", name, "--", "true"}, ""},
		{"run: grace 10s with the default TTL", []string{"run", "--grace", "10s", name, "--", "true"}, ""},
		{"run: bad duration", []string{"run", "--ttl", "soon", name, "--", "true"}, ""},
		{"run: TTL too short", []string{"run", "--ttl", "100ms", name, "--", "true"}, ""},
		{"run: bad prefix", []string{"run", "--prefix", "no-dashes", name, "--", "true"}, ""},
		{"run: label too long", []string{"run", "--label", strings.Repeat("x", 256), name, "--", "true"}, ""},
		{"run: empty name", []string{"run", "", "--", "true"}, ""},
		{"run: no DSN", []string{"run", name, "--", "true"}, "-"},
		{"run: empty --dsn", []string{"run", "--dsn", "", name, "--", "true"}, ""},
		{"ls: argument", []string{"ls", "extra"}, ""},
		{"ls: no DSN", []string{"ls"}, "-"},
		{"ls: bad prefix", []string{"ls", "--prefix", "a b"}, ""},
		{"schema: bad prefix", []string{"schema", "--prefix", "a;b"}, ""},
		{"release: no --force", []string{"release", name}, ""},
		{"release: no name", []string{"release", "--force"}, ""},
		{"release: two names", []string{"release", "--force", name, name}, ""},
		{"release: empty name", []string{"release", "--force", ""}, ""},
		{"release: no DSN", []string{"release", "--force", name}, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, out, errOut := dsyncCmd(tt.args...)
			if tt.env == "-" {
				cmd.Env = append(cmd.Env, envDSN+"=") // the last one counts
			}
			ran := filepath.Join(t.TempDir(), "ran")
			for i, a := range cmd.Args {
				if a == "true" {
					cmd.Args[i] = "touch"
					cmd.Args = append(cmd.Args, ran)
					break
				}
			}
			r := startCmd(t, cmd, out, errOut).wait(t)
			if r.code != exitUsage {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, exitUsage, r.stderr)
			}
			see := "(see 'dsync --help')\n"
			if c := tt.args; len(c) > 0 && c[0] != "lock" {
				see = "(see 'dsync " + c[0] + " --help')\n"
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "dsync") || !strings.HasSuffix(r.stderr, see) ||
				strings.Count(r.stderr, "dsync") != 2 {
				t.Errorf("stderr: got %q; want one line that says dsync once, the problem and %q", r.stderr, see)
			}
			if r.stdout != "" {
				t.Errorf("stdout: got %q; want nothing", r.stdout)
			}
			if exists(ran) {
				t.Errorf("the command ran")
			}
		})
	}
	for _, help := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, usage},
		{[]string{"--help"}, usage},
		{[]string{"-h"}, usage},
		{[]string{"run", "-h"}, "usage:\n" + runUsage},
		{[]string{"ls", "--help"}, "usage:\n" + lsUsage + lsColumns},
		{[]string{"release", "-help"}, "usage:\n" + releaseUsage},
	} {
		r := runDsync(t, help.args...)
		if r.code != 0 || r.stdout != help.want {
			t.Errorf("dsync %q: got status %d, stdout %q; want 0 and %q", help.args, r.code, r.stdout, help.want)
		}
	}
}

// TestGraceBound: --grace may be at most TTL/4, and defaults to that
// bound (at most 10s); a larger one is a usage error that names the bound
// and the --ttl it would need.
func TestGraceBound(t *testing.T) {
	name := lockName(t)
	for _, tt := range []struct {
		flags []string
		code  int
		say   string // in stderr
	}{
		{[]string{"--ttl", "20s", "--grace", "6s"}, exitUsage, "run: --grace 6s is more than TTL/4 = 5s (--ttl 20s): lower --grace, or raise --ttl to at least 24s (see 'dsync run --help')\n"},
		{[]string{"--grace", "4s"}, exitUsage, "TTL/4 = 3.75s (--ttl 15s)"},
		{[]string{"--ttl", "20s", "--grace", "5s"}, 0, ""},
		{[]string{"--ttl", "1s"}, 0, ""}, // the default grace fits
		{[]string{"--ttl", "1s", "--grace", "0"}, 0, ""},
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			r := runDsync(t, args([]string{"run"}, tt.flags, []string{name, "--", "true"})...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.say) {
				t.Errorf("got status %d, stderr %q; want %d and %q", r.code, r.stderr, tt.code, tt.say)
			}
		})
	}
}

// TestCommandEnvironment: the command gets DSYNC_LOCK, DSYNC_FENCE (0 for
// --read) and DSYNC_SESSION, keeps the rest of the environment, and
// inherits stdin, stdout and stderr. (The Mutex runs on a name of its
// own: one name is one kind of lock.)
func TestCommandEnvironment(t *testing.T) {
	queued := lockName(t)
	show := `echo "$DSYNC_LOCK|$DSYNC_FENCE|$DSYNC_SESSION|$DSYNC_TEST_INHERITED"; cat; echo to-stderr >&2`
	var lastFence int64
	for _, kind := range []string{"", "--fair", "--write", "--read"} {
		t.Run(strings.TrimPrefix(kind, "--")+"/", func(t *testing.T) {
			flags := []string{"run", "--label", "env-test"}
			name := queued + "/mutex"
			if kind != "" {
				flags = append(flags, kind)
				name = queued
			}
			cmd, out, errOut := dsyncCmd(args(flags, []string{name, "--", "sh", "-c", show})...)
			cmd.Env = append(cmd.Env, "DSYNC_TEST_INHERITED=yes")
			cmd.Stdin = strings.NewReader("from-stdin\n")
			r := startCmd(t, cmd, out, errOut).wait(t)
			if r.code != 0 {
				t.Fatalf("exit status: got %d; want 0 (stderr %q)", r.code, r.stderr)
			}
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != 2 || lines[1] != "from-stdin" {
				t.Fatalf("stdout: got %q; want the environment line and from-stdin", r.stdout)
			}
			if r.stderr != "to-stderr\n" {
				t.Errorf("stderr: got %q; want %q", r.stderr, "to-stderr\n")
			}
			f := strings.Split(lines[0], "|")
			fence, ferr := strconv.ParseInt(f[1], 10, 64)
			session, serr := strconv.ParseInt(f[2], 10, 64)
			switch {
			case f[0] != name:
				t.Errorf("DSYNC_LOCK: got %q; want %q", f[0], name)
			case ferr != nil || kind == "--read" && fence != 0 || kind != "--read" && fence <= 0:
				t.Errorf("DSYNC_FENCE: got %q; want %s", f[1], map[bool]string{true: "0", false: "> 0"}[kind == "--read"])
			case serr != nil || session <= 0:
				t.Errorf("DSYNC_SESSION: got %q; want a lease id", f[2])
			case f[3] != "yes":
				t.Errorf("inherited variable: got %q; want yes", f[3])
			}
			// The fences of the queued lock increase across runs.
			if kind == "--fair" || kind == "--write" {
				if fence <= lastFence {
					t.Errorf("DSYNC_FENCE: got %d; want > %d, the previous run's", fence, lastFence)
				}
				lastFence = fence
			}
		})
	}
}

// TestMutualExclusion runs several dsync run at once on one lock, in
// waves, for each exclusive kind: each command appends a start and an end
// line around a pause, and no two commands' lines may interleave.
func TestMutualExclusion(t *testing.T) {
	const procs, waves = 4, 3
	for _, kind := range [][]string{nil, {"--fair"}, {"--write"}} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			name := lockName(t)
			log := filepath.Join(t.TempDir(), "log")
			for w := range waves {
				var ps []*proc
				for i := range procs {
					id := fmt.Sprintf("%d.%d", w, i)
					ps = append(ps, startDsync(t, args([]string{"run"}, kind, []string{name, "--"},
						script(`echo "ID start" >> LOG; sleep 0.05; echo "ID end" >> LOG`, "ID", id, "LOG", log))...))
				}
				for _, p := range ps {
					if r := p.wait(t); r.code != 0 {
						t.Fatalf("exit status: got %d; want 0 (stderr %q)", r.code, r.stderr)
					}
				}
			}
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 2*procs*waves {
				t.Fatalf("log: got %d lines; want %d:\n%s", len(lines), 2*procs*waves, b)
			}
			for i := 0; i < len(lines); i += 2 {
				id, _, _ := strings.Cut(lines[i], " ")
				if lines[i] != id+" start" || lines[i+1] != id+" end" {
					t.Fatalf("log: commands interleaved at line %d:\n%s", i+1, b)
				}
			}
		})
	}
}

// TestRunLimit runs 5 dsync run --limit 2 at once on one name: each
// command counts itself in and out of a directory of markers, and no
// command ever sees more than 2 (its own included). A run with another
// limit, and one of --fair, exit 78 at once without running; -n exits 75
// while both permits are held.
func TestRunLimit(t *testing.T) {
	const procs = 5
	name := lockName(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	var ps []*proc
	for i := range procs {
		ps = append(ps, startDsync(t, args([]string{"run", "--limit", "2", name, "--"},
			script(`touch DIR/MARK; ls DIR | grep -c '^m' >> LOG; sleep 0.2; rm DIR/MARK`,
				"DIR", dir, "MARK", fmt.Sprintf("m%d", i), "LOG", log))...))
	}
	for _, p := range ps {
		if r := p.wait(t); r.code != 0 {
			t.Fatalf("exit status: got %d; want 0 (stderr %q)", r.code, r.stderr)
		}
	}
	lines := readLines(t, log)
	if len(lines) != procs {
		t.Fatalf("log: got %d lines; want %d: %q", len(lines), procs, lines)
	}
	for _, l := range lines {
		if l != "1" && l != "2" {
			t.Fatalf("commands running at once, as each saw it: %q; want 1 or 2 each", lines)
		}
	}

	holder := startDsync(t, "run", "--limit", "1", "--label", "limit-holder", name+"/held", "--", "sleep", "30")
	waitFor(t, "the holder's permit", func() bool {
		r := runDsync(t, "run", "--limit", "1", "-n", name+"/held", "--", "true")
		return r.code == exitNotObtained
	})
	// The waiting line names the holder of the permit.
	r := runDsync(t, "run", "--limit", "1", "--wait", "300ms", name+"/held", "--", "true")
	if waiting := fmt.Sprintf("dsync: waiting for lock %q held by limit-holder for ", name+"/held"); r.code != exitNotObtained || !strings.HasPrefix(r.stderr, waiting) {
		t.Errorf("dsync run --limit 1 --wait 300ms while the permit is held: got exit %d, stderr %q; want %d, %q first", r.code, r.stderr, exitNotObtained, waiting)
	}
	for _, flags := range [][]string{{"--limit", "2"}, {"--fair"}} {
		ran := filepath.Join(t.TempDir(), "ran")
		r := runDsync(t, args([]string{"run"}, flags, []string{name + "/held", "--", "touch", ran})...)
		if r.code != exitOtherKind || exists(ran) {
			t.Errorf("dsync run %v on a name of --limit 1: got exit %d, ran %v; want %d, not run (stderr %q)",
				flags, r.code, exists(ran), exitOtherKind, r.stderr)
		}
	}
	holder.signal(t, syscall.SIGTERM)
	holder.wait(t)
}

// TestExitStatusCannotRun: 127 when the command is not found, 126 when it
// is found but cannot be run, as in sh; the lock is released.
func TestExitStatusCannotRun(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "not-executable")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	for _, tt := range []struct {
		command string
		want    int
	}{
		{filepath.Join(dir, "missing"), exitNotFound},
		{"dsync-no-such-command-anywhere", exitNotFound},
		{notExec, exitCannotRun},
	} {
		r := runDsync(t, "run", name, "--", tt.command)
		if r.code != tt.want {
			t.Errorf("dsync run %s: exit status %d; want %d (stderr %q)", tt.command, r.code, tt.want, r.stderr)
		}
		if r := runDsync(t, "run", "-n", name, "--", "true"); r.code != 0 {
			t.Errorf("dsync run -n afterwards: exit status %d; want 0, the lock released (stderr %q)", r.code, r.stderr)
		}
	}
}

// TestVersion: dsync --version prints the module's version, "(devel)"
// when built from a checkout (as here), and exits 0.
func TestVersion(t *testing.T) {
	for _, flag := range []string{"--version", "-version", "version"} {
		r := runDsync(t, flag)
		if r.code != 0 || !regexp.MustCompile(`^dsync (\(devel\)|v\S+)( .*)?\n$`).MatchString(r.stdout) || r.stderr != "" {
			t.Errorf("dsync %s: got status %d, stdout %q, stderr %q; want 0 and \"dsync (devel)\" or \"dsync vX.Y.Z\"", flag, r.code, r.stdout, r.stderr)
		}
	}
}

// TestVersionOf: the version of a build from a module version, and of one
// from a checkout with and without its revision recorded.
func TestVersionOf(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "f2937ee"}, {Key: "vcs.time", Value: "2025-01-02T03:04:05Z"}}
	for _, tt := range []struct {
		version  string
		settings []debug.BuildSetting
		want     string
	}{
		{"v1.2.3", vcs, "v1.2.3"},
		{"(devel)", nil, "(devel)"},
		{"", nil, "(devel)"},
		{"(devel)", vcs, "(devel) f2937ee 2025-01-02T03:04:05Z"},
		{"(devel)", append(vcs, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "(devel) f2937ee+dirty 2025-01-02T03:04:05Z"},
	} {
		info := &debug.BuildInfo{Main: debug.Module{Version: tt.version}, Settings: tt.settings}
		if got := versionOf(info); got != tt.want {
			t.Errorf("versionOf(%q, %v): got %q; want %q", tt.version, tt.settings, got, tt.want)
		}
	}
}

// TestErrText: the library's "dsync: " goes wherever the CLI's own prefix
// makes it a repetition, and nowhere else (not in a quoted lock name).
func TestErrText(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"dsync: invalid option: TTL 100ms", "invalid option: TTL 100ms"},
		{`dsync: unlock "x": dsync: lock not held`, `unlock "x": lock not held`},
		{`no session: dsync: connect: refused`, `no session: connect: refused`},
		{`dsync: unlock "a: dsync: \"b\": dsync: c": dsync: lock not held`, `unlock "a: dsync: \"b\": dsync: c": lock not held`},
		{"a dsync: b", "a dsync: b"},
	} {
		if got := errText(tt.in); got != tt.want {
			t.Errorf("errText(%q): got %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestWaitingLine: a dsync run that has to wait says so on stderr once,
// with the holder, also when stderr is a pipe (as under cron); -q and
// --quiet silence it.
func TestWaitingLine(t *testing.T) {
	name := lockName(t)
	if err := dsync.NewMutex(newSession(t, dsync.WithLabel("test-holder")), name).Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, quiet := range []string{"", "-q", "--quiet"} {
		r := runDsync(t, args([]string{"run", "--wait", "300ms"}, slices.DeleteFunc([]string{quiet}, func(s string) bool { return s == "" }), []string{name, "--", "true"})...)
		if r.code != exitNotObtained {
			t.Errorf("dsync run %s: exit status %d; want %d (stderr %q)", quiet, r.code, exitNotObtained, r.stderr)
		}
		want := 1
		if quiet != "" {
			want = 0
		}
		waiting := fmt.Sprintf("dsync: waiting for lock %q held by test-holder for ", name)
		if got := strings.Count(r.stderr, waiting); got != want || want == 1 && !strings.HasPrefix(r.stderr, waiting) {
			t.Errorf("dsync run %s: stderr %q: got %d lines %q; want %d, first", quiet, r.stderr, got, waiting, want)
		}
	}
}

// TestForcedReleaseIsLostHold: dsync release --force of the Mutex of a
// running dsync run is a lost hold, as a lost lease is: dsync stops the
// command (SIGTERM, then SIGKILL after --grace) when a look at the tables
// (every TTL/3) finds the lock released, or, when the command ends before
// that, finds out as it releases the lock; it says so, and exits 70
// either way.
func TestForcedReleaseIsLostHold(t *testing.T) {
	for _, tt := range []struct {
		name   string
		ttl    string
		script string // writes READY once running; exits once STOP exists
	}{
		{"noticed while the command runs", "1.5s",
			// Gives up after 5s or so: dsync should have stopped it by then.
			`trap 'echo TERM > MARKER; exit 0' TERM; echo $$ > READY; i=0; while [ ! -e STOP ] && [ $i -lt 250 ]; do sleep 0.02; i=$((i+1)); done`},
		{"noticed as the command ends", "15s",
			`echo $$ > READY; while [ ! -e STOP ]; do sleep 0.02; done; exit 3`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ready, marker, stop := filepath.Join(dir, "ready"), filepath.Join(dir, "marker"), filepath.Join(dir, "stop")
			name := lockName(t)
			d := startDsync(t, args([]string{"run", "--ttl", tt.ttl, name, "--"},
				script(tt.script, "READY", ready, "MARKER", marker, "STOP", stop))...)
			waitFile(t, ready)
			if r := runDsync(t, "release", "--force", name); r.code != 0 {
				t.Fatalf("dsync release --force: exit status %d; want 0 (stderr %q)", r.code, r.stderr)
			}
			if tt.ttl == "15s" {
				// Before the first look, TTL/3 after the command started.
				if err := os.WriteFile(stop, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				t.Cleanup(func() { os.WriteFile(stop, nil, 0o644) })
			}
			r := d.wait(t)
			t.Logf("dsync exited %d after %v: %q", r.code, r.took, r.stderr)
			if r.code != exitLeaseLost {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, exitLeaseLost, r.stderr)
			}
			if !strings.Contains(r.stderr, fmt.Sprintf("lock %q released by force", name)) &&
				!strings.Contains(r.stderr, fmt.Sprintf("lock %q was released by force", name)) {
				t.Errorf("stderr: got %q; want it to say the lock was released by force", r.stderr)
			}
			if got, _ := os.ReadFile(marker); tt.ttl != "15s" && strings.TrimSpace(string(got)) != "TERM" {
				t.Errorf("the command's SIGTERM trap: got marker %q; want TERM, the command stopped", got)
			}
			if tt.ttl == "15s" && !strings.Contains(r.stderr, "exited 3") {
				t.Errorf("stderr: got %q; want it to give the command's status, 3", r.stderr)
			}
		})
	}
}

// TestDriverLogSilenced: the MySQL driver's own log lines ("[mysql] ...
// closing bad idle connection: ...") do not reach dsync's stderr when the
// server closes dsync's connections under a running command: dsync run,
// on a database of its own, holds a lock while its connections are
// killed; its renewals and release go on on new ones.
func TestDriverLogSilenced(t *testing.T) {
	admin := dbtest.Open(t)
	db := fmt.Sprintf("dsync_drvlog_%d", time.Now().UnixNano())
	if _, err := admin.Exec("CREATE DATABASE " + db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("DROP DATABASE " + db) })
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = db
	dir := t.TempDir()
	ready, stop := filepath.Join(dir, "ready"), filepath.Join(dir, "stop")
	d := startDsync(t, args([]string{"run", "--dsn", cfg.FormatDSN(), "--ttl", "1.5s", lockName(t), "--"},
		script(`echo ok > READY; while [ ! -e STOP ]; do sleep 0.02; done`, "READY", ready, "STOP", stop))...)
	waitFile(t, ready)
	kill := func() int {
		rows, err := admin.Query("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?", db)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id))
		}
		return len(ids)
	}
	killed := kill()
	time.Sleep(time.Second) // two renewals, on new connections
	killed += kill()
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := d.wait(t)
	if killed == 0 {
		t.Fatalf("no connection of dsync was killed: the fault did not happen")
	}
	t.Logf("killed %d connections of dsync; it exited %d: %q", killed, r.code, r.stderr)
	if strings.Contains(r.stderr, "[mysql]") {
		t.Errorf("stderr: got %q; want no line of the driver's", r.stderr)
	}
}

// TestRunUnderAutocommitOff: a DSN that turns autocommit off must not make
// dsync run take its own live hold for a forced release. Its looks at the
// tables (LockHolders, every TTL/3) would otherwise read one snapshot, in
// which the lease's expires_at never moves: two looks past it found no
// hold, and dsync stopped the command and exited 70 (a reviewer's finding:
// exit 70 after 2.5s with --ttl 1.5s).
func TestRunUnderAutocommitOff(t *testing.T) {
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["autocommit"] = "0"
	r := runDsync(t, "run", "--dsn", cfg.FormatDSN(), "--ttl", "1s", lockName(t), "--", "sleep", "2")
	if r.code != 0 || strings.Contains(r.stderr, "released by force") {
		t.Fatalf("dsync run under autocommit=0: exit %d after %v, stderr %q; want 0, the command's", r.code, r.took, r.stderr)
	}
}

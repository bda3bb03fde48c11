package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestSignalForwarded sends SIGTERM, SIGINT and SIGHUP to dsync while the
// command runs: the command's trap sees the signal once and exits 7, and
// dsync exits with the command's status, then the lock is free.
func TestSignalForwarded(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			ready, marker := filepath.Join(dir, "ready"), filepath.Join(dir, "marker")
			name := lockName(t)
			trap := fmt.Sprintf(`trap 'echo %[1]s >> MARKER; exit 7' %[1]s; echo ok > READY; while :; do sleep 0.05; done`,
				strings.TrimPrefix(signalName(sig), "SIG"))
			d := startDsync(t, args([]string{"run", name, "--"}, script(trap, "READY", ready, "MARKER", marker))...)
			waitFile(t, ready)
			d.signal(t, sig)
			r := d.wait(t)
			if r.code != 7 {
				t.Errorf("exit status: got %d; want 7, the command's (stderr %q)", r.code, r.stderr)
			}
			got, _ := os.ReadFile(marker)
			if want := strings.TrimPrefix(signalName(sig), "SIG") + "\n"; string(got) != want {
				t.Errorf("the command's trap: got %q; want %q (the signal, once)", got, want)
			}
			if r := runDsync(t, "run", "-n", name, "--", "true"); r.code != 0 {
				t.Errorf("dsync run -n after the command ended: got status %d; want 0, the lock free (stderr %q)", r.code, r.stderr)
			}
		})
	}
}

// signalName returns the shell's name of sig.
func signalName(sig syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT", syscall.SIGHUP: "SIGHUP"}[sig]
}

// TestSignalEndsCommand: a command without a trap dies of the forwarded
// SIGTERM, and so does what it started (its process group); dsync exits
// 128+15 and the lock is free.
func TestSignalEndsCommand(t *testing.T) {
	dir := t.TempDir()
	ready, grandchild := filepath.Join(dir, "ready"), filepath.Join(dir, "grandchild")
	name := lockName(t)
	d := startDsync(t, args([]string{"run", name, "--"},
		script(`sleep 60 & echo $! > GRANDCHILD; echo ok > READY; wait`, "READY", ready, "GRANDCHILD", grandchild))...)
	waitFile(t, ready)
	var pid int
	if _, err := fmt.Sscan(waitFile(t, grandchild), &pid); err != nil {
		t.Fatal(err)
	}
	d.signal(t, syscall.SIGTERM)
	r := d.wait(t)
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, 128+int(syscall.SIGTERM), r.stderr)
	}
	waitFor(t, "the command's own child to die of the forwarded SIGTERM", func() bool {
		return syscall.Kill(pid, 0) == syscall.ESRCH
	})
	if r := runDsync(t, "run", "-n", name, "--", "true"); r.code != 0 {
		t.Errorf("dsync run -n after the command ended: got status %d; want 0 (stderr %q)", r.code, r.stderr)
	}
}

// TestSignalWhileWaiting sends SIGTERM to a dsync waiting for the lock: it
// stops waiting, leaves the line (for --fair) and exits 128+15 without
// running the command.
func TestSignalWhileWaiting(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	for _, kind := range []string{"mutex", "fair"} {
		t.Run(kind, func(t *testing.T) {
			name := lockName(t)
			var unlock func(context.Context) error
			flags := []string{"run"}
			if kind == "fair" {
				m := dsync.NewFairMutex(s, name)
				if err := m.Lock(bg); err != nil {
					t.Fatal(err)
				}
				unlock = m.Unlock
				flags = append(flags, "--fair")
			} else {
				m := dsync.NewMutex(s, name)
				if err := m.Lock(bg); err != nil {
					t.Fatal(err)
				}
				unlock = m.Unlock
			}
			defer unlock(bg)
			ran := filepath.Join(t.TempDir(), "ran")
			d := startDsync(t, args(flags, []string{name, "--", "touch", ran})...)
			// dsync waits: its FairMutex ticket, or its Mutex claim (after
			// 100ms of waiting), shows as a waiter.
			waitFor(t, "dsync to wait for the lock", func() bool {
				h, err := dsync.LockHolders(bg, db, "dsync_", name)
				return err == nil && len(h) == 1 && h[0].Waiters == 1
			})
			d.signal(t, syscall.SIGTERM)
			r := d.wait(t)
			if r.code != 128+int(syscall.SIGTERM) {
				t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, 128+int(syscall.SIGTERM), r.stderr)
			}
			if exists(ran) {
				t.Errorf("the command ran")
			}
			if kind == "fair" { // its ticket left with its session
				h, err := dsync.LockHolders(bg, db, "dsync_", name)
				if err != nil || len(h) != 1 || h[0].Waiters != 0 {
					t.Errorf("LockHolders after dsync exited: got %+v, %v; want the test's hold, without waiters", h, err)
				}
			}
		})
	}
}

// TestReleasedAfterCommand: once the command has ended, however it ended,
// the lock is free at once.
func TestReleasedAfterCommand(t *testing.T) {
	for _, tt := range []struct {
		name  string
		flags []string
		cmd   string
	}{
		{"mutex exit 0", nil, "exit 0"},
		{"mutex exit 1", nil, "exit 1"},
		{"mutex killed", nil, "kill -KILL $$"},
		{"fair", []string{"--fair"}, "exit 0"},
		{"write", []string{"--write"}, "exit 3"},
		{"read", []string{"--read"}, "exit 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			name := lockName(t)
			runDsync(t, args([]string{"run"}, tt.flags, []string{name, "--", "sh", "-c", tt.cmd})...)
			start := time.Now()
			want := []string{"--write"} // the exclusive side of the queued lock, for the queued kinds
			if tt.flags == nil {
				want = nil
			}
			if r := runDsync(t, args([]string{"run", "-n"}, want, []string{name, "--", "true"})...); r.code != 0 {
				t.Errorf("dsync run -n after the first ended: got status %d; want 0 (stderr %q)", r.code, r.stderr)
			}
			t.Logf("second run took %v", time.Since(start))
		})
	}
}

// TestSignalWhileConnecting sends SIGTERM to a dsync connecting to a
// server that accepts and never answers: it exits 128+15 at once, well
// before its --connect-timeout.
func TestSignalWhileConnecting(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		defer close(accepted)
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	ran := filepath.Join(t.TempDir(), "ran")
	d := startDsync(t, "run", "--connect-timeout", "50s", "--dsn", "root@tcp("+silent.Addr().String()+")/x",
		lockName(t), "--", "touch", ran)
	var c net.Conn
	select {
	case c = <-accepted:
	case <-time.After(limit):
		t.Fatal("dsync did not connect")
	}
	d.signal(t, syscall.SIGTERM)
	r := d.wait(t)
	silent.Close()
	c.Close()
	for c := range accepted {
		c.Close()
	}
	if r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, 128+int(syscall.SIGTERM), r.stderr)
	}
	if r.took > 40*time.Second {
		t.Errorf("dsync exited after %v; want well before its --connect-timeout of 50s", r.took)
	}
	if exists(ran) {
		t.Errorf("the command ran")
	}
}

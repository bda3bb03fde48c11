package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// The tests build the dsync binary once and run it as a user would, with
// os/exec, against the real server of internal/dbtest.

var binary string // path of the dsync binary built by TestMain

func TestMain(m *testing.M) {
	// Run under nohup, the tests inherit SIGHUP ignored, and so would
	// every dsync they start: dsync rightly relays no signal its parent
	// ignores, and TestSignalForwarded's SIGHUP would hang. A signal this
	// process catches starts at its default in the processes it execs.
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
	dir, err := os.MkdirTemp("", "dsync-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "dsync")
	if err := build(binary); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	stop, err := dbtest.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		stop()
		os.RemoveAll(dir)
	}))
}

// build builds the command into path, with the race detector when the
// tests run with it.
func build(path string) error {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	args := []string{"build", "-o", path}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goCmd, append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build of dsync: %v\n%s", err, out)
	}
	return nil
}

// limit bounds every run of the binary: a dsync that hangs fails the test
// instead of the whole run.
const limit = 60 * time.Second

// dsyncCmd returns the command that runs the binary with args, with
// DSYNC_DSN set to the test database and its output captured.
func dsyncCmd(args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(binary, args...)
	cmd.Env = dsyncEnv()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	return cmd, &out, &errOut
}

// dsyncEnv returns the environment of dsync in the tests: DSYNC_DSN set
// to the test database, and a race-built dsync that stops at its first
// race and does not wait 1s before exiting (the race detector's default).
func dsyncEnv() []string {
	return append(os.Environ(), envDSN+"="+dbtest.DSN(), "GORACE=halt_on_error=1 atexit_sleep_ms=0")
}

// result is how a run of the binary ended.
type result struct {
	code           int // exit status
	stdout, stderr string
	took           time.Duration
}

// proc is a running dsync.
type proc struct {
	cmd         *exec.Cmd
	out, errOut *bytes.Buffer
	start       time.Time
	done        chan result
}

// startDsync starts the binary with args; wait returns how it ended.
func startDsync(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd, out, errOut := dsyncCmd(args...)
	return startCmd(t, cmd, out, errOut)
}

func startCmd(t *testing.T, cmd *exec.Cmd, out, errOut *bytes.Buffer) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: out, errOut: errOut, start: time.Now(), done: make(chan result, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dsync %q: %v", cmd.Args[1:], err)
	}
	go func() {
		err := cmd.Wait()
		r := result{code: cmd.ProcessState.ExitCode(), took: time.Since(p.start)}
		var exitErr *exec.ExitError
		if err != nil && !errors.As(err, &exitErr) {
			r.code = -2
		}
		if out != nil {
			r.stdout, r.stderr = out.String(), errOut.String()
		}
		p.done <- r
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for p to end, for at most limit.
func (p *proc) wait(t *testing.T) result {
	t.Helper()
	select {
	case r := <-p.done:
		p.done <- r // for the cleanup
		if strings.Contains(r.stderr, "DATA RACE") {
			t.Errorf("dsync %q: the race detector found a race:\n%s", p.cmd.Args[1:], r.stderr)
		}
		return r
	case <-time.After(limit):
		// SIGQUIT: the Go runtime writes every goroutine's stack to
		// stderr and exits, which says where dsync hung.
		p.cmd.Process.Signal(syscall.SIGQUIT)
		var stacks string
		select {
		case r := <-p.done:
			p.done <- r // for the cleanup
			stacks = r.stderr
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
		}
		t.Fatalf("dsync %q still running after %v; its stderr after SIGQUIT:\n%s", p.cmd.Args[1:], limit, stacks)
		return result{}
	}
}

// signal sends sig to the dsync process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to dsync: %v", sig, err)
	}
}

// runDsync runs the binary with args to its end.
func runDsync(t *testing.T, args ...string) result {
	t.Helper()
	return startDsync(t, args...).wait(t)
}

// lockName returns a lock name unique to the test.
func lockName(t *testing.T) string {
	return fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano())
}

// newSession returns a session on the test database, closed when the test
// ends.
func newSession(t *testing.T, opts ...dsync.Option) *dsync.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, dbtest.Open(t), opts...)
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitFile waits until the file at path exists and is not empty, for at
// most limit, and returns its contents.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still missing or empty after %v", path, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readLines returns the lines of the file at path.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// waitFor polls cond every 10ms until it holds, for at most limit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// script returns a sh command line: sh -c text, with the words of text
// replaced by the pairs of replacements (file paths, typically), quoted.
func script(text string, replacements ...string) []string {
	for i := 0; i+1 < len(replacements); i += 2 {
		text = strings.ReplaceAll(text, replacements[i], shQuote(replacements[i+1]))
	}
	return []string{"sh", "-c", text}
}

// shQuote quotes s for sh.
func shQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// args joins argument lists.
func args(lists ...[]string) []string {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

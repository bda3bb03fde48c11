// Command testlog runs go test with -json and prints one line per
// top-level test as it ends, one per package, and the whole output of
// every test and package that failed, so that make test shows progress
// while a package runs for minutes (go test prints a package's lines only
// when the package ends).
//
// Usage:
//
//	go run ./internal/cmd/testlog GO-COMMAND... test -json [FLAGS] [PACKAGES]
//
// It runs its arguments as the command (so a make variable such as
// GO='env GOTOOLCHAIN=go1.24.13 go' keeps working), and exits with the
// command's status, or 1 when the command exited 0 but a test or a build
// failed: no failure is lost in a pipe. The command's standard error, and
// lines of its output that are not JSON, are passed through. When nothing
// has been printed for 30s, it names the tests still running.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// quiet is how long testlog stays silent before it names the tests still
// running.
const quiet = 30 * time.Second

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testlog GO-COMMAND... test -json [FLAGS] [PACKAGES]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(1)
	}
	// Ctrl-C reaches go test too (same process group): let it end and
	// report, rather than die first and lose its last lines.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(1)
	}
	l := newLog(os.Stdout)
	stop := make(chan struct{})
	go l.heartbeat(stop, time.Now)
	l.read(stdout)
	close(stop)
	err = cmd.Wait()
	failed := l.finish()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(max(exit.ExitCode(), 1))
	case err != nil:
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(1)
	case failed:
		os.Exit(1)
	}
}

// event is one line of go test -json (cmd/test2json), with the build
// events of Go 1.24 and later (ImportPath, build-output, build-fail).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// testLog turns go test -json events into lines. Its methods are safe for
// concurrent use (the heartbeat runs beside read).
type testLog struct {
	mu      sync.Mutex
	w       io.Writer
	last    time.Time            // guarded by mu; when a line was last written
	output  map[string][]string  // guarded by mu; output of running tests and packages, by key
	running map[string]time.Time // guarded by mu; top-level tests running, by key, since
	failed  bool                 // guarded by mu; a test, package or build failed
}

func newLog(w io.Writer) *testLog {
	return &testLog{w: w, last: time.Now(), output: make(map[string][]string), running: make(map[string]time.Time)}
}

// key names a top-level test of a package ("pkg TestX"), or the package
// itself when test is empty.
func key(pkg, test string) string {
	if i := strings.IndexByte(test, '/'); i >= 0 {
		test = test[:i]
	}
	if test == "" {
		return pkg
	}
	return pkg + " " + test
}

// read handles every line of r until it ends.
func (l *testLog) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			l.print(string(line) + "\n")
			continue
		}
		l.handle(e)
	}
	if err := sc.Err(); err != nil {
		l.print("testlog: " + err.Error() + "\n")
		l.mu.Lock()
		l.failed = true
		l.mu.Unlock()
	}
}

// handle prints what event e ends, and keeps the output of what runs.
func (l *testLog) handle(e event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key(e.Package, e.Test)
	top := e.Test != "" && !strings.Contains(e.Test, "/")
	switch e.Action {
	case "build-output":
		l.printLocked(e.Output)
	case "build-fail":
		l.failed = true
	case "run":
		if top {
			l.running[k] = e.Time
		}
	case "output":
		l.output[k] = append(l.output[k], e.Output)
	case "pass", "skip", "fail":
		if e.Action == "fail" {
			l.failed = true
		}
		switch {
		case e.Test == "":
			l.packageEnded(e)
		case top:
			delete(l.running, k)
			status := map[string]string{"pass": "ok  ", "skip": "skip", "fail": "FAIL"}[e.Action]
			if e.Action == "fail" {
				l.printLocked(strings.Join(l.output[k], ""))
			}
			l.printLocked(fmt.Sprintf("%s %s %s (%.2fs)\n", status, e.Package, e.Test, e.Elapsed))
			delete(l.output, k)
		}
	}
}

// packageEnded prints the package's summary, and on failure the output
// the package printed outside its tests (TestMain, goleak, a panic, a
// timeout), with that of tests that never ended.
func (l *testLog) packageEnded(e event) {
	out := l.output[e.Package]
	delete(l.output, e.Package)
	if e.Action == "fail" {
		prefix := e.Package + " "
		var open []string
		for k := range l.output {
			if strings.HasPrefix(k, prefix) {
				open = append(open, k)
			}
		}
		sort.Strings(open)
		for _, k := range open {
			l.printLocked(strings.Join(l.output[k], ""))
			delete(l.output, k)
		}
		l.printLocked(strings.Join(out, ""))
	} else {
		// The package's last line: "ok  pkg 1.2s" or "?  pkg [no test files]".
		for i := len(out) - 1; i >= 0; i-- {
			if s := out[i]; strings.HasPrefix(s, "ok") || strings.HasPrefix(s, "?") {
				l.printLocked(s)
				break
			}
		}
	}
	for k := range l.running {
		if strings.HasPrefix(k, e.Package+" ") {
			delete(l.running, k)
		}
	}
}

// heartbeat names the running tests whenever nothing has been printed for
// quiet, until stop closes.
func (l *testLog) heartbeat(stop <-chan struct{}, now func() time.Time) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		if n := now(); n.Sub(l.last) >= quiet {
			var names []string
			for k, since := range l.running {
				names = append(names, fmt.Sprintf("%s (%.0fs)", k, n.Sub(since).Seconds()))
			}
			sort.Strings(names)
			if len(names) == 0 {
				names = []string{"(building, or between tests)"}
			}
			l.printLocked("... running: " + strings.Join(names, ", ") + "\n")
		}
		l.mu.Unlock()
	}
}

// finish prints the output of anything that never ended (the command
// died), and reports whether anything failed.
func (l *testLog) finish() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var open []string
	for k := range l.output {
		open = append(open, k)
	}
	sort.Strings(open)
	for _, k := range open {
		l.printLocked(strings.Join(l.output[k], ""))
	}
	return l.failed || len(l.running) > 0
}

func (l *testLog) print(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.printLocked(s)
}

func (l *testLog) printLocked(s string) {
	if s == "" {
		return
	}
	io.WriteString(l.w, s)
	l.last = time.Now()
}

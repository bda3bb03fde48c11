package dsync_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// Tests that need several OS processes re-run this test binary with
// childEnv set; TestMain then runs the named role instead of the tests.
const childEnv = "DSYNC_TEST_CHILD"

// childConfig is what a child process is told through its environment.
type childConfig struct {
	Role       string
	DSN        string
	Name       string        // lock name
	Table      string        // counter table (role "counter")
	Goroutines int           // goroutines per process
	Iterations int           // lock acquisitions per goroutine
	TTL        time.Duration // session TTL
	Kind       string        // "fair" or "rw" (role "driver"); "fair" or "" for a Mutex (role "hold")
}

func (c childConfig) env() []string {
	return append(os.Environ(),
		childEnv+"="+c.Role,
		"DSYNC_CHILD_DSN="+c.DSN,
		"DSYNC_CHILD_NAME="+c.Name,
		"DSYNC_CHILD_TABLE="+c.Table,
		"DSYNC_CHILD_GOROUTINES="+strconv.Itoa(c.Goroutines),
		"DSYNC_CHILD_ITERATIONS="+strconv.Itoa(c.Iterations),
		"DSYNC_CHILD_TTL="+c.TTL.String(),
		"DSYNC_CHILD_KIND="+c.Kind,
	)
}

func childConfigFromEnv(role string) childConfig {
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	ttl, _ := time.ParseDuration(os.Getenv("DSYNC_CHILD_TTL"))
	return childConfig{
		Role:       role,
		DSN:        os.Getenv("DSYNC_CHILD_DSN"),
		Name:       os.Getenv("DSYNC_CHILD_NAME"),
		Table:      os.Getenv("DSYNC_CHILD_TABLE"),
		Goroutines: atoi("DSYNC_CHILD_GOROUTINES"),
		Iterations: atoi("DSYNC_CHILD_ITERATIONS"),
		TTL:        ttl,
		Kind:       os.Getenv("DSYNC_CHILD_KIND"),
	}
}

// child is a running child process with its standard input and output.
type child struct {
	*exec.Cmd
	out *bufio.Reader
	in  io.WriteCloser
}

// startChild starts a child process; it is killed (if still running) and
// waited for when the test ends.
func startChild(t testing.TB, c childConfig) *child {
	t.Helper()
	if c.DSN == "" {
		c.DSN = dbtest.DSN()
	}
	if c.TTL == 0 {
		c.TTL = dsync.DefaultTTL
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = c.env()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	t.Cleanup(func() {
		in.Close()
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &child{Cmd: cmd, out: bufio.NewReader(out), in: in}
}

// expectLine reads one line from a child and fails unless it is want.
func expectLine(t testing.TB, r *bufio.Reader, want string) {
	t.Helper()
	line, err := r.ReadString('\n')
	if got := strings.TrimSpace(line); got != want || err != nil {
		t.Fatalf("child said %q (%v); want %q", got, err, want)
	}
}

func runChild(role string) int {
	c := childConfigFromEnv(role)
	var err error
	switch role {
	case "counter":
		err = childCounter(c)
	case "hold", "wait":
		err = childHold(c)
	case "churn":
		err = childChurn(c)
	case "driver":
		err = childDriver(c)
	case "rwcheck":
		err = childRWCheck(c)
	case "fencedholder":
		err = childFencedHolder(c)
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s (pid %d): %v\n", role, os.Getpid(), err)
		return 1
	}
	return 0
}

// childSession opens the child's database and session; closeAll closes
// both.
func childSession(c childConfig) (db *sql.DB, s *dsync.Session, closeAll func(), err error) {
	db, err = sql.Open("mysql", c.DSN)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err = dsync.NewSession(context.Background(), db, dsync.WithTTL(c.TTL))
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	return db, s, func() { s.Close(); db.Close() }, nil
}

// childCounter increments the counter row of c.Table by read-modify-write
// under the lock, from c.Goroutines goroutines, and logs each increment with
// its fence.
func childCounter(c childConfig) error {
	db, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	m := dsync.NewMutex(s, c.Name)
	ctx := context.Background()
	return inParallel(c.Goroutines, c.Iterations, func() error { return increment(ctx, db, m, c.Table) })
}

// inParallel runs f iterations times in each of n goroutines and returns
// the first error.
func inParallel(n, iterations int, f func() error) error {
	var g errgroup.Group
	for range n {
		g.Go(func() error {
			for range iterations {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// increment is one critical section: read the counter, write it back plus
// one, log the fence, through connections of db (not the session's).
func increment(ctx context.Context, db *sql.DB, m *dsync.Mutex, table string) error {
	if err := m.Lock(ctx); err != nil {
		return err
	}
	var v int64
	err := db.QueryRowContext(ctx, "SELECT value FROM "+table+" WHERE id = 1").Scan(&v)
	if err == nil {
		_, err = db.ExecContext(ctx, "UPDATE "+table+" SET value = ? WHERE id = 1", v+1)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "INSERT INTO "+table+"_log (fence, value) VALUES (?, ?)", m.Fence(), v+1)
	}
	if uerr := m.Unlock(ctx); err == nil {
		err = uerr
	}
	return err
}

// childHold takes the lock (a FairMutex when c.Kind is "fair", else a
// Mutex), says "locked" and waits to be killed. In role "wait" it first
// says its session's lease id (to be killed while it waits).
func childHold(c childConfig) error {
	_, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	if c.Role == "wait" {
		fmt.Println(s.ID())
	}
	lock := dsync.NewMutex(s, c.Name).Lock
	if c.Kind == "fair" {
		lock = dsync.NewFairMutex(s, c.Name).Lock
	}
	if err := lock(context.Background()); err != nil {
		return err
	}
	fmt.Println("locked")
	time.Sleep(time.Hour)
	return nil
}

// childChurn says "ready", waits for a line on stdin, then locks and
// unlocks c.Iterations times from c.Goroutines goroutines.
func childChurn(c childConfig) error {
	_, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	m := dsync.NewMutex(s, c.Name)
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	ctx := context.Background()
	return inParallel(c.Goroutines, c.Iterations, func() error {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		return m.Unlock(ctx)
	})
}

// Command workers is dsync's demo: several OS processes, each with several
// goroutines, increment one shared counter row by read-modify-write under
// one dsync.Mutex, and the parent checks that no increment was lost and that
// the fences were strictly increasing in commit order.
//
//	go run ./examples/workers            # starts a throwaway MariaDB
//	go run ./examples/workers -dsn 'user:pw@tcp(127.0.0.1:3306)/db'
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"golang.org/x/sync/errgroup"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/mariadb"
)

const (
	lockName = "demo-counter"
	counter  = "demo_counter"
	fenceLog = "demo_fence_log"
)

type config struct {
	dsn        string
	procs      int
	goroutines int
	duration   time.Duration
	child      bool
}

// report is what a child process prints when it is done.
type report struct {
	Acquisitions int64  `json:"acquisitions"`
	Error        string `json:"error,omitempty"`
}

func main() {
	var c config
	flag.StringVar(&c.dsn, "dsn", os.Getenv("DSYNC_DSN"), "go-sql-driver DSN; empty starts a throwaway MariaDB")
	flag.IntVar(&c.procs, "procs", 4, "worker processes")
	flag.IntVar(&c.goroutines, "goroutines", 4, "goroutines per process")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long the workers run")
	flag.BoolVar(&c.child, "child", false, "run as a worker process (used by the parent)")
	flag.Parse()
	if c.child {
		os.Exit(child(c))
	}
	if err := parent(c); err != nil {
		fmt.Fprintln(os.Stderr, "workers:", err)
		os.Exit(1)
	}
}

func parent(c config) error {
	if c.procs < 1 || c.goroutines < 1 || c.duration <= 0 {
		return errors.New("-procs, -goroutines and -duration must be positive")
	}
	ctx := context.Background()
	where := "your server"
	if c.dsn == "" {
		fmt.Println("starting a throwaway MariaDB in a temporary directory...")
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		server, err := mariadb.Start(startCtx)
		cancel()
		if err != nil {
			return err
		}
		defer server.Stop()
		if err := createDatabase(ctx, server.DSN(""), "dsync_demo"); err != nil {
			return err
		}
		c.dsn = server.DSN("dsync_demo")
		where = fmt.Sprintf("throwaway MariaDB on 127.0.0.1:%d", server.Port())
	}
	db, err := sql.Open("mysql", c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{
		"DROP TABLE IF EXISTS " + counter + ", " + fenceLog,
		"CREATE TABLE " + counter + " (id INT PRIMARY KEY, value BIGINT NOT NULL)",
		"INSERT INTO " + counter + " VALUES (1, 0)",
		"CREATE TABLE " + fenceLog + " (seq BIGINT AUTO_INCREMENT PRIMARY KEY, fence BIGINT NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	var version string
	_ = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version)
	fmt.Printf("%d processes x %d goroutines, one dsync.Mutex %q, %v, %s (%s)\n",
		c.procs, c.goroutines, lockName, c.duration, where, version)

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	reports := make([]report, c.procs)
	var wg sync.WaitGroup
	start := time.Now()
	for p := 0; p < c.procs; p++ {
		cmd := exec.Command(exe, "-child", "-dsn", c.dsn, "-goroutines", strconv.Itoa(c.goroutines), "-duration", c.duration.String())
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := json.NewDecoder(bufio.NewReader(out)).Decode(&reports[p]); err != nil {
				reports[p].Error = "no report: " + err.Error()
			}
			if err := cmd.Wait(); err != nil && reports[p].Error == "" {
				reports[p].Error = err.Error()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	var total int64
	failed := false
	for p, r := range reports {
		fmt.Printf("  process %d: %d acquisitions", p+1, r.Acquisitions)
		if r.Error != "" {
			fmt.Printf(" (error: %s)", r.Error)
			failed = true
		}
		fmt.Println()
		total += r.Acquisitions
	}
	fmt.Printf("acquisitions: %d in %v, %.0f handoffs/s\n", total, elapsed.Round(time.Millisecond), float64(total)/c.duration.Seconds())

	var value int64
	if err := db.QueryRowContext(ctx, "SELECT value FROM "+counter+" WHERE id = 1").Scan(&value); err != nil {
		return err
	}
	ok := value == total
	fmt.Printf("counter: %d, expected %d: %s\n", value, total, verdict(ok))
	failed = failed || !ok

	n, increasing, err := checkFences(ctx, db)
	if err != nil {
		return err
	}
	fmt.Printf("fences strictly increasing in commit order (%d fences): %s\n", n, verdict(increasing && n == total))
	failed = failed || !increasing || n != total
	if failed {
		return errors.New("demo failed")
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "OK"
	}
	return "FAILED"
}

func createDatabase(ctx context.Context, dsn, name string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+name)
	return err
}

// checkFences reads the fence log in commit order and reports how many
// fences there are and whether each is greater than the one before.
func checkFences(ctx context.Context, db *sql.DB) (int64, bool, error) {
	rows, err := db.QueryContext(ctx, "SELECT fence FROM "+fenceLog+" ORDER BY seq")
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	var n, last int64
	increasing := true
	for rows.Next() {
		var f int64
		if err := rows.Scan(&f); err != nil {
			return 0, false, err
		}
		if f <= last {
			increasing = false
		}
		n, last = n+1, f
	}
	return n, increasing, rows.Err()
}

// child runs c.goroutines workers for c.duration and prints its report.
func child(c config) int {
	r := report{}
	err := work(c, &r.Acquisitions)
	if err != nil {
		r.Error = err.Error()
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	if err != nil {
		return 1
	}
	return 0
}

func work(c config, acquisitions *int64) error {
	db, err := sql.Open("mysql", c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	session, err := dsync.NewSession(ctx, db)
	if err != nil {
		return err
	}
	defer session.Close()
	m := dsync.NewMutex(session, lockName)

	var mu sync.Mutex // guards *acquisitions
	var g errgroup.Group
	deadline := time.Now().Add(c.duration)
	for range c.goroutines {
		g.Go(func() error {
			for time.Now().Before(deadline) {
				if err := increment(ctx, db, m); err != nil {
					return err
				}
				mu.Lock()
				*acquisitions++
				mu.Unlock()
			}
			return nil
		})
	}
	return g.Wait()
}

// increment is the critical section: read the counter, write it back plus
// one, and log the fence, on connections that are not the lock's.
func increment(ctx context.Context, db *sql.DB, m *dsync.Mutex) error {
	if err := m.Lock(ctx); err != nil {
		return err
	}
	var v int64
	err := db.QueryRowContext(ctx, "SELECT value FROM "+counter+" WHERE id = 1").Scan(&v)
	if err == nil {
		_, err = db.ExecContext(ctx, "UPDATE "+counter+" SET value = ? WHERE id = 1", v+1)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "INSERT INTO "+fenceLog+" (fence) VALUES (?)", m.Fence())
	}
	return errors.Join(err, m.Unlock(ctx))
}

package dsync_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
)

// childDriver runs queued lock operations on command from stdin, one
// goroutine per operation id, and reports on stdout:
//
//	lock N / rlock N   take the write / read side; log N in c.Table; say "acquired N"
//	release N          release what N holds; say "released N"
//	cancel N           cancel N's wait; N says "cancelled N"
//	pass N             lock, log N, unlock at once; say "done N"
func childDriver(c childConfig) error {
	db, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	type op struct {
		cancel  context.CancelFunc
		release chan struct{}
	}
	ops := map[string]*op{}
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 2 {
			return fmt.Errorf("bad command %q", in.Text())
		}
		cmd, id := f[0], f[1]
		switch cmd {
		case "lock", "rlock", "pass":
			ctx, cancel := context.WithCancel(context.Background())
			o := &op{cancel: cancel, release: make(chan struct{})}
			ops[id] = o
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer cancel()
				lock, unlock := queuedOps(s, c, cmd == "rlock")
				if err := lock(ctx); err != nil {
					if errors.Is(err, context.Canceled) {
						say("cancelled %s", id)
					} else {
						say("error %s %v", id, err)
					}
					return
				}
				if _, err := db.Exec("INSERT INTO "+c.Table+" (id) VALUES (?)", id); err != nil {
					say("error %s %v", id, err)
				}
				if cmd == "pass" {
					if err := unlock(context.Background()); err != nil {
						say("error %s %v", id, err)
						return
					}
					say("done %s", id)
					return
				}
				say("acquired %s", id)
				<-o.release
				if err := unlock(context.Background()); err != nil {
					say("error %s %v", id, err)
					return
				}
				say("released %s", id)
			}()
		case "release":
			close(ops[id].release)
		case "cancel":
			ops[id].cancel()
		default:
			return fmt.Errorf("bad command %q", cmd)
		}
	}
	wg.Wait()
	return in.Err()
}

// queuedOps returns the lock and unlock functions of the child's kind.
func queuedOps(s *dsync.Session, c childConfig, read bool) (lock, unlock func(context.Context) error) {
	if c.Kind == "fair" {
		m := dsync.NewFairMutex(s, c.Name)
		return m.Lock, m.Unlock
	}
	rw := dsync.NewRWMutex(s, c.Name)
	if read {
		return rw.RLock, rw.RUnlock
	}
	return rw.Lock, rw.Unlock
}

// driver is a child process running childDriver, with its reports.
type driver struct {
	*child
	events chan string
}

func startDriver(t *testing.T, c childConfig) *driver {
	c.Role = "driver"
	d := &driver{child: startChild(t, c), events: make(chan string, 100)}
	go func() {
		defer close(d.events)
		for {
			line, err := d.out.ReadString('\n')
			if line = strings.TrimSpace(line); line != "" {
				d.events <- line
			}
			if err != nil {
				return
			}
		}
	}()
	return d
}

func (d *driver) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(d.in, cmd); err != nil {
		t.Fatalf("send %q: %v", cmd, err)
	}
}

// expect waits for the driver's next report and fails unless it is want.
func (d *driver) expect(t *testing.T, want string, within time.Duration) {
	t.Helper()
	select {
	case got, ok := <-d.events:
		if !ok || got != want {
			t.Fatalf("driver said %q; want %q", got, want)
		}
	case <-time.After(within):
		t.Fatalf("driver did not say %q within %v", want, within)
	}
}

// quiet fails if the driver reports anything within d.
func (d *driver) quiet(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case got := <-d.events:
		t.Fatalf("driver said %q; want nothing yet", got)
	case <-time.After(within):
	}
}

// waitTickets waits until name has n tickets in the line (held or waiting),
// a holder of the head slot counted as one.
func waitTickets(t *testing.T, db *sql.DB, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int
		if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder <> 0)
  + (SELECT COUNT(*) FROM dsync_queue WHERE name = ? AND holder <> 0)`, name, name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tickets of %q: got %d; want %d", name, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// orderLog creates a table the drivers log acquisitions to.
func orderLog(t *testing.T, db *sql.DB) string {
	t.Helper()
	table := fmt.Sprintf("order_%d", time.Now().UnixNano())
	if _, err := db.Exec("CREATE TABLE " + table + " (seq BIGINT AUTO_INCREMENT PRIMARY KEY, id VARCHAR(20) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return table
}

func readLog(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query("SELECT id FROM " + table + " ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// childRWCheck does c.Iterations random reads and writes per goroutine
// under the RWMutex, checking in c.Table that no reader overlaps a writer
// and no two writers overlap. Reads are four in five.
func childRWCheck(c childConfig) error {
	db, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	rw := dsync.NewRWMutex(s, c.Name)
	ctx := context.Background()
	return inParallel(c.Goroutines, c.Iterations, func() error {
		if rand.IntN(5) == 0 {
			return checkedWrite(ctx, db, rw, c.Table)
		}
		return checkedRead(ctx, db, rw, c.Table)
	})
}

func checkedRead(ctx context.Context, db *sql.DB, rw *dsync.RWMutex, table string) error {
	if err := rw.RLock(ctx); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, "UPDATE "+table+" SET readers = readers + 1, max_readers = GREATEST(max_readers, readers), ops = ops + 1 WHERE id = 1")
	var writers int
	if err == nil {
		err = db.QueryRowContext(ctx, "SELECT writers FROM "+table+" WHERE id = 1").Scan(&writers)
	}
	if err == nil && writers != 0 {
		_, err = db.ExecContext(ctx, "UPDATE "+table+" SET violations = violations + 1 WHERE id = 1")
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "UPDATE "+table+" SET readers = readers - 1 WHERE id = 1")
	}
	return errors.Join(err, rw.RUnlock(ctx))
}

func checkedWrite(ctx context.Context, db *sql.DB, rw *dsync.RWMutex, table string) error {
	if err := rw.Lock(ctx); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, "UPDATE "+table+" SET writers = writers + 1, ops = ops + 1, writes = writes + 1 WHERE id = 1")
	var readers, writers int
	if err == nil {
		err = db.QueryRowContext(ctx, "SELECT readers, writers FROM "+table+" WHERE id = 1").Scan(&readers, &writers)
	}
	if err == nil && (readers != 0 || writers != 1) {
		_, err = db.ExecContext(ctx, "UPDATE "+table+" SET violations = violations + 1 WHERE id = 1")
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "UPDATE "+table+" SET writers = writers - 1 WHERE id = 1")
	}
	return errors.Join(err, rw.Unlock(ctx))
}

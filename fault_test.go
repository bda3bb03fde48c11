package dsync_test

// Fault tests: a paused holder, a slow network from the start, a lost reply
// to Unlock, a black-holed network under a waiting Lock, a cut that loses
// sessions, and a lease lost while a Lock is in flight. Each test first
// proves that its fault really happened (a process state, the proxy's
// counters, a closed channel), then asserts the guarantee, and bounds its
// own time.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// faultSession opens a session with the given TTL on db, within 30s, and
// closes it when the test ends.
func faultSession(t *testing.T, db *sql.DB, ttl time.Duration) *dsync.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, db, dsync.WithTTL(ttl))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// faultLock is what Mutex and FairMutex have in common.
type faultLock interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) (bool, error)
	Unlock(ctx context.Context) error
	Fence() int64
}

// faultKinds are the lock kinds the table-driven fault tests run over.
var faultKinds = []string{"Mutex", "FairMutex"}

func newFaultLock(kind string, s *dsync.Session, name string) faultLock {
	if kind == "FairMutex" {
		return dsync.NewFairMutex(s, name)
	}
	return dsync.NewMutex(s, name)
}

// within runs f in a goroutine and returns its error and how long it took.
// It fails the test when f has not returned after limit; f is then left to
// end when the test's cleanups close what it waits on.
func within(t *testing.T, what string, limit time.Duration, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		return time.Since(start), err
	case <-time.After(limit):
		t.Fatalf("%s: still running after %v", what, limit)
		return 0, nil
	}
}

// callResult is what a call returned, and after how long (-1: it did not
// return).
type callResult struct {
	err  error
	took time.Duration
}

func (r callResult) String() string {
	if r.took < 0 {
		return "did not return"
	}
	return fmt.Sprintf("returned after %v: %v", r.took, r.err)
}

// isClosed reports whether ch is closed, waiting for it at most wait.
func isClosed(ch <-chan struct{}, wait time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(wait):
		return false
	}
}

// faultLogWriter writes a session's log lines to the test log. A session
// using it must be closed before the test ends, by a t.Cleanup.
type faultLogWriter struct{ t *testing.T }

func (w faultLogWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// fencedWrite is a write to a resource that checks fences: it updates the
// resource row only when fence is greater than that of the last write, and
// returns how many rows it changed (1: accepted; 0: refused).
func fencedWrite(ctx context.Context, db *sql.DB, table string, fence int64, owner string) (int64, error) {
	res, err := db.ExecContext(ctx, "UPDATE "+table+" SET fence = ?, owner = ? WHERE id = 1 AND fence < ?", fence, owner, fence)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// procState returns the state letter of process pid from /proc/pid/stat
// ('T' when stopped by a signal).
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// "pid (comm) S ...": comm may contain anything, so look after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return b[i+2], nil
}

// waitProcState waits up to 2s for process pid to be (or, with not set, to
// leave) state.
func waitProcState(t *testing.T, pid int, state byte, not bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		got, err := procState(pid)
		if err != nil {
			t.Fatal(err)
		}
		if (got == state) != not {
			return
		}
		if time.Now().After(deadline) {
			if not {
				t.Fatalf("child state: got %c; want anything but %c", got, state)
			}
			t.Fatalf("child state: got %c; want %c", got, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// childLines returns the lines the child writes on its standard output.
// The child is killed when the test ends, which ends the reading goroutine.
func childLines(t *testing.T, c *child) <-chan string {
	lines := make(chan string, 16)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		for {
			line, err := c.out.ReadString('\n')
			if line != "" {
				select {
				case lines <- strings.TrimSpace(line):
				case <-stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// This runs before startChild's cleanup, which waits for the child:
	// the pipe must be read to its end first.
	t.Cleanup(func() {
		_ = c.Process.Kill()
		close(stop)
		<-done
	})
	return lines
}

// nextLine returns the child's next line, split into its first word and
// the rest, waiting at most 10s.
func nextLine(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("child ended before saying %q", want)
		}
		word, rest, _ := strings.Cut(line, " ")
		if word != want {
			t.Fatalf("child said %q; want a line starting with %q", line, want)
		}
		return rest
	case <-time.After(10 * time.Second):
		t.Fatalf("child did not say %q within 10s", want)
		return ""
	}
}

// childFencedHolder (role "fencedholder") locks c.Name, writes the fenced
// resource c.Table with its fence and says "locked FENCE ROWS". After a line
// on its standard input it tries the fenced write again ("write ROWS"),
// unlocks ("unlock EXPIRED ERR", EXPIRED being whether the error is
// ErrSessionExpired) and reports its session ("err EXPIRED ERR", "done
// CLOSED").
func childFencedHolder(c childConfig) error {
	db, s, closeAll, err := childSession(c)
	if err != nil {
		return err
	}
	defer closeAll()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := dsync.NewMutex(s, c.Name)
	if err := m.Lock(ctx); err != nil {
		return err
	}
	fence := m.Fence()
	n, err := fencedWrite(ctx, db, c.Table, fence, "child")
	if err != nil {
		return err
	}
	fmt.Printf("locked %d %d\n", fence, n)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	// The process was paused past its lease; it resumes here.
	n, err = fencedWrite(ctx, db, c.Table, fence, "child")
	if err != nil {
		return err
	}
	fmt.Printf("write %d\n", n)
	uctx, ucancel := context.WithTimeout(ctx, 5*time.Second)
	err = m.Unlock(uctx)
	ucancel()
	fmt.Printf("unlock %t %v\n", errors.Is(err, dsync.ErrSessionExpired), err)
	err = s.Err()
	fmt.Printf("err %t %v\n", errors.Is(err, dsync.ErrSessionExpired), err)
	fmt.Printf("done %t\n", isClosed(s.Done(), 0))
	return nil
}

// TestPausedHolderIsFencedOut pauses a holding process (SIGSTOP) for 2×TTL.
// Another session must take the lock within TTL+1s of the pause with a
// greater fence, a fence-checking resource must refuse the paused holder's
// write after it resumes, and its Unlock must return ErrSessionExpired,
// never nil.
func TestPausedHolderIsFencedOut(t *testing.T) {
	slowTest(t)
	const ttl = 2 * time.Second
	ctx := context.Background()
	db := dbtest.Open(t)
	table := fmt.Sprintf("fault_res_%d", time.Now().UnixNano())
	for _, q := range []string{
		"CREATE TABLE " + table + " (id INT PRIMARY KEY, fence BIGINT NOT NULL, owner VARCHAR(64) NOT NULL)",
		"INSERT INTO " + table + " VALUES (1, 0, '')",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	name := lockName(t)
	other := dsync.NewMutex(newSession(t, dsync.WithTTL(ttl)), name)

	holder := startChild(t, childConfig{Role: "fencedholder", Name: name, Table: table, TTL: ttl})
	lines := childLines(t, holder)
	var childFence, childRows int64
	if _, err := fmt.Sscan(nextLine(t, lines, "locked"), &childFence, &childRows); err != nil {
		t.Fatal(err)
	}
	if childRows != 1 {
		t.Fatalf("the holder's fenced write before the pause changed %d rows; want 1", childRows)
	}
	if ok, err := other.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock while the child holds the lock: got %v, %v; want false, nil", ok, err)
	}

	pid := holder.Process.Pid
	if err := holder.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = holder.Process.Signal(syscall.SIGCONT) })
	waitProcState(t, pid, 'T', false)

	lctx, cancel := context.WithTimeout(ctx, 2*ttl+5*time.Second)
	defer cancel()
	if err := other.Lock(lctx); err != nil {
		t.Fatalf("Lock while the holder is paused: got %v; want nil", err)
	}
	takeover := time.Since(stopped)
	t.Logf("takeover %v after SIGSTOP (TTL %v)", takeover, ttl)
	if takeover > ttl+time.Second {
		t.Errorf("takeover after SIGSTOP: got %v; want at most %v", takeover, ttl+time.Second)
	}
	fence := other.Fence()
	if fence <= childFence {
		t.Errorf("fence after takeover: got %d; want > %d, the paused holder's", fence, childFence)
	}
	if n, err := fencedWrite(ctx, db, table, fence, "test"); n != 1 || err != nil {
		t.Fatalf("new holder's fenced write: got %d rows, %v; want 1, nil", n, err)
	}

	// Keep the holder paused for 2×TTL in all, then make sure it was.
	time.Sleep(time.Until(stopped.Add(2 * ttl)))
	waitProcState(t, pid, 'T', false)
	if err := holder.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("holder resumed after %v in state T", time.Since(stopped))
	waitProcState(t, pid, 'T', true)
	if _, err := fmt.Fprintln(holder.in, "go"); err != nil {
		t.Fatal(err)
	}

	if got := nextLine(t, lines, "write"); got != "0" {
		t.Errorf("paused holder's fenced write after resuming: got %s rows changed; want 0 (refused)", got)
	}
	if got := nextLine(t, lines, "unlock"); !strings.HasPrefix(got, "true ") {
		t.Errorf("paused holder's Unlock: got %q; want ErrSessionExpired", got)
	}
	if got := nextLine(t, lines, "err"); !strings.HasPrefix(got, "true ") {
		t.Errorf("paused holder's Err: got %q; want ErrSessionExpired", got)
	}
	if got := nextLine(t, lines, "done"); got != "true" {
		t.Errorf("paused holder's Done closed: got %s; want true", got)
	}

	var rowFence int64
	var owner string
	if err := db.QueryRowContext(ctx, "SELECT fence, owner FROM "+table+" WHERE id = 1").Scan(&rowFence, &owner); err != nil {
		t.Fatal(err)
	}
	if rowFence != fence || owner != "test" {
		t.Errorf("resource row: got fence %d owner %q; want fence %d owner %q", rowFence, owner, fence, "test")
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatalf("Unlock by the new holder: got %v; want nil", err)
	}
}

// leaseExpiry returns the lease row of session id: its expires_at as the
// server stores it, and how long it has left on the server's clock.
func leaseExpiry(t *testing.T, db *sql.DB, id int64) (string, time.Duration) {
	t.Helper()
	var at string
	var left int64
	err := db.QueryRow("SELECT CAST(expires_at AS CHAR), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM dsync_lease WHERE id = ?", id).Scan(&at, &left)
	if err != nil {
		t.Fatalf("lease row %d: %v", id, err)
	}
	return at, time.Duration(left) * time.Microsecond
}

// TestLatencyFromSessionStart puts TTL/6 of latency each way between a
// session and the server from before NewSession: the session must start,
// lock, renew and hold for 5×TTL from the moment it started without being
// lost.
func TestLatencyFromSessionStart(t *testing.T) {
	slowTest(t)
	t.Parallel() // waits on latency: beside the other such tests, after the statement-counting ones
	const ttl = 3 * time.Second
	const latency = ttl / 6
	p, dsn := dbtest.FaultProxy(t)
	p.SetLatency(latency)
	direct := dbtest.Open(t)
	// A first session, direct, creates the tables (the usual case: the slow
	// session does not run DDL) and takes the lock over at the end.
	next := newSession(t, dsync.WithTTL(ttl))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(faultLogWriter{t}, nil))
	start := time.Now()
	s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, dsn), dsync.WithTTL(ttl), dsync.WithLogger(logger))
	if err != nil {
		t.Fatalf("NewSession through the slow network: got %v; want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	started := time.Now()
	t.Logf("NewSession took %v with %v latency each way", started.Sub(start), latency)
	before := p.Stats()

	// Lock at once, as a caller would, and watch the session meanwhile.
	m := dsync.NewMutex(s, lockName(t))
	locked := make(chan callResult, 1)
	go func() { err := m.Lock(ctx); locked <- callResult{err, time.Since(started)} }()

	end := started.Add(5 * ttl)
	first, _ := leaseExpiry(t, direct, s.ID())
	last, advances, minLeft := first, 0, ttl
	var lock *callResult
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-s.Done():
			t.Fatalf("Done closed %v after NewSession returned (Err %v); want open for %v", time.Since(started), s.Err(), 5*ttl)
		case r := <-locked:
			if r.err != nil {
				t.Fatalf("Lock through the slow network: got %v; want nil", r.err)
			}
			t.Logf("Lock took %v", r.took)
			lock = &r
		case <-tick.C:
		}
		if err := s.Err(); err != nil {
			t.Fatalf("Err %v after NewSession returned: got %v; want nil", time.Since(started), err)
		}
		at, left := leaseExpiry(t, direct, s.ID())
		minLeft = min(minLeft, left)
		if at < last {
			t.Fatalf("lease expires_at went back: got %s after %s", at, last)
		}
		if at != last {
			advances++
			last = at
		}
	}
	if lock == nil {
		t.Fatalf("Lock through the slow network: still waiting %v after NewSession returned", 5*ttl)
	}
	after := p.Stats()
	t.Logf("over %v after NewSession returned: expires_at advanced %d times (%s → %s), the lease had at least %v left on the server; held for the last %v; proxy forwarded %d bytes to the server and %d to the client",
		5*ttl, advances, first, last, minLeft, 5*ttl-lock.took, after.ToServer-before.ToServer, after.ToClient-before.ToClient)
	// Renewals are due every TTL/3 and take one round trip (2×latency):
	// expect at least half of the 15 or so in the window.
	if advances < 7 {
		t.Errorf("lease renewals seen: got %d; want at least 7", advances)
	}
	if minLeft <= 0 {
		t.Errorf("lease time left on the server: got %v at least; want > 0 throughout", minLeft)
	}
	if after.ToServer <= before.ToServer || after.ToClient <= before.ToClient {
		t.Errorf("proxy traffic: got %+v then %+v; want both directions growing", before, after)
	}

	ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ecancel()
	if err := m.Unlock(ectx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
	took := dsync.NewMutex(next, m.Name())
	if ok, err := took.TryLock(ectx); !ok || err != nil {
		t.Fatalf("TryLock by another session after Unlock: got %v, %v; want true, nil", ok, err)
	}
	if err := took.Unlock(ectx); err != nil {
		t.Fatalf("Unlock: got %v; want nil", err)
	}
}

// holdState describes the database rows of a lock name: for a Mutex its
// row (holder, token, fence); for a FairMutex its tickets in order and the
// name's fence.
type holdState struct {
	holders, tokens []int64
	fence           int64
}

func readHoldState(t *testing.T, db *sql.DB, kind, name string) holdState {
	t.Helper()
	var h holdState
	if kind == "Mutex" {
		var holder, token int64
		if err := db.QueryRow("SELECT holder, token, fence FROM dsync_lock WHERE name = ?", name).Scan(&holder, &token, &h.fence); err != nil {
			t.Fatal(err)
		}
		h.holders, h.tokens = []int64{holder}, []int64{token}
		return h
	}
	rows, err := db.Query("SELECT holder, token FROM dsync_ticket WHERE name = ? ORDER BY seq", name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var holder, token int64
		if err := rows.Scan(&holder, &token); err != nil {
			t.Fatal(err)
		}
		h.holders, h.tokens = append(h.holders, holder), append(h.tokens, token)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT fence FROM dsync_queue WHERE name = ?", name).Scan(&h.fence); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h holdState) String() string {
	return fmt.Sprintf("holders %v tokens %v fence %d", h.holders, h.tokens, h.fence)
}

// awaitRenewal returns just after session id's lease was renewed, as seen
// on the server, so that the next renewal is about TTL/3 away.
func awaitRenewal(t *testing.T, db *sql.DB, id int64, ttl time.Duration) {
	t.Helper()
	first, _ := leaseExpiry(t, db, id)
	deadline := time.Now().Add(ttl)
	for {
		if at, _ := leaseExpiry(t, db, id); at != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal of lease %d within %v", id, ttl)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Let the renewal's reply through the proxy before anything is dropped.
	time.Sleep(50 * time.Millisecond)
}

// TestUnlockReplyLost drops the reply to a holder's Unlock: the release
// runs on the server, the holder's Unlock returns ctx's error, another
// session acquires at once, and the holder's background retries of the
// release (by its own token) never touch the new hold over 2×TTL.
func TestUnlockReplyLost(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	for _, kind := range faultKinds {
		t.Run(kind, func(t *testing.T) { unlockReplyLost(t, kind) })
	}
}

func unlockReplyLost(t *testing.T, kind string) {
	const ttl = 2 * time.Second
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	direct := dbtest.Open(t)
	name := lockName(t)

	// The holder's session must have its release statement prepared on
	// the connection it runs on, so that the dropped reply (right after a
	// renewal) is that of the release itself, not of a prepare or a dial:
	// it runs its lock statements on its doorbell's connection when that
	// is free (doorbell.lend), where the ring-in releases are prepared when
	// the doorbell is taken (doorbell.take), and a cycle after that
	// prepares the others there. It has two or three connections: its lease's,
	// its doorbell's, and one of the pool's until it has sat unused for a
	// second.
	var h *dsync.Session
	var held faultLock
	for attempt := 1; ; attempt++ {
		hdb := dbtest.OpenDSN(t, dsn)
		h = faultSession(t, hdb, ttl)
		held = newFaultLock(kind, h, name)
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		for i := range 3 {
			if i == 2 {
				awaitBellOf(t, direct, h.ID())
			}
			if err := held.Lock(ctx); err != nil {
				t.Fatalf("holder's Lock: got %v; want nil", err)
			}
			if err := held.Unlock(ctx); err != nil {
				t.Fatalf("holder's Unlock: got %v; want nil", err)
			}
		}
		err := held.Lock(ctx)
		cancel()
		if err != nil {
			t.Fatalf("holder's Lock: got %v; want nil", err)
		}
		if n := hdb.Stats().OpenConnections; n == 2 || n == 3 {
			break
		} else if attempt == 5 {
			t.Fatalf("holder's open connections after warm-up: got %d five times; want 2 or 3", n)
		}
		if err := held.Unlock(bg); err != nil {
			t.Fatal(err)
		}
		h.Close()
	}

	o := faultSession(t, direct, ttl)
	next := newFaultLock(kind, o, name)
	acquired := make(chan error, 1)
	var at time.Time // when next.Lock returned; written before the send on acquired
	octx, ocancel := context.WithTimeout(bg, 20*time.Second)
	defer ocancel()
	go func() {
		err := next.Lock(octx)
		at = time.Now()
		acquired <- err
	}()
	if kind == "FairMutex" {
		waitTickets(t, direct, name, 2) // the holder's and the waiter's
	}

	awaitRenewal(t, direct, h.ID(), ttl)
	dropped := p.DropNextReply()
	uctx, ucancel := context.WithTimeout(bg, 2*time.Second)
	defer ucancel()
	unlockStart := time.Now()
	took, err := within(t, "holder's Unlock", 2*time.Second+5*time.Second, func() error { return held.Unlock(uctx) })
	unlocked := time.Now()
	if !isClosed(dropped, 0) {
		t.Fatalf("DropNextReply's channel closed when Unlock returned: got false; want true (Unlock: %v)", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("holder's Unlock with its reply lost: got %v; want an error wrapping context.DeadlineExceeded", err)
	}

	select {
	case err := <-acquired:
		if err != nil {
			t.Fatalf("other session's Lock: got %v; want nil", err)
		}
	case <-time.After(time.Until(unlockStart.Add(ttl + 5*time.Second))):
		t.Fatalf("other session's Lock: not acquired within %v of the holder's Unlock", ttl+5*time.Second)
	}
	t.Logf("holder's Unlock returned %v after %v; the other session acquired %v after the Unlock started", err, took, at.Sub(unlockStart))
	if got := at.Sub(unlockStart); got > ttl {
		t.Fatalf("other session acquired after the holder's Unlock started: got %v; want within TTL (%v)", got, ttl)
	}
	if !at.Before(unlocked) {
		t.Fatalf("other session acquired %v after the holder's Unlock returned; want before it (the release ran on the server, only its reply was lost)", at.Sub(unlocked))
	}

	// The holder's session lives on and retries its release in the
	// background: the new hold must stay exactly as it is.
	want := readHoldState(t, direct, kind, name)
	if len(want.holders) != 1 || want.holders[0] != o.ID() {
		t.Fatalf("rows after the takeover: got %v; want held by the other session (%d) alone", want, o.ID())
	}
	fence := next.Fence()
	traffic := p.Stats()
	watchEnd := time.Now().Add(2 * ttl)
	for time.Now().Before(watchEnd) {
		if got := readHoldState(t, direct, kind, name); got.String() != want.String() {
			t.Fatalf("rows of the new hold: got %v; want %v, untouched", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := h.Err(); err != nil {
		t.Errorf("holder's session Err after %v: got %v; want nil (still live)", 2*ttl, err)
	}
	if got := p.Stats(); got.ToServer <= traffic.ToServer {
		t.Errorf("holder's traffic over %v: got %d bytes to the server; want some", 2*ttl, got.ToServer-traffic.ToServer)
	}
	if err := o.Err(); err != nil {
		t.Errorf("other session's Err: got %v; want nil", err)
	}
	if got := next.Fence(); got != fence {
		t.Errorf("other session's Fence: got %d; want %d", got, fence)
	}
	t.Logf("the new hold (%v) stayed untouched for %v while the holder's session lived on", want, 2*ttl)
	if err := next.Unlock(octx); err != nil {
		t.Fatalf("other session's Unlock: got %v; want nil", err)
	}
}

// TestCancellationBoundedOnBlackHole (issue 6, item 9) black-holes the
// network under a Lock waiting with a 2s ctx, 1s into the wait, and under
// an Unlock with a 1s ctx: each must return within its ctx plus 1s, with an
// error wrapping context.DeadlineExceeded. The TTL (6s) is long, so that an
// overshoot of TTL/3 would show.
func TestCancellationBoundedOnBlackHole(t *testing.T) {
	slowTest(t)
	for _, kind := range faultKinds {
		t.Run(kind, func(t *testing.T) { cancellationBoundedOnBlackHole(t, kind) })
	}
}

func cancellationBoundedOnBlackHole(t *testing.T, kind string) {
	const ttl = 6 * time.Second
	const lockWait, unlockWait, margin = 2 * time.Second, time.Second, time.Second
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	name, held := lockName(t), lockName(t)+"/held"

	owner := newFaultLock(kind, faultSession(t, dbtest.Open(t), ttl), name)
	if err := owner.Lock(bg); err != nil {
		t.Fatalf("direct session's Lock: got %v; want nil", err)
	}
	waiter := newFaultLock(kind, faultSession(t, dbtest.OpenDSN(t, dsn), ttl), name)
	holder := newFaultLock(kind, faultSession(t, dbtest.OpenDSN(t, dsn), ttl), held)
	if err := holder.Lock(bg); err != nil {
		t.Fatalf("proxied session's Lock: got %v; want nil", err)
	}
	// Close the proxy before the sessions, so that their Close fails fast
	// instead of waiting on the black hole.
	t.Cleanup(func() { p.Close() })

	call := func(f func() error) <-chan callResult {
		c := make(chan callResult, 1)
		start := time.Now()
		go func() { err := f(); c <- callResult{err, time.Since(start)} }()
		return c
	}
	// await waits for a call's result, giving up (and failing the test)
	// limit after the call started, well after its bound.
	await := func(what string, c <-chan callResult, start time.Time, limit time.Duration) callResult {
		select {
		case r := <-c:
			return r
		default:
		}
		timer := time.NewTimer(time.Until(start.Add(limit)))
		defer timer.Stop()
		select {
		case r := <-c:
			return r
		case <-timer.C:
			t.Errorf("%s: still running %v after the call", what, time.Since(start))
			return callResult{took: -1}
		}
	}

	before := p.Stats()
	lctx, lcancel := context.WithTimeout(bg, lockWait)
	defer lcancel()
	lockStart := time.Now()
	locked := call(func() error { return waiter.Lock(lctx) })

	time.Sleep(lockWait / 2)
	p.Cut(true)
	cutAt := time.Now()
	uctx, ucancel := context.WithTimeout(bg, unlockWait)
	defer ucancel()
	unlocked := call(func() error { return holder.Unlock(uctx) })
	time.Sleep(50 * time.Millisecond) // chunks already being written when the cut came
	atCut := p.Stats()
	if atCut.ToServer <= before.ToServer {
		t.Fatalf("waiter's traffic before the cut: got %d bytes to the server; want some", atCut.ToServer-before.ToServer)
	}

	lock := await("Lock through the cut network", locked, lockStart, lockWait+margin+15*time.Second)
	unlock := await("Unlock through the cut network", unlocked, cutAt, unlockWait+margin+15*time.Second)
	after := p.Stats()
	t.Logf("cut %v into the wait; Lock (ctx %v) %v; Unlock (ctx %v) %v; %d bytes dropped",
		cutAt.Sub(lockStart), lockWait, lock, unlockWait, unlock, after.Dropped-atCut.Dropped)
	if t.Failed() {
		t.FailNow()
	}
	if after.ToServer != atCut.ToServer || after.ToClient != atCut.ToClient || after.Dropped <= atCut.Dropped {
		t.Fatalf("proxy after the cut: got %+v, then %+v; want no byte forwarded and some dropped", atCut, after)
	}
	if !errors.Is(lock.err, context.DeadlineExceeded) {
		t.Errorf("Lock through the cut network: got %v; want an error wrapping context.DeadlineExceeded", lock.err)
	}
	if lock.took > lockWait+margin {
		t.Errorf("Lock through the cut network returned after: got %v; want at most %v", lock.took, lockWait+margin)
	}
	if !errors.Is(unlock.err, context.DeadlineExceeded) {
		t.Errorf("Unlock through the cut network: got %v; want an error wrapping context.DeadlineExceeded", unlock.err)
	}
	if unlock.took > unlockWait+margin {
		t.Errorf("Unlock through the cut network returned after: got %v; want at most %v", unlock.took, unlockWait+margin)
	}
	if err := owner.Unlock(bg); err != nil {
		t.Fatalf("direct session's Unlock: got %v; want nil", err)
	}
}

// TestLostSessionReleasesConnections (issue 6, item 10) cuts the network
// under 5 sessions of one *sql.DB, each holding 3 locks: all must be lost
// within TTL, and then give back every connection they used.
func TestLostSessionReleasesConnections(t *testing.T) {
	slowTest(t)
	const ttl = 3 * time.Second
	const sessions, locksEach = 5, 3
	const release = 2 * time.Second
	p, dsn := dbtest.FaultProxy(t)
	db := dbtest.OpenDSN(t, dsn)
	name := lockName(t)
	var all []*dsync.Session
	for range sessions {
		all = append(all, faultSession(t, db, ttl))
	}
	// Each session takes 3 locks at once over a slightly slow network, so
	// that the sessions use several connections, not one in turn.
	p.SetLatency(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errc := make(chan error, sessions*locksEach)
	for i, s := range all {
		for j := range locksEach {
			go func() { errc <- dsync.NewMutex(s, fmt.Sprintf("%s/%d/%d", name, i, j)).Lock(ctx) }()
		}
	}
	for range sessions * locksEach {
		if err := <-errc; err != nil {
			t.Fatalf("Lock: got %v; want nil", err)
		}
	}
	p.SetLatency(0)
	t.Cleanup(func() { p.Close() })
	held := db.Stats()
	if held.InUse == 0 {
		t.Fatalf("connections in use while the sessions hold locks: got %d; want some", held.InUse)
	}

	p.Cut(true)
	cutAt := time.Now()
	var lastDone time.Duration
	for i, s := range all {
		select {
		case <-s.Done():
		case <-time.After(time.Until(cutAt.Add(ttl + 5*time.Second))):
			t.Fatalf("session %d: Done still open %v after the cut", i, time.Since(cutAt))
		}
		lastDone = max(lastDone, time.Since(cutAt))
		if err := s.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
			t.Fatalf("session %d Err after the cut: got %v; want ErrSessionExpired", i, err)
		}
	}
	atDone := p.Stats()
	if atDone.Dropped == 0 {
		t.Fatalf("proxy after the cut: got %+v; want some bytes dropped", atDone)
	}
	if lastDone > ttl {
		t.Errorf("all %d sessions lost after the cut: got %v; want within TTL (%v)", sessions, lastDone, ttl)
	}

	var stats sql.DBStats
	for deadline := time.Now().Add(release); ; {
		stats = db.Stats()
		if stats.InUse == 0 && stats.OpenConnections == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("before the cut: %d connections open, %d in use; all %d sessions lost %v after the cut; %v after that: %d open, %d in use",
		held.OpenConnections, held.InUse, sessions, lastDone, time.Since(cutAt)-lastDone, stats.OpenConnections, stats.InUse)
	if stats.InUse != 0 {
		t.Errorf("connections in use %v after the last session was lost: got %d; want 0", release, stats.InUse)
	}
	if stats.OpenConnections != 0 {
		t.Errorf("connections open %v after the last session was lost: got %d; want 0", release, stats.OpenConnections)
	}
	if got := p.Stats(); got.ToServer != atDone.ToServer || got.ToClient != atDone.ToClient {
		t.Errorf("proxy while cut: got %+v after %+v; want no byte forwarded", got, atDone)
	}
}

// TestLockInFlightWhenLeaseLost (issue 6, item 4) slows the network of a
// session waiting in Lock to 1.5s each way (longer than its 1s TTL) as the
// holder unlocks: its acquisition lands as its lease ends, and Lock must
// report ErrSessionExpired, never nil; the lock is then free for a third
// session within TTL + 1s.
func TestLockInFlightWhenLeaseLost(t *testing.T) {
	slowTest(t)
	for _, kind := range faultKinds {
		t.Run(kind, func(t *testing.T) { lockInFlightWhenLeaseLost(t, kind) })
	}
}

func lockInFlightWhenLeaseLost(t *testing.T, kind string) {
	const ttl = time.Second
	const latency = 1500 * time.Millisecond
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	direct := dbtest.Open(t)
	name := lockName(t)

	b := newFaultLock(kind, faultSession(t, direct, ttl), name)
	if err := b.Lock(bg); err != nil {
		t.Fatalf("holder's Lock: got %v; want nil", err)
	}
	c := newFaultLock(kind, faultSession(t, direct, ttl), name)
	as := faultSession(t, dbtest.OpenDSN(t, dsn), ttl)
	a := newFaultLock(kind, as, name)

	lctx, lcancel := context.WithTimeout(bg, 10*time.Second)
	defer lcancel()
	lockErr := make(chan error, 1)
	go func() { lockErr <- a.Lock(lctx) }()
	if kind == "FairMutex" {
		waitTickets(t, direct, name, 2) // the holder's and the waiter's
	} else {
		time.Sleep(100 * time.Millisecond) // a few polls
	}

	p.SetLatency(latency)
	slowAt := time.Now()
	if err := b.Unlock(bg); err != nil {
		t.Fatalf("holder's Unlock: got %v; want nil", err)
	}
	var err error
	select {
	case err = <-lockErr:
	case <-time.After(15 * time.Second):
		t.Fatalf("waiter's Lock: still waiting %v after the network slowed down", time.Since(slowAt))
	}
	returned := time.Since(slowAt)
	if !isClosed(as.Done(), 0) {
		t.Fatalf("waiter's Done when its Lock returned (%v): got open; want closed", err)
	}
	if !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("waiter's Lock while its lease was lost: got %v; want ErrSessionExpired", err)
	}
	if got := a.Fence(); got != 0 {
		t.Errorf("waiter's Fence: got %d; want 0", got)
	}
	if s := p.Stats(); s.ToServer == 0 {
		t.Fatalf("proxy: got %+v; want traffic", s)
	}
	landed := ""
	if h := readHoldState(t, direct, kind, name); len(h.holders) > 0 && h.holders[0] == as.ID() {
		landed = " (its acquisition landed: the rows name its ended lease)"
	}

	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	freed := time.Now()
	for {
		ok, err := c.TryLock(ctx)
		if err != nil {
			t.Fatalf("third session's TryLock: got %v; want nil", err)
		}
		if ok {
			break
		}
		if time.Since(freed) > ttl+time.Second {
			t.Fatalf("third session's TryLock: still false %v after the waiter's Lock returned; want true within %v (rows: %v)",
				time.Since(freed), ttl+time.Second, readHoldState(t, direct, kind, name))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("waiter's Lock returned %v after the network slowed down, with %v%s; a third session took the lock %v later",
		returned, err, landed, time.Since(freed))
	if err := c.Unlock(ctx); err != nil {
		t.Fatalf("third session's Unlock: got %v; want nil", err)
	}
}

// TestCallsEndWithTheirSession cuts the network under a Lock and an Unlock
// called with context.Background(): no ctx will ever end them, so they must
// return, with ErrSessionExpired, once their session is lost (they used to
// block until the driver gave up on the dead connection, which a black hole
// may never make it do).
func TestCallsEndWithTheirSession(t *testing.T) {
	slowTest(t)
	const ttl = 2 * time.Second
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	name := lockName(t)
	owner := dsync.NewMutex(faultSession(t, dbtest.Open(t), ttl), name)
	if err := owner.Lock(bg); err != nil {
		t.Fatal(err)
	}
	ws := faultSession(t, dbtest.OpenDSN(t, dsn), ttl)
	waiter := dsync.NewMutex(ws, name)
	hs := faultSession(t, dbtest.OpenDSN(t, dsn), ttl)
	holder := dsync.NewMutex(hs, name+"/held")
	if err := holder.Lock(bg); err != nil {
		t.Fatal(err)
	}
	lockErr := make(chan error, 1)
	go func() { lockErr <- waiter.Lock(bg) }()
	time.Sleep(300 * time.Millisecond) // the waiter polls through the proxy
	p.Cut(true)
	cut := time.Now()
	unlockErr := make(chan error, 1)
	go func() { unlockErr <- holder.Unlock(bg) }()

	for _, s := range []*dsync.Session{ws, hs} {
		select {
		case <-s.Done():
		case <-time.After(2 * ttl):
			t.Fatalf("Done after the cut: still open after %v; want closed within the TTL", 2*ttl)
		}
	}
	lost := time.Since(cut)
	if st := p.Stats(); st.Dropped == 0 {
		t.Fatalf("bytes dropped by the cut: got %d; want some (the fault did not happen)", st.Dropped)
	}
	for _, c := range []struct {
		call string
		errc chan error
	}{{"Lock", lockErr}, {"Unlock", unlockErr}} {
		select {
		case err := <-c.errc:
			if !errors.Is(err, dsync.ErrSessionExpired) {
				t.Errorf("%s after its session was lost: got %v; want ErrSessionExpired", c.call, err)
			}
			t.Logf("%s returned %v after the cut (sessions lost after %v)", c.call, time.Since(cut), lost)
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: still blocked 2s after its session was lost; want it to return", c.call)
		}
	}
	if err := owner.Unlock(bg); err != nil {
		t.Fatal(err)
	}
}

// TestRenewalsOnSlowSharedPools: with latency of TTL/6 each way, a session
// whose lock statements keep its connections busy (polling a held lock)
// still renews in time on a pool limited to 4 connections (dsync kept one,
// and the renewal waited behind a poll: lost at 0.8 TTL).
func TestRenewalsOnSlowSharedPools(t *testing.T) {
	slowTest(t)
	t.Parallel() // waits on latency: beside the other such tests, after the statement-counting ones
	for _, tc := range []struct{ maxOpen, sessions int }{{4, 1}} {
		t.Run(fmt.Sprintf("max %d, %d sessions", tc.maxOpen, tc.sessions), func(t *testing.T) {
			const ttl = 3 * time.Second
			bg := context.Background()
			p, dsn := dbtest.FaultProxy(t)
			name := lockName(t)
			owner := dsync.NewMutex(newSession(t, dsync.WithTTL(ttl)), name)
			if err := owner.Lock(bg); err != nil {
				t.Fatal(err)
			}
			db := dbtest.OpenDSN(t, dsn)
			db.SetMaxOpenConns(tc.maxOpen)
			var ss []*dsync.Session
			for range tc.sessions {
				ss = append(ss, faultSession(t, db, ttl))
			}
			p.SetLatency(ttl / 6)
			ctx, cancel := context.WithTimeout(bg, 4*ttl)
			defer cancel()
			var wg sync.WaitGroup
			for _, s := range ss {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = dsync.NewMutex(s, name).Lock(ctx) // polls the held lock until ctx ends
				}()
			}
			start := time.Now()
			for i, s := range ss {
				select {
				case <-s.Done():
					t.Errorf("session %d: lost %v after the latency began (%v); want live for %v", i, time.Since(start), s.Err(), 4*ttl)
				case <-ctx.Done():
				}
			}
			wg.Wait()
			if st := p.Stats(); st.ToServer == 0 {
				t.Fatalf("bytes to the server through the proxy: got 0; want some (the fault did not apply)")
			}
			if err := owner.Unlock(bg); err != nil {
				t.Fatal(err)
			}
		})
	}
}

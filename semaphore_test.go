package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// semTickets counts the live tickets (not markers) of a queue key.
const semTickets = `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder <> 0`

// semaphoreKey is the name of a Semaphore's rows in the queue and ticket
// tables, its queue key (see "Queue keys" in queries.go).
func semaphoreKey(name string) string { return "\xfe" + name }

// acquireAsync runs m.Acquire(ctx, n) in a goroutine, which sends its
// error, and returns once the name has tickets live tickets (m's
// included: it is in line).
func acquireAsync(ctx context.Context, t *testing.T, m *dsync.Semaphore, n int64, tickets int) <-chan error {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- m.Acquire(ctx, n) }()
	waitRows(t, dbtest.Open(t), 10*time.Second, tickets, semTickets, semaphoreKey(m.Name()))
	return got
}

// semTicket returns the number of session s's one ticket in the line of
// queue key key.
func semTicket(t *testing.T, db *sql.DB, key string, s *dsync.Session) int64 {
	t.Helper()
	return int64(countRows(t, db, `SELECT seq FROM dsync_ticket WHERE name = ? AND holder = ?`, key, s.ID()))
}

// semaphores returns n Semaphores of name with limit, each on a new
// session of its own (as if in n processes).
func semaphores(t *testing.T, name string, limit int64, n int) []*dsync.Semaphore {
	t.Helper()
	var ms []*dsync.Semaphore
	for range n {
		ms = append(ms, dsync.NewSemaphore(newSession(t), name, limit))
	}
	return ms
}

// await returns the error got sends within limit, and fails the test
// with what when none comes.
func await(t *testing.T, got <-chan error, limit time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-got:
		return err
	case <-time.After(limit):
		t.Fatalf("%s: still waiting after %v", what, limit)
		return nil
	}
}

// pending fails the test when got has sent something: the call must still
// wait.
func pending(t *testing.T, got <-chan error, what string) {
	t.Helper()
	select {
	case err := <-got:
		t.Fatalf("%s: returned %v; want it still waiting", what, err)
	default:
	}
}

// TestSemaphoreLimitAcrossSessions: workers in 4 sessions acquire 1 or 2
// of 3 permits at once, again and again; the permits held, counted inside
// each hold, never exceed the limit, and every acquisition gets a fence of
// its own.
func TestSemaphoreLimitAcrossSessions(t *testing.T) { semaphoreLimit(t, 5) }

// TestSemaphoreClusterEnqueue is TestSemaphoreLimitAcrossSessions with
// the enqueue of a Galera cluster (qSemNumber and qTicketAdd in one
// transaction), on the test server.
func TestSemaphoreClusterEnqueue(t *testing.T) {
	defer dsync.EnqueueAsOnCluster()()
	semaphoreLimit(t, 3)
}

// semaphoreLimit: workers in 4 sessions acquire 1 or 2 of 3 permits, rounds
// times each; see TestSemaphoreLimitAcrossSessions.
func semaphoreLimit(t *testing.T, rounds int) {
	const limit, sessions, workers = 3, 4, 2
	ctx := context.Background()
	name := lockName(t)
	var held, most atomic.Int64
	var mu sync.Mutex
	fences := map[int64]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, sessions*workers)
	for i := range sessions {
		m := dsync.NewSemaphore(newSession(t), name, limit)
		for j := range workers {
			n := int64(1 + (i+j)%2)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					fence, err := m.AcquireFence(ctx, n)
					if err != nil {
						errs <- err
						return
					}
					now := held.Add(n)
					for {
						if m := most.Load(); now <= m || most.CompareAndSwap(m, now) {
							break
						}
					}
					mu.Lock()
					dup := fences[fence]
					fences[fence] = true
					mu.Unlock()
					if dup {
						errs <- errors.New("fence handed out twice")
					}
					time.Sleep(5 * time.Millisecond)
					held.Add(-n)
					if err := m.Release(ctx, n); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := most.Load(); got > limit || got < 2 {
		t.Errorf("most permits held at once: got %d; want 2 to %d", got, limit)
	}
	if got := len(fences); got != sessions*workers*rounds {
		t.Errorf("fences: got %d; want %d", got, sessions*workers*rounds)
	}
}

// TestSemaphoreNoBarging: with 2 of 3 permits held, a request for 3 waits
// at the head of the line, and a request for 1 behind it, which would fit,
// is not granted before it (nor is a TryAcquire of 1); across sessions,
// waiters are served in the order they arrived.
func TestSemaphoreNoBarging(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ms := semaphores(t, name, 3, 4)
	holder, big, small, late := ms[0], ms[1], ms[2], ms[3]
	if err := holder.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	gotBig := acquireAsync(ctx, t, big, 3, 2)
	gotSmall := acquireAsync(ctx, t, small, 1, 3)
	if ok, err := late.TryAcquire(ctx, 1); ok || err != nil {
		t.Fatalf("TryAcquire(1) behind a waiter: got %v, %v; want false, nil", ok, err)
	}
	time.Sleep(200 * time.Millisecond) // the small request had its chances
	pending(t, gotBig, "Acquire(3)")
	pending(t, gotSmall, "Acquire(1) behind Acquire(3)")
	if err := holder.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := await(t, gotBig, 10*time.Second, "Acquire(3) after the release"); err != nil {
		t.Fatal(err)
	}
	pending(t, gotSmall, "Acquire(1) while Acquire(3) holds")
	if err := big.Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := await(t, gotSmall, 10*time.Second, "Acquire(1) after Acquire(3) released"); err != nil {
		t.Fatal(err)
	}
	if err := small.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}

	// Arrival order across sessions, limit 1.
	name = lockName(t)
	first := dsync.NewSemaphore(newSession(t), name, 1)
	if err := first.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	const waiters = 4
	order := make(chan int, waiters)
	var sems []*dsync.Semaphore
	for i := range waiters {
		m := dsync.NewSemaphore(newSession(t), name, 1)
		sems = append(sems, m)
		go func() {
			if err := m.Acquire(ctx, 1); err != nil {
				t.Error(err)
				order <- -1
				return
			}
			order <- i
			m.Release(ctx, 1)
		}()
		waitRows(t, db, 10*time.Second, i+2, semTickets, semaphoreKey(name)) // queued before the next one starts
	}
	if err := first.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for want := range waiters {
		select {
		case got := <-order:
			if got != want {
				t.Fatalf("grant %d: got waiter %d; want %d (arrival order)", want, got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("grant %d: none after 20s", want)
		}
	}
}

// TestSemaphoreTakeStatement runs the take (qSemTake) directly, on a
// name of limit 3 where a holds 1, b waits for 3 and c for 1, in that
// order: b's own weight counts (1 + 3 > 3), and c, small enough for the
// free permits, does not overtake b. Once a's lease has ended, its weight
// no longer counts: b takes, and c still waits, now behind a live holder.
func TestSemaphoreTakeStatement(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	key := semaphoreKey(name)
	sa, sb, sc := newSession(t), newSession(t), newSession(t)
	if err := dsync.NewSemaphore(sa, name, 3).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	gotB := acquireAsync(wctx, t, dsync.NewSemaphore(sb, name, 3), 3, 2)
	gotC := acquireAsync(wctx, t, dsync.NewSemaphore(sc, name, 3), 1, 3)
	t.Cleanup(func() { cancel(); <-gotB; <-gotC })
	seq := func(s *dsync.Session) int64 { return semTicket(t, db, key, s) }
	ta, tb, tc := seq(sa), seq(sb), seq(sc)
	if !(ta < tb && tb < tc) {
		t.Fatalf("tickets a, b, c: got %d, %d, %d; want them in that order", ta, tb, tc)
	}
	take := func(what string, s *dsync.Session, ticket int64, wantTake bool) {
		t.Helper()
		ahead, fence, err := dsync.SemTake(ctx, s, key, ticket, 3)
		switch {
		case err != nil:
			t.Fatalf("%s: take: %v", what, err)
		case wantTake && (ahead != 0 || fence <= 0):
			t.Errorf("%s: take: got ahead %d, fence %d; want 0 and a fence", what, ahead, fence)
		case !wantTake && (ahead == 0 || fence != 0):
			t.Errorf("%s: take: got ahead %d, fence %d; want ahead, no fence", what, ahead, fence)
		}
	}
	take("a, holding 1 of 3", sa, ta, true)
	take("b, 3 behind a live holder of 1 (its own weight counts)", sb, tb, false)
	take("c, 1 behind b waiting for 3, 2 permits free", sc, tc, false)
	if _, err := db.Exec("UPDATE dsync_lease SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", sa.ID()); err != nil {
		t.Fatal(err)
	}
	take("b, 3 behind a's ended lease", sb, tb, true)
	take("c, 1 behind b holding 3", sc, tc, false)
}

// TestSemaphoreAheadLocksOnlyItsTicket: the read of whom a waiter blocks
// on (qSemAhead) share-locks only the ticket it picks, so a row lock on
// another ticket ahead (here another transaction's) does not hold it up:
// behind more than the limit it picks the nearest ticket, else the
// oldest, whichever the locked one is not.
func TestSemaphoreAheadLocksOnlyItsTicket(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	key := semaphoreKey(name)
	sa, sb, sc := newSession(t), newSession(t), newSession(t)
	for _, s := range []*dsync.Session{sa, sb} {
		if err := dsync.NewSemaphore(s, name, 2).Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	gotC := acquireAsync(wctx, t, dsync.NewSemaphore(sc, name, 2), 1, 3)
	t.Cleanup(func() { cancel(); <-gotC })
	seq := func(s *dsync.Session) int64 { return semTicket(t, db, key, s) }
	ta, tb, tc := seq(sa), seq(sb), seq(sc)
	tests := []struct {
		what           string
		locked, ticket int64
		want           int64
		several        bool
	}{
		{"behind a, b holding and c waiting, a locked", ta, tc + 1, tc, false},
		{"c behind a and b holding, b locked", tb, tc, ta, true},
	}
	for _, tt := range tests {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := countRows(t, db, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND seq = ?`, key, tt.locked); got != 1 {
			t.Fatalf("%s: the ticket to lock: got %d rows; want 1", tt.what, got)
		}
		var one int
		if err := tx.QueryRowContext(ctx, `SELECT 1 FROM dsync_ticket WHERE name = ? AND seq = ? FOR UPDATE`, key, tt.locked).Scan(&one); err != nil {
			t.Fatal(err)
		}
		got, several, err := dsync.SemAhead(ctx, sc, key, tt.ticket, 2)
		if rerr := tx.Rollback(); rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil || got != tt.want || several != tt.several {
			t.Errorf("%s: qSemAhead: got %d, %v, %v; want %d, %v, <nil>", tt.what, got, several, err, tt.want, tt.several)
		}
	}
}

// TestSemaphoreTryAcquire: TryAcquire takes free permits, returns false
// without a ticket left behind when they are not free, and takes them
// again once released.
func TestSemaphoreTryAcquire(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ms := semaphores(t, name, 2, 2)
	a, b := ms[0], ms[1]
	fa, err := a.TryAcquireFence(ctx, 2)
	if fa == 0 || err != nil {
		t.Fatalf("TryAcquireFence(2) of a free semaphore: got %d, %v; want a fence, nil", fa, err)
	}
	if ok, err := b.TryAcquire(ctx, 1); ok || err != nil {
		t.Fatalf("TryAcquire(1) with every permit held: got %v, %v; want false, nil", ok, err)
	}
	if got := countRows(t, db, semTickets, semaphoreKey(name)); got != 1 {
		t.Fatalf("tickets after a failed TryAcquire: got %d; want 1 (the holder's)", got)
	}
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	fb, err := b.TryAcquireFence(ctx, 1)
	if fb <= fa || err != nil {
		t.Fatalf("TryAcquireFence(1) after a partial release: got %d, %v; want a fence above %d, nil", fb, err, fa)
	}
}

// TestSemaphorePartialRelease: a holder of 3 permits releases 1 of them,
// which lets a waiter for 1 in at once (the release rings), then the other
// 2; a further Release gets ErrReleaseExceedsHeld, which is an ErrNotHeld,
// and releases nothing.
func TestSemaphorePartialRelease(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ms := semaphores(t, name, 3, 2)
	a, b := ms[0], ms[1]
	if err := a.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, t, b, 1, 2)
	time.Sleep(300 * time.Millisecond) // the waiter blocks on a's doorbell
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := await(t, got, 4*time.Second, "Acquire(1) after Release(1) of 3"); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, 3); !errors.Is(err, dsync.ErrReleaseExceedsHeld) || !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("Release(3) holding 2: got %v; want ErrReleaseExceedsHeld (an ErrNotHeld)", err)
	}
	if err := a.Release(ctx, 2); err != nil {
		t.Fatalf("Release(2) holding 2: got %v; want nil", err)
	}
	if err := a.Release(ctx, 1); !errors.Is(err, dsync.ErrReleaseExceedsHeld) {
		t.Fatalf("Release(1) holding none: got %v; want ErrReleaseExceedsHeld", err)
	}
	if err := b.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitRows(t, db, 10*time.Second, 0, semTickets, semaphoreKey(name))
}

// TestSemaphoreFailedReleaseNotRepeated: a partial Release that fails
// has released its permits in the process all the same, whether its
// statement reached the server or not, so that a caller never releases
// them twice: the session sends the statement again in the background.
// First the ctx has ended before the call (the statement never left);
// then another transaction holds the ticket's row, so the statement waits
// on the server past the call's deadline and lands after it (before, the
// process still counted the permits, so a retry released other ones).
func TestSemaphoreFailedReleaseNotRepeated(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ms := semaphores(t, name, 5, 2)
	a, b := ms[0], ms[1]
	if err := a.Acquire(ctx, 5); err != nil {
		t.Fatal(err)
	}
	weight := `SELECT COALESCE(SUM(weight), 0) FROM dsync_ticket WHERE name = ? AND holder <> 0`
	weightBecomes := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for countRows(t, db, weight, semaphoreKey(name)) != want {
			if time.Now().After(deadline) {
				t.Fatalf("weight held: got %d 10s after the failed Release; want %d", countRows(t, db, weight, semaphoreKey(name)), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Release(cctx, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release(2) of 5 with an ended ctx: got %v; want context.Canceled", err)
	}
	if err := a.Release(ctx, 4); !errors.Is(err, dsync.ErrReleaseExceedsHeld) {
		t.Fatalf("Release(4) after a failed Release(2) of 5: got %v; want ErrReleaseExceedsHeld (3 held)", err)
	}
	weightBecomes(3) // the session's retry
	if ok, err := b.TryAcquire(ctx, 3); ok || err != nil {
		t.Fatalf("TryAcquire(3) while 3 of 5 are held: got %v, %v; want false, nil", ok, err)
	}

	// The ticket's row locked by another transaction: the shrink waits.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM dsync_ticket WHERE name = ? AND holder <> 0 FOR UPDATE`, semaphoreKey(name)).Scan(&one); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = a.Release(rctx, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release(1) of 3 with its row locked: got %v; want context.DeadlineExceeded", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	weightBecomes(2)
	if ok, err := b.TryAcquire(ctx, 3); !ok || err != nil {
		t.Fatalf("TryAcquire(3) while 2 of 5 are held: got %v, %v; want true, nil", ok, err)
	}
	if err := a.Release(ctx, 3); !errors.Is(err, dsync.ErrReleaseExceedsHeld) {
		t.Fatalf("Release(3) after a failed Release(1) of 3: got %v; want ErrReleaseExceedsHeld (2 held; 3 more would exceed the limit with b's)", err)
	}
	if err := a.Release(ctx, 2); err != nil {
		t.Fatalf("Release(2) of the 2 left: got %v; want nil", err)
	}
	if err := b.Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
	weightBecomes(0)
}

// TestSemaphorePartialReleasesOnLostLease: after its lease is lost, a
// session made WithReplaceLostLease that releases its permits in parts
// (each Release returning ErrSessionExpired) holds none afterwards, and
// its next acquisition gets a new lease (before, a failed partial Release
// kept the permits in the process, and the session stayed on the lost
// lease: "session lease expired" from every later call).
func TestSemaphorePartialReleasesOnLostLease(t *testing.T) {
	ctx := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	s, err := dsync.NewSession(ctx, dbtest.OpenDSN(t, dsn), dsync.WithTTL(time.Second), dsync.WithReplaceLostLease())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	name := lockName(t)
	m := dsync.NewSemaphore(s, name, 5)
	if err := m.Acquire(ctx, 5); err != nil {
		t.Fatal(err)
	}
	p.Cut(true)
	if !isClosed(s.Done(), 10*time.Second) {
		t.Fatal("lease not lost 10s after the cut (the fault did not happen)")
	}
	p.Cut(false)
	for _, n := range []int64{2, 3} {
		if err := m.Release(ctx, n); !errors.Is(err, dsync.ErrSessionExpired) {
			t.Fatalf("Release(%d) on the lost lease: got %v; want ErrSessionExpired", n, err)
		}
	}
	if err := m.Release(ctx, 1); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Release(1) after all 5 were released on the lost lease: got %v; want ErrSessionExpired (the session's error)", err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.Acquire(actx, 1); err != nil {
		t.Fatalf("Acquire after every permit of the lost lease was released: got %v; want nil, on a new lease", err)
	}
	if err := m.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreMisuse: bad names, limits and counts get their sentinel
// errors, from every method, without a statement's effect.
func TestSemaphoreMisuse(t *testing.T) {
	ctx := context.Background()
	s := newSession(t)
	name := lockName(t)
	tests := []struct {
		what  string
		name  string
		limit int64
		n     int64
		want  error
	}{
		{"empty name", "", 1, 1, dsync.ErrInvalidName},
		{"limit 0", name, 0, 1, dsync.ErrInvalidLimit},
		{"limit -1", name, -1, 1, dsync.ErrInvalidLimit},
		{"n 0", name, 2, 0, dsync.ErrInvalidPermits},
		{"n -1", name, 2, -1, dsync.ErrInvalidPermits},
	}
	for _, tt := range tests {
		m := dsync.NewSemaphore(s, tt.name, tt.limit)
		if err := m.Acquire(ctx, tt.n); !errors.Is(err, tt.want) {
			t.Errorf("%s: Acquire: got %v; want %v", tt.what, err, tt.want)
		}
		if _, err := m.TryAcquire(ctx, tt.n); !errors.Is(err, tt.want) {
			t.Errorf("%s: TryAcquire: got %v; want %v", tt.what, err, tt.want)
		}
		if err := m.Release(ctx, tt.n); !errors.Is(err, tt.want) {
			t.Errorf("%s: Release: got %v; want %v", tt.what, err, tt.want)
		}
	}
	m := dsync.NewSemaphore(s, name, 2)
	if err := m.Acquire(ctx, 3); !errors.Is(err, dsync.ErrInvalidPermits) {
		t.Errorf("Acquire(3) of 2: got %v; want ErrInvalidPermits", err)
	}
	if _, err := m.TryAcquire(ctx, 3); !errors.Is(err, dsync.ErrInvalidPermits) {
		t.Errorf("TryAcquire(3) of 2: got %v; want ErrInvalidPermits", err)
	}
	if err := m.Release(ctx, 1); !errors.Is(err, dsync.ErrReleaseExceedsHeld) {
		t.Errorf("Release(1) holding none: got %v; want ErrReleaseExceedsHeld", err)
	}
	if got := countRows(t, dbtest.Open(t), `SELECT COUNT(*) FROM dsync_lock WHERE name = ?`, name); got != 0 {
		t.Errorf("lock rows of the name after the misuse: got %d; want 0", got)
	}
}

// TestSemaphoreCancelledAcquireLeavesNoTicket: an Acquire whose ctx ends
// while it waits returns ctx's error and leaves no ticket; the holder's
// release is not held up by it.
func TestSemaphoreCancelledAcquireLeavesNoTicket(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	a := dsync.NewSemaphore(newSession(t), name, 2)
	bs := newSession(t)
	b := dsync.NewSemaphore(bs, name, 2)
	if err := a.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	got := acquireAsync(cctx, t, b, 1, 2)
	cancel()
	if err := await(t, got, 5*time.Second, "cancelled Acquire"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: got %v; want context.Canceled", err)
	}
	waitRows(t, db, 5*time.Second, 0, `SELECT COUNT(*) FROM dsync_ticket WHERE name = ? AND holder = ?`, semaphoreKey(name), bs.ID())
	if err := a.Release(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryAcquire(ctx, 2); !ok || err != nil {
		t.Fatalf("TryAcquire(2) after the release: got %v, %v; want true, nil", ok, err)
	}
}

// TestSemaphoreLimitMismatch: the limit of the first Semaphore that uses a
// name stands; a Semaphore of the name with another limit gets
// ErrLimitMismatch from Acquire and TryAcquire, while the name's line
// exists and when it has to be created again, and holds nothing.
func TestSemaphoreLimitMismatch(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	two := dsync.NewSemaphore(newSession(t), name, 2)
	three := dsync.NewSemaphore(newSession(t), name, 3)
	if err := two.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := three.Acquire(ctx, 1); !errors.Is(err, dsync.ErrLimitMismatch) {
		t.Fatalf("Acquire of limit 3 on a name of limit 2: got %v; want ErrLimitMismatch", err)
	}
	if ok, err := three.TryAcquire(ctx, 1); ok || !errors.Is(err, dsync.ErrLimitMismatch) {
		t.Fatalf("TryAcquire of limit 3 on a name of limit 2: got %v, %v; want false, ErrLimitMismatch", ok, err)
	}
	if err := two.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The queue row gone (as the clean-up deletes it), the lock row keeps
	// the limit.
	if _, err := db.Exec(`DELETE FROM dsync_queue WHERE name = ?`, semaphoreKey(name)); err != nil {
		t.Fatal(err)
	}
	if err := three.Acquire(ctx, 1); !errors.Is(err, dsync.ErrLimitMismatch) {
		t.Fatalf("Acquire of limit 3 creating the line of a name of limit 2: got %v; want ErrLimitMismatch", err)
	}
	if got := countRows(t, db, semTickets, semaphoreKey(name)); got != 0 {
		t.Fatalf("tickets after the refused calls: got %d; want 0", got)
	}
	if err := two.Acquire(ctx, 2); err != nil {
		t.Fatalf("Acquire(2) of limit 2: got %v; want nil", err)
	}
}

// TestSemaphoreReleaseLimitMismatch: a Semaphore of the session's name
// with another limit gets ErrLimitMismatch from Release too, and releases
// none of the permits the name's Semaphore acquired.
func TestSemaphoreReleaseLimitMismatch(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	name := lockName(t)
	two := dsync.NewSemaphore(s, name, 2)
	three := dsync.NewSemaphore(s, name, 3)
	if err := two.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := three.Release(ctx, 2); !errors.Is(err, dsync.ErrLimitMismatch) {
		t.Fatalf("Release of limit 3 on a name of limit 2: got %v; want ErrLimitMismatch", err)
	}
	if got := countRows(t, db, semTickets, semaphoreKey(name)); got != 1 {
		t.Fatalf("tickets after the refused Release: got %d; want 1", got)
	}
	if err := two.Release(ctx, 2); err != nil {
		t.Fatalf("Release(2) of limit 2: got %v; want nil", err)
	}
}

// TestSemaphoreOtherKind: a name is one lock: a Semaphore's calls on a
// FairMutex's name return ErrOtherKind, and so do the other kinds' on a
// Semaphore's name, whether or not its line exists.
func TestSemaphoreOtherKind(t *testing.T) {
	ctx := context.Background()
	s := newSession(t)
	fair := lockName(t) + "/fair"
	if err := dsync.NewFairMutex(s, fair).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m := dsync.NewSemaphore(newSession(t), fair, 2)
	if err := m.Acquire(ctx, 1); !errors.Is(err, dsync.ErrOtherKind) {
		t.Errorf("Semaphore.Acquire on a FairMutex's name: got %v; want ErrOtherKind", err)
	}
	if _, err := m.TryAcquire(ctx, 1); !errors.Is(err, dsync.ErrOtherKind) {
		t.Errorf("Semaphore.TryAcquire on a FairMutex's name: got %v; want ErrOtherKind", err)
	}

	sem := lockName(t) + "/sem"
	if err := dsync.NewSemaphore(s, sem, 2).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	o := newSession(t)
	calls := []struct {
		what string
		call func() error
	}{
		{"FairMutex.Lock", func() error { return dsync.NewFairMutex(o, sem).Lock(ctx) }},
		{"RWMutex.RLock", func() error { return dsync.NewRWMutex(o, sem).RLock(ctx) }},
		{"RWMutex.TryRLock", func() error { _, err := dsync.NewRWMutex(o, sem).TryRLock(ctx); return err }},
		{"FairMutex.TryLock", func() error { _, err := dsync.NewFairMutex(o, sem).TryLock(ctx); return err }},
		{"Mutex.Lock", func() error { return dsync.NewMutex(o, sem).Lock(ctx) }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, dsync.ErrOtherKind) {
			t.Errorf("%s on a Semaphore's name: got %v; want ErrOtherKind", c.what, err)
		}
	}

	// The same from the session whose Semaphore holds and waits: its
	// local line of the Semaphore is not the FairMutex's.
	waitCtx, cancel := context.WithCancel(ctx)
	waiting := acquireAsync(waitCtx, t, dsync.NewSemaphore(s, sem, 2), 2, 2)
	if ok, err := dsync.NewFairMutex(s, sem).TryLock(ctx); !errors.Is(err, dsync.ErrOtherKind) {
		t.Errorf("FairMutex.TryLock on a Semaphore's name, by its session while it waits: got %v, %v; want ErrOtherKind", ok, err)
	}
	cancel()
	if err := await(t, waiting, 10*time.Second, "the cancelled Acquire"); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled Acquire: got %v; want context.Canceled", err)
	}
}

// TestSemaphoreHolderLost: the permits of a session whose lease is lost
// (its network cut) go to the waiter, and the lost session learns of it
// (Done) before the waiter is granted them.
func TestSemaphoreHolderLost(t *testing.T) {
	const ttl = time.Second
	ctx := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	direct := dbtest.Open(t)
	name := lockName(t)
	lost := faultSession(t, dbtest.OpenDSN(t, dsn), ttl)
	a := dsync.NewSemaphore(lost, name, 2)
	b := dsync.NewSemaphore(faultSession(t, direct, ttl), name, 2)
	if err := a.Acquire(ctx, 2); err != nil {
		t.Fatal(err)
	}
	got := acquireAsync(ctx, t, b, 1, 2)
	p.Cut(true)
	if err := await(t, got, 10*time.Second, "Acquire behind a lost session"); err != nil {
		t.Fatal(err)
	}
	// The fault happened: the holder's session ended.
	if !isClosed(lost.Done(), 0) {
		t.Fatal("lost session's Done when the waiter got its permits: got open; want closed")
	}
	if err := lost.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("lost session's Err: got %v; want ErrSessionExpired", err)
	}
	if err := a.Release(ctx, 2); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("lost session's Release: got %v; want ErrSessionExpired", err)
	}
}

// TestSemaphoreReleaseWakesWaiter: the first waiter, blocked on the
// doorbell of the oldest holder, gets the permits a moment after that
// holder's release, without waiting out a poll or a block (8s): the
// release rings. The same holds down a line of waiters: one granted after
// a wait rings for the waiter behind it, which may fit as well.
func TestSemaphoreReleaseWakesWaiter(t *testing.T) {
	t.Run("oldest of two holders", func(t *testing.T) { releaseWakes(t, 0, 4*time.Second) })
	t.Run("line of waiters", func(t *testing.T) {
		ctx := context.Background()
		name := lockName(t)
		ms := semaphores(t, name, 2, 3)
		a, b, c := ms[0], ms[1], ms[2]
		if err := a.Acquire(ctx, 2); err != nil {
			t.Fatal(err)
		}
		gotB := acquireAsync(ctx, t, b, 1, 2)
		gotC := acquireAsync(ctx, t, c, 1, 3)
		time.Sleep(500 * time.Millisecond) // both block on doorbells
		if err := a.Release(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if err := await(t, gotB, 4*time.Second, "first waiter after the release"); err != nil {
			t.Fatal(err)
		}
		if err := await(t, gotC, 4*time.Second, "second waiter, behind the first, after the release"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSemaphoreOtherHolderReleaseSeen: a release by a holder other than
// the oldest does not ring the first waiter's doorbell (it blocks on the
// oldest holder's, see Semaphore, "Waking"), but the waiter blocks for at
// most a second at a time while several holders are ahead of it, so it
// sees the release well before its longest block on a doorbell (bellWait,
// 8s), at the cost of a few statements a second for that waiter alone:
// the server's count while it waits, less that of three idle sessions.
func TestSemaphoreOtherHolderReleaseSeen(t *testing.T) {
	const watch = 2 * time.Second
	idle := idleStatements(t, 3, watch)
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	var holders []*dsync.Semaphore
	for i := range 2 {
		m := dsync.NewSemaphore(sessionOn(t, dbtest.Open(t)), name, 2)
		if err := m.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, m)
		waitRows(t, db, 10*time.Second, i+1, semTickets, semaphoreKey(name))
	}
	got := acquireAsync(ctx, t, dsync.NewSemaphore(sessionOn(t, dbtest.Open(t)), name, 2), 1, 3)
	time.Sleep(500 * time.Millisecond) // the waiter blocks on a doorbell
	q := questions(t)
	time.Sleep(watch)
	waiting := questions(t) - q - 1 // less the first questions call's own statement
	rate := float64(waiting-idle) / watch.Seconds()
	pending(t, got, "waiter while both holders hold")
	released := time.Now()
	if err := holders[1].Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := await(t, got, 5*time.Second, "waiter after the newer holder's release (bellWait is 8s)"); err != nil {
		t.Fatal(err)
	}
	t.Logf("first waiter: %.1f statements/s while waiting (%d in %v, %d idle); granted %v after the newer holder's release",
		rate, waiting, watch, idle, time.Since(released).Round(time.Millisecond))
	if rate > 6 {
		t.Errorf("got %.1f statements/s from the first waiter; want about 3 (per second a take, a read of whom to block on, a block)", rate)
	}
}

// TestSemaphoreFirstWaiterMarker: the first waiter blocks on the oldest
// holder's doorbell, and its enqueue leaves its marker (which makes that
// holder's release ring) behind the oldest holder's ticket, not behind
// the nearest one: no marker statement of its own before it blocks, and
// no ring for nobody when the nearest holder releases.
func TestSemaphoreFirstWaiterMarker(t *testing.T) {
	const markerBase = 1 << 62
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	key := semaphoreKey(name)
	ms := semaphores(t, name, 2, 3)
	for i, m := range ms[:2] {
		if err := m.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		waitRows(t, db, 10*time.Second, i+1, semTickets, key)
	}
	var oldest int64
	if err := db.QueryRow(`SELECT MIN(seq) FROM dsync_ticket WHERE name = ? AND holder <> 0`, key).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	got := acquireAsync(waitCtx, t, ms[2], 1, 3)
	defer func() {
		cancel()
		<-got
	}()
	time.Sleep(500 * time.Millisecond) // the waiter blocks on a doorbell
	rows, err := db.Query(`SELECT seq - ? FROM dsync_ticket WHERE name = ? AND seq >= ? ORDER BY seq`, int64(markerBase), key, int64(markerBase))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var behind []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			t.Fatal(err)
		}
		behind = append(behind, seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(behind) != 1 || behind[0] != oldest {
		t.Errorf("markers behind tickets: got %v; want one, behind the oldest holder's ticket %d", behind, oldest)
	}
}

// releaseWakes: two sessions hold one of 2 permits each, a third waits for
// one; holder which (0 the oldest, 1 the other) releases, and the waiter
// must be granted within limit.
func releaseWakes(t *testing.T, which int, limit time.Duration) {
	ctx := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	var holders []*dsync.Semaphore
	for i := range 2 {
		m := dsync.NewSemaphore(newSession(t), name, 2)
		if err := m.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, m)
		waitRows(t, db, 10*time.Second, i+1, semTickets, semaphoreKey(name))
	}
	waiter := dsync.NewSemaphore(newSession(t), name, 2)
	got := acquireAsync(ctx, t, waiter, 1, 3)
	time.Sleep(500 * time.Millisecond) // the waiter blocks on a doorbell
	released := time.Now()
	if err := holders[which].Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := await(t, got, limit, "waiter after a holder's release"); err != nil {
		t.Fatal(err)
	}
	t.Logf("granted %v after the release", time.Since(released))
}

// TestSemaphoreUncontendedStatements: an uncontended Acquire+Release is
// three statements: the enqueue, the take of the fence, the release.
func TestSemaphoreUncontendedStatements(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s := newSession(t, dsync.WithTTL(time.Minute), dsync.WithFreeRowAge(0))
	m := dsync.NewSemaphore(s, lockName(t), 3)
	cycle := func() {
		if err := m.Acquire(ctx, 2); err != nil {
			t.Fatalf("Acquire: got %v; want <nil>", err)
		}
		if err := m.Release(ctx, 2); err != nil {
			t.Fatalf("Release: got %v; want <nil>", err)
		}
	}
	cycle() // creates the rows, prepares the statements
	const n = 20
	if fewest := fewestStatements(t, db, n, cycle, 3*n); fewest != 3*n {
		t.Errorf("statements for %d uncontended Acquire+Release: got %d; want %d", n, fewest, 3*n)
	}
}

// The FairMutex statements of schema version 6 (before Semaphores), which
// a process of that version still runs on tables upgraded in place (see
// ErrSchemaVersion): the take of the head slot (args: -lease id, token,
// lease id, name), the enqueue without a marker (args: mode, lease id,
// token, mode, name) and the bind of a name to the queued locks (args:
// name).
const (
	oldQueueTake = "UPDATE dsync_queue SET\n" +
		"  holder = IF(NOT EXISTS (SELECT 1 FROM dsync_lease hl WHERE hl.id = dsync_queue.holder AND hl.expires_at > UTC_TIMESTAMP(6))\n" +
		"              AND NOT EXISTS (SELECT 1 FROM dsync_ticket t JOIN dsync_lease l ON l.id = t.holder\n" +
		"                              WHERE t.name = dsync_queue.name AND l.expires_at > UTC_TIMESTAMP(6)),\n" +
		"              ?, holder),\n" +
		"  fence = IF(holder < 0, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(4611686018427387904)),\n" +
		"  token = IF(holder < 0, ?, token),\n" +
		"  held_since = IF(holder < 0, UTC_TIMESTAMP(6), held_since),\n" +
		"  holder = IF(holder < 0, ?, holder)\n" +
		"WHERE name = ?"
	oldTicketInsertAlone = "INSERT INTO dsync_ticket (name, seq, holder, token, mode, held_since)\n" +
		"SELECT q.name, LAST_INSERT_ID(2 * (GREATEST(q.seq,\n" +
		"         COALESCE((SELECT MAX(t.seq) FROM dsync_ticket t WHERE t.name = q.name AND t.seq < 4611686018427387904), 0)) + 1)\n" +
		"       + IF((EXISTS (SELECT 1 FROM dsync_ticket ct JOIN dsync_lease cl ON cl.id = ct.holder\n" +
		"          WHERE ct.name = q.name AND (ct.mode = 1 OR ? = 1) AND cl.expires_at > UTC_TIMESTAMP(6))\n" +
		"        OR EXISTS (SELECT 1 FROM dsync_lease hl WHERE hl.id = q.holder AND hl.expires_at > UTC_TIMESTAMP(6))), 1, 0)) DIV 2,\n" +
		"       ?, ?, ?, UTC_TIMESTAMP(6)\n" +
		"FROM dsync_queue q WHERE q.name = ? FOR UPDATE"
	oldQueueBind = "INSERT INTO dsync_lock (name, kind, fence) VALUES (?, 1, LAST_INSERT_ID(1))\n" +
		"ON DUPLICATE KEY UPDATE fence = IF(kind = 1, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(2305843009213693952))"
)

// TestOldLocksNeverTakeASemaphoreName runs the Mutex and FairMutex
// statements of schema version 6, as a process of that version would on
// upgraded tables, on the name of a Semaphore that a session holds: the
// Mutex must refuse it (error 1690, which that version's Lock returns),
// never answer a fence (it answers kind * 2^61 for another kind, a
// positive number for kinds 2 and 3, see TestOldMutexNeverTakesAnElectionName);
// the FairMutex must find no line of the name to take or join (its
// statements do not read the lock row), and then be refused by its bind.
func TestOldLocksNeverTakeASemaphoreName(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ms := semaphores(t, name, 2, 2)
	if err := ms[0].Acquire(bg, 1); err != nil {
		t.Fatal(err)
	}
	old := newSession(t).ID() // a live lease, as the old process's
	const token = 7

	res, err := db.ExecContext(bg, oldMutexAcquire, name, old, token, old, -old, token, 0, old)
	var fence int64
	if err == nil {
		fence, err = res.LastInsertId()
	}
	if me := (*mysql.MySQLError)(nil); !errors.As(err, &me) || me.Number != 1690 {
		t.Fatalf("the old Mutex statement on a Semaphore's name: got %d, %v; want error 1690", fence, err)
	}

	res, err = db.ExecContext(bg, oldQueueTake, -old, token, old, name)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := res.LastInsertId(); got != 0 {
		t.Fatalf("the old FairMutex take of the head slot: got %d; want 0 (no line of the name)", got)
	}
	res, err = db.ExecContext(bg, oldTicketInsertAlone, 1, old, token, 1, name)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := res.RowsAffected(); got != 0 {
		t.Fatalf("the old FairMutex enqueue: got %d tickets; want 0 (no line of the name)", got)
	}
	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err = tx.ExecContext(bg, oldQueueBind, name)
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	bound, _ := res.LastInsertId()
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if bound != 1<<61 {
		t.Fatalf("the old FairMutex bind: got %d; want the refusal %d", bound, int64(1<<61))
	}

	// Nothing of the old statements landed: the Semaphore counts on.
	if got := countRows(t, db, `SELECT COUNT(*) FROM dsync_ticket WHERE holder = ?`, old); got != 0 {
		t.Fatalf("tickets of the old process: got %d; want 0", got)
	}
	if ok, err := ms[1].TryAcquire(bg, 1); err != nil || !ok {
		t.Fatalf("TryAcquire of the second permit: got %v, %v; want true, nil", ok, err)
	}
	if ok, err := ms[1].TryAcquire(bg, 1); err != nil || ok {
		t.Fatalf("TryAcquire beyond the limit: got %v, %v; want false, nil", ok, err)
	}
}

package connpool_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/connpool"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// setup pins a setting that differs from the server default, so a test can
// tell a pool connection from a caller's.
var setup = []string{"SET SESSION time_zone = '+03:00'"}

var queries = []string{"SELECT @@time_zone", "SELECT CONNECTION_ID()"}

func newPool(t *testing.T, size int) (*sql.DB, *connpool.Pool) {
	t.Helper()
	db := dbtest.Open(t)
	p := connpool.New(db, size, setup, queries)
	t.Cleanup(p.Close)
	return db, p
}

func queryString(t *testing.T, ctx context.Context, p *connpool.Pool, c *connpool.Conn, i int) string {
	t.Helper()
	st, err := c.Stmt(ctx, p, i)
	if err != nil {
		t.Fatal(err)
	}
	var s string
	if err := st.QueryRowContext(ctx).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPoolReservesOneConnectionForPriority(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	c1, err := p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, p, c1, 0); got != "+03:00" {
		t.Fatalf("time_zone on a pool connection: got %v; want +03:00", got)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = p.Get(short, false)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second non-priority Get with size 2: got %v; want DeadlineExceeded", err)
	}
	c2, err := p.Get(ctx, true)
	if err != nil {
		t.Fatalf("priority Get: got %v; want a connection", err)
	}
	// A priority waiter is served before a non-priority one.
	got := make(chan bool, 2)
	go func() {
		c, err := p.Get(ctx, false)
		if err == nil {
			got <- false
			p.Put(c, nil)
		}
	}()
	time.Sleep(50 * time.Millisecond) // the non-priority Get queues first
	go func() {
		c, err := p.Get(ctx, true)
		if err == nil {
			got <- true
			p.Put(c, nil)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	p.Put(c2, nil) // only a priority user may have the reserved connection
	if first := <-got; !first {
		t.Fatalf("first served after the reserved connection came back: got non-priority; want priority")
	}
	p.Put(c1, nil)
	if second := <-got; second {
		t.Fatalf("second served: got priority; want non-priority")
	}
}

func TestPoolNeverHandsConnectionsBack(t *testing.T) {
	ctx := context.Background()
	db, p := newPool(t, 3)
	var cs []*connpool.Conn
	for range 3 {
		c, err := p.Get(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	p.Put(cs[0], errors.New("read tcp: connection reset by peer"))
	p.Put(cs[1], nil)
	if got := p.Open(); got != 2 {
		t.Fatalf("open after discarding one: got %d; want 2", got)
	}
	p.Close()
	p.Put(cs[2], nil)
	if got := p.Open(); got != 0 {
		t.Fatalf("open after Close: got %d; want 0", got)
	}
	// Whatever the pool used was closed, not returned to db's idle pool.
	if st := db.Stats(); st.OpenConnections != 0 {
		t.Fatalf("caller's pool after Close: got %d open connections; want 0", st.OpenConnections)
	}
	if _, err := p.Get(ctx, false); !errors.Is(err, connpool.ErrClosed) {
		t.Fatalf("Get after Close: got %v; want ErrClosed", err)
	}
}

func TestPoolReplacesConnectionKilledWhileIdle(t *testing.T) {
	ctx := context.Background()
	db, p := newPool(t, 2)
	c, err := p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	id := queryString(t, ctx, p, c, 1)
	p.Put(c, nil)
	if _, err := db.ExecContext(ctx, "KILL CONNECTION "+id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the close reach the client socket
	c, err = p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put(c, nil)
	if got := queryString(t, ctx, p, c, 1); got == id {
		t.Fatalf("connection id after KILL: got the killed one %v; want a new one", got)
	}
}

func TestMain(m *testing.M) {
	stop, err := dbtest.Setup()
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { stop() }))
}

func TestPoolWaitEndsOnCtxAndClose(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 1)
	c, err := p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 2)
	go func() { _, err := p.Get(short, false); errc <- err }()
	go func() { _, err := p.Get(ctx, true); errc <- err }()
	time.Sleep(50 * time.Millisecond) // both wait: the only connection is in use
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting Get after its ctx ended: got %v; want context.Canceled", err)
	}
	p.Close()
	if err := <-errc; !errors.Is(err, connpool.ErrClosed) {
		t.Fatalf("waiting Get after Close: got %v; want ErrClosed", err)
	}
	p.Put(c, nil)
}

// TestPoolKeepsTheReserveWarm: once a priority user has used a connection,
// non-priority users never take it; they open their own, so a priority user
// always finds a set-up connection without opening one.
func TestPoolKeepsTheReserveWarm(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	c, err := p.Get(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	reserved := queryString(t, ctx, p, c, 1)
	p.Put(c, nil)
	n, err := p.Get(ctx, false) // must open a second connection
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, p, n, 1); got == reserved {
		t.Fatalf("non-priority Get: got the reserved connection %v; want another", got)
	}
	c, err = p.Get(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, p, c, 1); got != reserved {
		t.Fatalf("priority Get: got connection %v; want the reserve %v", got, reserved)
	}
	p.Put(c, nil)
	p.Put(n, nil)
	// A non-priority user waiting while the reserve is the only connection
	// opens its own instead of waiting for ever.
	_, q := newPool(t, 2)
	n1, err := q.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n2, err := q.Get(short, false)
		if err == nil {
			q.Put(n2, nil)
		}
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	q.Put(n1, nil) // becomes the reserve; the waiter must be told to open one
	if err := <-errc; err != nil {
		t.Fatalf("waiting non-priority Get after the only connection became the reserve: got %v; want a connection", err)
	}
}

// TestPoolWithoutReserve: with KeepReserve(false), a connection put back
// serves the next non-priority user, and non-priority users may hold every
// connection of the pool.
func TestPoolWithoutReserve(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	p.KeepReserve(false)
	c, err := p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	first := queryString(t, ctx, p, c, 1)
	p.Put(c, nil)
	c, err = p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ctx, p, c, 1); got != first {
		t.Fatalf("non-priority Get after a Put: got connection %v; want %v again (no reserve)", got, first)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := p.Get(short, false)
	if err != nil {
		t.Fatalf("second non-priority Get on a pool of 2 without reserve: got %v; want a connection", err)
	}
	if p.Open() != 2 {
		t.Errorf("open connections: got %d; want 2", p.Open())
	}
	p.Put(n, nil)
	p.Put(c, nil)
}

// TestKeptCapsAndReuses checks the cache of dedicated connections: at most
// most open at once, a kept one handed out again, none after Close.
func TestKeptCapsAndReuses(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	var k connpool.Kept
	t.Cleanup(k.Close)
	a, b := k.Get(ctx, p, 2), k.Get(ctx, p, 2)
	if a == nil || b == nil {
		t.Fatalf("got %v, %v; want two connections", a, b)
	}
	if c := k.Get(ctx, p, 2); c != nil {
		t.Fatalf("third Get with most 2: got %v; want nil", c)
	}
	if got := queryString(t, ctx, p, a, 0); got != "+03:00" {
		t.Fatalf("time_zone: got %v; want +03:00", got)
	}
	id := queryString(t, ctx, p, a, 1)
	k.Put(a, true)
	if c := k.Get(ctx, p, 2); c != a {
		t.Fatalf("Get after Put(keep): got %p; want the kept %p", c, a)
	}
	if got := queryString(t, ctx, p, a, 1); got != id {
		t.Fatalf("kept connection id: got %v; want %v", got, id)
	}
	k.Put(a, false) // closed: room for one more
	c := k.Get(ctx, p, 2)
	if c == nil || c == a {
		t.Fatalf("Get after Put(close): got %p; want a new connection", c)
	}
	k.Put(c, true)
	k.Close()
	if c := k.Get(ctx, p, 2); c != nil {
		t.Fatalf("Get after Close: got %v; want nil", c)
	}
	k.Put(b, true) // closed, not kept
}

// TestKeptOpenAndPutIdle checks the cache's side without a cap on open
// connections: Open opens past any cap, PutIdle keeps at most most idle
// (the last ones kept come out first), Idle never opens one.
func TestKeptOpenAndPutIdle(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	var k connpool.Kept
	t.Cleanup(k.Close)
	if c := k.Idle(); c != nil {
		t.Fatalf("Idle with none kept: got %v; want nil", c)
	}
	var cs []*connpool.Conn
	for range 3 {
		c, err := k.Open(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	if n := k.InUse(); n != 3 {
		t.Fatalf("InUse after 3 Opens: got %d; want 3", n)
	}
	for _, c := range cs {
		k.PutIdle(c, true, 2)
	}
	if n := k.InUse(); n != 0 {
		t.Fatalf("InUse after PutIdle of all: got %d; want 0", n)
	}
	a, b := k.Idle(), k.Idle()
	if a != cs[1] || b != cs[0] {
		t.Fatalf("Idle after PutIdle with most 2: got %p, %p; want %p, %p (the third closed)", a, b, cs[1], cs[0])
	}
	if c := k.Idle(); c != nil {
		t.Fatalf("third Idle: got %v; want nil", c)
	}
	k.Put(a, false)
	k.Put(b, false)
}

// TestDedicatedCapped checks the cap on dedicated connections: Dedicated
// returns ErrNoRoom once the cap's worth are open, and room again once
// one is closed; Kept.Get then returns nil, opening nothing.
func TestDedicatedCapped(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 2)
	p.LimitDedicated(2)
	a, err := p.Dedicated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Dedicated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Dedicated(ctx); !errors.Is(err, connpool.ErrNoRoom) {
		t.Fatalf("third Dedicated with a cap of 2: got %v; want ErrNoRoom", err)
	}
	var k connpool.Kept
	t.Cleanup(k.Close)
	if c := k.Get(ctx, p, 5); c != nil {
		t.Fatalf("Kept.Get with the cap reached: got %v; want nil", c)
	}
	if n := p.DedicatedOpen(); n != 2 {
		t.Fatalf("DedicatedOpen: got %d; want 2", n)
	}
	a.Close()
	c := k.Get(ctx, p, 5)
	if c == nil {
		t.Fatal("Kept.Get after a Close: got nil; want a connection")
	}
	k.Put(c, false)
	b.Close()
	if n := p.DedicatedOpen(); n != 0 {
		t.Fatalf("DedicatedOpen after every Close: got %d; want 0", n)
	}
}

// TestCloseIdleAfter checks that a pool told to close idle connections
// does so once they have sat idle that long, but keeps the reserve, and
// that Dedicated takes an idle connection of the pool instead of opening
// one (the same connection: its server id stays).
func TestCloseIdleAfter(t *testing.T) {
	ctx := context.Background()
	_, p := newPool(t, 3)
	p.CloseIdleAfter(200 * time.Millisecond)
	var cs []*connpool.Conn
	for range 2 {
		c, err := p.Get(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	r, err := p.Get(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		p.Put(c, nil)
	}
	p.Put(r, nil) // the reserve
	if got := p.Open(); got != 3 {
		t.Fatalf("open right after the connections were put back: got %d; want 3", got)
	}
	time.Sleep(600 * time.Millisecond)
	if got := p.Open(); got != 1 {
		t.Fatalf("open after the idle ones sat idle past the limit: got %d; want 1 (the reserve)", got)
	}

	c, err := p.Get(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	id := queryString(t, ctx, p, c, 1)
	p.Put(c, nil)
	d, err := p.Dedicated(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := queryString(t, ctx, p, d, 1); got != id {
		t.Fatalf("connection id of Dedicated with an idle connection in the pool: got %s; want %s (the idle one)", got, id)
	}
	if got, ded := p.Open(), p.DedicatedOpen(); got != 1 || ded != 1 {
		t.Fatalf("open and dedicated after Dedicated took the idle connection: got %d and %d; want 1 and 1", got, ded)
	}
}

package faultproxy_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// server is the throwaway MariaDB server behind every proxy in the tests.
var server *mariadb.Server

// withServer runs the tests with server started, and stops it after them.
type withServer struct{ m *testing.M }

func (w withServer) Run() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := mariadb.Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faultproxy: the tests need a MariaDB server: %v\n", err)
		return 1
	}
	server = s
	defer s.Stop()
	return w.m.Run()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(withServer{m}) }

// newProxy returns a proxy to server, closed when t ends.
func newProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", server.Port()))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// open returns a connection pool to database dbName on the server through
// the proxy at addr ("" for a direct connection), closed when t ends.
func open(t *testing.T, addr, dbName string) *sql.DB {
	t.Helper()
	dsn := server.DSN(dbName)
	if addr != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Addr = addr
		dsn = cfg.FormatDSN()
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// conn returns one established connection of db, closed when t ends.
func conn(ctx context.Context, t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// selectOne runs SELECT 1 on c and returns how long it took.
func selectOne(ctx context.Context, t *testing.T, c *sql.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	var one int
	if err := c.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1: got %d, %v; want 1, nil", one, err)
	}
	return time.Since(start)
}

func TestNewBadUpstream(t *testing.T) {
	p, err := faultproxy.New("no port")
	if err == nil {
		p.Close()
		t.Fatal("New(\"no port\"): got nil error; want an error")
	}
}

// TestForward checks plain forwarding and the counts in Stats.
func TestForward(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newProxy(t)
	c := conn(ctx, t, open(t, p.Addr(), ""))
	selectOne(ctx, t, c)
	st := p.Stats()
	if st.Accepted != 1 || st.ToServer == 0 || st.ToClient == 0 || st.Dropped != 0 {
		t.Errorf("Stats: got %+v; want 1 connection accepted, bytes both ways, none dropped", st)
	}
}

// TestLatency checks that SetLatency(d) adds at least 2d to a round trip
// and that a reply of many chunks is delayed by d, not d per chunk.
func TestLatency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newProxy(t)
	c := conn(ctx, t, open(t, p.Addr(), ""))
	base := selectOne(ctx, t, c)

	const d = 100 * time.Millisecond
	p.SetLatency(d)
	for range 3 {
		if got := selectOne(ctx, t, c); got < 2*d {
			t.Errorf("SELECT 1 with latency %v: got %v (%v without); want >= %v", d, got, base, 2*d)
		}
	}

	// 4 MiB come back in well over a hundred chunks: if each chunk waited
	// out d after the one before, the reply would take 10 s or more.
	const size = 4 << 20
	before := p.Stats().ToClient
	start := time.Now()
	var n int
	if err := c.QueryRowContext(ctx, fmt.Sprintf("SELECT LENGTH(REPEAT('x', %d)), REPEAT('x', %d)", size, size)).Scan(&n, new([]byte)); err != nil || n != size {
		t.Fatalf("large SELECT: got %d, %v; want %d, nil", n, err, size)
	}
	took := time.Since(start)
	if took < 2*d || took > 2*d+2*time.Second {
		t.Errorf("%d-byte reply with latency %v: took %v; want between %v and %v", size, d, took, 2*d, 2*d+2*time.Second)
	}
	t.Logf("SELECT 1 took %v without latency; %d bytes took %v with latency %v", base, p.Stats().ToClient-before, took, d)

	p.SetLatency(0)
	if got := selectOne(ctx, t, c); got >= d {
		t.Errorf("SELECT 1 after SetLatency(0): got %v; want < %v", got, d)
	}
}

// TestCut checks that a query fails while the proxy is cut, without the
// connection being reset, and that new connections work once it is not.
func TestCut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newProxy(t)
	db := open(t, p.Addr(), "")
	c := conn(ctx, t, db)
	selectOne(ctx, t, c)

	p.Cut(true)
	queryCtx, cancelQuery := context.WithTimeout(ctx, time.Second)
	var one int
	start := time.Now()
	err := c.QueryRowContext(queryCtx, "SELECT 1").Scan(&one)
	cancelQuery()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SELECT 1 while cut: got %v after %v; want %v", err, time.Since(start), context.DeadlineExceeded)
	}
	if st := p.Stats(); st.Dropped == 0 {
		t.Errorf("Stats while cut: got %+v; want bytes dropped", st)
	}

	p.Cut(false)
	selectOne(ctx, t, conn(ctx, t, db))
}

// TestRefuse checks that new connections fail at once while the proxy
// refuses them, that an open one still works, and that new connections
// work again once it does not.
func TestRefuse(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := newProxy(t)
	db := open(t, p.Addr(), "")
	c := conn(ctx, t, db)
	selectOne(ctx, t, c)

	p.Refuse(true)
	before := p.Stats().Accepted
	start := time.Now()
	nc, err := db.Conn(ctx)
	if err == nil {
		nc.Close()
		t.Fatalf("new connection while refused: got nil error; want a failure")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("new connection while refused: failed after %v; want at once", took)
	}
	if got := p.Stats().Accepted; got == before {
		t.Errorf("Accepted while refused: got %d, as before; want the refused connections counted", got)
	}
	selectOne(ctx, t, c) // open before: untouched

	p.Refuse(false)
	selectOne(ctx, t, conn(ctx, t, db))
}

// TestDropNextReply checks that an INSERT whose reply is dropped fails on
// the client yet ran on the server, and that only that connection is
// black-holed.
func TestDropNextReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	direct := open(t, "", "")
	for _, q := range []string{
		"CREATE DATABASE IF NOT EXISTS faultproxy",
		"CREATE TABLE IF NOT EXISTS faultproxy.dropped (id INT PRIMARY KEY)",
		"DELETE FROM faultproxy.dropped",
	} {
		if _, err := direct.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	p := newProxy(t)
	db := open(t, p.Addr(), "faultproxy")
	c := conn(ctx, t, db)
	selectOne(ctx, t, c) // the handshake is done: the next reply is the INSERT's

	dropped := p.DropNextReply()
	select {
	case <-dropped:
		t.Fatal("the channel from DropNextReply closed before any reply was sent")
	default:
	}
	insertCtx, cancelInsert := context.WithTimeout(ctx, time.Second)
	_, err := c.ExecContext(insertCtx, "INSERT INTO dropped VALUES (7)")
	cancelInsert()
	if err == nil {
		t.Fatal("INSERT whose reply is dropped: got nil error; want an error")
	}
	select {
	case <-dropped:
	case <-time.After(5 * time.Second):
		t.Fatal("the channel from DropNextReply is still open after the INSERT failed")
	}
	var n int
	if err := direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM faultproxy.dropped WHERE id = 7").Scan(&n); err != nil || n != 1 {
		t.Errorf("rows with id 7 on the server: got %d, %v; want 1, nil", n, err)
	}
	if st := p.Stats(); st.Dropped == 0 {
		t.Errorf("Stats: got %+v; want bytes dropped", st)
	}

	// Other connections, and new ones, are untouched.
	other := conn(ctx, t, db)
	if err := other.QueryRowContext(ctx, "SELECT COUNT(*) FROM dropped").Scan(&n); err != nil || n != 1 {
		t.Errorf("rows through the proxy on a new connection: got %d, %v; want 1, nil", n, err)
	}
}

// TestCloseWithOpenConnections checks that Close ends connections that are
// cut and busy; goleak in TestMain checks that no goroutine is left.
func TestCloseWithOpenConnections(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", server.Port()))
	if err != nil {
		t.Fatal(err)
	}
	db := open(t, p.Addr(), "")
	c := conn(ctx, t, db)
	selectOne(ctx, t, c)
	p.SetLatency(time.Hour)
	errc := make(chan error, 1)
	go func() {
		_, err := c.ExecContext(ctx, "DO 1")
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := <-errc; err == nil {
		t.Error("statement on a connection closed by Close: got nil error; want an error")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close with a delayed chunk in flight took %v", took)
	}
}

package dsync_test

// Tests of WithReplaceLostLease (issue 18, item 5): a session that lost its
// lease opens a new one for the calls that hold nothing, and still reports
// every hold that was lost. Each test makes the loss happen as production
// does (the network cut under the session's renewals) and proves it
// happened before it asserts anything else.

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/go-sql-driver/mysql"
)

// replaceSession opens a session WithReplaceLostLease and a TTL of 1s, the
// shortest, on db, and closes it when the test ends.
func replaceSession(t *testing.T, db *sql.DB) *dsync.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := dsync.NewSession(ctx, db, dsync.WithTTL(time.Second), dsync.WithReplaceLostLease(),
		dsync.WithLogger(slog.New(slog.NewTextHandler(faultLogWriter{t}, nil))))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// awaitNewLease waits up to limit for s to have a lease other than old,
// and returns its id.
func awaitNewLease(t *testing.T, s *dsync.Session, old int64, limit time.Duration) int64 {
	t.Helper()
	for deadline := time.Now().Add(limit); ; time.Sleep(10 * time.Millisecond) {
		if id := s.ID(); id != old {
			return id
		}
		if time.Now().After(deadline) {
			t.Fatalf("session's lease: still %d %v later; want a new one", old, limit)
		}
	}
}

// TestReplaceLostLeaseWaiter: a Lock waiting with context.Background()
// while its session's lease is lost and the database refuses every
// connection goes on waiting, tries to open a new lease with back-off (a
// few connection attempts a second, not a busy loop), and takes the lock
// under the new lease once the database is back and the holder releases
// it, with a greater fence.
func TestReplaceLostLeaseWaiter(t *testing.T) {
	slowTest(t)
	const outage = 2 * time.Second
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	direct := dbtest.Open(t)
	name := lockName(t)

	holder := dsync.NewMutex(faultSession(t, direct, 10*time.Second), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatalf("holder's Lock: got %v; want nil", err)
	}
	held := holder.Fence()
	ws := replaceSession(t, dbtest.OpenDSN(t, dsn))
	waiter := dsync.NewMutex(ws, name)
	lockErr := make(chan error, 1)
	go func() { lockErr <- waiter.Lock(bg) }()
	for deadline := time.Now().Add(10 * time.Second); ws.Stats().Waiting == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("waiter's Lock: not waiting after 10s")
		}
	}
	lost, done := ws.ID(), ws.Done()

	p.Cut(true)    // the renewals get no answer
	p.Refuse(true) // and every new connection fails at once
	if !isClosed(done, 3*time.Second) {
		t.Fatalf("waiter's Done: still open 3s after the cut; want closed (the lease lost)")
	}
	if err := ws.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("waiter's session Err after the cut: got %v; want ErrSessionExpired", err)
	}
	if st := p.Stats(); st.Dropped == 0 {
		t.Fatalf("proxy after the cut: got %+v; want bytes dropped (the fault did not happen)", st)
	}

	a0, q0, from := p.Stats().Accepted, serverQuestions(t, direct), time.Now()
	time.Sleep(outage)
	attempts, statements, d := p.Stats().Accepted-a0, serverQuestions(t, direct)-q0-1, time.Since(from)
	t.Logf("while the database refused connections: %d connection attempts and %d statements on the server in %v",
		attempts, statements, d.Round(time.Millisecond))
	if rate := float64(attempts) / d.Seconds(); rate > spinBudget {
		t.Errorf("connection attempts while the database refused them: got %.1f/s; want at most %.0f/s", rate, spinBudget)
	}
	if attempts == 0 {
		t.Errorf("connection attempts while the database refused them: got none; want the session to try for a new lease")
	}
	if rate := float64(statements) / d.Seconds(); rate > spinBudget {
		t.Errorf("statements on the server while the waiter's database was unreachable: got %.1f/s; want at most %.0f/s", rate, spinBudget)
	}
	select {
	case err := <-lockErr:
		t.Fatalf("waiter's Lock during the outage: returned %v; want it still waiting", err)
	default:
	}
	if got := ws.Stats().Waiting; got != 1 {
		t.Errorf("Stats.Waiting while the Lock waits for a new lease: got %d; want 1", got)
	}

	p.Refuse(false)
	p.Cut(false)
	renewed := awaitNewLease(t, ws, lost, 10*time.Second)
	if err := ws.Err(); err != nil {
		t.Errorf("session Err with its new lease: got %v; want nil", err)
	}
	if isClosed(ws.Done(), 0) {
		t.Errorf("session Done with its new lease: got closed; want open")
	}
	select {
	case err := <-lockErr:
		t.Fatalf("waiter's Lock with the holder still holding: returned %v; want it still waiting", err)
	default:
	}
	if err := holder.Unlock(bg); err != nil {
		t.Fatalf("holder's Unlock: got %v; want nil", err)
	}
	select {
	case err := <-lockErr:
		if err != nil {
			t.Fatalf("waiter's Lock across the lost lease: got %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("waiter's Lock: still waiting 10s after the holder's Unlock")
	}
	if got := ws.ID(); got != renewed {
		t.Errorf("session ID while holding: got %d; want %d, the new lease", got, renewed)
	}
	if st := ws.Stats(); st.Waiting != 0 || st.Contended != 1 || st.WaitTime < outage {
		t.Errorf("Stats after the Lock across the lost lease: got Waiting %d, Contended %d, WaitTime %v; want 0, 1 and at least the outage, %v",
			st.Waiting, st.Contended, st.WaitTime, outage)
	}
	if h := readHoldState(t, direct, "Mutex", name); len(h.holders) != 1 || h.holders[0] != renewed {
		t.Errorf("lock row's holder: got %v; want [%d], the new lease (lost: %d)", h.holders, renewed, lost)
	}
	if got := waiter.Fence(); got <= held {
		t.Errorf("waiter's fence: got %d; want more than the holder's %d", got, held)
	}
	if isClosed(ws.Done(), 0) {
		t.Errorf("session Done read while holding under the new lease: got closed; want open")
	}
	if err := waiter.Unlock(bg); err != nil {
		t.Errorf("waiter's Unlock: got %v; want nil", err)
	}
}

// TestReplaceLostLeaseHold: a hold taken before the lease is lost is
// reported lost, exactly as without the option: Done read while holding
// closes, every call fails with ErrSessionExpired while the hold remains
// (no new lease is opened under it), Unlock returns ErrSessionExpired, and
// another session takes the lock only after Done closed. Once the hold is
// released, the session opens a new lease and locks again, with greater
// fences.
func TestReplaceLostLeaseHold(t *testing.T) {
	slowTest(t)
	for _, kind := range faultKinds {
		t.Run(kind, func(t *testing.T) { replaceLostLeaseHold(t, kind) })
	}
}

func replaceLostLeaseHold(t *testing.T, kind string) {
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	direct := dbtest.Open(t)
	name := lockName(t)

	ws := replaceSession(t, dbtest.OpenDSN(t, dsn))
	mine := newFaultLock(kind, ws, name)
	if err := mine.Lock(bg); err != nil {
		t.Fatalf("Lock: got %v; want nil", err)
	}
	lost, done, fence := ws.ID(), ws.Done(), mine.Fence()
	other := newFaultLock(kind, faultSession(t, direct, 10*time.Second), name)
	// The other session polls: when it first gets the lock, the holder
	// must already know it lost it.
	taken := make(chan bool, 1) // whether Done was closed when the other took it
	ctx, cancel := context.WithTimeout(bg, 15*time.Second)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if ok, err := other.TryLock(ctx); err != nil || ok {
				taken <- err == nil && isClosed(done, 0)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		taken <- false
	}()

	p.Cut(true)
	if !isClosed(done, 3*time.Second) {
		t.Fatalf("Done read while holding: still open 3s after the cut; want closed")
	}
	if st := p.Stats(); st.Dropped == 0 {
		t.Fatalf("proxy after the cut: got %+v; want bytes dropped (the fault did not happen)", st)
	}
	if err := ws.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Err while holding after the cut: got %v; want ErrSessionExpired", err)
	}
	p.Cut(false)
	// While the hold remains, nothing replaces the lease: calls fail at
	// once, as without the option, and Done and Err still say lost.
	second := newFaultLock(kind, ws, name+"/second")
	if _, err := within(t, "second Lock while the lost hold remains", 5*time.Second, func() error { return second.Lock(bg) }); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("another Lock while the lost hold remains: got %v; want ErrSessionExpired", err)
	}
	if got := ws.ID(); got != lost {
		t.Errorf("session ID while the lost hold remains: got %d; want %d, the lost lease", got, lost)
	}
	if !isClosed(ws.Done(), 0) {
		t.Errorf("Done while the lost hold remains: got open; want closed")
	}
	select {
	case ok := <-taken:
		if !ok {
			t.Fatalf("other session's TryLock: failed, or succeeded before the holder's Done closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("other session's TryLock: still false 10s after the cut")
	}
	if err := mine.Unlock(bg); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Errorf("Unlock of the lost hold: got %v; want ErrSessionExpired", err)
	}

	// Nothing held: the next Lock opens a new lease.
	lctx, lcancel := context.WithTimeout(bg, 10*time.Second)
	defer lcancel()
	if err := second.Lock(lctx); err != nil {
		t.Fatalf("Lock after the lost hold was released: got %v; want nil", err)
	}
	if got := ws.ID(); got == lost {
		t.Errorf("session ID after the loss was reported: got %d, the lost lease; want a new one", got)
	}
	if err := ws.Err(); err != nil || isClosed(ws.Done(), 0) {
		t.Errorf("session with its new lease: Err %v, Done closed %v; want nil and open", err, isClosed(ws.Done(), 0))
	}
	if err := second.Unlock(bg); err != nil {
		t.Errorf("Unlock under the new lease: got %v; want nil", err)
	}
	ofence := other.Fence()
	if err := other.Unlock(bg); err != nil {
		t.Fatalf("other session's Unlock: got %v; want nil", err)
	}
	if err := mine.Lock(lctx); err != nil {
		t.Fatalf("Lock of the name again under the new lease: got %v; want nil", err)
	}
	if got := mine.Fence(); got <= ofence || ofence <= fence {
		t.Errorf("fences: lost hold %d, other session %d, new lease %d; want strictly increasing", fence, ofence, got)
	}
	if err := mine.Unlock(bg); err != nil {
		t.Errorf("Unlock under the new lease: got %v; want nil", err)
	}
}

// lostRefused returns a session made WithReplaceLostLease (see
// replaceSession) through a fault proxy, once it has lost its lease to the
// network cut, and with the proxy refusing every new connection.
func lostRefused(t *testing.T) (*faultproxy.Proxy, *dsync.Session) {
	t.Helper()
	p, dsn := dbtest.FaultProxy(t)
	ws := replaceSession(t, dbtest.OpenDSN(t, dsn))
	done := ws.Done()
	p.Cut(true)
	p.Refuse(true)
	if !isClosed(done, 3*time.Second) {
		t.Fatalf("Done: still open 3s after the cut; want closed")
	}
	if st := p.Stats(); st.Dropped == 0 {
		t.Fatalf("proxy after the cut: got %+v; want bytes dropped (the fault did not happen)", st)
	}
	return p, ws
}

// TestReplaceLostLeaseClose: Close while a Lock waits for a new lease (the
// database refusing connections) ends the wait with ErrSessionClosed and
// opens no lease after it.
func TestReplaceLostLeaseClose(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	p, ws := lostRefused(t)
	m := dsync.NewMutex(ws, lockName(t))
	lockErr := make(chan error, 1)
	go func() { lockErr <- m.Lock(bg) }()
	time.Sleep(300 * time.Millisecond) // it tries for a new lease
	if _, err := within(t, "Close", 5*time.Second, ws.Close); err != nil {
		t.Errorf("Close of a lost session: got %v; want nil", err)
	}
	select {
	case err := <-lockErr:
		if !errors.Is(err, dsync.ErrSessionClosed) {
			t.Errorf("Lock waiting for a new lease at Close: got %v; want ErrSessionClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Lock waiting for a new lease: still waiting 5s after Close")
	}
	p.Refuse(false)
	p.Cut(false)
	if err := m.Lock(bg); !errors.Is(err, dsync.ErrSessionClosed) {
		t.Errorf("Lock after Close: got %v; want ErrSessionClosed", err)
	}
	if err := ws.Close(); !errors.Is(err, dsync.ErrSessionClosed) {
		t.Errorf("Close again: got %v; want ErrSessionClosed", err)
	}
}

// TestReplaceLostLeaseTxHandOver: a lease lost right after LockTx handed
// the lock row to the caller's transaction makes LockTx return
// ErrSessionExpired at once, as without the option, instead of running
// again on a new lease in that transaction, where it would wait for the
// row the transaction itself has locked until ctx ends. Nobody else takes
// the lock while the transaction runs; after its rollback the name is
// free to others, and the session locks under a new lease.
func TestReplaceLostLeaseTxHandOver(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	ws := replaceSession(t, db)
	lost := ws.ID()
	var expired atomic.Bool
	defer dsync.AfterTxHandOver(func(n string) {
		if n == name && !expired.Swap(true) {
			dsync.ExpireLocally(ws)
		}
	})()
	tx := beginTx(t, db, sql.LevelDefault)
	m := dsync.NewMutex(ws, name)
	ctx, cancel := context.WithTimeout(bg, 3*time.Second)
	defer cancel()
	took, err := within(t, "LockTx", 10*time.Second, func() error { return m.LockTx(ctx, tx) })
	if !expired.Load() {
		t.Fatalf("LockTx: returned %v without handing the row to tx; want the lease lost after the hand-over (the fault did not happen)", err)
	}
	if !errors.Is(err, dsync.ErrSessionExpired) || ctx.Err() != nil {
		t.Fatalf("LockTx with the lease lost after the hand-over: got %v after %v; want ErrSessionExpired before ctx ends", err, took.Round(time.Millisecond))
	}
	other := dsync.NewMutex(faultSession(t, db, 10*time.Second), name)
	if ok, err := other.TryLock(ctx); ok || err != nil {
		t.Fatalf("another session's TryLock while tx runs: got %v, %v; want false, nil", ok, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	lctx, lcancel := context.WithTimeout(bg, 10*time.Second)
	defer lcancel()
	if err := other.Lock(lctx); err != nil {
		t.Fatalf("another session's Lock after the rollback: got %v; want nil", err)
	}
	if err := other.Unlock(bg); err != nil {
		t.Fatalf("another session's Unlock: got %v; want nil", err)
	}
	if err := m.Lock(lctx); err != nil {
		t.Fatalf("Lock after the loss: got %v; want nil", err)
	}
	if got := ws.ID(); got == lost {
		t.Errorf("session ID after the loss: got %d, the lost lease; want a new one", got)
	}
	if err := m.Unlock(bg); err != nil {
		t.Errorf("Unlock under the new lease: got %v; want nil", err)
	}
}

// TestReplaceLostLeaseTxWaiting: a LockTx waiting in the database for
// another transaction's hold does not keep a lost lease from being
// replaced: another lock call of the session opens the new lease and
// locks at once. The LockTx carries on, and takes the lock under the new
// lease once the other transaction has ended.
func TestReplaceLostLeaseTxWaiting(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	tx1 := beginTx(t, db, sql.LevelDefault)
	if err := dsync.NewMutex(faultSession(t, db, 10*time.Second), name).LockTx(bg, tx1); err != nil {
		t.Fatalf("holder's LockTx: got %v; want nil", err)
	}
	ws := replaceSession(t, db)
	lost := ws.ID()
	tx2 := beginTx(t, db, sql.LevelDefault)
	m := dsync.NewMutex(ws, name)
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	lockErr := make(chan error, 1)
	go func() { lockErr <- m.LockTx(ctx, tx2) }()
	for deadline := time.Now().Add(10 * time.Second); ws.Stats().Waiting == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("LockTx: not waiting after 10s")
		}
	}
	dsync.ExpireLocally(ws)
	if err := ws.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("session Err after ExpireLocally: got %v; want ErrSessionExpired (the fault did not happen)", err)
	}

	second := dsync.NewMutex(ws, name+"/second")
	lctx, lcancel := context.WithTimeout(bg, 3*time.Second)
	defer lcancel()
	took, err := within(t, "Lock of another name", 10*time.Second, func() error { return second.Lock(lctx) })
	if err != nil {
		t.Fatalf("Lock of another name while LockTx waits for another transaction: got %v after %v; want nil, under a new lease", err, took.Round(time.Millisecond))
	}
	if got := ws.ID(); got == lost {
		t.Errorf("session ID after the loss: got %d, the lost lease; want a new one", got)
	}
	if err := second.Unlock(bg); err != nil {
		t.Errorf("Unlock under the new lease: got %v; want nil", err)
	}
	select {
	case err := <-lockErr:
		t.Fatalf("LockTx while the other transaction holds the name: returned %v; want it still waiting", err)
	default:
	}
	if err := tx1.Rollback(); err != nil {
		t.Fatalf("holder's Rollback: %v", err)
	}
	select {
	case err := <-lockErr:
		if err != nil {
			t.Fatalf("LockTx across the lost lease: got %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockTx: still waiting 10s after the holder's rollback")
	}
	if m.Fence() == 0 {
		t.Errorf("Fence of the LockTx hold: got 0; want the hold's")
	}
}

// TestReplaceLostLeasePace: while the database refuses connections, the
// tries to open a new lease keep the line's back-off however many calls
// want one and however short their ctx: four goroutines calling TryLock
// with a 20ms ctx in a loop cost a few connection attempts a second, not
// one per call.
func TestReplaceLostLeasePace(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	p, ws := lostRefused(t)
	m := dsync.NewMutex(ws, lockName(t))

	ctx, cancel := context.WithCancel(bg)
	var wg sync.WaitGroup
	var calls, expired atomic.Int64
	a0, from := p.Stats().Accepted, time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, 20*time.Millisecond)
				ok, err := m.TryLock(cctx)
				ccancel()
				calls.Add(1)
				if ok {
					t.Errorf("TryLock with the database refusing connections: got true; want false")
					m.Unlock(bg)
				}
				if errors.Is(err, dsync.ErrSessionExpired) {
					expired.Add(1)
				}
			}
		}()
	}
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	attempts, d := p.Stats().Accepted-a0, time.Since(from)
	t.Logf("%d TryLock calls, %d of them ErrSessionExpired; %d connection attempts in %v",
		calls.Load(), expired.Load(), attempts, d.Round(time.Millisecond))
	if expired.Load() == 0 {
		t.Fatalf("TryLock calls returning ErrSessionExpired: got none of %d; want them to meet the lost lease", calls.Load())
	}
	if rate := float64(attempts) / d.Seconds(); rate > spinBudget {
		t.Errorf("connection attempts while the database refused them: got %.1f/s; want at most %.0f/s", rate, spinBudget)
	}
	if attempts == 0 {
		t.Errorf("connection attempts while the database refused them: got none; want the session to try for a new lease")
	}

	p.Refuse(false)
	p.Cut(false)
	lctx, lcancel := context.WithTimeout(bg, 10*time.Second)
	defer lcancel()
	if err := m.Lock(lctx); err != nil {
		t.Fatalf("Lock once the database is back: got %v; want nil", err)
	}
	if err := m.Unlock(bg); err != nil {
		t.Errorf("Unlock under the new lease: got %v; want nil", err)
	}
}

// switchConnector opens connections through the connector to, once it is
// set, else through the one it embeds.
type switchConnector struct {
	sqldriver.Connector
	to atomic.Pointer[sqldriver.Connector]
}

func (c *switchConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	if to := c.to.Load(); to != nil {
		return (*to).Connect(ctx)
	}
	return c.Connector.Connect(ctx)
}

// connectorOf returns a connector for dsn.
func connectorOf(t *testing.T, dsn string) sqldriver.Connector {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLostSessionEndsBellConnOpen: a Lock (without a deadline) that is
// opening a connection to block on the holder's doorbell when the network
// goes dark, so that the open never completes, returns ErrSessionExpired
// once its session is lost, as every wait of a lost session does.
func TestLostSessionEndsBellConnOpen(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	p, dsn := dbtest.FaultProxy(t)
	dark, darkDSN := dbtest.FaultProxy(t)
	dark.Cut(true) // no connection through it ever opens
	conns := &switchConnector{Connector: connectorOf(t, dsn)}
	db := sql.OpenDB(conns)
	t.Cleanup(func() { db.Close() })
	direct := dbtest.Open(t)
	name := lockName(t)

	holder := dsync.NewMutex(faultSession(t, direct, 10*time.Second), name)
	if err := holder.Lock(bg); err != nil {
		t.Fatalf("holder's Lock: got %v; want nil", err)
	}
	ws := faultSession(t, db, time.Second)
	// The session's statement connections open before the dark: only the
	// waiter's doorbell connection is opened after it.
	warm := dsync.NewMutex(ws, name+"/warm")
	if err := warm.Lock(bg); err != nil {
		t.Fatalf("Lock of another name: got %v; want nil", err)
	}
	if err := warm.Unlock(bg); err != nil {
		t.Fatalf("Unlock of another name: got %v; want nil", err)
	}
	// A waiting connection adopts an idle one of the pool before it opens
	// one (connpool.DedicatedSpare): let the pool close its idle ones
	// (poolIdleFor), so that the waiter's is opened in the dark.
	for deadline := time.Now().Add(5 * time.Second); dsync.PoolOpen(ws) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("session's pool: %d connections open 5s after its last statement; want its idle ones closed", dsync.PoolOpen(ws))
		}
	}
	to := connectorOf(t, darkDSN)
	conns.to.Store(&to)

	ctx, cancel := context.WithCancel(bg) // no deadline; ends the Lock when the test fails
	defer cancel()
	lockErr := make(chan error, 1)
	go func() { lockErr <- dsync.NewMutex(ws, name).Lock(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); dsync.BellWaitConnsInUse(ws) == 0 || dark.Stats().Accepted == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waiter: not opening a doorbell connection after 10s (in use %d, dark connections %d; the fault did not happen)",
				dsync.BellWaitConnsInUse(ws), dark.Stats().Accepted)
		}
	}
	p.Cut(true) // and the renewals get no answer
	if !isClosed(ws.Done(), 3*time.Second) {
		t.Fatalf("waiter's Done: still open 3s after the cut; want closed (the lease lost)")
	}
	select {
	case err := <-lockErr:
		if !errors.Is(err, dsync.ErrSessionExpired) {
			t.Errorf("waiter's Lock after its session was lost: got %v; want ErrSessionExpired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter's Lock: still opening its doorbell connection 5s after its session was lost")
	}
}

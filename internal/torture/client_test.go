//go:build linux

package torture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/dsynclock/dsync"
)

// The environment of a client process (the test binary run again).
const (
	envChild      = "DSYNC_TORTURE_CHILD" // set: run as a client
	envProc       = "DSYNC_TORTURE_PROC"
	envInc        = "DSYNC_TORTURE_INC"
	envDSN        = "DSYNC_TORTURE_DSN"     // the client's DSN, through its fault proxy
	envRegDSN     = "DSYNC_TORTURE_REG_DSN" // the register's DSN, straight to the server
	envSeed       = "DSYNC_TORTURE_SEED"
	envTTL        = "DSYNC_TORTURE_TTL"
	envUntil      = "DSYNC_TORTURE_UNTIL" // CLOCK_MONOTONIC ns at which to stop
	envGoroutines = "DSYNC_TORTURE_GOROUTINES"
	envNoLockTx   = "DSYNC_TORTURE_NO_LOCKTX" // set: no LockTx (a Galera cluster)
)

// The lock names every client uses: Mutex names (Lock, TryLock, LockTx),
// one FairMutex name per goroutine number (so that a process waits for
// each with one goroutine at most, and its ticket is its call's), and one
// RWMutex name.
var mutexNames = []string{"m0", "m1"}

const rwName = "rw0"

func fairName(g int) string { return "f" + strconv.Itoa(g) }

// The register's statement: it lands only with a fence above the one it
// holds; a trigger logs every landed write with its key, in the same
// statement, so that the outcome of a write whose reply was lost can be
// read afterwards.
const writeRegister = "UPDATE torture_reg SET fence = ?, k = ? WHERE name = ? AND fence < ?"

// client is one client process.
type client struct {
	rec   *recorder
	db    *sql.DB // the client's database, through its fault proxy
	regDB *sql.DB // the register, straight to the server
	ttl   time.Duration
	until int64
	seed  uint64
	// noLockTx leaves LockTx out (Galera does not support it): its share
	// goes to Lock and TryLock.
	noLockTx bool

	mu   sync.Mutex
	sess *dsync.Session // the current session, nil between sessions; guarded by mu

	semMu sync.Mutex // held by the goroutine that uses the semaphore (see semaphore)
}

func (c *client) current() *dsync.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sess
}

// runClient is a client process's main: sessions opened and closed at
// random moments, and goroutines running random operations, until the
// time given.
func runClient() int {
	atoi := func(k string) int64 { n, _ := strconv.ParseInt(os.Getenv(k), 10, 64); return n }
	ttl, _ := time.ParseDuration(os.Getenv(envTTL))
	c := &client{
		rec:   &recorder{w: os.Stdout, proc: int(atoi(envProc)), inc: int(atoi(envInc))},
		ttl:   ttl,
		until: atoi(envUntil),
		seed:  uint64(atoi(envSeed)),

		noLockTx: os.Getenv(envNoLockTx) != "",
	}
	var err error
	if c.db, err = sql.Open("mysql", os.Getenv(envDSN)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if c.regDB, err = sql.Open("mysql", os.Getenv(envRegDSN)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.observe()
	}()
	for g := range int(atoi(envGoroutines)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(g)
		}()
	}
	c.sessions()
	wg.Wait()
	if s := c.current(); s != nil {
		c.close(s)
	}
	return 0
}

func result(e Event, err error) Event {
	if err != nil {
		e.Res, e.Err = "fail", err.Error()
	} else {
		e.Res = "ok"
	}
	return e
}

func (c *client) rng(g int) *rand.Rand {
	return rand.New(rand.NewPCG(c.seed, uint64(c.rec.proc)<<32|uint64(c.rec.inc)<<16|uint64(g+1)))
}

// sessions opens a session, keeps it for a random while (or until it is
// lost), closes it, and opens the next, until the end. Half the sessions
// are made WithReplaceLostLease: those are kept when a lease is lost, and
// replace it.
func (c *client) sessions() {
	rng := c.rng(-1)
	for now() < c.until {
		replace := rng.IntN(2) == 0
		opts := []dsync.Option{dsync.WithTTL(c.ttl), dsync.WithLabel(fmt.Sprintf("torture-p%d.%d", c.rec.proc, c.rec.inc))}
		if replace {
			opts = append(opts, dsync.WithReplaceLostLease())
		}
		id := c.rec.call(-1, Event{Op: opOpen, Owner: replace})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := dsync.NewSession(ctx, c.db, opts...)
		cancel()
		if err != nil {
			c.rec.ret(-1, id, result(Event{Op: opOpen}, err))
			time.Sleep(200 * time.Millisecond)
			continue
		}
		c.rec.ret(-1, id, Event{Op: opOpen, Res: "ok", Sess: s.ID()})
		closed := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			c.watch(s, replace, closed)
		}()
		c.mu.Lock()
		c.sess = s
		c.mu.Unlock()
		epoch := time.Duration(3000+rng.IntN(7000)) * time.Millisecond
		left := time.Duration(c.until - now())
		if left <= epoch {
			// Keep the last session to the end: runClient closes it.
			<-time.After(left)
			return
		}
		lost := s.Done()
		if replace {
			lost = nil
		}
		select {
		case <-time.After(epoch):
		case <-lost:
		}
		c.mu.Lock()
		c.sess = nil
		c.mu.Unlock()
		c.close(s)
		close(closed)
		<-watched
	}
}

// close closes s and records it, with the lease ids it had before and
// after (a lease replaced meanwhile is ended by Close too).
func (c *client) close(s *dsync.Session) {
	before := s.ID()
	id := c.rec.call(-1, Event{Op: opClose, Sess: before})
	err := s.Close()
	// Close returns nil for a lease that was lost already, without
	// deleting it: the database may count it live a while longer (see
	// Lost, for the election model).
	lost := !errors.Is(s.Err(), dsync.ErrSessionClosed)
	after := s.ID()
	e := result(Event{Op: opClose, Sess: before, Lost: lost || after != before}, err)
	c.rec.ret(-1, id, e)
	if after != before && err == nil {
		c.rec.event(-1, Event{Op: opClose, Sess: after, Res: "ok", Lost: lost})
	}
}

// watch records each lease of s ending (Done closed), until closed; with
// replace, it goes on with the next lease.
func (c *client) watch(s *dsync.Session, replace bool, closed <-chan struct{}) {
	for {
		id := s.ID()
		done := s.Done()
		if s.ID() != id {
			continue // replaced between the two reads
		}
		select {
		case <-done:
			c.rec.event(-1, Event{Op: opDone, Sess: id, Err: fmt.Sprint(s.Err())})
		case <-closed:
			return
		}
		if !replace {
			<-closed
			return
		}
		for s.ID() == id {
			select {
			case <-closed:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// deadline returns a ctx with a random deadline, or none.
func deadline(rng *rand.Rand, base context.Context, min, max time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(base, min+time.Duration(rng.Int64N(int64(max-min))))
}

// work is one goroutine's loop of random operations.
func (c *client) work(g int) {
	rng := c.rng(g)
	base := context.Background()
	owner := g%2 == 0
	if owner {
		base = dsync.WithOwner(base)
	}
	for now() < c.until {
		s := c.current()
		if s == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		switch r := rng.IntN(100); {
		case r < 24:
			c.mutexLock(g, rng, base, owner, s, false)
		case r < 31:
			c.mutexLock(g, rng, base, owner, s, true)
		case r < 42 && c.noLockTx:
			c.mutexLock(g, rng, base, owner, s, r < 39)
		case r < 42:
			c.lockTx(g, rng, base, owner, s)
		case r < 53:
			c.fairLock(g, rng, base, owner, s)
		case r < 61:
			c.rLock(g, rng, base, owner, s)
		case r < 69:
			c.wLock(g, rng, base, owner, s)
		case r < 80:
			c.campaign(g, rng, base, s)
		case r < 86:
			c.readLeader(g, rng, base, s)
		default:
			c.semaphore(g, rng, base, s)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
	}
}

// held runs the work of a hold: a few checks that the session still holds
// (Session.Err), and, for an exclusive hold with a fence, writes of the
// fenced register. One hold in three is long (up to two TTLs, checked
// every 50-150 ms), so that some holds span a fault: the checks then tell
// whether the session knew of the loss of its lease before the database
// let another session take the lock. It returns false once a check failed.
func (c *client) held(g int, rng *rand.Rand, s *dsync.Session, name string, shared bool, fence int64) bool {
	checks, gap := 1+rng.IntN(3), 60
	if rng.IntN(3) == 0 {
		checks, gap = 2+rng.IntN(int(2*c.ttl/(100*time.Millisecond))), 150
	}
	for range checks {
		time.Sleep(time.Duration(gap/3+rng.IntN(gap*2/3)) * time.Millisecond)
		id := c.rec.call(g, Event{Op: opCheck, Name: name})
		err := s.Err()
		c.rec.ret(g, id, result(Event{Op: opCheck, Name: name}, err))
		if err != nil {
			return false
		}
		if !shared && fence != 0 && rng.IntN(2) == 0 {
			c.write(g, c.regDB, name, fence)
		}
	}
	return true
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// write writes the fenced register with fence, through db (a transaction
// of LockTx, or the register's pool).
func (c *client) write(g int, db execer, name string, fence int64) {
	key := fmt.Sprintf("%d.%d.%d.%d", c.rec.proc, c.rec.inc, g, now())
	e := Event{Op: opWrite, Name: name, Fence: fence, Key: key}
	id := c.rec.call(g, e)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := db.ExecContext(ctx, writeRegister, fence, key, name, fence)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	switch {
	case err != nil:
		e.Res, e.Err = "unknown", err.Error()
	case n == 1:
		e.Res = "landed"
	default:
		e.Res = "refused"
	}
	c.rec.ret(g, id, e)
}

// unlock releases a hold with a random deadline (sometimes one too short
// for the statement).
func (c *client) unlock(g int, rng *rand.Rand, base context.Context, op, name string, owner bool, f func(context.Context) error) {
	ctx, cancel := base, context.CancelFunc(func() {})
	if rng.IntN(5) == 0 {
		ctx, cancel = deadline(rng, base, time.Millisecond, 5*time.Millisecond)
	}
	defer cancel()
	id := c.rec.call(g, Event{Op: op, Name: name, Owner: owner})
	err := f(ctx)
	c.rec.ret(g, id, result(Event{Op: op, Name: name}, err))
}

// lockCalls is one way to take a lock: an acquisition, the fence of the
// hold, and its release.
type lockCalls struct {
	op, name string
	shared   bool                                // a read hold: no fence, no register writes
	lock     func(context.Context) (bool, error) // false, nil: not taken (TryLock)
	fence    func() int64                        // nil for a read hold
	unlockOp string
	unlock   func(context.Context) error
}

// lockAndHold runs one acquisition with a deadline between min and max,
// or, one time in four, between 1 and 20 ms, which often ends while the
// acquisition's statement runs (then the session undoes an acquisition
// that landed, in the background), and when it took the lock, the hold's
// work (held) and the release.
func (c *client) lockAndHold(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session, min, max time.Duration, l lockCalls) {
	if rng.IntN(4) == 0 {
		min, max = time.Millisecond, 20*time.Millisecond
	}
	ctx, cancel := deadline(rng, base, min, max)
	id := c.rec.call(g, Event{Op: l.op, Name: l.name, Owner: owner})
	ok, err := l.lock(ctx)
	cancel()
	e := result(Event{Op: l.op, Name: l.name, Sess: s.ID()}, err)
	if err == nil && !ok {
		e.Res = "fail"
	}
	if e.Res == "ok" && l.fence != nil {
		e.Fence = l.fence()
	}
	c.rec.ret(g, id, e)
	if e.Res != "ok" {
		return
	}
	c.held(g, rng, s, l.name, l.shared, e.Fence)
	c.unlock(g, rng, base, l.unlockOp, l.name, owner, l.unlock)
}

func (c *client) mutexLock(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session, try bool) {
	name := mutexNames[rng.IntN(len(mutexNames))]
	m := dsync.NewMutex(s, name)
	l := lockCalls{op: opLock, name: name, fence: m.Fence, unlockOp: opUnlock, unlock: m.Unlock,
		lock: func(ctx context.Context) (bool, error) { return true, m.Lock(ctx) }}
	if try {
		l.op, l.lock = opTryLock, m.TryLock
	}
	c.lockAndHold(g, rng, base, owner, s, 20*time.Millisecond, 2*time.Second, l)
}

// fairLock takes a FairMutex, looking for its waiter's ticket meanwhile.
func (c *client) fairLock(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session) {
	name := fairName(g)
	m := dsync.NewFairMutex(s, name)
	c.lockAndHold(g, rng, base, owner, s, 50*time.Millisecond, 3*time.Second, lockCalls{
		op: opFairLock, name: name, fence: m.Fence, unlockOp: opUnlock, unlock: m.Unlock,
		lock: func(ctx context.Context) (bool, error) {
			stop := make(chan struct{})
			looked := make(chan struct{})
			go func() {
				defer close(looked)
				c.lookForTicket(g, s, name, stop)
			}()
			err := m.Lock(ctx)
			close(stop)
			<-looked
			if err == nil {
				// A waiter granted at once was never seen waiting: its
				// ticket, which it holds until Unlock, is read now.
				c.lookOnce(g, s, name)
			}
			return true, err
		},
	})
}

// lookForTicket records, until stop, the ticket the session's waiter holds
// for name, every 15 ms, for the FairMutex order check. It reads
// dsync_ticket, whose rows are documented in docs/OPERATIONS.md (dsync ls
// reads them too); if a later schema changes them, the look finds nothing
// and the order check has no tickets to compare.
func (c *client) lookForTicket(g int, s *dsync.Session, name string, stop <-chan struct{}) {
	t := time.NewTicker(15 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		c.lookOnce(g, s, name)
	}
}

// lookOnce records the ticket the session holds for name, if it holds one.
func (c *client) lookOnce(g int, s *dsync.Session, name string) {
	call := now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	sess := s.ID()
	seqs, err := c.tickets(ctx, name, sess)
	cancel()
	if err != nil || len(seqs) != 1 {
		// None yet, or a ticket a fault left behind beside this call's:
		// which is whose is not known.
		return
	}
	c.rec.mu.Lock()
	c.rec.next++
	id := c.rec.next
	c.rec.mu.Unlock()
	c.rec.emit(Event{G: g, ID: id, Type: "call", TS: call, Op: opTicket, Name: name})
	c.rec.ret(g, id, Event{Op: opTicket, Name: name, Seq: seqs[0], Sess: sess, Res: "ok"})
}

// tickets returns the numbers of the tickets the session holds for name.
func (c *client) tickets(ctx context.Context, name string, sess int64) ([]int64, error) {
	rows, err := c.regDB.QueryContext(ctx, "SELECT seq FROM dsync_ticket WHERE name = ? AND holder = ?", name, sess)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, rows.Err()
}

func (c *client) rLock(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session) {
	rw := dsync.NewRWMutex(s, rwName)
	c.lockAndHold(g, rng, base, owner, s, 20*time.Millisecond, 2*time.Second, lockCalls{
		op: opRLock, name: rwName, shared: true, unlockOp: opRUnlock, unlock: rw.RUnlock,
		lock: func(ctx context.Context) (bool, error) { return true, rw.RLock(ctx) },
	})
}

func (c *client) wLock(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session) {
	rw := dsync.NewRWMutex(s, rwName)
	c.lockAndHold(g, rng, base, owner, s, 20*time.Millisecond, 2*time.Second, lockCalls{
		op: opWLock, name: rwName, fence: rw.Fence, unlockOp: opUnlock, unlock: rw.Unlock,
		lock: func(ctx context.Context) (bool, error) { return true, rw.Lock(ctx) },
	})
}

// lockTx takes a Mutex for a new transaction, writes the register in it,
// and commits, rolls back, or rolls back to a savepoint taken before the
// LockTx (which ends the hold while the transaction goes on) and then
// rolls back.
func (c *client) lockTx(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session) {
	name := mutexNames[rng.IntN(len(mutexNames))]
	m := dsync.NewMutex(s, name)
	ctx, cancel := context.WithTimeout(base, 10*time.Second)
	defer cancel()
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer tx.Rollback()
	end := rng.IntN(100)
	if end < 15 {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT before_lock"); err != nil {
			return
		}
	}
	lctx, lcancel := deadline(rng, base, 20*time.Millisecond, 2*time.Second)
	id := c.rec.call(g, Event{Op: opLockTx, Name: name, Owner: owner})
	err = m.LockTx(lctx, tx)
	lcancel()
	e := result(Event{Op: opLockTx, Name: name, Sess: s.ID()}, err)
	if err == nil {
		e.Fence = m.Fence()
	}
	c.rec.ret(g, id, e)
	if err != nil {
		return
	}
	time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	if e.Fence != 0 {
		c.write(g, tx, name, e.Fence)
	}
	time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	op, f := opCommit, tx.Commit
	switch {
	case end < 15:
		op, f = opRTS, func() error {
			_, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT before_lock")
			return err
		}
	case end < 40:
		op, f = opRollback, tx.Rollback
	}
	id = c.rec.call(g, Event{Op: op, Name: name})
	err = f()
	c.rec.ret(g, id, result(Event{Op: op, Name: name}, err))
	if op == opRTS && err == nil {
		c.lockTxAgain(g, rng, base, owner, s, tx, m, e.Fence)
	}
}

// lockTxAgain runs LockTx again in tx after a ROLLBACK TO SAVEPOINT that
// ended tx's hold of m (fence fence): it must fail (ErrNotHeld), since a
// hold that ended never comes back. Had it returned nil, tx would claim
// the hold it had, so it is recorded as an acquisition with that hold's
// fence (or the one Fence reports), which the model finds illegal whatever
// happened meanwhile (fences only go up). It then writes the register in
// tx and rolls tx back.
func (c *client) lockTxAgain(g int, rng *rand.Rand, base context.Context, owner bool, s *dsync.Session, tx *sql.Tx, m *dsync.Mutex, fence int64) {
	ctx, cancel := deadline(rng, base, 20*time.Millisecond, 2*time.Second)
	defer cancel()
	name := m.Name()
	id := c.rec.call(g, Event{Op: opLockTx, Name: name, Owner: owner})
	err := m.LockTx(ctx, tx)
	e := result(Event{Op: opLockTx, Name: name, Sess: s.ID()}, err)
	if err == nil {
		e.Fence = fence
		if f := m.Fence(); f != 0 {
			e.Fence = f
		}
	}
	c.rec.ret(g, id, e)
	if err != nil {
		return
	}
	if e.Fence != 0 {
		c.write(g, tx, name, e.Fence)
	}
	id = c.rec.call(g, Event{Op: opRollback, Name: name})
	err = tx.Rollback()
	c.rec.ret(g, id, result(Event{Op: opRollback, Name: name}, err))
}

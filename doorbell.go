package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// Doorbells: how a Mutex waiter in another process learns of a release
// without polling.
//
// Each session that has held or waited for a lock keeps a doorbell: a named lock
// (GET_LOCK) called "dsync:<lease id>:<generation>", held on a connection of
// its own, whose generation it publishes in its lease row (lease.bell). A
// waiter says that it waits (lock.wanted_until, qLockWant), reads who holds
// the lock and that session's doorbell (qLockBell), and blocks in GET_LOCK
// on it (qBellWait). A release that finds wanted_until current, and a want
// since the row was acquired (waiter <> 0, see qCreateLock), rings
// (qLockRelease): the releaser takes the next generation and lets the current one go
// (qBellRing), which wakes every waiter blocked on it, and then publishes
// the next generation. A Mutex release that finds the doorbell's connection
// free runs there and rings inside its own statement (qLockReleaseRing,
// freeRinging), a statement sooner. A woken waiter tries the lock row
// again.
//
// A release does not miss a waiter: a waiter reads the doorbell after
// saying that it waits (the Mutex row's wanted_until, or the marker, which
// it writes while it holds the ticket ahead locked, or, behind a holder of
// a queued lock's head slot, its own ticket, which the slot's release
// reads under the row lock that every enqueue takes), so a release that
// comes after rings the generation it read or a later one, and a waiter
// that blocks on a generation already rung (the next one is published
// after the ring, so a waiter may read one that has rung) gets it at
// once. An acquisition voids the Mutex row's wants (waiter 0), so that
// the uncontended holds after a wait ring nothing: a waiter whose read
// finds its want voided (an acquisition came between the two) says it
// again before it blocks, and a claimant that acquires leaves waiter -1,
// so that its release rings for those that read it as the claimant.
// Every path
// that frees a row or ticket rings (Unlock, the reaper, undo, Close's
// clean-up, ForceRelease, which closes the holder's doorbell connection),
// and so does a claimant that gives up (also when its claim was taken
// over). What is left is bounded: a marker of a ticket whose enqueue had
// an unknown outcome, or one deleted by a purge that raced a number
// coming again, costs its waiter at most bellWait; a Mutex waiter whose
// qLockWant met the row locked (so wanted_until may not be written)
// blocks at most paceCap. The row stays the only source of truth: a
// doorbell that rings for nothing, or never, costs a retry or a wait,
// never a wrong answer.
//
// A wake-up is only a hint, and a waiter never tries again at once on the
// grounds it tried on last (judge): a doorbell it woke from, rung or gone
// with its connection (a dead holder or claimant, a killed connection, a
// server restart), is never blocked on again (found again, its next
// generation is, once); finding nobody to wait for (a row that a
// transaction holds after its session ended) lets it try at once only
// when the lock's fence moved since it last found nobody. Otherwise it
// polls, paced from paceFloor up to paceCap, until it finds something
// new.
//
// Doorbells are per server, not replicated, so on a Galera
// cluster (where MariaDB refuses GET_LOCK) waiters poll instead, as they do
// when the *sql.DB limits its open connections to fewer than
// bellsMinLimit. Doorbells take connections of their own: one per session
// that has held (or, without a connection limit, waited for) a lock, and
// one per session that waits (bellWaiters), or, with a connection limit,
// one for all the sessions of the *sql.DB, all of them within
// dedicatedCap. A waiter without a connection to block on, or whose
// holder has no doorbell (bell 0), paces itself (connPace, nextPace). A
// waiter blocks, and paces itself, no longer than the holder's lease has
// left (see bellWaiter.wait, nextPace), so a holder that stopped renewing
// (paused, cut off, dead) is overtaken as soon as its lease ends.
const (
	bellWait    = 8 * time.Second      // longest block on one doorbell, then the row is tried again
	bellWaiters = 1                    // most connections a session blocks on doorbells with
	bellLate    = 5 * time.Millisecond // a block outlasts the holder's lease by this much
)

// bellName is the GET_LOCK name of generation gen of session id's doorbell
// (at most 6+16+1+16 = 39 characters; the limit is 64).
func bellName(id, gen int64) string { return fmt.Sprintf("dsync:%x:%x", id, gen) }

// ticketBellName is the GET_LOCK name of the own doorbell of the ticket
// that session id's acquisition token holds (see qTicketInsertBell), as
// ticketBellSQL makes it from the ticket's row: lease id and token, both
// positive, in lower-case hex (at most 7+16+1+16 = 40 characters). The
// two name one acquisition (tokens come from a per-session counter): a
// ticket number comes again once the line empties, and a bell left held
// by an earlier ticket of the number must not stand for the new one.
func ticketBellName(id, token int64) string { return fmt.Sprintf("dsynct:%x:%x", id, token) }

// doorbell is the holder side: a goroutine that takes the session's
// doorbell when the session first holds a Mutex, rings it on request and
// publishes its generations; and the connection that holds it, on which a
// release may ring it in its own statement (freeRinging). It is given
// what it needs of its session when made (newDoorbell), and holds no
// *Session.
type doorbell struct {
	store    *store           // runs its statements, on connections of its own
	id       int64            // the session's lease id: the doorbell's name, and the lease row it publishes in
	logger   *slog.Logger     // the session's
	stopped  context.Context  // ends when Close starts or the session is lost: so does the goroutine
	ringStmt func() stmtIndex // the statement a release rings in (see ringIn), prepared on each new connection
	ended    func() bool      // whether the session was closed or has ended (see arm)

	wake chan struct{} // a value: work for the goroutine (ring, publish, or take the doorbell)
	done chan struct{} // closed when the goroutine returns

	allowed bool        // set by newDoorbell: not Galera, no connection limit below bellsMinLimit
	capped  bool        // set by newDoorbell: the *sql.DB limits its connections (see armWaiting, take)
	armed   atomic.Bool // started, read without armMu
	armMu   sync.Mutex  // guards started and off
	started bool        // guarded by armMu
	off     bool        // guarded by armMu; the server refused GET_LOCK
	asked   atomic.Bool // a ring was asked for (ring) and not done yet

	mu        sync.Mutex     // held while c is in use
	c         *connpool.Conn // guarded by mu; holds generation gen; nil: none now
	gen       int64          // guarded by mu
	published int64          // guarded by mu; the generation in the lease row

	// The tickets' own doorbells c holds (see qTicketInsertBell). Taken
	// with mu held or not; mu is never taken while bellsMu is held.
	bellsMu sync.Mutex
	bells   map[int64]bool // guarded by bellsMu; tokens of the acquisitions whose ticket's bell c holds
	letGo   []int64        // guarded by bellsMu; of those, the ones whose tickets were freed on another connection: tend lets them go
}

// newDoorbell returns the doorbell of session id, not started (see arm):
// allowed is false on a Galera cluster or when the *sql.DB limits its
// connections below bellsMinLimit; capped says that it limits them;
// stopped ends when the session does; ringStmt names the statement a
// release rings in; ended reports whether the session was closed or has
// ended.
func newDoorbell(st *store, id int64, logger *slog.Logger, stopped context.Context, allowed, capped bool, ringStmt func() stmtIndex, ended func() bool) *doorbell {
	return &doorbell{store: st, id: id, logger: logger, stopped: stopped, ringStmt: ringStmt, ended: ended,
		wake: make(chan struct{}, 1), done: make(chan struct{}), allowed: allowed, capped: capped}
}

// armWaiting arms the doorbell for a session whose Mutex waiter waits
// (waiters behind its claim block on it), except on a *sql.DB with a
// connection limit: there the few connections of dsync's share
// (dedicatedCap) go to the doorbells of holders and of queued waiters
// (whose tickets others queue behind) and to waiting, and the waiters
// behind a Mutex claimant pace themselves for the moment between its
// claim and its hold.
func (b *doorbell) armWaiting() {
	if !b.capped {
		b.arm()
	}
}

// arm starts the doorbell, once, after the session's first acquisition or
// when it first waits, off the caller's path. It does nothing on a Galera
// cluster, after the session was closed or has ended, or when the server
// refused GET_LOCK.
//
// It asks ended while it holds armMu, and stop reads started under
// armMu: Close marks the session closed before it stops the doorbell, so
// either arm finds the session closed and starts nothing, or stop finds
// the doorbell started and waits for its goroutine. (Lock order: armMu,
// then the session's mutex, inside ended.)
func (b *doorbell) arm() {
	if b.armed.Load() || !b.allowed {
		return
	}
	b.armMu.Lock()
	defer b.armMu.Unlock()
	if b.started || b.off || b.ended() {
		return
	}
	b.started = true
	b.armed.Store(true)
	go b.run()
}

// stop waits for the doorbell goroutine, if it was started, which ends
// with the session (closing its connection).
func (b *doorbell) stop() {
	b.armMu.Lock()
	started := b.started
	b.armMu.Unlock()
	if started {
		<-b.done
	}
}

// usable reports whether the session's waiters block on doorbells: not on
// a Galera cluster, not when the server refused GET_LOCK, and not when the
// *sql.DB limited its connections as the session started (doorbells take
// connections of their own, which would come out of the caller's share).
func (b *doorbell) usable() bool {
	if !b.allowed {
		return false
	}
	b.armMu.Lock()
	defer b.armMu.Unlock()
	return !b.off
}

// ring asks the doorbell goroutine to ring, without waiting for it.
func (b *doorbell) ring() {
	b.asked.Store(true)
	b.nudge()
}

// nudge wakes the doorbell goroutine, without waiting for it.
func (b *doorbell) nudge() {
	select {
	case b.wake <- struct{}{}:
	default: // it has been woken already, and looks at everything it does
	}
}

// run holds the session's doorbell, rings it on request and publishes
// the generations that releases rang into place, until the session ends.
// A failure drops the connection (which lets the doorbell go: its waiters
// wake and poll) and takes a new generation on a new one.
func (b *doorbell) run() {
	defer close(b.done)
	defer b.drop()
	retry := time.NewTimer(pollFor)
	retry.Stop()
	defer retry.Stop()
	retryIn := pollFor // after a failed take; doubles up to bellWait
	for {
		again, stop := b.tend(b.stopped)
		if stop {
			return
		}
		if again {
			continue
		}
		b.mu.Lock()
		failed := b.c == nil
		b.mu.Unlock()
		var retryC <-chan time.Time
		if failed {
			// A doorbell that could not be taken is tried again soon, and
			// less often while that goes on (the server may be refusing
			// connections).
			retry.Reset(retryIn)
			retryC = retry.C
			retryIn = min(2*retryIn, bellWait)
		} else {
			retryIn = pollFor
		}
		select {
		case <-b.stopped.Done():
			return
		case <-b.wake:
		case <-retryC:
		}
	}
}

// tend does what the doorbell needs now: takes it when there is none,
// rings it when asked, or publishes the generation that a release rang
// into place. It reports again when it should run again at once (the
// connection failed), stop when the goroutine should end.
func (b *doorbell) tend(ctx context.Context) (again, stop bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c == nil {
		c, err := b.take(ctx, b.gen+1)
		if err != nil {
			if isErrNo(err, errNotSupportedYet) || ctx.Err() != nil {
				b.armMu.Lock()
				b.off = ctx.Err() == nil
				b.armMu.Unlock()
				if ctx.Err() == nil {
					b.logger.Info("dsync: the server refuses GET_LOCK; waiters poll", "err", err)
				}
				return false, true
			}
			b.logger.Debug("dsync: doorbell failed", "err", err)
			b.gen++ // a connection of the failed attempt may hold it yet
			return false, false
		}
		b.gen++
		b.c, b.published = c, b.gen
		return b.asked.Load(), false // a ring asked for meanwhile comes next
	}
	var err error
	switch {
	case b.asked.Swap(false):
		if err = b.advance(ctx, b.c, b.gen); err == nil {
			b.gen++
			b.published = b.gen
		}
	case b.published != b.gen:
		if err = b.publish(ctx, b.c, b.gen); err == nil {
			b.published = b.gen
		}
	}
	if err == nil {
		err = b.letBellsGo(ctx)
	}
	if err != nil {
		b.logger.Debug("dsync: doorbell ring failed", "err", err)
		b.lose() // the failed statement may have taken the next generation
		return true, false
	}
	return false, false
}

// drop closes the doorbell's connection, which lets it go.
func (b *doorbell) drop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
		b.forgetBells()
	}
}

// take opens a connection, takes generation gen of the doorbell on it
// and publishes it.
func (b *doorbell) take(ctx context.Context, gen int64) (*connpool.Conn, error) {
	// With a connection limit, the doorbells of the sessions of the
	// *sql.DB leave one connection of dsync's share for waiting, unless
	// their waiter side has it already.
	spare := 0
	if b.capped && b.store.waiters.conns.Count() == 0 {
		spare = 1
	}
	c, err := b.store.pool.DedicatedSpare(ctx, spare)
	if err != nil {
		return nil, err
	}
	// Lock statements are lent c (see lend): a row lock must not keep
	// one past lentFor.
	if _, err := c.ExecContext(ctx, qLentLockWait); err != nil {
		c.Close()
		return nil, err
	}
	var took sql.NullInt64
	err = b.store.query(ctx, c, sBellTake, []any{bellName(b.id, gen)}, &took)
	if err == nil && took.Int64 != 1 {
		err = errors.New("doorbell taken by another connection")
	}
	if err == nil {
		// Prepared now, so that a release that rings on c costs no more
		// round trips than one on any other connection: the Mutex's, and
		// the queued locks' (see tickets.freeRinging). A failure only
		// leaves them to be prepared at first use.
		for _, i := range []stmtIndex{b.ringStmt(), sQueueReleaseRing, sTicketReleaseRing} {
			_, _ = c.Stmt(ctx, b.store.pool, int(i))
		}
	}
	if err == nil {
		err = b.publish(ctx, c, gen)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// advance rings the doorbell on c: it takes generation gen+1 and lets gen
// go, waking its waiters, then publishes gen+1.
func (b *doorbell) advance(ctx context.Context, c *connpool.Conn, gen int64) error {
	var took sql.NullInt64
	if err := b.store.query(ctx, c, sBellRing, []any{bellName(b.id, gen+1), bellName(b.id, gen)}, &took); err != nil {
		return err
	}
	if took.Int64 != 1 {
		return errors.New("next doorbell taken by another connection")
	}
	return b.publish(ctx, c, gen+1)
}

// ringResult is what a statement that ringIn ran on the doorbell's
// connection did with the doorbell.
type ringResult int

const (
	ringNotRun  ringResult = iota // it did nothing (refused, or met its row locked); the connection is kept
	ringBadConn                   // nothing was sent: the connection is bad
	ringNone                      // it ran without ringing
	ringRang                      // it took the next generation and let the current one go
	ringBroken                    // it failed, maybe after it rang, or it rang without taking the next generation
)

// ringIn lends the doorbell's connection to a statement that may ring the
// doorbell in itself (freeRinging): it prepares stmt there and calls run
// with it, a ctx that ends with the session, after lentFor, or lateFor
// after ctx ends (see detach), and the GET_LOCK names
// of the next generation and the current one. It reports whether the
// statement ran (see ringResult); false when it was not sent: the session
// is ending or closing; ctx has ended; the doorbell is not taken, or its
// connection is in use, or was dropped by the server while idle; or the
// statement could not be prepared. A connection that failed (ringBadConn,
// ringBroken; a prepare that broke it) is dropped with its doorbell,
// which wakes the waiters, and the goroutine takes a new one and
// publishes the generation.
func (b *doorbell) ringIn(ctx context.Context, stmt stmtIndex, run func(ctx context.Context, st *sql.Stmt, next, cur string) ringResult) bool {
	// Close's own statements (see closingCtx) are not sent here either: Close
	// makes their ctx only after it has ended stopped.
	if !b.armed.Load() || ctx.Err() != nil || b.stopped.Err() != nil || !b.mu.TryLock() {
		return false
	}
	defer b.mu.Unlock()
	if b.c == nil {
		return false // the goroutine takes one (run)
	}
	if !b.c.Alive(ctx) {
		// The server dropped the connection while it was idle (its doorbell
		// went with it, which woke the waiters): take a new one, and let
		// the caller run its statement on another connection.
		b.lose()
		return false
	}
	// Detached from ctx (see runDetached): a caller's deadline that falls
	// mid-statement would drop the doorbell.
	sctx, cancel := detach(ctx, b.stopped, lentFor)
	defer cancel()
	st, err := b.c.Stmt(sctx, b.store.pool, int(stmt))
	if err != nil {
		if !connpool.Reusable(err) {
			b.lose()
		}
		return false // not sent
	}
	asked := b.asked.Swap(false) // this statement may ring instead
	r := run(sctx, st, bellName(b.id, b.gen+1), bellName(b.id, b.gen))
	if asked && r != ringRang {
		b.asked.Store(true)
	}
	ran := true
	switch r {
	case ringNotRun:
		ran = false
	case ringBadConn:
		b.lose()
		ran = false
	case ringBroken:
		// Drop the connection (and with it whatever doorbell it holds)
		// and have the goroutine take a new one.
		b.lose()
	case ringRang:
		b.gen++
	}
	if b.c == nil || b.published != b.gen || b.asked.Load() {
		b.nudge()
	}
	return ran
}

// lend runs f, a lock statement of the session (see store.use), on the
// doorbell's connection when it is free, and reports whether
// it ran it: not when the doorbell is not armed or taken, its connection
// is in use (the goroutine, a ring, another statement) or was dropped by
// the server while idle, or the session is ending. So a session keeps no
// connection of the pool's for its statements while it has a doorbell
// (at rest: its lease connection and its doorbell's; see
// docs/OPERATIONS.md, Connections), and an uncontended Lock and its
// Unlock run on the same connection. f runs under a ctx detached from
// ctx (see runDetached), so that a caller's deadline that falls
// mid-statement does not drop the doorbell; a use that did not end
// cleanly (an error that did not come from the server, or a statement
// cut short after lentFor, or by the session's end) drops the
// connection, and with it the doorbell: its waiters wake, find nothing
// changed, and block on the next generation (see judge). A statement
// that meets a row lock (a release behind a LockTx transaction, or any
// lock statement on MySQL) holds up the session's rings meanwhile: a
// second at most, the connection's lock wait timeout (qLentLockWait),
// after which the server ends it with 1205, which is not retried on the
// connection (see retryRolledBackN), so the doorbell is kept.
func (b *doorbell) lend(ctx context.Context, f func(context.Context, *connpool.Conn) error) (bool, error) {
	if !b.armed.Load() || ctx.Err() != nil || b.stopped.Err() != nil || !b.mu.TryLock() {
		return false, nil
	}
	defer b.mu.Unlock()
	if b.c == nil {
		return false, nil
	}
	if !b.c.Alive(ctx) {
		b.lose()
		return false, nil
	}
	alive := func() bool { return b.c.Alive(context.Background()) }
	err, clean := runDetached(ctx, b.stopped, lentFor, alive, func(ctx context.Context) error { return f(ctx, b.c) })
	if !clean {
		b.lose() // the driver may have closed it, or the statement may still run
	}
	if b.c == nil || b.published != b.gen || b.asked.Load() {
		b.nudge()
	}
	return true, err
}

// lose drops the doorbell's connection (b.mu held), which lets its
// doorbell go, and skips the next generation, which a statement of that
// connection may have taken, so that the goroutine takes a new one.
func (b *doorbell) lose() {
	b.c.Close()
	b.c = nil
	b.gen++
	b.forgetBells()
	b.nudge()
}

// publish writes the doorbell's generation into the lease row.
func (b *doorbell) publish(ctx context.Context, c *connpool.Conn, gen int64) error {
	st, err := c.Stmt(ctx, b.store.pool, int(sLeaseBell))
	if err != nil {
		return err
	}
	_, err = retryRolledBack(ctx, func() (sql.Result, error) { return st.ExecContext(ctx, gen, b.id) })
	return err
}

// bellRef names one generation of one session's doorbell, or (tok > 0)
// the own doorbell of the ticket of that session's acquisition tok (see
// ticketBellName).
type bellRef struct{ id, gen, tok int64 }

// name returns the GET_LOCK name of the doorbell ref names.
func (r bellRef) name() string {
	if r.tok > 0 {
		return ticketBellName(r.id, r.tok)
	}
	return bellName(r.id, r.gen)
}

// bellState is what one Lock call's waiting remembers between doorbells.
type bellState struct {
	woke        map[bellRef]bool // doorbells it woke from at once or when rung: never blocked on again (see judge)
	nobody      bool             // the last read found nobody to wait for, and it has not found anyone since
	nobodyFence int64            // the lock's fence then
	nobodyPaced bool             // and it has paced itself since, with that fence
	pace        time.Duration    // the last paced poll's delay (see nextPace); 0: none since the last progress
	paced       bool             // it paced itself (nextPace) since its last block or progress (see moved)
	soon        bool             // the next paced poll comes after claimPoll, once (see judge, unarmedPolls)
	unarmed     int              // times the one waited for was found without a doorbell (see unarmedPolls)
	busy        bool             // the next paced poll comes after connPace, once: no connection to block on (see bellWaiter.wait)
	woken       bool             // the doorbell waited on rang: the row may still be locked by the release that rang it
	leaseEnd    time.Time        // when the lease of the one waited for ends, as last read (see judge); zero: unknown
	endPaced    time.Time        // the last lease end a paced poll was brought forward to (see nextPace)
}

// waitOutcome is what a waiter's doorbell step (awaitBell,
// awaitTicketBell) tells its loop to do next.
type waitOutcome int

const (
	// waitTry: something changed, or a doorbell rang or timed out after a
	// block: try the lock again at once.
	waitTry waitOutcome = iota
	// waitPace: nothing changed since the last try, or a step failed: try
	// again after bellState.nextPace, without the back-off's claims.
	waitPace
	// waitPoll: there is no doorbell to use (none allowed, the holder has
	// none, or no connection to block with): poll as the back-off says.
	waitPoll
)

// The pace of a waiter whose doorbell step found nothing changed: the
// grounds of its last try (the doorbell it woke from, or nobody to wait
// for) have not changed, so trying again at once would be a busy loop
// against the database (a doorbell whose connection went away, or whose
// session died, reads as rung at once, for as long as the lease lives on;
// a row a transaction holds after its session ended has nobody to wait
// for). It polls after paceFloor, doubling up to paceCap, until something
// changes: at most 3 statements per paceCap once it has grown, and
// a lock that falls free meanwhile is taken within paceCap, or, when the
// one waited for dies, within bellLate of its lease's end (see
// nextPace).
const (
	paceFloor = 100 * time.Millisecond
	paceCap   = time.Second
)

// nextPace returns how long a waiter waits before its next paced try:
// claimPoll once when it asked to poll soon (a holder without a doorbell
// yet, or the first time nobody was found again; see judge), connPace
// once when it had no connection to block on (see bellWaiter.wait), or
// longer, as the polling budget polls says, else paceFloor, then twice
// the last, up to paceCap. Only the polls at connPace, which go on for as
// long as the lock stays held, need the budget: the others are a few, or
// slow down by themselves.
//
// A paced poll never lands later than bellLate after the end of the lease
// of the one waited for, as last read (see judge): a holder that died
// freed its doorbell at once (its connection closed), so its waiters pace
// themselves, and would otherwise take the lock up to paceCap after its
// lease ended. That is one poll more per lease end at most, within the
// budget: a poll is brought forward only to a lease end at least
// paceFloor later than the last one it was brought forward to (a read
// after that end finds the lease over, or renewed: a later end).
func (st *bellState) nextPace(polls *pollBudget) time.Duration {
	st.paced = true
	var d time.Duration
	switch {
	case st.soon:
		st.soon = false
		d = claimPoll
	case st.busy:
		st.busy = false
		d = polls.delay(connPace)
	default:
		st.pace = min(max(2*st.pace, paceFloor), paceCap)
		d = st.pace
	}
	if st.leaseEnd.Sub(st.endPaced) < paceFloor {
		return d
	}
	if until := time.Until(st.leaseEnd) + bellLate; until > 0 && until < d {
		st.endPaced = st.leaseEnd
		d = polls.delay(until)
	}
	return d
}

// moved records a waiter's progress: a block on a doorbell ended (rung,
// or timed out), or it found nobody after somebody. Its next pace starts
// from paceFloor again, and its next doorbell step says again that it
// waits (an acquisition since may have voided its want and its claim).
func (st *bellState) moved() {
	st.pace, st.paced = 0, false
}

// judge decides, from a waiter's read of whom it waits for (found false:
// nobody; else the doorbell ref, and left, the microseconds that session's
// lease has left, which bound its paced polls, see nextPace) and of the
// lock's fence (0 when unknown),
// whether it may block on a doorbell (block true), which one, or what its
// loop does instead. It is the one place that keeps a wake-up from being
// retried at once on unchanged grounds: a doorbell that woke the waiter
// once (rung, or gone with its connection) is never blocked on again;
// finding it again, it blocks on the next generation, which a ring takes
// before it lets the current one go (so a waiter that read a doorbell
// rung but not yet replaced in the lease row waits for the next ring),
// and when that one was free at once too (no ring took it: the
// connection went away), it paces itself. Finding nobody to wait for lets
// it try at once, but not twice in a row with the same fence (nobody
// acquired the lock in between, and its try failed: a transaction holds
// the row, or statements held it through the no-wait tries): then it
// paces itself, the first time after claimPoll. The pace starts again
// from paceFloor only after a block, or when it finds nobody after
// somebody.
func (st *bellState) judge(found bool, ref bellRef, left, fence int64) (bell bellRef, block bool, out waitOutcome) {
	st.leaseEnd = time.Time{}
	if found && left > 0 {
		st.leaseEnd = time.Now().Add(time.Duration(left) * time.Microsecond)
	}
	if !found {
		if st.nobody && fence == st.nobodyFence {
			// The first time, soon: a row locked for a moment by other
			// statements (the no-wait tries gave up) is free again within
			// milliseconds.
			st.soon = !st.nobodyPaced
			st.nobodyPaced = true
			return ref, false, waitPace
		}
		if !st.nobody {
			st.moved()
		}
		st.nobody, st.nobodyFence, st.nobodyPaced = true, fence, false
		return ref, false, waitTry
	}
	st.nobody = false
	if st.woke[ref] {
		ref.gen++
		if st.woke[ref] {
			return ref, false, waitPace
		}
	}
	return ref, true, waitTry
}

// wokeFrom records that the waiter's block on ref ended with the doorbell
// free: rung, or gone.
func (st *bellState) wokeFrom(ref bellRef) {
	if st.woke == nil {
		st.woke = make(map[bellRef]bool)
	}
	st.woke[ref] = true
}

// pollFor is how long the doorbell goroutine waits before it tries again
// to take a doorbell it could not take (doubling up to bellWait), and the
// longest a waiter on a *sql.DB with a connection limit waits for a
// connection to block on.
const pollFor = 100 * time.Millisecond

// bellWaiter is the waiter side: it blocks on other sessions' doorbells
// on one connection of its own (bellWaiters), however many names its
// sessions wait for, kept idle for the next waits. Each session has one
// on a *sql.DB without a connection limit; on one with a limit, its
// sessions share the pool's (see sharedPool), so that their waiting takes
// one connection of dsync's share. The calls that wait for the doorbell
// it blocks on share that block (N names held by one session cost one
// connection and no statements); a call that waits for another doorbell
// while the connection blocks, or when no connection can be had (the
// server refuses one, 1040; the *sql.DB's share for dsync is taken, see
// dedicatedCap), polls at connPace and looks again; but an Election's
// observers yield the connection to a lock waiter (see join), and read at
// their idle pace instead. It holds no *Session.
type bellWaiter struct {
	pool   *connpool.Pool // opens its connection and prepares its statement
	capped bool           // the *sql.DB limits its connections: opening one waits at most pollFor
	conns  connpool.Kept  // the connection blocked on, or kept for blocking on, doorbells

	mu      sync.Mutex
	cur     *bellBlock     // guarded by mu; the block in progress or being started; nil: none
	stopped bool           // guarded by mu; stop was called: no block starts
	blocks  sync.WaitGroup // the blocks' goroutines; Add only under mu while not stopped
	idleAt  time.Time      // guarded by mu; when the connection was last kept idle
	refused time.Time      // guarded by mu; until then no connection is opened: the server refused one (1040)
	backoff time.Duration  // guarded by mu; the last wait after a refusal; 0: the last open succeeded
	idle    *time.Timer    // guarded by mu; closes the connection kept idle for poolIdleFor (see put)
}

// bellBlock is one block on a doorbell, shared by the calls that wait for
// it.
type bellBlock struct {
	ref    bellRef
	done   chan struct{}      // closed when the block has ended; rung and failed are set before
	rung   bool               // the doorbell was free (rung, or gone with its connection)
	failed bool               // no connection, or the statement failed
	calls  int                // guarded by bellWaiter.mu; calls waiting for it
	locks  int                // guarded by bellWaiter.mu; those of lock waiters (the others observe an Election and yield the connection, see join)
	cancel context.CancelFunc // guarded by bellWaiter.mu; ends the block; nil until it runs
}

// connPace is how often, at most, a waiter that has no connection to
// block on (its session's blocks on another doorbell, or none can be had)
// tries the lock again: each try and read of the doorbell are two
// statements (its want is said again once a second), and the polling
// budget (pollRate) holds it to about one poll every 2/pollRate once its
// burst is spent; a claimant among them takes a lock that fell free
// within that.
const connPace = 110 * time.Millisecond

// newBellWaiter returns a waiter side that opens its connection from p;
// capped says that p's *sql.DB limits its connections.
func newBellWaiter(p *connpool.Pool, capped bool) *bellWaiter {
	return &bellWaiter{pool: p, capped: capped}
}

// get returns a connection to block on a doorbell with, or nil when none
// can be opened (on a *sql.DB with a connection limit, within pollFor:
// the caller's own use of the pool goes first). Opening one ends when the
// waiting call's session does (done) too: on a network gone dark the
// handshake never ends, and a Lock with context.Background() would wait on
// it for ever after its session was lost.
func (w *bellWaiter) get(ctx context.Context, done <-chan struct{}) *connpool.Conn {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan struct{})
	defer close(got)
	go func() {
		select {
		case <-done:
			cancel()
		case <-got:
		}
	}()
	if w.capped {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, pollFor)
		defer stop()
	}
	w.mu.Lock()
	refused := time.Now().Before(w.refused)
	w.mu.Unlock()
	if refused {
		if c := w.conns.Idle(); c != nil {
			return c
		}
		return nil
	}
	c, err := w.conns.GetErr(ctx, w.pool, bellWaiters)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case isErrNo(err, errTooManyConnections):
		// The server is out of connections: its sessions' waiters poll
		// (connPace) and try to open one again less and less often, not
		// at each poll.
		w.backoff = min(max(2*w.backoff, connPace), bellWait)
		w.refused = time.Now().Add(w.backoff)
	case c != nil:
		w.backoff = 0
	}
	return c
}

// put keeps c for the next waiter when keep is set, else closes it. A
// connection kept idle for poolIdleFor is closed: a session keeps one to
// wait on only while it waits, and for the waits that follow soon.
func (w *bellWaiter) put(c *connpool.Conn, keep bool) {
	w.conns.Put(c, keep)
	if !keep {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.idleAt = time.Now()
	if w.idle == nil && !w.stopped {
		w.idle = time.AfterFunc(poolIdleFor, w.closeUnused)
	}
}

// closeUnused closes the connection kept idle when it has been so for
// poolIdleFor, or looks again when it will have been.
func (w *bellWaiter) closeUnused() {
	w.mu.Lock()
	w.idle = nil
	if w.stopped {
		w.mu.Unlock()
		return
	}
	if wait := poolIdleFor - time.Since(w.idleAt); wait > 0 {
		w.idle = time.AfterFunc(wait, w.closeUnused)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	if c := w.conns.Idle(); c != nil {
		w.conns.Put(c, false)
	}
}

// idleConn returns the connection kept idle for blocking on doorbells, taken
// out until put back (see put), or nil when none is kept: a read that
// comes between two blocks of an Election's observer runs on it (see
// Election.read), rather than on a connection of the pool's, which closes
// its connections a second after their last use, and so opened one (its
// settings, a prepare) for each read.
func (w *bellWaiter) idleConn() *connpool.Conn { return w.conns.Idle() }

// closeIdle closes the idle connections (the session has ended; those in
// use are closed when put back).
func (w *bellWaiter) closeIdle() { w.conns.Close() }

// stop closes the idle connections and waits for the blocks in progress,
// which end when the calls waiting for them have gone.
func (w *bellWaiter) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	w.mu.Unlock()
	w.closeIdle()
	w.blocks.Wait()
}

// wait blocks until doorbell ref rings, for at most most (a whole number
// of seconds) or what the ringing session's lease has left (left
// microseconds), or until ctx ends or done (the waiting session's Done)
// is closed; yield says that the call observes an Election (see join);
// logger, name and kind are for its log. It shares the session's block on ref when there is one, and
// starts one on the session's connection (see bellWaiter) when it is
// free, or blocks on another doorbell for observers alone and the call
// does not yield; else it asks st for connPace and returns waitPace. A doorbell that is free at once (rung,
// or gone with its connection) or rings is recorded in st (see judge);
// the caller tries again at once after it or after a block that timed
// out, and paces itself after an error.
//
// The block's timeout is fractional: MariaDB's GET_LOCK honours it, so a
// waiter overtakes a holder that stopped renewing within bellLate of its
// lease's end; MySQL's rounds it to whole seconds. With less than a second
// left, which MySQL could round to no wait at all (and the waiter would
// block again and again at once), the waiter sleeps until the lease's end
// instead, sending nothing, and on no connection. A holder that stopped
// renewing gets that close to its lease's end; so does every holder whose
// TTL is under about 1.2s (it renews every TTL/3), whose waiters thus
// retry about once a second and are not woken by its release.
func (w *bellWaiter) wait(ctx context.Context, done <-chan struct{}, ref bellRef, left int64, most time.Duration, yield bool, st *bellState, logger *slog.Logger, name, kind string) waitOutcome {
	limit := min(most, time.Duration(left)*time.Microsecond+bellLate)
	if limit < time.Second {
		// Sleep it out, on no connection: MySQL's GET_LOCK takes whole
		// seconds.
		t := time.NewTimer(limit)
		defer t.Stop()
		select {
		case <-t.C:
			st.moved()
		case <-ctx.Done():
		case <-done:
		}
		return waitTry
	}
	b, joined := w.join(ctx, done, ref, limit, yield, logger, name, kind)
	if b == nil {
		st.busy = true
		return waitPace // the connection blocks on another doorbell, or there is none
	}
	defer w.leave(b, yield)
	var own <-chan time.Time
	if joined {
		// A block that another call started may last longer than this
		// call's limit.
		t := time.NewTimer(limit)
		defer t.Stop()
		own = t.C
	}
	select {
	case <-b.done:
	case <-own:
		st.moved()
		return waitTry
	case <-ctx.Done():
		return waitTry // the caller returns ctx's error
	case <-done:
		return waitTry // the caller returns the session's
	}
	if b.failed {
		st.busy = true
		return waitPace
	}
	st.moved()
	if b.rung {
		st.wokeFrom(ref)
		st.woken = true
	}
	return waitTry
}

// join returns the session's block on ref, counting the call in it
// (joined true when another call started it), or starts one, for limit,
// on the session's connection; nil when the connection blocks on another
// doorbell, or none can be had.
//
// A call that does not yield (a lock waiter's) takes the connection over
// from a block on another doorbell that only yielding calls wait for (an
// Election's observers; Observe says they read once a second meanwhile):
// it ends that block, which closes its connection, and starts its own.
// Else a Campaign behind a campaigner that does not lead, in a session
// whose observer blocked on the leader's doorbell first, polled at
// connPace for as long as that block lasted, up to bellWait, and found
// the observer blocking again each time, as it starts its next block
// within milliseconds.
func (w *bellWaiter) join(ctx context.Context, done <-chan struct{}, ref bellRef, limit time.Duration, yield bool, logger *slog.Logger, name, kind string) (b *bellBlock, joined bool) {
	w.mu.Lock()
	for w.cur != nil {
		b := w.cur
		if b.ref == ref {
			b.calls++
			if !yield {
				b.locks++
			}
			w.mu.Unlock()
			return b, true
		}
		if yield || b.locks > 0 || b.cancel == nil {
			w.mu.Unlock()
			return nil, false
		}
		b.cancel()
		w.mu.Unlock()
		select {
		case <-b.done: // it has let the connection go (see block)
		case <-ctx.Done():
			return nil, false
		case <-done:
			return nil, false
		}
		w.mu.Lock()
	}
	b = &bellBlock{ref: ref, done: make(chan struct{}), calls: 1}
	if !yield {
		b.locks = 1
	}
	w.cur = b // calls that come meanwhile join it
	w.mu.Unlock()
	c := w.get(ctx, done)
	w.mu.Lock()
	defer w.mu.Unlock()
	if c == nil || w.stopped {
		if c != nil {
			w.conns.Put(c, false)
		}
		w.cur = nil
		b.failed = true
		close(b.done) // those that joined meanwhile pace themselves too
		return nil, false
	}
	bctx, cancel := context.WithCancel(context.Background()) // ended by leave, when the last call has gone
	b.cancel = cancel
	w.blocks.Add(1)
	go w.block(bctx, c, b, limit, logger, name, kind)
	return b, false
}

// leave counts a call out of block b (yield: as join counted it), and
// ends the block when it was the last call waiting for it.
func (w *bellWaiter) leave(b *bellBlock, yield bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !yield {
		b.locks--
	}
	if b.calls--; b.calls == 0 && b.cancel != nil {
		b.cancel()
	}
}

// block runs block b on c for at most limit, and records its outcome.
func (w *bellWaiter) block(ctx context.Context, c *connpool.Conn, b *bellBlock, limit time.Duration, logger *slog.Logger, name, kind string) {
	defer w.blocks.Done()
	bell := b.ref.name()
	var got sql.NullInt64
	st, err := c.Stmt(ctx, w.pool, int(sBellWait))
	if err == nil {
		err = st.QueryRowContext(ctx, bell, limit.Seconds(), bell).Scan(&got)
	}
	w.put(c, err == nil && ctx.Err() == nil)
	if err != nil && ctx.Err() == nil {
		logger.Debug("dsync: wait for doorbell failed", "lock", name, "kind", kind, "err", err)
	}
	w.mu.Lock()
	if w.cur == b {
		w.cur = nil
	}
	b.failed = err != nil
	b.rung = err == nil && got.Int64 == 1
	b.cancel()
	w.mu.Unlock()
	close(b.done)
}

// tookTicketBell records that the doorbell's connection took the own
// doorbell of the ticket of the session's acquisition token (b.mu held:
// the enqueue ran there, see tickets.insertBelled).
func (b *doorbell) tookTicketBell(token int64) {
	b.bellsMu.Lock()
	defer b.bellsMu.Unlock()
	if b.bells == nil {
		b.bells = make(map[int64]bool)
	}
	b.bells[token] = true
}

// ticketFreed records that the ticket of the session's acquisition token
// was freed (or not found: the release ran before), on the doorbell's
// connection in a statement that let its bell go (letGone), or elsewhere:
// then, when the connection holds its bell, the doorbell goroutine lets
// it go (tend), after the release committed, never on the caller's path.
// A bell left held meanwhile only keeps the waiters behind the gone
// ticket blocked until their block times out (at most bellWait, or the
// end of this session's lease): their checks, not the bell, decide.
func (b *doorbell) ticketFreed(token int64, letGone bool) {
	b.bellsMu.Lock()
	held := b.bells[token]
	delete(b.bells, token)
	if held && !letGone {
		b.letGo = append(b.letGo, token)
	}
	b.bellsMu.Unlock()
	if held && !letGone {
		b.nudge()
	}
}

// forgetBells forgets the tickets' bells (b.mu held): the connection that
// held them is gone, and they with it.
func (b *doorbell) forgetBells() {
	b.bellsMu.Lock()
	defer b.bellsMu.Unlock()
	b.bells, b.letGo = nil, nil
}

// letBellsGo lets go, on the doorbell's connection (b.mu held), the
// tickets' bells that ticketFreed asked it to (qTicketBellLetGo).
func (b *doorbell) letBellsGo(ctx context.Context) error {
	b.bellsMu.Lock()
	tokens := b.letGo
	b.letGo = nil
	b.bellsMu.Unlock()
	for _, token := range tokens {
		st, err := b.c.Stmt(ctx, b.store.pool, int(sTicketBellLetGo))
		if err == nil {
			_, err = st.ExecContext(ctx, ticketBellName(b.id, token))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

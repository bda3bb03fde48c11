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
	"unicode/utf8"
)

// A Session is one lease on the database, renewed in the background, and the
// owner of every lock taken through it: those locks live exactly as long as
// the lease. Create it with [NewSession]; the zero value is not usable. A
// Session is safe for concurrent use; one per process is usual.
//
// When the lease cannot be renewed before it could end on the server, the
// session is lost: [Session.Done] closes and [Session.Err] returns
// [ErrSessionExpired], before any other session can take its locks. Every
// later call then fails with ErrSessionExpired; make a new Session, or make
// the session [WithReplaceLostLease]: then, once no hold of the lost lease
// remains, the next lock call opens a new lease and goes on under it.
//
// # Connections
//
// When the *sql.DB has no connection limit (SetMaxOpenConns), each session
// keeps a connection of its own for its lease (opened by NewSession, with
// the renewal prepared, before it returns), so that lock traffic never
// delays a renewal and a renewal never waits for a connection; each
// session that has locked or waited keeps a doorbell connection, on which
// it also runs its lock statements when it is free; the sessions of one
// *sql.DB (and table prefix) share at most 3 more for the lock statements
// that find it busy, each closed after a second unused; a session that
// waits takes one more to wait on, however many names it waits for,
// closed a second after its last wait (so 2 at rest, 3 while waiting);
// and one per [Mutex.LockTx] hold in progress, blocked until its transaction
// ends, of which it keeps up to 4 idle for the next holds (see
// docs/OPERATIONS.md, Connections). With a limit, the sessions of one *sql.DB
// share a quarter of it, at least 2 and at most 4, or 1 when the limit is
// 2 or 3 (then renewals only go first: they may wait for one lock
// statement), for lock statements and renewals; with a limit of 8 or
// more, another quarter of it, at least 2, for the doorbells of the
// sessions that hold locks and one connection that their waiters share;
// a limit of 1 leaves the caller nothing, and NewSession refuses it. When there are two or more, one of them, once opened, is
// kept warm for the sessions' renewals only (lock statements open their
// own), and renewals go first. LockTx holds then take no connection of
// their own: the session checks for their end on these. dsync pins what
// its statements rely on (autocommit, isolation, time zone, sql_mode) on
// these connections, whatever the DSN says, and so never hands them back
// to the pool: it closes them when it is done with
// them (the session, or the last session of the pool, closed or lost, or a
// connection in an unknown state). When the server refuses a connection
// (1040, too many connections), NewSession and the calls that need one
// return that error, except a Lock that waits: it polls instead of
// blocking on a doorbell, runs its statements on the session's lease
// connection, and tries again, paced, until ctx ends.
type Session struct {
	store *store // the statement runner (see store.go)

	opts   options
	id     int64 // lease id, the holder column of the lock rows it holds
	logger *slog.Logger

	lease *lease // the lease row: its keep-alive and local deadline

	lastToken atomic.Int64  // last acquisition token handed out
	acquiring atomic.Int64  // goroutines in a database acquisition (see localLock)
	done      chan struct{} // closed when err is set
	stop      context.CancelFunc
	stopped   context.Context // ends when Close starts or the session is lost
	reaper    *reaper         // frees orphans in the background (see orphans.go)
	sweeper   *sweeper        // the clean-up of free rows (see sweep.go)
	rows      *lockRows       // the Mutex row's statements (see lockrow.go)
	tickets   *tickets        // the queue's statements (see tickets.go)
	stats     *counters       // see Stats; one for every lease of a Session made WithReplaceLostLease

	bell       *doorbell   // this session's doorbell (see doorbell.go)
	waiters    *bellWaiter // blocks on other sessions' doorbells (see doorbell.go)
	ownWaiters bool        // waiters is the session's own, not its shared pool's

	mu     sync.Mutex
	err    error                // guarded by mu; nil while live
	closed bool                 // guarded by mu; Close was called
	locks  registry[localLock]  // in-process state of the Mutex names in use
	queues registry[localQueue] // the same for FairMutex and RWMutex names

	txHolds *txHolds // LockTx's goroutines, connections and records (see locktx.go)

	// unused, when not nil, is closed (and set to nil) when the last name
	// in locks and queues goes: no hold and no call remain. Guarded by
	// mu; see whenUnused.
	unused chan struct{}

	// line, on a Session made WithReplaceLostLease, is its line of
	// leases; nil otherwise. Only the Session that NewSession returned
	// (whose methods the caller calls) reads it; each lease's Session
	// runs the calls made on it (see succession.go).
	line *succession
}

// NewSession creates the tables if they are missing (safe when many
// processes start at once), inserts a lease row for the session and starts
// renewing it. ctx bounds only this setup. On error nothing is left running;
// the error names the step that failed (connect to the database, look for
// or create the tables, check the schema version, create the lease) and
// wraps the driver's error (go-sql-driver's *mysql.MySQLError: 1045, access
// denied, or 1049, unknown database; a dial error; ctx's error).
// It returns an error wrapping [ErrInvalidOption] for a bad option, a nil
// db, or a db whose connection limit leaves the caller nothing (see
// [Session]).
func NewSession(ctx context.Context, db *sql.DB, opts ...Option) (*Session, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	s, err := startSession(ctx, db, o, new(counters))
	if err != nil {
		return nil, err
	}
	if o.replaceLost {
		s.line = newSuccession(db, o, s)
	}
	return s, nil
}

// startSession creates the tables if they are missing, inserts a lease row
// and starts renewing it: the Session of one lease, counting its calls in
// stats. On error nothing is left running.
func startSession(ctx context.Context, db *sql.DB, o options, stats *counters) (*Session, error) {
	q := newQueries(o.prefix)
	st, err := newStore(ctx, db, q, o.logger)
	if err != nil {
		return nil, err
	}
	s := &Session{
		store:   st,
		opts:    o,
		logger:  o.logger,
		stats:   stats,
		done:    make(chan struct{}),
		txHolds: newTxHolds(),
	}
	bellsAllowed := !st.galera && bellsFit(db)
	capped := db.Stats().MaxOpenConnections != 0
	s.lease = newLease(st, o.ttl, s.stats, s.lose)
	if st.leaseConn != nil {
		st.leaseConn.lendFor = s.lease.lendable()
	}
	s.reaper = newReaper(st, o.ttl, s.free)
	s.sweeper = newSweeper(st, &o)
	s.stopped, s.stop = context.WithCancel(context.Background())
	st.stopped, st.ended = s.stopped, s.leaseErr
	s.locks = newRegistry(&s.mu, s.noteUnused, func() *localLock { return &localLock{sem: make(chan struct{}, 1)} })
	s.queues = newRegistry(&s.mu, s.noteUnused, func() *localQueue {
		return &localQueue{enq: make(chan struct{}, 1), rOwners: make(map[uint64]int)}
	})
	if err := s.lease.start(ctx, o.label); err != nil {
		s.stop()
		s.store.leaseConn.close()
		s.store.releasePool()
		return nil, err
	}
	s.id = s.lease.id
	s.logger = s.logger.With("session", s.id) // every record names its session
	st.logger, s.lease.logger, s.reaper.logger = s.logger, s.logger, s.logger
	s.sweeper.id = s.id
	// The doorbell's arm reads closed and err as Close and end write them,
	// under mu (see doorbell.arm).
	ended := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed || s.err != nil
	}
	s.rows = &lockRows{st: st, id: s.id}
	s.bell = newDoorbell(st, s.id, s.logger, s.stopped, bellsAllowed, capped, s.rows.ringInStmt, ended)
	// With a connection limit the sessions of the *sql.DB share one
	// waiter side, and one connection to wait on (see bellWaiter).
	s.waiters, s.ownWaiters = st.waiters, !capped
	if s.ownWaiters {
		s.waiters = newBellWaiter(st.pool, false)
	}
	s.rows.bell = s.bell
	st.lend = s.bell.lend
	s.tickets = &tickets{st: st, id: s.id, bell: s.bell, createRow: s.createQueueRow}
	go s.lease.keepAlive(s.stopped)
	go s.reaper.reap()
	go s.sweeper.run()
	return s, nil
}

// ID returns the session's lease id, the value of the holder column of the
// lock rows it holds. On a session made [WithReplaceLostLease] it is the
// current lease's, and changes when a lost lease is replaced.
func (s *Session) ID() int64 { return s.current().id }

// TTL returns the lease time to live.
func (s *Session) TTL() time.Duration { return s.opts.ttl }

// Done returns a channel that is closed when the session ends: its lease was
// lost (see [Session.Err]) or [Session.Close] was called. Select on it
// beside long work done under a lock, and stop that work when it closes.
//
// On a session made [WithReplaceLostLease], Done is the channel of the
// current lease: read it after Lock returns, while holding the lock (the
// lease of a hold is the current one until the hold is released). A Done
// read before a Lock may belong to an earlier lease, and be closed
// already: a spurious signal, never a missed one.
func (s *Session) Done() <-chan struct{} { return s.current().done }

// Deadline returns the local time until which the lease is known to hold:
// the last successful renewal's send time plus the TTL, less the safety
// margin of TTL/5 (the server keeps the lease at least TTL/5 longer). A
// renewal that succeeds moves it later; when none does before it, Done
// closes then. It has a monotonic clock reading, so [time.Until] of it is
// exact. Once the session has ended it no longer moves; on a session made
// [WithReplaceLostLease] it is the current lease's, and moves on with the
// new lease once a lost one is replaced.
func (s *Session) Deadline() time.Time {
	return s.current().lease.deadlineTime()
}

// Err returns nil while the session is live, [ErrSessionExpired] once its
// lease was lost, and [ErrSessionClosed] after Close. It checks the renewal
// deadline itself: after the process was paused (SIGSTOP, a VM pause) past
// it, Err reports the loss (and Done closes) even before the keep-alive
// goroutine has run again. On a session made [WithReplaceLostLease] it is
// the current lease's: ErrSessionExpired from a loss until a lock call
// opens the new lease (see [Session.Done]).
func (s *Session) Err() error { return s.current().leaseErr() }

// leaseErr is Err of this lease's Session: what every call made on it
// reads.
func (s *Session) leaseErr() error {
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err == nil && s.lease.pastDeadline() {
		s.lose(errors.New("renewal deadline passed"))
		return s.leaseErr()
	}
	return err
}

// end records why the session ended and closes Done; the first call wins,
// and runs record (when not nil) before Done closes, so that whoever
// wakes on Done finds the record written.
// (Err reports the end from the start; record runs outside the session's
// mutex, so a log handler may call the session.)
func (s *Session) end(err error, record func()) bool {
	s.mu.Lock()
	first := s.err == nil
	if first {
		s.err = err
	}
	s.mu.Unlock()
	if !first {
		return false
	}
	if record != nil {
		record()
	}
	close(s.done)
	return true
}

// lose ends the session as lost: its lease may end on the server at any
// moment, so nothing it holds is worth freeing, and its connections go.
func (s *Session) lose(cause error) {
	if s.end(ErrSessionExpired, func() {
		s.logger.Error("dsync: session lost; its locks may belong to others now", "err", cause)
	}) {
		s.stop()
		s.store.leaseConn.close() // after stop: a renewal on it ends at once
		if s.ownWaiters {
			s.waiters.closeIdle()
		}
		s.txHolds.closeIdle()
		s.store.releasePool()
	}
}

// Close ends the session: Done closes, calls in progress and later return
// [ErrSessionClosed], and the lease row is deleted, which frees every lock
// the session holds at once. Close returns within about one TTL even when
// the database is unreachable; the lease then simply ends on the server.
// After the session was lost, Close only releases its connections. Calling
// Close again returns ErrSessionClosed. A session made
// [WithReplaceLostLease] opens no lease after Close has begun.
func (s *Session) Close() error {
	if s.line != nil {
		return s.line.close()
	}
	return s.closeLease()
}

// closeLease is Close of this lease's Session.
func (s *Session) closeLease() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.closed = true
	s.mu.Unlock()
	lost := !s.end(ErrSessionClosed, nil)
	s.stop()
	<-s.lease.exited
	<-s.reaper.exited
	s.tickets.records.stop()
	s.txHolds.stop()
	s.bell.stop()
	if s.ownWaiters {
		s.waiters.stop()
	}
	<-s.sweeper.exited
	defer s.store.releasePool()
	defer s.store.leaseConn.close()
	if lost {
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ttl)
	defer cancel()
	ctx = closingCtx(ctx)
	// Deleting the lease frees every lock row and ticket of the session at
	// once: a holder whose lease row is gone holds nothing. It runs where
	// renewals did, on a connection that is open.
	if _, err := s.store.execConn(ctx, true, sLeaseDelete, maxRetries, s.id); err != nil {
		return opErrorf(err, "close session %d (its lease ends on the server within %v)", s.id, s.opts.ttl)
	}
	// Then tidy what the session knows it held, so the next acquisition of
	// those names takes the cheap path; best effort, nothing depends on it.
	for _, o := range s.knownHolds() {
		if _, err := s.free(ctx, o); err != nil {
			break
		}
	}
	return nil
}

// nextToken returns a token for a new acquisition, unique in this session.
func (s *Session) nextToken() int64 { return s.lastToken.Add(1) }

// validName reports whether name can be a lock name.
func validName(name string) error {
	if name == "" || len(name) > 255 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q (want 1 to 255 bytes of UTF-8)", ErrInvalidName, name)
	}
	return nil
}

// validKeyedName reports whether name can be the name of a lock of a
// keyed kind (see "Queue keys" in queries.go): a lock name whose queue key fits the
// tables' 255 bytes.
func validKeyedName(name string) error {
	if err := validName(name); err != nil || len(name) <= 254 {
		return err
	}
	return fmt.Errorf("%w: %q (at most 254 bytes for an Election or a Semaphore)", ErrInvalidName, name)
}

// A background runs goroutines of a session that outlive the call that
// started them (the record of a hold's start, tickets.granted; the watch
// of a LockTx hold's transaction, watchTx), and is stopped, waiting for
// them, when the session closes (their context, the session's stopped,
// has ended by then).
type background struct {
	mu      sync.Mutex
	stopped bool // guarded by mu: stop was called; run runs nothing more
	wg      sync.WaitGroup
}

// run runs f in a goroutine of its own and reports true, unless b is
// stopped.
func (b *background) run(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// isStopped reports whether stop was called.
func (b *background) isStopped() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopped
}

// stop makes run run nothing more, and waits for what it ran.
func (b *background) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
	b.wg.Wait()
}

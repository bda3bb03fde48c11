package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync/internal/connpool"
)

// Defaults of the session options.
const (
	DefaultTTL         = 15 * time.Second // lease time to live, see WithTTL
	DefaultTablePrefix = "dsync_"         // see WithTablePrefix
	minTTL             = time.Second
	maxIdleConns       = 4 // session connections kept open between statements
)

// options is the configuration of a Session, set by Options and validated
// once in NewSession.
type options struct {
	ttl        time.Duration
	prefix     string
	newBackOff func() backoff.BackOff
	logger     *slog.Logger
	label      string
}

// An Option configures a [Session]. Options are validated by [NewSession],
// which returns an error wrapping [ErrInvalidOption] for a bad value.
type Option func(*options)

// WithTTL sets the lease time to live (default 15s, at least 1s). The
// session renews its lease every TTL/3; a process that dies frees its locks
// at most TTL after its last renewal, and a session that cannot reach the
// database for most of a TTL is lost ([Session.Done]).
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithTablePrefix sets the prefix of the table names (default "dsync_";
// only ASCII letters, digits and '_', at most 32 characters). Sessions see
// each other's locks only when they use the same prefix.
func WithTablePrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithBackOff sets the polling policy of a blocking Lock while another
// process holds the lock. newBackOff is called once per wait, so the
// policies it returns need not be safe for concurrent use. The default is an
// exponential back-off from 2ms to 100ms with jitter, without time limit
// (ctx bounds the wait). When a policy returns backoff.Stop, Lock returns
// [ErrNotObtained].
func WithBackOff(newBackOff func() backoff.BackOff) Option {
	return func(o *options) { o.newBackOff = newBackOff }
}

// WithLogger sets the logger for background events (renewal failures, lease
// loss). The default discards them.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithLabel sets the holder label stored in the lease row, for operators
// reading the tables (default "hostname:pid"; at most 255 bytes of UTF-8).
func WithLabel(label string) Option { return func(o *options) { o.label = label } }

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_]{0,32}$`)

func defaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 2 * time.Millisecond
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.MaxInterval = 100 * time.Millisecond
	b.MaxElapsedTime = 0
	return b
}

func (o *options) validate() error {
	switch {
	case o.ttl < minTTL:
		return fmt.Errorf("%w: TTL %v is below %v", ErrInvalidOption, o.ttl, minTTL)
	case !prefixPattern.MatchString(o.prefix):
		return fmt.Errorf("%w: table prefix %q: want at most 32 of [A-Za-z0-9_]", ErrInvalidOption, o.prefix)
	case o.newBackOff == nil:
		return fmt.Errorf("%w: nil back-off factory", ErrInvalidOption)
	case o.logger == nil:
		return fmt.Errorf("%w: nil logger", ErrInvalidOption)
	case len(o.label) > 255 || !utf8.ValidString(o.label):
		return fmt.Errorf("%w: label must be at most 255 bytes of UTF-8", ErrInvalidOption)
	}
	return nil
}

// A Session is one lease on the database, renewed in the background, and the
// owner of every lock taken through it: those locks live exactly as long as
// the lease. Create it with [NewSession]; the zero value is not usable. A
// Session is safe for concurrent use; one per process is usual.
//
// When the lease cannot be renewed before it could end on the server, the
// session is lost: [Session.Done] closes and [Session.Err] returns
// [ErrSessionExpired], before any other session can take its locks. Every
// later call then fails with ErrSessionExpired; make a new Session.
type Session struct {
	db     *sql.DB
	opts   options
	q      *queries
	pool   *connpool.Pool
	id     int64 // lease id, the holder column of the lock rows it holds
	logger *slog.Logger

	lastToken atomic.Int64  // last acquisition token handed out
	acquiring atomic.Int64  // goroutines in a database acquisition (see localLock)
	done      chan struct{} // closed when err is set
	stop      context.CancelFunc
	stopped   context.Context // ends when Close starts
	renewer   chan struct{}   // closed when the keep-alive goroutine returns

	mu      sync.Mutex
	err     error                // guarded by mu; nil while live
	closed  bool                 // guarded by mu; Close was called
	locks   registry[localLock]  // in-process state of the Mutex names in use
	queues  registry[localQueue] // the same for FairMutex and RWMutex names
	orphans []orphan             // guarded by mu; rows to free in the background
}

// orphan is a lock row or ticket that this session may hold without a local
// holder: an acquire or enqueue whose outcome was unknown (the statement may
// still land on the server after the client gave up on it), or a release
// that failed. The keep-alive goroutine frees it, by its token, so a later
// acquisition of the same name is never touched.
type orphan struct {
	name   string // lock name
	token  int64
	ticket bool      // a queued lock's ticket rather than a lock row
	since  time.Time // when it was recorded
}

// orphanWindow is how long the session keeps trying to free an orphan that
// it did not find: the statement that may create it can still be queued on
// the server behind a row lock (innodb_lock_wait_timeout is 50s by
// default), and lands, if ever, within that time.
const orphanWindow = time.Minute

// NewSession creates the tables if they are missing (safe when many
// processes start at once), inserts a lease row for the session and starts
// renewing it. ctx bounds only this setup. On error nothing is left running.
func NewSession(ctx context.Context, db *sql.DB, opts ...Option) (*Session, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	host, _ := os.Hostname()
	o := options{
		ttl:        DefaultTTL,
		prefix:     DefaultTablePrefix,
		newBackOff: defaultBackOff,
		logger:     slog.New(slog.DiscardHandler),
		label:      host + ":" + strconv.Itoa(os.Getpid()),
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	q := newQueries(o.prefix)
	for _, stmt := range []string{q.createLease, q.createLock, q.createQueue, q.createTicket, q.leasePurge, q.ticketPurge} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("dsync: prepare tables: %w", err)
		}
	}
	s := &Session{
		db:      db,
		opts:    o,
		q:       q,
		pool:    connpool.New(db, maxIdleConns, []string{qReadCommitted}, q.prepared[:]),
		logger:  o.logger,
		done:    make(chan struct{}),
		renewer: make(chan struct{}),
	}
	s.locks = newRegistry(&s.mu, func() *localLock { return &localLock{sem: make(chan struct{}, 1)} })
	s.queues = newRegistry(&s.mu, func() *localQueue {
		return &localQueue{enq: make(chan struct{}, 1), rOwners: make(map[uint64]int)}
	})
	start := time.Now()
	res, err := db.ExecContext(ctx, q.leaseInsert, o.label, o.ttl.Microseconds())
	if err == nil {
		s.id, err = res.LastInsertId()
	}
	if err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("dsync: create lease: %w", err)
	}
	s.stopped, s.stop = context.WithCancel(context.Background())
	go s.keepAlive(start)
	return s, nil
}

// ID returns the session's lease id, the value of the holder column of the
// lock rows it holds.
func (s *Session) ID() int64 { return s.id }

// TTL returns the lease time to live.
func (s *Session) TTL() time.Duration { return s.opts.ttl }

// Done returns a channel that is closed when the session ends: its lease was
// lost (see [Session.Err]) or [Session.Close] was called. Select on it
// beside long work done under a lock, and stop that work when it closes.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the session is live, [ErrSessionExpired] once its
// lease was lost, and [ErrSessionClosed] after Close.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// end records why the session ended and closes Done; the first call wins.
func (s *Session) end(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false
	}
	s.err = err
	close(s.done)
	return true
}

// safetyMargin is how long before the lease could end on the server the
// session gives up on it: room for timer and scheduling delays and for the
// two clocks running at slightly different rates.
func (s *Session) safetyMargin() time.Duration { return s.opts.ttl / 5 }

// keepAlive renews the lease every TTL/3. A renewal sent at local time t
// makes the lease end no earlier than t+TTL on the server (the server reads
// its clock after receiving it), so until t+TTL-margin no other session can
// take this session's locks. Failed renewals are retried until that local
// deadline; past it the session is lost.
func (s *Session) keepAlive(lastSent time.Time) {
	defer close(s.renewer)
	ttl := s.opts.ttl
	deadline := lastSent.Add(ttl - s.safetyMargin())
	timer := time.NewTimer(ttl / 3)
	defer timer.Stop()
	for {
		select {
		case <-s.stopped.Done():
			return
		case <-timer.C:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			s.lose(errors.New("renewal deadline passed"))
			return
		}
		ctx, cancel := context.WithDeadline(s.stopped, deadline)
		err := s.renew(ctx)
		cancel()
		switch {
		case err == nil:
			deadline = sent.Add(ttl - s.safetyMargin())
			next := sent.Add(ttl / 3)
			s.freeOrphans(next)
			timer.Reset(max(time.Until(next), 0))
		case errors.Is(err, errLeaseEnded):
			s.lose(err)
			return
		case s.stopped.Err() != nil:
			return
		default:
			s.logger.Warn("dsync: lease renewal failed; retrying", "session", s.id, "err", err,
				"deadline_in", time.Until(deadline))
			timer.Reset(min(ttl/10, max(time.Until(deadline), 0)))
		}
	}
}

var errLeaseEnded = errors.New("lease ended on the server")

func (s *Session) renew(ctx context.Context) error {
	return s.withConn(ctx, func(c *connpool.Conn) error {
		res, err := c.Stmt(int(sLeaseRenew)).ExecContext(ctx, s.opts.ttl.Microseconds(), s.id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return errLeaseEnded
		}
		return nil
	})
}

func (s *Session) lose(cause error) {
	if s.end(ErrSessionExpired) {
		s.logger.Error("dsync: session lost; its locks may belong to others now", "session", s.id, "cause", cause)
	}
}

// withConn runs f on one of the session's connections.
func (s *Session) withConn(ctx context.Context, f func(*connpool.Conn) error) error {
	c, err := s.pool.Get(ctx)
	if err != nil {
		return err
	}
	err = f(c)
	s.pool.Put(c, err)
	return err
}

// addOrphan records a lock row or ticket to free in the background.
func (s *Session) addOrphan(o orphan) {
	o.since = time.Now()
	s.mu.Lock()
	s.orphans = append(s.orphans, o)
	s.mu.Unlock()
}

// freeOrphans tries once to free every orphaned row or ticket, giving up at
// until, so that the next renewal is not delayed.
func (s *Session) freeOrphans(until time.Time) {
	s.mu.Lock()
	todo := s.orphans
	s.orphans = nil
	s.mu.Unlock()
	var keep []orphan
	for i, o := range todo {
		ctx, cancel := context.WithDeadline(s.stopped, until)
		freed, err := s.free(ctx, o)
		cancel()
		if err != nil {
			keep = append(keep, todo[i:]...)
			break
		}
		if !freed && time.Since(o.since) < orphanWindow {
			keep = append(keep, o)
		}
	}
	if len(keep) > 0 {
		s.mu.Lock()
		s.orphans = append(s.orphans, keep...)
		s.mu.Unlock()
	}
}

// Close ends the session: Done closes, calls in progress and later return
// [ErrSessionClosed], and the lease row is deleted, which frees every lock
// the session holds at once. Close returns within about one TTL even when the database is
// unreachable; the lease then simply ends on the server. Calling Close again
// returns ErrSessionClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.closed = true
	s.mu.Unlock()
	s.end(ErrSessionClosed)
	s.stop()
	<-s.renewer
	defer s.pool.Close()

	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ttl)
	defer cancel()
	// Deleting the lease frees every lock row and ticket of the session at
	// once: a holder whose lease row is gone holds nothing.
	err := s.withConn(ctx, func(c *connpool.Conn) error {
		_, err := c.ExecContext(ctx, s.q.leaseDelete, s.id)
		return err
	})
	if err != nil {
		return fmt.Errorf("dsync: close session %d (its lease ends on the server within %v): %w", s.id, s.opts.ttl, err)
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

// knownHolds lists the lock rows and tickets the session holds or may hold:
// its holds and its orphans.
func (s *Session) knownHolds() []orphan {
	s.mu.Lock()
	defer s.mu.Unlock()
	holds := append([]orphan(nil), s.orphans...)
	for name, e := range s.locks.entries {
		e.state.mu.Lock()
		if e.state.held {
			holds = append(holds, orphan{name: name, token: e.state.token})
		}
		e.state.mu.Unlock()
	}
	for name, e := range s.queues.entries {
		e.state.mu.Lock()
		if e.state.held {
			holds = append(holds, orphan{name: name, token: e.state.token, ticket: true})
		}
		for _, r := range e.state.reads {
			holds = append(holds, orphan{name: name, token: r.token, ticket: true})
		}
		e.state.mu.Unlock()
	}
	return holds
}

// nextToken returns a token for a new acquisition, unique in this session.
func (s *Session) nextToken() int64 { return s.lastToken.Add(1) }

// acquireRow makes one attempt to take the lock row for name, with the
// cheap statement for a row that exists and is free when fast is set (a miss
// then says nothing about the row), else with the statement that handles
// every state of the row. It returns the new fence, or 0 when not taken.
// Its outcome is unknown when the statement failed other than by a server
// error (the connection broke, ctx ended): then it undoes the attempt before
// returning the error, so that no row is left held without a holder.
func (s *Session) acquireRow(ctx context.Context, name string, token int64, fast bool) (int64, error) {
	var fence int64
	err := s.withConn(ctx, func(c *connpool.Conn) error {
		var res sql.Result
		var err error
		if fast {
			res, err = c.Stmt(int(sLockAcquireFast)).ExecContext(ctx, s.id, token, name)
		} else {
			res, err = c.Stmt(int(sLockAcquire)).ExecContext(ctx, name, s.id, token, -s.id, token, s.id)
		}
		if err != nil {
			if !connpool.Reusable(err) {
				s.undo(orphan{name: name, token: token})
			}
			return err
		}
		fence, err = res.LastInsertId()
		return err
	})
	return fence, err
}

// undo frees a lock row or ticket that an acquisition or enqueue whose
// outcome is unknown may have created. The statement may still be on its
// way to the server, or waiting there, when the client gave up on it (the
// driver does not cancel it there): unless the undo found and freed it, the
// keep-alive goroutine keeps trying for orphanWindow.
func (s *Session) undo(o orphan) {
	ctx, cancel := context.WithTimeout(s.stopped, s.opts.ttl/3)
	defer cancel()
	if freed, err := s.free(ctx, o); err != nil || !freed {
		s.addOrphan(o)
	}
}

// free releases the lock row or removes the ticket o names, if this
// session's acquisition o.token still has it, and reports whether it did.
func (s *Session) free(ctx context.Context, o orphan) (bool, error) {
	if o.ticket {
		return s.execChanged(ctx, sTicketDelete, o.name, s.id, o.token)
	}
	return s.execChanged(ctx, sLockRelease, o.name, s.id, o.token)
}

// releaseRow frees the row for name if this acquisition (token) holds it,
// and reports whether it did.
func (s *Session) releaseRow(ctx context.Context, name string, token int64) (bool, error) {
	return s.free(ctx, orphan{name: name, token: token})
}

// execChanged runs a prepared statement and reports whether it changed a
// row.
func (s *Session) execChanged(ctx context.Context, stmt stmtIndex, args ...any) (bool, error) {
	var n int64
	err := s.withConn(ctx, func(c *connpool.Conn) error {
		res, err := c.Stmt(int(stmt)).ExecContext(ctx, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n > 0, err
}

// validName reports whether name can be a lock name.
func validName(name string) error {
	if name == "" || len(name) > 255 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q (want 1 to 255 bytes of UTF-8)", ErrInvalidName, name)
	}
	return nil
}

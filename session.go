package dsync

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync/internal/connpool"
)

// Defaults of the session options.
const (
	DefaultTTL         = 15 * time.Second // lease time to live, see WithTTL
	DefaultTablePrefix = "dsync_"         // see WithTablePrefix
	DefaultFreeRowAge  = time.Hour        // see WithFreeRowAge
	minTTL             = time.Second
	minFreeRowAge      = time.Second
	maxTTL             = 24 * time.Hour
	maxConns           = 4 // most connections the sessions of one *sql.DB keep
)

// options is the configuration of a Session, set by Options and validated
// once in NewSession.
type options struct {
	ttl        time.Duration
	prefix     string
	newBackOff func() backoff.BackOff
	logger     *slog.Logger
	label      string
	freeRowAge time.Duration // 0: no clean-up
	sweepEvery time.Duration // the sweep interval when set (tests); else see sweepInterval
}

// An Option configures a [Session]. Options are validated by [NewSession],
// which returns an error wrapping [ErrInvalidOption] for a bad value.
type Option func(*options)

// WithTTL sets the lease time to live (default 15s, from 1s to 24h). The
// session renews its lease every TTL/3, and at least every 2s (so that a
// database stall shorter than 0.8*TTL-2s loses no session); a process that dies frees its locks
// at most TTL after its last renewal, and a session that cannot reach the
// database for most of a TTL is lost ([Session.Done]).
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithTablePrefix sets the prefix of the table names (default "dsync_";
// only ASCII letters, digits and '_', at most 32 characters). Sessions see
// each other's locks only when they use the same prefix.
func WithTablePrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithBackOff sets the polling policy of a blocking Lock while another
// process holds the lock, where waiters poll (no doorbell: see the
// package's Waiting section); a waiter on a doorbell consults it once per
// wake-up, only for backoff.Stop. newBackOff is called once per wait, so
// the policies it returns need not be safe for concurrent use. The default
// is an exponential back-off from 2ms to 100ms with jitter, without time
// limit (ctx bounds the wait). When a policy returns backoff.Stop, Lock
// returns [ErrNotObtained]; on a doorbell that may be up to 8s after the
// policy's time limit (bound a wait with ctx instead).
func WithBackOff(newBackOff func() backoff.BackOff) Option {
	return func(o *options) { o.newBackOff = newBackOff }
}

// WithLogger sets the logger for the session's events: long waits for a
// lock, renewal failures, the lease lost, orphans freed (the records and
// their attributes are listed in the package doc, under Logging). The
// default discards them.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithLabel sets the holder label stored in the lease row, for operators
// reading the tables (default "hostname:pid"; at most 255 bytes of UTF-8).
func WithLabel(label string) Option { return func(o *options) { o.label = label } }

// WithFreeRowAge sets how long a lock row or queue row must have been free
// before it is deleted (default [DefaultFreeRowAge], one hour; at least 1s;
// 0: this session deletes none). Lock and queue rows are one per name ever
// used, so without clean-up a service that locks per entity (per order,
// per user) grows the tables for ever. A free row is one no session holds
// or waits for; rows of held locks, of queued locks with a waiter, and of
// locks used within the age are never deleted. The next use of a deleted
// name creates its row again, at the cost of one more statement (a queued
// lock's: a read and a transaction of two).
//
// A name's lock row also binds the name to the kind of lock that uses it
// (see [ErrOtherKind]): the name is free for the other kind once the
// clean-up has deleted it, the age after its last use for a Mutex, and
// after its queue row, about twice the age, for a FairMutex or RWMutex.
//
// Fences stay strictly increasing across deletion: before it deletes rows,
// the clean-up records the highest fence among them in the schema table,
// and a row created anew starts its fences above that record (and at least
// at the database's clock in microseconds), whatever the clocks do.
//
// The clean-up runs in the background, at most one pass at a time across
// every session of the tables, elected through the schema table. A pass
// starts about every age/8 (from 1s to 10min) and walks the tables in
// batches of 500 names, each batch a few short autocommit statements on
// the session's own connections, so lock traffic waits at most one of
// them. A row is deleted by the first pass that reaches it at least age
// after a pass found it free: at most age + 2.75 intervals (1.34 x age)
// after it fell free, plus up to three pass durations (see the README for
// measured ones). The session that runs a pass applies its own age: give
// every session of the tables the same one.
func WithFreeRowAge(age time.Duration) Option { return func(o *options) { o.freeRowAge = age } }

var prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_]{0,32}$`)

func defaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 2 * time.Millisecond
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.MaxInterval = 100 * time.Millisecond
	b.MaxElapsedTime = 0
	b.Reset() // NewExponentialBackOff has reset itself with its own defaults
	return b
}

func (o *options) validate() error {
	switch {
	case o.ttl < minTTL || o.ttl > maxTTL:
		return fmt.Errorf("%w: TTL %v is not between %v and %v", ErrInvalidOption, o.ttl, minTTL, maxTTL)
	case !prefixPattern.MatchString(o.prefix):
		return fmt.Errorf("%w: table prefix %q: want at most 32 of [A-Za-z0-9_]", ErrInvalidOption, o.prefix)
	case o.newBackOff == nil:
		return fmt.Errorf("%w: nil back-off factory", ErrInvalidOption)
	case o.logger == nil:
		return fmt.Errorf("%w: nil logger", ErrInvalidOption)
	case len(o.label) > 255 || !utf8.ValidString(o.label):
		return fmt.Errorf("%w: label must be at most 255 bytes of UTF-8", ErrInvalidOption)
	case o.freeRowAge < 0 || (o.freeRowAge > 0 && o.freeRowAge < minFreeRowAge && o.sweepEvery == 0):
		return fmt.Errorf("%w: free-row age %v: want 0 (no clean-up) or at least %v", ErrInvalidOption, o.freeRowAge, minFreeRowAge)
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
//
// # Connections
//
// When the *sql.DB has no connection limit (SetMaxOpenConns), each session
// keeps a connection of its own for its lease (opened by NewSession, with
// the renewal prepared, before it returns), so that lock traffic never
// delays a renewal and a renewal never waits for a connection; the
// sessions of one *sql.DB (and table prefix) share at most 3 more for lock
// statements, and each session that has locked or waited keeps a doorbell
// connection, and up to 8 while waiting, kept idle for the next waits; and
// one per [Mutex.LockTx] hold in progress, blocked until its transaction
// ends, of which it keeps up to 4 idle for the next holds (see the
// README's Connections section). With a limit, the sessions of one *sql.DB
// share a quarter of it, at least 2 and at most 4, or 1 when the limit is
// 2 or 3 (then renewals only go first: they may wait for one lock
// statement); a limit of 1 leaves the caller nothing, and NewSession
// refuses it. When there are two or more, one of them, once opened, is
// kept warm for the sessions' renewals only (lock statements open their
// own), and renewals go first. LockTx holds then take no connection of
// their own: the session checks for their end on these. dsync pins what
// its statements rely on (autocommit, isolation, time zone, sql_mode) on
// these connections, whatever the DSN says, and so never hands them back
// to the pool: it closes them when it is done with
// them (the session, or the last session of the pool, closed or lost, or a
// connection in an unknown state). When the server refuses a connection
// (1040, too many connections), NewSession and the calls that need one
// return that error.
type Session struct {
	db     *sql.DB
	opts   options
	q      *queries
	pool   *connpool.Pool
	lease  *leaseConn // the session's own connection for its lease statements; nil: they use the pool's reserve (see acquirePool)
	galera bool       // the database is a Galera cluster node (see qSyncWait)
	id     int64      // lease id, the holder column of the lock rows it holds
	logger *slog.Logger

	// origin is a reading of the monotonic clock; deadline (nanoseconds
	// after origin) is when the lease could end on the server, less the
	// safety margin. Err reports the session lost from then on, even when
	// the keep-alive goroutine has not run (a paused process).
	origin   time.Time
	deadline atomic.Int64

	lastToken atomic.Int64  // last acquisition token handed out
	acquiring atomic.Int64  // goroutines in a database acquisition (see localLock)
	done      chan struct{} // closed when err is set
	stop      context.CancelFunc
	stopped   context.Context // ends when Close starts or the session is lost
	renewer   chan struct{}   // closed when the keep-alive goroutine returns
	reaper    chan struct{}   // closed when the reaper goroutine returns
	sweeper   chan struct{}   // closed when the sweeper goroutine returns (see sweep.go)
	sweeps    atomic.Int64    // sweep passes this session has run
	kick      chan struct{}   // a value: the reaper has orphans to free now
	release   sync.Once       // releases the session's share of the pool
	stats     counters        // see Stats

	mu      sync.Mutex
	err     error                // guarded by mu; nil while live
	closed  bool                 // guarded by mu; Close was called
	locks   registry[localLock]  // in-process state of the Mutex names in use
	queues  registry[localQueue] // the same for FairMutex and RWMutex names
	orphans []orphan             // guarded by mu; rows to free in the background
	freeing int                  // guarded by mu; orphans taken out of orphans by freeOrphans, being freed
	bell    doorbell             // this session's doorbell (see bell.go)
	waiters bellWaiter           // connections that wait on other sessions' doorbells

	noWaitOff atomic.Bool // the server refused the no-wait statements (see noWait)

	txq      atomic.Pointer[txQueries] // LockTx's statements, made at its first use (see locktx.go)
	txHolds  sync.WaitGroup            // goroutines waiting for a LockTx hold's transaction to end
	txClosed bool                      // guarded by mu; no new such goroutine starts
	txConns  []*connpool.Conn          // guarded by mu; idle connections of those goroutines
}

// orphan is a lock row or ticket that this session may hold without a local
// holder: an acquire or enqueue whose outcome was unknown (the statement may
// still land on the server after the client gave up on it), an acquisition
// made as the session ended, or a release that failed. The reaper goroutine
// frees it, by its token, so a later acquisition of the same name is never
// touched.
type orphan struct {
	name   string // lock name
	token  int64
	ticket bool      // a queued lock's ticket (or head slot) rather than a lock row
	seq    int64     // the ticket's number, when known (0: not known), or headSlot
	since  time.Time // when it was recorded
}

// kind returns the kind of lock of o, as log records name it.
func (o orphan) kind() string {
	if o.ticket {
		return kindQueue
	}
	return kindMutex
}

// orphanWindow is how long the session keeps trying to free an orphan that
// it did not find: the statement that may create it can still be queued on
// the server behind a row lock (innodb_lock_wait_timeout is 50s by
// default), and lands, if ever, within that time.
const orphanWindow = time.Minute

// purgeEvery is how often a session purges long-ended leases and their
// tickets (housekeeping only: nothing depends on it).
const purgeEvery = 10 * time.Minute

// shared pools of session connections, one per *sql.DB and table prefix.
var pools = struct {
	sync.Mutex
	m map[poolKey]*sharedPool
}{m: make(map[poolKey]*sharedPool)}

type poolKey struct {
	db     *sql.DB
	prefix string
}

type sharedPool struct {
	pool   *connpool.Pool
	galera bool // the database is a Galera cluster node
	refs   int  // sessions using it; guarded by pools' mutex
}

// poolSize is how many connections the sessions of db share (see Session)
// for their lock statements, and, when db has a connection limit, for
// their renewals too.
func poolSize(db *sql.DB) (int, error) {
	limit := db.Stats().MaxOpenConnections
	switch {
	case limit == 0:
		// Each session renews on a connection of its own (leaseConn).
		return maxConns - 1, nil
	case limit < 2:
		return 0, fmt.Errorf("%w: the *sql.DB allows %d open connection(s); dsync keeps one of them, so allow at least 2 (SetMaxOpenConns)", ErrInvalidOption, limit)
	case limit < 4:
		return 1, nil // no connection to spare for renewals alone
	}
	return min(max(limit/4, 2), maxConns), nil
}

// acquirePool returns the shared pool of db and prefix, counting a user,
// and whether the database is a Galera cluster node. The first session of
// a pool asks the server (see isGalera).
func acquirePool(ctx context.Context, db *sql.DB, q *queries) (*connpool.Pool, bool, error) {
	k := poolKey{db, q.tables[0]}
	pools.Lock()
	sp := pools.m[k]
	pools.Unlock()
	galera := false
	if sp == nil {
		var err error
		if galera, err = isGalera(ctx, db); err != nil {
			return nil, false, fmt.Errorf("dsync: ask the server about wsrep: %w", err)
		}
	}
	pools.Lock()
	defer pools.Unlock()
	sp = pools.m[k]
	size, err := poolSize(db)
	if err != nil {
		return nil, false, err
	}
	if sp != nil {
		sp.pool.Resize(size)
	} else {
		setup := []string{qSetSession, qReadCommitted}
		if galera {
			setup = append(setup, qSyncWait)
		}
		// Where sessions renew on the pool's connections (a *sql.DB with a
		// connection limit), every one has the renewal prepared before a
		// renewal needs it, so that a renewal costs one round trip even on
		// a new one; elsewhere they renew on their own (leaseConn, which
		// start leaves with the renewal prepared).
		var eager []int
		if ownLeaseConn(db) == nil {
			eager = append(eager, int(sLeaseRenew))
		}
		sp = &sharedPool{pool: connpool.New(db, size, setup, q.prepared[:], eager...), galera: galera}
		// Lock statements never use more than maxConns-1 connections; the
		// rest serve renewals.
		sp.pool.LimitNormal(maxConns - 1)
		pools.m[k] = sp
	}
	// Where each session renews on a connection of its own, the pool keeps
	// none for renewals.
	sp.pool.KeepReserve(db.Stats().MaxOpenConnections != 0)
	sp.refs++
	return sp.pool, sp.galera, nil
}

// isGalera reports whether db is a Galera cluster node with replication on.
// It runs one read on a connection of db's own pool.
func isGalera(ctx context.Context, db *sql.DB) (bool, error) {
	var name, value string
	err := db.QueryRowContext(ctx, qWsrepOn).Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // not MariaDB, or built without wsrep
	case err != nil:
		return false, err
	}
	return strings.EqualFold(value, "ON"), nil
}

// releasePool drops a user of a shared pool, closing it after the last.
func releasePool(db *sql.DB, q *queries) {
	pools.Lock()
	defer pools.Unlock()
	k := poolKey{db, q.tables[0]}
	sp := pools.m[k]
	if sp.refs--; sp.refs == 0 {
		delete(pools.m, k)
		sp.pool.Close()
	} else if size, err := poolSize(db); err == nil {
		sp.pool.Resize(size)
	}
}

// NewSession creates the tables if they are missing (safe when many
// processes start at once), inserts a lease row for the session and starts
// renewing it. ctx bounds only this setup. On error nothing is left running.
// It returns an error wrapping [ErrInvalidOption] for a bad option, a nil
// db, or a db whose connection limit leaves the caller nothing (see
// [Session]).
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
		freeRowAge: DefaultFreeRowAge,
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
	pool, galera, err := acquirePool(ctx, db, q)
	if err != nil {
		return nil, err
	}
	s := &Session{
		db:      db,
		opts:    o,
		q:       q,
		pool:    pool,
		lease:   ownLeaseConn(db),
		galera:  galera,
		logger:  o.logger,
		done:    make(chan struct{}),
		renewer: make(chan struct{}),
		reaper:  make(chan struct{}),
		sweeper: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		bell: doorbell{ring: make(chan struct{}, 1), done: make(chan struct{}),
			allowed: !galera && db.Stats().MaxOpenConnections == 0},
	}
	s.stopped, s.stop = context.WithCancel(context.Background())
	s.locks = newRegistry(&s.mu, func() *localLock { return &localLock{sem: make(chan struct{}, 1)} })
	s.queues = newRegistry(&s.mu, func() *localQueue {
		return &localQueue{enq: make(chan struct{}, 1), rOwners: make(map[uint64]int)}
	})
	if err := s.start(ctx); err != nil {
		s.stop()
		s.lease.close()
		s.release.Do(func() { releasePool(db, q) })
		return nil, err
	}
	s.logger = s.logger.With("session", s.id) // every record names its session
	go s.keepAlive()
	go s.reap()
	go s.sweepLoop()
	return s, nil
}

// start creates the missing tables and the lease, on the connection of the
// lease statements, which it leaves with the renewal prepared, and sets the
// first deadline.
func (s *Session) start(ctx context.Context) error {
	return s.withConn(ctx, true, func(ctx context.Context, c *connpool.Conn) error {
		// On a Galera cluster the DDL of sessions creating the tables at
		// once, and the version record, can meet as certification
		// conflicts (1213), which roll a statement back: all of it runs
		// again, and finds what the others created.
		_, err := retryRolledBack(ctx, func() (sql.Result, error) { return nil, s.createTables(ctx, c) })
		if errors.Is(err, ErrSchemaVersion) {
			return err
		} else if err != nil {
			return fmt.Errorf("dsync: prepare tables: %w", err)
		}
		st, err := c.Stmt(ctx, s.pool, int(sLeaseInsert))
		if err == nil {
			_, err = c.Stmt(ctx, s.pool, int(sLeaseRenew)) // see acquirePool
		}
		if err != nil {
			return fmt.Errorf("dsync: create lease: %w", err)
		}
		for attempt := 0; ; attempt++ {
			id, err := randomID()
			if err != nil {
				return fmt.Errorf("dsync: create lease: %w", err)
			}
			// The lease can end no earlier than TTL after the insert is
			// sent: the clock starts now, not before the statement was
			// prepared or the connection opened.
			_, err = retryRolledBack(ctx, func() (sql.Result, error) {
				s.origin = time.Now()
				return st.ExecContext(ctx, id, s.opts.label, s.opts.ttl.Microseconds())
			})
			if err == nil {
				s.id = id
				s.deadline.Store(int64(s.opts.ttl - s.safetyMargin()))
				return nil
			}
			if !isErrNo(err, 1062) || attempt == 9 || ctx.Err() != nil {
				return fmt.Errorf("dsync: create lease: %w", err)
			}
		}
	})
}

// createTables creates whichever of the tables are missing, and checks the
// schema version they were created with. The version table is created (and
// the version recorded) before the others, so tables without it are of a
// dsync older than the version record. A version already recorded is
// checked before any DDL, so that tables of another version are left as
// they are (no table of this version is added beside them).
func (s *Session) createTables(ctx context.Context, c *connpool.Conn) error {
	present, err := s.tablesPresent(ctx, c)
	if err != nil {
		return err
	}
	schema := s.q.tables[0]
	if !present[schema] && len(present) > 0 {
		var found []string
		for _, table := range s.q.tables[1:] {
			if present[table] {
				found = append(found, table)
			}
		}
		// With the empty prefix, another application's table called lock
		// or queue gets here as well as an old dsync's tables.
		return fmt.Errorf("%w: found %s but no version table %s: tables of a dsync before schema version %d, or another application's (give dsync a table prefix of its own: WithTablePrefix)",
			ErrSchemaVersion, strings.Join(found, ", "), schema, schemaVersion)
	}
	if present[schema] && len(present) < len(s.q.tables) {
		var version int
		err := c.QueryRowContext(ctx, s.q.version).Scan(&version)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// Created by a session that has not recorded the version
			// yet; checked again below.
		case err != nil:
			return err
		case version != schemaVersion:
			return fmt.Errorf("%w: table %s records version %d, this dsync uses version %d",
				ErrSchemaVersion, schema, version, schemaVersion)
		}
	}
	for i, table := range s.q.tables {
		if present[table] {
			continue
		}
		if _, err := c.ExecContext(ctx, s.q.creates[i]); err != nil {
			return err
		}
		if i == 0 {
			if _, err := c.ExecContext(ctx, s.q.record, schemaVersion); err != nil {
				return err
			}
		}
	}
	var version int
	err = c.QueryRowContext(ctx, s.q.version).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		// Created by a session that has not recorded the version yet.
		if _, err := c.ExecContext(ctx, s.q.record, schemaVersion); err != nil {
			return err
		}
		err = c.QueryRowContext(ctx, s.q.version).Scan(&version)
	}
	switch {
	case err != nil:
		return err
	case version != schemaVersion:
		return fmt.Errorf("%w: table %s records version %d, this dsync uses version %d",
			ErrSchemaVersion, schema, version, schemaVersion)
	}
	return nil
}

// tablesPresent reads which of the session's tables exist, keyed by the
// session's names for them. A server that compares table names without
// regard to case (lower_case_table_names) may return them in lower case
// whatever the prefix's case: its names are matched to the session's
// without regard to case too.
func (s *Session) tablesPresent(ctx context.Context, c *connpool.Conn) (map[string]bool, error) {
	t := s.q.tables
	rows, err := c.QueryContext(ctx, qTablesPresent, t[0], t[1], t[2], t[3], t[4], t[5])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	present := make(map[string]bool)
	for rows.Next() {
		var name string
		var folds bool
		if err := rows.Scan(&name, &folds); err != nil {
			return nil, err
		}
		for _, table := range t {
			if name == table || folds && strings.EqualFold(name, table) {
				present[table] = true
			}
		}
	}
	return present, rows.Err()
}

// randomID returns a random positive lease id: ids never repeat in
// practice, even after the lease table was emptied or restored.
func randomID() (int64, error) {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(b[:])>>1) | 1, nil
}

// isErrNo reports whether err is a server error with one of the numbers.
func isErrNo(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
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

// Deadline returns the local time until which the lease is known to hold:
// the last successful renewal's send time plus the TTL, less the safety
// margin of TTL/5 (the server keeps the lease at least TTL/5 longer). A
// renewal that succeeds moves it later; when none does before it, Done
// closes then. It has a monotonic clock reading, so [time.Until] of it is
// exact. Once the session has ended it no longer moves.
func (s *Session) Deadline() time.Time {
	return s.origin.Add(time.Duration(s.deadline.Load()))
}

// Err returns nil while the session is live, [ErrSessionExpired] once its
// lease was lost, and [ErrSessionClosed] after Close. It checks the renewal
// deadline itself: after the process was paused (SIGSTOP, a VM pause) past
// it, Err reports the loss (and Done closes) even before the keep-alive
// goroutine has run again.
func (s *Session) Err() error {
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err == nil && s.pastDeadline() {
		s.lose(errors.New("renewal deadline passed"))
		return s.Err()
	}
	return err
}

// pastDeadline reports whether the lease could have ended on the server.
func (s *Session) pastDeadline() bool {
	return time.Since(s.origin) >= time.Duration(s.deadline.Load())
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

// safetyMargin is how long before the lease could end on the server the
// session gives up on it: room for timer and scheduling delays and for the
// two clocks running at slightly different rates.
func (s *Session) safetyMargin() time.Duration { return s.opts.ttl / 5 }

// renewEvery is how often the lease is renewed: every TTL/3, and at least
// every maxRenewEvery. The session gives up on its lease TTL-TTL/5 after the
// last renewal that succeeded was sent, so a stall of the database (every
// statement waiting, as all commits of a Galera cluster do for about 6s
// until a crashed node is evicted) loses no session when it is shorter
// than 0.8*TTL - renewEvery: 10s for the default TTL of 15s.
func (s *Session) renewEvery() time.Duration { return min(s.opts.ttl/3, maxRenewEvery) }

// maxRenewEvery bounds the renewal period of long TTLs (see renewEvery).
const maxRenewEvery = 2 * time.Second

// keepAlive renews the lease every renewEvery. A renewal sent at local time t
// makes the lease end no earlier than t+TTL on the server (the server reads
// its clock after receiving it), so until t+TTL-margin no other session can
// take this session's locks. Failed renewals are retried until that local
// deadline; past it the session is lost.
func (s *Session) keepAlive() {
	defer close(s.renewer)
	ttl := s.opts.ttl
	lastSent := s.origin
	every := s.renewEvery()
	timer := time.NewTimer(max(time.Until(lastSent.Add(every)), 0))
	defer timer.Stop()
	failures := 0 // renewals failed in a row
	for {
		select {
		case <-s.stopped.Done():
			return
		case <-timer.C:
		}
		deadline := s.origin.Add(time.Duration(s.deadline.Load()))
		if !time.Now().Before(deadline) {
			s.lose(errors.New("renewal deadline passed"))
			return
		}
		ctx, cancel := context.WithDeadline(s.stopped, deadline)
		sent, err := s.renew(ctx)
		cancel()
		switch {
		case err == nil:
			s.stats.renewals.Add(1)
			failures = 0
			lastSent = sent
			s.deadline.Store(int64(sent.Sub(s.origin) + ttl - s.safetyMargin()))
			timer.Reset(max(time.Until(lastSent.Add(every)), 0))
		case errors.Is(err, errLeaseEnded):
			s.stats.renewalFailures.Add(1)
			s.lose(err)
			return
		case s.stopped.Err() != nil:
			return
		default:
			s.stats.renewalFailures.Add(1)
			failures++
			s.logger.Warn("dsync: lease renewal failed; retrying", "err", err, "attempt", failures,
				"deadline_in", time.Until(deadline))
			timer.Reset(min(ttl/10, max(time.Until(deadline), 0)))
		}
	}
}

var errLeaseEnded = errors.New("lease ended on the server")

// renew extends the lease once, on the connection of the lease statements
// (see leaseConn), and returns when the renewal was sent: the lease lasts
// at least TTL from then.
func (s *Session) renew(ctx context.Context) (sent time.Time, err error) {
	err = s.withConn(ctx, true, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.pool, int(sLeaseRenew))
		if err != nil {
			return err
		}
		res, err := retryRolledBack(ctx, func() (sql.Result, error) {
			sent = time.Now()
			return st.ExecContext(ctx, s.opts.ttl.Microseconds(), s.id)
		})
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
	return sent, err
}

// lose ends the session as lost: its lease may end on the server at any
// moment, so nothing it holds is worth freeing, and its connections go.
func (s *Session) lose(cause error) {
	if s.end(ErrSessionExpired, func() {
		s.logger.Error("dsync: session lost; its locks may belong to others now", "err", cause)
	}) {
		s.stop()
		s.lease.close() // after stop: a renewal on it ends at once
		s.waiters.closeIdle()
		s.closeTxConns()
		s.release.Do(func() { releasePool(s.db, s.q) })
	}
}

// closeTxConns closes the idle connections of ended LockTx holds. Once the
// session has stopped, awaitTxEnd keeps no more of them.
func (s *Session) closeTxConns() {
	s.mu.Lock()
	idle := s.txConns
	s.txConns = nil
	s.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// withConn runs f on one of the session's connections (priority: a lease
// statement, which runs on the session's own connection when it has one,
// see leaseConn), under a ctx that ends when ctx does or when the session ends
// (closed or lost), so that no call outlives its session even with a
// context.Background() ctx and a database that stopped answering; Close's
// own statements (see closingCtx) run under Close's ctx alone. A connection
// whose use ended with that ctx done is discarded: the driver may have
// closed it, or a statement may still be running on it.
func (s *Session) withConn(ctx context.Context, priority bool, f func(context.Context, *connpool.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err // no connection is spent on a call that cannot run
	}
	sctx := ctx
	if ctx.Value(closingKey{}) == nil {
		if ctx.Done() == nil {
			sctx = s.stopped // no allocation on the common path
		} else {
			var cancel context.CancelFunc
			sctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(s.stopped, cancel)()
		}
	}
	err := s.use(sctx, priority, f)
	if err != nil && ctx.Err() == nil && sctx.Err() != nil {
		if serr := s.Err(); serr != nil {
			return serr // the session ended under the statement
		}
	}
	return err
}

// use runs f on a connection from the pool under ctx and puts it back, or,
// for a lease statement, on the session's own connection when it has one.
func (s *Session) use(ctx context.Context, priority bool, f func(context.Context, *connpool.Conn) error) error {
	if priority && s.lease != nil {
		return s.lease.use(ctx, s.pool, f)
	}
	c, err := s.pool.Get(ctx, priority)
	if err != nil {
		return err
	}
	err = f(ctx, c)
	if cerr := ctx.Err(); cerr != nil {
		s.pool.Put(c, cerr) // discarded: the driver may have closed it
	} else {
		s.pool.Put(c, err)
	}
	return err
}

// leaseConn is a session's own connection for its lease statements (the
// lease insert, then renewals), apart from the connections its locks use:
// whatever lock traffic needs (connections to open, statements to prepare,
// doorbells) never delays a renewal, and a renewal never waits for a
// connection that lock traffic, or another session of the same *sql.DB,
// holds. NewSession opens it and prepares the renewal on it before it
// returns; after a failure that may have left it unusable it is closed, and
// the next renewal opens another. Sessions have one when their *sql.DB has
// no connection limit; on a limited one they renew on the connection that
// the shared pool keeps for renewals instead, so that they do not take a
// connection each of the caller's share.
type leaseConn struct {
	mu sync.Mutex     // held for a use: by start, the keep-alive goroutine, Close
	c  *connpool.Conn // guarded by mu; nil: opened at the next use
}

// ownLeaseConn returns the lease connection of a new session on db, or nil
// when db has a connection limit.
func ownLeaseConn(db *sql.DB) *leaseConn {
	if db.Stats().MaxOpenConnections != 0 {
		return nil
	}
	return &leaseConn{}
}

// use runs f on the connection, opened (and set up as p's are) when there
// is none, and closes it when f's use did not end cleanly.
func (l *leaseConn) use(ctx context.Context, p *connpool.Pool, f func(context.Context, *connpool.Conn) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c == nil {
		c, err := p.Dedicated(ctx)
		if err != nil {
			return err
		}
		l.c = c
	}
	err := f(ctx, l.c)
	if ctx.Err() != nil || !connpool.Reusable(err) {
		l.c.Close() // the driver may have closed it, or a statement may still run on it
		l.c = nil
	}
	return err
}

// close closes the connection, if any; l may be nil.
func (l *leaseConn) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		l.c.Close()
		l.c = nil
	}
}

// closingKey marks the ctx of Close's own statements, which run after the
// session has ended.
type closingKey struct{}

// closingCtx returns the ctx for Close's own statements.
func closingCtx(ctx context.Context) context.Context {
	return context.WithValue(ctx, closingKey{}, true)
}

// addOrphan records a lock row or ticket to free in the background and
// wakes the reaper.
func (s *Session) addOrphan(o orphan) {
	o.since = time.Now()
	s.mu.Lock()
	s.orphans = append(s.orphans, o)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// reap frees orphans as soon as they are recorded (and retries every
// TTL/3), and purges long-ended leases now and then. It runs beside the
// keep-alive goroutine so that nothing it does can delay a renewal.
func (s *Session) reap() {
	defer close(s.reaper)
	retry := time.NewTicker(s.opts.ttl / 3)
	defer retry.Stop()
	// The first purge comes at a random moment of the first minute, so that
	// sessions starting together do not purge together.
	purge := time.NewTimer(time.Second + rand.N(time.Minute))
	defer purge.Stop()
	for {
		select {
		case <-s.stopped.Done():
			return
		case <-s.kick:
		case <-retry.C:
		case <-purge.C:
			s.purge()
			purge.Reset(purgeEvery)
			continue
		}
		s.freeOrphans()
	}
}

// purge deletes leases that ended over an hour ago and tickets of deleted
// leases; a failure is only logged.
func (s *Session) purge() {
	ctx, cancel := context.WithTimeout(s.stopped, s.opts.ttl)
	defer cancel()
	type ticket struct {
		name        string
		seq, holder int64
	}
	var tickets []ticket
	_, err := s.exec(ctx, sLeasePurge)
	if err == nil {
		err = s.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
			st, err := c.Stmt(ctx, s.pool, int(sTicketsOrphaned))
			if err != nil {
				return err
			}
			rows, err := st.QueryContext(ctx)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var t ticket
				if err := rows.Scan(&t.name, &t.seq, &t.holder); err != nil {
					return err
				}
				tickets = append(tickets, t)
			}
			return rows.Err()
		})
	}
	for _, t := range tickets {
		if err != nil {
			break
		}
		_, err = s.exec(ctx, sTicketPurge, t.name, t.seq, t.holder)
	}
	if err != nil {
		s.logger.Debug("dsync: purge failed", "err", err)
	}
}

// freeOrphans tries once to free every orphaned row or ticket.
func (s *Session) freeOrphans() {
	s.mu.Lock()
	todo := s.orphans
	s.orphans = nil
	s.freeing = len(todo)
	s.mu.Unlock()
	var keep []orphan
	for i, o := range todo {
		ctx, cancel := context.WithTimeout(s.stopped, s.opts.ttl/3)
		freed, err := s.free(ctx, o)
		cancel()
		switch {
		case err != nil:
			keep = append(keep, todo[i:]...)
		case freed:
			s.logger.Info("dsync: orphan freed", "lock", o.name, "kind", o.kind(), "token", o.token,
				"age", time.Since(o.since))
		case time.Since(o.since) < orphanWindow:
			keep = append(keep, o)
		default:
			s.logger.Debug("dsync: orphan not found; given up", "lock", o.name, "kind", o.kind(), "token", o.token,
				"age", time.Since(o.since))
		}
		if err != nil {
			break
		}
	}
	s.mu.Lock()
	s.orphans = append(s.orphans, keep...)
	s.freeing = 0
	s.mu.Unlock()
}

// Close ends the session: Done closes, calls in progress and later return
// [ErrSessionClosed], and the lease row is deleted, which frees every lock
// the session holds at once. Close returns within about one TTL even when
// the database is unreachable; the lease then simply ends on the server.
// After the session was lost, Close only releases its connections. Calling
// Close again returns ErrSessionClosed.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.closed = true
	s.mu.Unlock()
	lost := !s.end(ErrSessionClosed, nil)
	s.stop()
	<-s.renewer
	<-s.reaper
	s.stopTxHolds()
	s.stopBell()
	<-s.sweeper
	defer s.release.Do(func() { releasePool(s.db, s.q) })
	defer s.lease.close()
	if lost {
		return nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ttl)
	defer cancel()
	ctx = closingCtx(ctx)
	// Deleting the lease frees every lock row and ticket of the session at
	// once: a holder whose lease row is gone holds nothing. It runs where
	// renewals did, on a connection that is open.
	if _, err := s.execConn(ctx, true, sLeaseDelete, maxRetries, s.id); err != nil {
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
		if e.state.held && e.state.tx == nil { // a LockTx hold ends with its transaction
			holds = append(holds, orphan{name: name, token: e.state.token})
		}
		e.state.mu.Unlock()
	}
	for name, e := range s.queues.entries {
		e.state.mu.Lock()
		if e.state.held {
			holds = append(holds, orphan{name: name, token: e.state.token, ticket: true, seq: e.state.ticket})
		}
		for _, r := range e.state.reads {
			holds = append(holds, orphan{name: name, token: r.token, ticket: true, seq: r.ticket})
		}
		e.state.mu.Unlock()
	}
	return holds
}

// nextToken returns a token for a new acquisition, unique in this session.
func (s *Session) nextToken() int64 { return s.lastToken.Add(1) }

// maxRetries bounds the immediate retries of a statement that a deadlock
// (1213) or lock wait timeout (1205) rolled back.
const maxRetries = 10

// exec runs a prepared statement on a session connection. Every statement
// dsync prepares is a single autocommit statement, so one that a deadlock
// (1213) or a lock wait timeout (1205) rolled back may simply run again:
// exec retries those, so they never reach a caller while a retry is safe.
func (s *Session) exec(ctx context.Context, stmt stmtIndex, args ...any) (sql.Result, error) {
	return s.execRetrying(ctx, stmt, maxRetries, args...)
}

// execRetrying is exec with at most lockWaits retries after a lock wait
// timeout (see retryRolledBackN).
func (s *Session) execRetrying(ctx context.Context, stmt stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	return s.execConn(ctx, false, stmt, lockWaits, args...)
}

// execConn is execRetrying on a connection for lease statements (priority)
// or for lock statements.
func (s *Session) execConn(ctx context.Context, priority bool, stmt stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	var res sql.Result
	err := s.withConn(ctx, priority, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.pool, int(stmt))
		if err != nil {
			return err
		}
		res, err = retryRolledBackN(ctx, func() (sql.Result, error) { return st.ExecContext(ctx, args...) }, lockWaits)
		return err
	})
	return res, err
}

// retryRolledBack runs a single autocommit statement (or dsync's own one
// transaction) again while a server error says it had no effect (see
// rolledBack: a deadlock or certification conflict, a lock wait timeout, a
// Galera node not ready), up to maxRetries times and while ctx lasts. From
// the second retry on it first waits a random time that doubles each time
// (1ms, 2ms, ... up to 64ms), so that statements that conflicted on a
// cluster do not meet again at once.
func retryRolledBack(ctx context.Context, run func() (sql.Result, error)) (sql.Result, error) {
	return retryRolledBackN(ctx, run, maxRetries)
}

// retryRolledBackN is retryRolledBack with at most lockWaits retries after a
// lock wait timeout (1205).
func retryRolledBackN(ctx context.Context, run func() (sql.Result, error), lockWaits int) (sql.Result, error) {
	for attempt := 0; ; attempt++ {
		res, err := run()
		if !isErrNo(err, rolledBack...) || attempt == maxRetries || ctx.Err() != nil {
			return res, err
		}
		if isErrNo(err, 1205) {
			if lockWaits == 0 {
				return res, err
			}
			lockWaits--
		}
		if attempt > 0 {
			d := rand.N(time.Millisecond << min(attempt, 6))
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return res, err
			}
		}
	}
}

// execNoWait runs the variant of a lock row statement that does not wait
// for row locks (see noWaitSQL), or the plain statement on a server that
// refuses the variant, with exec's retries but for lock wait timeouts
// (1205), which it retries noWaitLockWaits times. A 1205 that it returns
// means: a transaction holds the row (Mutex.LockTx), which only its end,
// and the doorbell of the session that handed it over, will change.
// Every statement that a waiter or TryLock writes a lock row with runs
// this way, so that none of them holds a session connection while a
// transaction runs.
func (s *Session) execNoWait(ctx context.Context, plain, variant stmtIndex, args ...any) (sql.Result, error) {
	return s.execNoWaitN(ctx, plain, variant, noWaitLockWaits, args...)
}

// execNoWaitN is execNoWait with at most lockWaits retries after a lock
// wait timeout.
func (s *Session) execNoWaitN(ctx context.Context, plain, variant stmtIndex, lockWaits int, args ...any) (sql.Result, error) {
	for {
		stmt := s.noWait(plain, variant)
		res, err := s.execRetrying(ctx, stmt, lockWaits, args...)
		if stmt == variant && s.noWaitRefused(err) {
			continue // the plain statement, from now on
		}
		return res, err
	}
}

// execNoWaitChanged runs a statement as execNoWait does and reports whether
// it changed a row.
func (s *Session) execNoWaitChanged(ctx context.Context, plain, variant stmtIndex, args ...any) (bool, error) {
	res, err := s.execNoWait(ctx, plain, variant, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// noWait returns the variant of stmt that does not wait for row locks
// (SET STATEMENT innodb_lock_wait_timeout = 0, MariaDB's), or stmt itself
// on a server that refused that syntax (MySQL; see noWaitRefused).
func (s *Session) noWait(stmt, variant stmtIndex) stmtIndex {
	if s.noWaitOff.Load() {
		return stmt
	}
	return variant
}

// noWaitRefused reports whether err is the server refusing the syntax of
// the no-wait variants (1064), and then stops using them.
func (s *Session) noWaitRefused(err error) bool {
	if !isErrNo(err, 1064) {
		return false
	}
	if !s.noWaitOff.Swap(true) {
		s.logger.Info("dsync: the server refuses SET STATEMENT; TryLock reads the lock row first", "err", err)
	}
	return true
}

// undo frees a lock row or ticket that an acquisition or enqueue whose
// outcome is unknown may have created, or that was taken as the session
// ended. While ctx lasts it tries at once; else, or when that fails, it
// leaves the work to the reaper goroutine, so the caller returns promptly
// after its ctx ends. The statement may still be on its way to the server,
// or waiting there, when the client gave up on it (the driver does not
// cancel it there): unless the undo found and freed it, the reaper keeps
// trying for orphanWindow.
func (s *Session) undo(ctx context.Context, o orphan) {
	if s.Err() != nil && !s.closing() {
		return // lost: the lease ends on the server, and with it the hold
	}
	if ctx.Err() == nil {
		if freed, err := s.free(ctx, o); err == nil && freed {
			return
		}
	}
	s.addOrphan(o)
}

// closing reports whether Close was called.
func (s *Session) closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// free releases the lock row or removes the ticket o names, if this
// session's acquisition o.token still has it, and reports whether it did.
// Whatever frees a row or ticket that others may wait for rings the
// session's doorbell when they do (see bell.go): a lock row whose
// wanted_until is current, a ticket with a waiter's marker behind it.
func (s *Session) free(ctx context.Context, o orphan) (bool, error) {
	if o.ticket {
		return s.freeTicket(ctx, o) // see queue.go
	}
	ran, res, err := s.freeRinging(ctx, o) // see bell.go
	switch {
	case !ran:
		res, err = s.exec(ctx, sLockRelease, o.name, s.id, o.token)
	case err != nil && ctx.Err() == nil:
		// The statement failed on the doorbell's connection, which went
		// with it (ForceRelease of another of this session's locks kills
		// it to wake that lock's waiters; a server restart): free o on a
		// pool connection. The release is by token: when the statement
		// did commit before it failed, this one frees nothing, and the
		// error stands (the reaper then finds nothing to free).
		if again, aerr := s.exec(ctx, sLockRelease, o.name, s.id, o.token); aerr == nil {
			if n, _ := again.RowsAffected(); n > 0 {
				ran, res, err = false, again, nil // rings below when waiters want it
			}
		}
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return false, err
	}
	if wanted, _ := res.LastInsertId(); wanted == 1 && !ran {
		s.ringBell()
	}
	return true, nil
}

// execChanged runs a prepared statement and reports whether it changed a
// row.
func (s *Session) execChanged(ctx context.Context, stmt stmtIndex, args ...any) (bool, error) {
	res, err := s.exec(ctx, stmt, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// validName reports whether name can be a lock name.
func validName(name string) error {
	if name == "" || len(name) > 255 || !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q (want 1 to 255 bytes of UTF-8)", ErrInvalidName, name)
	}
	return nil
}

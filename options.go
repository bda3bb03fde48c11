package dsync

import (
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
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
	ttl         time.Duration
	prefix      string
	newBackOff  func() backoff.BackOff
	logger      *slog.Logger
	label       string
	freeRowAge  time.Duration // 0: no clean-up
	sweepEvery  time.Duration // the sweep interval when set (tests); else see sweepInterval
	replaceLost bool          // see WithReplaceLostLease
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
// policy's time limit (bound a wait with ctx instead). Whatever the policy
// says, a polling waiter keeps within a budget: a burst of 6 statements,
// then 12 a second (so at most about 20 in any second with its session's
// keep-alive).
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
// after it fell free, plus up to three pass durations (see
// docs/OPERATIONS.md, "Table size and clean-up", for measured ones). The
// session that runs a pass applies its own age: give every session of the
// tables the same one.
func WithFreeRowAge(age time.Duration) Option { return func(o *options) { o.freeRowAge = age } }

// WithReplaceLostLease makes a session that lost its lease open a new one
// (a new lease row, with a new [Session.ID]) instead of ending for good,
// once nothing taken under the lost lease is held any more. The session
// does not open it by itself: the next lock call does (see below). A hold
// that was lost is still reported as lost: until every Lock and RLock hold
// of the lost lease has been released, [Session.Done] stays closed,
// [Session.Err] returns ErrSessionExpired, and every call returns
// ErrSessionExpired at once. The release that ends a hold returns
// [ErrSessionExpired], as without this option; one that leaves the hold
// in place returns nil, as without it too: an Unlock that undoes one of
// several Locks of an owner ([WithOwner]), and an RUnlock that leaves
// other read locks of the name in the process. (A [Mutex.LockTx] hold
// lives with its transaction, not the lease, and does not hold the
// replacement up; nor does a LockTx waiting for another transaction's
// hold.)
//
// From then on, a lock call that holds nothing carries on: a Lock or
// RLock that was waiting when the lease was lost, and any lock call made
// after, TryLock, TryRLock and TryLockTx included, opens the new lease
// and waits or acquires under it, bounded by its ctx. While the database
// cannot be reached the session tries again with back-off (from 100ms,
// doubling, up to every 2s, each try bounded by the TTL), whichever calls
// ask, so a TryLock may wait for the whole outage, up to its ctx; a call
// whose ctx ends first returns an error wrapping both ErrSessionExpired
// and ctx.Err(). A LockTx that fails with ErrSessionExpired after it
// handed the lock row to the caller's transaction returns it, as without
// this option (roll the transaction back). Done, Err, ID and Deadline
// then describe the new lease; the lock values made on the session stay
// valid. Nothing opens a new lease after [Session.Close] has begun.
func WithReplaceLostLease() Option { return func(o *options) { o.replaceLost = true } }

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

// newOptions returns the defaults with opts applied, validated.
func newOptions(opts []Option) (options, error) {
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
			return options{}, fmt.Errorf("%w: nil Option", ErrInvalidOption)
		}
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return options{}, err
	}
	return o, nil
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

package dsync

import (
	"context"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Acquiring returns how many goroutines of s are acquiring a lock on the
// database right now (as opposed to waiting in the local layer).
func Acquiring(s *Session) int64 { return s.current().acquiring.Load() }

// NewBackOff returns a new polling policy from s's back-off factory: the
// default one (defaultBackOff) unless the session was made WithBackOff.
func NewBackOff(s *Session) backoff.BackOff { return s.opts.newBackOff() }

// ExpireLocally moves s's local renewal deadline to its origin, that is into
// the past, without touching the keep-alive goroutine: what a process sees
// after a pause (SIGSTOP, a VM pause) longer than its lease.
func ExpireLocally(s *Session) { s.current().lease.deadline.Store(0) }

// WithSweep sets the free-row age and the sweep interval directly, below the
// limits WithFreeRowAge enforces, so that tests see passes in milliseconds.
func WithSweep(age, every time.Duration) Option {
	return func(o *options) { o.freeRowAge, o.sweepEvery = age, every }
}

// SweepPasses returns how many sweep passes s has been elected to run.
func SweepPasses(s *Session) int64 { return s.current().sweeper.passes.Load() }

// SweepPass runs one sweep pass on s at once, deleting the rows marked at
// least age ago, and returns how many rows it deleted and marked. Give s
// WithFreeRowAge(0), so that its own sweeper does not run beside it.
func SweepPass(s *Session, age time.Duration) (deleted, marked int64) {
	return s.current().sweeper.sweep(time.Hour, age)
}

// BellWaitConnsInUse returns how many of s's connections for blocking on
// other sessions' doorbells are in use: none once no Lock of s waits.
func BellWaitConnsInUse(s *Session) int { return s.current().waiters.conns.InUse() }

// LeaseConnLent returns how many lock statements of s ran on its lease
// connection (the server refused connections), and of those, how many
// callers' ctxs ended while they ran.
func LeaseConnLent(s *Session) (lent, cut int64) {
	l := s.current().store.leaseConn
	return l.lent.Load(), l.cut.Load()
}

// PoolOpen returns how many connections s's shared pool has open or is
// opening (not its dedicated ones: a lease's, a doorbell's).
func PoolOpen(s *Session) int { return s.current().store.pool.Open() }

// SchemaVersion is the version of the tables this code reads and writes.
const SchemaVersion = schemaVersion

// AfterKindRead makes f run each time a queued lock has read the kind of a
// name's lock row and is about to bind the name to the queued locks (see
// createQueueRow), until the returned function is called.
func AfterKindRead(f func(name string)) (restore func()) {
	kindReadHook.Store(&f)
	return func() { kindReadHook.Store(nil) }
}

// TxCheckAnyServer makes the sessions whose first LockTx comes after it
// use the statements of a server without MariaDB's @@in_transaction
// (MySQL), as if the server had none, until the returned function is
// called.
func TxCheckAnyServer() (restore func()) {
	txAnyServerHook.Store(true)
	return func() { txAnyServerHook.Store(false) }
}

// EnqueueAsOnCluster makes every session enqueue its queued locks' waiters
// with the statements of a Galera cluster (qTicketNumber, qTicketAdd), on
// any server, until the returned function is called.
func EnqueueAsOnCluster() (restore func()) {
	clusterEnqueueHook.Store(true)
	return func() { clusterEnqueueHook.Store(false) }
}

// AfterTxHandOver makes f run each time LockTx has handed a name's lock
// row to the caller's transaction, before it checks the session's lease,
// until the returned function is called.
func AfterTxHandOver(f func(name string)) (restore func()) {
	txHandOverHook.Store(&f)
	return func() { txHandOverHook.Store(nil) }
}

// CheckWoken runs the turn check of a waiter of s with ticket number
// ticket of name (exclusive or shared) that a doorbell has just woken
// behind ticket behind (0: the head slot's holder), and returns the count
// of conflicting holds and tickets ahead of it, and the fence it took (an
// exclusive ticket with none ahead takes the lock).
func CheckWoken(ctx context.Context, s *Session, name string, ticket int64, exclusive bool, behind int64) (ahead, fence int64, err error) {
	w := &waiter{ticket: ticket, want: want{mode: modeShared}, woken: true, behind: behind}
	if exclusive {
		w.mode = modeExclusive
	}
	return s.current().tickets.checkTicket(ctx, nil, name, w, false)
}

// SemTake runs session s's turn check of a Semaphore's waiting ticket
// with ticket number ticket in the line of queue key key (qSemTake), for a
// name of limit permits: 1 and no fence when it does not hold, else 0 and
// the fence it took.
func SemTake(ctx context.Context, s *Session, key string, ticket, limit int64) (ahead, fence int64, err error) {
	w := &waiter{ticket: ticket, want: want{mode: modeWeighted, limit: limit}}
	return s.current().tickets.checkTicket(ctx, nil, key, w, false)
}

// SemAhead runs session s's read of whom a Semaphore's waiting ticket
// with ticket number ticket in the line of queue key key waits for
// (qSemAhead), for a name of limit permits: the ticket it blocks on, and
// whether it is the first waiter behind several holders.
func SemAhead(ctx context.Context, s *Session, key string, ticket, limit int64) (seq int64, several bool, err error) {
	w := &waiter{ticket: ticket, want: want{mode: modeWeighted, limit: limit}}
	seq, _, _, _, several, _, err = s.current().tickets.ticketAhead(ctx, key, w)
	return seq, several, err
}

// TicketAhead runs session s's read of whom a waiting ticket of name waits
// for (qTicketAhead): the nearest conflicting live ticket ahead (0: the
// head slot's holder), and whether a marker is behind it; sql.ErrNoRows
// when nothing is ahead.
func TicketAhead(ctx context.Context, s *Session, name string, ticket int64, exclusive bool) (seq int64, marked bool, err error) {
	w := &waiter{ticket: ticket, want: want{mode: modeShared}}
	if exclusive {
		w.mode = modeExclusive
	}
	seq, _, _, marked, _, _, err = s.current().tickets.ticketAhead(ctx, name, w)
	return seq, marked, err
}

// ProclaimedValue returns the value e believes it leads with (what a
// Campaign of the same value compares with), and whether a failed Proclaim
// left it unsure.
func ProclaimedValue(e *Election) (value string, stale bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.value, e.stale
}

// RecordLeader runs the record of an Election's leader (qLeaderRecord) on
// s, for a hold of token and term, as Campaign does after its take, and
// returns how many rows it changed.
func RecordLeader(s *Session, name string, token, term int64, value string) (int64, error) {
	return NewElection(s, name).record(context.Background(), s.current(), token, term, value)
}

// AfterElectionTake makes f run each time a Campaign has taken its
// election's lock and is about to record the leader (qLeaderRecord), with
// the election's name and the hold's token and term, until the returned
// function is called.
func AfterElectionTake(f func(name string, token, term int64)) (restore func()) {
	electionTakeHook.Store(&f)
	return func() { electionTakeHook.Store(nil) }
}

// Purge runs s's purge of long-ended leases and of tickets without a
// lease or markers without a ticket (reaper.purge) now.
func Purge(s *Session) { s.current().reaper.purge() }

// PurgeLater puts the first purge of long-ended leases (reaper.purge) of
// every session that starts from now on an hour after its start, instead
// of a random moment of its first minute, until the returned function is
// called: a test that counts the server's statements over a few seconds
// does not count a purge (a connection's settings, a delete, a read, a
// delete per orphaned ticket) as polling. TestMain calls it for the
// whole package.
func PurgeLater() (restore func()) {
	purgeFirstHook.Store(int64(time.Hour))
	return func() { purgeFirstHook.Store(0) }
}

// LockDoorbell holds the mutex of session s's doorbell, as while its
// connection is in use, until the returned func first runs.
func LockDoorbell(s *Session) (unlock func()) {
	b := s.current().bell
	b.mu.Lock()
	return sync.OnceFunc(b.mu.Unlock)
}

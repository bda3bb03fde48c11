package dsync

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. dsync wraps them with context (the lock name, the
// underlying cause), so compare with [errors.Is], never with ==. Every
// error dsync returns starts with "dsync: ", once.
var (
	// ErrNotHeld is returned by Unlock when this process does not hold the
	// lock (never locked, or already unlocked), and by Unlock when the lock
	// row turned out to belong to someone else: released by force (see
	// [ErrReleasedByForce]), or taken over after the session's lease
	// lapsed on the server.
	ErrNotHeld = errors.New("dsync: lock not held")

	// ErrReleasedByForce is returned by [Mutex.Unlock] when an operator
	// freed the lock while this session held it ([ForceRelease], or
	// dsync release --force): the hold was lost, and another session may
	// have taken the lock meanwhile. It wraps [ErrNotHeld], so
	// errors.Is(err, ErrNotHeld) is true for it as well. The session stays
	// live: Unlock is the only call that learns of it.
	ErrReleasedByForce = fmt.Errorf("%w: released by force", ErrNotHeld)

	// ErrNotOwner is returned by Unlock when the lock was taken with an owner
	// (see [WithOwner]) and ctx carries a different owner or none.
	ErrNotOwner = errors.New("dsync: lock held by another owner")

	// ErrSessionExpired is returned by every call on a session whose lease
	// could not be renewed in time: its locks may already belong to others.
	ErrSessionExpired = errors.New("dsync: session lease expired")

	// ErrSessionClosed is returned by every call on a session after
	// [Session.Close].
	ErrSessionClosed = errors.New("dsync: session closed")

	// ErrInvalidName is returned for a lock name that is empty, longer than
	// 255 bytes (254 for an [Election] or a [Semaphore]) or not valid UTF-8.
	ErrInvalidName = errors.New("dsync: invalid lock name")

	// ErrInvalidOption is returned by [NewSession] for a bad option value or
	// a nil *sql.DB, by [Mutex.LockTx] for a nil *sql.Tx, and by
	// [Mutex.Do] (and the other locks' Do and RDo) for a nil function.
	ErrInvalidOption = errors.New("dsync: invalid option")

	// ErrLockUpgrade is returned by a write Lock (RWMutex.Lock, or
	// FairMutex.Lock of the same name) whose owner holds a read lock of the
	// name: waiting would deadlock, as the read lock could never be released.
	ErrLockUpgrade = errors.New("dsync: cannot upgrade a read lock to a write lock")

	// ErrLockDowngrade is returned by RWMutex.RLock (and TryRLock) whose
	// owner holds the write lock of the name: waiting would deadlock, as the
	// write lock could never be released. Unlock first, or use the write
	// hold for reading.
	ErrLockDowngrade = errors.New("dsync: cannot take a read lock while holding the write lock")

	// ErrSchemaVersion is returned by [NewSession] when the tables of its
	// prefix were created by a version of dsync that lays them out
	// differently (schema version 7 added the Semaphore's columns, version
	// 6 the held_since columns that
	// ListLocks reads; version 5 the lock table's kind, which
	// makes one name one lock across kinds; version 4 the queued locks'
	// head slot and the txlock table, version 3 the clean-up of free rows); dsync never
	// alters tables. Tables of version 6 or 5 can be upgraded in place:
	// the error names the statements (for each version, three ALTER TABLE
	// ... ADD COLUMN and an UPDATE of the version), which an operator runs
	// once; processes of the old version keep working on them (those of
	// version 5 show a wrong age in ListLocks; on the name of a Semaphore
	// or an Election their Mutex returns the server's error 1690 and their
	// FairMutex and RWMutex ErrOtherKind). Else, to move to this version, stop every process of the old
	// one, drop the tables of the prefix (schema, lease, lock, queue, ticket
	// and, if present, txlock and leader), and start the new processes, which create them
	// again; fences of the new rows start at the database's clock in
	// microseconds, above the old ones. Or give this version a prefix of its
	// own (WithTablePrefix); the locks of the two versions are then apart,
	// so processes of both must not share what the locks protect.
	ErrSchemaVersion = errors.New("dsync: tables of another schema version")

	// ErrDeadlock is returned by [Mutex.LockTx] and [Mutex.TryLockTx] when
	// waiting could never end: the database found the caller's transaction
	// in a deadlock with another one (error 1213: it rolled the
	// transaction back), or the owner in ctx holds the lock through Lock.
	ErrDeadlock = errors.New("dsync: deadlock")

	// ErrOtherKind is returned by Lock, TryLock, LockTx and TryLockTx of a
	// [Mutex], by Lock, TryLock, RLock and TryRLock of a [FairMutex] or
	// [RWMutex], by Acquire and TryAcquire of a [Semaphore], and by
	// [Election.Campaign], when the name is used by another kind of lock:
	// a name is one lock, bound to the kind that first used it (Mutex; the
	// queued locks, FairMutex and RWMutex, which share one lock space;
	// Semaphore; or Election) until the
	// clean-up deletes its idle rows (see [WithFreeRowAge]). The call holds
	// nothing and does not wait for the name, not even for a transaction
	// that holds it ([Mutex.LockTx]); only while another transaction is
	// writing the name's row, whose kind cannot be read before it commits,
	// a queued lock pauses as its back-off says (see [WithBackOff]). The
	// wrapped message names the kind that uses the name.
	ErrOtherKind = errors.New("dsync: name is used by another kind of lock")

	// ErrInvalidLimit is returned by every method of a [Semaphore] made
	// with a limit of 0 or less.
	ErrInvalidLimit = errors.New("dsync: invalid semaphore limit")

	// ErrInvalidPermits is returned by [Semaphore.Acquire],
	// [Semaphore.TryAcquire] and [Semaphore.Release] for a number of
	// permits of 0 or less, or, to acquire, above the semaphore's limit
	// (such a request could never be granted).
	ErrInvalidPermits = errors.New("dsync: invalid number of permits")

	// ErrReleaseExceedsHeld is returned by [Semaphore.Release] when this
	// session holds fewer permits of the name than it asks to release;
	// nothing is released then. It wraps [ErrNotHeld], so
	// errors.Is(err, ErrNotHeld) is true for it as well.
	ErrReleaseExceedsHeld = fmt.Errorf("%w: release of more permits than held", ErrNotHeld)

	// ErrLimitMismatch is returned by the methods of a [Semaphore] whose
	// limit differs from the one the name is bound to: the limit of the
	// Semaphore whose call first used the name stands for as long as the
	// name is bound (while any session holds or waits for it, and until
	// the clean-up deletes its idle rows, see [WithFreeRowAge]). The call
	// holds nothing.
	ErrLimitMismatch = errors.New("dsync: semaphore limit differs from the name's")
	// ErrNotLeader is returned by [Election.Proclaim] when this session
	// does not lead the election: it never campaigned, resigned, or its
	// leadership ended with its session. When the session has ended, the
	// error wraps its [ErrSessionExpired] or [ErrSessionClosed] too.
	ErrNotLeader = errors.New("dsync: not the leader")

	// ErrNoLeader is returned by [Election.Leader] when nobody leads the
	// election: nobody campaigns, or the leader's lease has ended (on the
	// database's clock) and the next campaigner has not taken over yet.
	ErrNoLeader = errors.New("dsync: no leader")

	// ErrValueTooLong is returned by [Election.Campaign] and
	// [Election.Proclaim] for a value longer than 65535 bytes.
	ErrValueTooLong = errors.New("dsync: value too long")

	// ErrNotObtained is returned by a blocking Lock when the back-off policy
	// given with [WithBackOff] stops (returns backoff.Stop) before the lock
	// became free.
	ErrNotObtained = errors.New("dsync: lock not obtained")
)

// otherKindError returns ErrOtherKind for a name that the other kind of
// lock uses; kind is the kind column of the name's lock row. The caller
// wraps it with the name.
func otherKindError(kind int) error {
	user := "another kind of lock"
	switch kind {
	case kindRowMutex:
		user = "a Mutex"
	case kindRowQueued:
		user = "a FairMutex or RWMutex"
	case kindRowSemaphore:
		user = "a Semaphore"
	case kindRowElection:
		user = "an Election"
	}
	return fmt.Errorf("%w: %s uses it (until the clean-up deletes its idle rows, see WithFreeRowAge)", ErrOtherKind, user)
}

// An opError is an error of a dsync call: what failed (op, such as
// `unlock "x"`) and why (err). Its message carries the "dsync: " prefix
// once: err's own prefix, when it is a dsync error (a sentinel, or an
// error that starts with one), is dropped from the text, while errors.Is
// and errors.As still see err.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "dsync: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "dsync: ")
}

func (e *opError) Unwrap() error { return e.err }

// opErrorf returns err as the cause of the failed operation that format
// and args describe (see opError).
func opErrorf(err error, format string, args ...any) error {
	return &opError{op: fmt.Sprintf(format, args...), err: err}
}

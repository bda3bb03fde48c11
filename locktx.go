package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/dsynclock/dsync/internal/connpool"
)

// Locks scoped to a caller's transaction (Mutex.LockTx).
//
// A LockTx hold is made of two row locks of the caller's transaction,
// both taken by primary key, so they are record locks without gaps at
// READ COMMITTED and REPEATABLE READ alike, and neither read the lease
// table (whose shared locks would hold up renewals):
//
//  1. The name's row in the transaction-lock table (qTxLock). Only
//     transactions lock it, so a transaction waiting for another one's
//     hold waits for it there, inside the database, which reports a
//     deadlock between such waits (1213) instead of letting them hang.
//  2. The lock row itself. The session first takes it as Lock does
//     (waiting for Lock holders with the back-off and doorbells, and
//     honouring claims, so neither side starves the other), then hands it
//     to the transaction (qTxHold): the transaction frees the row, so the
//     row is free the moment the transaction commits, and holds it locked
//     until the transaction ends. Every acquirer writes the row, so none
//     can take it before that end, even if the session's lease ends
//     meanwhile: the hold does not depend on the lease.
//
// A rollback restores the row as the session held it; so does ROLLBACK TO
// a SAVEPOINT taken before the hold, while the transaction goes on without
// it (the database lets go of the row locks taken after a savepoint). A
// goroutine of the session waits for the transaction's row lock to go (see
// awaitTxEnd), frees the row when the transaction rolled back, rings the
// doorbell, and ends the hold in the process (whose goroutines wait for it
// locally, as for a Lock hold). While the transaction runs, the statements
// with which others write the lock row do not wait for it (see
// execNoWait).
//
// So the process's record of a hold proves nothing about the transaction:
// a LockTx again in the same transaction asks the database (txHeld). The
// row the transaction frees carries the hold's mark (qTxHold), which shows
// to the transaction while its write stands, and also once a COMMIT run
// through it made the write everyone's; the committed row, read on a
// session connection, tells the two apart (qTxHoldPending). A hold that
// has ended never comes back: LockTx again returns ErrNotHeld, and the
// caller rolls the transaction back. Taking the lock anew in it instead
// would hand it a lock another holder may have had, and written under,
// since its REPEATABLE READ snapshot was taken. The process remembers the
// holds it took in a transaction for as long as the *sql.Tx lives
// (txHolds.remember), not only while the hold lasts.

// LockTx acquires the lock for the caller's transaction tx: the lock is
// held until tx commits or rolls back, so what tx writes and the lock's
// release commit together. There is no Unlock (it returns [ErrNotOwner]);
// the hold does not end with the session's lease either. It excludes
// every other holder of the name: Lock holders of any session, and
// LockTx transactions; and a name that a FairMutex, RWMutex or Election
// uses gives [ErrOtherKind].
//
// tx must be on the session's database server; LockTx names the session's
// tables with its database, so tx may have another one selected. It works
// at READ COMMITTED and REPEATABLE READ, and runs in tx only statements
// that lock by primary key (one row of the transaction-lock table, and the
// lock row), never blocking a lease renewal or another holder's Unlock.
//
// Waiting: for a Lock holder, LockTx waits as Lock does (the session's
// back-off, doorbells, claims). For another transaction's hold, it waits
// in the database, where a deadlock between transactions that lock names
// in opposite orders is found: LockTx then returns [ErrDeadlock], and the
// database has rolled tx back. Each wait there lasts up to tx's
// connection's innodb_lock_wait_timeout, and LockTx waits again after
// one ran out (unless the server rolls the transaction back on lock wait
// timeouts, innodb_rollback_on_timeout: then it returns the error).
//
// When ctx ends, LockTx returns an error wrapping ctx.Err(). If ctx ended
// while a statement ran in tx, the driver has closed tx's connection: tx
// is then rolled back and unusable. After any error, roll tx back: it may
// hold the name's transaction-lock row, which keeps other transactions
// waiting until it ends. A Lock of the name in this process waits until
// tx ends, and LockTx with an owner that holds the name through Lock
// returns [ErrDeadlock].
//
// LockTx again in the same tx returns nil only when tx holds the name in
// the database at that moment (the hold is one, and ends with tx); it asks
// the database with two plain reads that lock nothing: one in tx, and one
// on a session connection. ROLLBACK TO a SAVEPOINT taken after LockTx keeps
// the hold. ROLLBACK TO a SAVEPOINT taken before it ends the hold while tx
// goes on: the database lets go of tx's row locks, the session frees the
// row in the background (at once, or within 500ms where its *sql.DB has a
// connection limit), and another holder may take the lock while tx runs.
// LockTx (or TryLockTx) again in tx then returns an error wrapping
// [ErrNotHeld], however long after, as it does after a COMMIT run through
// tx: a hold that has ended never comes back. Roll tx back and start a new
// transaction.
//
// A LockTx hold counts in the session's [Stats] as a Lock does ([Session.Stats]),
// has a fence ([Mutex.Fence], until the process learns that tx ended), and
// takes a connection of its own from the session's *sql.DB while tx runs,
// blocked until tx ends, when that *sql.DB has no connection limit (else
// the session checks for the end now and then, on its own connections).
//
// At REPEATABLE READ, read what the lock protects after LockTx: a snapshot
// taken by a read before it may predate the previous holder's commit. tx
// must still be in its transaction: after a COMMIT (or an implicitly
// committing statement) run through it, LockTx returns [ErrNotHeld]. On
// MariaDB it checks that with @@in_transaction, in the statement that
// hands the lock row to tx; on a server without it (MySQL) it reads the
// committed row on a session connection after that statement, one more
// round trip, and undoes a hand-over that committed at once. After a
// COMMIT and a BEGIN run through tx, LockTx of a name tx held before the
// COMMIT returns [ErrNotHeld] too.
//
// On a Galera cluster LockTx returns an error wrapping
// [errors.ErrUnsupported]: row locks are per node there, so a transaction
// would wait for another node's transaction nowhere (no deadlock would be
// found), and its writes of the shared rows would meet others' only at
// certification, as aborted transactions.
func (m *Mutex) LockTx(ctx context.Context, tx *sql.Tx) error {
	_, err := m.lockTx(ctx, tx, true)
	return err
}

// TryLockTx makes one attempt to acquire the lock for tx, as [Mutex.LockTx]
// does, without waiting. It returns true, nil when acquired; false, nil
// when another holder has it; and false with an error as LockTx does
// otherwise. Again in the same tx it returns true only when tx holds the
// name in the database at that moment, and false with an error wrapping
// [ErrNotHeld] when the hold has ended while tx went on (see LockTx). After
// false, roll tx back (on a server that rolls back transactions on lock wait
// timeouts, innodb_rollback_on_timeout, the database has done so already).
func (m *Mutex) TryLockTx(ctx context.Context, tx *sql.Tx) (bool, error) {
	return m.lockTx(ctx, tx, false)
}

func (m *Mutex) lockTx(ctx context.Context, tx *sql.Tx, wait bool) (bool, error) {
	c := m.s.track(kindMutex, "locktx", m.name, wait)
	return m.s.withLease(ctx, c, func(g *Session) (bool, error) { return m.on(g).lockTxOn(ctx, c, tx, wait) })
}

func (m *Mutex) lockTxOn(ctx context.Context, c *call, tx *sql.Tx, wait bool) (ok bool, err error) {
	if m.err != nil {
		return false, m.err
	}
	if tx == nil {
		return false, opErrorf(fmt.Errorf("%w: nil *sql.Tx", ErrInvalidOption), "lock %q in a transaction", m.name)
	}
	if err := m.s.leaseErr(); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, opErrorf(err, "lock %q in a transaction", m.name)
	}
	if m.s.store.galera {
		return false, opErrorf(fmt.Errorf("%w on a Galera cluster (row locks are per node there)", errors.ErrUnsupported), "lock %q in a transaction", m.name)
	}
	ok, err = m.takeTx(ctx, c, tx, wait)
	if err != nil {
		err = opErrorf(err, "lock %q in a transaction", m.name)
	}
	return ok, err
}

func (m *Mutex) takeTx(ctx context.Context, c *call, tx *sql.Tx, wait bool) (bool, error) {
	q, err := m.s.txHolds.queries(ctx, m.s.store, m.s.opts.prefix)
	if err != nil {
		return false, err
	}
	if rec, again := m.s.txHolds.record(tx, m.name); again {
		err := m.txHeld(ctx, tx, q, rec)
		return err == nil, err
	}
	// 1. The transaction-lock row, before any wait in the process: two
	// transactions of this process that lock names in opposite orders must
	// meet in the database, which sees the deadlock. It is created outside
	// tx. The name is not in use in the session (locks.ref) while tx waits
	// for it there, which may be for as long as another transaction runs:
	// a lost lease is replaced meanwhile (see Session.whenUnused), and this
	// call, run on the lost one, fails with it after the wait and runs again
	// on the new one, in tx, which has the row by then.
	if _, err := m.s.store.exec(ctx, sTxLockCreate, m.name, m.name); err != nil && !isErrNo(err, errDupEntry) {
		return false, err
	}
	if got, err := m.txLock(ctx, c, tx, q, wait); !got || err != nil {
		return false, err
	}
	l := m.s.locks.ref(m.name)
	owner := ownerOf(ctx)
	l.mu.Lock()
	mine := l.held && owner != 0 && l.owner == owner
	l.mu.Unlock()
	if mine {
		m.s.locks.unref(m.name)
		return false, fmt.Errorf("%w: the owner in ctx holds it through Lock", ErrDeadlock)
	}
	// 2. The lock row, as Lock takes it.
	fence, token, err := m.enterAcquire(ctx, c, l, wait)
	if err != nil || fence == 0 {
		return false, err
	}
	// 3. Handed to the transaction.
	res, err := tx.ExecContext(ctx, q.hold, m.name, m.s.id, token)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	committed := false // the hand-over committed at once: tx is in no transaction
	switch {
	case err == nil && n != 1:
		err = fmt.Errorf("%w: the lock row was not the session's to hand to tx (tx is in no transaction, or on another server, or the session's lease ended)", ErrNotHeld)
	case err == nil && q.anyServer:
		committed, err = m.txCommittedAtOnce(ctx, token, fence)
	case isErrNo(err, errDeadlock):
		err = fmt.Errorf("%w (the database rolled tx back): %w", ErrDeadlock, err)
	}
	if err == nil {
		if hook := txHandOverHook.Load(); hook != nil {
			(*hook)(m.name)
		}
		if err = m.s.leaseErr(); err != nil {
			// tx has the row: on a new lease, LockTx in tx would wait for
			// tx itself (withLease), until ctx ends.
			err = finalError{err}
		}
	}
	if err != nil {
		// tx did not take the row (a server error, or nothing matched), or
		// its connection is gone and with it the transaction: the session
		// still holds the row, and frees it in the background (it may wait
		// for tx to end). Unless the hand-over committed at once: the row
		// is free already.
		if !committed {
			m.s.addOrphan(orphan{name: m.name, token: token})
		}
		l.leave()
		m.s.locks.unref(m.name)
		return false, err
	}
	l.mu.Lock()
	l.take(0, fence, token)
	l.tx = tx
	l.mu.Unlock()
	if !m.s.watchTx(l, m.name, token, fence) {
		// Closing: the session cannot learn when tx ends. tx holds the
		// lock until then all the same; the caller is told to roll back.
		l.mu.Lock()
		l.hold = hold{}
		l.mu.Unlock()
		l.leave()
		m.s.locks.unref(m.name)
		return false, ErrSessionClosed
	}
	m.s.txHolds.remember(tx, m.name, txRecord{id: m.s.id, token: token, fence: fence})
	m.s.bell.arm()
	return true, nil // the reference from ref now belongs to the hold
}

// txHeld asks the database whether tx holds the name now through the hold
// rec that this process took in it. The record alone proves nothing: the
// hold ends while tx goes on after ROLLBACK TO a SAVEPOINT taken before it
// (the database lets go of the row locks taken since), or a COMMIT run
// through tx. Two plain reads, which lock nothing whatever the row's
// state: the lock row as tx sees it (qTxHeld), and, when that shows the
// hold's mark, the committed row on a session connection
// (qTxHoldPending). The mark shows to tx both as its own pending write
// and once a COMMIT run through tx has made it everyone's (tx's connection
// then reads committed rows, in no transaction or a later one); the
// committed row is the session's only in the first case. So the two reads
// need no server's word on whether tx's connection is in a transaction.
// It returns nil when tx holds the name, and an error wrapping ErrNotHeld
// when the hold has ended.
func (m *Mutex) txHeld(ctx context.Context, tx *sql.Tx, q *txQueries, rec txRecord) error {
	var marked bool
	err := tx.QueryRowContext(ctx, q.held, -rec.token, rec.fence, m.name).Scan(&marked)
	if err == nil && marked {
		var pending bool
		pending, err = m.txPending(ctx, rec.id, rec.token)
		if err == nil && pending {
			return nil
		}
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return fmt.Errorf("%w: the hold of tx ended while tx went on (ROLLBACK TO SAVEPOINT taken before LockTx, or COMMIT through tx): roll tx back and start a new transaction", ErrNotHeld)
}

// txPending reads, on a session connection, whether the committed lock row
// is still as the session held it under token before it handed the row to
// a transaction (qTxHoldPending), under its lease id and token: then the
// hand-over waits for that transaction's end.
func (m *Mutex) txPending(ctx context.Context, id, token int64) (bool, error) {
	var one int
	err := m.s.store.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		return m.s.store.query(ctx, c, sTxHoldPending, []any{m.name, id, token}, &one)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// txCommittedAtOnce checks, on a server without @@in_transaction, that
// the hand-over of the row (qTxHoldAnyServer, RowsAffected 1) waits for
// tx's commit, which proves that tx is in a transaction; else it
// committed at once, freeing the row (tx's connection is in autocommit
// mode). Then it clears the hold's mark (qTxHoldEnd), rings the doorbell
// (waiters saw the row held by this session), and returns true and an
// error wrapping ErrNotHeld: the lock was this session's until that
// commit and nobody's after it, never tx's. (Another session may have
// taken it since; nothing here assumes otherwise.) After an error of the
// read it does not know, and returns false and the error.
func (m *Mutex) txCommittedAtOnce(ctx context.Context, token, fence int64) (bool, error) {
	pending, err := m.txPending(ctx, m.s.id, token)
	if err != nil || pending {
		return false, err
	}
	if _, err := m.s.store.exec(ctx, sTxHoldEnd, m.name, m.s.id, token, -token, fence); err != nil {
		m.s.logger.Debug("dsync: clearing the mark of a hold that tx committed at once failed", "lock", m.name, "kind", kindMutex, "err", err)
	}
	m.s.bell.ring()
	return true, fmt.Errorf("%w: tx is in no transaction (it ran a COMMIT or an implicitly committing statement, or was rolled back), so the hand-over committed at once", ErrNotHeld)
}

// txRecord is what the process remembers of a LockTx hold it took: the
// lease id it was taken under, and the hold's acquisition token and
// fence, which its mark carries (qTxHold).
type txRecord struct{ id, token, fence int64 }

// txHolds is what a session keeps of its LockTx holds: the goroutines
// that wait for their transactions to end (see awaitTxEnd), the
// connections of those goroutines (one each while it blocks, up to
// txIdleConns kept idle), and the records of the holds it took in each
// transaction. It has a mutex of its own.
type txHolds struct {
	watches background                // goroutines waiting for a LockTx hold's transaction to end
	conns   connpool.Kept             // the connections of those goroutines, in use or idle
	records *sync.Map                 // txKey to txRecord; see remember
	txq     atomic.Pointer[txQueries] // LockTx's statements, made at its first use (see queries)
}

// txHandOverHook, when set (by tests), runs in takeTx right after the
// lock row of the name it is given was handed to a transaction.
var txHandOverHook atomic.Pointer[func(name string)]

// txAnyServerHook, when set (by tests), makes sessions whose LockTx
// statements are made from then on use those of a server without
// @@in_transaction, whatever the server.
var txAnyServerHook atomic.Bool

func newTxHolds() *txHolds { return &txHolds{records: new(sync.Map)} }

// txKey names the holds of one name that the session took in one
// transaction. Its pointer is weak: a record does not keep the
// transaction alive.
type txKey struct {
	tx   weak.Pointer[sql.Tx]
	name string
}

// remember records the hold rec of name taken in tx, for as long as tx
// lives (a cleanup deletes it once the garbage collector frees the
// *sql.Tx), not only while the hold lasts: a LockTx again in the
// transaction must learn that its hold has ended however long ago that
// was, and the process cannot see when a *sql.Tx is done with. The
// cleanup holds the records map alone, not the session.
func (h *txHolds) remember(tx *sql.Tx, name string, rec txRecord) {
	k := txKey{tx: weak.Make(tx), name: name}
	records := h.records
	if _, loaded := records.Swap(k, rec); !loaded {
		runtime.AddCleanup(tx, func(k txKey) { records.Delete(k) }, k)
	}
}

// record returns the record of the hold of name taken in tx, if any.
func (h *txHolds) record(tx *sql.Tx, name string) (txRecord, bool) {
	v, ok := h.records.Load(txKey{tx: weak.Make(tx), name: name})
	if !ok {
		return txRecord{}, false
	}
	return v.(txRecord), true
}

// txLock locks the name's transaction-lock row in tx (qTxLock): at once or
// not at all when wait is false, else waiting in the database. It reports
// whether tx has it.
func (m *Mutex) txLock(ctx context.Context, c *call, tx *sql.Tx, q *txQueries, wait bool) (bool, error) {
	nowait := (!wait || !q.rollbackOnTimeout) && !m.s.store.noWaitOff.Load()
	if !wait && !nowait {
		// No statement that does not wait (MySQL): wait in the database
		// only when the lock row is not held now, so that a TryLockTx
		// waits at most for a transaction that is taking the lock.
		held, err := m.s.rows.lockTaken(ctx, m.name)
		if err != nil || held {
			return false, err
		}
	}
	for {
		stmt := q.lock
		if nowait {
			// A first attempt that does not wait, so that a wait is known
			// (Stats), when a lock wait timeout rolls back only the
			// statement.
			stmt = q.lockNoWait
		}
		_, err := tx.ExecContext(ctx, stmt, m.name)
		switch {
		case err == nil:
			return true, nil
		case isErrNo(err, errDeadlock):
			return false, fmt.Errorf("%w (the database rolled tx back): %w", ErrDeadlock, err)
		case nowait && m.s.store.noWaitRefused(err):
			return m.txLock(ctx, c, tx, q, wait) // without SET STATEMENT from now on
		case !isErrNo(err, errLockWaitTimeout) || ctx.Err() != nil:
			return false, err
		case !wait:
			return false, nil // another transaction holds it
		}
		// A lock wait timeout: wait (again), unless it rolled back tx.
		var wholeTx bool
		if rerr := tx.QueryRowContext(ctx, qTxRollbackOnTimeout).Scan(&wholeTx); rerr != nil {
			return false, rerr
		}
		if wholeTx {
			return false, fmt.Errorf("another transaction held it for longer than innodb_lock_wait_timeout, and the server rolled tx back (innodb_rollback_on_timeout): %w", err)
		}
		c.noteWait()
		nowait = false
	}
}

// queries returns LockTx's statements, made at its first use from what
// the session's connections (st) say about the server (qTxSession,
// qTxInTransaction).
func (h *txHolds) queries(ctx context.Context, st *store, prefix string) (*txQueries, error) {
	if q := h.txq.Load(); q != nil {
		return q, nil
	}
	var database sql.NullString
	var rollback, inTx bool
	anyServer := txAnyServerHook.Load()
	err := st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		if err := c.QueryRowContext(ctx, qTxSession).Scan(&database, &rollback); err != nil {
			return err
		}
		err := c.QueryRowContext(ctx, qTxInTransaction).Scan(&inTx)
		if isErrNo(err, errUnknownSystemVariable) {
			anyServer, err = true, nil
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	q := newTxQueries(database.String, prefix, anyServer)
	q.rollbackOnTimeout = rollback
	h.txq.Store(q)
	return q, nil
}

// watchTx starts the goroutine that ends the LockTx hold of name (token,
// fence, held in l) when its transaction ends. It reports false, starting
// nothing, once Close has begun.
func (s *Session) watchTx(l *localLock, name string, token, fence int64) bool {
	return s.txHolds.watches.run(func() { s.awaitTxEnd(l, name, token, fence) })
}

// stop waits for the goroutines of LockTx holds, which end with the
// session (the holds do not: each lasts until its transaction ends), and
// closes their idle connections.
func (h *txHolds) stop() {
	h.watches.stop()
	h.closeIdle()
}

// txIdleConns is how many connections of ended LockTx holds a session
// keeps for the next ones.
const txIdleConns = 4

// txPollMax is the longest pause between two checks of a transaction's end
// where the session does not block on it (a *sql.DB with a connection
// limit: see awaitTxEnd).
const txPollMax = 500 * time.Millisecond

// awaitTxEnd waits for the transaction of a LockTx hold to end, and ends
// the hold (qTxHoldEnd): a commit has freed the row, and the statement
// clears the hold's mark; after a rollback, whole or to a savepoint taken
// before the hold, it frees the row. Then it rings the doorbell (waiters
// of other sessions wait on it: the row reads as held by this session),
// and ends the hold in the process. Where the *sql.DB has no connection
// limit (as for doorbells), the statement blocks on a connection of its
// own until the transaction's row lock goes, up to the lock wait timeout of qSetSession at a time;
// else it runs on the session's connections without waiting
// (execNoWait), as often as the back-off (up to txPollMax) says, so that
// it never takes a connection of the caller's share. When the session
// ends first, the hold ends in the process only; the transaction keeps the
// row until it ends, and the lease's end frees it after a rollback.
func (s *Session) awaitTxEnd(l *localLock, name string, token, fence int64) {
	ctx := s.stopped
	var c *connpool.Conn
	if s.bell.allowed {
		c = s.txHolds.conns.Idle()
	}
	ended := false
	pause := time.Millisecond
	for !ended && ctx.Err() == nil {
		var err error
		switch {
		case !s.bell.allowed:
			_, err = s.store.execNoWait(ctx, sTxHoldEnd, sTxHoldEndNoWait, name, s.id, token, -token, fence)
		case c == nil:
			c, err = s.txHolds.conns.Open(ctx, s.store.pool)
		}
		if err == nil && c != nil {
			_, err = s.store.execOn(ctx, c, sTxHoldEnd, name, s.id, token, -token, fence)
		}
		switch {
		case err == nil:
			ended = true
			continue
		case isErrNo(err, errLockWaitTimeout) && c != nil:
			continue // the transaction still runs
		case !isErrNo(err, errLockWaitTimeout) && ctx.Err() == nil:
			s.logger.Debug("dsync: waiting for a transaction's hold to end failed; retrying",
				"lock", name, "kind", kindMutex, "err", err)
			if c != nil {
				s.txHolds.conns.Put(c, false)
				c = nil
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, txPollMax)
	}
	if ended {
		s.bell.ring()
	}
	l.mu.Lock()
	if l.held && l.token == token {
		l.hold = hold{}
	}
	l.mu.Unlock()
	l.leave()
	s.locks.unref(name)
	if c == nil {
		return
	}
	h := s.txHolds
	keep := ended && !h.watches.isStopped() && s.stopped.Err() == nil
	h.conns.PutIdle(c, keep, txIdleConns)
}

// closeIdle closes the idle connections of ended LockTx holds, and keeps
// none from now on: those in use are closed when their goroutines end.
func (h *txHolds) closeIdle() { h.conns.Close() }

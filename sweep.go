package dsync

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// The clean-up of free rows (see WithFreeRowAge and the statements under
// "Clean-up of free rows" in queries.go). Every session whose free-row age
// is not 0 runs a sweeper goroutine beside its keep-alive and reaper: a few
// times per sweep interval it asks to be elected (qSweepElect, one
// single-row UPDATE of the schema row), and the session elected runs one
// pass over the lock table, then the queue table. The election lets at
// most one pass start per interval across all sessions of the tables; a
// pass that runs longer than half an interval says so (qSweepHold), so
// that no second pass starts beside it.

// A sweeper runs a session's part in the clean-up of free rows: the
// elections and the passes it wins. It runs its statements through the
// session's store and never calls into the Session.
type sweeper struct {
	st     *store
	id     int64         // the session's lease id, for the log records
	ttl    time.Duration // bounds each statement
	age    time.Duration // the free-row age; 0: no clean-up
	every  time.Duration // the sweep interval (see sweepInterval)
	passes atomic.Int64  // sweep passes this session has run
	exited chan struct{} // closed when run returns
}

func newSweeper(st *store, o *options) *sweeper {
	return &sweeper{st: st, ttl: o.ttl, age: o.freeRowAge, every: o.sweepInterval(), exited: make(chan struct{})}
}

// sweepBatch is how many names a batch of a sweep pass covers: the most
// rows one of its statements locks, and so the longest a lock statement
// waits for the sweep.
const sweepBatch = 500

// Bounds of the sweep interval (see sweepInterval).
const (
	minSweepEvery = time.Second
	maxSweepEvery = 10 * time.Minute
)

// sweepInterval is how often a pass runs: an eighth of the free-row age,
// from 1s to 10min (or what a test set). A row is marked by the first pass
// to reach it after it fell free, and deleted by the first pass to reach
// it at least the age after that. Sessions ask to be elected every 1/8 to
// 3/8 of an interval, so a pass starts at most 1.375 intervals after the
// one before it started (or, when that one ran over half an interval and
// so held the election, ended), and a row is deleted at most age + 2.75
// intervals (1.34 x age) after it fell free, plus up to three pass
// durations.
func (o *options) sweepInterval() time.Duration {
	if o.sweepEvery > 0 {
		return o.sweepEvery
	}
	return min(max(o.freeRowAge/8, minSweepEvery), maxSweepEvery)
}

// sweepTable names the statements of one table's sweep.
type sweepTable struct {
	name                     string
	end, read, delete, marks stmtIndex
}

var sweepTables = [...]sweepTable{
	{"lock", sLockBatchEnd, sLockSweepRead, sLockSweepDelete, sLockSweepMark},
	{"queue", sQueueBatchEnd, sQueueSweepRead, sQueueSweepDelete, sQueueSweepMark},
}

// run asks to be elected every quarter interval, jittered, the first
// time at a random moment of the first interval (so that sessions starting
// together do not ask together), and runs a pass when elected. It returns
// when the session ends; a pass in progress stops at its next statement.
func (s *sweeper) run() {
	defer close(s.exited)
	if s.age == 0 {
		return
	}
	every := s.every
	timer := time.NewTimer(rand.N(every))
	defer timer.Stop()
	for {
		select {
		case <-s.st.stopped.Done():
			return
		case <-timer.C:
		}
		if s.elect(every) {
			s.passes.Add(1)
			start := time.Now()
			deleted, marked := s.sweep(every, s.age)
			s.st.logger.Debug("dsync: sweep pass", "session", s.id, "deleted", deleted, "marked", marked,
				"took", time.Since(start))
		}
		timer.Reset(every/8 + rand.N(every/4))
	}
}

// elect reports whether this session runs the next pass.
func (s *sweeper) elect(every time.Duration) bool {
	ctx, cancel := context.WithTimeout(s.st.stopped, s.ttl)
	defer cancel()
	won, err := s.st.execChanged(ctx, sSweepElect, every.Microseconds())
	if err != nil {
		s.st.logger.Debug("dsync: sweep election failed", "session", s.id, "err", err)
		return false
	}
	return won
}

// sweep runs one pass, deleting rows marked at least age ago, and returns
// how many rows it deleted and marked. A batch that fails with a server
// error (a lock wait timeout, say, after the retries) is skipped; any other
// error (the connection, the session ending) ends the pass. Either way the
// rows left are seen again by the next pass.
func (s *sweeper) sweep(every, age time.Duration) (deleted, marked int64) {
	held := time.Now() // when this pass last told the others it runs
	for _, t := range sweepTables {
		for after := ""; ; {
			if s.st.stopped.Err() != nil {
				return deleted, marked
			}
			if time.Since(held) >= every/2 {
				ctx, cancel := context.WithTimeout(s.st.stopped, s.ttl)
				if _, err := s.st.exec(ctx, sSweepHold); err != nil {
					s.st.logger.Debug("dsync: sweep hold failed", "session", s.id, "err", err)
				}
				cancel()
				held = time.Now()
			}
			ctx, cancel := context.WithTimeout(s.st.stopped, s.ttl)
			b, err := s.sweepBatch(ctx, t, after, age)
			cancel()
			deleted += b.deleted
			marked += b.marked
			if err != nil {
				s.st.logger.Debug("dsync: sweep batch failed", "session", s.id, "table", t.name, "after", after, "err", err)
				if b.last == "" || !serverError(err) {
					return deleted, marked
				}
			}
			if b.last == "" {
				break // the table is done
			}
			after = b.last
		}
	}
	deleted += s.sweepTxLocks(age)
	deleted += s.sweepLeaders()
	return deleted, marked
}

// sweepLeaders deletes up to sweepBatch leader rows (see qCreateLeader)
// whose lease has ended or is gone, one by one by their key, after a
// plain read that lists them (qLeadersEnded), and returns how many it
// deleted. Such a row never counts again (its lease never lives again),
// so it may go at once, whatever the free-row age. A failure ends it; the
// next pass tries again.
func (s *sweeper) sweepLeaders() (deleted int64) {
	ctx, cancel := context.WithTimeout(s.st.stopped, s.ttl)
	defer cancel()
	type leaderRow struct {
		name   string
		holder int64
	}
	deleted, _, err := listThenDelete(ctx, s.st, sLeadersEnded, []any{sweepBatch},
		func(rows *sql.Rows) (r leaderRow, err error) {
			err = rows.Scan(&r.name, &r.holder)
			return r, err
		},
		func(ctx context.Context, r leaderRow) (int64, error) {
			return s.st.execCount(ctx, sLeaderPurge, r.name, r.holder)
		})
	if err != nil {
		s.st.logger.Debug("dsync: sweep batch failed", "session", s.id, "table", "leader", "err", err)
	}
	return deleted
}

// sweepTxLocks deletes the transaction-lock rows (see qCreateTxLock) unused
// for age, one by one, with the statement that does not wait for a row a
// transaction holds (it skips that row), after a plain read of up to
// sweepBatch of them at a time. It returns how many it deleted; a failure
// ends it, and the next pass tries again.
func (s *sweeper) sweepTxLocks(age time.Duration) (deleted int64) {
	for s.st.stopped.Err() == nil {
		ctx, cancel := context.WithTimeout(s.st.stopped, s.ttl)
		n, listed, err := s.sweepTxLockBatch(ctx, age)
		cancel()
		deleted += n
		if err != nil {
			s.st.logger.Debug("dsync: sweep batch failed", "session", s.id, "table", "txlock", "err", err)
		}
		if err != nil || listed < sweepBatch || n == 0 {
			return deleted
		}
	}
	return deleted
}

// sweepTxLockBatch lists up to sweepBatch idle transaction-lock rows and
// deletes those still idle and not held.
func (s *sweeper) sweepTxLockBatch(ctx context.Context, age time.Duration) (deleted int64, listed int, err error) {
	return listThenDelete(ctx, s.st, sTxLockIdle, []any{age.Microseconds(), sweepBatch},
		func(rows *sql.Rows) (name string, err error) {
			err = rows.Scan(&name)
			return name, err
		},
		func(ctx context.Context, name string) (int64, error) {
			res, err := s.st.execNoWait(ctx, sTxLockSweepDelete, sTxLockSweepDeleteNoWait, name, age.Microseconds())
			if isErrNo(err, errLockWaitTimeout) {
				return 0, nil // a transaction holds it
			}
			if err != nil {
				return 0, err
			}
			n, _ := res.RowsAffected()
			return n, nil
		})
}

// batch is what one batch of a pass did.
type batch struct {
	last            string // the batch's last name; "" when the table is done
	deleted, marked int64  // rows deleted, rows marked (or unmarked)
}

// sweepBatch sweeps the next batch of t after the name after: it reads
// what there is to do, then records the fence floor and deletes the rows
// that are ready, if any, then marks the rows that are free, if any.
func (s *sweeper) sweepBatch(ctx context.Context, t sweepTable, after string, freeRowAge time.Duration) (batch, error) {
	var b batch
	age := freeRowAge.Microseconds()
	var last sql.NullString
	var fence sql.NullInt64 // the highest fence of the rows ready to go
	var marks int64
	err := s.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
		st, err := c.Stmt(ctx, s.st.pool, int(t.end))
		if err != nil {
			return err
		}
		if err := st.QueryRowContext(ctx, after, sweepBatch).Scan(&last); err != nil || !last.Valid {
			return err
		}
		if st, err = c.Stmt(ctx, s.st.pool, int(t.read)); err != nil {
			return err
		}
		return st.QueryRowContext(ctx, age, after, last.String).Scan(&fence, &marks)
	})
	if err != nil || !last.Valid {
		return b, err
	}
	b.last = last.String
	if fence.Valid {
		// The floor first: once a row is gone, a new row of its name may
		// be created at once, and its fence must start above this one.
		// Read back, the floor also bounds the delete: a row that became
		// ready since the read, with a higher fence, waits for the next
		// pass, and without a schema row nothing goes.
		var floor int64
		if _, err := s.st.exec(ctx, sSweepFloor, fence.Int64); err != nil {
			return b, err
		}
		err := s.st.withConn(ctx, false, func(ctx context.Context, c *connpool.Conn) error {
			st, err := c.Stmt(ctx, s.st.pool, int(sSweepFloorRead))
			if err != nil {
				return err
			}
			return st.QueryRowContext(ctx).Scan(&floor)
		})
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return b, err
		default:
			if b.deleted, err = s.st.execCount(ctx, s.sweepStmt(t.delete), after, b.last, age, floor); err != nil {
				s.st.noWaitRefused(err)
				return b, err
			}
		}
	}
	if marks > 0 {
		if b.marked, err = s.st.execCount(ctx, s.sweepStmt(t.marks), after, b.last); err != nil {
			s.st.noWaitRefused(err)
			return b, err
		}
	}
	return b, nil
}

// sweepStmt returns the statement to run for stmt: for the lock table, its
// variant that does not wait for row locks (see noWaitSQL), so that a
// batch statement does not wait for a transaction's hold (Mutex.LockTx)
// while it holds the rows it has changed already. Such a batch fails
// with a lock wait timeout (1205) after exec's retries, and is skipped
// until the next pass.
func (s *sweeper) sweepStmt(stmt stmtIndex) stmtIndex {
	switch stmt {
	case sLockSweepDelete:
		return s.st.noWait(stmt, sLockSweepDeleteNoWait)
	case sLockSweepMark:
		return s.st.noWait(stmt, sLockSweepMarkNoWait)
	}
	return stmt
}

package dsync

import (
	"context"
	"database/sql"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

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
	weight int64     // > 0: a Semaphore's ticket to shrink to this weight (a partial Release), not to free
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

// A reaper frees a session's orphans in the background, by the session's
// free (given when made, as it is the lock kinds' release), and purges
// long-ended leases now and then. It runs its statements through the
// session's store, and never calls into the Session otherwise.
type reaper struct {
	st     *store
	ttl    time.Duration
	free   func(context.Context, orphan) (bool, error) // Session.free
	logger *slog.Logger                                // set by the session before reap starts
	kick   chan struct{}                               // a value: there are orphans to free now
	exited chan struct{}                               // closed when reap returns

	mu      sync.Mutex
	orphans []orphan // guarded by mu; rows to free in the background
	freeing int      // guarded by mu; orphans taken out of orphans by freeAll, being freed
}

func newReaper(st *store, ttl time.Duration, free func(context.Context, orphan) (bool, error)) *reaper {
	return &reaper{st: st, ttl: ttl, free: free, kick: make(chan struct{}, 1), exited: make(chan struct{})}
}

// add records a lock row or ticket to free in the background and wakes
// the reaper.
func (r *reaper) add(o orphan) {
	o.since = time.Now()
	r.mu.Lock()
	r.orphans = append(r.orphans, o)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// pending returns the orphans not freed yet (those being freed right now
// are out of the list).
func (r *reaper) pending() []orphan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]orphan(nil), r.orphans...)
}

// count returns how many orphans are left to free, those being freed
// right now included.
func (r *reaper) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.orphans) + r.freeing
}

// addOrphan records a lock row or ticket to free in the background (see
// reaper.add).
func (s *Session) addOrphan(o orphan) { s.reaper.add(o) }

// reap frees orphans as soon as they are recorded (and retries every
// TTL/3), and purges long-ended leases now and then. It runs beside the
// keep-alive goroutine so that nothing it does can delay a renewal.
func (r *reaper) reap() {
	defer close(r.exited)
	retry := time.NewTicker(r.ttl / 3)
	defer retry.Stop()
	// The first purge comes at a random moment of the first minute, so that
	// sessions starting together do not purge together.
	first := time.Second + rand.N(time.Minute)
	if d := purgeFirstHook.Load(); d > 0 {
		first = time.Duration(d)
	}
	purge := time.NewTimer(first)
	defer purge.Stop()
	for {
		select {
		case <-r.st.stopped.Done():
			return
		case <-r.kick:
		case <-retry.C:
		case <-purge.C:
			r.purge()
			purge.Reset(purgeEvery)
			continue
		}
		r.freeAll()
	}
}

// purgeFirstHook, when above 0 (set by tests), is the delay of the first
// purge of the sessions that start meanwhile, instead of a random moment
// of their first minute: tests that count the server's statements over a
// few seconds would count a purge that fell in their window as polling.
var purgeFirstHook atomic.Int64

// purge deletes leases that ended over an hour ago and tickets of deleted
// leases; a failure is only logged.
func (r *reaper) purge() {
	s := r.st
	ctx, cancel := context.WithTimeout(s.stopped, r.ttl)
	defer cancel()
	type ticket struct {
		name        string
		seq, holder int64
	}
	_, err := s.exec(ctx, sLeasePurge)
	if err == nil {
		_, _, err = listThenDelete(ctx, s, sTicketsOrphaned, nil,
			func(rows *sql.Rows) (t ticket, err error) {
				err = rows.Scan(&t.name, &t.seq, &t.holder)
				return t, err
			},
			func(ctx context.Context, t ticket) (int64, error) {
				_, err := s.exec(ctx, sTicketPurge, t.name, t.seq, t.holder)
				return 0, err
			})
	}
	if err != nil {
		s.logger.Debug("dsync: purge failed", "err", err)
	}
}

// freeAll tries once to free every orphaned row or ticket.
func (r *reaper) freeAll() {
	r.mu.Lock()
	todo := r.orphans
	r.orphans = nil
	r.freeing = len(todo)
	r.mu.Unlock()
	var keep []orphan
	for i, o := range todo {
		ctx, cancel := context.WithTimeout(r.st.stopped, r.ttl/3)
		freed, err := r.free(ctx, o)
		cancel()
		switch {
		case err != nil:
			keep = append(keep, todo[i:]...)
		case freed:
			r.logger.Info("dsync: orphan freed", "lock", o.name, "kind", o.kind(), "token", o.token,
				"age", time.Since(o.since))
		case time.Since(o.since) < orphanWindow:
			keep = append(keep, o)
		default:
			r.logger.Debug("dsync: orphan not found; given up", "lock", o.name, "kind", o.kind(), "token", o.token,
				"age", time.Since(o.since))
		}
		if err != nil {
			break
		}
	}
	r.mu.Lock()
	r.orphans = append(r.orphans, keep...)
	r.freeing = 0
	r.mu.Unlock()
}

// knownHolds lists the lock rows and tickets the session holds or may hold:
// its holds and its orphans.
func (s *Session) knownHolds() []orphan {
	s.mu.Lock()
	defer s.mu.Unlock()
	holds := s.reaper.pending()
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
		for _, h := range e.state.permits {
			holds = append(holds, orphan{name: name, token: h.token, ticket: true, seq: h.ticket})
		}
		e.state.mu.Unlock()
	}
	return holds
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
	if s.leaseErr() != nil {
		s.mu.Lock()
		closing := s.closed // Close was called
		s.mu.Unlock()
		if !closing {
			return // lost: the lease ends on the server, and with it the hold
		}
	}
	if ctx.Err() == nil {
		if freed, err := s.free(ctx, o); err == nil && freed {
			return
		}
	}
	s.addOrphan(o)
}

// free releases the lock row or removes the ticket o names, if this
// session's acquisition o.token still has it, and reports whether it did.
// Whatever frees a row or ticket that others may wait for rings the
// session's doorbell when they do (see doorbell.go): a lock row whose
// wanted_until is current, a ticket with a waiter's marker behind it.
// When ctx ended meanwhile, its error is ctx's: a release on the
// doorbell's connection runs on shortly after ctx (see ringIn), and is
// cut with an error of its own.
func (s *Session) free(ctx context.Context, o orphan) (freed bool, err error) {
	defer func() {
		if cerr := ctx.Err(); err != nil && cerr != nil {
			err = cerr
		}
	}()
	if o.ticket {
		return s.tickets.freeTicket(ctx, o) // see tickets.go
	}
	ran, res, err := s.rows.freeRinging(ctx, o) // see lockrow.go
	switch {
	case !ran:
		res, err = s.store.exec(ctx, sLockRelease, o.name, s.id, o.token)
	case err != nil && ctx.Err() == nil:
		// The statement failed on the doorbell's connection, which went
		// with it (ForceRelease of another of this session's locks kills
		// it to wake that lock's waiters; a server restart): free o on a
		// pool connection. The release is by token: when the statement
		// did commit before it failed, this one frees nothing, and the
		// error stands (the reaper then finds nothing to free).
		if again, aerr := s.store.exec(ctx, sLockRelease, o.name, s.id, o.token); aerr == nil {
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
		s.bell.ring()
	}
	return true, nil
}

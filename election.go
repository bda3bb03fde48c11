package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// A Leader is the leader of an [Election] as the database recorded it.
type Leader struct {
	Value   string // the value of its Campaign, or of its latest Proclaim
	Session int64  // the leading session's ID()
	Term    int64  // strictly increasing per election name; a fencing token
}

// An Election elects one leader among the sessions that campaign for the
// same name, shared like [Mutex] by every process whose [Session] reaches
// the same database and table prefix. Create it with [NewElection]; the
// zero value is not usable. An Election is safe for concurrent use.
//
// Leadership is the exclusive hold of a [FairMutex]-like lock of the
// name, so it has the same guarantees: campaigners are served in the
// order the database committed their arrival (no starvation); at most
// one session leads at any instant by the database's clock; the leader's
// term is the hold's fence, strictly greater than every earlier term of
// the name, for resources that refuse a deposed leader's writes; and
// leadership ends with the leader's session: its [Session.Done] closes
// before the database lets another campaigner take over (see
// [Session]). A session that leads an election learns of the end of its
// leadership only that way (or from [Election.Term], 0 then): watch Done.
//
// The leader's value is stored beside the hold and read together with it
// in one statement, so [Election.Leader] and [Election.Observe] never pair
// a term with another leader's value, and never report a term before the
// hold that owns it took it: between a new leader's take of the lock and
// its record of the value (a statement later) nobody is reported to lead.
//
// A name is one lock: while a Mutex, FairMutex or RWMutex uses it,
// [Election.Campaign] returns [ErrOtherKind], and the other way round.
// Election names are lock names (see [NewMutex]) of at most 254 bytes.
type Election struct {
	q    queued // the election's lock, under its queue key (see "Queue keys" in queries.go)
	name string

	camp chan struct{} // holds a value while a Campaign runs: one at a time
	proc chan struct{} // holds a value while a Proclaim runs: one at a time, so that they land in the order of their vers and value is the database's

	mu    sync.Mutex
	g     *Session // guarded by mu; the lease of this session's leadership; nil: not leading
	token int64    // guarded by mu; the hold's acquisition token
	term  int64    // guarded by mu; the hold's fence
	ver   int64    // guarded by mu; the ver of the last Proclaim sent in this term
	value string   // guarded by mu; the value last recorded in this term
	stale bool     // guarded by mu; a Proclaim failed after it was sent: the database may hold its value, not value
}

// maxValueLen is the longest value of a leader (the leader table's BLOB).
const maxValueLen = 65535

// NewElection returns the election called name in s's lock space. With an
// invalid name every method returns [ErrInvalidName] (Observe a closed
// channel). NewElection panics if s is nil.
func NewElection(s *Session, name string) *Election {
	return &Election{q: newQueued(s, kindRowElection, name, "Election"), name: name,
		camp: make(chan struct{}, 1), proc: make(chan struct{}, 1)}
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Campaign joins the line of campaigners and blocks until this session
// leads the election with value, ctx ends, or the session ends. When this
// Election leads already, it returns at once, after it has proclaimed
// value if that differs (as etcd's Campaign does). Campaigns of one
// Election run one at a time; another Election of the same session and
// name is another campaigner, served in its turn. On error the caller is out of the line,
// leads nothing and has left nothing in the database (a hold taken as ctx
// ended is given back, at once or by the session's keep-alive). It
// returns [ErrInvalidName], [ErrValueTooLong], [ErrOtherKind], ctx's
// error, [ErrSessionExpired], [ErrSessionClosed], [ErrNotLeader] (it led,
// and the leadership ended before it proclaimed value) or a database
// error.
func (e *Election) Campaign(ctx context.Context, value string) error {
	_, err := e.campaign(ctx, value, true)
	return err
}

// TryCampaign leads the election with value only if nobody leads it and
// nobody campaigns: it never joins the line. It returns false, nil
// otherwise, and errors as Campaign does; false, nil also while a
// Campaign or TryCampaign of this Election runs (it campaigns, or leads
// and proclaims), without waiting for it. It waits only for a new lease,
// as [Mutex.TryLock] says. When this Election leads already, it returns
// true, after it has proclaimed value if that differs.
func (e *Election) TryCampaign(ctx context.Context, value string) (bool, error) {
	return e.campaign(ctx, value, false)
}

// campaign is Campaign (wait) and TryCampaign.
func (e *Election) campaign(ctx context.Context, value string, wait bool) (bool, error) {
	if err := e.check(value); err != nil {
		return false, err
	}
	if wait {
		select {
		case e.camp <- struct{}{}:
		case <-ctx.Done():
			return false, opErrorf(ctx.Err(), "campaign %q", e.name)
		}
	} else {
		select {
		case e.camp <- struct{}{}:
		default:
			return false, nil // a Campaign of this Election runs: it campaigns
		}
	}
	defer func() { <-e.camp }()
	if e.Term() != 0 {
		e.mu.Lock()
		same := e.value == value && !e.stale
		e.mu.Unlock()
		if same {
			return true, nil
		}
		err := e.Proclaim(ctx, value)
		return err == nil, err
	}
	// Leadership has no owner: any goroutine may resign it.
	ctx = context.WithValue(ctx, ownerKey{}, uint64(0))
	c := e.q.s.track(kindElection, "campaign", e.name, wait)
	return e.q.s.withLease(ctx, c, func(g *Session) (bool, error) { return e.campaignOn(ctx, c, g, value, wait) })
}

// campaignOn runs Campaign on the lease g: it takes the lock, then records
// the leader (qLeaderRecord). When the record fails, the hold is given
// back and the record, should it have landed, deleted.
func (e *Election) campaignOn(ctx context.Context, c *call, g *Session, value string, wait bool) (bool, error) {
	q := e.q.on(g)
	if ok, err := q.lockOn(ctx, c, wait); !ok {
		return false, e.rename(err, "campaign")
	}
	lq := g.queues.lookup(q.name)
	lq.mu.Lock()
	token, term := lq.token, lq.fence
	lq.mu.Unlock()
	if hook := electionTakeHook.Load(); hook != nil {
		(*hook)(e.name, token, term)
	}
	n, err := e.record(ctx, g, token, term, value)
	if err == nil && n == 0 {
		err = errors.New("the hold ended before the leader was recorded")
	}
	if err != nil {
		// The hold is given back, also when ctx has ended (see undo), and
		// the record removed in case it landed: it counts for nothing
		// without its hold anyway.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opts.ttl)
		defer cancel()
		_ = q.unlockOn(uctx)
		if _, derr := g.store.exec(uctx, sLeaderDelete, e.name, g.id, token); derr != nil {
			g.logger.Debug("dsync: delete a leader record failed", "lock", e.name, "err", derr)
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		} else if lerr := g.leaseErr(); lerr != nil {
			err = lerr
		}
		return false, opErrorf(err, "campaign %q", e.name)
	}
	e.mu.Lock()
	e.g, e.token, e.term, e.ver, e.value, e.stale = g, token, term, 0, value, false
	e.mu.Unlock()
	// Observers that found this session at the head of the line, not yet
	// recorded, block on its doorbell.
	g.bell.ring()
	return true, nil
}

// electionTakeHook, when set, runs in campaignOn between the take of the
// election's lock and the record of the leader, with the election's name
// and the hold's token and term; tests set it (see export_test.go).
var electionTakeHook atomic.Pointer[func(name string, token, term int64)]

// record records this session, on the lease g, as the leader with value
// for the hold of token and term (qLeaderRecord), and returns how many
// rows it changed: 0 when the hold is gone.
func (e *Election) record(ctx context.Context, g *Session, token, term int64, value string) (int64, error) {
	return g.store.execCount(ctx, sLeaderRecord, append([]any{e.name, g.id, token, term, value}, e.heldArgs(g, token)...)...)
}

// heldArgs returns the arguments of leaderHeldSQL for the hold of token
// on the lease g.
func (e *Election) heldArgs(g *Session, token int64) []any {
	return []any{e.q.name, g.id, token, e.q.name, g.id, token}
}

// Proclaim changes the leader's value to value without giving up
// leadership; observers see it with the same term. It returns
// [ErrNotLeader] when this Election does not lead (wrapping the session's
// error when the session had ended before the value was sent), and then
// it changed nothing; or [ErrInvalidName], [ErrValueTooLong], ctx's error,
// a database error, or the session's error ([ErrSessionExpired],
// [ErrSessionClosed]) when the session ended while the value was on its
// way. A Proclaim that failed otherwise than with ErrNotLeader may have
// changed the value or not (before the leadership ended); one that the
// client gave up on never lands after a later one. Proclaims of one
// Election run one at a time, in the order they got their turn; each
// rings the leader session's doorbell, which wakes its observers, and
// also the waiters for the session's other locks, who read once and block
// again.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := e.check(value); err != nil {
		return err
	}
	select {
	case e.proc <- struct{}{}:
	case <-ctx.Done():
		return opErrorf(ctx.Err(), "proclaim %q", e.name)
	}
	defer func() { <-e.proc }()
	e.mu.Lock()
	g, token := e.g, e.token
	e.ver++ // also after a failure: a late landing of this one is then older than the next
	ver := e.ver
	e.mu.Unlock()
	if g == nil {
		return opErrorf(ErrNotLeader, "proclaim %q", e.name)
	}
	if err := g.leaseErr(); err != nil {
		return opErrorf(fmt.Errorf("%w: %w", ErrNotLeader, err), "proclaim %q", e.name)
	}
	n, err := g.store.execCount(ctx, sLeaderProclaim, append([]any{value, ver, e.name, g.id, token, ver}, e.heldArgs(g, token)...)...)
	if err != nil {
		e.mu.Lock()
		if e.g == g && e.token == token {
			e.stale = true // it may land yet: a Campaign of value proclaims it again
		}
		e.mu.Unlock()
	}
	switch {
	case err != nil && g.leaseErr() != nil:
		// Not ErrNotLeader: the statement may have landed before the end.
		return opErrorf(fmt.Errorf("%w, the value may have landed before: %w", g.leaseErr(), err), "proclaim %q", e.name)
	case err != nil:
		return opErrorf(err, "proclaim %q", e.name)
	case n == 0:
		return opErrorf(ErrNotLeader, "proclaim %q", e.name)
	}
	e.mu.Lock()
	if e.g == g && e.token == token {
		e.value, e.stale = value, false
	}
	e.mu.Unlock()
	g.bell.ring() // observers block on the leader's doorbell
	return nil
}

// Resign gives up leadership, letting the next campaigner in, and
// returns nil; also when this Election does not lead (never campaigned,
// resigned already, or its session has ended, which ended its
// leadership). It returns [ErrInvalidName], or the database's error when
// the release failed: then the session retries it in the background, and
// the leadership ends at the latest with the session.
func (e *Election) Resign(ctx context.Context) error {
	if e.q.err != nil {
		return e.q.err
	}
	e.mu.Lock()
	g, token := e.g, e.token
	e.g, e.token, e.term, e.value, e.stale = nil, 0, 0, "", false
	e.mu.Unlock()
	if g == nil || !e.holds(g, token) {
		return nil
	}
	err := e.q.on(g).unlockOn(context.WithValue(ctx, ownerKey{}, uint64(0)))
	if errors.Is(err, ErrNotHeld) || errors.Is(err, ErrSessionExpired) || errors.Is(err, ErrSessionClosed) {
		err = nil // the leadership ended with the session
	}
	if g.leaseErr() == nil {
		if _, derr := g.store.exec(ctx, sLeaderDelete, e.name, g.id, token); derr != nil {
			// It counts for nothing without its hold; the session's next
			// Campaign of the name, or the sweep after the session,
			// replaces or deletes it.
			g.logger.Debug("dsync: delete a leader record failed", "lock", e.name, "err", derr)
		}
	}
	g.bell.ring() // observers block on the leader's doorbell
	return e.rename(err, "resign")
}

// Term returns this session's term while this Election leads, else 0. It
// reads no database: once the session has ended it is 0.
func (e *Election) Term() int64 {
	e.mu.Lock()
	g, token, term := e.g, e.token, e.term
	e.mu.Unlock()
	if g == nil || g.leaseErr() != nil || !e.holds(g, token) {
		return 0
	}
	return term
}

// holds reports whether this process holds the election's lock on the
// lease g with the acquisition token.
func (e *Election) holds(g *Session, token int64) bool {
	lq := g.queues.lookup(e.q.name)
	if lq == nil {
		return false
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	return lq.held && lq.token == token
}

// Leader returns the current leader of the election, as the database
// records it at one instant: [ErrNoLeader] when nobody leads (nobody
// campaigns, the leader's lease has ended on the database's clock, or the
// next leader has taken the lock but not recorded its value yet). It
// returns [ErrInvalidName], ctx's error, the session's error or a
// database error otherwise.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	g := e.q.s.current()
	if err := e.precheck(ctx, g, "leader"); err != nil {
		return Leader{}, err
	}
	r, err := e.read(ctx, g)
	switch {
	case err != nil:
		return Leader{}, opErrorf(err, "leader %q", e.name)
	case !r.leads:
		return Leader{}, opErrorf(ErrNoLeader, "leader %q", e.name)
	}
	return r.leader, nil
}

// Observe returns a channel that delivers the election's current leader,
// then every change of leader or of its value (a new term, or a Proclaim),
// in order: each delivery has a greater (Term, Proclaim number) than the
// one before, so a stale leader never comes after a newer one. While
// nobody leads, nothing is delivered (not even that nobody leads: use
// [Election.Leader] for that). The channel is closed when ctx ends or the
// session ends (on a session made [WithReplaceLostLease], the lease
// current when Observe was called); with an invalid name it is closed at
// once.
//
// Changes that come faster than the receiver reads, or between two of the
// observer's reads of the database, are coalesced: the observer delivers
// the state it reads, so a value proclaimed and replaced at once, or a
// leader that resigned or died before the observer read it, may never be
// delivered; terms may therefore be skipped, but never reordered (etcd's
// Observe coalesces the same way).
//
// One goroutine per call does the work. It does not poll where doorbells
// work: it blocks on the leader's doorbell, which the leader rings when it
// proclaims, resigns or leads (and which its connection's end rings when
// its process dies), and reads again at the latest when the leader's
// lease would end, within 8 seconds: an observer of a leader that changes
// nothing sends a statement or two per wait. A session blocks on one
// doorbell at a time: while its own Campaign waits behind a campaigner
// that does not lead (it blocks on that one's doorbell; an observer
// blocking on the leader's gives the connection up to it), or no
// connection can be had to block with, the observer reads once a second
// instead, and sees a change within a second. While nobody holds or waits for the
// election it reads once a second too; on a Galera cluster, and where
// doorbells are not used (see the package's Waiting section), it reads
// four times a second.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	g := e.q.s.current()
	if e.precheck(ctx, g, "observe") != nil {
		close(ch)
		return ch
	}
	go e.observe(ctx, g, ch)
	return ch
}

// How an observer waits when it cannot block on a leader's doorbell:
// observeIdle while nobody holds or waits for the election (nobody's
// doorbell to block on: a first Campaign is seen within it), and while its
// session's waiting connection blocks on another doorbell or none can be
// had (see bellWaiter.wait); observePoll where doorbells are not used
// (Galera); within the polling budget either way.
const (
	observeIdle = time.Second
	observePoll = 250 * time.Millisecond
)

// maxWoke bounds the doorbells an observer remembers having woken from
// (bellState.woke): a leader that proclaims all day adds one per ring.
const maxWoke = 64

// observe is Observe's goroutine on the lease g.
func (e *Election) observe(ctx context.Context, g *Session, ch chan<- Leader) {
	defer close(ch)
	var lastTerm, lastVer int64 // of the last delivery
	var bells bellState
	var polls pollBudget
	var holder int64 // the session whose doorbell bells is about
	for {
		r, err := e.read(ctx, g)
		polls.spend(1)
		if ctx.Err() != nil || g.leaseErr() != nil {
			return
		}
		if err == nil && r.leads && (r.leader.Term > lastTerm || r.leader.Term == lastTerm && r.ver > lastVer) {
			select {
			case ch <- r.leader:
			case <-ctx.Done():
				return
			case <-g.done:
				return
			}
			lastTerm, lastVer = r.leader.Term, r.ver
			continue // the send may have waited: read again
		}
		if r.id != holder || len(bells.woke) > maxWoke {
			bells, holder = bellState{}, r.id
		}
		var d time.Duration
		switch {
		case err != nil:
			g.logger.Debug("dsync: observe failed", "lock", e.name, "kind", kindElection, "err", err)
			d = bells.nextPace(&polls)
		case !g.bell.usable():
			d = polls.delay(observePoll)
		case !r.found:
			d = polls.delay(observeIdle)
		case r.bell == 0:
			d = bells.nextPace(&polls) // the holder's doorbell is not there yet
		default:
			ref, block, _ := bells.judge(true, bellRef{id: r.id, gen: r.bell}, r.left, 0)
			if !block {
				d = bells.nextPace(&polls)
				break
			}
			if g.waiters.wait(ctx, g.done, ref, r.left, bellWait, true, &bells, g.logger, e.name, kindElection) != waitPace {
				break
			}
			if bells.busy {
				// The session's connection blocks on another doorbell
				// (its own Campaign waits behind another campaigner),
				// maybe for as long as the line stands still, or none
				// can be had: read at the idle pace, not a lock
				// waiter's connPace.
				bells.busy = false
				d = polls.delay(observeIdle)
			} else {
				d = bells.nextPace(&polls)
			}
		}
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
			case <-g.done:
			}
			t.Stop()
		}
	}
}

// leaderRead is one read of an election (qLeaderRead).
type leaderRead struct {
	found  bool   // a live session holds or waits for the election
	leads  bool   // and leads: it recorded itself
	leader Leader // when leads
	ver    int64  // the leader's Proclaim number in its term
	id     int64  // the holder's lease id, when found
	bell   int64  // the generation of its doorbell (0: none)
	left   int64  // microseconds its lease has left
}

// read reads the election's holder and leader in one statement, on the
// session's connection for blocking on doorbells when it is idle (between
// two blocks of an observer, see bellWaiter.idleConn), else as the
// session's other statements run.
func (e *Election) read(ctx context.Context, g *Session) (leaderRead, error) {
	var r leaderRead
	var term, ver sql.NullInt64
	var value []byte
	var none bool // no row: nobody holds or waits
	run := func(ctx context.Context, c *connpool.Conn) error {
		err := g.store.query(ctx, c, sLeaderRead, []any{e.name, e.q.name, e.q.name, e.q.name, e.name},
			&term, &ver, &value, &r.id, &r.bell, &r.left)
		if errors.Is(err, sql.ErrNoRows) {
			none, err = true, nil // an answer: the connection is kept
		}
		return err
	}
	var err error
	if c := g.waiters.idleConn(); c != nil {
		err = g.store.withDedicated(ctx, c, g.waiters.put, func(ctx context.Context) error { return run(ctx, c) })
	} else {
		err = g.store.withConn(ctx, false, run)
	}
	switch {
	case err != nil:
		return r, err
	case none:
		return r, nil
	}
	r.found, r.leads, r.ver = true, term.Valid, ver.Int64
	if r.leads {
		r.leader = Leader{Value: string(value), Session: r.id, Term: term.Int64}
	}
	return r, nil
}

// check returns the error that stops Campaign or Proclaim of value
// before it starts.
func (e *Election) check(value string) error {
	if e.q.err != nil {
		return e.q.err
	}
	if len(value) > maxValueLen {
		return fmt.Errorf("%w: %d bytes (at most %d)", ErrValueTooLong, len(value), maxValueLen)
	}
	return nil
}

// precheck returns the error that stops a read of the election on the
// lease g before it starts.
func (e *Election) precheck(ctx context.Context, g *Session, op string) error {
	if e.q.err != nil {
		return e.q.err
	}
	if err := g.leaseErr(); err != nil {
		return opErrorf(err, "%s %q", op, e.name)
	}
	if err := ctx.Err(); err != nil {
		return opErrorf(err, "%s %q", op, e.name)
	}
	return nil
}

// rename returns err, an error of the election's lock, as an error of the
// election's operation op: the lock's errors name its queue key.
func (e *Election) rename(err error, op string) error {
	var oe *opError
	if errors.As(err, &oe) && strings.Contains(oe.op, fmt.Sprintf("%q", e.name)) {
		return opErrorf(oe.err, "%s %q", op, e.name)
	}
	return err
}

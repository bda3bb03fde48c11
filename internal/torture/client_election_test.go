//go:build linux

package torture

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/dsynclock/dsync"
)

// electName is the election every client campaigns for and reads.
const electName = "e0"

// gObserver is the goroutine number of a process's observer in the
// history (its events' G): one above any worker's.
const gObserver = 1000

// value returns a value no other call of the run sends: the process, its
// incarnation, the goroutine and the time.
func (c *client) value(g int) string {
	return fmt.Sprintf("p%d.%d.g%d.%d", c.rec.proc, c.rec.inc, g, now())
}

// campaign campaigns for the election with a unique value and a deadline
// of 50 ms-3 s (one time in four 1-20 ms, which often ends while its
// statements run), and when it leads, does the work of a leader (lead)
// and resigns. The ret carries the term (Election.Term, 0 if the
// leadership ended already) and the session, when the session's lease
// was the same before and after the call (else 0: a lease replaced
// meanwhile, which of the two the leadership is on is not known).
func (c *client) campaign(g int, rng *rand.Rand, base context.Context, s *dsync.Session) {
	e := dsync.NewElection(s, electName)
	value := c.value(g)
	min, max := 50*time.Millisecond, 3*time.Second
	if rng.IntN(4) == 0 {
		min, max = time.Millisecond, 20*time.Millisecond
	}
	ctx, cancel := deadline(rng, base, min, max)
	sess := s.ID()
	id := c.rec.call(g, Event{Op: opCampaign, Name: electName, Value: value, Sess: sess})
	err := e.Campaign(ctx, value)
	cancel()
	r := result(Event{Op: opCampaign, Name: electName, Value: value}, err)
	if s.ID() == sess {
		r.Sess = sess
	}
	if err == nil {
		r.Fence = e.Term()
	}
	c.rec.ret(g, id, r)
	if err != nil {
		return
	}
	c.lead(g, rng, s, e, r.Sess, r.Fence)
	c.resign(g, rng, base, s, e, r.Sess)
}

// lead runs the work of a leader, as held does for a lock: one to four
// steps within 60 ms, or for one leadership in three, steps every
// 50-150 ms for up to two TTLs, each a check (Session.Err) with, one time
// in two, a write of the fenced register with the term as the fence, a
// Proclaim of a new value, or a read of the leader. It returns once a
// check failed.
func (c *client) lead(g int, rng *rand.Rand, s *dsync.Session, e *dsync.Election, sess, term int64) {
	steps, gap := 1+rng.IntN(4), 60
	if rng.IntN(3) == 0 {
		steps, gap = 2+rng.IntN(int(2*c.ttl/(100*time.Millisecond))), 150
	}
	for range steps {
		time.Sleep(time.Duration(gap/3+rng.IntN(gap*2/3)) * time.Millisecond)
		switch rng.IntN(4) {
		case 0:
			c.proclaim(g, rng, s, e)
		case 1:
			c.readLeader(g, rng, context.Background(), s)
		default:
			id := c.rec.call(g, Event{Op: opCheck, Name: electName, Sess: sess})
			err := s.Err()
			c.rec.ret(g, id, result(Event{Op: opCheck, Name: electName}, err))
			if err != nil {
				return
			}
			if term != 0 && rng.IntN(2) == 0 {
				c.write(g, c.regDB, electName, term)
			}
		}
	}
}

// proclaim proclaims a new value, with a deadline of 1-5 ms one time in
// five (a Proclaim that may land or not), else 2 s. Its ret is ok,
// notleader (ErrNotLeader) or fail.
func (c *client) proclaim(g int, rng *rand.Rand, s *dsync.Session, e *dsync.Election) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if rng.IntN(5) == 0 {
		cancel()
		ctx, cancel = deadline(rng, context.Background(), time.Millisecond, 5*time.Millisecond)
	}
	defer cancel()
	value := c.value(g)
	id := c.rec.call(g, Event{Op: opProclaim, Name: electName, Value: value, Sess: s.ID()})
	err := e.Proclaim(ctx, value)
	r := result(Event{Op: opProclaim, Name: electName, Value: value}, err)
	if errors.Is(err, dsync.ErrNotLeader) {
		r.Res = "notleader"
	}
	c.rec.ret(g, id, r)
}

// resign resigns, with a deadline of 1-5 ms one time in five (a release
// that then finishes in the background). Its ret says whether the
// leadership's lease had ended (or was replaced) when Resign returned
// (Lost): a Resign that returned nil on a live lease released the hold in
// the database; one on an ended lease returns nil having released
// nothing, and the database may count that lease live a while longer.
func (c *client) resign(g int, rng *rand.Rand, base context.Context, s *dsync.Session, e *dsync.Election, sess int64) {
	ctx, cancel := base, context.CancelFunc(func() {})
	if rng.IntN(5) == 0 {
		ctx, cancel = deadline(rng, base, time.Millisecond, 5*time.Millisecond)
	}
	defer cancel()
	id := c.rec.call(g, Event{Op: opResign, Name: electName, Sess: sess})
	err := e.Resign(ctx)
	r := result(Event{Op: opResign, Name: electName, Sess: sess}, err)
	r.Lost = sess == 0 || s.ID() != sess || s.Err() != nil
	c.rec.ret(g, id, r)
}

// readLeader reads the election's leader, with a deadline of 20 ms-1 s.
// Its ret is ok with the leader (Value, Leader: its session, Fence: its
// term), noleader (ErrNoLeader), or fail.
func (c *client) readLeader(g int, rng *rand.Rand, base context.Context, s *dsync.Session) {
	ctx, cancel := deadline(rng, base, 20*time.Millisecond, time.Second)
	defer cancel()
	id := c.rec.call(g, Event{Op: opLeader, Name: electName, Sess: s.ID()})
	l, err := dsync.NewElection(s, electName).Leader(ctx)
	r := result(Event{Op: opLeader, Name: electName}, err)
	switch {
	case err == nil:
		r.Value, r.Leader, r.Fence = l.Value, l.Session, l.Term
	case errors.Is(err, dsync.ErrNoLeader):
		r.Res = "noleader"
	}
	c.rec.ret(g, id, r)
}

// observe observes the election until the end, with one Observe per
// session (per lease, for a session made WithReplaceLostLease), numbered
// in Seq. Each Leader delivered is recorded as an operation of goroutine
// gObserver, an observed read of the database: the observer read it after
// it handed over the previous one, so the read lies between the moment
// the receiver was ready for the previous one (the Observe call, for the
// first) and the receipt; that is the operation's call and ret.
func (c *client) observe() {
	n := int64(0)
	for now() < c.until {
		s := c.current()
		if s == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		n++
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(c.until-now()))
		prev := now()
		ch := dsync.NewElection(s, electName).Observe(ctx)
		for {
			ready := now()
			l, ok := <-ch
			if !ok {
				break
			}
			ret := now()
			c.rec.mu.Lock()
			c.rec.next++
			id := c.rec.next
			c.rec.mu.Unlock()
			c.rec.emit(Event{G: gObserver, ID: id, Type: "call", TS: prev, Op: opObserved, Name: electName, Seq: n})
			c.rec.emit(Event{G: gObserver, ID: id, Type: "ret", TS: ret, Op: opObserved, Name: electName, Seq: n,
				Res: "ok", Value: l.Value, Leader: l.Session, Fence: l.Term})
			prev = ready
		}
		cancel()
		// Closed: the lease ended (the next one of a session that replaces
		// it, or the next session, is observed next), or the run did.
		time.Sleep(20 * time.Millisecond)
	}
}

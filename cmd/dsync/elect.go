package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/dsynclock/dsync"
)

// cmdElect runs a command while this process leads an election, or prints
// the election's leaders as they change:
// dsync elect [flags] NAME -- COMMAND [ARG...];
// dsync elect --observe [--json] [flags] NAME.
func cmdElect(args []string) int {
	c, code := parseHold("elect", args)
	if code >= 0 {
		return code
	}
	if c.observe {
		return c.observeLeaders()
	}
	return c.run()
}

// what names what dsync run holds, or dsync elect leads, in messages.
func (c *runConfig) what() string {
	if c.kind == kindElect {
		return fmt.Sprintf("leadership of %q", c.name)
	}
	return fmt.Sprintf("lock %q", c.name)
}

// newLock returns what c takes in s: the lock of its kind, or for dsync
// elect the leadership of the Election (a campaign with --value, or with
// the session's label; the term is the hold's fence).
func (c *runConfig) newLock(s *dsync.Session) *lock {
	if c.kind != kindElect {
		return newLock(s, c.kind, c.name, c.limit)
	}
	e := dsync.NewElection(s, c.name)
	c.election = e
	value := c.value
	if value == "" {
		value = c.leaderValue()
	}
	return &lock{
		try:    func(ctx context.Context) (bool, error) { return e.TryCampaign(ctx, value) },
		lock:   func(ctx context.Context) error { return e.Campaign(ctx, value) },
		unlock: e.Resign,
		fence:  e.Term,
		space:  func(dsync.LockKind) bool { return false }, // the waiting line names the leader instead
	}
}

// leaderValue is the value dsync elect campaigns with when --value is not
// given: --label, else host:pid, as the session's label.
func (c *runConfig) leaderValue() string {
	if c.labelSet {
		return c.label
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// parseObserve finishes parsing dsync elect --observe, whose only
// argument is the election's name; runOnly says whether a flag of running
// a command was given (--wait, --nonblock, --grace, --quiet, --value,
// --conflict-exit-code).
func (c *runConfig) parseObserve(rest []string, runOnly bool) (*runConfig, int) {
	switch {
	case !c.observe:
		return nil, usageError("elect: --json goes with --observe")
	case runOnly:
		return nil, usageError("elect: --observe runs no command: --wait, --nonblock, --grace, --quiet, --value and --conflict-exit-code do not apply")
	case len(rest) == 0:
		return nil, usageError("elect: no election name")
	case len(rest) > 1:
		return nil, usageError(fmt.Sprintf("elect: --observe takes the election's name only, not %q", rest[1:]))
	}
	c.name = rest[0]
	if msg := c.check(); msg != "" {
		return nil, usageError(msg)
	}
	return c, -1
}

// observedLeader is a line of dsync elect --observe --json.
type observedLeader struct {
	Time    time.Time `json:"time"`
	Term    int64     `json:"term"`
	Session int64     `json:"session"`
	Value   string    `json:"value"`
}

// observeRetry is how long dsync elect --observe waits before it observes
// again after its session's lease was lost (the session opens a new one).
const observeRetry = time.Second

// observeLeaders prints a line for the election's current leader and for
// each change of leader or value, until a signal (exit 128+N) or the
// database is unusable at the start (69). A lease lost meanwhile is
// replaced and the observation goes on; a leader older than one printed
// (a term below it) is never printed after it.
func (c *runConfig) observeLeaders() int {
	r := newRelay()
	defer r.stop()
	db, s, code := c.connect(r)
	if code >= 0 {
		return code
	}
	defer db.Close()
	defer func() { s.Close() }() // the session of the moment: a lost one is replaced

	e := dsync.NewElection(s, c.name)
	look, cancel := context.WithTimeout(r.ctx, c.connectTimeout)
	_, err := e.Leader(look)
	cancel()
	switch {
	case errors.Is(err, dsync.ErrInvalidName):
		return usageError(err.Error())
	case err != nil && !errors.Is(err, dsync.ErrNoLeader) && s.Err() == nil:
		// (A lease lost already is replaced below, as one lost later.)
		if sig, ok := r.received(); ok {
			return exitSignal + int(sig)
		}
		return unavailable(err)
	}
	var last dsync.Leader
	enc := json.NewEncoder(stdout)
	for {
		for l := range e.Observe(r.ctx) {
			if l.Term < last.Term || l == last {
				continue
			}
			last = l
			if c.json {
				_ = enc.Encode(observedLeader{time.Now().UTC(), l.Term, l.Session, l.Value})
			} else {
				fmt.Fprintf(stdout, "term %d session %d value %q\n", l.Term, l.Session, l.Value)
			}
		}
		if sig, ok := r.received(); ok {
			return exitSignal + int(sig)
		}
		if errors.Is(s.Err(), dsync.ErrSessionClosed) {
			return exitOK
		}
		if s.Err() == nil {
			// Not for a lost lease: Observe refused the election.
			fmt.Fprintf(stderr, "dsync: observing election %q ended\n", c.name)
			return exitUnavailable
		}
		fmt.Fprintf(stderr, "dsync: session lost while observing election %q (%s); observing again with a new one\n", c.name, errText(fmt.Sprint(s.Err())))
		// A lost lease is replaced only by a lock call, which an observer
		// never makes: it opens a new session instead, once a second at
		// most while the database is out.
		s.Close()
		for {
			select {
			case <-r.ctx.Done():
			case <-time.After(observeRetry):
			}
			if sig, ok := r.received(); ok {
				return exitSignal + int(sig)
			}
			setup, cancel := context.WithTimeout(r.ctx, c.connectTimeout)
			next, err := dsync.NewSession(setup, db, c.options()...)
			cancel()
			if err == nil {
				s = next
				e = dsync.NewElection(s, c.name)
				break
			}
			fmt.Fprintf(stderr, "dsync: no new session yet (%s)\n", errText(err.Error()))
		}
	}
}

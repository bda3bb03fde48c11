package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsynclock/dsync"
)

// Lock kinds of dsync run.
const (
	kindMutex = "mutex"
	kindFair  = "fair"
	kindRead  = "read"
	kindWrite = "write"
	kindLimit = "limit" // a Semaphore of --limit permits, one per run
	kindElect = "elect" // dsync elect: leadership of an Election
)

// defaultGrace is the most --grace defaults to; see graceBound.
const defaultGrace = 10 * time.Second

// graceBound returns the largest --grace allowed with a TTL: TTL/4. The
// command gets SIGTERM when the lease's deadline ([dsync.Session.Deadline])
// is --grace away, and a healthy session's deadline comes as close as
// 0.8*TTL - min(TTL/3, 2s) (at least 0.47*TTL) just before each renewal:
// TTL/4 keeps a margin of over a fifth of the TTL for a slow renewal before
// a healthy command would be stopped.
func graceBound(ttl time.Duration) time.Duration { return ttl / 4 }

// releaseTimeout bounds the Unlock after the command has ended; Close,
// which frees everything the session holds anyway, is bounded by the TTL.
const releaseTimeout = 5 * time.Second

// runConfig is the parsed command line of dsync run, or of dsync elect
// (cmd "elect", kind kindElect), which runs its command the same way while
// it leads.
type runConfig struct {
	dbFlags
	cmd      string // run or elect
	ttl      time.Duration
	wait     time.Duration   // 0: wait for ever (unless nonblock)
	nonblock bool            // -n, --nonblock, or --wait 0
	conflict int             // exit status when the lock is not obtained (-E)
	quiet    bool            // no "waiting for" line (-q)
	kind     string          // kindMutex, kindFair, kindRead, kindWrite, kindLimit or kindElect
	limit    int64           // --limit: the Semaphore's limit (kindLimit)
	value    string          // elect --value: the leader's value
	observe  bool            // elect --observe: print the leaders, run nothing
	json     bool            // elect --observe --json
	election *dsync.Election // the Election of dsync elect, once its session is open
	grace    time.Duration
	label    string
	labelSet bool
	name     string
	argv     []string // the command and its arguments
}

// cmdRun runs a command while holding a lock:
// dsync run [flags] NAME -- COMMAND [ARG...].
func cmdRun(args []string) int {
	c, code := parseRun(args)
	if code >= 0 {
		return code
	}
	return c.run()
}

// parseRun parses the arguments of dsync run. It returns -1 and the
// configuration, or the exit status of a usage error or -h.
func parseRun(args []string) (*runConfig, int) { return parseHold("run", args) }

// parseHold parses the arguments of dsync run or dsync elect (cmd), which
// share their flags but the kind flags of run (--fair, --read, --write) and
// the --value of elect.
func parseHold(cmd string, args []string) (*runConfig, int) {
	c := &runConfig{cmd: cmd}
	fs := newFlags(cmd)
	c.register(fs)
	fs.DurationVar(&c.ttl, "ttl", dsync.DefaultTTL, "")
	fs.Var((*seconds)(&c.wait), "wait", "")
	fs.Var((*seconds)(&c.wait), "w", "")
	fs.BoolVar(&c.nonblock, "nonblock", false, "")
	fs.BoolVar(&c.nonblock, "n", false, "")
	fs.IntVar(&c.conflict, "conflict-exit-code", exitNotObtained, "")
	fs.IntVar(&c.conflict, "E", exitNotObtained, "")
	fs.BoolVar(&c.quiet, "quiet", false, "")
	fs.BoolVar(&c.quiet, "q", false, "")
	var fair, read, write bool
	if cmd == "run" {
		fs.BoolVar(&fair, "fair", false, "")
		fs.BoolVar(&read, "read", false, "")
		fs.BoolVar(&write, "write", false, "")
		fs.Int64Var(&c.limit, "limit", 0, "")
	} else {
		fs.StringVar(&c.value, "value", "", "")
		fs.BoolVar(&c.observe, "observe", false, "")
		fs.BoolVar(&c.json, "json", false, "")
	}
	fs.DurationVar(&c.grace, "grace", defaultGrace, "")
	fs.StringVar(&c.label, "label", "", "")
	if code := parseFlags(fs, args); code >= 0 {
		return nil, code
	}
	waitSet, graceSet, limitSet, conflictSet := false, false, false, false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "limit":
			limitSet = true
		case "wait", "w":
			waitSet = true
		case "grace":
			graceSet = true
		case "conflict-exit-code", "E":
			conflictSet = true
		case "label":
			c.labelSet = true
		}
	})

	c.kind = kindMutex
	if cmd == "elect" {
		c.kind = kindElect
	}
	kinds := 0
	for _, k := range []struct {
		set  bool
		kind string
	}{{fair, kindFair}, {read, kindRead}, {write, kindWrite}, {limitSet, kindLimit}} {
		if k.set {
			c.kind = k.kind
			kinds++
		}
	}
	rest := fs.Args()
	noun := "lock"
	if cmd == "elect" {
		noun = "election"
	}
	if c.observe || c.json {
		return c.parseObserve(rest, waitSet || graceSet || conflictSet || c.nonblock || c.quiet || c.value != "")
	}
	switch {
	case kinds > 1:
		return nil, usageError(cmd + ": --fair, --read, --write and --limit exclude each other")
	case limitSet && c.limit < 1:
		return nil, usageError(fmt.Sprintf(cmd+": --limit %d: want 1 or more", c.limit))
	case waitSet && c.nonblock:
		return nil, usageError(cmd + ": --wait and --nonblock exclude each other")
	case c.conflict < 0 || c.conflict > 255:
		return nil, usageError(fmt.Sprintf(cmd+": --conflict-exit-code %d is not an exit status (0 to 255)", c.conflict))
	case c.grace < 0:
		return nil, usageError(cmd + ": --grace must not be negative")
	case graceSet && c.ttl > 0 && c.grace > graceBound(c.ttl):
		return nil, usageError(fmt.Sprintf(cmd+": --grace %v is more than TTL/4 = %v (--ttl %v): lower --grace, or raise --ttl to at least %v",
			c.grace, graceBound(c.ttl), c.ttl, 4*c.grace))
	case len(rest) == 0:
		return nil, usageError(cmd + ": no " + noun + " name")
	case len(rest) == 1 || len(rest) == 2 && rest[1] == "--":
		return nil, usageError(cmd + ": no command")
	case rest[1] != "--" && strings.HasPrefix(rest[1], "-"):
		return nil, usageError(fmt.Sprintf(cmd+": %q after the %s name: flags go before it, the command after --", rest[1], noun))
	}
	if !graceSet {
		c.grace = min(defaultGrace, graceBound(c.ttl))
	}
	if waitSet && c.wait == 0 {
		c.nonblock = true
	}
	c.name, c.argv = rest[0], rest[1:]
	if c.argv[0] == "--" {
		c.argv = c.argv[1:]
	}
	if msg := c.check(); msg != "" {
		return nil, usageError(msg)
	}
	return c, -1
}

// seconds is the flag.Value of --wait: a duration (5s, 1m30s), or a
// number of seconds as flock(1)'s -w takes it (5, 0.5); not negative.
type seconds time.Duration

func (d *seconds) String() string { return time.Duration(*d).String() }

func (d *seconds) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || f*float64(time.Second) >= math.MaxInt64 {
			return fmt.Errorf("%q is neither a duration (5s, 1m) nor a number of seconds (5, 0.5)", s)
		}
		v = time.Duration(f * float64(time.Second))
	}
	if v < 0 || strings.HasPrefix(s, "-") {
		return fmt.Errorf("%q is negative", s)
	}
	*d = seconds(v)
	return nil
}

// options returns the session options of the flags. The session replaces
// a lease lost while dsync waits for the lock (nothing is held then); a
// lease lost while the command runs still ends it (see watchCommand): the
// hold's lease stays the session's until the hold is released.
func (c *runConfig) options() []dsync.Option {
	opts := []dsync.Option{dsync.WithTTL(c.ttl), dsync.WithTablePrefix(c.prefix), dsync.WithReplaceLostLease()}
	if c.labelSet {
		opts = append(opts, dsync.WithLabel(c.label))
	}
	return opts
}

// connect opens the *sql.DB of --dsn and the session of dsync run or
// elect on it, within --connect-timeout. It returns both and -1 (the
// caller closes them, the session first), or the exit status when either
// could not be opened (a signal, a usage error, or the database), having
// closed what it opened.
func (c *runConfig) connect(r *relay) (*sql.DB, *dsync.Session, int) {
	db, err := openDB(c.dsn)
	if err != nil {
		return nil, nil, unavailable(err)
	}
	s, code := c.newSession(r, db)
	if code >= 0 {
		db.Close()
		return nil, nil, code
	}
	return db, s, -1
}

// newSession opens the session of dsync run or elect on db within
// --connect-timeout. It returns -1 and the session, or the exit status
// when none could be opened (a signal, a usage error, or the database).
func (c *runConfig) newSession(r *relay, db *sql.DB) (*dsync.Session, int) {
	setup, cancel := context.WithTimeout(r.ctx, c.connectTimeout)
	s, err := dsync.NewSession(setup, db, c.options()...)
	cancel()
	if err != nil {
		if sig, ok := r.received(); ok {
			return nil, exitSignal + int(sig)
		}
		if errors.Is(err, dsync.ErrInvalidOption) {
			return nil, usageError(err.Error())
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no session within --connect-timeout %v: %w", c.connectTimeout, err)
		}
		return nil, unavailable(err)
	}
	return s, -1
}

// run connects, takes the lock, runs the command and releases the lock,
// and returns the exit status.
func (c *runConfig) run() int {
	r := newRelay()
	defer r.stop()

	db, s, code := c.connect(r)
	if code >= 0 {
		return code
	}
	defer db.Close()
	defer func() {
		if err := s.Close(); err != nil {
			fmt.Fprintf(stderr, "dsync: %s\n", errText(err.Error()))
		}
	}()

	l := c.newLock(s)
	if code := c.acquire(r, db, s, l); code >= 0 {
		return code
	}
	code, lost := c.runCommand(r, db, s, l)
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	switch err := l.unlock(ctx); {
	case err == nil || lost:
	case errors.Is(err, dsync.ErrNotHeld):
		// Freed by dsync release --force (ErrReleasedByForce) before
		// watchHold saw it, or taken over after the lease lapsed
		// unnoticed: the command ran its last moments, at least, without
		// the lock, and another may have held it meanwhile. A lost hold,
		// as a lost lease.
		why := "was released by force (dsync release --force)"
		if !errors.Is(err, dsync.ErrReleasedByForce) {
			why = fmt.Sprintf("was not held any more (%s)", errText(err.Error()))
		}
		fmt.Fprintf(stderr, "dsync: %s %s while %s ran (it exited %d): the hold was lost, exit %d\n",
			c.what(), why, c.argv[0], code, exitLeaseLost)
		return exitLeaseLost
	default:
		fmt.Fprintf(stderr, "dsync: %s (the lock is freed as the session closes)\n", errText(err.Error()))
	}
	return code
}

// acquire takes the lock. It returns -1 once the lock is held, else the
// exit status.
func (c *runConfig) acquire(r *relay, db *sql.DB, s *dsync.Session, l *lock) int {
	// --wait bounds the first try too, and so does --connect-timeout with
	// --nonblock: a try on a lease lost since NewSession waits for a new
	// one (WithReplaceLostLease), as long as the database is out.
	ctx := r.ctx
	if c.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.wait)
		defer cancel()
	}
	tryCtx := ctx
	if c.nonblock {
		var cancel context.CancelFunc
		tryCtx, cancel = context.WithTimeout(ctx, c.connectTimeout)
		defer cancel()
	}
	ok, err := l.try(tryCtx)
	if c.nonblock && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no lease within --connect-timeout %v: %w", c.connectTimeout, err)
		return unavailable(err)
	}
	if err == nil && !ok && !c.nonblock {
		if !c.quiet {
			c.sayWaiting(r.ctx, db, l)
		}
		stop := c.reportNewLeases(s)
		err = l.lock(ctx)
		stop()
		ok = err == nil
	}
	if sig, received := r.received(); received {
		// A Lock that ctx ended holds nothing (an acquisition that landed
		// was undone); one that won the race is released here.
		if ok {
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			_ = l.unlock(ctx)
		}
		return exitSignal + int(sig)
	}
	switch {
	case ok:
		return -1
	case err == nil:
		fmt.Fprintf(stderr, "dsync: %s not obtained: it is taken (--nonblock)\n", c.what())
		return c.conflict
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "dsync: %s not obtained within --wait %v\n", c.what(), c.wait)
		return c.conflict
	case errors.Is(err, dsync.ErrOtherKind):
		// At once, whatever --wait says: the name stays bound to the other
		// kind while its rows exist, so waiting would not end.
		takes := "dsync run takes a Mutex, with --fair, --read or --write the queued lock of the name, and with --limit its Semaphore"
		if c.kind == kindElect {
			takes = "dsync elect campaigns in the Election of the name"
		}
		fmt.Fprintf(stderr, "dsync: %s; the command did not run (%s)\n", errText(err.Error()), takes)
		return exitOtherKind
	case errors.Is(err, dsync.ErrLimitMismatch):
		// At once, as for ErrOtherKind: the name's limit stands while its
		// rows exist.
		fmt.Fprintf(stderr, "dsync: %s; the command did not run (--limit %d)\n", errText(err.Error()), c.limit)
		return exitOtherKind
	case errors.Is(err, dsync.ErrInvalidName), errors.Is(err, dsync.ErrValueTooLong):
		return usageError(err.Error())
	}
	return unavailable(err)
}

// reportNewLeases says on stderr, while dsync waits for the lock, each time
// the session's lease is lost and each time the session has opened a new
// one to go on waiting with. It returns the function that stops it.
func (c *runConfig) reportNewLeases(s *dsync.Session) (stop func()) {
	quit, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			id := s.ID() // before Done: a Done of a lease replaced since is closed, never missed
			select {
			case <-s.Done():
			case <-quit:
				return
			}
			if errors.Is(s.Err(), dsync.ErrSessionClosed) {
				return
			}
			fmt.Fprintf(stderr, "dsync: session %d lost while waiting for %s; opening a new one to wait on\n", id, c.what())
			tick := time.NewTicker(leasePoll)
			stopped := false
			for s.ID() == id && !stopped {
				select {
				case <-tick.C:
				case <-quit:
					stopped = true // the Lock returned: under a new lease, maybe
				}
			}
			tick.Stop()
			if next := s.ID(); next != id {
				fmt.Fprintf(stderr, "dsync: waiting for %s with new session %d\n", c.what(), next)
			}
			if stopped {
				return
			}
		}
	}()
	return func() { close(quit); <-ended }
}

// leasePoll is how often reportNewLeases looks whether the session has
// opened its new lease (a local look, no statement).
const leasePoll = 50 * time.Millisecond

// sayWaiting prints once on stderr which lock dsync waits for and who holds
// it, as far as a quick look at the tables tells.
func (c *runConfig) sayWaiting(ctx context.Context, db *sql.DB, l *lock) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	holders, _ := dsync.LockHolders(ctx, db, c.prefix, c.name)
	var blocking []dsync.LockInfo
	for _, h := range holders {
		if l.space(h.Kind) {
			blocking = append(blocking, h)
		}
	}
	msg := fmt.Sprintf("dsync: waiting for %s", c.what())
	if c.election != nil {
		if ld, err := c.election.Leader(ctx); err == nil {
			msg += fmt.Sprintf(", led by session %d (%q, term %d)", ld.Session, ld.Value, ld.Term)
		}
	}
	if len(blocking) > 0 {
		h := blocking[0]
		msg += fmt.Sprintf(" held by %s for %s", h.Holder, roughly(h.Held))
		if n := len(blocking) - 1; n > 0 {
			msg += fmt.Sprintf(" (and %d more holders)", n)
		}
	}
	fmt.Fprintln(stderr, msg)
}

// runCommand runs the command while the lock is held and returns its exit
// status, and whether the hold was lost meanwhile, with the lease or by a
// forced release (the status is then exitLeaseLost). It returns once the
// command's process group is empty (see watchCommand).
func (c *runConfig) runCommand(r *relay, db *sql.DB, s *dsync.Session, l *lock) (code int, lost bool) {
	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"DSYNC_LOCK="+c.name,
		"DSYNC_FENCE="+strconv.FormatInt(l.fence(), 10),
		"DSYNC_SESSION="+strconv.FormatInt(s.ID(), 10))
	if c.kind == kindElect {
		cmd.Env = append(cmd.Env, "DSYNC_TERM="+strconv.FormatInt(l.fence(), 10))
	}
	fg := foreground()
	cmd.SysProcAttr = childAttr(fg)
	adoptOrphans()
	started, err := r.start(cmd)
	if fg {
		// The command may have taken the terminal, even if it then failed
		// to start: take it back when it is done (see afterStart).
		afterStart()
		defer takeTerminalBack()
	}
	switch {
	case err != nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist)):
		fmt.Fprintf(stderr, "dsync: %s\n", errText(err.Error()))
		return exitNotFound, false
	case err != nil:
		fmt.Fprintf(stderr, "dsync: %s\n", errText(err.Error()))
		return exitCannotRun, false
	case !started:
		sig, _ := r.received()
		return exitSignal + int(sig), false
	}

	pid := cmd.Process.Pid // waitChild releases cmd.Process
	waited := make(chan int, 1)
	leaseHolds := func() bool { return s.Err() == nil && time.Until(s.Deadline()) > c.grace }
	go func() { waited <- waitChild(cmd, fg, leaseHolds) }()
	watching, stopWatching := context.WithCancel(context.Background())
	released := c.watchHold(watching, db, s, l)
	code, lost = c.watchCommand(s, pid, fg, waited, released)
	stopWatching()
	r.exited()
	if !lost && errors.Is(s.Err(), dsync.ErrSessionExpired) {
		// Lost as the command ended (the keep-alive had not noticed yet):
		// the command may have run its last moments without the lock.
		lost = true
		fmt.Fprintf(stderr, "dsync: lease of %s lost as %s ended\n", c.what(), c.argv[0])
	}
	if lost {
		return exitLeaseLost, true
	}
	return code, false
}

// watchCommand waits for the command (pid; its status comes on waited)
// to end, and then for its process group to be empty, while the lease
// holds, and returns the command's status: what the command left running
// in its group (a job started with &, a trap still running) runs under
// the lock too, and the lock is released only when the last of them has
// ended, as flock(1)'s is when the last process holding its descriptor
// has. Signals relayed to the command keep going to its group meanwhile.
// Ended children of dsync (the orphans it adopted, see adoptOrphans) are
// reaped as they end. With the terminal (fg), dsync takes it back when
// the command ends, as a shell does, so that Ctrl-C reaches dsync and is
// relayed to the group. When the lease is at risk first (its deadline is
// --grace away, no renewal having moved it) or lost, or when released
// closes (the lock was released by force), it stops the group (see
// stopCommand) and returns exitLeaseLost and true.
func (c *runConfig) watchCommand(s *dsync.Session, pid int, fg bool, waited <-chan int, released <-chan struct{}) (code int, stopped bool) {
	exits, stop := notifyChildExits()
	defer stop()
	var poll <-chan time.Time // ticks once the command has been reaped
	told := false             // the wait for the group's leftovers was reported
	for {
		// waited is nil once the command has been reaped.
		reapOrphans(pid, waited == nil)
		if waited == nil && groupGone(pid) {
			return code, false
		}
		left := time.Until(s.Deadline())
		if left <= c.grace {
			break
		}
		// A healthy session moves the deadline on before the timer fires;
		// then the timer is set again.
		t := time.NewTimer(left - c.grace)
		select {
		case code = <-waited:
			waited = nil
			// The terminal stays with the group until it is empty (the
			// deferred takeTerminalBack of runCommand): its keys reach the
			// processes left in it, and none can stop or kill dsync,
			// which holds the lease for them, while they run on. A member
			// of the group whose parent is outside it and not dsync ends
			// without a SIGCHLD to dsync: poll for those.
			tick := time.NewTicker(groupPoll)
			defer tick.Stop()
			poll = tick.C
		case <-exits:
		case <-poll:
			if !told {
				told = true
				fmt.Fprintf(stderr, "dsync: %s has exited; holding %s until the processes it left in its process group %d end\n",
					c.argv[0], c.what(), pid)
			}
		case <-s.Done():
			t.Stop()
			return c.stopCommand(s, pid, waited, false), true
		case <-released:
			t.Stop()
			return c.stopCommand(s, pid, waited, true), true
		case <-t.C:
		}
		t.Stop()
	}
	return c.stopCommand(s, pid, waited, false), true
}

// watchHold returns a channel that is closed when the Mutex l, held by s,
// was released by force (dsync release --force, which does not tell the
// holder), as looks at the tables every TTL/3 (the pace of the lease's
// renewals), until ctx ends, find out while s is live: at once when
// another session holds the name with a greater fence, or when two looks
// in a row find no hold of s. (Not one: on a Galera node, or a replica,
// that has not yet applied the acquisition, a look misses a hold that is
// there; one that shows a later hold has applied the release.) A look that
// fails counts for nothing: the lease's renewals judge the database. The
// channel of the queued kinds, which release --force does not free, is nil.
func (c *runConfig) watchHold(ctx context.Context, db *sql.DB, s *dsync.Session, l *lock) <-chan struct{} {
	if c.kind != kindMutex {
		return nil
	}
	released := make(chan struct{})
	fence := l.fence()
	every := s.TTL() / 3
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		misses := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			look, cancel := context.WithTimeout(ctx, every)
			holders, err := dsync.LockHolders(look, db, c.prefix, c.name)
			cancel()
			if err != nil || s.Err() != nil {
				// s.Err() after the look: the look saw a live lease of s.
				continue
			}
			held, later := false, false
			for _, h := range holders {
				if h.Kind != dsync.KindMutex {
					continue
				}
				held = held || h.Session == s.ID() && h.Fence == fence
				later = later || h.Fence > fence
			}
			if held {
				misses = 0
				continue
			}
			if misses++; later || misses >= 2 {
				close(released)
				return
			}
		}
	}()
	return released
}

// groupPoll is how often watchCommand looks whether the command's process
// group is empty, once the command has ended, besides each SIGCHLD: the
// lock stays held meanwhile, so a slow look only delays its release.
const groupPoll = 100 * time.Millisecond

// stopCommand ends the command's process group, whose lease is at risk or
// lost, or whose lock was released by force (forced) (waited is nil when
// the command itself has already been reaped): SIGTERM now, and SIGKILL
// --grace later, but no later than the lease's deadline or the end of the
// session (at once when that has come).
// It returns once the command has been reaped and its group is empty,
// which SIGKILL at the deadline leaves TTL/5 for: the server keeps the
// lease at least that much longer, so nobody else can hold the lock yet.
// A process that SIGKILL cannot end in that time (stuck in the kernel) is
// reported and left behind: stopCommand returns then anyway. The status
// is always exitLeaseLost.
func (c *runConfig) stopCommand(s *dsync.Session, pid int, waited <-chan int, forced bool) int {
	start := time.Now()
	killAt := start.Add(c.grace)
	if d := s.Deadline(); d.Before(killAt) {
		killAt = d
	}
	byForce := fmt.Sprintf("%s released by force (dsync release --force) while %s ran", c.what(), c.argv[0])
	killed := false
	kill := func(why string) {
		fmt.Fprintf(stderr, "dsync: %s: sending %s SIGKILL\n", why, c.argv[0])
		signalChild(pid, syscall.SIGKILL)
		killed = true
	}
	select {
	case <-s.Done():
		kill(fmt.Sprintf("lease of %s lost while %s ran", c.what(), c.argv[0]))
	default:
		if forced && !start.Before(killAt) {
			kill(byForce)
			break
		}
		if forced {
			fmt.Fprintf(stderr, "dsync: %s: sending %s SIGTERM, and SIGKILL in %v\n", byForce, c.argv[0], killAt.Sub(start).Round(time.Millisecond))
			signalChild(pid, syscall.SIGTERM)
			continueChild(pid)
			break
		}
		if !start.Before(killAt) {
			kill(fmt.Sprintf("lease of %s lost now (renewals failed)", c.what()))
			break
		}
		fmt.Fprintf(stderr, "dsync: lease of %s at risk (renewals failing; lost in %v): sending %s SIGTERM, and SIGKILL in %v\n",
			c.what(), time.Until(s.Deadline()).Round(time.Millisecond), c.argv[0], killAt.Sub(start).Round(time.Millisecond))
		signalChild(pid, syscall.SIGTERM)
		continueChild(pid) // in case it is stopped
	}
	reaped := waited == nil
	done := s.Done() // nil once the command got SIGKILL
	if killed {
		done = nil
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if reaped {
			// Members of the group left behind by the command are
			// dsync's children now (see reapOrphans).
			reapOrphans(pid, true)
			if groupGone(pid) {
				return exitLeaseLost
			}
		}
		now := time.Now()
		if !killed && !now.Before(killAt) {
			done = nil
			as := fmt.Sprintf("as the lease of %s ends", c.what())
			if forced {
				as = "--grace " + c.grace.String()
			}
			kill(fmt.Sprintf("%s or its process group still runs %v after SIGTERM, %s",
				c.argv[0], now.Sub(start).Round(time.Millisecond), as))
		}
		giveUp := s.Deadline().Add(s.TTL() / 5)
		if forced && killAt.Add(s.TTL()/5).Before(giveUp) {
			// The lease is healthy and its deadline moves on: give up as
			// if it ended at killAt.
			giveUp = killAt.Add(s.TTL() / 5)
		}
		if !now.Before(giveUp) {
			fmt.Fprintf(stderr, "dsync: processes of %s (process group %d) still exist after SIGKILL, and the lock may pass to another holder now\n", c.argv[0], pid)
			return exitLeaseLost
		}
		select {
		case <-waited:
			reaped = true
			waited = nil
		case <-done:
			kill(fmt.Sprintf("lease of %s lost while %s ran", c.what(), c.argv[0]))
			done = nil
		case <-tick.C:
		}
	}
}

// lock is the lock of a dsync run, whatever its kind.
type lock struct {
	try    func(context.Context) (bool, error)
	lock   func(context.Context) error
	unlock func(context.Context) error
	fence  func() int64
	space  func(dsync.LockKind) bool // whether holds of this kind can block it
}

// newLock returns the lock of kind called name in s.
func newLock(s *dsync.Session, kind, name string, limit int64) *lock {
	queued := func(k dsync.LockKind) bool { return k != dsync.KindMutex }
	switch kind {
	case kindLimit:
		// One permit per run; the fence is its acquisition's.
		m := dsync.NewSemaphore(s, name, limit)
		var fence int64
		return &lock{
			func(ctx context.Context) (bool, error) {
				f, err := m.TryAcquireFence(ctx, 1)
				fence = f
				return f > 0, err
			},
			func(ctx context.Context) (err error) {
				fence, err = m.AcquireFence(ctx, 1)
				return err
			},
			func(ctx context.Context) error { return m.Release(ctx, 1) },
			func() int64 { return fence },
			func(k dsync.LockKind) bool { return k == dsync.KindSemaphore },
		}
	case kindFair:
		m := dsync.NewFairMutex(s, name)
		return &lock{m.TryLock, m.Lock, m.Unlock, m.Fence, queued}
	case kindRead:
		rw := dsync.NewRWMutex(s, name)
		return &lock{rw.TryRLock, rw.RLock, rw.RUnlock, func() int64 { return 0 }, queued}
	case kindWrite:
		rw := dsync.NewRWMutex(s, name)
		return &lock{rw.TryLock, rw.Lock, rw.Unlock, rw.Fence, queued}
	}
	m := dsync.NewMutex(s, name)
	return &lock{m.TryLock, m.Lock, m.Unlock, m.Fence, func(k dsync.LockKind) bool { return k == dsync.KindMutex }}
}

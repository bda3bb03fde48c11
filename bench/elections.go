package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dsynclock/dsync"
)

// An electionSystem is one leader election under test: dsync's Election
// or etcd's concurrency.Election.
type electionSystem struct {
	key    string // short identifier, used in the tables and -systems
	name   string // what it is, for the report
	server string
	// newSession opens one client session with a lease of ttl (0: the
	// system's default): what one process would have.
	newSession func(ctx context.Context, ttl time.Duration) (electSession, error)
	// child is the leader-child system name and address (see leaderChild).
	child, addr string
	statements  func(ctx context.Context) (int64, error)
	countDesc   string
	selfCount   int64
}

// An electSession is one client's session of an election system.
type electSession interface {
	election(name string) elector
	close() error
}

// An elector is one campaigner (and observer) of an election.
type elector interface {
	Campaign(ctx context.Context, value string) error
	Proclaim(ctx context.Context, value string) error
	Resign(ctx context.Context) error
	// term is the fencing token of this campaigner's leadership: dsync's
	// Term, etcd's Rev (the leader key's creation revision).
	term() int64
	// observe returns the values of the leaders Observe delivers.
	observe(ctx context.Context) <-chan string
}

// electionSystems returns the election systems, dsync's first.
func (e *env) electionSystems() []*electionSystem {
	dsn := e.srv.mysqlDSN()
	return []*electionSystem{
		{key: "election", name: "dsync `Election`", server: "mariadb", child: "dsync", addr: dsn,
			newSession: func(ctx context.Context, ttl time.Duration) (electSession, error) {
				var opts []dsync.Option
				if ttl > 0 {
					opts = append(opts, dsync.WithTTL(ttl))
				}
				return newDsyncSession(ctx, dsn, e.prefix, "election", opts...)
			},
			statements: e.questions, countDesc: "MariaDB `Questions` (SHOW GLOBAL STATUS)", selfCount: 1},
		{key: "etcd-election", name: "etcd `concurrency.Election`", server: "etcd", child: "etcd", addr: e.srv.etcdURL,
			newSession: func(ctx context.Context, ttl time.Duration) (electSession, error) {
				return newEtcdSessionTTL(ctx, e.srv.etcdURL, &e.etcdRPCs, ttl)
			},
			statements: func(context.Context) (int64, error) { return e.etcdRPCs.Load(), nil },
			countDesc:  "unary gRPC calls sent by the clients (Observe's watch is a stream, not counted)"},
	}
}

func (d *dsyncSession) election(name string) elector {
	return dsyncElector{dsync.NewElection(d.s, name)}
}

// dsyncElector is a dsync Election as an elector.
type dsyncElector struct{ *dsync.Election }

func (e dsyncElector) term() int64 { return e.Term() }

func (e dsyncElector) observe(ctx context.Context) <-chan string {
	return relay(ctx, e.Observe(ctx), func(l dsync.Leader) string { return l.Value })
}

func (e *etcdSession) election(name string) elector {
	return etcdElector{concurrency.NewElection(e.s, etcdElectionPrefix(name))}
}

// etcdElectionPrefix is the etcd key prefix of the election called name.
func etcdElectionPrefix(name string) string {
	return "/bench-elect/" + strings.ReplaceAll(name, "/", "_")
}

// etcdElector is an etcd concurrency.Election as an elector.
type etcdElector struct{ *concurrency.Election }

func (e etcdElector) term() int64 { return e.Rev() }

func (e etcdElector) observe(ctx context.Context) <-chan string {
	return relay(ctx, e.Observe(ctx), func(r clientv3.GetResponse) string {
		if len(r.Kvs) == 0 {
			return ""
		}
		return string(r.Kvs[0].Value)
	})
}

// relay passes what in delivers on as value(delivery) until in closes or
// ctx ends, then closes its channel.
func relay[T any](ctx context.Context, in <-chan T, value func(T) string) <-chan string {
	out := make(chan string)
	go func() {
		defer close(out)
		for v := range in {
			select {
			case out <- value(v):
			case <-ctx.Done():
				// Drain in: it closes once its ctx, the same, has ended.
				for range in {
				}
				return
			}
		}
	}()
	return out
}

// newEtcdSessionTTL is newEtcdSession with a lease of ttl (0: etcd's
// default, 60 s; etcd raises a TTL below its minimum, 2 s by default).
func newEtcdSessionTTL(ctx context.Context, endpoint string, rpcs *atomic.Int64, ttl time.Duration) (*etcdSession, error) {
	var opts []concurrency.SessionOption
	if ttl > 0 {
		opts = append(opts, concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
	}
	return newEtcdSession(ctx, endpoint, rpcs, opts...)
}

// childArg is the first argument that makes this program a leader child.
const childArg = "leader-child"

// leaderChild is the program run as a leader child: with its arguments
// SYSTEM ADDR PREFIX NAME TTL it opens a session of SYSTEM ("dsync" or
// "etcd") at ADDR with a lease of TTL, campaigns for NAME, prints
// "leading TERM" once it leads and then waits until its standard input
// ends, which it does when the parent kills it: a process that dies
// leading, with its lease unreleased. It returns the exit code.
func leaderChild(args []string) int {
	if len(args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: bench", childArg, "SYSTEM ADDR PREFIX NAME TTL")
		return 64
	}
	system, addr, prefix, name := args[0], args[1], args[2], args[3]
	ttl, err := time.ParseDuration(args[4])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 64
	}
	ctx := context.Background()
	var s electSession
	switch system {
	case "dsync":
		s, err = newDsyncSession(ctx, addr, prefix, "election", dsync.WithTTL(ttl))
	case "etcd":
		var rpcs atomic.Int64
		s, err = newEtcdSessionTTL(ctx, addr, &rpcs, ttl)
	default:
		err = fmt.Errorf("unknown system %q", system)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: leader child:", err)
		return 1
	}
	el := s.election(name)
	if err := el.Campaign(ctx, "child"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: leader child: campaign:", err)
		return 1
	}
	fmt.Printf("leading %d\n", el.term())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0 // the parent ended without killing this process: let go
}

// A child is a leader child process (see leaderChild).
type child struct {
	cmd   *exec.Cmd
	stdin io.Closer
	term  int64
}

// startLeaderChild starts a leader child of sys campaigning for name with
// a lease of ttl and waits until it leads.
func startLeaderChild(ctx context.Context, sys *electionSystem, prefix, name string, ttl time.Duration) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, childArg, sys.child, sys.addr, prefix, name, ttl.String())
	cmd.Stderr = os.Stderr
	// The child dies with this process, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		if t, found := strings.CutPrefix(l, "leading "); ok && found {
			if c.term, err = strconv.ParseInt(t, 10, 64); err == nil {
				return c, nil
			}
		}
		c.kill()
		return nil, fmt.Errorf("leader child: said %q, not that it leads", l)
	case <-time.After(lockTimeout):
		c.kill()
		return nil, errors.New("leader child did not lead within " + lockTimeout.String())
	case <-ctx.Done():
		c.kill()
		return nil, ctx.Err()
	}
}

// kill ends the child with SIGKILL, as a crash would, and reaps it.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
	c.stdin.Close()
}

// failoverResult is one run of the failover scenario for one system.
type failoverResult struct {
	p50, max time.Duration // from the leader's death to the next leader's Campaign returning
}

// failover measures, samples times, how long after its leader dies an
// election has its next leader: a leader child process (a lease of ttl)
// leads, a campaigner of this process waits in line, the child is killed
// with SIGKILL at a random phase of its lease's renewals (it neither
// resigns nor releases its lease; its connections close with it), and the
// time from the kill to the waiting Campaign's return is taken. The new
// leader's term must exceed the dead one's.
func failover(ctx context.Context, sys *electionSystem, prefix, name string, ttl time.Duration, samples int) (failoverResult, error) {
	s, err := sys.newSession(ctx, ttl)
	if err != nil {
		return failoverResult{}, err
	}
	defer s.close()
	w := s.election(name)
	type got struct {
		at  time.Time
		err error
	}
	var d []time.Duration
	for range samples {
		c, err := startLeaderChild(ctx, sys, prefix, name, ttl)
		if err != nil {
			return failoverResult{}, err
		}
		ch := make(chan got, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, lockTimeout)
			defer cancel()
			err := w.Campaign(cctx, "waiter")
			ch <- got{time.Now(), err}
		}()
		// The waiter is in line by then; the kill falls at a random phase
		// of the child's renewals (every TTL/3 for both systems).
		time.Sleep(300*time.Millisecond + rand.N(ttl/3))
		select {
		case g := <-ch:
			c.kill()
			return failoverResult{}, fmt.Errorf("Campaign returned while the child led (err %v)", g.err)
		default:
		}
		t0 := time.Now()
		c.kill()
		g := <-ch
		if g.err != nil {
			return failoverResult{}, fmt.Errorf("Campaign after the leader's death: %w", g.err)
		}
		d = append(d, g.at.Sub(t0))
		if t := w.term(); t <= c.term {
			return failoverResult{}, fmt.Errorf("the new leader's term %d does not exceed the dead leader's %d", t, c.term)
		}
		if err := w.Resign(ctx); err != nil {
			return failoverResult{}, err
		}
	}
	return failoverResult{p50: percentile(d, 50), max: percentile(d, 100)}, nil
}

// resignHandoff measures the handoff scenario on elections: the time
// from the leader's Resign call to the return of the Campaign of a
// campaigner of another session that was already waiting, samples times;
// the two sessions take turns, after a lead of 5-15 ms.
func resignHandoff(ctx context.Context, es *electionSystem, name string, samples int) (p50, p99 time.Duration, err error) {
	sys := &system{key: es.key, name: es.name, server: es.server, exclusive: true,
		newSession: func(ctx context.Context) (session, error) {
			s, err := es.newSession(ctx, 0)
			if err != nil {
				return nil, err
			}
			return campaigns{s}, nil
		}}
	return handoff(ctx, sys, name, samples)
}

// campaigns is an election session as a lock session: a lock's Lock is a
// Campaign, its Unlock a Resign.
type campaigns struct{ electSession }

func (c campaigns) lock(name string) locker {
	el := c.election(name)
	return lockFuncs{func(ctx context.Context) error { return el.Campaign(ctx, "leader") }, el.Resign}
}

// observeResult is one run of the observe-latency scenario.
type observeResult struct {
	p50, p99 time.Duration // from the Proclaim call to the observer's delivery of its value
	proclaim time.Duration // p50 of the Proclaim call itself
}

// observeLatency measures, samples times, the time from a leader's
// Proclaim call to the delivery of the value proclaimed on the Observe
// channel of an observer in another session, after a pause of 5-15 ms.
func observeLatency(ctx context.Context, sys *electionSystem, name string, samples int) (observeResult, error) {
	ss, err := openElectSessions(ctx, sys, 2)
	if err != nil {
		return observeResult{}, err
	}
	defer closeSessions(ss)
	leader := ss[0].election(name)
	if err := leader.Campaign(ctx, "v-start"); err != nil {
		return observeResult{}, err
	}
	defer leader.Resign(ctx)
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	type delivery struct {
		value string
		at    time.Time
	}
	deliveries := make(chan delivery, 16)
	obs := ss[1].election(name).observe(octx)
	go func() {
		defer close(deliveries)
		for v := range obs {
			select {
			case deliveries <- delivery{v, time.Now()}:
			case <-octx.Done():
			}
		}
	}()
	await := func(value string) (time.Time, error) {
		timeout := time.After(lockTimeout)
		for {
			select {
			case dl, ok := <-deliveries:
				if !ok {
					return time.Time{}, errors.New("the Observe channel closed")
				}
				if dl.value == value {
					return dl.at, nil
				}
			case <-timeout:
				return time.Time{}, fmt.Errorf("%q not observed within %v", value, lockTimeout)
			}
		}
	}
	if _, err := await("v-start"); err != nil {
		return observeResult{}, err
	}
	var d, pd []time.Duration
	for i := range samples {
		time.Sleep(5*time.Millisecond + rand.N(10*time.Millisecond))
		v := "v-" + strconv.Itoa(i)
		t0 := time.Now()
		if err := leader.Proclaim(ctx, v); err != nil {
			return observeResult{}, err
		}
		pd = append(pd, time.Since(t0))
		t1, err := await(v)
		if err != nil {
			return observeResult{}, err
		}
		d = append(d, t1.Sub(t0))
	}
	return observeResult{p50: percentile(d, 50), p99: percentile(d, 99), proclaim: percentile(pd, 50)}, nil
}

// idleObservers counts the statements the server receives while
// observers sessions observe an election whose leader changes nothing,
// for d, against a baseline of the same sessions idle for d with the
// same leader.
func idleObservers(ctx context.Context, sys *electionSystem, name string, observers int, d time.Duration) (idleResult, error) {
	ss, err := openElectSessions(ctx, sys, observers+1)
	if err != nil {
		return idleResult{}, err
	}
	defer closeSessions(ss)
	leader := ss[0].election(name)
	if err := leader.Campaign(ctx, "idle"); err != nil {
		return idleResult{}, err
	}
	defer leader.Resign(ctx)
	time.Sleep(300 * time.Millisecond) // let the sessions' start-up settle
	var r idleResult
	if r.baseline, err = countStatements(ctx, sys.statements, sys.selfCount, d); err != nil {
		return r, err
	}
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, s := range ss[1:] {
		ch := s.election(name).observe(octx)
		select {
		case <-ch: // the current leader
		case <-time.After(lockTimeout):
			return r, errors.New("an observer saw no leader")
		}
		go func() {
			for range ch {
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the observers' first reads are not idle
	if r.waiting, err = countStatements(ctx, sys.statements, sys.selfCount, d); err != nil {
		return r, err
	}
	r.perWaiter = (r.waiting - r.baseline) / float64(observers)
	return r, nil
}

// openElectSessions opens n sessions of sys with its default TTL; on error
// it closes those opened.
func openElectSessions(ctx context.Context, sys *electionSystem, n int) ([]electSession, error) {
	return openAll(ctx, sys.key, n, func(ctx context.Context) (electSession, error) { return sys.newSession(ctx, 0) })
}

// electionScenarios runs the election scenarios -only selects on es, run
// runNo, adding their figures to res; handFloor is the run's handoff
// floor p50.
func electionScenarios(ctx context.Context, p params, e *env, res *results, es *electionSystem, runNo int, handFloor time.Duration, fail func(string, ...any)) {
	if p.wants("failover") && ctx.Err() == nil {
		r, err := failover(ctx, es, e.prefix, fmt.Sprintf("fail-%s-%d", es.key, runNo), p.electTTL, p.failSamples)
		if err != nil {
			fail("failover %s: %v", es.key, err)
		} else {
			res.add("fail.p50", es.key, ms(r.p50))
			res.add("fail.max", es.key, ms(r.max))
			res.add("fail.ratio", es.key, ratioTo(ms(r.p50), ms(p.electTTL)))
			res.add("fail.ratiomax", es.key, ratioTo(ms(r.max), ms(p.electTTL)))
			res.add("fail.excess", es.key, ms(r.p50)-ms(p.electTTL))
			logf("  failover    %-16s p50 %.0f ms  longest %.0f ms  %.2fx TTL", es.key, ms(r.p50), ms(r.max), ratioTo(ms(r.p50), ms(p.electTTL)))
		}
	}
	if p.wants("resign") && ctx.Err() == nil {
		p50, p99, err := resignHandoff(ctx, es, fmt.Sprintf("resign-%s-%d", es.key, runNo), p.electSamples)
		if err != nil {
			fail("resign %s: %v", es.key, err)
		} else {
			res.add("resign.p50", es.key, ms(p50))
			res.add("resign.p99", es.key, ms(p99))
			res.add("resign.vsfloor", es.key, ratioTo(ms(p50), ms(handFloor)))
			logf("  resign      %-16s p50 %.3f ms  p99 %.3f ms  %.2fx handoff floor", es.key, ms(p50), ms(p99), ratioTo(ms(p50), ms(handFloor)))
		}
	}
	if p.wants("observe") && ctx.Err() == nil {
		r, err := observeLatency(ctx, es, fmt.Sprintf("observe-%s-%d", es.key, runNo), p.electSamples)
		if err != nil {
			fail("observe %s: %v", es.key, err)
		} else {
			res.add("obs.p50", es.key, ms(r.p50))
			res.add("obs.p99", es.key, ms(r.p99))
			res.add("obs.proclaim", es.key, ms(r.proclaim))
			res.add("obs.vsfloor", es.key, ratioTo(ms(r.p50), ms(handFloor)))
			logf("  observe     %-16s p50 %.3f ms  p99 %.3f ms  %.2fx handoff floor (Proclaim p50 %.3f ms)", es.key, ms(r.p50), ms(r.p99), ratioTo(ms(r.p50), ms(handFloor)), ms(r.proclaim))
		}
		i, err := idleObservers(ctx, es, fmt.Sprintf("observe-idle-%s-%d", es.key, runNo), p.observers, p.observeIdle)
		if err != nil {
			fail("observe %s: idle observers: %v", es.key, err)
		} else {
			res.add("obs.base", es.key, i.baseline)
			res.add("obs.wait", es.key, i.waiting)
			res.add("obs.per", es.key, i.perWaiter)
			logf("  observe     %-16s idle: baseline %.2f/s  observing %.2f/s  per observer %.2f/s", es.key, i.baseline, i.waiting, i.perWaiter)
		}
	}
}

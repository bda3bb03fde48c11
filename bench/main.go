// Command bench measures dsync against its peers in one run: it starts
// every server it needs on 127.0.0.1 (a throwaway MariaDB, two redis-server
// processes, an embedded etcd), runs the scenarios described in
// docs/BENCHMARKS.md on each lock system, stops every server again, and
// writes docs/BENCHMARKS.md and docs/benchmarks.svg. Run it with
// `make bench-peers` from the repository root.
//
// It exits non-zero when a correctness check fails (a mutual-exclusion
// violation under contention, a repeated fence) or a system errs; targets
// that are not met are reported, not failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// params are the sizes of one benchmark, set by the flags.
type params struct {
	runs          int
	quick         bool
	out           string
	names         int
	namesAge      time.Duration
	uncIters      int           // Lock+Unlock pairs timed per uncontended run
	conSessions   int           // contending sessions
	conDur        time.Duration // per contention run
	handSamples   int           // handoffs timed per run
	idleWaiters   int
	idleDur       time.Duration
	manyLocks     int
	manyHold      time.Duration
	namesSessions int
	namesPer      int // goroutines per session
	command       string
	failSamples   int             // leader deaths per run and election system
	electTTL      time.Duration   // the leases of the failover scenario
	electSamples  int             // Resign handoffs and Proclaims timed per run
	observers     int             // idle observers
	observeIdle   time.Duration   // window of the idle-observer count
	semLimit      int64           // limit of the semaphore scenario
	semHold       time.Duration   // how long each acquisition of its contention is held
	update        bool            // rewrite only the marked sections of the scenarios run
	only          map[string]bool // scenarios to run; nil: all
	systems       map[string]bool // systems to measure besides the floor; nil: all
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(leaderChild(os.Args[2:]))
	}
	code := 0
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		code = 1
	}
	os.Exit(code)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func parseFlags() params {
	var p params
	var only, systems string
	flag.IntVar(&p.runs, "runs", 3, "runs of each scenario (the distinct-names scenario runs once)")
	flag.BoolVar(&p.quick, "quick", false, "short durations and few iterations, for development and a smoke test")
	flag.StringVar(&p.out, "out", "docs", "directory to write BENCHMARKS.md and benchmarks.svg to")
	flag.IntVar(&p.names, "names", 1_000_000, "distinct names of the distinct-names scenario (quick: 20,000 unless set)")
	flag.DurationVar(&p.namesAge, "age", 30*time.Second, "free-row age (dsync.WithFreeRowAge) of the distinct-names scenario (quick: 5s unless set)")
	flag.StringVar(&p.command, "command", "", "the command line to print in the report (default: this program's)")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run (uncontended,contention,handoff,idle,many,names,failover,resign,observe,semaphore); for development: the report then lacks the others (see -update)")
	flag.StringVar(&systems, "systems", "", "comma-separated systems to measure besides the floor (floor,get_lock,mutex,mutex-cap8,mutex-cap32,fair,fair-cap8,fair-cap32,rw-writer,rw-writer-cap8,rw-reader,rw-reader-cap8,redsync,redsync-1ms,redsync-aof,redsync-1ms-aof,etcd; election,etcd-election for failover, resign and observe); for development")
	flag.BoolVar(&p.update, "update", false, "with -only of failover, resign, observe and semaphore alone: rewrite only their sections of the existing BENCHMARKS.md (each states its own command, date and load), keeping the rest and the chart")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	p.uncIters, p.conSessions, p.conDur, p.handSamples = 2000, 4, 5*time.Second, 200
	// The idle windows last a multiple of dsync's renewal period (2 s with
	// the default TTL), so that each holds the same number of renewals.
	p.idleWaiters, p.idleDur, p.manyLocks, p.manyHold = 8, 6*time.Second, 10_000, 10*time.Second
	p.namesSessions, p.namesPer = 4, 2
	// 2 s: etcd's smallest lease TTL (with its default heartbeat and
	// election timeout), and allowed by dsync (1 s at least).
	p.failSamples, p.electTTL, p.electSamples = 8, 2*time.Second, 50
	// A dsync observer of a leader that changes nothing reads at the
	// latest every 8 s: a window of two such periods.
	p.observers, p.observeIdle, p.semLimit = 4, 16*time.Second, 2
	// Holds long enough to overlap, so that the check of the limit has
	// something to check, and short beside a statement's commit.
	p.semHold = time.Millisecond
	if p.quick {
		p.failSamples, p.electSamples, p.observeIdle = 2, 10, 4*time.Second
		p.uncIters, p.conDur, p.handSamples = 200, time.Second, 30
		p.idleDur, p.manyLocks, p.manyHold = 2*time.Second, 1000, 4*time.Second
		if !set["names"] {
			p.names = 20_000
		}
		if !set["age"] {
			p.namesAge = 5 * time.Second
		}
	}
	if p.command == "" {
		p.command = "go run . " + strings.Join(os.Args[1:], " ")
	}
	p.only, p.systems = setOf(only), setOf(systems)
	return p
}

// markedScenarios are the scenarios whose sections -update rewrites.
var markedScenarios = []string{"failover", "resign", "observe", "semaphore"}

// checkUpdate returns an error when -update is given with scenarios
// whose figures it cannot keep apart from the rest of the file.
func (p params) checkUpdate() error {
	if !p.update {
		return nil
	}
	if p.only == nil {
		return errors.New("-update needs -only with some of " + strings.Join(markedScenarios, ","))
	}
	for sc := range p.only {
		if !slices.Contains(markedScenarios, sc) {
			return fmt.Errorf("-update rewrites only the sections of %s, not %q: run the whole benchmark for that", strings.Join(markedScenarios, ", "), sc)
		}
	}
	return nil
}

// wantsSystem reports whether -systems selects key (or was not given).
func (p params) wantsSystem(key string) bool { return p.systems == nil || p.systems[key] }

// setOf returns the set of a comma-separated list, nil for an empty one.
func setOf(list string) map[string]bool {
	if list == "" {
		return nil
	}
	m := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		m[strings.TrimSpace(s)] = true
	}
	return m
}

// wants reports whether -only selects scenario (or -only was not given).
func (p params) wants(scenario string) bool { return p.only == nil || p.only[scenario] }

func run() error {
	p := parseFlags()
	if p.runs < 1 || p.names < 1 {
		return errors.New("-runs and -names must be at least 1")
	}
	if err := p.checkUpdate(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	began, revision, loadStart := time.Now(), dsyncRevision(), loadAverage()

	srv, err := startServers(ctx)
	if err != nil {
		return err
	}
	defer func() {
		logf("stopping the servers")
		srv.stop()
	}()
	e := &env{srv: srv, prefix: "bench_"}
	if e.monitor, err = openDB(srv.mysqlDSN()); err != nil {
		return err
	}
	defer e.monitor.Close()
	for _, r := range srv.redis {
		c := redis.NewClient(&redis.Options{Addr: r.addr})
		defer c.Close()
		e.redisMon = append(e.redisMon, c)
	}
	var systems []*system
	for _, s := range e.systems() {
		if p.wantsSystem(s.key) || s.key == "floor" {
			systems = append(systems, s)
		}
	}
	var elections []*electionSystem
	for _, s := range e.electionSystems() {
		if p.wantsSystem(s.key) {
			elections = append(elections, s)
		}
	}
	res := newResults(systems)
	res.elections = elections
	var failures []error
	fail := func(format string, args ...any) {
		if ctx.Err() != nil {
			return // interrupted: the run ends with that error
		}
		err := fmt.Errorf(format, args...)
		logf("FAIL: %v", err)
		failures = append(failures, err)
	}

	for runNo := 1; runNo <= p.runs && ctx.Err() == nil; runNo++ {
		logf("run %d of %d", runNo, p.runs)
		var floor uncontendedResult
		if p.wants("uncontended") || p.wants("contention") || p.wants("handoff") || p.wants("semaphore") {
			for _, sys := range res.systems {
				if sys.key != "floor" && !p.wants("uncontended") {
					continue
				}
				u, err := uncontended(ctx, sys, fmt.Sprintf("unc-%s-%d", sys.key, runNo), p.uncIters)
				if err != nil {
					fail("uncontended %s: %v", sys.key, err)
					continue
				}
				if sys.key == "floor" {
					floor = u
				}
				res.add("unc.p50", sys.key, ms(u.p50))
				res.add("unc.p99", sys.key, ms(u.p99))
				res.add("unc.rate", sys.key, u.rate)
				res.add("unc.ratio", sys.key, ratioTo(ms(u.p50), ms(floor.p50)))
				res.add("unc.ratio99", sys.key, ratioTo(ms(u.p99), ms(floor.p99)))
				logf("  uncontended %-16s p50 %.3f ms  p99 %.3f ms  %.2fx floor", sys.key, ms(u.p50), ms(u.p99), ratioTo(ms(u.p50), ms(floor.p50)))
			}
		}
		if p.wants("contention") {
			for _, sys := range res.exclusive() {
				c, err := contention(ctx, sys, fmt.Sprintf("con-%s-%d", sys.key, runNo), p.conSessions, p.conDur, 1, 0)
				if err != nil {
					fail("contention %s: %v", sys.key, err)
				}
				if c.violations > 0 {
					fail("contention %s: %d mutual-exclusion violations", sys.key, c.violations)
				}
				res.add("con.acq", sys.key, c.perSecond(c.acquisitions))
				res.add("con.handoffs", sys.key, c.perSecond(c.handoffs))
				res.add("con.share", sys.key, 100*float64(c.handoffs)/math.Max(1, float64(c.acquisitions)))
				res.add("con.longest", sys.key, ms(c.longestWait))
				res.add("con.violations", sys.key, float64(c.violations))
				res.add("con.vsfloor", sys.key, ratioTo(c.perSecond(c.acquisitions), floor.rate))
				logf("  contention  %-16s %.0f acq/s  %.0f handoffs/s  longest %.1f ms  violations %d",
					sys.key, c.perSecond(c.acquisitions), c.perSecond(c.handoffs), ms(c.longestWait), c.violations)
			}
		}
		var handFloor time.Duration
		if p.wants("handoff") || p.wants("resign") || p.wants("observe") {
			if sys := res.system("floor"); sys != nil {
				p50, p99, err := handoffFloor(ctx, sys, fmt.Sprintf("hand-floor-%d", runNo), p.handSamples)
				if err != nil {
					fail("handoff floor: %v", err)
				} else {
					handFloor = p50
					res.add("hfloor.p50", sys.key, ms(p50))
					res.add("hfloor.p99", sys.key, ms(p99))
					if p.wants("handoff") {
						res.add("hand.p50", sys.key, ms(p50))
						res.add("hand.p99", sys.key, ms(p99))
						res.add("hand.ratio", sys.key, ratioTo(ms(p50), ms(floor.p50)))
						res.add("hand.vsfloor", sys.key, 1)
					}
					logf("  handoff     %-16s p50 %.3f ms  p99 %.3f ms", sys.key, ms(p50), ms(p99))
				}
			}
		}
		if p.wants("handoff") {
			for _, sys := range res.systems {
				if !sys.exclusive && !sys.readers {
					continue
				}
				p50, p99, err := handoff(ctx, sys, fmt.Sprintf("hand-%s-%d", sys.key, runNo), p.handSamples)
				if err != nil {
					fail("handoff %s: %v", sys.key, err)
					continue
				}
				res.add("hand.p50", sys.key, ms(p50))
				res.add("hand.p99", sys.key, ms(p99))
				res.add("hand.ratio", sys.key, ratioTo(ms(p50), ms(floor.p50)))
				res.add("hand.vsfloor", sys.key, ratioTo(ms(p50), ms(handFloor)))
				logf("  handoff     %-16s p50 %.3f ms  p99 %.3f ms  %.2fx handoff floor", sys.key, ms(p50), ms(p99), ratioTo(ms(p50), ms(handFloor)))
			}
		}
		if p.wants("idle") {
			for _, sys := range res.systems {
				if !sys.exclusive && !sys.readers {
					continue
				}
				r, err := idle(ctx, sys, fmt.Sprintf("idle-%s-%d", sys.key, runNo), p.idleWaiters, p.idleDur)
				if err != nil {
					fail("idle %s: %v", sys.key, err)
					continue
				}
				res.add("idle.base", sys.key, r.baseline)
				res.add("idle.wait", sys.key, r.waiting)
				res.add("idle.per", sys.key, r.perWaiter)
				logf("  idle        %-16s baseline %.2f/s  waiting %.2f/s  per waiter %.2f/s", sys.key, r.baseline, r.waiting, r.perWaiter)
			}
		}
		if p.wants("many") {
			for _, sys := range res.systems {
				if sys.key != "mutex" && sys.key != "get_lock" {
					continue
				}
				r, err := holdMany(ctx, sys, fmt.Sprintf("many-%s-%d", sys.key, runNo), p.manyLocks, p.manyHold)
				if err != nil {
					fail("many %s: %v", sys.key, err)
					continue
				}
				res.add("many.acq", sys.key, r.acquire.Seconds())
				res.add("many.rate", sys.key, float64(p.manyLocks)/r.acquire.Seconds())
				res.add("many.stmts", sys.key, r.perSecond)
				logf("  many        %-16s %d locks in %.2fs; %.2f statements/s while held", sys.key, p.manyLocks, r.acquire.Seconds(), r.perSecond)
			}
		}
		for _, es := range elections {
			electionScenarios(ctx, p, e, res, es, runNo, handFloor, fail)
		}
		if p.wants("semaphore") && p.wantsSystem("semaphore") {
			semaphoreScenarios(ctx, p, e, res, runNo, floor, fail)
		}
	}
	var names *namesResult
	if p.wants("names") && ctx.Err() == nil {
		logf("distinct names: %d, age %v", p.names, p.namesAge)
		r, err := distinctNames(ctx, e, p.names, p.namesSessions, p.namesPer, p.namesAge, 2*time.Second)
		if err != nil {
			fail("distinct names: %v", err)
		} else {
			names = &r
			if r.fenceRepeats > 0 || r.zeroFences > 0 {
				fail("distinct names: %d fences repeated, %d acquisitions without a fence", r.fenceRepeats, r.zeroFences)
			}
			logf("  names %d in %.1fs (%.0f/s); peak %d rows; back to 1%% after %v; %d re-locked, %d repeats",
				r.n, r.elapsed.Seconds(), r.rate, r.peakRows, r.backAfter, r.sampled, r.fenceRepeats)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	rep := report{p: p, res: res, names: names, srv: srv, began: began, revision: revision, took: time.Since(began), failures: failures,
		loadStart: loadStart, loadEnd: loadAverage()}
	if p.update {
		path := filepath.Join(p.out, "BENCHMARKS.md")
		if err := rep.update(path); err != nil {
			return err
		}
		logf("rewrote the sections of %s in %s (%v)", strings.Join(slices.Sorted(maps.Keys(p.only)), ", "), path, time.Since(began).Round(time.Second))
		return errors.Join(failures...)
	}
	if err := os.MkdirAll(p.out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.out, "benchmarks.svg"), rep.svg(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.out, "BENCHMARKS.md"), rep.markdown(), 0o644); err != nil {
		return err
	}
	logf("wrote %s and %s (%v)", filepath.Join(p.out, "BENCHMARKS.md"), filepath.Join(p.out, "benchmarks.svg"), time.Since(began).Round(time.Second))
	return errors.Join(failures...)
}

// ratioTo returns a/b, NaN when b is not positive.
func ratioTo(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}

// results holds every figure of every run, by metric and system.
type results struct {
	systems   []*system
	elections []*electionSystem
	figs      map[string]*spread // metric + "|" + system key
}

func newResults(systems []*system) *results {
	return &results{systems: systems, figs: map[string]*spread{}}
}

func (r *results) add(metric, key string, v float64) {
	k := metric + "|" + key
	if r.figs[k] == nil {
		r.figs[k] = &spread{}
	}
	r.figs[k].add(v)
}

func (r *results) get(metric, key string) spread {
	if s := r.figs[metric+"|"+key]; s != nil {
		return *s
	}
	return spread{}
}

func (r *results) exclusive() []*system {
	var out []*system
	for _, s := range r.systems {
		if s.exclusive {
			out = append(out, s)
		}
	}
	return out
}

func (r *results) system(key string) *system {
	for _, s := range r.systems {
		if s.key == key {
			return s
		}
	}
	return nil
}

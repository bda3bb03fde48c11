package main

import (
	"bufio"
	"bytes"
	"fmt"
	"html"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/version"
)

// report renders the figures of one benchmark run.
type report struct {
	p        params
	res      *results
	names    *namesResult // nil when the scenario was not run or failed
	srv      *servers
	began    time.Time
	revision string // of the dsync measured, read as the run began
	took     time.Duration
	failures []error
	// loadStart and loadEnd are the machine's load averages as the run
	// began and ended.
	loadStart, loadEnd string
}

// loadAverage returns the 1, 5 and 15 minute load averages of
// /proc/loadavg, "unknown" without it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " / ")
	}
	return "unknown"
}

func etcdVersion() string { return version.Version }

// machine describes the machine from /proc and /etc/os-release.
func machine() [][2]string {
	cpu, cores := "unknown", 0
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				cpu = strings.TrimSpace(v)
			case "processor":
				cores++
			}
		}
		f.Close()
	}
	mem := "unknown"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
				mem = fmt.Sprintf("%.1f GiB", kb/1024/1024)
			}
		}
	}
	osName := "unknown"
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				osName = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		osName += ", Linux " + strings.TrimSpace(string(b))
	}
	return [][2]string{
		{"CPU", fmt.Sprintf("%s, %d logical CPUs", cpu, cores)},
		{"RAM", mem},
		{"OS", osName},
		{"Go", runtime.Version()},
	}
}

// dsyncRevision names the commit of the dsync measured (the module the
// replace directive points at), with "+changes" for a dirty tree.
func dsyncRevision() string {
	out, err := exec.Command("git", "-C", "..", "log", "-1", "--format=%h %s").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if len(rev) > 90 {
		rev = rev[:87] + "..."
	}
	if st, err := exec.Command("git", "-C", "..", "status", "--porcelain", "--", ".", ":!docs", ":!bench").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += " (+ uncommitted changes)"
	}
	return rev
}

// A target is one figure the project set itself, judged on the median of
// the runs.
type target struct {
	label  string
	metric string
	key    string
	atMost bool // the figure must be <= limit; else >= limit
	limit  float64
	f      func(float64) string // formats a bare number
	unit   string
}

func pctNum(v float64) string { return fmt.Sprintf("%.0f", v) }

func (r *report) targets() []target {
	var t []target
	kinds := []struct{ key, name string }{{"mutex", "Mutex"}, {"fair", "FairMutex"}, {"rw-writer", "RWMutex writer"}}
	for _, k := range kinds {
		t = append(t, target{k.name + " handoff p50 ≤ 1 ms", "hand.p50", k.key, true, 1, num, " ms"})
	}
	for _, k := range kinds {
		t = append(t, target{k.name + " handoff p99 ≤ 5 ms", "hand.p99", k.key, true, 5, num, " ms"})
	}
	for _, k := range append(kinds, struct{ key, name string }{"rw-reader", "RWMutex reader"}) {
		t = append(t, target{k.name + " idle waiter ≤ 1 statement/s", "idle.per", k.key, true, 1, num, "/s"})
	}
	t = append(t,
		target{"Mutex uncontended ≤ 1.1× floor", "unc.ratio", "mutex", true, 1.1, ratioNum, "×"},
		target{"FairMutex uncontended ≤ 1.3× floor", "unc.ratio", "fair", true, 1.3, ratioNum, "×"},
		target{"RWMutex writer uncontended ≤ 1.3× floor", "unc.ratio", "rw-writer", true, 1.3, ratioNum, "×"},
		target{"RWMutex reader uncontended ≤ 1.3× floor", "unc.ratio", "rw-reader", true, 1.3, ratioNum, "×"},
		target{"Mutex, 4 sessions: longest wait ≤ 50 ms", "con.longest", "mutex", true, 50, num, " ms"},
		target{"Mutex, 4 sessions: ≥ 50 % of acquisitions change sessions", "con.share", "mutex", false, 50, pctNum, " %"},
		target{"FairMutex, 4 sessions: ≥ 0.7× the floor's serial rate", "con.vsfloor", "fair", false, 0.7, ratioNum, "×"},
	)
	// Issue 19: the same on capped pools (SetMaxOpenConns), as production
	// runs them.
	for _, k := range []struct{ key, name string }{{"mutex-cap8", "Mutex, SetMaxOpenConns(8)"}, {"mutex-cap32", "Mutex, SetMaxOpenConns(32)"}} {
		t = append(t,
			target{k.name + ": handoff p50 ≤ 1.2× the handoff floor", "hand.vsfloor", k.key, true, 1.2, ratioNum, "×"},
			target{k.name + ": uncontended ≤ 1.1× floor", "unc.ratio", k.key, true, 1.1, ratioNum, "×"},
			target{k.name + ": idle waiter ≤ 1 statement/s", "idle.per", k.key, true, 1, num, "/s"},
			target{k.name + ", 4 sessions: longest wait ≤ 50 ms", "con.longest", k.key, true, 50, num, " ms"},
			target{k.name + ", 4 sessions: ≥ 50 % of acquisitions change sessions", "con.share", k.key, false, 50, pctNum, " %"},
		)
	}
	for _, k := range []struct{ key, name string }{
		{"fair-cap8", "FairMutex, SetMaxOpenConns(8)"}, {"fair-cap32", "FairMutex, SetMaxOpenConns(32)"},
		{"rw-writer-cap8", "RWMutex writer, SetMaxOpenConns(8)"}, {"rw-reader-cap8", "RWMutex reader, SetMaxOpenConns(8)"},
	} {
		t = append(t, target{k.name + ": idle waiter ≤ 1 statement/s", "idle.per", k.key, true, 1, num, "/s"})
	}
	t = append(t, target{"Mutex handoff p50 ≤ 1.2× the handoff floor", "hand.vsfloor", "mutex", true, 1.2, ratioNum, "×"})
	// Issue 19 §3: the queued locks' handoffs at the floor.
	t = append(t,
		target{"FairMutex handoff p50 ≤ 1.3× the handoff floor", "hand.vsfloor", "fair", true, 1.3, ratioNum, "×"},
		target{"RWMutex writer → writer handoff p50 ≤ 1.3× the handoff floor", "hand.vsfloor", "rw-writer", true, 1.3, ratioNum, "×"},
		target{"RWMutex writer → reader handoff p50 ≤ 1.3× the handoff floor", "hand.vsfloor", "rw-reader", true, 1.3, ratioNum, "×"},
	)
	return t
}

// judge returns the median's verdict, noting runs that missed.
func (t target) judge(s spread) string {
	if !s.ok() {
		return "not measured"
	}
	ok := func(v float64) bool {
		if t.atMost {
			return v <= t.limit
		}
		return v >= t.limit
	}
	missed := 0
	vals := s.sorted()
	for _, v := range vals {
		if !ok(v) {
			missed++
		}
	}
	switch {
	case ok(s.median()) && missed == 0:
		return "**met**"
	case ok(s.median()):
		return fmt.Sprintf("**met** (median; missed in %d of %d runs)", missed, len(vals))
	default:
		return "not met"
	}
}

func (r *report) markdown() []byte {
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p := r.p
	mode := "full"
	if p.quick {
		mode = "quick (`-quick`: short durations, few iterations; for development, not for quoting)"
	}
	w("# Benchmarks: dsync and its peers\n\n")
	w("Written by the benchmark program in `bench/` (do not edit by hand; run it again).\n\n")
	w("| | |\n|---|---|\n")
	if strings.HasPrefix(p.command, "make ") {
		w("| command | `%s` |\n", p.command)
	} else {
		w("| command | `%s` in `bench/` |\n", p.command)
	}
	w("| date | %s, took %s |\n", r.began.UTC().Format("2006-01-02 15:04 UTC"), r.took.Round(time.Second))
	w("| mode | %s; %d run(s) of each scenario but the distinct-names one, which runs once |\n", mode, p.runs)
	for _, m := range machine() {
		w("| %s | %s |\n", m[0], m[1])
	}
	w("| MariaDB | %s, throwaway server started by `internal/mariadb` (default settings: `innodb_flush_log_at_trx_commit=1`, binary log off) |\n", r.srv.versions["mariadb"])
	w("| Redis | %s (Debian's `redis-server`), two servers: %s; and %s |\n", r.srv.versions["redis"], r.srv.redis[0].desc, r.srv.redis[1].desc)
	w("| etcd | %s, embedded (`go.etcd.io/etcd/server/v3/embed`), one member, default settings (WAL fsynced on every commit) |\n", r.srv.versions["etcd"])
	w("| dsync | %s |\n", r.revision)
	w("| load average (1 / 5 / 15 min) | %s as the run began, %s as it ended |\n", r.loadStart, r.loadEnd)
	w("\nClients, servers and this program share the machine, all over 127.0.0.1: absolute times are noise on a small shared box, the ratios to the floor measured in the same run are the figures to compare. Every figure is the median of the runs with the range (min–max) in brackets.\n\n")
	w("![Uncontended Lock+Unlock p50 as a multiple of the floor, and handoff p50 between sessions, per lock system](benchmarks.svg)\n\n")

	if len(r.failures) > 0 {
		w("## Failures\n\n")
		for _, err := range r.failures {
			w("- **FAIL**: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		w("\n")
	}

	w("## Targets\n\n| target | measured | verdict |\n|---|---|---|\n")
	for _, t := range r.targets() {
		s := r.res.get(t.metric, t.key)
		w("| %s | %s | %s |\n", t.label, s.format(t.f, t.unit), t.judge(s))
	}
	if f := r.res.get("hand.p50", "floor"); f.ok() {
		w("| for the handoff targets: the handoff floor's p50 (a `DELETE` and an `INSERT` on two connections idle through the hold, in series: a release's and an acquisition's commits, with no wake-up) | %s | reference |\n", f.format(num, " ms"))
	}
	if n := r.names; n != nil {
		verdict := "not met"
		if n.backAfter >= 0 && n.backAfter <= 2*n.age {
			verdict = "**met**"
		}
		w("| %s names: lock table back to ≤ 1 %% of its peak within 2× the free-row age (%v) | %s | %s |\n",
			groupThousands(int64(n.n)), 2*n.age, backAfter(n), verdict)
		verdict = "**met**"
		if n.fenceRepeats > 0 {
			verdict = "**FAIL**"
		}
		w("| fences never repeat (%s names locked again) | %d repeats | %s |\n", groupThousands(int64(n.sampled)), n.fenceRepeats, verdict)
	}
	w("\n")

	w("## What is measured\n\n")
	w("Each scenario opens its own sessions (a *session* is what one process has: a dsync `Session` on a `*sql.DB` of its own; a MariaDB connection; a go-redis client with a redsync instance; an etcd client with a `concurrency.Session`) and uses lock names of its own.\n\n")
	w("- **floor**: a prepared autocommit `INSERT` and `DELETE` of one row on a plain InnoDB table of the same MariaDB, on one connection: the least a durable row lock can cost. Its p50 per pair is the unit of every ratio (\"× floor\"), from the same run; its pairs per second, one after another, is the floor's serial rate.\n")
	w("- **uncontended**: one session, `Lock`+`Unlock` of one name in a loop: %s pairs timed after %d warm-up pairs; p50 and p99 per pair. `GET_LOCK(name, 600)` and `RELEASE_LOCK(name)` are prepared statements on one connection. redsync runs with default options (8 s expiry, 32 tries 50–250 ms apart) and with `WithRetryDelay(1ms)`; a `Lock` that returns `ErrFailed` after its tries is called again, as a caller who must have the lock would. For every lock system a second session has first waited for the name once (blocked in `Lock` while the first held it) and stays open: what a past wait leaves behind must not cost the uncontended path.\n", groupThousands(int64(p.uncIters)), max(p.uncIters/20, 10))
	w("- **contention**: %d sessions, each a goroutine looping `Lock`, check, `Unlock` on one name for %v. The check: an atomic count of holders must be 1 inside the critical section, and a plain counter incremented there must equal the acquisitions at the end; anything else is a violation, which fails the program. Acquisitions/s; handoffs/s (acquisitions whose previous holder was another session) and their share; the longest time one `Lock` took; \"vs floor\" is acquisitions/s over the floor's serial rate.\n", p.conSessions, p.conDur)
	w("- **handoff latency**: session A holds the lock, session B is blocked in `Lock`; after a hold of 5–15 ms A notes t0 and calls `Unlock`, B notes t1 when its `Lock` returns; t1 − t0, %d times per run (the two sessions take turns; for `RWMutex` reader A is a writer and B a reader, writer → reader, and A locks again after B lets go); p50 and p99. The *handoff floor* is what the two commits of a handoff of a durable row lock cost, with no wake-up at all: after the same holds, the floor's `DELETE` on one connection and then at once its `INSERT` on another, timed together (two commits in series, each on a connection that sat idle through the hold, as a release and the waiter's acquisition are); \"× handoff floor\" is a system's p50 over it, from the same run.\n", p.handSamples)
	w("- **idle waiters**: %d+1 sessions; first none of them does anything for %v (baseline: keep-alives and the like), then one holds the lock and %d wait in `Lock` (counted from 0.5 s after they started, for %v; a multiple of dsync's 2 s renewal period, so that both windows hold as many renewals). Per waiter: (statements/s while waiting − baseline statements/s) / %d; a renewal more or less in one window moves it by about 0.02/s, and can make it negative. Counted on the server: MariaDB's global `Questions` (`SHOW GLOBAL STATUS`), redis' `total_commands_processed` (`INFO stats`), minus the counting query itself; for etcd, the unary gRPC calls the benchmark's clients sent (lease keep-alives and watches are streams and not counted; a waiting `concurrency.Mutex` watches its predecessor's key and sends nothing). For `RWMutex` reader the holder is a writer and the waiters are readers.\n", p.idleWaiters, p.idleDur, p.idleWaiters, p.idleDur, p.idleWaiters)
	w("- **many locks**: one session acquires %s `Mutex` names one after another (time taken), then holds them for %v while the server's statements are counted (as above): the keep-alive cost of holding many locks. `GET_LOCK` on one connection for comparison.\n", groupThousands(int64(p.manyLocks)), p.manyHold)
	w("- **distinct names**: %d goroutines over %d sessions lock and unlock %s distinct `Mutex` names once each, recording each fence (once per `make bench-peers`: it takes minutes). With `dsync.WithFreeRowAge(age)` the lock table's rows are counted (`SELECT COUNT(*)`, every 2 s during the pass and every second after it; the peak is the largest count seen) until they are back to ≤ 1 %% of the peak; data+index size from `information_schema.TABLES` after `ANALYZE TABLE`. Then one name in %s is locked again: its new fence must exceed the recorded one (a repeat fails the program).\n\n", p.namesSessions*p.namesPer, p.namesSessions, groupThousands(int64(p.names)), groupThousands(int64(max(1, p.names/2000))))

	w("The election and semaphore scenarios (failover, resign, observe, semaphore) are described in their own sections at the end.\n\n")
	w("Reading the figures:\n\n")
	w("- `GET_LOCK` queues its waiters inside the server and wakes the next one when the lock is released, but it is not a lease: it lives as long as one connection, and MariaDB Galera Cluster does not support it.\n")
	w("- redsync waiters poll: with the default retry delay (50–250 ms) a releasing session usually takes the lock again before any waiter looks, so handoffs between sessions are rare and waits long; with a 1 ms delay each waiter sends a few commands per millisecond while it waits. A redsync lock is not fenced, and a redis without persistence forgets every lock when it restarts.\n")
	w("- etcd's `concurrency.Mutex` waiter watches its predecessor's key from the revision it read (`WithRev`), a past revision: etcd hands events to such an \"unsynced\" watcher in a loop that runs every 100 ms (`watchResyncPeriod` in etcd's mvcc), so a lock released within about 100 ms of the waiter starting to wait reaches it only at that loop's next turn.\n")
	w("- dsync's baseline is its keep-alive: each session renews its lease every TTL/3, at most 2 s apart (0.5 statements/s per session with the default TTL of 15 s), however many locks it holds; the idle-waiter figure is what waiting adds to that.\n\n")

	if r.res.has("unc.p50") {
		w("## Uncontended Lock+Unlock\n\n| system | server | p50 | p99 | pairs/s | p50 × floor | p99 × floor |\n|---|---|---|---|---|---|---|\n")
		for _, s := range r.res.systems {
			if !r.res.get("unc.p50", s.key).ok() {
				continue
			}
			w("| %s | %s | %s | %s | %s | %s | %s |\n", s.name, s.server,
				r.res.get("unc.p50", s.key).format(num, " ms"), r.res.get("unc.p99", s.key).format(num, " ms"),
				r.res.get("unc.rate", s.key).format(num, ""), r.res.get("unc.ratio", s.key).format(ratioNum, "×"),
				r.res.get("unc.ratio99", s.key).format(ratioNum, "×"))
		}
		w("\n")
	}
	if r.res.has("con.acq") {
		w("## %d sessions contending for one lock\n\n| system | acquisitions/s | handoffs/s | handoff share | longest wait | violations | acquisitions/s × floor serial rate |\n|---|---|---|---|---|---|---|\n", p.conSessions)
		for _, s := range r.res.exclusive() {
			if !r.res.get("con.acq", s.key).ok() {
				continue
			}
			v := r.res.get("con.violations", s.key)
			viol := fmt.Sprintf("%.0f", v.max())
			if v.max() > 0 {
				viol = "**FAIL " + viol + "**"
			}
			w("| %s | %s | %s | %s | %s | %s | %s |\n", s.name,
				r.res.get("con.acq", s.key).format(num, ""), r.res.get("con.handoffs", s.key).format(num, ""),
				r.res.get("con.share", s.key).format(pctNum, " %"), r.res.get("con.longest", s.key).format(num, " ms"),
				viol, r.res.get("con.vsfloor", s.key).format(ratioNum, "×"))
		}
		w("\n")
	}
	if r.res.has("hand.p50") {
		w("## Handoff latency between sessions\n\n| system | p50 | p99 | p50 × floor | p50 × handoff floor |\n|---|---|---|---|---|\n")
		for _, s := range r.res.systems {
			if !r.res.get("hand.p50", s.key).ok() {
				continue
			}
			name := s.name
			if s.key == "floor" {
				name = "handoff floor: the floor's `DELETE` on one connection, then its `INSERT` on another"
			}
			if s.readers {
				name += ", from a writer (writer → reader)"
			}
			w("| %s | %s | %s | %s | %s |\n", name, r.res.get("hand.p50", s.key).format(num, " ms"),
				r.res.get("hand.p99", s.key).format(num, " ms"), r.res.get("hand.ratio", s.key).format(ratioNum, "×"),
				r.res.get("hand.vsfloor", s.key).format(ratioNum, "×"))
		}
		w("\n")
	}
	if r.res.has("idle.per") {
		w("## Idle waiters\n\n| system | counted | baseline (%d sessions idle) | holder + %d waiting | per waiter |\n|---|---|---|---|---|\n", p.idleWaiters+1, p.idleWaiters)
		for _, s := range r.res.systems {
			r.idleRow(w, s.name, s.countDesc, s.key, "idle")
		}
		w("\n")
	}
	if r.res.has("many.acq") {
		w("## One session holding %s locks\n\n| system | time to acquire | locks/s | statements/s while held (%v) |\n|---|---|---|---|\n", groupThousands(int64(p.manyLocks)), p.manyHold)
		for _, s := range r.res.systems {
			if !r.res.get("many.acq", s.key).ok() {
				continue
			}
			w("| %s | %s | %s | %s |\n", s.name, r.res.get("many.acq", s.key).format(num, " s"),
				r.res.get("many.rate", s.key).format(num, ""), r.res.get("many.stmts", s.key).format(num, "/s"))
		}
		w("\n")
	}
	if n := r.names; n != nil {
		w("## %s distinct names\n\n", groupThousands(int64(n.n)))
		w("| figure | value |\n|---|---|\n")
		w("| Lock+Unlock of every name (%d goroutines, %d sessions) | %.1f s, %s names/s |\n", n.goroutines, n.sessions, n.elapsed.Seconds(), num(n.rate))
		w("| free-row age (`dsync.WithFreeRowAge`) | %v |\n", n.age)
		w("| lock table at its peak | %s rows |\n", groupThousands(n.peakRows))
		w("| lock table size at its peak | %s |\n", bytesUnit(n.peakBytes))
		w("| back to ≤ 1 %% of the peak | %s |\n", backAfter(n))
		w("| lock table at the end (%.0f s after the last `Unlock`) | %s rows, %s |\n", n.waited.Seconds(), groupThousands(n.finalRows), bytesUnit(n.finalBytes))
		w("| names locked again, fence above the recorded one | %s of %s |\n", groupThousands(int64(n.sampled)-n.fenceRepeats), groupThousands(int64(n.sampled)))
		w("\n")
	}
	for _, sec := range r.sections() {
		w("%s\n", sec.text)
	}
	return b.Bytes()
}

// idleRow writes the row of an idle-statements table: the figures
// metric.base, metric.wait and metric.per of key; nothing when key was not
// measured.
func (r *report) idleRow(w func(string, ...any), name, countDesc, key, metric string) {
	if !r.res.get(metric+".per", key).ok() {
		return
	}
	w("| %s | %s | %s | %s | %s |\n", name, countDesc, r.res.get(metric+".base", key).format(num, "/s"),
		r.res.get(metric+".wait", key).format(num, "/s"), r.res.get(metric+".per", key).format(num, "/s"))
}

func backAfter(n *namesResult) string {
	if n.backAfter < 0 {
		return fmt.Sprintf("not within %.0f s of the last `Unlock`", n.waited.Seconds())
	}
	return fmt.Sprintf("%.1f s after the last `Unlock` (%.2f× the age)", n.backAfter.Seconds(), n.backAfter.Seconds()/n.age.Seconds())
}

func bytesUnit(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%d B", b)
	}
}

func (r *results) has(metric string) bool {
	for _, s := range r.systems {
		if r.get(metric, s.key).ok() {
			return true
		}
	}
	return false
}

// color is a system's bar colour in the chart.
func color(s *system) string {
	switch {
	case s.key == "floor":
		return "#9e9e9e"
	case s.key == "get_lock":
		return "#00897b"
	case s.server == "mariadb":
		return "#1e63c4"
	case s.server == "etcd":
		return "#43a047"
	default:
		return "#d84315"
	}
}

// svg draws two horizontal bar charts on log scales: the uncontended p50 as
// a multiple of the floor, and the handoff p50 between sessions.
func (r *report) svg() []byte {
	type bar struct {
		label, value, color string
		v                   float64
		bad                 bool
	}
	var panels []struct {
		title string
		bars  []bar
	}
	var unc, hand []bar
	for _, s := range r.res.systems {
		bad := r.res.get("con.violations", s.key).max() > 0
		if v := r.res.get("unc.ratio", s.key); v.ok() {
			unc = append(unc, bar{s.name, ratio(v.median()), color(s), v.median(), bad})
		}
		if v := r.res.get("hand.p50", s.key); v.ok() {
			hand = append(hand, bar{s.name, num(v.median()) + " ms", color(s), v.median(), bad})
		}
	}
	if len(unc) > 0 {
		panels = append(panels, struct {
			title string
			bars  []bar
		}{"Uncontended Lock+Unlock, p50 as a multiple of the floor (prepared INSERT+DELETE, same run)", unc})
	}
	if len(hand) > 0 {
		panels = append(panels, struct {
			title string
			bars  []bar
		}{"Handoff between sessions (Unlock call to the blocked waiter's Lock return), p50 in ms; floor: DELETE then INSERT on two connections, in series", hand})
	}
	const (
		width  = 960
		labelW = 380
		barW   = 480
		rowH   = 22
		left   = 10
	)
	height := 60
	for _, p := range panels {
		height += 60 + rowH*len(p.bars)
	}
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	what := fmt.Sprintf("medians of %d runs", r.p.runs)
	if r.p.runs == 1 {
		what = "one run"
	}
	if r.p.quick {
		what += ", quick mode"
	}
	w(`<text x="%d" y="22" font-size="15" font-weight="bold">dsync and its peers: %s, %s (log scales)</text>`+"\n",
		left, what, html.EscapeString(r.began.UTC().Format("2006-01-02")))
	y := 50
	for _, p := range panels {
		w(`<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", left, y, html.EscapeString(p.title))
		y += 16
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, br := range p.bars {
			if br.v > 0 {
				lo, hi = math.Min(lo, br.v), math.Max(hi, br.v)
			}
		}
		lo = math.Pow(10, math.Floor(math.Log10(lo)))
		hi = math.Pow(10, math.Ceil(math.Log10(hi)))
		if hi <= lo {
			hi = lo * 10
		}
		x := func(v float64) float64 {
			if v <= lo {
				return 1
			}
			return math.Max(1, (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))*barW)
		}
		top, bottom := y, y+rowH*len(p.bars)
		// Grid and axis first, with a tick at every power of ten.
		w(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#666"/>`+"\n", left+labelW, bottom+2, left+labelW+barW, bottom+2)
		for t := lo; t <= hi*1.0001; t *= 10 {
			tx := float64(left+labelW) + x(t)
			if t == lo {
				tx = float64(left + labelW)
			}
			w(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", tx, top, tx, bottom+2)
			w(`<text x="%.1f" y="%d" text-anchor="middle" fill="#666" font-size="10">%s</text>`+"\n", tx, bottom+14, strconv.FormatFloat(t, 'f', -1, 64))
		}
		for i, br := range p.bars {
			ry := y + i*rowH
			label := br.label
			fill := "#222"
			if br.bad {
				label += " — VIOLATIONS"
				fill = "#c62828"
			}
			label = strings.ReplaceAll(label, "`", "")
			w(`<text x="%d" y="%d" text-anchor="end" fill="%s">%s</text>`+"\n", left+labelW-8, ry+15, fill, html.EscapeString(label))
			bw := x(br.v)
			w(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left+labelW, ry+3, bw, rowH-6, br.color)
			w(`<text x="%.1f" y="%d" fill="#222">%s</text>`+"\n", float64(left+labelW)+bw+5, ry+15, html.EscapeString(br.value))
		}
		y = bottom + 44
	}
	w("</svg>\n")
	return b.Bytes()
}

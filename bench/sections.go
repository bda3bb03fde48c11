package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"
)

// A section is the part of BENCHMARKS.md one scenario writes, between the
// markers sectionStart(key) and sectionEnd(key), so that -update can
// rewrite it alone.
type section struct {
	key  string // the scenario
	text string // markers included
}

func sectionStart(key string) string { return "<!-- bench:" + key + " -->" }
func sectionEnd(key string) string   { return "<!-- /bench:" + key + " -->" }

// sections returns the sections of the marked scenarios run, in the
// order of markedScenarios.
func (r *report) sections() []section {
	var out []section
	for _, key := range markedScenarios {
		if !r.p.wants(key) {
			continue
		}
		var b bytes.Buffer
		w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
		w("%s\n", sectionStart(key))
		switch key {
		case "failover":
			r.failoverSection(w)
		case "resign":
			r.resignSection(w)
		case "observe":
			r.observeSection(w)
		case "semaphore":
			r.semaphoreSection(w)
		}
		for _, err := range r.failures {
			if strings.HasPrefix(err.Error(), key+" ") {
				w("- **FAIL**: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			}
		}
		w("%s\n", sectionEnd(key))
		out = append(out, section{key, b.String()})
	}
	return out
}

// provenance writes the line that says how a section's figures were
// measured: it stands apart from the file's header after -update.
func (r *report) provenance(w func(string, ...any)) {
	cmd := "`" + r.p.command + "` in `bench/`"
	if strings.HasPrefix(r.p.command, "make ") {
		cmd = "`" + r.p.command + "`"
	}
	mode := ""
	if r.p.quick {
		mode = ", quick mode (for development, not for quoting)"
	}
	cpu := machine()[0][1]
	rev, _, _ := strings.Cut(r.revision, " ")
	if strings.HasSuffix(r.revision, "(+ uncommitted changes)") {
		rev += " (+ uncommitted changes)"
	}
	w("Measured by %s on %s (the command took %s), %d run(s)%s; %s; load average (1 / 5 / 15 min) %s as the run began, %s as it ended; dsync %s. Figures: median of the runs (min–max); ratios are to floors measured in the same run.\n\n",
		cmd, r.began.UTC().Format("2006-01-02 15:04 UTC"), r.took.Round(time.Second), r.p.runs, mode, cpu, r.loadStart, r.loadEnd, rev)
}

func (r *report) failoverSection(w func(string, ...any)) {
	p := r.p
	w("## Election failover after the leader dies\n\n")
	r.provenance(w)
	w("A leader child process (this program, run again with `%s`) opens a session with a lease of %v (dsync `WithTTL(%v)`; etcd `concurrency.WithTTL(%d)`, etcd's smallest with its default heartbeat and election timeout), campaigns and leads. A campaigner of another session in this process, with the same TTL, waits in line. After 0.3 s and a random part of TTL/3 the child is killed with SIGKILL: it neither resigns nor ends its lease, and its connections close with it (so MariaDB frees the `GET_LOCK` doorbells of its dsync session). *Failover* is the time from the kill to the return of the waiting `Campaign`, %d times per run and system; p50 and the longest. The floor is the TTL itself: a dead leader's lease ends one TTL after its last renewal, which came at most a renewal period before the kill (dsync renews every TTL/3; etcd's client when a third of the TTL has passed, looking every 500 ms), so a failover can take less than a TTL; \"p50 − TTL\" is the excess in ms. A dsync campaigner blocked on the dead leader's doorbell wakes when MariaDB frees it, at the kill; with no doorbell left to block on, it then polls at a pace that grows from 100 ms to 1 s (`paceFloor`, `paceCap` in doorbell.go), but never later than 5 ms (`bellLate`) after the end of the dead leader's lease, as it last read it (`nextPace`), and takes over at that poll. etcd revokes expired leases in a loop that runs every 500 ms, and the waiter sees the deletion through its watch. The new leader's term (dsync `Term`; etcd `Rev`, its key's creation revision) must exceed the dead leader's, or the program fails.\n\n",
		childArg, p.electTTL, p.electTTL, int(p.electTTL/time.Second), p.failSamples)
	w("| system | failover p50 | longest | p50 × TTL | longest × TTL | p50 − TTL |\n|---|---|---|---|---|---|\n")
	for _, s := range r.res.elections {
		if !r.res.get("fail.p50", s.key).ok() {
			continue
		}
		w("| %s | %s | %s | %s | %s | %s |\n", s.name,
			r.res.get("fail.p50", s.key).format(num, " ms"), r.res.get("fail.max", s.key).format(num, " ms"),
			r.res.get("fail.ratio", s.key).format(ratioNum, "×"), r.res.get("fail.ratiomax", s.key).format(ratioNum, "×"),
			r.res.get("fail.excess", s.key).format(num, " ms"))
	}
	w("\n")
}

// handFloorRow writes the handoff floor's row of a table of n columns
// after the first two.
func (r *report) handFloorRow(w func(string, ...any), n int) {
	f := r.res.get("hfloor.p50", "floor")
	if !f.ok() {
		return
	}
	w("| handoff floor: the floor's `DELETE` on one connection, then its `INSERT` on another (%d pairs per run) | %s | %s |%s\n",
		r.p.handSamples, f.format(num, " ms"), r.res.get("hfloor.p99", "floor").format(num, " ms"), strings.Repeat(" 1.00× |", n))
}

func (r *report) resignSection(w func(string, ...any)) {
	w("## Election handoff on `Resign`\n\n")
	r.provenance(w)
	w("Session A leads, session B waits in `Campaign`; after a lead of 5–15 ms A notes t0 and calls `Resign`, B notes t1 when its `Campaign` returns; t1 − t0, %d times per run (the two sessions take turns), p50 and p99, both sessions with the system's default TTL. \"× handoff floor\" is the p50 over the p50 of the handoff floor of the same run (see *handoff latency*: two commits in series, with no wake-up). etcd's waiting campaigner watches the key ahead of it from a past revision, as its `concurrency.Mutex` does (see *Reading the figures*: etcd's unsynced watchers are served every 100 ms).\n\n", r.p.electSamples)
	w("| system | p50 | p99 | p50 × handoff floor |\n|---|---|---|---|\n")
	for _, s := range r.res.elections {
		if !r.res.get("resign.p50", s.key).ok() {
			continue
		}
		w("| %s | %s | %s | %s |\n", s.name, r.res.get("resign.p50", s.key).format(num, " ms"),
			r.res.get("resign.p99", s.key).format(num, " ms"), r.res.get("resign.vsfloor", s.key).format(ratioNum, "×"))
	}
	r.handFloorRow(w, 1)
	w("\n")
}

func (r *report) observeSection(w func(string, ...any)) {
	p := r.p
	w("## Election `Observe`\n\n")
	r.provenance(w)
	w("**Latency**: session A leads, session B observes (`Observe`; dsync's delivers `Leader` values, etcd's `GetResponse`s); after a pause of 5–15 ms A notes t0 and calls `Proclaim` with a new value, B notes t1 when that value comes out of its channel; t1 − t0, %d times per run; p50 and p99, and the p50 of the `Proclaim` call alone. \"× handoff floor\" as for `Resign`.\n\n", p.electSamples)
	w("| system | p50 | p99 | p50 × handoff floor | `Proclaim` p50 |\n|---|---|---|---|---|\n")
	for _, s := range r.res.elections {
		if !r.res.get("obs.p50", s.key).ok() {
			continue
		}
		w("| %s | %s | %s | %s | %s |\n", s.name, r.res.get("obs.p50", s.key).format(num, " ms"),
			r.res.get("obs.p99", s.key).format(num, " ms"), r.res.get("obs.vsfloor", s.key).format(ratioNum, "×"),
			r.res.get("obs.proclaim", s.key).format(num, " ms"))
	}
	if f := r.res.get("hfloor.p50", "floor"); f.ok() {
		w("| handoff floor (as above) | %s | %s | 1.00× | |\n", f.format(num, " ms"), r.res.get("hfloor.p99", "floor").format(num, " ms"))
	}
	w("\n**Idle observers**: %d+1 sessions with the default TTL, one leading; first the others do nothing for %v (baseline), then each observes, the leader changing nothing, and the statements the server receives are counted from 0.5 s after every observer had its first delivery, for %v (a dsync observer of a leader that changes nothing reads at the latest every 8 s, so the window holds two such reads). Per observer: (statements/s while observing − baseline) / %d; counted as for *idle waiters*.\n\n", p.observers, p.observeIdle, p.observeIdle, p.observers)
	w("| system | counted | baseline (%d sessions) | %d observing | per observer |\n|---|---|---|---|---|\n", p.observers+1, p.observers)
	for _, s := range r.res.elections {
		r.idleRow(w, s.name, s.countDesc, s.key, "obs")
	}
	w("\n")
}

func (r *report) semaphoreSection(w func(string, ...any)) {
	p := r.p
	w("## `Semaphore`\n\n")
	r.provenance(w)
	w("No peer: none of the distributed semaphores for Go on Redis or etcd that were looked for is in the list of modules this project installs from, and none is a peer of like design. etcd's client has none (`client/v3/concurrency`: `Mutex`, `Election`, STM; `client/v3/experimental/recipes`: barriers, queues, `RWMutex`); redsync, redislock and rueidis' `rueidislock` are mutexes only; the Redis semaphores found (rfyiamcool/go_redis_semaphore: a hash and a list under a `SETNX` lock, on redigo; bluele/gosem: in-memory and Redis; amitaifrey/redisemaphore: a sorted set under a Redis mutex, polled every 200 ms by default) are small projects outside that list; Consul's `api.Semaphore` (`consul lock -n`) needs Consul. So dsync's `Semaphore` is measured against the floor alone.\n\n")
	w("**Uncontended**: one session, `Acquire(1)`+`Release(1)` of one name with a limit of %d, in a loop: %s pairs timed after %d warm-up pairs; p50 and p99 per pair, over the floor's (a prepared `INSERT` + `DELETE`, same run).\n\n", p.semLimit, groupThousands(int64(p.uncIters)), max(p.uncIters/20, 10))
	w("| system | p50 | p99 | pairs/s | p50 × floor | p99 × floor |\n|---|---|---|---|---|---|\n")
	if f := r.res.get("unc.p50", "floor"); f.ok() {
		w("| floor: prepared `INSERT` + `DELETE` | %s | %s | %s | 1.00× | 1.00× |\n", f.format(num, " ms"),
			r.res.get("unc.p99", "floor").format(num, " ms"), r.res.get("unc.rate", "floor").format(num, ""))
	}
	if s := r.res.get("sem.unc.p50", "semaphore"); s.ok() {
		w("| dsync `Semaphore`, limit %d | %s | %s | %s | %s | %s |\n", p.semLimit, s.format(num, " ms"),
			r.res.get("sem.unc.p99", "semaphore").format(num, " ms"), r.res.get("sem.unc.rate", "semaphore").format(num, ""),
			r.res.get("sem.unc.ratio", "semaphore").format(ratioNum, "×"), r.res.get("sem.unc.ratio99", "semaphore").format(ratioNum, "×"))
	}
	w("\n**Contention**: %d sessions, each a goroutine looping `Acquire(1)`, check, a hold of %v (`time.Sleep`, so that holds overlap), `Release(1)` on one name with a limit of %d, for %v. The check: an atomic count of holders, from `Acquire`'s return to the `Release` call, must not exceed the limit (a holder beyond it fails the program); the most seen at once is reported. Acquisitions/s, over the floor's serial rate (its uncontended pairs per second, same run; the holds alone would allow %d × 1 s / %v = %s/s); the share of acquisitions whose previous acquirer was another session; the longest time one `Acquire` took.\n\n", p.conSessions, p.semHold, p.semLimit, p.conDur, p.semLimit, p.semHold, groupThousands(p.semLimit*int64(time.Second/p.semHold)))
	w("| system | acquisitions/s | × floor serial rate | most held at once (limit %d) | beyond the limit | changes of session | longest wait |\n|---|---|---|---|---|---|---|\n", p.semLimit)
	if s := r.res.get("sem.con.acq", "semaphore"); s.ok() {
		v := r.res.get("sem.con.violations", "semaphore")
		viol := fmt.Sprintf("%.0f", v.max())
		if v.max() > 0 {
			viol = "**FAIL " + viol + "**"
		}
		w("| dsync `Semaphore`, limit %d | %s | %s | %s | %s | %s | %s |\n", p.semLimit, s.format(num, ""),
			r.res.get("sem.con.vsfloor", "semaphore").format(ratioNum, "×"), r.res.get("sem.con.maxheld", "semaphore").format(func(v float64) string { return fmt.Sprintf("%.0f", v) }, ""),
			viol, r.res.get("sem.con.share", "semaphore").format(pctNum, " %"), r.res.get("sem.con.longest", "semaphore").format(num, " ms"))
	}
	w("\n")
}

// update rewrites the sections of this run in the BENCHMARKS.md at path,
// keeping the rest: a section already there (between its markers) is
// replaced, a new one is added at the end.
func (r *report) update(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-update: %w (run the whole benchmark first)", err)
	}
	doc := string(b)
	for _, sec := range r.sections() {
		start, end := strings.Index(doc, sectionStart(sec.key)), strings.Index(doc, sectionEnd(sec.key))
		switch {
		case start >= 0 && end > start:
			end += len(sectionEnd(sec.key)) + 1 // and its newline
			doc = doc[:start] + sec.text + doc[min(end, len(doc)):]
		case start >= 0 || end >= 0:
			return fmt.Errorf("-update: %s: the markers of section %s are out of order", path, sec.key)
		default:
			doc = strings.TrimRight(doc, "\n") + "\n\n" + sec.text
		}
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

//go:build linux

package torture

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/dsynclock/dsync/internal/mariadb"
)

var (
	flagDuration   = flag.Duration("torture.duration", 20*time.Second, "how long the clients run operations")
	flagSeed       = flag.Uint64("torture.seed", 0, "seed of the nemesis schedule and the clients' choices (0: from the clock)")
	flagProcs      = flag.Int("torture.procs", 3, "client processes")
	flagGoroutines = flag.Int("torture.goroutines", 3, "goroutines per client process")
	flagTTL        = flag.Duration("torture.ttl", 2*time.Second, "the sessions' TTL")
	flagNemesis    = flag.String("torture.nemesis", "stop,kill,killconn,latency,cut,drop,server", "the nemesis's faults, comma-separated")
	flagOut        = flag.String("torture.out", "", "directory to write the history to (default: a temporary directory, on failure only)")
	flagDSNTZ      = flag.String("torture.dsn-tz", "", "a time_zone (e.g. +05:00) for the DSN of every other client process (odd ones), unlike the server's")
)

func TestMain(m *testing.M) {
	// The driver logs every connection a fault breaks; the history has what matters.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	if os.Getenv(envChild) != "" {
		os.Exit(runClient())
	}
	goleak.VerifyTestMain(m)
}

// TestTorture runs client processes through random lock operations under
// the nemesis and checks the history; the seed is printed, and a failure
// prints the nemesis's schedule and the smallest illegal sub-history and
// writes the whole history to a file. make torture runs it for longer:
// DURATION=10m SEED=n.
func TestTorture(t *testing.T) {
	if testing.Short() {
		t.Skip("a torture run takes about 45s")
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	cfg := config{
		seed:       seed,
		duration:   *flagDuration,
		procs:      *flagProcs,
		goroutines: *flagGoroutines,
		ttl:        *flagTTL,
		nemesis:    strings.Split(*flagNemesis, ","),
		out:        *flagOut,
		dsnTZ:      *flagDSNTZ,
		target:     "server",
		summary:    *flagSummary,
		mutant:     *flagMutant,
	}
	run(t, cfg)
}

// config is one torture run's.
type config struct {
	seed       uint64
	duration   time.Duration
	procs      int
	goroutines int
	ttl        time.Duration
	nemesis    []string
	out        string
	dsnTZ      string // the DSN time_zone of the odd client processes ("": the server's)
	target     string // what the clients run against, for the summary: "server", "galera"
	summary    string // the file to write the run's Summary to ("": none)
	mutant     string // the mutant the tree carries, for the summary

	// On a cluster (galera_test.go): the database, the node faults, and
	// whether LockTx is left out of the clients' operations.
	db          database // nil: a server of the run's own
	nodeNemesis []string
	noLockTx    bool
}

// fault is one entry of the nemesis's schedule.
type fault struct {
	at     time.Duration // after the start of the clients
	kind   string
	target int           // client process
	dur    time.Duration // how long it lasts
}

// faultWeights weighs the nemesis's draw: pauses and cuts, the faults that
// test what a session knows of its lease, come twice as often.
var faultWeights = map[string]int{nemStop: 2, nemCut: 2}

// schedule draws the nemesis's faults from the seed: one every 0.3-2.3 s,
// from 2 s after the start to 3 s before the end.
func schedule(cfg config) []fault {
	rng := rand.New(rand.NewPCG(cfg.seed, 0x6e656d65736973))
	var out []fault
	lastForward := -time.Hour // of the clock
	if len(cfg.nemesis) == 0 || cfg.nemesis[0] == "" {
		return nil
	}
	var kinds []string
	for _, k := range cfg.nemesis {
		for range max(faultWeights[k], 1) {
			kinds = append(kinds, k)
		}
	}
	for at := 2 * time.Second; at < cfg.duration-3*time.Second; at += time.Duration(300+rng.IntN(2000)) * time.Millisecond {
		f := fault{at: at, kind: kinds[rng.IntN(len(kinds))], target: rng.IntN(cfg.procs)}
		switch f.kind {
		case nemStop:
			f.dur = cfg.ttl + time.Duration(rng.Int64N(int64(cfg.ttl)*3/2))
		case nemKill:
			f.dur = time.Duration(200+rng.IntN(1800)) * time.Millisecond
		case nemLatency:
			f.dur = time.Duration(500+rng.IntN(2500)) * time.Millisecond
		case nemCut:
			f.dur = time.Duration(rng.Int64N(int64(cfg.ttl) * 3 / 2))
		case nemServer:
			f.dur = time.Duration(200+rng.IntN(1800)) * time.Millisecond
		case nemClock:
			f.dur = clockStep(rng, cfg.ttl, at, &lastForward)
		}
		out = append(out, f)
	}
	return out
}

// proc is a client process slot: its fault proxy and its current
// incarnation.
type proc struct {
	n     int
	node  int // the database node it talks to
	proxy *faultproxy.Proxy
	user  string
	inc   int
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has been waited for
}

// harness is a run's controller.
type harness struct {
	t      *testing.T
	cfg    config
	db     database
	admin  *sql.DB   // root on node 0
	admins []*sql.DB // root on each node
	procs  []*proc
	until  int64 // CLOCK_MONOTONIC at which the clients stop
	start  int64

	mu     sync.Mutex
	events []Event        // guarded by mu
	faults map[string]int // guarded by mu
	wg     sync.WaitGroup // readers of the clients' output

	// The clock nemesis's (clock_test.go): the server's libfaketime file,
	// the sum of the steps written to it, and the server's clock minus
	// the machine's before any step.
	clockPath   string
	clockOffset time.Duration
	clockBase   time.Duration
}

// count counts a fault of kind.
func (h *harness) count(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[kind]++
}

func (h *harness) record(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, e)
}

func run(t *testing.T, cfg config) {
	began := time.Now()
	t.Logf("torture: seed %d, %v, %d processes x %d goroutines, TTL %v, nemesis %s",
		cfg.seed, cfg.duration, cfg.procs, cfg.goroutines, cfg.ttl, strings.Join(cfg.nemesis, ","))
	if cfg.dsnTZ != "" {
		t.Logf("torture: the odd client processes' DSN has time_zone '%s'", cfg.dsnTZ)
	}
	ctx := context.Background()
	db := cfg.db
	var clockPath string
	if db == nil {
		var scfg mariadb.Config
		if slices.Contains(cfg.nemesis, nemClock) {
			path, err := clockFile(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			scfg.FakeTimeFile = path
		}
		server, err := mariadb.StartWith(ctx, scfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Stop() })
		db = single{server}
		clockPath = scfg.FakeTimeFile
	}
	h := &harness{t: t, cfg: cfg, db: db, faults: map[string]int{}, clockPath: clockPath}
	for i := range db.nodes() {
		admin, err := sql.Open("mysql", db.dsn(i, ""))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Close() })
		h.admins = append(h.admins, admin)
	}
	h.admin = h.admins[0]
	if h.clockPath != "" {
		var err error
		if h.clockBase, _, err = h.serverOffset(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("torture: the server runs under libfaketime (%s); its clock is %v off the machine's", h.clockPath, h.clockBase)
	}
	names := append([]string{rwName, electName, semName}, mutexNames...)
	for g := range cfg.goroutines {
		names = append(names, fairName(g))
	}
	stmts := []string{
		"CREATE DATABASE torture",
		"CREATE TABLE torture.torture_reg (name VARBINARY(255) PRIMARY KEY, fence BIGINT NOT NULL, k VARCHAR(100) NOT NULL)",
		"CREATE TABLE torture.torture_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARBINARY(255) NOT NULL, fence BIGINT NOT NULL, k VARCHAR(100) NOT NULL)",
		"CREATE TRIGGER torture.torture_logged AFTER UPDATE ON torture.torture_reg FOR EACH ROW INSERT INTO torture.torture_log (name, fence, k) VALUES (NEW.name, NEW.fence, NEW.k)",
	}
	for _, n := range names {
		stmts = append(stmts, "INSERT INTO torture.torture_reg VALUES ('"+n+"', 0, '')")
	}
	for p := range cfg.procs {
		user := "torture" + strconv.Itoa(p)
		stmts = append(stmts, "CREATE USER '"+user+"'@'%'", "GRANT ALL ON torture.* TO '"+user+"'@'%'")
	}
	for _, q := range stmts {
		if _, err := h.admin.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for p := range cfg.procs {
		node := p % db.nodes()
		addr, err := nodeAddr(db.dsn(node, ""))
		if err != nil {
			t.Fatal(err)
		}
		px, err := faultproxy.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		h.procs = append(h.procs, &proc{n: p, node: node, proxy: px, user: "torture" + strconv.Itoa(p), inc: -1})
	}

	plan := schedule(cfg)
	h.start = now()
	h.until = h.start + int64(cfg.duration)
	for _, p := range h.procs {
		h.spawn(p)
	}
	nodesDone := make(chan struct{})
	go func() {
		defer close(nodesDone)
		if n, ok := db.(nodeNemesis); ok && len(cfg.nodeNemesis) > 0 {
			n.nemesis(h, cfg.nodeNemesis)
		}
	}()
	h.nemesis(plan)
	// The clients stop at until; give them time to release and close.
	grace := time.Duration(h.until-now()) + 2*cfg.ttl + 10*time.Second
	deadline := time.After(grace)
	for _, p := range h.procs {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-p.done:
		case <-deadline:
			t.Logf("torture: client %d did not stop in time: killed", p.n)
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			time.Sleep(time.Second)
			h.kill(p)
		}
	}
	h.wg.Wait()
	<-nodesDone // every node is up and Synced again
	elapsed := time.Duration(now() - h.start)
	if figures, err := checkRegisterLog(ctx, h.admins); err != nil {
		t.Errorf("torture: the register's log: %v", err)
	} else {
		t.Logf("torture: the register's log: %s", figures)
	}

	logKeys := map[string]bool{}
	rows, err := h.admin.QueryContext(ctx, "SELECT k FROM torture.torture_log")
	if err != nil {
		t.Fatalf("read the register's log: %v", err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		logKeys[k] = true
	}
	rows.Close()

	h.mu.Lock()
	events := h.events
	h.mu.Unlock()
	checkStart := time.Now()
	b := build(events, cfg.ttl, logKeys)
	anomalies, timedOut := b.check(time.Minute, h.start)
	checkTook := time.Since(checkStart)
	ops := 0
	for _, p := range b.parts {
		ops += len(p)
	}
	var fs []string
	total := 0
	for k, n := range h.faults {
		fs = append(fs, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(fs)
	t.Logf("torture: seed %d: %d client operations (%d without a reply), %d model operations on %d names, %d FairMutex locks with tickets seen, %d Semaphore lines checked (%d of them after a step back of the clock; %d without the session's ticket), %d leader reads of a lost lease after a step back of the clock left out; faults: %d (%s); run %v, check %v",
		cfg.seed, b.complete+b.unknown, b.unknown, ops, len(b.parts), len(b.fairOps), len(b.semLooks)-b.semLooksSkipped, b.semLooksAfterStep, b.semLooksSkipped, b.revivedReads, total, strings.Join(fs, ", "),
		elapsed.Round(time.Millisecond), checkTook.Round(time.Millisecond))
	if h.clockPath != "" {
		if off, _, err := h.serverOffset(ctx); err == nil {
			t.Logf("torture: after %d clock steps the server's clock is %v off the machine's (the steps sum to %v)",
				h.faults[nemClock], off.Round(time.Millisecond), h.clockOffset.Round(time.Millisecond))
		}
	}
	if cfg.summary != "" {
		err := h.writeSummary(runResult{began: began, events: events, modelOps: ops, anomalies: anomalies, timedOut: timedOut, check: checkTook})
		if err != nil {
			t.Errorf("write the summary: %v", err)
		}
	}
	if len(timedOut) > 0 {
		t.Logf("torture: the check of %v ran out of time (inconclusive, not a failure)", timedOut)
	}
	failed := len(anomalies) > 0
	if failed || cfg.out != "" {
		dir := cfg.out
		if dir == "" {
			dir, err = os.MkdirTemp("", "dsync-torture-")
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("history-%d.jsonl", cfg.seed))
		if err := writeHistory(path, events); err != nil {
			t.Errorf("write the history: %v", err)
		}
		t.Logf("torture: the whole history is in %s", path)
		for i, a := range anomalies {
			if a.ops == nil {
				continue
			}
			vis := filepath.Join(dir, fmt.Sprintf("anomaly-%d-%d-%s.html", cfg.seed, i, a.name))
			if err := porcupine.VisualizePath(modelFor(a.name), a.info, vis); err == nil {
				t.Logf("torture: porcupine's view of %s: %s", a.name, vis)
			}
		}
	}
	if failed {
		var sb strings.Builder
		fmt.Fprintf(&sb, "torture: seed %d: %d anomalies (rerun: make %s SEED=%d DURATION=%v)\nnemesis schedule (as run; the seed's plan had %d faults):\n", cfg.seed, len(anomalies), makeTarget(cfg), cfg.seed, cfg.duration, len(plan))
		for _, e := range events {
			if e.Proc == -1 && (e.Op == nemClock || e.Op == nemClockSeen) {
				sb.WriteString(clockLine(e, h.start))
			} else if e.Proc == -1 && isNodeFault(e.Op) {
				fmt.Fprintf(&sb, "  %8.3fs %-8s node %d for %v: %s\n", float64(e.TS-h.start)/1e9, e.Op, e.G+1, time.Duration(e.Dur).Round(time.Millisecond), e.Err)
			} else if e.Proc == -1 {
				fmt.Fprintf(&sb, "  %8.3fs %-8s client %d.%d for %v\n", float64(e.TS-h.start)/1e9, e.Op, e.G, e.Inc, time.Duration(e.Dur).Round(time.Millisecond))
			}
		}
		first := anomalies[0]
		for _, a := range anomalies {
			fmt.Fprintf(&sb, "lock %q: %s\n%s\n", a.name, a.result, a.text)
			if a.last < first.last {
				first = a
			}
		}
		// The history is illegal from the call of the last operation of
		// the smallest illegal sub-history on.
		fmt.Fprintf(&sb, "torture: first anomaly at %.3fs (lock %q; its operations began from %.3fs)\n",
			float64(first.last-h.start)/1e9, first.name, float64(first.first-h.start)/1e9)
		t.Error(sb.String())
	}
}

// spawn starts the next incarnation of client process p.
func (h *harness) spawn(p *proc) {
	p.inc++
	cfg, err := mysql.ParseDSN(h.db.dsn(p.node, "torture"))
	if err != nil {
		h.t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	// A LockTx transaction that writes the register holds its row: others
	// wait for it at most this long. Set on the parsed config: appended as
	// "&..." to a DSN without a "?", it became part of the database's name,
	// and every register write and ticket look outside a LockTx
	// transaction failed with error 1049, unknown database.
	cfg.Params["innodb_lock_wait_timeout"] = "2"
	// The register's DSN: straight to the server, as root.
	reg := cfg.FormatDSN()
	cfg.User = p.user
	cfg.Addr = p.proxy.Addr()
	if h.cfg.dsnTZ != "" && p.n%2 == 1 {
		// A connection time_zone unlike the server's: expiries judged on
		// the session's clock (NOW()) instead of UTC_TIMESTAMP() move.
		cfg.Params["time_zone"] = "'" + h.cfg.dsnTZ + "'"
	}
	// A connection whose reply the proxy dropped never hears back: the
	// client's own statements (its transactions' COMMIT and ROLLBACK, which
	// take no ctx) give up after this; it is longer than any wait of
	// dsync's on a statement (a doorbell's GET_LOCK waits at most 8 s).
	cfg.ReadTimeout = 20 * time.Second
	cfg.WriteTimeout = 20 * time.Second
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envChild+"=1",
		envProc+"="+strconv.Itoa(p.n),
		envInc+"="+strconv.Itoa(p.inc),
		envDSN+"="+cfg.FormatDSN(),
		envRegDSN+"="+reg,
		envSeed+"="+strconv.FormatUint(h.cfg.seed, 10),
		envTTL+"="+h.cfg.ttl.String(),
		envUntil+"="+strconv.FormatInt(h.until, 10),
		envGoroutines+"="+strconv.Itoa(h.cfg.goroutines),
	)
	if h.cfg.noLockTx {
		cmd.Env = append(cmd.Env, envNoLockTx+"=1")
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start client %d: %v", p.n, err)
	}
	p.cmd = cmd
	p.done = make(chan struct{})
	h.wg.Add(1)
	go func(done chan struct{}) {
		defer h.wg.Done()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e Event
			if err := json.Unmarshal(sc.Bytes(), &e); err == nil {
				h.record(e)
			}
		}
		_ = cmd.Wait()
		close(done)
	}(p.done)
}

// kill SIGKILLs p's current incarnation, records it, and waits for it.
func (h *harness) kill(p *proc) {
	h.record(Event{Proc: -1, G: p.n, Inc: p.inc, Type: "event", TS: now(), Op: nemKill})
	_ = p.cmd.Process.Kill()
	<-p.done
}

// nemesis runs the schedule until the clients stop.
func (h *harness) nemesis(plan []fault) {
	rng := rand.New(rand.NewPCG(h.cfg.seed, 1))
	ctx := context.Background()
	for _, f := range plan {
		if wait := time.Duration(h.start + int64(f.at) - now()); wait > 0 {
			time.Sleep(wait)
		}
		if now() > h.until-int64(2*time.Second) {
			break
		}
		p := h.procs[f.target]
		h.record(Event{Proc: -1, G: f.target, Inc: p.inc, Type: "event", TS: now(), Op: f.kind, Dur: int64(f.dur)})
		h.count(f.kind)
		switch f.kind {
		case nemStop:
			_ = p.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(f.dur)
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		case nemKill:
			h.kill(p)
			time.Sleep(f.dur)
			if now() < h.until-int64(time.Second) {
				h.spawn(p)
			}
		case nemKillConn:
			var ids []int64
			rows, err := h.admins[p.node].QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ?", p.user)
			if err == nil {
				for rows.Next() {
					var id int64
					if rows.Scan(&id) == nil {
						ids = append(ids, id)
					}
				}
				rows.Close()
			}
			if len(ids) > 0 {
				_, _ = h.admins[p.node].ExecContext(ctx, "KILL CONNECTION "+strconv.FormatInt(ids[rng.IntN(len(ids))], 10))
			}
		case nemLatency:
			p.proxy.SetLatency(time.Duration(20+rng.IntN(200)) * time.Millisecond)
			time.Sleep(f.dur)
			p.proxy.SetLatency(0)
		case nemCut:
			p.proxy.Cut(true)
			time.Sleep(f.dur)
			p.proxy.Cut(false)
		case nemDrop:
			p.proxy.DropNextReply()
		case nemClock:
			h.stepClock(ctx, f.dur)
		case nemServer:
			if err := h.db.crash(ctx, f.dur); err != nil {
				h.t.Fatalf("restart the server: %v", err)
			}
		}
	}
	if wait := time.Duration(h.until - now()); wait > 0 {
		time.Sleep(wait)
	}
}

//go:build linux && galera

package torture

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// galeraScript runs the throwaway cluster (make torture-galera starts it);
// DSYNC_GALERA_DIR, inherited, says where it lives.
const galeraScript = "../../scripts/galera.sh"

// galeraNodes is the cluster's size.
const galeraNodes = 3

// galeraNemesis is -torture.nemesis's default on a cluster: the client
// faults that make sense there and the node faults. (server, the single
// server's SIGKILL, is nodekill here; LockTx is not supported on Galera.)
const galeraNemesis = "stop,kill,killconn,latency,cut,drop,nodekill,partition"

// TestTortureGalera is TestTorture on a running 3-node Galera cluster
// (make torture-galera starts one and runs it): client process p talks to
// node p % 3 through its own fault proxy, LockTx is left out (the
// Election and the Semaphore run as on one server, their waiters and
// observers polling where there are no doorbells), and besides
// the client faults the nemesis SIGKILLs a node and restarts it, or cuts
// one node off the others' group communication, one node at a time.
func TestTortureGalera(t *testing.T) {
	c := newCluster(t)
	nemesis := *flagNemesis
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "torture.nemesis" })
	if !set {
		nemesis = galeraNemesis
	}
	var clientFaults, nodeFaults []string
	for _, k := range strings.Split(nemesis, ",") {
		switch {
		case k == "":
		case isNodeFault(k):
			nodeFaults = append(nodeFaults, k)
		case k == nemServer:
			t.Fatalf("-torture.nemesis: %q is the single server's fault; on a cluster use %s", k, nemNodeKill)
		case k == nemClock:
			t.Fatalf("-torture.nemesis: %q steps the clock of the run's own server; the cluster's nodes run without libfaketime", k)
		default:
			clientFaults = append(clientFaults, k)
		}
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("torture: Galera cluster of %d nodes, node faults %s", galeraNodes, strings.Join(nodeFaults, ","))
	run(t, config{
		seed:        seed,
		duration:    *flagDuration,
		procs:       *flagProcs,
		goroutines:  *flagGoroutines,
		ttl:         *flagTTL,
		nemesis:     clientFaults,
		out:         *flagOut,
		dsnTZ:       *flagDSNTZ,
		target:      "galera",
		summary:     *flagSummary,
		mutant:      *flagMutant,
		db:          c,
		nodeNemesis: nodeFaults,
		noLockTx:    true,
	})
}

// cluster is the running Galera cluster of scripts/galera.sh.
type cluster struct {
	t    *testing.T
	base [galeraNodes]string // root's DSN straight to each node, no database
}

// galera runs scripts/galera.sh with args and returns its standard output.
func galera(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{galeraScript}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s%s", galeraScript, strings.Join(args, " "), err, out, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// newCluster finds the running cluster, checks that its nodes are Synced,
// and drops what an earlier run left on it (the database torture and its
// users).
func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t}
	for i := range galeraNodes {
		dsn, err := galera("dsn", strconv.Itoa(i+1))
		if err != nil {
			t.Fatalf("%v\n(make torture-galera starts a cluster and runs this test)", err)
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		// A dead node refuses at once; a stalled one should not hang the
		// controller's admin statements.
		cfg.Timeout = 5 * time.Second
		c.base[i] = cfg.FormatDSN()
	}
	ctx := context.Background()
	if err := c.waitSynced(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", c.base[0])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stmts := []string{"DROP DATABASE IF EXISTS torture"}
	for p := range *flagProcs {
		stmts = append(stmts, "DROP USER IF EXISTS 'torture"+strconv.Itoa(p)+"'@'%'")
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return c
}

func (c *cluster) nodes() int { return galeraNodes }

// dsn returns root's DSN to node i. The clients' DSNs (those that select
// the database) wait for causality as dsync's own connections do
// (wsrep_sync_wait = 7), so that the register's writes and the ticket
// reads see every commit of the cluster before them; the controller's
// (none selected) do not, so that they can read a cut-off node's status.
func (c *cluster) dsn(i int, dbName string) string {
	cfg, err := mysql.ParseDSN(c.base[i])
	if err != nil {
		panic(err) // parsed in newCluster
	}
	cfg.DBName = dbName
	if dbName != "" {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["wsrep_sync_wait"] = "7"
	}
	return cfg.FormatDSN()
}

func (c *cluster) crash(context.Context, time.Duration) error {
	return errors.New("the server fault is a single server's; on a cluster the nemesis kills one node (" + nemNodeKill + ")")
}

// nodeState is what a node says of the cluster.
type nodeState struct {
	size   int    // wsrep_cluster_size
	status string // wsrep_cluster_status: Primary, non-Primary, Disconnected
	state  string // wsrep_local_state_comment: Synced, Joining, ...
}

func (s nodeState) String() string {
	return fmt.Sprintf("size %d, %s, %s", s.size, s.status, s.state)
}

// state asks node i, on a connection of its own, what it says of the
// cluster.
func (c *cluster) state(ctx context.Context, i int) (nodeState, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", c.base[i])
	if err != nil {
		return nodeState{}, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
		WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE', 'WSREP_CLUSTER_STATUS', 'WSREP_LOCAL_STATE_COMMENT')`)
	if err != nil {
		return nodeState{}, err
	}
	defer rows.Close()
	var s nodeState
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nodeState{}, err
		}
		switch strings.ToUpper(k) {
		case "WSREP_CLUSTER_SIZE":
			s.size, _ = strconv.Atoi(v)
		case "WSREP_CLUSTER_STATUS":
			s.status = v
		case "WSREP_LOCAL_STATE_COMMENT":
			s.state = v
		}
	}
	return s, rows.Err()
}

// until polls, every 100 ms up to timeout, until ok holds of the states of
// the nodes given; it returns how long that took, and the last states.
func (c *cluster) until(ctx context.Context, timeout time.Duration, nodes []int, ok func(i int, s nodeState) bool) (time.Duration, string, error) {
	start := time.Now()
	for {
		all := true
		var last []string
		for _, i := range nodes {
			s, err := c.state(ctx, i)
			if err != nil {
				last = append(last, fmt.Sprintf("node %d: %v", i+1, err))
				all = false
				continue
			}
			last = append(last, fmt.Sprintf("node %d: %v", i+1, s))
			all = all && ok(i, s)
		}
		if all {
			return time.Since(start), strings.Join(last, "; "), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), strings.Join(last, "; "), fmt.Errorf("not within %v: %s", timeout, strings.Join(last, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func allNodes() []int { return []int{0, 1, 2} }

// others returns the nodes other than n.
func others(n int) []int {
	var o []int
	for i := range galeraNodes {
		if i != n {
			o = append(o, i)
		}
	}
	return o
}

// waitSynced waits until every node is Synced in a Primary cluster of 3.
func (c *cluster) waitSynced(ctx context.Context, timeout time.Duration) error {
	_, _, err := c.until(ctx, timeout, allNodes(), func(_ int, s nodeState) bool {
		return s.size == galeraNodes && s.status == "Primary" && s.state == "Synced"
	})
	return err
}

// isolate cuts node n off the group communication of the others (on), or
// lets it back (off): gmcast.isolate=1 makes the node close every group
// connection it has and refuse new ones, from either side, while its SQL
// clients stay connected.
func (c *cluster) isolate(ctx context.Context, n int, on bool) error {
	db, err := sql.Open("mysql", c.base[n])
	if err != nil {
		return err
	}
	defer db.Close()
	v := "0"
	if on {
		v = "1"
	}
	_, err = db.ExecContext(ctx, "SET GLOBAL wsrep_provider_options = 'gmcast.isolate="+v+"'")
	return err
}

// nemesis runs the node faults, one at a time, each on a random node, from
// 4-10 s after the start, with 3-15 s between the end of one (every node
// Synced again) and the next, until the clients stop; it returns with
// every node Synced. A node fault lasts 3-12 s:
//
//   - nodekill: scripts/galera.sh kill (SIGKILL), proven by the two
//     others reporting a cluster of 2 (waited for past the fault's
//     duration if need be: the eviction takes about 6 s), then
//     scripts/galera.sh restart (the node rejoins by IST).
//   - partition: gmcast.isolate=1 on the node, proven by the node reporting
//     a non-Primary cluster of 1 and the others a Primary cluster of 2;
//     then gmcast.isolate=0 and the node rejoins.
//
// The proof is logged, and recorded as the fault event's Err.
func (c *cluster) nemesis(h *harness, kinds []string) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(h.cfg.seed, 0x6e6f646573))
	next := time.Duration(4000+rng.IntN(6000)) * time.Millisecond
	for {
		if wait := time.Duration(h.start + int64(next) - now()); wait > 0 {
			time.Sleep(wait)
		}
		kind := kinds[rng.IntN(len(kinds))]
		n := rng.IntN(galeraNodes)
		dur := time.Duration(3000+rng.IntN(9000)) * time.Millisecond
		// The fault and its proof must end before the clients stop.
		if now()+int64(dur)+int64(5*time.Second) > h.until {
			return
		}
		start := now()
		h.count(kind)
		var proof string
		var err error
		switch kind {
		case nemNodeKill:
			proof, err = c.killNode(ctx, n, dur)
		case nemPartition:
			proof, err = c.partition(ctx, n, dur)
		}
		if err != nil {
			proof += " FAILED: " + err.Error()
		}
		h.record(Event{Proc: -1, G: n, Type: "event", TS: start, Op: kind, Dur: now() - start, Err: proof})
		h.t.Logf("torture: %8.3fs %s node %d: %s", float64(start-h.start)/1e9, kind, n+1, proof)
		if err != nil {
			h.t.Errorf("torture: %s node %d: %v", kind, n+1, err)
			return
		}
		next = time.Duration(now()-h.start) + time.Duration(3000+rng.IntN(12000))*time.Millisecond
	}
}

// killNode SIGKILLs node n, waits for the others to evict it and for dur,
// and restarts it.
func (c *cluster) killNode(ctx context.Context, n int, dur time.Duration) (string, error) {
	start := time.Now()
	if _, err := galera("kill", strconv.Itoa(n+1)); err != nil {
		return "", err
	}
	took, seen, err := c.until(ctx, dur+30*time.Second, others(n), func(_ int, s nodeState) bool {
		return s.size == galeraNodes-1 && s.status == "Primary"
	})
	proof := fmt.Sprintf("SIGKILLed; the others a Primary cluster of 2 after %.1fs (%s)", took.Seconds(), seen)
	if err != nil {
		return proof, err
	}
	time.Sleep(dur - time.Since(start))
	restart := time.Now()
	if _, err := galera("restart", strconv.Itoa(n+1)); err != nil {
		return proof, err
	}
	if err := c.waitSynced(ctx, 3*time.Minute); err != nil {
		return proof, err
	}
	return proof + fmt.Sprintf("; down %.1fs; restarted, all Synced in %.1fs", restart.Sub(start).Seconds(), time.Since(restart).Seconds()), nil
}

// partition cuts node n off the others for dur, and lets it back.
func (c *cluster) partition(ctx context.Context, n int, dur time.Duration) (string, error) {
	start := time.Now()
	if err := c.isolate(ctx, n, true); err != nil {
		return "", err
	}
	took, seen, err := c.until(ctx, dur+30*time.Second, allNodes(), func(i int, s nodeState) bool {
		if i == n {
			return s.size == 1 && s.status != "Primary"
		}
		return s.size == galeraNodes-1 && s.status == "Primary"
	})
	proof := fmt.Sprintf("gmcast.isolate=1; after %.1fs %s", took.Seconds(), seen)
	if err != nil {
		_ = c.isolate(ctx, n, false)
		return proof, err
	}
	time.Sleep(dur - time.Since(start))
	heal := time.Now()
	if err := c.isolate(ctx, n, false); err != nil {
		return proof, err
	}
	if err := c.waitSynced(ctx, 3*time.Minute); err != nil {
		return proof, err
	}
	return proof + fmt.Sprintf("; cut off %.1fs; healed, all Synced in %.1fs", heal.Sub(start).Seconds(), time.Since(heal).Seconds()), nil
}

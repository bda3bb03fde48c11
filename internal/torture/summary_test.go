//go:build linux

package torture

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

var (
	flagSummary = flag.String("torture.summary", "", "file to write a JSON summary of the run to (see Summary; make verification turns docs/verification/*.json into docs/VERIFICATION.md)")
	flagMutant  = flag.String("torture.mutant", "", "the name of the mutant the tree carries, for the summary (scripts/mutants.sh sets it)")
)

// runResult is what a run found, for its summary.
type runResult struct {
	began     time.Time // the test's start
	events    []Event
	modelOps  int
	anomalies []anomaly
	timedOut  []string
	check     time.Duration
}

// writeSummary writes the run's Summary to cfg.summary.
func (h *harness) writeSummary(r runResult) error {
	cfg := h.cfg
	s := Summary{
		Mutant:          cfg.mutant,
		Target:          cfg.target,
		Command:         command(cfg),
		Date:            r.began.UTC().Format(time.RFC3339),
		Seed:            cfg.seed,
		Duration:        cfg.duration.Seconds(),
		Procs:           cfg.procs,
		Goroutines:      cfg.goroutines,
		TTL:             cfg.ttl.Seconds(),
		Nemesis:         allFaults(cfg),
		DSNTZ:           cfg.dsnTZ,
		Operations:      countOperations(r.events),
		ModelOperations: r.modelOps,
		Faults:          h.faults,
		Anomalies:       []Anomaly{},
		TimedOut:        r.timedOut,
		Check:           r.check.Seconds(),
		Wall:            time.Since(r.began).Seconds(),
		Go:              runtime.Version(),
		Cores:           runtime.NumCPU(),
		OS:              osName(),
		Code:            treeCommit(),
	}
	for _, a := range r.anomalies {
		at := float64(a.last-h.start) / 1e9
		s.Anomalies = append(s.Anomalies, Anomaly{Name: a.name, Check: a.check, At: at})
		if s.FirstAnomaly == 0 || at < s.FirstAnomaly {
			s.FirstAnomaly = at
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.admin.QueryRowContext(ctx, "SELECT VERSION()").Scan(&s.Server); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.summary), 0o755); err != nil {
		return err
	}
	return os.WriteFile(cfg.summary, append(b, '\n'), 0o644)
}

// command returns the make command that reruns the run. It names the
// nemesis's faults whether or not the flag was set, since make torture's
// default (NEMESIS) is not the flag's.
func command(cfg config) string {
	c := fmt.Sprintf("make %s DURATION=%v SEED=%d", makeTarget(cfg), cfg.duration, cfg.seed)
	extra := []string{"-torture.nemesis=" + strings.Join(allFaults(cfg), ",")}
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "torture.duration", "torture.seed", "torture.out", "torture.summary", "torture.mutant", "torture.nemesis":
		default:
			if strings.HasPrefix(f.Name, "torture.") {
				extra = append(extra, "-"+f.Name+"="+f.Value.String())
			}
		}
	})
	return c + " TORTURE_FLAGS='" + strings.Join(extra, " ") + "'"
}

// makeTarget is the make target that runs a run like cfg's.
func makeTarget(cfg config) string {
	if cfg.db != nil {
		return "torture-galera"
	}
	return "torture"
}

// allFaults returns the run's faults: the clients' and, on a cluster, the
// nodes'.
func allFaults(cfg config) []string {
	return append(append([]string(nil), cfg.nemesis...), cfg.nodeNemesis...)
}

// countOperations counts the clients' operations by kind and outcome (see
// Summary.Operations).
func countOperations(events []Event) map[string]map[string]int {
	type key struct {
		proc, inc int
		id        int64
	}
	calls := map[key]string{}
	out := map[string]map[string]int{}
	count := func(op, res string) {
		if out[op] == nil {
			out[op] = map[string]int{}
		}
		out[op][res]++
	}
	for _, e := range events {
		if e.Proc < 0 {
			continue
		}
		k := key{e.Proc, e.Inc, e.ID}
		switch e.Type {
		case "call":
			calls[k] = e.Op
		case "ret":
			if op, ok := calls[k]; ok {
				count(op, e.Res)
				delete(calls, k)
			}
		}
	}
	ops := make([]string, 0, len(calls))
	for _, op := range calls {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		count(op, "none")
	}
	return out
}

// osName returns PRETTY_NAME of /etc/os-release.
func osName() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return runtime.GOOS
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return runtime.GOOS
}

// treeCommit returns the commit of the git work tree the test runs in,
// with "+changes" when tracked files differ from it, or "" when there is
// no work tree or no git.
func treeCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(out))
	if diff, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(diff))) > 0 {
		commit += "+changes"
	}
	return commit
}

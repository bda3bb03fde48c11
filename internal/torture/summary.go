package torture

// Summary is what a torture run writes with -torture.summary=FILE (as
// JSON), and what internal/cmd/verification reads back from
// docs/verification/*.json to generate docs/VERIFICATION.md. It is the one
// non-test type of the package, so that the generator can read it without
// importing the checker.
type Summary struct {
	// Mutant is the name of the mutant (internal/torture/mutants) the run
	// was made against, set by scripts/mutants.sh; empty for a run of the
	// tree as it is.
	Mutant string `json:"mutant,omitempty"`
	// Target is what the clients ran against: "server" (one MariaDB
	// server) or "galera" (a cluster).
	Target     string   `json:"target"`
	Command    string   `json:"command"` // the command that reruns it
	Date       string   `json:"date"`    // when it began, RFC 3339, UTC
	Seed       uint64   `json:"seed"`
	Duration   float64  `json:"duration_s"` // the clients' run, as asked
	Procs      int      `json:"procs"`
	Goroutines int      `json:"goroutines"`
	TTL        float64  `json:"ttl_s"`
	Nemesis    []string `json:"nemesis"`
	DSNTZ      string   `json:"dsn_tz,omitempty"`

	// Operations counts the clients' operations by kind and outcome: ok,
	// fail, landed, refused, unknown (a reply with an unknown outcome),
	// noleader and notleader (an Election's ErrNoLeader and ErrNotLeader),
	// or none (the process died before the reply).
	Operations      map[string]map[string]int `json:"operations"`
	ModelOperations int                       `json:"model_operations"`
	// Faults counts the nemesis's faults by kind.
	Faults    map[string]int `json:"faults"`
	Anomalies []Anomaly      `json:"anomalies"`
	// FirstAnomaly is when the history became illegal, in seconds since
	// the clients began; 0 without anomalies.
	FirstAnomaly float64  `json:"first_anomaly_s,omitempty"`
	TimedOut     []string `json:"timed_out,omitempty"` // names whose check was inconclusive
	Check        float64  `json:"check_s"`             // the checker's time
	Wall         float64  `json:"wall_s"`              // the whole test's time
	Go           string   `json:"go"`
	Cores        int      `json:"cores"`
	OS           string   `json:"os"`
	Server       string   `json:"server"` // SELECT VERSION()
	// Code is the commit of the tree the run was built from (git
	// rev-parse), with "+changes" when the tree differed from it; empty
	// outside a git work tree (scripts/mutants.sh's copies).
	Code string `json:"code,omitempty"`
	// Error is set by scripts/mutants.sh when a run failed without an
	// anomaly (the patch did not apply, the build failed, ...).
	Error string `json:"error,omitempty"`
}

// Anomaly is one anomaly of a Summary.
type Anomaly struct {
	Name  string  `json:"name"`  // the lock name
	Check string  `json:"check"` // "linearizability", "fifo", "observe" or "line" (a Semaphore's)
	At    float64 `json:"at_s"`  // when the history became illegal, seconds since the start
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/torture"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGenerate renders a run's and a mutant's summaries into a template.
func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, s torture.Summary) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("run.json", torture.Summary{Target: "server", Command: "make torture DURATION=30m SEED=7", Date: "2026-11-25T01:00:00Z",
		Seed: 7, Duration: 1800, Procs: 3, Goroutines: 3, TTL: 2, Nemesis: []string{"stop", "clock"},
		Operations: map[string]map[string]int{"lock": {"ok": 1200, "fail": 3}, "write": {"landed": 5, "none": 1}},
		Faults:     map[string]int{"stop": 4, "clock": 2}, Cores: 2, OS: "Debian", Go: "go1.25", Server: "10.11.6-MariaDB"})
	write("mutant-x.json", torture.Summary{Mutant: "x", Target: "server", Seed: 3, Duration: 120,
		Anomalies: []torture.Anomaly{{Name: "f0", Check: "fifo", At: 12.5}}, FirstAnomaly: 12.5})
	write("mutant-y.json", torture.Summary{Mutant: "y", Target: "server", Error: "the patch does not apply"})
	tmpl := filepath.Join(dir, "page.tmpl")
	if err := os.WriteFile(tmpl, []byte("# Page\n\n{{runs}}\n\n{{mutants}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "page.md")
	if err := generate(dir, tmpl, out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		"make torture DURATION=30m SEED=7",
		"| 1,209 | 6 | 0 |", // client operations, faults, anomalies
		"6 (clock 2, stop 4)",
		"| lock | 1,200 | 3 | 0 | 0 |",
		"| `x` | yes | at 12.5 s of 2m00s | fifo f0 |",
		"`DURATION=2m SEED=3 bash scripts/mutants.sh internal/torture/mutants/x.patch`",
		"| `y` | the patch does not apply | | | | | `bash scripts/mutants.sh internal/torture/mutants/y.patch` |",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "{{") {
		t.Errorf("a mark is left in the page:\n%s", page)
	}
	if err := generate(dir, filepath.Join(dir, "run.json"), out); err == nil {
		t.Error("generate with a template without the marks: got nil error; want one")
	}
}

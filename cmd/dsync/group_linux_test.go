//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The command's process group, and the orphans dsync adopts as their
// child subreaper, are Linux's (see proc_linux.go).

// TestLockHeldUntilGroupEnds: a command that exits leaving a job running
// in the background in its process group (sh -c 'job & exit 3') keeps
// the lock until the job has ended, and dsync exits with the command's
// status. A second dsync run of the name, started while the first holds
// the lock, runs its command only after the job has ended. (Before, the
// lock was released as the command exited, and the second command ran
// alongside the job.)
func TestLockHeldUntilGroupEnds(t *testing.T) {
	dir := t.TempDir()
	ready, log := filepath.Join(dir, "ready"), filepath.Join(dir, "log")
	name := lockName(t)
	first := startDsync(t, args([]string{"run", name, "--"},
		script(`(sleep 1; echo job end >> LOG) >/dev/null 2>&1 & echo $! > READY; exit 3`, "READY", ready, "LOG", log))...)
	waitFile(t, ready)
	second := startDsync(t, args([]string{"run", name, "--"}, script(`echo second >> LOG`, "LOG", log))...)
	r1, r2 := first.wait(t), second.wait(t)
	if r1.code != 3 {
		t.Errorf("first dsync: exit status %d; want 3, the command's (stderr %q)", r1.code, r1.stderr)
	}
	if r2.code != 0 {
		t.Errorf("second dsync: exit status %d; want 0 (stderr %q)", r2.code, r2.stderr)
	}
	if got := readLines(t, log); !slices.Equal(got, []string{"job end", "second"}) {
		t.Errorf("log: got %q; want [\"job end\" second]: the second command only once the first's background job has ended", got)
	}
}

// TestOrphansReapedWhileCommandRuns: dsync adopts the orphans of the
// command (it is their child subreaper) and reaps them as they end, while
// the command still runs, so that a long command that keeps orphaning
// helpers leaves no zombies. The command orphans three helpers, which
// record their pid and their parent (dsync, once they are orphans) and
// end, and keeps running. (Before, they stayed dsync's zombies until the
// command ended.)
func TestOrphansReapedWhileCommandRuns(t *testing.T) {
	dir := t.TempDir()
	orphans, ready := filepath.Join(dir, "orphans"), filepath.Join(dir, "ready")
	d := startDsync(t, args([]string{"run", lockName(t), "--"},
		script(`for i in 1 2 3; do (sh -c 'sleep 0.2; echo $$ $(cut -d" " -f4 /proc/$$/stat) >> ORPHANS' &); done
while [ "$(wc -l < ORPHANS 2>/dev/null)" != 3 ]; do sleep 0.05; done
echo ok > READY; while :; do sleep 0.05; done`, "ORPHANS", orphans, "READY", ready))...)
	dsyncPid := d.cmd.Process.Pid
	waitFile(t, ready)
	var pids []int
	for _, line := range readLines(t, orphans) {
		var pid, ppid int
		if _, err := fmt.Sscan(line, &pid, &ppid); err != nil {
			t.Fatalf("orphans: line %q: %v", line, err)
		}
		if ppid != dsyncPid {
			t.Fatalf("orphan %d: parent %d; want dsync (%d): the helper was not dsync's orphan, nothing was tested", pid, ppid, dsyncPid)
		}
		pids = append(pids, pid)
	}
	waitFor(t, fmt.Sprintf("dsync (%d) to reap its ended orphans %v while the command runs", dsyncPid, pids), func() bool {
		for _, pid := range pids {
			if st, ok := readStat(pid); ok && st.ppid == dsyncPid {
				return false
			}
		}
		return true
	})
	if z := zombieChildren(dsyncPid); len(z) > 0 {
		t.Errorf("zombie children of dsync while the command runs: got %v; want none", z)
	}
	d.signal(t, syscall.SIGTERM)
	if r := d.wait(t); r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit status: got %d; want %d (stderr %q)", r.code, 128+int(syscall.SIGTERM), r.stderr)
	}
}

// zombieChildren returns the pids of the children of ppid that have ended
// and are not reaped (state Z in /proc/PID/stat).
func zombieChildren(ppid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var zombies []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 2 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
			zombies = append(zombies, pid)
		}
	}
	return zombies
}

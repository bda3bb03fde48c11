//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/dsynclock/dsync"
)

// pty is a pseudo-terminal whose output the test collects.
type pty struct {
	master, slave *os.File
	mu            sync.Mutex
	out           strings.Builder // guarded by mu
	done          chan struct{}   // closed when the reader returns
}

// openPTY opens a pseudo-terminal with the kernel's default settings (ISIG
// on, Ctrl-C sends SIGINT to the foreground group), closed when the test
// ends.
func openPTY(t *testing.T) *pty {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open /dev/ptmx: %v", err)
	}
	var n uint32
	if err := ioctlFile(master, syscall.TIOCSPTLCK, unsafe.Pointer(new(int32))); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	if err := ioctlFile(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("pty number: %v", err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	p := &pty{master: master, slave: slave, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			p.mu.Lock()
			p.out.Write(buf[:n])
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		slave.Close()
		master.Close()
		<-p.done
	})
	return p
}

// ioctlFile runs an ioctl with a pointer argument on f, without putting f
// in blocking mode (its reads stay interruptible by Close).
func ioctlFile(f *os.File, req uint, arg unsafe.Pointer) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, uintptr(req), uintptr(arg))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// output returns what the terminal has shown so far.
func (p *pty) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// statGroups returns the process group and the terminal's foreground group
// (fields 5 and 8 of /proc/PID/stat) in a saved copy of that file.
func statGroups(t *testing.T, stat string) (pgrp, tpgid int) {
	t.Helper()
	// The command name, field 2, is in parentheses and may hold spaces.
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	pgrp, err1 := strconv.Atoi(fields[2])
	tpgid, err2 := strconv.Atoi(fields[5])
	if err1 != nil || err2 != nil {
		t.Fatalf("bad /proc stat %q", stat)
	}
	return pgrp, tpgid
}

// TestTerminal runs dsync run as a user at a terminal would: from a shell
// that is the session leader of a pseudo-terminal. While dsync waits it
// says once what for and who holds the lock; the command gets the
// terminal's foreground, so a Ctrl-C typed at the terminal reaches it once
// (and neither dsync nor the shell); when the command ends, the terminal
// is the shell's again. A Ctrl-Z, which no shell there could undo, is
// undone by dsync.
func TestTerminal(t *testing.T) {
	bg := context.Background()
	s := newSession(t, dsync.WithLabel("pty-holder"))
	name := lockName(t)
	held := dsync.NewMutex(s, name)
	if err := held.Lock(bg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(n string) string { return filepath.Join(dir, n) }
	command := script(`trap 'echo INT >> INTS' INT; cat /proc/$$/stat > CHILDSTAT; echo ok > READY; `+
		`while [ ! -e STOP ]; do sleep 0.02; done`,
		"INTS", file("ints"), "CHILDSTAT", file("childstat"), "READY", file("ready"), "STOP", file("stop"))
	command[0] = "bash" // not sh: see testJobControl
	shell := fmt.Sprintf(`%s run --wait 60s %s -- %s %s %s; echo $? > STATUS; cat /proc/$$/stat > AFTER`,
		shQuote(binary), shQuote(name), command[0], command[1], shQuote(command[2]))
	shell = strings.NewReplacer("STATUS", shQuote(file("status")), "AFTER", shQuote(file("after"))).Replace(shell)

	tty := openPTY(t)
	sh := exec.Command("sh", "-c", shell)
	sh.Stdin, sh.Stdout, sh.Stderr = tty.slave, tty.slave, tty.slave
	sh.Env = dsyncEnv()
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	p := startCmd(t, sh, nil, nil)

	waitFor(t, "dsync to say what it waits for", func() bool { return strings.Contains(tty.output(), "waiting for lock") })
	want := fmt.Sprintf("dsync: waiting for lock %q held by pty-holder for ", name)
	if out := tty.output(); !strings.Contains(out, want) {
		t.Errorf("terminal: got %q; want a line starting %q", out, want)
	}
	if err := held.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	waitFile(t, file("ready"))
	pgrp, tpgid := statGroups(t, waitFile(t, file("childstat")))
	if pgrp != tpgid {
		t.Errorf("the command's process group %d; the terminal's foreground group %d; want the command's", pgrp, tpgid)
	}
	if pgrp == sh.Process.Pid {
		t.Errorf("the command is in the shell's process group %d; want one of its own", pgrp)
	}

	// A Ctrl-Z first: with no job-control shell to continue the job,
	// dsync continues the command at once (else the Ctrl-C below would
	// never be handled).
	if _, err := tty.master.Write([]byte{26}); err != nil { // Ctrl-Z
		t.Fatal(err)
	}
	if _, err := tty.master.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	waitFile(t, file("ints"))
	time.Sleep(300 * time.Millisecond) // room for a second SIGINT, which must not come
	if err := os.WriteFile(file("stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := p.wait(t); r.code != 0 {
		t.Errorf("shell: exit status %d; want 0 (terminal %q)", r.code, tty.output())
	}
	if got, _ := os.ReadFile(file("ints")); string(got) != "INT\n" {
		t.Errorf("SIGINTs the command saw: got %q; want one", got)
	}
	if got, _ := os.ReadFile(file("status")); strings.TrimSpace(string(got)) != "0" {
		t.Errorf("dsync's exit status: got %q; want 0, the command's (terminal %q)", got, tty.output())
	}
	after, _ := os.ReadFile(file("after")) // written before the shell exited
	if len(after) == 0 {
		t.Fatalf("the shell did not get to the end of its script (terminal %q)", tty.output())
	}
	pgrp, tpgid = statGroups(t, string(after))
	if pgrp != tpgid || pgrp != sh.Process.Pid {
		t.Errorf("after dsync: the shell's process group %d, the terminal's foreground group %d; want both %d, the shell's",
			pgrp, tpgid, sh.Process.Pid)
	}
	if strings.Contains(tty.output(), "DATA RACE") {
		t.Errorf("the race detector found a race: %s", tty.output())
	}
	if strings.Count(tty.output(), "waiting for lock") != 1 {
		t.Errorf("terminal: got %q; want the waiting line once", tty.output())
	}
}

// procState returns the state letter of a process (field 3 of
// /proc/PID/stat): T when stopped.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return fields[0]
}

// TestTerminalJobControl runs dsync run from an interactive bash with job
// control: a Ctrl-Z stops the command and dsync (bash gets the terminal
// back and reports the job stopped), and fg continues both, the command
// with the terminal again; dsync then exits with the command's status. In
// a pipeline, the rest of the job stops too (bash reports a job stopped
// only when all of it is).
func TestTerminalJobControl(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("this test needs bash: %v", err)
	}
	for _, pipe := range []string{"", " | cat"} {
		t.Run("pipe="+pipe, func(t *testing.T) { testJobControl(t, pipe) })
	}
}

// bashPrompt is the prompt of the interactive bash of testJobControl:
// no line the test types holds it.
const bashPrompt = "bash-prompt> "

func testJobControl(t *testing.T, pipe string) {
	dir := t.TempDir()
	file := func(n string) string { return filepath.Join(dir, n) }
	name := lockName(t)
	command := script(`echo $$ > PID; while [ ! -e STOP ]; do sleep 0.02; done; cat /proc/$$/stat > CHILDSTAT; exit 5`,
		"PID", file("pid"), "STOP", file("stop"), "CHILDSTAT", file("childstat"))
	// bash, not sh: dash starts sleep with vfork, and a Ctrl-Z that stops
	// the child between vfork and exec leaves the parent waiting for it,
	// unstopped, so neither dsync nor a shell sees the job stop.
	command[0] = "bash"

	tty := openPTY(t)
	bash := exec.Command("bash", "--norc", "--noprofile", "--noediting", "-i")
	bash.Stdin, bash.Stdout, bash.Stderr = tty.slave, tty.slave, tty.slave
	bash.Env = append(dsyncEnv(), "PS1="+bashPrompt, "HISTFILE=/dev/null", "TERM=dumb")
	bash.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	p := startCmd(t, bash, nil, nil)
	typed := 0 // lines typed
	typeLine := func(line string) {
		t.Helper()
		if _, err := tty.master.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		typed++
	}
	typeLine(fmt.Sprintf("%s run %s -- %s %s %s%s", shQuote(binary), shQuote(name), command[0], command[1], shQuote(command[2]), pipe))
	var pid int
	if _, err := fmt.Sscan(waitFile(t, file("pid")), &pid); err != nil {
		t.Fatal(err)
	}

	if _, err := tty.master.Write([]byte{26}); err != nil { // Ctrl-Z
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("TTY: %q", tty.output())
		}
	}()
	waitFor(t, "bash to report the job stopped", func() bool { return strings.Contains(tty.output(), "Stopped") })
	if state := procState(pid); state != "T" {
		t.Errorf("the command after Ctrl-Z: state %q; want T (stopped)", state)
	}
	typeLine("echo alive-$((20+22))") // bash has the terminal again
	waitFor(t, "bash to answer while the job is stopped", func() bool { return strings.Contains(tty.output(), "alive-42") })
	if err := os.WriteFile(file("stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	typeLine("fg")
	waitFile(t, file("childstat"))
	pgrp, tpgid := statGroups(t, waitFile(t, file("childstat")))
	if pgrp != pid || tpgid != pid {
		t.Errorf("the command after fg: process group %d, terminal's foreground group %d; want both %d", pgrp, tpgid, pid)
	}
	// Type the next line only at bash's prompt: input typed while the job
	// still runs may be discarded when bash takes the terminal back. Bash
	// prints one prompt at its start and one after each line typed (the
	// first line's after the job stopped, fg's after the job ended); the
	// terminal echoes a line as it is typed, which on a busy machine may
	// be before bash has printed the prompt the line answers, so the
	// prompts are counted rather than looked for before the echo of fg.
	waitFor(t, "bash's prompt after the job", func() bool { return strings.Count(tty.output(), bashPrompt) > typed })
	typeLine("echo status-$?")
	waitFor(t, "dsync's exit status", func() bool { return regexp.MustCompile(`(?m)^status-`).MatchString(tty.output()) })
	typeLine("exit")
	p.wait(t)
	out := tty.output()
	if pipe == "" && !strings.Contains(out, "status-5") {
		t.Errorf("dsync's exit status: want 5, the command's; terminal %q", out)
	}
	if strings.Contains(out, "DATA RACE") {
		t.Errorf("the race detector found a race: %s", out)
	}
}

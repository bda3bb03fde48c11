//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// The command gets SIGKILL when dsync dies (PR_SET_PDEATHSIG): its lock
// ends with dsync's lease, so it must not run on without it. The kernel
// sends that signal when the thread that started the command exits, so the
// command is started from the main goroutine, locked here to the main
// thread, which lives as long as the process.
func init() { runtime.LockOSThread() }

// childAttr returns the process attributes of the command: a process group
// of its own (so that dsync can signal the command and whatever it starts,
// as a terminal would) and, when fg is set, the foreground of dsync's
// terminal (its standard input), so that the keys that send signals
// (Ctrl-C, Ctrl-\) reach the command once, and dsync not at all.
func childAttr(fg bool) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:    true,
		Foreground: fg,
		Ctty:       0, // the command's standard input, when fg is set
		Pdeathsig:  syscall.SIGKILL,
	}
}

// ioctlPgrp runs a process group ioctl (TIOCGPGRP, TIOCSPGRP) on fd.
func ioctlPgrp(fd int, req uint, pgrp *int32) error {
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(pgrp)))
	if e != 0 {
		return e
	}
	return nil
}

// foreground reports whether dsync's standard input is its controlling
// terminal and dsync's process group is that terminal's foreground group:
// then the command is given the terminal. (A dsync started in the
// background, or on no terminal, leaves the terminal alone.)
func foreground() bool {
	var pgrp int32
	if ioctlPgrp(0, syscall.TIOCGPGRP, &pgrp) != nil {
		return false
	}
	return int(pgrp) == syscall.Getpgrp()
}

// afterStart is called once the command was started with the terminal:
// dsync, now in the background, ignores SIGTTOU, so that neither its
// messages on the terminal nor taking the terminal back stop it. (Not
// before the start: the command would inherit the ignored SIGTTOU.)
func afterStart() { signal.Ignore(syscall.SIGTTOU) }

// takeTerminalBack makes dsync's process group the terminal's foreground
// group again.
func takeTerminalBack() {
	pgrp := int32(syscall.Getpgrp())
	_ = ioctlPgrp(0, syscall.TIOCSPGRP, &pgrp)
}

// signalChild sends sig to the command's process group: the command and
// the processes it started that stayed in its group, as a terminal does.
func signalChild(pid int, sig syscall.Signal) {
	_ = syscall.Kill(-pid, sig)
}

// adoptOrphans makes dsync the child subreaper of the processes the
// command starts (PR_SET_CHILD_SUBREAPER): those whose parent dies become
// dsync's children rather than init's, so that dsync can reap them
// (reapOrphans) and know when the command's process group is empty
// (groupGone), whatever init does with its orphans.
func adoptOrphans() {
	const prSetChildSubreaper = 36 // <linux/prctl.h>
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// notifyChildExits returns a channel that receives SIGCHLD, which dsync
// gets when one of its children (the command, or an orphan it adopted)
// ends, and the function that stops the notification.
func notifyChildExits() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	return ch, func() { signal.Stop(ch) }
}

// reapOrphans reaps the children of dsync that have ended, other than
// the command (pid): the orphans it adopted (see adoptOrphans), in its
// process group or not. Until the command has been reaped (cmdReaped),
// waitChild waits for it and must be the one to reap it: reapOrphans then
// peeks at the ended children (waitid with WNOWAIT) and reaps only those
// that are not the command, each by its pid; it stops at the command,
// which waitChild reaps next. Once the command has been reaped, every
// child of dsync is an adopted orphan, and reapOrphans reaps them all.
func reapOrphans(pid int, cmdReaped bool) {
	for {
		child := -1
		if !cmdReaped {
			child = endedChild()
			if child <= 0 || child == pid {
				return
			}
		}
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(child, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || wpid <= 0 {
			return
		}
	}
}

// endedChild returns the pid of a child of dsync that has ended and is
// not reaped yet, without reaping it (waitid(P_ALL, WEXITED|WNOHANG|
// WNOWAIT)), or 0 when there is none.
func endedChild() int {
	const (
		pAll    = 0         // idtype_t P_ALL
		wExited = 4         // WEXITED
		wNowait = 0x1000000 // WNOWAIT
	)
	// A siginfo_t: 128 bytes, si_pid after three ints (si_signo, si_errno,
	// si_code), aligned as a pointer. Zeroed: WNOHANG leaves si_pid 0 when
	// no child has ended.
	var info [128 / 8]uint64
	pidOffset := (3*4 + unsafe.Sizeof(uintptr(0)) - 1) &^ (unsafe.Sizeof(uintptr(0)) - 1)
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pAll, 0, uintptr(unsafe.Pointer(&info)),
			wExited|syscall.WNOHANG|wNowait, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0
		}
		return int(*(*int32)(unsafe.Add(unsafe.Pointer(&info), pidOffset)))
	}
}

// groupGone reports whether no process of the process group pgid exists
// any more, not even unreaped.
func groupGone(pgid int) bool { return syscall.Kill(-pgid, 0) == syscall.ESRCH }

// continueChild continues the command's process group, in case it is
// stopped.
func continueChild(pid int) { _ = syscall.Kill(-pid, syscall.SIGCONT) }

// waitChild waits for the command to end and returns its exit status, or
// 128+N when a signal N ended it; then it releases cmd.Process (use the
// pid from before the wait to signal the command meanwhile). With the terminal (fg), it also passes
// on job control: when the command is stopped (Ctrl-Z), dsync takes the
// terminal back and stops itself, so that the shell regains the terminal
// and sees the job stopped; when the job is continued, dsync gives the
// terminal back to the command if the job is in the foreground, and
// continues the command if the lease still holds (see suspend).
func waitChild(cmd *exec.Cmd, fg bool, leaseHolds func() bool) int {
	pid := cmd.Process.Pid
	defer cmd.Process.Release()
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			// Only ECHILD is possible, and only if something else reaped it.
			return exitSignal + int(syscall.SIGKILL)
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return exitSignal + int(ws.Signal())
		case ws.Stopped() && fg:
			suspend(pid, leaseHolds)
		}
	}
}

// suspend stops dsync's job after the command (process group pgid) was
// stopped at the terminal, and continues the command when dsync is
// continued. While dsync is stopped its lease is not renewed: a job stopped
// for longer than about the TTL loses the lock, and the command gets
// SIGKILL when it is continued: suspend continues it only while
// leaseHolds reports the lease safe (not at risk), since a lease lost while
// dsync was stopped may already be another holder's; the stop of the
// command then ends with the SIGTERM or SIGKILL of stopCommand. When no
// shell with job control could continue dsync (see jobControlled), dsync
// continues the command at once, keeping it in the foreground: the stop is
// undone.
func suspend(pgid int, leaseHolds func() bool) {
	if !jobControlled() {
		if leaseHolds() {
			_ = syscall.Kill(-pgid, syscall.SIGCONT)
		}
		return
	}
	var tty int32
	if ioctlPgrp(0, syscall.TIOCGPGRP, &tty) == nil && int(tty) == pgid {
		takeTerminalBack()
	}
	stopJob()
	if foreground() {
		tty = int32(pgid)
		_ = ioctlPgrp(0, syscall.TIOCSPGRP, &tty)
	}
	if leaseHolds() {
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
	}
}

// stopJob stops dsync's process group (dsync, and the rest of a pipeline
// it is part of) with SIGTSTP, as the terminal would have, so that the
// shell sees the job stopped, and returns once dsync is continued. The stop
// may come a moment after kill returns (another thread of dsync may take
// the signal), so it waits for the SIGCONT that ends the stop. (The kernel
// would discard the signal if the group were orphaned; suspend checks that
// it is not.)
func stopJob() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	_ = syscall.Kill(0, syscall.SIGTSTP)
	<-cont
}

// jobControlled reports whether a shell with job control can continue
// dsync's process group: whether the nearest of dsync's ancestors outside
// the group is in dsync's session (the group is then not orphaned).
func jobControlled() bool {
	self, ok := readStat(os.Getpid())
	if !ok {
		return false
	}
	for pid := self.ppid; pid > 0; {
		st, ok := readStat(pid)
		switch {
		case !ok:
			return false
		case st.pgrp != self.pgrp:
			return st.session == self.session
		}
		pid = st.ppid
	}
	return false
}

// procStat is what dsync reads of /proc/PID/stat.
type procStat struct{ ppid, pgrp, session int }

// readStat reads the parent, process group and session of a process.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// After the command name, in parentheses: state ppid pgrp session ...
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return procStat{}, false
	}
	var st procStat
	var err1, err2, err3 error
	st.ppid, err1 = strconv.Atoi(f[1])
	st.pgrp, err2 = strconv.Atoi(f[2])
	st.session, err3 = strconv.Atoi(f[3])
	return st, err1 == nil && err2 == nil && err3 == nil
}

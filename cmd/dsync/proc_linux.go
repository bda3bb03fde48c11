//go:build linux

package main

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
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

// isTerminal reports whether f is a terminal.
func isTerminal(f *os.File) bool {
	var t syscall.Termios
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return e == 0
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
// continues the command.
func waitChild(cmd *exec.Cmd, fg bool) int {
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
			suspend(pid)
		}
	}
}

// suspend stops dsync's job after the command (process group pgid) was
// stopped at the terminal, and continues the command when dsync is
// continued. While dsync is stopped its lease is not renewed: a job stopped
// for longer than about the TTL loses the lock, and the command gets
// SIGTERM as soon as it is continued.
func suspend(pgid int) {
	var tty int32
	if ioctlPgrp(0, syscall.TIOCGPGRP, &tty) == nil && int(tty) == pgid {
		takeTerminalBack()
	}
	_ = syscall.Kill(0, syscall.SIGTSTP) // returns once dsync is continued
	if foreground() {
		tty = int32(pgid)
		_ = ioctlPgrp(0, syscall.TIOCSPGRP, &tty)
	}
	_ = syscall.Kill(-pgid, syscall.SIGCONT)
}

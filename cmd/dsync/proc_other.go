//go:build !linux

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// On systems other than Linux, dsync run does not hand the terminal to the
// command: the command stays in dsync's process group, so a Ctrl-C typed
// at a terminal reaches it directly and again through dsync, and dsync
// does not say on the terminal what it waits for.

func childAttr(fg bool) *syscall.SysProcAttr { return nil }

func foreground() bool { return false }

func afterStart() {}

func takeTerminalBack() {}

// signalChild sends sig to the command.
func signalChild(pid int, sig syscall.Signal) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Signal(sig)
	}
}

func continueChild(pid int) {}

func adoptOrphans() {}

func reapOrphans(pid int, cmdReaped bool) {}

// notifyChildExits returns a nil channel: dsync adopts no orphans here.
func notifyChildExits() (<-chan os.Signal, func()) { return nil, func() {} }

// groupGone reports true: the command has no process group of its own, and
// has been reaped when this is called.
func groupGone(pgid int) bool { return true }

// waitChild waits for the command to end and returns its exit status, or
// 128+N when a signal N ended it.
func waitChild(cmd *exec.Cmd, fg bool, leaseHolds func() bool) int {
	_ = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(interface {
		Signaled() bool
		Signal() syscall.Signal
	})
	if ok && ws.Signaled() {
		return exitSignal + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}

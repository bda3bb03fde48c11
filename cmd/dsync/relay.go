package main

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// relaySignals are the signals dsync passes on to the command.
var relaySignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// A relay receives SIGINT, SIGTERM and SIGHUP for dsync run. While the
// command runs, it forwards each of them to it, once. At other times the
// first of them ends ctx: dsync stops connecting or waiting, releases what
// it holds, and exits with 128+N (or, once the command has ended, with the
// command's status). Signals that dsync was started with ignored (nohup)
// stay ignored, for dsync and the command.
type relay struct {
	ctx    context.Context // ends at the first signal received while no command runs
	cancel context.CancelFunc
	ch     chan os.Signal
	quit   chan struct{} // closed by stop
	done   chan struct{} // closed when loop returns

	mu    sync.Mutex
	first syscall.Signal // guarded by mu; the signal that ended ctx, or 0
	child int            // guarded by mu; the pid of the running command, or 0
}

// newRelay starts receiving the signals; stop ends it.
func newRelay() *relay {
	r := &relay{ch: make(chan os.Signal, 8), quit: make(chan struct{}), done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for _, sig := range relaySignals {
		if !signal.Ignored(sig) {
			signal.Notify(r.ch, sig)
		}
	}
	go r.loop()
	return r
}

func (r *relay) loop() {
	defer close(r.done)
	for {
		select {
		case sig := <-r.ch:
			r.handle(sig.(syscall.Signal))
		case <-r.quit:
			return
		}
	}
}

// handle forwards sig to the running command, or records it and ends ctx.
func (r *relay) handle(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.child != 0 {
		signalChild(r.child, sig)
		return
	}
	if r.first == 0 {
		r.first = sig
		r.cancel()
	}
}

// received returns the signal that ended ctx, if one did.
func (r *relay) received() (syscall.Signal, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first, r.first != 0
}

// start starts cmd unless a signal has ended ctx: then it returns false and
// no error. From a successful start until exited, signals go to cmd.
func (r *relay) start(cmd *exec.Cmd) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.first != 0 {
		return false, nil
	}
	if err := cmd.Start(); err != nil {
		return false, err
	}
	r.child = cmd.Process.Pid
	return true, nil
}

// exited stops forwarding signals to the command, which has ended.
func (r *relay) exited() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.child = 0
}

// stop stops receiving signals (they have their default effect again).
func (r *relay) stop() {
	signal.Stop(r.ch)
	close(r.quit)
	<-r.done
	r.cancel()
}

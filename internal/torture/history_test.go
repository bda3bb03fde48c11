//go:build linux

package torture

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// now returns CLOCK_MONOTONIC in nanoseconds. On Linux that clock is one
// for the whole system, so the timestamps of every process of a run (the
// controller, the nemesis and the clients) can be compared; it runs on
// while a process is stopped (SIGSTOP).
func now() int64 {
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 {
		panic(fmt.Sprintf("clock_gettime: %v", errno))
	}
	return ts.Nano()
}

// Event is one line of a history: the invocation ("call") or completion
// ("ret") of a client's operation, or a point event ("event": a session's
// Done observed, a nemesis action). A client stamps a call before it
// starts the operation and its ret after the operation returned, so the
// interval [call, ret] contains the operation's effect. An operation whose
// process was killed has a call and no ret: its outcome is unknown.
type Event struct {
	Proc  int    `json:"proc"`            // client process number; -1 for the nemesis
	Inc   int    `json:"inc"`             // incarnation of the process (it is restarted after SIGKILL)
	G     int    `json:"g"`               // goroutine number in the process; -1 for the process's session events
	ID    int64  `json:"id"`              // operation id in the incarnation: a call and its ret share it
	Type  string `json:"type"`            // "call", "ret" or "event"
	TS    int64  `json:"ts"`              // CLOCK_MONOTONIC, nanoseconds
	Op    string `json:"op"`              // what: see the op constants
	Name  string `json:"name,omitempty"`  // lock name
	Owner bool   `json:"owner,omitempty"` // the call carried an owner (dsync.WithOwner)
	Sess  int64  `json:"sess,omitempty"`  // the session's lease id
	Fence int64  `json:"fence,omitempty"` // the hold's fence (acquire ret), or the fence written (write)
	Res   string `json:"res,omitempty"`   // ret: ok, fail, landed, refused, unknown, noleader, notleader
	Err   string `json:"err,omitempty"`   // ret: the error, when there was one
	Seq   int64  `json:"seq,omitempty"`   // ticket: the FairMutex ticket seen waiting; observed: the process's Observe call it came from; semlook: the session's latest ticket
	Key   string `json:"key,omitempty"`   // write: the key of its log row
	Dur   int64  `json:"dur,omitempty"`   // nemesis: how long the fault lasts, nanoseconds

	// Elections. Fence is the term (campaign ret, leader and observed
	// rets: the leader's term); Sess the session the call ran on.
	Value  string `json:"value,omitempty"`  // campaign, proclaim: the value sent; leader, observed ret: the leader's value
	Leader int64  `json:"leader,omitempty"` // leader, observed ret: the leader's session (Leader.Session)
	Lost   bool   `json:"lost,omitempty"`   // resign, close ret: the session's lease had ended (Err not nil, or replaced) when it returned

	// Semaphores. Fence is the acquisition's (AcquireFence); Sess the
	// session the call ran on (ret: after it); Seq a line look's own ticket.
	N int64 `json:"n,omitempty"` // semacquire, semtry, semrelease: the permits asked for or given back; semlook: the permits the call's goroutine holds
}

// The operations.
const (
	opLock     = "lock"     // Mutex.Lock
	opTryLock  = "trylock"  // Mutex.TryLock
	opLockTx   = "locktx"   // Mutex.LockTx in a new transaction
	opFairLock = "fairlock" // FairMutex.Lock
	opRLock    = "rlock"    // RWMutex.RLock
	opWLock    = "wlock"    // RWMutex.Lock
	opUnlock   = "unlock"   // Mutex/FairMutex/RWMutex.Unlock
	opRUnlock  = "runlock"  // RWMutex.RUnlock
	opCommit   = "commit"   // the LockTx transaction's COMMIT
	opRollback = "rollback" // the LockTx transaction's ROLLBACK
	opRTS      = "rts"      // ROLLBACK TO SAVEPOINT taken before LockTx
	opCheck    = "check"    // Session.Err() while holding: nil is "ok"
	opWrite    = "write"    // the fenced register's UPDATE ... WHERE fence < ?
	opTicket   = "ticket"   // a FairMutex waiter's ticket seen in the database
	opOpen     = "open"     // NewSession (ret carries the lease id)
	opClose    = "close"    // Session.Close
	opDone     = "done"     // Session.Done() closed (event)

	opCampaign = "campaign" // Election.Campaign (ret: the term, Fence, from Election.Term)
	opProclaim = "proclaim" // Election.Proclaim while leading
	opResign   = "resign"   // Election.Resign after leading
	opLeader   = "leader"   // Election.Leader: ok (the leader), noleader (ErrNoLeader) or fail
	opObserved = "observed" // a Leader delivered by Election.Observe: a read over [call, ret] (see observe)

	opSemAcquire = "semacquire" // Semaphore.AcquireFence (ret: Fence, Sess)
	opSemTry     = "semtry"     // Semaphore.TryAcquireFence: ok (acquired), fail (false, or an error)
	opSemRelease = "semrelease" // Semaphore.Release of N permits
	opSemLook    = "semlook"    // the semaphore's live line read right after a grant (Value: the line, see semLine)
)

// The nemesis's actions (events of Proc -1, Op one of these, G the target).
const (
	nemStop     = "stop"     // SIGSTOP a client for Dur, then SIGCONT
	nemKill     = "kill"     // SIGKILL a client, restarted after Dur
	nemKillConn = "killconn" // KILL CONNECTION of one of a client's connections
	nemLatency  = "latency"  // a client's proxy delays every chunk for Dur
	nemCut      = "cut"      // a client's proxy drops every byte for Dur
	nemDrop     = "drop"     // a client's proxy loses one reply
	nemServer   = "server"   // SIGKILL the database server, restarted after Dur
)

// recorder writes events as JSON lines, one write per line, so that a line
// is whole in the pipe even when its process is killed right after.
type recorder struct {
	mu   sync.Mutex
	w    io.Writer
	proc int
	inc  int
	next int64 // last operation id; guarded by mu
}

// emit stamps e with the recorder's process and writes it.
func (r *recorder) emit(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.Proc, e.Inc = r.proc, r.inc
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	_, _ = r.w.Write(append(b, '\n'))
}

// call records the invocation of op by goroutine g and returns the
// operation's id for ret.
func (r *recorder) call(g int, e Event) int64 {
	r.mu.Lock()
	r.next++
	id := r.next
	r.mu.Unlock()
	e.G, e.ID, e.Type, e.TS = g, id, "call", now()
	r.emit(e)
	return id
}

// ret records the completion of operation id.
func (r *recorder) ret(g int, id int64, e Event) {
	e.G, e.ID, e.Type, e.TS = g, id, "ret", now()
	r.emit(e)
}

// event records a point event.
func (r *recorder) event(g int, e Event) {
	e.G, e.Type, e.TS = g, "event", now()
	r.emit(e)
}

// writeHistory writes events to path as JSON lines.
func writeHistory(path string, events []Event) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readHistory reads a history written by writeHistory.
func readHistory(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		events = append(events, e)
	}
	return events, sc.Err()
}

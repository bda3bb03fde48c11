package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestSchemaIsWhatNewSessionCreates applies Schema's statements on one
// prefix and lets NewSession create the tables of another: every table must
// come out the same, the version must be recorded, and a session must start
// on the applied tables.
func TestSchemaIsWhatNewSessionCreates(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	applied, created := freshPrefix("schemaop"), freshPrefix("schemans")

	stmts, err := dsync.Schema(applied)
	if err != nil {
		t.Fatalf("Schema: got %v; want nil", err)
	}
	if len(stmts) != 8 {
		t.Fatalf("Schema: got %d statements; want 8 (7 tables and the version record)", len(stmts))
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("applying %q: %v", s, err)
		}
	}
	for _, s := range stmts { // all of them are safe to run again
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("applying %q again: %v", s, err)
		}
	}
	if err := sessionOn(t, db, dsync.WithTablePrefix(created)).Close(); err != nil {
		t.Fatalf("Close: got %v; want nil", err)
	}
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket", "txlock", "leader"} {
		a, c := showCreate(t, db, applied+table), showCreate(t, db, created+table)
		if strings.ReplaceAll(a, applied, created) != c {
			t.Errorf("table %s: Schema's statements made\n%s\nNewSession made\n%s", table, a, c)
		}
	}
	var va, vc int
	if err := db.QueryRow("SELECT version FROM `" + applied + "schema`").Scan(&va); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT version FROM `" + created + "schema`").Scan(&vc); err != nil {
		t.Fatal(err)
	}
	if va != vc {
		t.Errorf("recorded schema version: got %d; want %d, as NewSession records", va, vc)
	}
	s, err := dsync.NewSession(bg, db, dsync.WithTablePrefix(applied))
	if err != nil {
		t.Fatalf("NewSession on the applied tables: got %v; want nil", err)
	}
	defer s.Close()
	if ok, err := dsync.NewMutex(s, "x").TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock on the applied tables: got %v, %v; want true, nil", ok, err)
	}
}

// showCreate returns a table's SHOW CREATE TABLE text.
func showCreate(t *testing.T, db *sql.DB, table string) string {
	t.Helper()
	var name, stmt string
	if err := db.QueryRow("SHOW CREATE TABLE `"+table+"`").Scan(&name, &stmt); err != nil {
		t.Fatalf("SHOW CREATE TABLE %s: %v", table, err)
	}
	return stmt
}

// twoSessions returns the test database, a fresh table prefix made from
// tag, and two sessions on its tables with the labels a and b, closed
// when the test ends.
func twoSessions(t *testing.T, tag, a, b string) (*sql.DB, string, *dsync.Session, *dsync.Session) {
	t.Helper()
	db := dbtest.Open(t)
	prefix := freshPrefix(tag)
	return db, prefix, sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithLabel(a)),
		sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithLabel(b))
}

// findHold returns the hold of name, kind and lease id in locks.
func findHold(locks []dsync.LockInfo, name string, kind dsync.LockKind, session int64) (dsync.LockInfo, bool) {
	for _, l := range locks {
		if l.Name == name && l.Kind == kind && l.Session == session {
			return l, true
		}
	}
	return dsync.LockInfo{}, false
}

// waitForLocks polls ListLocks until cond holds for its result, for at
// most 10s, and returns the last result.
func waitForLocks(t *testing.T, db *sql.DB, prefix, what string, cond func([]dsync.LockInfo) bool) []dsync.LockInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := dsync.ListLocks(context.Background(), db, prefix)
		if err != nil {
			t.Fatalf("ListLocks: got %v; want nil", err)
		}
		if cond(locks) {
			return locks
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListLocks: got %+v; want %s", locks, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestListLocks lists holders of every kind, with their waiters: a Mutex
// with a claiming waiter, an RWMutex held by two readers with a writer
// waiting, a FairMutex with a waiter; and checks that released locks, and
// locks of an ended lease, are not listed.
func TestListLocks(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("ls")
	open := func(label string) *dsync.Session {
		return sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithLabel(label))
	}
	a, b, c, d := open("holder-a"), open("holder-b"), open("reader-c"), open("reader-d")
	started := time.Now() // after every session's lease was created

	if locks, err := dsync.ListLocks(bg, db, prefix); err != nil || len(locks) != 0 || locks == nil {
		t.Fatalf("ListLocks with nothing held: got %#v, %v; want an empty, non-nil list", locks, err)
	}

	// A Mutex held by a, which b waits for long enough to claim it.
	mu := dsync.NewMutex(a, "m")
	if err := mu.Lock(bg); err != nil {
		t.Fatal(err)
	}
	waitCtx, stopWaiting := context.WithCancel(bg)
	defer stopWaiting()
	waited := make(chan error, 1)
	go func() { waited <- dsync.NewMutex(b, "m").Lock(waitCtx) }()

	// An RWMutex read by c and d, for which b's writer waits (behind b's
	// Mutex wait: another goroutine).
	for _, s := range []*dsync.Session{c, d} {
		if err := dsync.NewRWMutex(s, "rw").RLock(bg); err != nil {
			t.Fatal(err)
		}
	}
	wrote := make(chan error, 1)
	go func() { wrote <- dsync.NewRWMutex(b, "rw").Lock(waitCtx) }()

	// A FairMutex held by a, which c waits for.
	fair := dsync.NewFairMutex(a, "fair")
	if err := fair.Lock(bg); err != nil {
		t.Fatal(err)
	}
	fairWaited := make(chan error, 1)
	go func() { fairWaited <- dsync.NewFairMutex(c, "fair").Lock(waitCtx) }()

	locks := waitForLocks(t, db, prefix, "3 holds with 1 waiter each, and the readers", func(ls []dsync.LockInfo) bool {
		m, _ := findHold(ls, "m", dsync.KindMutex, a.ID())
		r, _ := findHold(ls, "rw", dsync.KindRead, c.ID())
		f, _ := findHold(ls, "fair", dsync.KindWrite, a.ID())
		return m.Waiters == 1 && r.Waiters == 1 && f.Waiters == 1
	})
	elapsed := time.Since(started)
	want := []dsync.LockInfo{
		{Name: "fair", Kind: dsync.KindWrite, Holder: "holder-a", Session: a.ID(), Fence: fair.Fence(), Waiters: 1},
		{Name: "m", Kind: dsync.KindMutex, Holder: "holder-a", Session: a.ID(), Fence: mu.Fence(), Waiters: 1},
		{Name: "rw", Kind: dsync.KindRead, Holder: "reader-c", Session: c.ID(), Fence: 0, Waiters: 1},
		{Name: "rw", Kind: dsync.KindRead, Holder: "reader-d", Session: d.ID(), Fence: 0, Waiters: 1},
	}
	if c.ID() > d.ID() { // sorted by lease id within a name and kind
		want[2], want[3] = want[3], want[2]
	}
	if len(locks) != len(want) {
		t.Fatalf("ListLocks: got %+v; want %+v", locks, want)
	}
	for i, got := range locks {
		// Held is the age of the hold, on the server's clock: the holds
		// were taken after the leases were created here.
		if got.Held <= 0 || got.Held > elapsed+heldSlack {
			t.Errorf("ListLocks[%d].Held: got %v; want more than 0, at most %v (since the sessions started)", i, got.Held, elapsed)
		}
		got.Held = 0
		if got != want[i] {
			t.Errorf("ListLocks[%d]: got %+v; want %+v", i, got, want[i])
		}
	}
	if mu.Fence() <= 0 || fair.Fence() <= 0 {
		t.Fatalf("fences: got %d, %d; want > 0", mu.Fence(), fair.Fence())
	}

	// LockHolders reads one name: the Mutex and the queued lock of it.
	holders, err := dsync.LockHolders(bg, db, prefix, "rw")
	if err != nil || len(holders) != 2 || holders[0].Kind != dsync.KindRead || holders[1].Kind != dsync.KindRead {
		t.Errorf("LockHolders(rw): got %+v, %v; want the 2 readers", holders, err)
	}
	if err := dsync.NewMutex(d, "fair").Lock(bg); !errors.Is(err, dsync.ErrOtherKind) { // one name, one lock
		t.Fatalf("Mutex.Lock of a FairMutex's name: got %v; want ErrOtherKind", err)
	}
	if err := dsync.NewMutex(d, "fair/m").Lock(bg); err != nil {
		t.Fatal(err)
	}
	holders, err = dsync.LockHolders(bg, db, prefix, "fair")
	if err != nil || len(holders) != 1 || holders[0].Kind != dsync.KindWrite || holders[0].Session != a.ID() {
		t.Errorf("LockHolders(fair): got %+v, %v; want a's FairMutex", holders, err)
	}
	if holders, err := dsync.LockHolders(bg, db, prefix, "nobody"); err != nil || len(holders) != 0 {
		t.Errorf("LockHolders(nobody): got %+v, %v; want none", holders, err)
	}

	// The waiters give up and the readers leave: a's two holds and d's
	// Mutex remain, without waiters.
	stopWaiting()
	for _, ch := range []chan error{waited, wrote, fairWaited} {
		if err := <-ch; !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter: got %v; want context.Canceled", err)
		}
	}
	for _, s := range []*dsync.Session{c, d} {
		if err := dsync.NewRWMutex(s, "rw").RUnlock(bg); err != nil {
			t.Fatal(err)
		}
	}
	waitForLocks(t, db, prefix, "3 holds without waiters", func(ls []dsync.LockInfo) bool {
		if len(ls) != 3 {
			return false
		}
		for _, l := range ls {
			if l.Waiters != 0 { // the Mutex claim lapses within 300ms
				return false
			}
		}
		return true
	})

	// A lease that ended on the server holds nothing, whatever its rows say.
	if _, err := db.Exec("UPDATE `"+prefix+"lease` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", d.ID()); err != nil {
		t.Fatal(err)
	}
	locks, err = dsync.ListLocks(bg, db, prefix)
	if err != nil || len(locks) != 2 {
		t.Fatalf("ListLocks after d's lease ended: got %+v, %v; want a's 2 holds", locks, err)
	}
	for _, l := range locks {
		if l.Session != a.ID() {
			t.Errorf("ListLocks after d's lease ended: got %+v; want only a's holds", l)
		}
	}
}

// TestListLocksWriterAhead checks which tickets hold when a writer holds
// a queued lock: the writer, not the readers queued behind it.
func TestListLocksWriterAhead(t *testing.T) {
	bg := context.Background()
	db, prefix, w, r := twoSessions(t, "lsw", "writer", "reader")
	rw := dsync.NewRWMutex(w, "rw")
	if err := rw.Lock(bg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	read := make(chan error, 1)
	go func() { read <- dsync.NewRWMutex(r, "rw").RLock(ctx) }()
	locks := waitForLocks(t, db, prefix, "the writer's hold with 1 waiter", func(ls []dsync.LockInfo) bool {
		return len(ls) == 1 && ls[0].Waiters == 1
	})
	want := dsync.LockInfo{Name: "rw", Kind: dsync.KindWrite, Holder: "writer", Session: w.ID(), Fence: rw.Fence(), Waiters: 1}
	if got := locks[0]; got.Held <= 0 {
		t.Errorf("Held: got %v; want > 0", got.Held)
	} else if got.Held = 0; got != want {
		t.Errorf("ListLocks: got %+v; want %+v", got, want)
	}
	if err := rw.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("RLock after the writer left: got %v; want nil", err)
	}
	locks = waitForLocks(t, db, prefix, "the reader's hold", func(ls []dsync.LockInfo) bool { return len(ls) == 1 })
	if got := locks[0]; got.Kind != dsync.KindRead || got.Session != r.ID() || got.Fence != 0 || got.Waiters != 0 {
		t.Errorf("ListLocks after the writer left: got %+v; want r's read hold, fence 0, no waiters", got)
	}
}

// TestListLocksSemaphore: ListLocks and LockHolders list a Semaphore's
// holders, one entry per acquisition with its permits, and count the
// session in line behind them as their waiter; ForceRelease frees none
// of them and says why (ErrOtherKind), and LockHolders finds an
// Election's leader under its name.
func TestListLocksSemaphore(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("lssem")
	open := func(label string) *dsync.Session {
		return sessionOn(t, db, dsync.WithTablePrefix(prefix), dsync.WithLabel(label))
	}
	a, b, c := open("a"), open("b"), open("c")
	if err := dsync.NewSemaphore(a, "exports", 3).Acquire(bg, 2); err != nil {
		t.Fatal(err)
	}
	if err := dsync.NewSemaphore(b, "exports", 3).Acquire(bg, 1); err != nil {
		t.Fatal(err)
	}
	waitCtx, stopWaiting := context.WithCancel(bg)
	waited := make(chan error, 1)
	go func() { waited <- dsync.NewSemaphore(c, "exports", 3).Acquire(waitCtx, 2) }()
	defer func() {
		stopWaiting()
		<-waited
	}()
	leader := dsync.NewElection(a, "scheduler")
	if err := leader.Campaign(bg, "a"); err != nil {
		t.Fatal(err)
	}
	locks := waitForLocks(t, db, prefix, "2 Semaphore holders with 1 waiter", func(ls []dsync.LockInfo) bool {
		h, _ := findHold(ls, "exports", dsync.KindSemaphore, a.ID())
		return h.Waiters == 1
	})
	for _, want := range []dsync.LockInfo{
		{Name: "exports", Kind: dsync.KindSemaphore, Holder: "a", Session: a.ID(), Permits: 2, Waiters: 1},
		{Name: "exports", Kind: dsync.KindSemaphore, Holder: "b", Session: b.ID(), Permits: 1, Waiters: 1},
	} {
		got, ok := findHold(locks, want.Name, want.Kind, want.Session)
		got.Held = 0
		if !ok || got != want {
			t.Errorf("ListLocks: got %+v; want %+v in it", locks, want)
		}
	}
	if _, ok := findHold(locks, "exports", dsync.KindSemaphore, c.ID()); ok {
		t.Errorf("ListLocks: got %+v; want the waiter c not listed", locks)
	}
	holders, err := dsync.LockHolders(bg, db, prefix, "exports")
	if err != nil || len(holders) != 2 {
		t.Errorf("LockHolders of the Semaphore: got %+v, %v; want its 2 holders", holders, err)
	}
	holders, err = dsync.LockHolders(bg, db, prefix, "scheduler")
	if err != nil || len(holders) != 1 || holders[0].Kind != dsync.KindLeader || holders[0].Fence != leader.Term() {
		t.Errorf("LockHolders of the Election: got %+v, %v; want its leader, fence %d", holders, err, leader.Term())
	}
	for _, name := range []string{"exports", "scheduler"} {
		if ok, err := dsync.ForceRelease(bg, db, prefix, name); ok || !errors.Is(err, dsync.ErrOtherKind) {
			t.Errorf("ForceRelease of %q: got %v, %v; want false, ErrOtherKind", name, ok, err)
		}
	}
}

// TestForceRelease frees a Mutex held by a live session: another session
// takes it at once with a greater fence, the stuck holder's Unlock reports
// ErrNotHeld, and a lock nobody holds is left alone.
func TestForceRelease(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("force")
	stuck := sessionOn(t, db, dsync.WithTablePrefix(prefix))
	other := sessionOn(t, db, dsync.WithTablePrefix(prefix))
	m := dsync.NewMutex(stuck, "job")
	if err := m.Lock(bg); err != nil {
		t.Fatal(err)
	}
	stale := m.Fence()
	if ok, err := dsync.ForceRelease(bg, db, prefix, "job"); !ok || err != nil {
		t.Fatalf("ForceRelease of a held lock: got %v, %v; want true, nil", ok, err)
	}
	m2 := dsync.NewMutex(other, "job")
	if ok, err := m2.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock after ForceRelease: got %v, %v; want true, nil", ok, err)
	}
	if m2.Fence() <= stale {
		t.Errorf("fence after ForceRelease: got %d; want > %d, the stuck holder's", m2.Fence(), stale)
	}
	if err := m.Unlock(bg); !errors.Is(err, dsync.ErrNotHeld) {
		t.Errorf("the stuck holder's Unlock: got %v; want ErrNotHeld", err)
	}
	if err := stuck.Err(); err != nil {
		t.Errorf("the stuck holder's session: got %v; want it live (it is not told)", err)
	}
	if err := m2.Unlock(bg); err != nil {
		t.Fatal(err)
	}
	if ok, err := dsync.ForceRelease(bg, db, prefix, "job"); ok || err != nil {
		t.Errorf("ForceRelease of a free lock: got %v, %v; want false, nil", ok, err)
	}
	if ok, err := dsync.ForceRelease(bg, db, prefix, "never-used"); ok || err != nil {
		t.Errorf("ForceRelease of a lock never used: got %v, %v; want false, nil", ok, err)
	}
	// A queued lock is untouched.
	fair := dsync.NewFairMutex(other, "queued-job")
	if err := fair.Lock(bg); err != nil {
		t.Fatal(err)
	}
	if ok, err := dsync.ForceRelease(bg, db, prefix, "queued-job"); ok || err != nil {
		t.Errorf("ForceRelease with only a FairMutex held: got %v, %v; want false, nil", ok, err)
	}
	if err := fair.Unlock(bg); err != nil {
		t.Errorf("FairMutex.Unlock after ForceRelease of the Mutex: got %v; want nil", err)
	}
}

// TestAdminMisuse checks the sentinel errors of the operator functions.
func TestAdminMisuse(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	prefix := freshPrefix("adminmisuse")
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"Schema bad prefix", func() error { _, err := dsync.Schema("x-y"); return err }, dsync.ErrInvalidOption},
		{"Schema long prefix", func() error { _, err := dsync.Schema(strings.Repeat("p", 33)); return err }, dsync.ErrInvalidOption},
		{"ListLocks bad prefix", func() error { _, err := dsync.ListLocks(bg, db, "`; DROP"); return err }, dsync.ErrInvalidOption},
		{"ListLocks nil db", func() error { _, err := dsync.ListLocks(bg, nil, prefix); return err }, dsync.ErrInvalidOption},
		{"LockHolders empty name", func() error { _, err := dsync.LockHolders(bg, db, prefix, ""); return err }, dsync.ErrInvalidName},
		{"LockHolders bad prefix", func() error { _, err := dsync.LockHolders(bg, db, "a b", "x"); return err }, dsync.ErrInvalidOption},
		{"ForceRelease empty name", func() error { _, err := dsync.ForceRelease(bg, db, prefix, ""); return err }, dsync.ErrInvalidName},
		{"ForceRelease long name", func() error { _, err := dsync.ForceRelease(bg, db, prefix, strings.Repeat("n", 256)); return err }, dsync.ErrInvalidName},
		{"ForceRelease bad UTF-8", func() error { _, err := dsync.ForceRelease(bg, db, prefix, "\xff"); return err }, dsync.ErrInvalidName},
		{"ForceRelease bad prefix", func() error { _, err := dsync.ForceRelease(bg, db, "é", "x"); return err }, dsync.ErrInvalidOption},
		{"ForceRelease nil db", func() error { _, err := dsync.ForceRelease(bg, nil, prefix, "x"); return err }, dsync.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v; want %v", err, tt.want)
			}
			if n := strings.Count(err.Error(), "dsync:"); n != 1 {
				t.Errorf("got %q (dsync: %d times); want dsync: once", err, n)
			}
		})
	}
	// Tables of a prefix no session has used: a database error, not a panic.
	missing := freshPrefix("nosuch")
	if _, err := dsync.ListLocks(bg, db, missing); err == nil {
		t.Errorf("ListLocks on missing tables: got nil; want an error")
	}
	if _, err := dsync.ForceRelease(bg, db, missing, "x"); err == nil {
		t.Errorf("ForceRelease on missing tables: got nil; want an error")
	}
}

// TestForceReleaseLeavesTheHoldersOtherUnlock: ForceRelease of one lock,
// which kills the holder's doorbell connection to wake that lock's waiters,
// while the holder releases another of its locks on that connection (the
// release rings in its own statement there): that Unlock must still free
// its lock and return nil. The other lock's row is kept locked by a
// transaction of the test, so that the release is still running on the
// doorbell's connection when ForceRelease kills it.
func TestForceReleaseLeavesTheHoldersOtherUnlock(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	holder, waiter, other := sessionOn(t, db), sessionOn(t, db), sessionOn(t, db)
	forced, kept := lockName(t)+"/forced", lockName(t)+"/kept"
	mf, mk := dsync.NewMutex(holder, forced), dsync.NewMutex(holder, kept)
	if err := mf.Lock(bg); err != nil {
		t.Fatal(err)
	}
	if err := mk.Lock(bg); err != nil {
		t.Fatal(err)
	}
	bell := awaitBellOf(t, db, holder.ID())
	got := lockInBackground(t, dsync.NewMutex(waiter, forced))
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var wanted bool
		if err := db.QueryRow("SELECT wanted_until > UTC_TIMESTAMP(6) FROM dsync_lock WHERE name = ?", forced).Scan(&wanted); err != nil {
			t.Fatal(err)
		}
		if wanted {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the waiter never said it waits")
		}
	}

	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT name FROM dsync_lock WHERE name = ? FOR UPDATE", kept); err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	go func() { unlocked <- mk.Unlock(bg) }()
	// The fault: the release runs on the doorbell's connection, waiting
	// for the row, when ForceRelease kills that connection.
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var running int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND COMMAND = 'Execute'", bell).Scan(&running); err != nil {
			t.Fatal(err)
		}
		if running == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the release of the kept lock never ran on the doorbell's connection")
		}
	}
	if ok, err := dsync.ForceRelease(bg, db, "dsync_", forced); !ok || err != nil {
		t.Fatalf("ForceRelease: got %v, %v; want true, nil", ok, err)
	}
	awaitGone(t, db, bell)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-unlocked; err != nil {
		t.Errorf("Unlock of the kept lock while ForceRelease killed the connection it ran on: got %v; want nil", err)
	}
	if at := <-got; at.IsZero() {
		t.Error("the waiter of the forced lock never got it")
	}
	if ok, err := dsync.NewMutex(other, kept).TryLock(bg); !ok || err != nil {
		t.Errorf("TryLock of the kept lock by another session: got %v, %v; want true, nil", ok, err)
	}
}

// heldSlack is what a hold's age (LockInfo.Held, on the server's clock)
// may exceed the same interval timed here by: the server rounds nothing
// (DATETIME(6)), but its clock and this process's are read at slightly
// different moments.
const heldSlack = 20 * time.Millisecond

// TestListLocksHeldIsTheHolds checks that LockInfo.Held is the age of the
// hold, not of the holder's session: holds of every kind taken by a
// session more than a second old, some of them after waiting a second (a
// FairMutex and an RWMutex writer and reader behind another session's
// writers), are listed with an age between the time they have been held
// for sure and the time since they could have begun.
func TestListLocksHeldIsTheHolds(t *testing.T) {
	slowTest(t)
	bg := context.Background()
	db, prefix, a, b := twoSessions(t, "held", "a", "b")
	sessionStarted := time.Now()

	// b holds three queued locks that a waits for, a second long.
	fw, ww, rw := dsync.NewFairMutex(b, "fair-waited"), dsync.NewRWMutex(b, "writer-waited"), dsync.NewRWMutex(b, "reader-waited")
	for _, l := range []interface{ Lock(context.Context) error }{fw, ww, rw} {
		if err := l.Lock(bg); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 3)
	go func() { got <- dsync.NewFairMutex(a, "fair-waited").Lock(bg) }()
	go func() { got <- dsync.NewRWMutex(a, "writer-waited").Lock(bg) }()
	go func() { got <- dsync.NewRWMutex(a, "reader-waited").RLock(bg) }()
	waitForLocks(t, db, prefix, "a's three waits", func(ls []dsync.LockInfo) bool {
		n := 0
		for _, l := range ls {
			n += l.Waiters
		}
		return n == 3
	})
	time.Sleep(time.Until(sessionStarted.Add(1200 * time.Millisecond)))

	released := time.Now() // no hold of a began before this
	for _, l := range []interface{ Unlock(context.Context) error }{fw, ww, rw} {
		if err := l.Unlock(bg); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	// Holds taken at once: a Mutex, a FairMutex and an RWMutex writer (the
	// head slot), an RWMutex reader (a ticket).
	if err := dsync.NewMutex(a, "mutex").Lock(bg); err != nil {
		t.Fatal(err)
	}
	for _, l := range []interface{ Lock(context.Context) error }{dsync.NewFairMutex(a, "fair"), dsync.NewRWMutex(a, "writer")} {
		if err := l.Lock(bg); err != nil {
			t.Fatal(err)
		}
	}
	if err := dsync.NewRWMutex(a, "reader").RLock(bg); err != nil {
		t.Fatal(err)
	}
	// Every hold of a began before this sleep, so it has lasted at least
	// heldFor when the list is read.
	const heldFor = 200 * time.Millisecond
	time.Sleep(heldFor)

	locks, err := dsync.ListLocks(bg, db, prefix)
	upper, sessionAge := time.Since(released), time.Since(sessionStarted)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]dsync.LockKind{
		"fair": dsync.KindWrite, "fair-waited": dsync.KindWrite, "mutex": dsync.KindMutex,
		"reader": dsync.KindRead, "reader-waited": dsync.KindRead, "writer": dsync.KindWrite, "writer-waited": dsync.KindWrite,
	}
	if len(locks) != len(want) {
		t.Fatalf("ListLocks: got %+v; want a's %d holds", locks, len(want))
	}
	for _, l := range locks {
		if l.Session != a.ID() || l.Kind != want[l.Name] {
			t.Errorf("ListLocks: got %+v; want a's %s hold of %s", l, want[l.Name], l.Name)
		}
		if l.Held < heldFor-heldSlack || l.Held > upper+heldSlack {
			t.Errorf("Held of %s (%s): got %v; want from %v (held for sure) to %v (since b released), not the session's age %v",
				l.Name, l.Kind, l.Held, heldFor, upper, sessionAge)
		}
	}
}

// TestAdminUnderDSNSettings: ListLocks, LockHolders and ForceRelease on a
// *sql.DB whose DSN turns autocommit off, alone and with SERIALIZABLE, as
// dsync run's --dsn may. Their reads must not stay in one snapshot across
// calls (with autocommit off the first read begins a transaction that
// the next call on that connection goes on with: the lease's expires_at
// would never move, and a live hold would drop out of the list, which
// dsync run takes for a forced release), nor keep shared locks that hold
// up the holder's renewals; and ForceRelease's release must commit.
func TestAdminUnderDSNSettings(t *testing.T) {
	slowTest(t)
	iso := isolationVar(t, dbtest.Open(t))
	for _, params := range []map[string]string{
		{"autocommit": "0"},
		{"autocommit": "0", iso: "'SERIALIZABLE'"},
	} {
		t.Run(fmt.Sprint(params), func(t *testing.T) {
			bg := context.Background()
			cfg, err := mysql.ParseDSN(dbtest.DSN())
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			maps.Copy(cfg.Params, params)
			admin := dbtest.OpenDSN(t, cfg.FormatDSN())
			admin.SetMaxOpenConns(1) // every call on the one connection
			prefix := freshPrefix("adm")
			holder := sessionOn(t, dbtest.Open(t), dsync.WithTablePrefix(prefix), dsync.WithTTL(time.Second))
			other := sessionOn(t, dbtest.Open(t), dsync.WithTablePrefix(prefix))
			m := dsync.NewMutex(holder, "job")
			if err := m.Lock(bg); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if i > 0 {
					time.Sleep(1200 * time.Millisecond) // past the lease's expires_at as the first look read it
				}
				holds, err := dsync.LockHolders(bg, admin, prefix, "job")
				if err != nil || len(holds) != 1 || holds[0].Session != holder.ID() {
					t.Fatalf("LockHolders, look %d: got %+v, %v; want the live hold of session %d", i, holds, err, holder.ID())
				}
			}
			if err := holder.Err(); err != nil {
				t.Fatalf("the holder's session after the looks: %v; want live (renewals not held up)", err)
			}
			if ok, err := dsync.ForceRelease(bg, admin, prefix, "job"); !ok || err != nil {
				t.Fatalf("ForceRelease: got %v, %v; want true, nil", ok, err)
			}
			ctx, cancel := context.WithTimeout(bg, 3*time.Second)
			defer cancel()
			m2 := dsync.NewMutex(other, "job")
			if ok, err := m2.TryLock(ctx); !ok || err != nil {
				t.Fatalf("another session's TryLock after ForceRelease: got %v, %v; want true, nil (the release committed)", ok, err)
			}
			if err := m2.Unlock(bg); err != nil {
				t.Error(err)
			}
			if err := m.Unlock(bg); !errors.Is(err, dsync.ErrReleasedByForce) {
				t.Errorf("the old holder's Unlock: got %v; want ErrReleasedByForce", err)
			}
		})
	}
}

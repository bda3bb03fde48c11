package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// isolations are the caller's isolation levels LockTx must work under.
var isolations = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead}

// beginTx starts a transaction at iso on db, rolled back when the test ends
// if still open.
func beginTx(t testing.TB, db *sql.DB, iso sql.IsolationLevel) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{Isolation: iso})
	if err != nil {
		t.Fatalf("BeginTx: %v", err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return tx
}

// lockTxPair returns a hold of a name unique to the test, taken by a
// session with LockTx in tx, a transaction at iso on db, and the Mutex of
// the name of the holding session (m1) and of another one (m2).
func lockTxPair(t *testing.T, iso sql.IsolationLevel) (db *sql.DB, tx *sql.Tx, m1, m2 *dsync.Mutex) {
	t.Helper()
	db = dbtest.Open(t)
	name := lockName(t)
	m1, m2 = dsync.NewMutex(newSession(t), name), dsync.NewMutex(newSession(t), name)
	tx = beginTx(t, db, iso)
	if err := m1.LockTx(context.Background(), tx); err != nil {
		t.Fatalf("LockTx: got %v; want nil", err)
	}
	return db, tx, m1, m2
}

// TestLockTxExcludesLockBothWays: a transaction's hold keeps Lock holders of
// another session out until it commits, and a Lock holder keeps LockTx out
// until Unlock; TryLock and TryLockTx answer false at once, without waiting
// for the other side.
func TestLockTxExcludesLockBothWays(t *testing.T) {
	for _, iso := range isolations {
		t.Run(iso.String(), func(t *testing.T) {
			ctx := context.Background()
			db, tx, m1, m2 := lockTxPair(t, iso)
			if m1.Fence() <= 0 {
				t.Fatalf("Fence of a LockTx hold: got %d; want > 0", m1.Fence())
			}
			// A TryLock that waited for the transaction would run into this
			// deadline instead of answering false.
			tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if ok, err := m2.TryLock(tctx); ok || err != nil {
				t.Fatalf("TryLock while a transaction holds it: got %v, %v; want false, nil", ok, err)
			}
			cancel()
			lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			if err := m2.Lock(lctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock while a transaction holds it: got %v; want DeadlineExceeded", err)
			}
			cancel()
			if err := m1.Unlock(ctx); !errors.Is(err, dsync.ErrNotOwner) {
				t.Fatalf("Unlock of a LockTx hold: got %v; want ErrNotOwner", err)
			}

			got := make(chan error, 1)
			go func() { got <- m2.Lock(ctx) }()
			time.Sleep(50 * time.Millisecond)
			select {
			case err := <-got:
				t.Fatalf("Lock returned %v before the transaction ended", err)
			default:
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			if err := <-got; err != nil {
				t.Fatalf("Lock after the commit: got %v; want nil", err)
			}
			f2 := m2.Fence()

			// The other way: a Lock holder keeps LockTx out.
			tx2 := beginTx(t, db, iso)
			if ok, err := m1.TryLockTx(ctx, tx2); ok || err != nil {
				t.Fatalf("TryLockTx while Lock holds it: got %v, %v; want false, nil", ok, err)
			}
			tx2.Rollback()
			tx3 := beginTx(t, db, iso)
			done := make(chan error, 1)
			go func() { done <- m1.LockTx(ctx, tx3) }()
			time.Sleep(50 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("LockTx returned %v while Lock held it", err)
			default:
			}
			if err := m2.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("LockTx after Unlock: got %v; want nil", err)
			}
			if f := m1.Fence(); f <= f2 {
				t.Fatalf("fence of the LockTx hold: got %d; want > %d", f, f2)
			}
			if err := tx3.Rollback(); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
			// A rollback ends the hold too: the session frees the row.
			lctx, cancel = context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := m2.Lock(lctx); err != nil {
				t.Fatalf("Lock after the rollback: got %v; want nil", err)
			}
			if err := m2.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
		})
	}
}

// TestLockTxExclusionUnderLoad: goroutines of three sessions take one name
// in turns, some with LockTx (each incrementing a counter in its
// transaction) and some with Lock (incrementing it in autocommit
// statements), at READ COMMITTED and REPEATABLE READ. Every increment is a
// read and a write apart, so two holders at once would lose one; the
// in-process flag catches an overlap directly.
func TestLockTxExclusionUnderLoad(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	table := fmt.Sprintf("locktx_counter_%d", time.Now().UnixNano())
	if _, err := db.Exec("CREATE TABLE " + table + " (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	defer db.Exec("DROP TABLE " + table)
	if _, err := db.Exec("INSERT INTO " + table + " VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	name := lockName(t)
	sessions := []*dsync.Session{newSession(t), newSession(t), newSession(t)}
	const rounds = 25
	var inside, overlaps, done atomic.Int64
	enter := func() {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		time.Sleep(time.Millisecond)
	}
	leave := func() { inside.Add(-1); done.Add(1) }
	increment := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}) error {
		var n int
		if err := q.QueryRowContext(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
			return err
		}
		_, err := q.ExecContext(ctx, "UPDATE "+table+" SET n = ? WHERE id = 1", n+1)
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i, s := range sessions {
		m := dsync.NewMutex(s, name)
		iso := isolations[i%2]
		wg.Add(2)
		go func() { // transactions
			defer wg.Done()
			for range rounds {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
				if err != nil {
					errs <- err
					return
				}
				if err := m.LockTx(ctx, tx); err != nil {
					tx.Rollback()
					errs <- fmt.Errorf("LockTx: %w", err)
					return
				}
				enter()
				err = increment(tx)
				leave()
				if err == nil {
					err = tx.Commit()
				} else {
					tx.Rollback()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // Lock holders
			defer wg.Done()
			for range rounds {
				if err := m.Lock(ctx); err != nil {
					errs <- fmt.Errorf("Lock: %w", err)
					return
				}
				enter()
				err := increment(db)
				leave()
				if uerr := m.Unlock(ctx); err == nil {
					err = uerr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var n int64
	if err := db.QueryRow("SELECT n FROM " + table + " WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := int64(len(sessions) * 2 * rounds); n != want || done.Load() != want || overlaps.Load() != 0 {
		t.Fatalf("counter %d, holds %d, overlaps %d; want %d, %d, 0", n, done.Load(), overlaps.Load(), want, want)
	}
}

// TestLockTxDeadlockIsReported: two transactions, of two sessions and of one
// session, lock two names in opposite orders: one gets ErrDeadlock (the
// database rolled it back), the other gets both once it does.
func TestLockTxDeadlockIsReported(t *testing.T) {
	for _, sameSession := range []bool{false, true} {
		for _, iso := range isolations {
			t.Run(fmt.Sprintf("same session %v/%v", sameSession, iso), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
				defer cancel()
				db := dbtest.Open(t)
				s1 := newSession(t)
				s2 := s1
				if !sameSession {
					s2 = newSession(t)
				}
				a, b := lockName(t)+"/a", lockName(t)+"/b"
				tx1, tx2 := beginTx(t, db, iso), beginTx(t, db, iso)
				if err := dsync.NewMutex(s1, a).LockTx(ctx, tx1); err != nil {
					t.Fatal(err)
				}
				if err := dsync.NewMutex(s2, b).LockTx(ctx, tx2); err != nil {
					t.Fatal(err)
				}
				errs := make(chan error, 2)
				go func() {
					err := dsync.NewMutex(s1, b).LockTx(ctx, tx1)
					if err != nil {
						tx1.Rollback()
					} else {
						err = tx1.Commit()
					}
					errs <- err
				}()
				go func() {
					err := dsync.NewMutex(s2, a).LockTx(ctx, tx2)
					if err != nil {
						tx2.Rollback()
					} else {
						err = tx2.Commit()
					}
					errs <- err
				}()
				e1, e2 := <-errs, <-errs
				if e1 != nil && e2 != nil || e1 == nil && e2 == nil {
					t.Fatalf("got %v and %v; want one ErrDeadlock and one nil", e1, e2)
				}
				if err := errors.Join(e1, e2); !errors.Is(err, dsync.ErrDeadlock) {
					t.Fatalf("got %v; want ErrDeadlock", err)
				}
			})
		}
	}
}

// TestLockTxNeverBlocksUnlockOrRenewal: a transaction that tried to lock a
// name held by Lock, and gave up, must not hold up that holder's Unlock or
// its session's renewals while it stays open, at REPEATABLE READ too.
func TestLockTxNeverBlocksUnlockOrRenewal(t *testing.T) {
	slowTest(t)
	t.Parallel() // counts no statements: beside the latency tests, after the statement-counting ones
	for _, iso := range isolations {
		t.Run(iso.String(), func(t *testing.T) {
			ctx := context.Background()
			db := dbtest.Open(t)
			holder := newSession(t, dsync.WithTTL(2*time.Second))
			other := newSession(t)
			name := lockName(t)
			hm := dsync.NewMutex(holder, name)
			if err := hm.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			tx := beginTx(t, db, iso)
			wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := dsync.NewMutex(other, name).LockTx(wctx, tx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("LockTx while Lock holds it: got %v; want DeadlineExceeded", err)
			}
			if ok, err := dsync.NewMutex(other, name).TryLockTx(ctx, tx); ok || err != nil {
				t.Fatalf("TryLockTx while Lock holds it: got %v, %v; want false, nil", ok, err)
			}
			// tx stays open past the holder's TTL: its renewals must go on.
			time.Sleep(3 * time.Second)
			if err := holder.Err(); err != nil {
				t.Fatalf("holder's session with the transaction open: %v", err)
			}
			uctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if err := hm.Unlock(uctx); err != nil {
				t.Fatalf("Unlock with the transaction open: got %v; want nil", err)
			}
		})
	}
}

// TestLockTxMisuse: bad input and repeated calls get clear answers.
func TestLockTxMisuse(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	name := lockName(t)
	m := dsync.NewMutex(s, name)
	if err := m.LockTx(ctx, nil); !errors.Is(err, dsync.ErrInvalidOption) {
		t.Fatalf("LockTx(nil): got %v; want ErrInvalidOption", err)
	}
	if err := dsync.NewMutex(s, "").LockTx(ctx, beginTx(t, db, sql.LevelDefault)); !errors.Is(err, dsync.ErrInvalidName) {
		t.Fatalf("LockTx of an empty name: got %v; want ErrInvalidName", err)
	}
	tx := beginTx(t, db, sql.LevelDefault)
	if err := m.LockTx(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := m.LockTx(ctx, tx); err != nil {
		t.Fatalf("LockTx again in the same tx: got %v; want nil", err)
	}
	if ok, err := m.TryLockTx(ctx, tx); !ok || err != nil {
		t.Fatalf("TryLockTx in the same tx: got %v, %v; want true, nil", ok, err)
	}
	if ok, err := m.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock in the process while tx holds it: got %v, %v; want false, nil", ok, err)
	}
	st := s.Stats()
	if st.Acquisitions != 3 || st.Held != 1 {
		t.Fatalf("Stats: %d acquisitions, %d held; want 3, 1", st.Acquisitions, st.Held)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := m.LockTx(ctx, tx); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("LockTx with a committed tx: got %v; want sql.ErrTxDone", err)
	}

	// An owner that holds the name through Lock would wait for itself.
	octx := dsync.WithOwner(ctx)
	if err := m.Lock(octx); err != nil {
		t.Fatalf("Lock after the commit: %v", err)
	}
	tx2 := beginTx(t, db, sql.LevelDefault)
	if err := m.LockTx(octx, tx2); !errors.Is(err, dsync.ErrDeadlock) {
		t.Fatalf("LockTx by the owner holding it through Lock: got %v; want ErrDeadlock", err)
	}
	tx2.Rollback()
	if err := m.Unlock(octx); err != nil {
		t.Fatal(err)
	}
}

// TestLockTxSurvivesItsSessionEnd: the hold belongs to the transaction, not
// the lease: after the session that took it closes, another session still
// cannot take the name until the transaction ends.
func TestLockTxSurvivesItsSessionEnd(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s1, s2 := newSession(t), newSession(t)
	name := lockName(t)
	tx := beginTx(t, db, sql.LevelRepeatableRead)
	if err := dsync.NewMutex(s1, name).LockTx(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	var holder int64
	if err := db.QueryRow("SELECT holder FROM dsync_lock WHERE name = ?", name).Scan(&holder); err != nil || holder != s1.ID() {
		t.Fatalf("committed holder after Close: %d, %v; want the closed session %d", holder, err, s1.ID())
	}
	m2 := dsync.NewMutex(s2, name)
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err := m2.Lock(lctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock while the transaction of a closed session holds it: got %v; want DeadlineExceeded", err)
	}
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx) }()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after the commit: %v", err)
	}
	m2.Unlock(ctx)
}

// TestLockTxNeitherSideStarves measures how long one side waits under a
// steady stream of the other: a Lock waiter of one session while two
// goroutines of another take the name with LockTx transactions back to
// back, and a LockTx waiter while two goroutines hold it with Lock back to
// back. Each wait must end with the lock (a starved waiter would run into
// its 20s deadline) after at most the holds that fit in the claim delay; the waits are
// logged (go test -v -run NeitherSide).
func TestLockTxNeitherSideStarves(t *testing.T) {
	for _, streamTx := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream of LockTx %v", streamTx), func(t *testing.T) {
			ctx := context.Background()
			db := dbtest.Open(t)
			name := lockName(t)
			stream, waiter := newSession(t), newSession(t)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var streamed atomic.Int64
			streamErr := make(chan error, 2)
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					m := dsync.NewMutex(stream, name)
					for {
						select {
						case <-stop:
							return
						default:
						}
						var err error
						if streamTx {
							var tx *sql.Tx
							if tx, err = db.BeginTx(ctx, nil); err == nil {
								if err = m.LockTx(ctx, tx); err == nil {
									time.Sleep(2 * time.Millisecond)
									err = tx.Commit()
								} else {
									tx.Rollback()
								}
							}
						} else if err = m.Lock(ctx); err == nil {
							time.Sleep(2 * time.Millisecond)
							err = m.Unlock(ctx)
						}
						if err != nil {
							streamErr <- err
							return
						}
						streamed.Add(1)
					}
				}()
			}
			defer func() {
				close(stop)
				wg.Wait()
				select {
				case err := <-streamErr:
					t.Errorf("stream: %v", err)
				default:
				}
			}()
			m := dsync.NewMutex(waiter, name)
			var longest, total time.Duration
			var overtaken int64 // most holds of the stream that ended during one wait
			const waits = 10
			for range waits {
				time.Sleep(20 * time.Millisecond) // the stream runs meanwhile
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				start, before := time.Now(), streamed.Load()
				got := func() {
					took := time.Since(start)
					longest, total = max(longest, took), total+took
					overtaken = max(overtaken, streamed.Load()-before)
				}
				var err error
				if streamTx {
					if err = m.Lock(wctx); err == nil {
						got()
						err = m.Unlock(ctx)
					}
				} else {
					var tx *sql.Tx
					if tx, err = db.BeginTx(ctx, nil); err == nil {
						if err = m.LockTx(wctx, tx); err == nil {
							got()
							err = tx.Commit()
						} else {
							tx.Rollback()
						}
					}
				}
				cancel()
				if err != nil {
					t.Fatalf("waiter: %v", err)
				}
			}
			t.Logf("waits of the other side: mean %v, longest %v, at most %d holds of the stream during one; %d holds of the stream in all",
				total/waits, longest, overtaken, streamed.Load())
			// A waiter that loses the races for the free row claims the next
			// hold after polling starveAfter (100ms, mutex.go), so it is
			// overtaken by at most the holds that fit in that time (each
			// takes at least the stream's 2ms sleep: 50), the holds in
			// progress when it began (one per goroutine of the stream) and
			// a few more; a starving one would let the stream go on to its
			// 20s deadline, thousands of holds. (On an idle machine the
			// doorbell wakes it first and it sees 2 or 3; 27 were seen on a
			// loaded 2-core one.)
			if overtaken > 60 {
				t.Errorf("a wait saw %d holds of the stream; want at most 60", overtaken)
			}
		})
	}
}

// TestLockTxConnectionKilled: the server kills the connection of a
// transaction holding a name (the fault: its Commit fails). The database
// rolls the transaction back, which restores the row as the session had
// taken it; the session, waiting for that end, frees it, so another
// session gets the lock, and the lock was never held twice.
func TestLockTxConnectionKilled(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s1, s2 := newSession(t), newSession(t)
	name := lockName(t)
	tx := beginTx(t, db, sql.LevelRepeatableRead)
	if err := dsync.NewMutex(s1, name).LockTx(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	m2 := dsync.NewMutex(s2, name)
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("Lock returned %v while the transaction held the name", err)
	default:
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL %d", id)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err == nil {
		t.Fatal("Commit on a killed connection: got nil; want an error (the fault did not happen)")
	}
	if err := <-got; err != nil {
		t.Fatalf("Lock after the transaction was killed: got %v; want nil", err)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockTxOutsideATransaction: a tx whose connection ran COMMIT itself
// (or a statement that commits implicitly) is in no transaction any more;
// LockTx must not report a hold there (its statements would commit at
// once, leaving the lock free), and must not leave the lock held.
func TestLockTxOutsideATransaction(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s1, s2 := newSession(t), newSession(t)
	name := lockName(t)
	tx := beginTx(t, db, sql.LevelRepeatableRead)
	if _, err := tx.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := dsync.NewMutex(s1, name).LockTx(ctx, tx); !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("LockTx after the transaction committed: got %v; want ErrNotHeld", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m2 := dsync.NewMutex(s2, name)
	if err := m2.Lock(lctx); err != nil {
		t.Fatalf("Lock after the refused LockTx: got %v; want nil", err)
	}
	m2.Unlock(ctx)
}

// TestLockTxWaitersOfARolledBackHold: two transactions of other sessions
// wait for a name whose first LockTx rolls back; both get it in turn, with
// no deadlock reported (there is none: one name).
func TestLockTxWaitersOfARolledBackHold(t *testing.T) {
	for _, iso := range isolations {
		t.Run(iso.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			db := dbtest.Open(t)
			s1, s2, s3 := newSession(t), newSession(t), newSession(t)
			for round := range 3 {
				name := fmt.Sprintf("%s/%d", lockName(t), round) // a new row each round
				tx1 := beginTx(t, db, iso)
				if err := dsync.NewMutex(s1, name).LockTx(ctx, tx1); err != nil {
					t.Fatal(err)
				}
				errs := make(chan error, 2)
				for _, s := range []*dsync.Session{s2, s3} {
					go func() {
						tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
						if err == nil {
							if err = dsync.NewMutex(s, name).LockTx(ctx, tx); err == nil {
								err = tx.Commit()
							} else {
								tx.Rollback()
							}
						}
						errs <- err
					}()
				}
				time.Sleep(100 * time.Millisecond) // both wait
				if err := tx1.Rollback(); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if err := <-errs; err != nil {
						t.Fatalf("round %d: a waiter of the rolled-back hold: %v", round, err)
					}
				}
			}
		})
	}
}

// TestLockTxLeavesTheCallersConnections: with a *sql.DB limited to two
// connections (dsync keeps one), a LockTx hold takes no connection of the
// caller's share, during the hold or after it.
func TestLockTxLeavesTheCallersConnections(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	db.SetMaxOpenConns(2)
	s := newSession(t)
	m := dsync.NewMutex(s, lockName(t))
	for range 3 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.LockTx(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		tx2, err := db.BeginTx(bctx, nil)
		if err != nil {
			cancel()
			t.Fatalf("BeginTx after a LockTx hold: %v (open %d, in use %d)", err, db.Stats().OpenConnections, db.Stats().InUse)
		}
		tx2.Rollback()
		cancel()
	}
}

// TestLockWaitersOnTransactionHoldsKeepTheSessionUsable: Lock waiters of one
// session on names that transactions hold do not occupy the session's
// connections: the session's Unlock of another name, and a TryLock of a
// free one, go through at once.
func TestLockWaitersOnTransactionHoldsKeepTheSessionUsable(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	holder, waiter := newSession(t), newSession(t)
	base := lockName(t)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 4 {
		name := fmt.Sprintf("%s/held%d", base, i)
		tx := beginTx(t, db, sql.LevelReadCommitted)
		if err := dsync.NewMutex(holder, name).LockTx(ctx, tx); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := dsync.NewMutex(waiter, name).Lock(wctx); err == nil {
				t.Errorf("Lock of %s returned while a transaction held it", name)
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(300 * time.Millisecond) // the waiters wait
	other := dsync.NewMutex(waiter, base+"/other")
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	uctx, ucancel := context.WithTimeout(ctx, 2*time.Second)
	defer ucancel()
	if err := other.Unlock(uctx); err != nil {
		t.Fatalf("Unlock beside Lock waiters on transaction holds: %v", err)
	}
	if ok, err := dsync.NewMutex(waiter, base+"/free").TryLock(uctx); !ok || err != nil {
		t.Fatalf("TryLock of a free name beside them: got %v, %v; want true, nil", ok, err)
	}
}

// TestSweepDeletesIdleTxLockRows: the sweep deletes transaction-lock rows
// unused for the free-row age, and skips one that a transaction holds.
func TestSweepDeletesIdleTxLockRows(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	s := newSession(t, dsync.WithFreeRowAge(0))
	base := lockName(t)
	for i := range 3 {
		tx := beginTx(t, db, sql.LevelReadCommitted)
		if err := dsync.NewMutex(s, fmt.Sprintf("%s/%d", base, i)).LockTx(ctx, tx); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() (n int) {
		if err := db.QueryRow("SELECT COUNT(*) FROM dsync_txlock WHERE name LIKE ?", base+"/%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 3 {
		t.Fatalf("txlock rows after three LockTx: got %d; want 3", n)
	}
	time.Sleep(10 * time.Millisecond)
	dsync.SweepPass(s, time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("txlock rows after a sweep with one held: got %d; want 1", n)
	}
}

// txRounds is how many holds the tests of a hold that ends while its
// transaction goes on take: the session learns of that end in the
// background, so a LockTx that trusted what the process recorded failed
// only for some of them where the *sql.DB has no connection limit.
// Where it has one, the session learns of it late, and that LockTx failed
// for every hold: there they take txRoundsLimited.
const (
	txRounds        = 20
	txRoundsLimited = 4
)

// txRoundsFor returns how many holds to take for a session whose *sql.DB
// allows maxOpen connections.
func txRoundsFor(maxOpen int) int {
	if maxOpen > 0 {
		return txRoundsLimited
	}
	return txRounds
}

// txExec runs query in tx, failing the test on an error.
func txExec(t *testing.T, tx *sql.Tx, query string) {
	t.Helper()
	if _, err := tx.Exec(query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// txSessionDBs are the *sql.DB limits of the session under the tests of a
// hold that ends while its transaction goes on: none (the session blocks
// on a connection of its own until the transaction's row lock goes), and a
// limit (it checks for the end now and then, less often as the hold ages).
var txSessionDBs = []int{0, 4}

// txHold is one LockTx hold of a test: its transaction, and the Mutex of
// the holding session (s1 below) and of another one (s2).
type txHold struct {
	tx       *sql.Tx
	m, rival *dsync.Mutex
}

// takeTxHolds takes n LockTx holds of names unique to the test, each in a
// transaction of its own at iso, by a session s1 on a *sql.DB limited to
// maxOpen connections (0: no limit; rival: the same name through another
// session, s2), after a SAVEPOINT a in each transaction when savepoint is
// set. Where s1's *sql.DB has a connection limit, it then waits until s1
// checks for the ends of the holds only now and then (at most every
// 500ms), as it does for holds that have lasted a while.
//
// The names' rows are made first, by a transaction at READ COMMITTED of a
// third session: at REPEATABLE READ, a transaction holding a row keeps a
// gap locked after a page split moves it, and a row inserted there waits
// for the transaction's end.
func takeTxHolds(t *testing.T, iso sql.IsolationLevel, maxOpen, n int, savepoint bool) []txHold {
	t.Helper()
	ctx := context.Background()
	db := dbtest.Open(t)
	s1, s2 := sessionOn(t, openDB(t, dbtest.DSN(), maxOpen)), newSession(t)
	base := lockName(t)
	names := make([]string, n)
	s0, tx0 := newSession(t), beginTx(t, db, sql.LevelReadCommitted)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", base, i)
		if err := dsync.NewMutex(s0, names[i]).LockTx(ctx, tx0); err != nil {
			t.Fatalf("making the row of %s: %v", names[i], err)
		}
	}
	if err := tx0.Commit(); err != nil {
		t.Fatal(err)
	}
	holds := make([]txHold, n)
	for i, name := range names {
		h := txHold{tx: beginTx(t, db, iso), m: dsync.NewMutex(s1, name), rival: dsync.NewMutex(s2, name)}
		if savepoint {
			txExec(t, h.tx, "SAVEPOINT a")
		}
		if err := h.m.LockTx(ctx, h.tx); err != nil {
			t.Fatalf("hold %d: LockTx: %v", i, err)
		}
		holds[i] = h
	}
	if maxOpen > 0 {
		time.Sleep(600 * time.Millisecond)
	}
	return holds
}

// lockTxAgainEnded runs LockTx (or, when try is set, TryLockTx) again in
// the transaction of h, whose hold has ended while it went on (what), and
// fails the test unless it returns ErrNotHeld (and false). When it returns
// nil, it reports whether another session's TryLock then succeeds: two
// holders.
func lockTxAgainEnded(t *testing.T, i int, h txHold, try bool, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	call, ok, err := "LockTx", false, error(nil)
	if try {
		call = "TryLockTx"
		ok, err = h.m.TryLockTx(ctx, h.tx)
	} else {
		err = h.m.LockTx(ctx, h.tx)
		ok = err == nil
	}
	if ok || err == nil {
		rival, rerr := h.rival.TryLock(ctx)
		t.Fatalf("hold %d: %s %s: got %v, %v (another session's TryLock: %v, %v); want false, ErrNotHeld", i, call, what, ok, err, rival, rerr)
	}
	if !errors.Is(err, dsync.ErrNotHeld) {
		t.Fatalf("hold %d: %s %s: got %v; want ErrNotHeld", i, call, what, err)
	}
}

// takeEndedHold takes the lock of h through another session, proving that
// the hold of h has ended, then makes sure LockTx again in its transaction
// still returns ErrNotHeld (it does not wait for that holder), and unlocks.
func takeEndedHold(t *testing.T, i int, h txHold) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.rival.Lock(ctx); err != nil {
		t.Fatalf("hold %d: another session's Lock after the hold ended: got %v; want nil", i, err)
	}
	lockTxAgainEnded(t, i, h, i%2 == 1, "while another session holds the lock")
	if err := h.rival.Unlock(ctx); err != nil {
		t.Fatalf("hold %d: Unlock of another session: got %v; want nil", i, err)
	}
}

// TestLockTxAgainAfterRollbackToSavepoint: ROLLBACK TO SAVEPOINT taken
// before LockTx lets go of the hold's row locks while tx goes on. LockTx or
// TryLockTx again in tx must then return ErrNotHeld, never nil: the hold
// ended, and another session may take the lock while tx runs. It says so
// however long after: once the session freed the row, and while another
// session holds the lock.
func TestLockTxAgainAfterRollbackToSavepoint(t *testing.T) {
	slowTest(t)
	for _, iso := range isolations {
		for _, maxOpen := range txSessionDBs {
			t.Run(fmt.Sprintf("%v/maxOpen=%d", iso, maxOpen), func(t *testing.T) {
				holds := takeTxHolds(t, iso, maxOpen, txRoundsFor(maxOpen), true)
				for i, h := range holds {
					txExec(t, h.tx, "ROLLBACK TO SAVEPOINT a")
					lockTxAgainEnded(t, i, h, i%2 == 1, "after ROLLBACK TO SAVEPOINT")
				}
				for i, h := range holds {
					takeEndedHold(t, i, h)
					if err := h.tx.Commit(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// TestLockTxAfterCommitThroughTx: a COMMIT run through tx ends its hold:
// LockTx again returns ErrNotHeld, never nil, whether tx's connection is
// then in no transaction or has begun another one (a BEGIN run through
// tx), and whether or not the session has seen the hold end by then.
func TestLockTxAfterCommitThroughTx(t *testing.T) {
	slowTest(t)
	for _, begin := range []bool{false, true} {
		for _, maxOpen := range txSessionDBs {
			t.Run(fmt.Sprintf("begin=%v/maxOpen=%d", begin, maxOpen), func(t *testing.T) {
				for i, h := range takeTxHolds(t, sql.LevelRepeatableRead, maxOpen, txRoundsFor(maxOpen), false) {
					txExec(t, h.tx, "COMMIT")
					var inTx bool
					if err := h.tx.QueryRow("SELECT @@in_transaction").Scan(&inTx); err != nil || inTx {
						t.Fatalf("hold %d: @@in_transaction after COMMIT through tx: got %v, %v; want false, nil", i, inTx, err)
					}
					if begin {
						txExec(t, h.tx, "BEGIN")
					}
					lockTxAgainEnded(t, i, h, false, "after COMMIT through tx")
					takeEndedHold(t, i, h)
					h.tx.Rollback()
				}
			})
		}
	}
}

// TestLockTxKeptByRollbackToALaterSavepoint: ROLLBACK TO SAVEPOINT taken
// after LockTx keeps the hold: another session's TryLock fails until tx
// ends, and LockTx again in tx returns nil at once.
func TestLockTxKeptByRollbackToALaterSavepoint(t *testing.T) {
	for _, iso := range isolations {
		t.Run(iso.String(), func(t *testing.T) {
			ctx := context.Background()
			_, tx, m1, m2 := lockTxPair(t, iso)
			fence := m1.Fence()
			txExec(t, tx, "SAVEPOINT b")
			txExec(t, tx, "ROLLBACK TO SAVEPOINT b")
			if ok, err := m2.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock after ROLLBACK TO a savepoint taken after LockTx: got %v, %v; want false, nil", ok, err)
			}
			if err := m1.LockTx(ctx, tx); err != nil {
				t.Fatalf("LockTx again: got %v; want nil", err)
			}
			if got := m1.Fence(); got != fence {
				t.Fatalf("Fence of the kept hold: got %d; want %d", got, fence)
			}
			if ok, err := m2.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock after LockTx again: got %v, %v; want false, nil", ok, err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := m2.Lock(lctx); err != nil {
				t.Fatalf("Lock after the commit: got %v; want nil", err)
			}
			m2.Unlock(ctx)
		})
	}
}

// TestLockTxEndedByRollbackToSavepoint: after ROLLBACK TO SAVEPOINT taken
// before LockTx, and no LockTx again, the hold is over while tx goes on:
// another session gets the lock, and the first session's process neither
// thinks it holds the lock (its TryLockTx in tx returns ErrNotHeld) nor
// keeps it: Lock in that process works, while tx runs and after.
func TestLockTxEndedByRollbackToSavepoint(t *testing.T) {
	for _, maxOpen := range txSessionDBs {
		t.Run(fmt.Sprintf("maxOpen=%d", maxOpen), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db := dbtest.Open(t)
			s1 := sessionOn(t, openDB(t, dbtest.DSN(), maxOpen))
			s2 := newSession(t)
			name := lockName(t)
			m1, m2 := dsync.NewMutex(s1, name), dsync.NewMutex(s2, name)
			tx := beginTx(t, db, sql.LevelRepeatableRead)
			txExec(t, tx, "SAVEPOINT a")
			if err := m1.LockTx(ctx, tx); err != nil {
				t.Fatal(err)
			}
			txExec(t, tx, "ROLLBACK TO SAVEPOINT a")
			// The hold is over: another session gets the lock while tx runs.
			if err := m2.Lock(ctx); err != nil {
				t.Fatalf("another session's Lock after ROLLBACK TO SAVEPOINT: got %v; want nil", err)
			}
			if ok, err := m1.TryLockTx(ctx, tx); ok || !errors.Is(err, dsync.ErrNotHeld) {
				t.Fatalf("TryLockTx in tx while another session holds the lock: got %v, %v; want false, ErrNotHeld", ok, err)
			}
			if err := m2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := m1.Lock(ctx); err != nil {
				t.Fatalf("Lock in the first process while tx runs: %v", err)
			}
			if m1.Fence() <= 0 {
				t.Fatalf("Fence of that Lock: got %d; want > 0", m1.Fence())
			}
			if err := m1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := m1.Lock(ctx); err != nil {
				t.Fatalf("Lock in the first process after tx: %v", err)
			}
			if err := m1.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if st := s1.Stats(); st.Held != 0 {
				t.Fatalf("Stats of the first session at the end: %d held; want 0", st.Held)
			}
		})
	}
}

// BenchmarkLockTxAgain: LockTx again in the transaction that holds the
// name (it asks the database whether the transaction still holds it).
func BenchmarkLockTxAgain(b *testing.B) {
	ctx := context.Background()
	m := dsync.NewMutex(newSession(b), lockName(b))
	tx := beginTx(b, dbtest.Open(b), sql.LevelRepeatableRead)
	if err := m.LockTx(ctx, tx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := m.LockTx(ctx, tx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockTxCommit: a first LockTx in a transaction, and its commit.
func BenchmarkLockTxCommit(b *testing.B) {
	ctx := context.Background()
	db := dbtest.Open(b)
	m := dsync.NewMutex(newSession(b), lockName(b))
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.LockTx(ctx, tx); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLostSessionClosesTxConns: a lost session closes the connections that
// its ended LockTx holds kept idle for the next ones, as it closes its
// lease, doorbell and waiter connections, so that none of the *sql.DB's
// connections stays in use. Before, they stayed open until Close.
func TestLostSessionClosesTxConns(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := sessionOn(t, db)
	m := dsync.NewMutex(s, lockName(t))
	tx := beginTx(t, db, sql.LevelReadCommitted)
	if err := m.LockTx(bg, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); m.Fence() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the LockTx hold after its commit: still held after 10s")
		}
	}
	time.Sleep(50 * time.Millisecond) // its connection goes idle right after
	held := db.Stats().InUse

	dsync.ExpireLocally(s)
	if err := s.Err(); !errors.Is(err, dsync.ErrSessionExpired) {
		t.Fatalf("Err past the deadline: got %v; want ErrSessionExpired", err)
	}
	var inUse int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if inUse = db.Stats().InUse; inUse == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("connections in use after the hold ended: %d; after the session was lost: %d", held, inUse)
	if inUse != 0 {
		t.Errorf("connections in use after the session was lost: got %d; want 0", inUse)
	}
}

// TestLockTxWithoutInTransaction: on a server without MariaDB's
// @@in_transaction (MySQL), LockTx learns that tx is in a transaction from
// the committed lock row after handing the row to tx, and undoes a
// hand-over that committed at once. The tests of that contract run again
// with those statements (dsync.TxCheckAnyServer): a hold excludes Lock
// both ways; outside a transaction LockTx returns ErrNotHeld and leaves
// the lock free; LockTx again after a COMMIT through tx returns
// ErrNotHeld, and after ROLLBACK TO a SAVEPOINT taken after it nil.
func TestLockTxWithoutInTransaction(t *testing.T) {
	slowTest(t)
	t.Cleanup(dsync.TxCheckAnyServer())
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ExcludesLockBothWays", TestLockTxExcludesLockBothWays},
		{"OutsideATransaction", TestLockTxOutsideATransaction},
		{"AfterCommitThroughTx", TestLockTxAfterCommitThroughTx},
		{"KeptByRollbackToALaterSavepoint", TestLockTxKeptByRollbackToALaterSavepoint},
	} {
		t.Run(tc.name, tc.test)
	}
}

package dsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestWokenCheckWaitsForRelease plays a queued handoff whose release rang
// before it committed (a head slot's release rings inside its UPDATE): a
// waiter woken then must not read the line as it was before the release.
// A transaction stands for the release: it frees the head slot (or deletes
// the ticket ahead) and commits 300ms later, while the woken waiter's
// check runs. The check must wait for that commit and then find the lock
// free: a writer takes it, with a fence above the released hold's, and a
// reader counts nothing ahead. A plain check (the code before) read the
// hold as still there, and the waiter went back to a doorbell that had
// already rung.
func TestWokenCheckWaitsForRelease(t *testing.T) {
	ctx := context.Background()
	db := dbtest.Open(t)
	for _, c := range []struct {
		name      string
		exclusive bool
		slot      bool // the release frees the head slot; else it deletes a ticket ahead
	}{
		{"writer behind the head slot", true, true},
		{"reader behind the head slot", false, true},
		{"writer behind a ticket", true, false},
		{"reader behind a ticket", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := lockName(t)
			holder := newSession(t)
			waiting := newSession(t)
			m := dsync.NewFairMutex(holder, name)
			if err := m.Lock(ctx); err != nil { // the head slot
				t.Fatal(err)
			}
			held := m.Fence()
			var next int64
			if err := db.QueryRow(`SELECT seq + 1 FROM dsync_queue WHERE name = ?`, name).Scan(&next); err != nil {
				t.Fatal(err)
			}
			behind := int64(0)
			release, args := `UPDATE dsync_queue SET holder = 0, token = 0 WHERE name = ?`, []any{name}
			if !c.slot {
				// A ticket of the holder's session ahead, released instead.
				behind, next = next, next+1
				if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, 99, 1)`,
					name, behind, holder.ID()); err != nil {
					t.Fatal(err)
				}
				if _, err := db.Exec(release, args...); err != nil {
					t.Fatal(err)
				}
				release, args = `DELETE FROM dsync_ticket WHERE name = ? AND seq = ?`, []any{name, behind}
			}
			mode := 1
			if !c.exclusive {
				mode = 0
			}
			if _, err := db.Exec(`INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, ?, 98, ?)`,
				name, next, waiting.ID(), mode); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Exec(`DELETE FROM dsync_ticket WHERE name = ?`, name) })

			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(release, args...); err != nil {
				tx.Rollback()
				t.Fatal(err)
			}
			committed := make(chan error, 1)
			go func() {
				time.Sleep(300 * time.Millisecond)
				committed <- tx.Commit()
			}()
			ahead, fence, err := dsync.CheckWoken(ctx, waiting, name, next, c.exclusive, behind)
			if cerr := <-committed; cerr != nil {
				t.Fatal(cerr)
			}
			if err != nil {
				t.Fatal(err)
			}
			if ahead != 0 {
				t.Fatalf("conflicting holds and tickets ahead after the release: got %d; want 0", ahead)
			}
			if c.exclusive && fence <= held {
				t.Errorf("fence taken: got %d; want above the released hold's %d", fence, held)
			}
		})
	}
}

package dsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestMutexUncontendedAfterWaitTwoStatements checks that an uncontended
// Lock+Unlock of a Mutex sends two statements (every dsync statement is a
// prepared one) also right after another session waited for the name and
// took it, with doorbells on, on a *sql.DB without a connection limit and
// on ones limited to 8 and 32: the wait left no ring, publish or other
// statement on the uncontended path (issue 19 §5: every release rang the
// doorbell and published its next generation, 3 statements a pair, for
// the 10s that the waiter had said it waited). The count is global to
// the server: a few tries, and the fewest counts.
func TestMutexUncontendedAfterWaitTwoStatements(t *testing.T) {
	ctx := context.Background()
	admin := dbtest.Open(t)
	for _, limit := range []int{0, 8, 32} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			s := sessionOn(t, cappedDB(t, limit), dsync.WithTTL(time.Minute))
			name := lockName(t)
			m, other := dsync.NewMutex(s, name), dsync.NewMutex(newSession(t), name)
			mustLock(t, m, ctx)
			got := make(chan error, 1)
			go func() { got <- other.Lock(ctx) }()
			time.Sleep(200 * time.Millisecond) // it waits, on m's session's doorbell
			mustUnlock(t, m, ctx)
			if err := <-got; err != nil {
				t.Fatalf("Lock of the other session: got %v; want nil", err)
			}
			mustUnlock(t, other, ctx)
			const n = 20
			cycle := func() {
				mustLock(t, m, ctx)
				mustUnlock(t, m, ctx)
			}
			cycle()
			fewest := int64(-1)
			for try := 0; try < 5 && fewest != 2*n; try++ {
				before := stmtExecutes(t, admin)
				for range n {
					cycle()
				}
				if d := stmtExecutes(t, admin) - before; fewest < 0 || d < fewest {
					fewest = d
				}
			}
			if fewest != 2*n {
				t.Errorf("statements for %d uncontended Lock+Unlock after another session waited: got %d; want %d", n, fewest, 2*n)
			}
		})
	}
}

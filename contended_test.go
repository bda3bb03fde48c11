package dsync_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
)

// TestFairContendedStatements counts the statements the server receives
// per acquisition while 4 sessions loop Lock and Unlock on one FairMutex,
// so that nearly every acquisition is contended (the acquirer enqueues,
// blocks on the doorbell of the ticket ahead and takes its turn when
// woken). The count is the server's (Questions, global: every client's
// statements, the lease renewals and doorbells included), so it does not
// depend on the machine's speed; other traffic can only add to it, and
// the fewest of a few tries counts. It is the cost that bounds a
// contended line's throughput on a small server (issue 19 §3).
func TestFairContendedStatements(t *testing.T) {
	ctx := context.Background()
	name := lockName(t)
	const sessions, each = 4, 40
	locks := make([]*dsync.FairMutex, sessions)
	for i := range locks {
		locks[i] = dsync.NewFairMutex(newSession(t, dsync.WithTTL(time.Minute)), name)
	}
	loop := func(n int) {
		var wg sync.WaitGroup
		for _, m := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if err := m.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					if err := m.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	loop(5) // warm up: rows, doorbells, prepared statements
	fewest := -1.0
	for try := 0; try < 3 && !t.Failed(); try++ {
		before := questions(t)
		loop(each)
		per := float64(questions(t)-before-1) / (sessions * each)
		t.Logf("try %d: %.2f statements per acquisition (%d sessions, %d acquisitions each)", try, per, sessions, each)
		if fewest < 0 || per < fewest {
			fewest = per
		}
	}
	t.Logf("statements per contended FairMutex acquisition: %.2f", fewest)
	const most = 5.4
	if fewest > most {
		t.Errorf("statements per contended acquisition: got %.2f; want at most %.2f", fewest, most)
	}
}

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsynclock/dsync"
)

// namesPrefix is the dsync table prefix of the distinct-names scenario, so
// that its lock table holds only its own rows.
const namesPrefix = "benchnames_"

// namesResult is the outcome of the distinct-names scenario.
type namesResult struct {
	n            int
	sessions     int
	goroutines   int
	elapsed      time.Duration // Lock+Unlock of all n names
	rate         float64       // names per second
	age          time.Duration // the configured free-row age
	peakRows     int64         // largest lock-table row count seen
	peakBytes    int64         // data+index bytes of the lock table at its peak
	backAfter    time.Duration // after the last Unlock, until rows <= 1% of peak; -1: never
	waited       time.Duration // how long the clean-up was watched
	finalRows    int64
	finalBytes   int64
	sampled      int   // names locked again after the clean-up
	fenceRepeats int64 // a re-lock's fence not above the name's earlier fence
	zeroFences   int64 // an acquisition reporting no fence
}

// namesName is the i-th distinct name.
func namesName(i int) string { return fmt.Sprintf("name-%07d", i) }

// distinctNames locks and unlocks n distinct names once each with dsync
// Mutexes (goroutines spread over sessions), recording every fence, then
// watches the lock table's row count fall back (with WithFreeRowAge(age))
// and locks a sample of the names again: each new fence must exceed the
// name's recorded one.
func distinctNames(ctx context.Context, e *env, n, sessions, perSession int, age time.Duration, poll time.Duration) (namesResult, error) {
	r := namesResult{n: n, sessions: sessions, goroutines: sessions * perSession, age: age, backAfter: -1}
	opts := []dsync.Option{dsync.WithFreeRowAge(age)}
	dsn := e.srv.mysqlDSN()
	var ss []*dsyncSession
	defer func() {
		for _, s := range ss {
			s.close()
		}
	}()
	for range sessions {
		s, err := newDsyncSession(ctx, dsn, namesPrefix, "mutex", opts...)
		if err != nil {
			return r, err
		}
		ss = append(ss, s)
	}
	table := "`" + namesPrefix + "lock`"
	rows := func() (int64, error) {
		var c int64
		err := e.monitor.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&c)
		return c, err
	}
	var peak, peakBytes atomic.Int64
	// observe counts the rows and, at a new peak, measures the table's size.
	observe := func() (int64, error) {
		c, err := rows()
		if err == nil && c > peak.Load() {
			peak.Store(c)
			if b, err := tableBytes(ctx, e.monitor, namesPrefix+"lock"); err == nil {
				peakBytes.Store(b)
			}
		}
		return c, err
	}

	fences := make([]int64, n)
	var next atomic.Int64
	var zero atomic.Int64
	stopPoll := make(chan struct{})
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		t := time.NewTicker(poll)
		defer t.Stop()
		for {
			select {
			case <-stopPoll:
				return
			case <-t.C:
				_, _ = observe()
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, sessions*perSession)
	var done atomic.Int64
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
	go func() {
		for range progress.C {
			logf("  names: %d of %d (%.0f/s), peak %d rows so far", done.Load(), n, float64(done.Load())/time.Since(start).Seconds(), peak.Load())
		}
	}()
	for _, s := range ss {
		for range perSession {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= n || ctx.Err() != nil {
						return
					}
					m := dsync.NewMutex(s.s, namesName(i))
					if err := m.Lock(ctx); err != nil {
						errs <- err
						return
					}
					f := m.Fence()
					if f == 0 {
						zero.Add(1)
					}
					fences[i] = f
					if err := m.Unlock(ctx); err != nil {
						errs <- err
						return
					}
					done.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	close(stopPoll)
	pollWG.Wait()
	progress.Stop()
	r.elapsed = time.Since(start)
	r.rate = float64(n) / r.elapsed.Seconds()
	r.zeroFences = zero.Load()
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return r, err
	}
	lastUnlock := time.Now()
	if _, err := observe(); err != nil {
		return r, err
	}

	// Watch the clean-up: until the table is back to 1% of its peak, or for
	// long enough past the target (2 x age) to say it was missed.
	limit := max(4*age, 2*age+30*time.Second)
	for {
		c, err := observe()
		if err != nil {
			return r, err
		}
		r.finalRows = c
		if c*100 <= peak.Load() {
			r.backAfter = time.Since(lastUnlock)
			break
		}
		if time.Since(lastUnlock) > limit {
			break
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	r.waited = time.Since(lastUnlock)
	r.peakRows, r.peakBytes = peak.Load(), peakBytes.Load()
	var err error
	if r.finalBytes, err = tableBytes(ctx, e.monitor, namesPrefix+"lock"); err != nil {
		return r, err
	}

	// Lock a sample of the names again: a fence that does not exceed the
	// one recorded (a deleted row started again below it) is a failure.
	step := max(1, n/2000)
	m := ss[0]
	for i := 0; i < n; i += step {
		mu := dsync.NewMutex(m.s, namesName(i))
		if err := mu.Lock(ctx); err != nil {
			return r, err
		}
		if f := mu.Fence(); f <= fences[i] {
			r.fenceRepeats++
			logf("  FENCE REPEAT: %s had fence %d, now %d", namesName(i), fences[i], f)
		}
		if err := mu.Unlock(ctx); err != nil {
			return r, err
		}
		r.sampled++
	}
	return r, nil
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// tableBytes returns the data and index bytes of a table of the benchmark's
// database, after refreshing the statistics they come from.
func tableBytes(ctx context.Context, db *sql.DB, table string) (int64, error) {
	rows, err := db.QueryContext(ctx, "ANALYZE TABLE `"+table+"`")
	if err != nil {
		return 0, err
	}
	for rows.Next() {
	}
	rows.Close()
	var b int64
	err = db.QueryRowContext(ctx, `SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table).Scan(&b)
	return b, err
}

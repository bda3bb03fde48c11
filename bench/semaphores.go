package main

import (
	"context"
	"fmt"
	"math"
)

// semaphoreSystem is dsync's Semaphore of limit permits as a system whose
// Lock acquires one permit and Unlock releases it.
func (e *env) semaphoreSystem(limit int64) *system {
	dsn := e.srv.mysqlDSN()
	return &system{key: "semaphore", name: fmt.Sprintf("dsync `Semaphore`, limit %d, `Acquire(1)`+`Release(1)`", limit), server: "mariadb",
		newSession: func(ctx context.Context) (session, error) {
			s, err := newDsyncSession(ctx, dsn, e.prefix, "semaphore")
			if err != nil {
				return nil, err
			}
			s.limit = limit
			return s, nil
		},
		statements: e.questions, countDesc: "MariaDB `Questions` (SHOW GLOBAL STATUS)", selfCount: 1}
}

// semaphoreScenarios runs the semaphore scenario, run runNo, adding its
// figures to res: uncontended Acquire(1)+Release(1), as a multiple of
// floor, and p.conSessions sessions contending for p.semLimit permits.
func semaphoreScenarios(ctx context.Context, p params, e *env, res *results, runNo int, floor uncontendedResult, fail func(string, ...any)) {
	sys := e.semaphoreSystem(p.semLimit)
	u, err := uncontended(ctx, sys, fmt.Sprintf("sem-unc-%d", runNo), p.uncIters)
	if err != nil {
		fail("semaphore uncontended: %v", err)
	} else {
		res.add("sem.unc.p50", sys.key, ms(u.p50))
		res.add("sem.unc.p99", sys.key, ms(u.p99))
		res.add("sem.unc.rate", sys.key, u.rate)
		res.add("sem.unc.ratio", sys.key, ratioTo(ms(u.p50), ms(floor.p50)))
		res.add("sem.unc.ratio99", sys.key, ratioTo(ms(u.p99), ms(floor.p99)))
		logf("  semaphore   uncontended p50 %.3f ms  p99 %.3f ms  %.2fx floor", ms(u.p50), ms(u.p99), ratioTo(ms(u.p50), ms(floor.p50)))
	}
	if ctx.Err() != nil {
		return
	}
	c, err := contention(ctx, sys, fmt.Sprintf("sem-con-%d", runNo), p.conSessions, p.conDur, int32(p.semLimit), p.semHold)
	if err != nil {
		fail("semaphore contention: %v", err)
	}
	if c.violations > 0 {
		fail("semaphore contention: %d acquisitions beyond the limit of %d", c.violations, p.semLimit)
	}
	res.add("sem.con.acq", sys.key, c.perSecond(c.acquisitions))
	res.add("sem.con.vsfloor", sys.key, ratioTo(c.perSecond(c.acquisitions), floor.rate))
	res.add("sem.con.maxheld", sys.key, float64(c.maxHeld))
	res.add("sem.con.longest", sys.key, ms(c.longestWait))
	res.add("sem.con.violations", sys.key, float64(c.violations))
	res.add("sem.con.share", sys.key, 100*float64(c.handoffs)/math.Max(1, float64(c.acquisitions)))
	logf("  semaphore   %d sessions, limit %d: %.0f acq/s  %.2fx floor serial rate  most held %d  longest %.1f ms  violations %d",
		p.conSessions, p.semLimit, c.perSecond(c.acquisitions), ratioTo(c.perSecond(c.acquisitions), floor.rate), c.maxHeld, ms(c.longestWait), c.violations)
}

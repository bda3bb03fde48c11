package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dsynclock/dsync/internal/connpool"
)

// shared pools of session connections, one per *sql.DB and table prefix.
var pools = struct {
	sync.Mutex
	m map[poolKey]*sharedPool
}{m: make(map[poolKey]*sharedPool)}

type poolKey struct {
	db     *sql.DB
	prefix string
}

type sharedPool struct {
	pool    *connpool.Pool
	galera  bool        // the database is a Galera cluster node
	waiters *bellWaiter // the waiter side of its sessions where the *sql.DB limits its connections (see bellWaiter)
	refs    int         // sessions using it; guarded by pools' mutex
}

// poolSize is how many connections the sessions of db share (see Session)
// for their lock statements, and, when db has a connection limit, for
// their renewals too.
func poolSize(db *sql.DB) (int, error) {
	limit := db.Stats().MaxOpenConnections
	switch {
	case limit == 0:
		// Each session renews on a connection of its own (leaseConn).
		return maxConns - 1, nil
	case limit < 2:
		return 0, fmt.Errorf("%w: the *sql.DB allows %d open connection(s); dsync keeps one of them, so allow at least 2 (SetMaxOpenConns)", ErrInvalidOption, limit)
	case limit < 4:
		return 1, nil // no connection to spare for renewals alone
	}
	return min(max(limit/4, 2), maxConns), nil
}

// poolIdleFor is how long the shared pool of a *sql.DB keeps a
// connection that nobody uses (but the one it keeps for renewals on a
// *sql.DB with a connection limit): its sessions run
// their lock statements on their doorbells' connections when these are
// free (see doorbell.lend), so that the pool serves bursts, and a session
// keeps 2 connections at rest (see docs/OPERATIONS.md, Connections).
const poolIdleFor = time.Second

// bellsMinLimit is the smallest connection limit (SetMaxOpenConns) of a
// *sql.DB on whose sessions waiters block on doorbells: below it, the
// doorbells' connections would take too much of the caller's share, and
// waiters poll.
const bellsMinLimit = 8

// bellsFit reports whether the sessions of db may use doorbells, as far
// as its connection limit goes (see bellsMinLimit).
func bellsFit(db *sql.DB) bool {
	limit := db.Stats().MaxOpenConnections
	return limit == 0 || limit >= bellsMinLimit
}

// dedicatedCap is the most connections of their own (doorbells, and the
// connections waiters block on) that the sessions of db keep open at once
// (connpool's LimitDedicated; 0: no cap): with a connection limit, a
// quarter of it, at least 2, beside poolSize's quarter, so that dsync
// never takes more than half of a limit of 8 and leaves the caller the
// rest; a session that finds no room polls within the paced budget (see
// doorbell.go).
func dedicatedCap(db *sql.DB) int {
	limit := db.Stats().MaxOpenConnections
	if limit == 0 {
		return 0
	}
	return max(limit/4, 2)
}

// acquirePool returns the shared pool of db and prefix, counting a user;
// its galera field says whether the database is a Galera cluster node.
// The first session of a pool asks the server (see isGalera).
func acquirePool(ctx context.Context, db *sql.DB, q *queries) (*sharedPool, error) {
	k := poolKey{db, q.tables[0]}
	pools.Lock()
	sp := pools.m[k]
	pools.Unlock()
	galera := false
	if sp == nil {
		var err error
		if galera, err = isGalera(ctx, db); err != nil {
			return nil, err
		}
	}
	pools.Lock()
	defer pools.Unlock()
	sp = pools.m[k]
	size, err := poolSize(db)
	if err != nil {
		return nil, err
	}
	if sp != nil {
		sp.pool.Resize(size)
	} else {
		setup := []string{qSetSession, qReadCommitted}
		if galera {
			setup = append(setup, qSyncWait)
		}
		// Where sessions renew on the pool's connections (a *sql.DB with a
		// connection limit), every one has the renewal prepared before a
		// renewal needs it, so that a renewal costs one round trip even on
		// a new one; elsewhere they renew on their own (leaseConn, which
		// start leaves with the renewal prepared).
		var eager []int
		if ownLeaseConn(db) == nil {
			eager = append(eager, int(sLeaseRenew))
		}
		sp = &sharedPool{pool: connpool.New(db, size, setup, q.prepared[:], eager...), galera: galera}
		sp.waiters = newBellWaiter(sp.pool, true)
		// Lock statements never use more than maxConns-1 connections; the
		// rest serve renewals.
		sp.pool.LimitNormal(maxConns - 1)
		pools.m[k] = sp
	}
	// Where each session renews on a connection of its own, the pool keeps
	// none for renewals. Every pool closes what it does not use (but the
	// reserve): its sessions run their statements on their doorbells'
	// connections first.
	sp.pool.KeepReserve(db.Stats().MaxOpenConnections != 0)
	sp.pool.CloseIdleAfter(poolIdleFor)
	sp.pool.LimitDedicated(dedicatedCap(db))
	sp.refs++
	return sp, nil
}

// isGalera reports whether db is a Galera cluster node with replication on.
// It runs one read on a connection of db's own pool. It is the first thing
// a new pool does on the server, so it opens the connection as a step of
// its own: a wrong password, an unknown database, a refused port or a
// server that does not answer is reported as such (see connectError), not
// as a failed read.
func isGalera(ctx context.Context, db *sql.DB) (bool, error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return false, connectError(err)
	}
	defer c.Close()
	var name, value string
	err = c.QueryRowContext(ctx, qWsrepOn).Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // not MariaDB, or built without wsrep
	case err != nil:
		return false, opErrorf(err, "read the server's wsrep_on (whether it is a Galera node)")
	}
	return strings.EqualFold(value, "ON"), nil
}

// connectError is the error of a connection to the database that could not
// be opened (or set up): it names that step, and wraps the driver's error,
// which says what failed (the address that refused or did not answer, the
// user that was denied, the database that does not exist). A *sql.DB does
// not tell its address or user, and the DSN may hold a password, so
// nothing more is added.
func connectError(err error) error {
	return opErrorf(err, "connect to the database")
}

// releasePool drops a user of a shared pool, closing it after the last.
func releasePool(db *sql.DB, q *queries) {
	pools.Lock()
	defer pools.Unlock()
	k := poolKey{db, q.tables[0]}
	sp := pools.m[k]
	if sp.refs--; sp.refs == 0 {
		delete(pools.m, k)
		sp.waiters.stop() // its calls have gone with their sessions
		sp.pool.Close()
	} else if size, err := poolSize(db); err == nil {
		sp.pool.Resize(size)
	}
}

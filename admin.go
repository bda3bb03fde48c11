package dsync

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Operator functions: what the dsync command (cmd/dsync) needs besides
// locks. They take the caller's *sql.DB and a table prefix, need no
// Session, and send the statements of queries_admin.go.

// Schema returns the statements that create dsync's tables for prefix, in
// the order [NewSession] runs them: the CREATE TABLE statements (each IF NOT
// EXISTS) and, right after the schema table's, the INSERT that records the
// schema version. Run in order, they leave exactly what NewSession creates,
// for an operator who creates the tables ahead of time (say, with a user
// that the applications' users are not: NewSession then runs no DDL). It
// returns an error wrapping [ErrInvalidOption] for a prefix that
// [WithTablePrefix] refuses.
func Schema(prefix string) ([]string, error) {
	q, err := adminQueries(prefix)
	if err != nil {
		return nil, err
	}
	// The version record's only argument is this package's constant
	// schemaVersion, spelled out so the statement runs without arguments.
	record := strings.Replace(q.record, "?", strconv.Itoa(schemaVersion), 1)
	out := []string{q.creates[0], record}
	return append(out, q.creates[1:]...), nil
}

// LockKind is the kind of a hold that [LockInfo] describes.
type LockKind string

// The kinds of holds. FairMutex holds and RWMutex write holds are one
// kind, KindWrite: both are exclusive tickets of the queued locks, and
// the tables do not record which type took them (a FairMutex is the write
// side of the RWMutex of the same name). A name has holds of one kind of
// lock only: Mutex, the queued locks, Election or Semaphore (see
// [ErrOtherKind]).
const (
	KindMutex     LockKind = "mutex"     // a Mutex hold
	KindWrite     LockKind = "write"     // a FairMutex hold or an RWMutex write hold
	KindRead      LockKind = "read"      // an RWMutex read hold
	KindLeader    LockKind = "leader"    // an Election's leader
	KindSemaphore LockKind = "semaphore" // one acquisition of a Semaphore's permits
)

// LockInfo describes one hold of a lock by a live session, as the database
// has it at the moment of reading.
type LockInfo struct {
	Name    string   // the lock's name
	Kind    LockKind // which kind of lock and side: see LockKind
	Holder  string   // the label of the holder's session (see WithLabel)
	Session int64    // the holder's lease id (see Session.ID)
	Fence   int64    // the fence of the hold; 0 for a read hold, which takes none, and for a Semaphore's, whose fences the tables do not keep
	Permits int64    // KindSemaphore: the permits the acquisition holds (of the name's limit); else 0

	// Held is how long the lock has been held, on the database's clock:
	// since the statement that took it (the tables record when, see
	// "held_since" in queries.go). A Mutex.LockTx hold counts from the
	// take of the lock row, right before the caller's transaction gets it,
	// and lasts until that transaction ends. For KindWrite and KindRead, a
	// waiting ticket whose turn has come but whose holder has not seen it
	// yet (a poll or a doorbell away) is listed as a hold, with Held an
	// overestimate: since the ticket was taken or, for KindWrite, since
	// the exclusive hold before it began, whichever is later. The same
	// goes for KindSemaphore (a ticket whose permits fit, see
	// [Semaphore]). A read hold or a Semaphore's permits that waited
	// record when they began right after RLock or Acquire has returned
	// (a statement sent in the background, so that the handoff does not
	// wait for its commit): until it lands, Held is such an overestimate
	// too. Holds taken
	// by a dsync of schema version 5 on upgraded tables (see
	// [ErrSchemaVersion]) show a wrong Held.
	Held time.Duration

	// Waiters counts the sessions waiting for the lock, as far as the
	// database records them. For the queued locks (KindWrite, KindRead)
	// and the Semaphores and Elections it is exact: the number of live tickets of the name that do not hold it,
	// each waiting session's ticket (goroutines of one process wait behind
	// one ticket), whatever side they wait for; every hold of the name has
	// the same count. For KindMutex it is a lower bound, 1 while a waiter
	// has claimed the next hold (see Mutex) and 0 otherwise: the tables
	// name that one waiter only. The others block on the holder's doorbell
	// (a GET_LOCK, see doorbell.go), which no table records, and which the
	// server's process list shows without its lock's name (the wait is a
	// prepared statement, and a doorbell is a session's, not a lock's).
	// A waiter on a doorbell claims at once, one that polls (no doorbell)
	// once it has waited 100 ms (10 ms on a Galera cluster).
	Waiters int
}

// ListLocks returns every hold of a lock by a live session in the tables of
// prefix, sorted by name, kind and lease id: Mutex holders, FairMutex and
// RWMutex writers, RWMutex readers (one entry per read ticket; the
// readers of one process usually share one), Election leaders, and
// Semaphore holders (one entry per acquisition, with its permits). Waiting sessions are not
// listed, they are counted in the Waiters of the holds. It reads the
// database twice (the Mutex and the queued locks' tables), each time in one
// statement that reads every row of the name's table: it is meant for
// operators, not for a hot path.
//
// It returns an error wrapping [ErrInvalidOption] for a bad prefix or a nil
// db, or a database error (such as a missing table, when no session has
// ever used the prefix).
func ListLocks(ctx context.Context, db *sql.DB, prefix string) ([]LockInfo, error) {
	return listLocks(ctx, db, prefix, "", false)
}

// LockHolders returns the holds of the lock called name by live sessions,
// as ListLocks does but reading only that name's rows. A name is one lock,
// used by one kind of lock (see [ErrOtherKind]): the holds are a Mutex's
// one hold, the queued lock's writer or readers, an Election's leader, or
// a Semaphore's holders. It returns an error wrapping [ErrInvalidName] for an invalid name,
// or as ListLocks does.
func LockHolders(ctx context.Context, db *sql.DB, prefix, name string) ([]LockInfo, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	return listLocks(ctx, db, prefix, name, true)
}

func listLocks(ctx context.Context, db *sql.DB, prefix, name string, one bool) ([]LockInfo, error) {
	q, err := adminQueries(prefix)
	if err != nil {
		return nil, err
	}
	if db == nil {
		return nil, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	var args []any
	mutexes, tickets := q.listMutexes, q.listTickets
	if one {
		mutexes, tickets = q.listMutexesOf, q.listTicketsOf
	}
	// Both reads in one short transaction at READ COMMITTED, ended before
	// returning, whatever the DSN sets: with autocommit off a plain read
	// would begin a transaction that the next call on that pooled
	// connection goes on with, reading the first call's snapshot (leases
	// whose expires_at never moves drop out of the list), and at
	// SERIALIZABLE its reads would take shared locks that hold up the
	// holders' renewals.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true})
	if err != nil {
		return nil, opErrorf(err, "list locks")
	}
	defer tx.Rollback()   // read only: nothing to commit
	locks := []LockInfo{} // not nil: an empty list, for JSON too
	if one {
		args = []any{name}
	}
	if err := scanRows(ctx, tx, mutexes, args, func(rows *sql.Rows) error {
		l := LockInfo{Kind: KindMutex}
		var held int64
		if err := rows.Scan(&l.Name, &l.Holder, &l.Session, &l.Fence, &held, &l.Waiters); err != nil {
			return err
		}
		l.Held = heldFor(held)
		locks = append(locks, l)
		return nil
	}); err != nil {
		return nil, opErrorf(err, "list Mutex holders")
	}
	if one {
		args = []any{name, queueKey(kindRowElection, name), queueKey(kindRowSemaphore, name)}
	}
	var line []ticketInfo // the live tickets of one name, in line order
	if err := scanRows(ctx, tx, tickets, args, func(rows *sql.Rows) error {
		var t ticketInfo
		var held int64
		if err := rows.Scan(&t.Name, &t.seq, &t.mode, &t.Session, &t.Holder, &held, &t.Fence, &t.Permits, &t.limit); err != nil {
			return err
		}
		t.Held = heldFor(held)
		if len(line) > 0 && line[0].Name != t.Name {
			locks = appendHolds(locks, line)
			line = line[:0]
		}
		line = append(line, t)
		return nil
	}); err != nil {
		return nil, opErrorf(err, "list the holders of queued locks")
	}
	locks = appendHolds(locks, line)
	for i, l := range locks {
		// Elections and Semaphores keep their lines under queue keys; an
		// Election's hold is an exclusive ticket.
		name, kind := boundAs(l.Name)
		locks[i].Name = name
		if kind == kindRowElection {
			locks[i].Kind = KindLeader
		}
	}
	slices.SortStableFunc(locks, func(a, b LockInfo) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(string(a.Kind), string(b.Kind)),
			cmp.Compare(a.Session, b.Session))
	})
	return locks, nil
}

// ticketInfo is a live ticket read by qListTickets.
type ticketInfo struct {
	LockInfo       // Kind, Fence and Waiters not set yet; Fence is the name's last fence, Permits the ticket's weight
	seq      int64 // ticket number
	mode     int
	limit    int64 // the line's limit, for a Semaphore's ticket
}

// appendHolds appends the holds among the live tickets of one name, in
// line order: as in qCreateTicket, an exclusive ticket holds the lock when
// no live ticket is ahead of it, a shared one when no live exclusive ticket
// is, and a Semaphore's when the weights up to and including it add up to
// at most the limit (see qSemTake). The others are its waiters.
func appendHolds(locks []LockInfo, line []ticketInfo) []LockInfo {
	first := len(locks)
	anyAhead, writerAhead := false, false
	var weights int64
	for _, t := range line {
		weights += t.Permits
		switch {
		case t.mode == modeExclusive && !anyAhead:
			t.Kind, t.Permits = KindWrite, 0
			locks = append(locks, t.LockInfo)
		case t.mode == modeShared && !writerAhead:
			t.Kind, t.Fence, t.Permits = KindRead, 0, 0
			locks = append(locks, t.LockInfo)
		case t.mode == modeWeighted && weights <= t.limit:
			t.Kind, t.Fence = KindSemaphore, 0
			locks = append(locks, t.LockInfo)
		}
		anyAhead = true
		writerAhead = writerAhead || t.mode == modeExclusive
	}
	for i := first; i < len(locks); i++ {
		locks[i].Waiters = len(line) - (len(locks) - first)
	}
	return locks
}

// heldFor converts the microseconds since a hold began into a duration,
// never negative.
func heldFor(micros int64) time.Duration {
	return time.Duration(max(micros, 0)) * time.Microsecond
}

// scanRows runs query with args on db and calls scan for every row.
func scanRows(ctx context.Context, tx *sql.Tx, query string, args []any, scan func(*sql.Rows) error) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// ForceRelease frees the Mutex called name if a live session holds it, and
// reports whether it did: the operator's override for a holder that is
// stuck but still renewing its lease. The holder is not told: its session
// stays live, it goes on believing it holds the lock until its Unlock
// returns [ErrReleasedByForce] (which is also [ErrNotHeld]), and meanwhile another session may take the lock.
// Only fences keep it from doing harm from then on: the next acquisition's
// fence is greater than the stuck holder's, so a resource that checks
// fences refuses the stuck holder's writes once the new holder has
// written. FairMutex and RWMutex holds are not affected (they are
// tickets, and their name's lock row is never held): it returns false,
// nil for their names. The holds of a [Semaphore] or an [Election] are
// not freed either: for their names it returns false and an error
// wrapping [ErrOtherKind] (their holders release, or their sessions end).
//
// Waiters blocked on the holder's doorbell are woken: when sessions wait,
// ForceRelease closes the connection that holds the holder's doorbell
// (KILL CONNECTION; without the privilege for it they wake within 8 s
// instead), and the holder takes a new doorbell when it next rings. It
// kills only a connection that holds a doorbell, checked right before on
// the connection that ran the release (behind a proxy or load balancer
// the id could mean another server's connection); a release of another
// of the holder's locks that was running on it is redone on another
// connection.
//
// It returns an error wrapping [ErrInvalidName] for an invalid name,
// [ErrOtherKind] as said above, [ErrInvalidOption] for a bad prefix or a
// nil db, or a database error.
func ForceRelease(ctx context.Context, db *sql.DB, prefix, name string) (bool, error) {
	q, err := adminQueries(prefix)
	if err != nil {
		return false, err
	}
	if err := validName(name); err != nil {
		return false, err
	}
	if db == nil {
		return false, fmt.Errorf("%w: nil *sql.DB", ErrInvalidOption)
	}
	// One connection for the release and the kill: the connection id the
	// release reads means a connection of the server that ran it.
	c, err := db.Conn(ctx)
	if err != nil {
		return false, opErrorf(err, "force release %q", name)
	}
	defer c.Close()
	// In a transaction of its own, committed here, whatever the DSN sets:
	// with autocommit off a plain UPDATE would not commit, and the release
	// would be rolled back when the connection ends.
	tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return false, opErrorf(err, "force release %q", name)
	}
	res, err := tx.ExecContext(ctx, q.forceRelease, name)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		_ = tx.Rollback()
		return false, opErrorf(err, "force release %q", name)
	}
	if n == 0 {
		// Nothing freed: a Semaphore's or an Election's name has holds
		// that this cannot free; say so rather than "not held".
		var kind int
		if err := c.QueryRowContext(ctx, q.prepared[sLockKind], name).Scan(&kind); err == nil && kind >= firstKeyedKind {
			return false, opErrorf(otherKindError(kind), "force release %q (it frees a Mutex's hold only)", name)
		}
		return false, nil
	}
	if conn, _ := res.LastInsertId(); conn > 0 {
		// Ring for the holder, which does not know, if that connection
		// still holds a doorbell: without the privilege to kill it, the
		// waiters wake when their wait ends (at most 8 s).
		var bell bool
		if err := c.QueryRowContext(ctx, q.isBell, conn, conn).Scan(&bell); err == nil && bell {
			_, _ = c.ExecContext(ctx, qKillBell, conn)
		}
	}
	return n > 0, nil
}

// operatorQueries holds the statements of admin.go for one table prefix.
type operatorQueries struct {
	*queries
	listMutexes, listMutexesOf string
	listTickets, listTicketsOf string
	forceRelease, isBell       string
}

// adminQueries validates prefix as WithTablePrefix does and returns its
// statements.
func adminQueries(prefix string) (*operatorQueries, error) {
	if !prefixPattern.MatchString(prefix) {
		return nil, fmt.Errorf("%w: table prefix %q: want at most 32 of [A-Za-z0-9_]", ErrInvalidOption, prefix)
	}
	q := newQueries(prefix)
	t := q.tables // schema, lease, lock, queue, ticket
	r := strings.NewReplacer("{lease}", "`"+t[1]+"`", "{lock}", "`"+t[2]+"`",
		"{queue}", "`"+t[3]+"`", "{ticket}", "`"+t[4]+"`")
	return &operatorQueries{
		queries:       q,
		listMutexes:   r.Replace(qListMutexes),
		listMutexesOf: r.Replace(qListMutexesOf),
		listTickets:   r.Replace(qListTickets),
		listTicketsOf: r.Replace(qListTicketsOf),
		forceRelease:  r.Replace(qForceRelease),
		isBell:        r.Replace(qIsBell),
	}, nil
}

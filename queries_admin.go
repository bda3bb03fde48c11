package dsync

// The SQL of the operator functions of admin.go (ListLocks, LockHolders,
// ForceRelease), with the conventions of queries.go: "{lease}", "{lock}",
// "{queue}" and "{ticket}" stand for the table names of a validated prefix,
// and every value is a statement argument. They run on the caller's
// *sql.DB, not on a session's connections: each is a single statement that
// relies on no session setting (every time is UTC_TIMESTAMP(6), and
// ForceRelease's result does not depend on clientFoundRows).

const (
	// qListMutexes lists the Mutex holds of live leases: name, holder's
	// label, lease id, fence, microseconds since the hold began (held_since,
	// written by the statement that took the row, see qCreateLock) and
	// waiters.
	//
	// Mutex waiters are not queued in the database: they block on the
	// holder's doorbell, or poll (see doorbell.go). The only waiter the lock row
	// names is the one that has claimed the next hold (see qCreateLock), so
	// waiters is 1 while a claim is current and 0 otherwise, however many
	// wait (waiter -1 names no claimant; see qCreateLock). This column is
	// the one place where that reading is made.
	qListMutexes = `SELECT k.name, l.label, l.id, k.fence,
  TIMESTAMPDIFF(MICROSECOND, k.held_since, UTC_TIMESTAMP(6)),
  IF(k.waiter > 0 AND k.claimed_until > UTC_TIMESTAMP(6), 1, 0)
FROM {lock} k JOIN {lease} l ON l.id = k.holder
WHERE l.expires_at > UTC_TIMESTAMP(6)`

	// qListMutexesOf is qListMutexes for one name. Args: name.
	qListMutexesOf = qListMutexes + ` AND k.name = ?`

	// qListTickets lists the tickets of live leases, holders and waiters
	// alike, in line order: name (the queue key, see "Queue keys" in
	// queries.go), ticket number, mode (1 exclusive, 0 shared, 2 a
	// Semaphore's), lease id, holder's label, microseconds since the
	// ticket began to hold if it holds, the name's last fence (the fence
	// of its exclusive holder, if it has one that has taken the lock), the
	// ticket's weight and the line's limit (a Semaphore's; else 0). A live
	// holder of a name's head slot (see qCreateQueue) is listed as an
	// exclusive ticket numbered 0, ahead of every ticket. Which of them
	// hold the lock follows from the order, as in qCreateTicket.
	//
	// The start of a hold: the head slot's and an exclusive ticket's is the
	// queue row's held_since (written by the take of the fence); for an
	// exclusive ticket that has not taken the fence yet (its turn has come,
	// its holder has not seen it yet) the later of that, the previous
	// exclusive hold's start, and its own insert, both before its turn. A
	// shared ticket's is its held_since (see qCreateTicket): its insert, or
	// when its holder saw its turn after waiting; until then, its insert.
	qListTickets = qListTicketsFrom + qListTicketsOrder

	// qListTicketsOf is qListTickets for one name, whatever its kind:
	// its queue keys as a queued lock's, an Election's and a Semaphore's.
	// Args: those three keys.
	qListTicketsOf = qListTicketsFrom + ` WHERE t.name IN (?, ?, ?)` + qListTicketsOrder

	qListTicketsFrom = `SELECT t.name, t.seq, t.mode, t.id, t.label, t.held, t.fence, t.weight, t.permits FROM (
SELECT t.name, t.seq, t.mode, l.id, l.label,
  TIMESTAMPDIFF(MICROSECOND, IF(t.mode = 1, GREATEST(t.held_since, COALESCE(q.held_since, t.held_since)), t.held_since),
                UTC_TIMESTAMP(6)) AS held,
  COALESCE(q.fence, 0) AS fence, t.weight, COALESCE(q.permits, 0) AS permits
FROM {ticket} t JOIN {lease} l ON l.id = t.holder LEFT JOIN {queue} q ON q.name = t.name
WHERE l.expires_at > UTC_TIMESTAMP(6)
UNION ALL
SELECT q.name, 0, 1, l.id, l.label, TIMESTAMPDIFF(MICROSECOND, q.held_since, UTC_TIMESTAMP(6)), q.fence, 0, 0
FROM {queue} q JOIN {lease} l ON l.id = q.holder
WHERE l.expires_at > UTC_TIMESTAMP(6)) t`
	qListTicketsOrder = ` ORDER BY t.name, t.seq`

	// qForceRelease frees a Mutex's lock row that a live lease holds,
	// whichever it is, without telling its session. Args: name.
	// RowsAffected 1: freed; 0: no live lease held it. (Every matched row
	// is changed, so clientFoundRows does not change the answer.)
	// LastInsertId is the server's id of the connection that holds the
	// holder's doorbell (see doorbell.go) when sessions wait for the lock
	// (wanted_until), else 0: ForceRelease kills that connection
	// (qKillBell), which wakes the waiters, as the holder's release would
	// have rung it. The doorbell is the generation published in the lease
	// row or, between a ring and its publication, the next one (a ring
	// takes the next before it lets the published one go). The first
	// assignment reads the holder before the second frees the row
	// (assignments run left to right).
	qForceRelease = `UPDATE {lock} SET token = 0 + 0 * LAST_INSERT_ID(IF(wanted_until > UTC_TIMESTAMP(6),
    COALESCE((SELECT COALESCE(IS_USED_LOCK(` + bellNameSQL + `),
                              IS_USED_LOCK(` + bellNextNameSQL + `))
              FROM {lease} l WHERE l.id = {lock}.holder AND l.bell <> 0), 0), 0)),
  holder = 0
WHERE name = ? AND holder <> 0
  AND EXISTS (SELECT 1 FROM {lease} l WHERE l.id = {lock}.holder AND l.expires_at > UTC_TIMESTAMP(6))`

	// qIsBell reports whether the connection with the given server id
	// holds a session's doorbell (the published generation or the next),
	// on the server that runs it: ForceRelease checks it right before
	// qKillBell, on the connection that ran qForceRelease, so that it
	// never kills a connection that is not a doorbell's (a proxy or load
	// balancer that sent the two statements to different servers, whose
	// connection ids mean different connections). Args: connection id
	// twice. One row, 1 or 0.
	qIsBell = `SELECT EXISTS (SELECT 1 FROM {lease} l WHERE l.bell <> 0
  AND (IS_USED_LOCK(` + bellNameSQL + `) = ?
       OR IS_USED_LOCK(` + bellNextNameSQL + `) = ?))`

	// qKillBell closes the connection that holds a forcibly released
	// holder's doorbell, which lets the doorbell go and so wakes its
	// waiters; the holder's session takes a new one when it next rings.
	// Args: connection id (from qForceRelease, checked with qIsBell). It
	// needs the privilege to kill that connection (the same user, or
	// CONNECTION ADMIN / SUPER).
	qKillBell = `KILL CONNECTION ?`
)

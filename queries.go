package dsync

import "strings"

// All SQL that dsync sends lives in this file (admin.go's in queries_admin.go). Each statement names its
// arguments (in order) and what its result means. "{lease}", "{lock}",
// "{queue}", "{ticket}", "{leader}" and "{schema}" stand for the session's table names: the table
// prefix, validated by NewSession to [A-Za-z0-9_]{0,32}, plus the table's
// name, in backquotes
// (an empty prefix leaves the reserved word lock). No other text from
// outside ever reaches SQL: every value is a statement argument.

// Schema. Every time is the server's clock in UTC (UTC_TIMESTAMP(6)), never
// NOW(), which follows each connection's time_zone and jumps at daylight
// saving changes. A name's fence never goes back, although lock and queue
// rows that have been free for the free-row age (WithFreeRowAge) are
// deleted by a background sweep (see "Clean-up of free rows" below): the
// sweep records the highest fence it is about to delete in {schema}
// (deleted_fence) before it deletes, and a row created anew starts its
// fences (qFenceSeed) above that record and at least at the server's UTC
// clock in microseconds, so above every fence an earlier row of the name
// reached, whether the sweep or an operator deleted it.
const (
	// qCreateLease creates the lease table: one row per live Session.
	// expires_at is on the server's UTC clock; a lease is live while
	// expires_at > UTC_TIMESTAMP(6). id is chosen at random by the session
	// (never AUTO_INCREMENT, which can go back and hand a new session the id
	// of a crashed one, with its stranded locks). bell is the generation of
	// the session's doorbell (see doorbell.go), 0 while it has none.
	qCreateLease = `CREATE TABLE IF NOT EXISTS {lease} (
  id         BIGINT       NOT NULL PRIMARY KEY,
  label      VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
  created_at DATETIME(6)  NOT NULL,
  expires_at DATETIME(6)  NOT NULL,
  bell       BIGINT       NOT NULL DEFAULT 0,
  KEY expires_at_idx (expires_at)
) ENGINE=InnoDB`

	// qCreateLock creates the lock table: one row per lock name in use (see
	// "Clean-up of free rows" for when a row goes).
	// holder is the lease id of the holding session (0: free), token the
	// holder's per-acquisition token (chosen by the client before the write,
	// so an ambiguous acquire can be undone), fence the fencing token of the
	// latest acquisition. A row whose holder's lease has ended is free.
	// held_since (server UTC) is when the latest acquisition took the row,
	// written by the statement that takes it (no extra statement; see
	// docs/OPERATIONS.md for what it costs): ListLocks reports the hold's
	// age from it. Release leaves it as it is; it means nothing while the
	// row is free. (There is deliberately no index on holder: writing an
	// indexed column on every acquisition measurably slows the uncontended
	// path.)
	//
	// waiter is the lease id of a session that waits for the lock and has
	// claimed the next hold (0: none; see qLockWant and qLockClaim); until
	// claimed_until (server UTC) no other session takes the row when it
	// falls free, so a waiter, on another node of a cluster or behind a
	// process that releases and re-acquires at once, is not overtaken for
	// ever. Any acquisition clears the claim. A claim whose session has
	// ended counts for nothing. waiter_since (server UTC) is when the
	// claimant began to wait: a waiter that began earlier takes the claim
	// over (qLockWant), so the claim goes to the longest waiter, and the
	// releaser, back at once, does not win it from waiters that slept.
	//
	// wanted_until (server UTC) says that sessions wait for the lock until
	// then: a release before it rings the holder's doorbell (see
	// doorbell.go), when waiter <> 0 too. waiter is 0 only between an
	// acquisition and the next want (every want sets it when nobody claims
	// the row), -1 when sessions wanted the lock but none claims it: a
	// claimant that gave up (qLockUnclaim), or a call that waited (and so
	// may have been read as the claimant, and blocked on) and acquired the
	// row; an acquisition by a call that did not wait sets 0. So a release
	// rings only when a session said that it waits since the row was
	// acquired, or may wait on the waiter that acquired it; a session that
	// waited once leaves nothing for the uncontended holds that follow to
	// ring.
	//
	// idle_since and idle_fence are the sweep's mark (see qLockSweepMark):
	// when a sweep pass found the row free, and its fence then. Lock
	// statements never read or write them; an acquisition changes fence,
	// which voids the mark.
	//
	// kind binds the name to one kind of lock while the row exists (see
	// "One name, one kind" below): 0 (kindRowMutex) a Mutex's, 1
	// (kindRowQueued) the queued locks' (FairMutex, RWMutex), 4
	// (kindRowElection) an Election's, 5 (kindRowSemaphore) a Semaphore's;
	// the row of the last three is never held (holder stays 0) and its
	// fence only counts the creations of the name's queue row. permits is
	// a Semaphore's limit, written by the statement that binds the name
	// (qQueueBind), so it stands for as long as the name stays bound: while
	// any queue row or ticket of the name exists (see lockFree); 0 for the
	// other kinds.
	qCreateLock = `CREATE TABLE IF NOT EXISTS {lock} (
  name          VARBINARY(255) NOT NULL PRIMARY KEY,
  holder        BIGINT         NOT NULL DEFAULT 0,
  token         BIGINT         NOT NULL DEFAULT 0,
  fence         BIGINT         NOT NULL DEFAULT 0,
  waiter        BIGINT         NOT NULL DEFAULT 0,
  claimed_until DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  waiter_since  DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  wanted_until  DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  idle_since    DATETIME(6)    NULL,
  idle_fence    BIGINT         NOT NULL DEFAULT 0,
  kind          TINYINT        NOT NULL DEFAULT 0,
  held_since    DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  permits       BIGINT         NOT NULL DEFAULT 0
) ENGINE=InnoDB`
)

// Schema of the queued locks (FairMutex, RWMutex). Their rows are apart
// from Mutex's, but a name is one lock: its row in the lock table says
// which kind uses it (see "One name, one kind").
const (
	// qCreateQueue creates the per-name table of the queued locks: seq is
	// the name's last ticket number handed out on a cluster (see
	// qTicketNumber), fence the name's last fencing token. Enqueues lock this
	// row (on a single server) or write it (on a cluster), which makes the
	// tickets of one name commit in ticket order. idle_since and idle_fence
	// are the sweep's mark, as in qCreateLock (see qQueueSweepMark).
	//
	// holder and token are the head slot: the exclusive hold of a session
	// (lease id, 0: none) that took the lock while the line was empty,
	// without a ticket (qQueueTake), and its per-acquisition token. A live
	// head-slot holder is ahead of every ticket: it conflicts with all of
	// them, and every statement that reads the line counts it. A holder whose
	// lease has ended holds nothing.
	//
	// held_since (server UTC) is when the name's latest exclusive hold
	// began: written by the statements that take the fence, qQueueTake (the
	// head slot) and qTicketTake (an exclusive ticket at the head), in the
	// same statement. ListLocks reports the exclusive holder's age from it.
	//
	// permits is the limit of a Semaphore's line (copied from the lock
	// row's, see qQueueBind), 0 for the other kinds' lines, which are
	// under other queue keys (see "Queue keys"): every statement of a
	// semaphore's line names the limit it expects, so a semaphore of
	// another limit reads the row as missing, and its creation
	// (createQueueRow) reports the difference (ErrLimitMismatch).
	qCreateQueue = `CREATE TABLE IF NOT EXISTS {queue} (
  name       VARBINARY(255) NOT NULL PRIMARY KEY,
  seq        BIGINT         NOT NULL DEFAULT 0,
  fence      BIGINT         NOT NULL DEFAULT 0,
  idle_since DATETIME(6)    NULL,
  idle_fence BIGINT         NOT NULL DEFAULT 0,
  holder     BIGINT         NOT NULL DEFAULT 0,
  token      BIGINT         NOT NULL DEFAULT 0,
  held_since DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  permits    BIGINT         NOT NULL DEFAULT 0
) ENGINE=InnoDB`

	// qCreateTicket creates the queue entries: one row per waiter or holder
	// of a queued lock, numbered per name (seq) in the order the database
	// committed them. mode 1 is exclusive (FairMutex, RWMutex writer), 0
	// shared (reader). A ticket of a live lease holds the lock when no live
	// ticket before it conflicts with it: any earlier ticket for an exclusive
	// one, an earlier exclusive ticket for a shared one, and no live holder
	// of the head slot is there (see qCreateQueue). Tickets of ended leases
	// are skipped.
	//
	// held_since (server UTC) is when the ticket was inserted, so when it
	// began to hold if nothing it conflicts with was ahead of it then; a
	// shared ticket that waited has it written again when its holder finds
	// its turn (qTicketGranted). An exclusive ticket's hold begins with
	// qTicketTake, which writes the queue row's held_since. ListLocks reads
	// both (see qListTickets).
	//
	// mode 2 (modeWeighted) is a Semaphore's ticket, of weight permits (0
	// in the other modes): it holds when the weights of the live tickets
	// up to and including it add up to at most the line's limit (the queue
	// row's permits; see qSemTake).
	qCreateTicket = `CREATE TABLE IF NOT EXISTS {ticket} (
  name       VARBINARY(255) NOT NULL,
  seq        BIGINT         NOT NULL,
  holder     BIGINT         NOT NULL,
  token      BIGINT         NOT NULL,
  mode       TINYINT        NOT NULL,
  held_since DATETIME(6)    NOT NULL DEFAULT '1970-01-01 00:00:00',
  weight     BIGINT         NOT NULL DEFAULT 0,
  PRIMARY KEY (name, seq)
) ENGINE=InnoDB`

	// qCreateSchema creates the table that records which version of these
	// tables the database holds: one row, written once by whichever session
	// creates the tables first. NewSession refuses tables of another version
	// (ErrSchemaVersion) instead of misreading them. The same row holds the
	// sweep's state: swept_at, when the latest sweep pass was started (or
	// last confirmed running) by some session (see qSweepElect), and
	// deleted_fence, the highest fence of any lock or queue row the sweep
	// may have deleted (see qSweepFloor and qFenceSeed).
	qCreateSchema = `CREATE TABLE IF NOT EXISTS {schema} (
  id            TINYINT     NOT NULL PRIMARY KEY,
  version       INT         NOT NULL,
  swept_at      DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',
  deleted_fence BIGINT      NOT NULL DEFAULT 0
) ENGINE=InnoDB`

	// qSchemaRecord records this version, unless one is recorded already.
	// Args: version.
	qSchemaRecord = `INSERT IGNORE INTO {schema} (id, version) VALUES (1, ?)`

	// qSchemaVersion reads the recorded version (no row: not recorded yet).
	qSchemaVersion = `SELECT version FROM {schema} WHERE id = 1`
)

// qCreateTxLock creates the table of transaction locks (Mutex.LockTx, see
// locktx.go): one row per name that a caller's transaction holds or waits
// for, locked (never changed in a way anyone reads) by the transaction
// until it ends. Only LockTx and the session that made the hold touch it,
// so a transaction waiting for a row here waits for another transaction,
// where the database sees a deadlock. Rows are created outside the
// transactions (qTxLockCreate) and kept; the sweep deletes those unused for
// the free-row age (qTxLockSweepDelete).
const qCreateTxLock = `CREATE TABLE IF NOT EXISTS {txlock} (
  name    VARBINARY(255) NOT NULL PRIMARY KEY,
  used_at DATETIME(6)    NOT NULL
) ENGINE=InnoDB`

// schemaVersion is the version of the tables this code reads and writes.
// Version 1 (no version record) numbered tickets with AUTO_INCREMENT;
// version 2 had no doorbells (lease.bell, lock.wanted_until) and no sweep
// columns (idle_since, idle_fence, swept_at, deleted_fence); version 3 had
// no head slot (queue.holder, queue.token), so its code would not see a
// lock held there, and no txlock table (Mutex.LockTx); version 4 had no
// lock.kind, so a Mutex and a FairMutex of one name were two locks, and
// its code would take a name that this version's queued locks use;
// version 5 had no held_since columns (lock, queue, ticket), which
// ListLocks reads (qUpgradeFrom5 upgrades version 5 in place); version 6
// had no Semaphore columns (lock.permits, queue.permits, ticket.weight),
// which a Semaphore's statements need (qUpgradeFrom6 upgrades version 6
// in place; its code never takes a Semaphore's name, see there).
const schemaVersion = 7

// qUpgradeFrom5 upgrades tables of schema version 5 to this version in
// place: the held_since columns, as qCreateLock, qCreateQueue and
// qCreateTicket have them, and the version record. NewSession never runs
// it (dsync never alters tables): the ErrSchemaVersion of tables of
// version 5 names it, for an operator to run. The ALTERs are instant on
// MariaDB 10.6+ and MySQL 8, but each waits for every transaction using
// its table, LockTx's included, and the lock statements queue behind it
// meanwhile: lock_wait_timeout makes it give up after 5 s instead. Old
// processes work on the upgraded tables (their statements name their
// columns); only their NewSession refuses them.
const qUpgradeFrom5 = `SET SESSION lock_wait_timeout = 5;
ALTER TABLE {lock} ADD COLUMN held_since DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00';
ALTER TABLE {queue} ADD COLUMN held_since DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00';
ALTER TABLE {ticket} ADD COLUMN held_since DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00';
UPDATE {schema} SET version = 6 WHERE id = 1 AND version = 5;`

// qUpgradeFrom6 upgrades tables of schema version 6 to this version in
// place, as qUpgradeFrom5 does version 5: the columns of the Semaphore
// (lock.permits, queue.permits, ticket.weight), as qCreateLock, qCreateQueue
// and qCreateTicket have them, and the version record. Their defaults (0)
// are what the rows of the other kinds have, so the rows in use stay as
// they are. Processes of version 6 work on the upgraded tables, and never
// take a Semaphore's name: their Mutex gets error 1690 on its lock row
// (kind 5), their FairMutex and RWMutex find no line of the name (a
// Semaphore's is under its queue key, see "Queue keys") and are refused
// by their bind (TestOldLocksNeverTakeASemaphoreName).
const qUpgradeFrom6 = `SET SESSION lock_wait_timeout = 5;
ALTER TABLE {lock} ADD COLUMN permits BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {queue} ADD COLUMN permits BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {ticket} ADD COLUMN weight BIGINT NOT NULL DEFAULT 0;
UPDATE {schema} SET version = 7 WHERE id = 1 AND version = 6;`

// qFenceSeed is the first fence of a row created anew: the greater of the
// server's UTC clock in microseconds since 1970 and one above the highest
// fence the sweep has deleted (deleted_fence; the sweep records it before
// it deletes, see qSweepFloor). So a name's row that the sweep deleted had
// fences at most deleted_fence, and the new row's are above them whatever
// the clocks do (a clock stepped back, or the nodes of a cluster
// disagreeing). A row an operator deleted was seeded the same way and then
// gained one per acquisition, far fewer than one per microsecond, so the
// clock alone puts the new row above it (unless the server's clock stepped
// back by more than the time since then). It is an expression, spliced
// into statements below. Its read of the schema row is a primary-key
// lookup; in an INSERT, at READ COMMITTED too, it takes a shared lock on
// that row until the statement ends, so the sweep's own writes of the row
// (one short single-row UPDATE each, a few per pass) and statements that
// queue behind such a write wait for one another, for as long as one of
// them runs.
const qFenceSeed = `GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)),
  COALESCE((SELECT deleted_fence FROM {schema} WHERE id = 1), 0) + 1)`

// Connection setup, run once on every connection the session uses, so that
// no DSN setting changes what a statement means: autocommit on (each lock
// statement is its own transaction), the UTC time zone (belt and braces:
// every statement uses UTC_TIMESTAMP anyway), an sql_mode without MariaDB's
// SIMULTANEOUS_ASSIGNMENT (the statements below rely on assignments running
// left to right), READ COMMITTED (no gap locks, and subqueries of
// writes read without locking, so they never block a lease renewal), and
// a lock wait timeout of 5s instead of the server's (50s by default): the
// row locks that dsync's own statements wait for are held for a statement;
// its lock statements do not wait for a caller's transaction holding a
// lock row (Mutex.LockTx; see execNoWait), and what else meets one (the
// wait for its end, a release after a lost lease, a statement on MySQL,
// which has no no-wait variants) gives up within that time, also on the
// server when the client has gone. Such a connection is never handed back
// to the caller's pool (see connpool).
const (
	qSetSession = `SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_ENGINE_SUBSTITUTION',
  SESSION time_zone = '+00:00', SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = 5`
	qReadCommitted = `SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED`
)

// qLentLockWait pins a lock wait timeout of a second (lentLockWait) on
// the connections that a session lends its lock statements (its doorbell
// connection, its lease connection): a lent statement that meets a row
// lock (a LockTx transaction's, a foreign one) is ended by the server
// with 1205 within a second and leaves the connection open, instead of
// being cut by the client, which closes it (see runDetached). No args, no
// result.
const qLentLockWait = `SET SESSION innodb_lock_wait_timeout = 1`

// qLentNoWait makes the lease connection's statements not wait for row
// locks while lock statements are lent it and a second's wait would not
// fit in lendable (see leaseConn.useOpen); qLentLockWait sets the wait
// back before a lease statement. MariaDB's (MySQL's least is 1). No
// args, no result.
const qLentNoWait = `SET SESSION innodb_lock_wait_timeout = 0`

// qTablesPresent lists which of the seven tables exist, so that NewSession
// runs DDL only when one is missing (CREATE TABLE IF NOT EXISTS on a table
// that exists is still DDL: it takes metadata locks and, on Galera, is
// replicated cluster-wide as a total-order operation that writes racing it
// fail certification against). Args: the seven table names. Result: one
// row per table found, its name as stored, and whether the server compares
// table names without regard to case (@@lower_case_table_names not 0: then
// it may store and return them in lower case).
const qTablesPresent = `SELECT TABLE_NAME, @@lower_case_table_names <> 0 FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?, ?, ?, ?, ?, ?)`

// qWsrepOn tells whether the server is a Galera cluster node with
// replication on: one row whose Value is ON. MySQL has no such variable and
// returns no row.
const qWsrepOn = `SHOW VARIABLES LIKE 'wsrep_on'`

// qSyncWait makes reads and writes on a Galera node causal: before each
// statement the node applies every write the cluster committed before it
// (wsrep_sync_wait bits 1 reads, 2 updates and deletes, 4 inserts). Without
// it a lock statement could miss another node's ticket, or a lease renewal
// that another node committed, and take a lock that is held. It is run on
// dsync's own connections only, and only on a cluster.
const qSyncWait = `SET SESSION wsrep_sync_wait = 7`

// Lease statements.
const (
	// qLeaseInsert creates the session's lease. Args: lease id (random,
	// positive), label, ttl in microseconds. Error 1062: the id is taken;
	// draw another.
	qLeaseInsert = `INSERT INTO {lease} (id, label, created_at, expires_at)
VALUES (?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`

	// qLeaseRenew extends a lease that has not yet ended.
	// Args: ttl in microseconds, lease id. RowsAffected 0: the lease had
	// already ended (or was deleted) on the server; it is lost for good.
	qLeaseRenew = `UPDATE {lease} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE id = ? AND expires_at > UTC_TIMESTAMP(6)`

	// qLeaseDelete removes the session's lease; any lock row still naming it
	// is free from then on. Args: lease id.
	qLeaseDelete = `DELETE FROM {lease} WHERE id = ?`

	// qLeaseLive reads whether the session's lease is live on the server.
	// Unlock asks it when the release found the lock row no longer the
	// session's: a live lease was never taken over (a lease that ended
	// stays ended, see qLeaseRenew, and no acquisition takes a live
	// lease's row), so its row was freed by ForceRelease. Args: lease id.
	// One row, 1 or 0.
	qLeaseLive = `SELECT EXISTS (SELECT 1 FROM {lease} WHERE id = ? AND expires_at > UTC_TIMESTAMP(6))`

	// qLeasePurge deletes leases that ended over an hour ago (crashed
	// sessions), so the table does not grow without bound. A lock row naming
	// a missing lease is free, exactly as one naming an ended lease.
	// It runs in the background, at READ COMMITTED, never in NewSession.
	qLeasePurge = `DELETE FROM {lease} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL 1 HOUR LIMIT 1000`
)

// Lock statements.
const (
	// qLockAcquireFast takes a lock row that exists, is free and is not
	// claimed by another waiter in one cheap statement: no subquery, no
	// insert. Args: lease id, token, waited (1: the call waited for the
	// lock, else 0), name, lease id. (waiter becomes -1 when the call
	// waited, else 0: see wanted_until.) LastInsertId is the new
	// fence when the lock was taken, 0 otherwise (no row, a holder that may
	// be live, or a claim that may be stale: then qLockAcquire decides).
	// A row of another kind (the queued locks', an Election's) is never
	// taken: qLockAcquire then reports it.
	qLockAcquireFast = `UPDATE {lock} SET holder = ?, token = ?, fence = LAST_INSERT_ID(fence + 1), waiter = IF(?, -1, 0),
  held_since = UTC_TIMESTAMP(6)
WHERE name = ? AND holder = 0 AND (waiter <= 0 OR waiter = ?) AND kind = 0`

	// qLockAcquire takes the lock row for a session in one autocommit
	// statement, whatever state the row is in, unless another waiter's claim
	// on it (see qCreateLock) is current. Args: name, lease id, token, lease
	// id, -lease id, token, waited, lease id. (waiter, as in
	// qLockAcquireFast.)
	//
	// LastInsertId is the new fence when the lock was taken, 0 when a live
	// lease holds it, otherKind plus the row's kind when another kind uses
	// the name (any kind but 0, see "One name, one kind"; the row is left
	// unchanged). RowsAffected is
	// not used: it depends on the client's clientFoundRows.
	//
	// A row held by this session itself counts as held, even though the
	// session runs one acquisition per name at a time: an attempt that the
	// client gave up on can still land on the server later, and it must not
	// overwrite a later acquisition's token. The session frees such late
	// rows in the background (see orphan in session.go).
	//
	// A new row is inserted held, with the fence qFenceSeed. For an existing row the
	// ON DUPLICATE KEY UPDATE assignments run left to right, each seeing the
	// ones before it, so the free/held decision is made exactly once, by the
	// first: it marks the row taken by writing -leaseID into holder (lease ids
	// are positive, so a stored row never holds a negative value), and the
	// later assignments test for that mark and finally replace it with the
	// lease id. LAST_INSERT_ID(expr) hands the fence back in the OK packet;
	// the not-taken branch sets it to 0 so no earlier statement's value leaks.
	qLockAcquire = `INSERT INTO {lock} (name, holder, token, fence, held_since)
VALUES (?, ?, ?, LAST_INSERT_ID(` + qFenceSeed + `), UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
  holder = IF(kind = 0 AND NOT EXISTS (SELECT 1 FROM {lease} l
                          WHERE l.id = {lock}.holder AND l.expires_at > UTC_TIMESTAMP(6))
              AND (waiter = 0 OR waiter = ? OR claimed_until < UTC_TIMESTAMP(6)
                   OR NOT EXISTS (SELECT 1 FROM {lease} w
                                  WHERE w.id = {lock}.waiter AND w.expires_at > UTC_TIMESTAMP(6))),
              ?, holder),
  fence = IF(holder < 0, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(IF(kind = 0, 0, ` + otherKindSQL + ` + kind))),
  token = IF(holder < 0, ?, token),
  waiter = IF(holder < 0, IF(?, -1, 0), waiter),
  held_since = IF(holder < 0, UTC_TIMESTAMP(6), held_since),
  holder = IF(holder < 0, ?, holder)`

	// qLockClaim claims the next hold of a lock for a session that has
	// waited long (see qCreateLock), unless another waiter's claim is
	// current and that waiter began to wait no later than this one, or
	// renews the session's own claim: the claim goes to the longest
	// waiter, as qLockWant's does. Args: lease id, claim length in
	// microseconds, microseconds this session has waited, name, lease id,
	// microseconds waited. RowsAffected 1: the claim is the session's (the
	// condition is in WHERE, so clientFoundRows does not matter). A claim
	// is only a courtesy between waiters: mutual exclusion never depends
	// on it.
	qLockClaim = `UPDATE {lock} SET waiter = ?, claimed_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
  waiter_since = UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
WHERE name = ? AND (waiter <= 0 OR waiter = ? OR claimed_until < UTC_TIMESTAMP(6)
                    OR UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND < waiter_since)`

	// qLockUnclaim drops the session's claim when it stops waiting,
	// leaving waiter -1: sessions wanted the lock since it was last
	// acquired (see wanted_until). Args: name, lease id. RowsAffected 1:
	// it dropped a claim (every matched row is changed).
	qLockUnclaim = `UPDATE {lock} SET waiter = -1 WHERE name = ? AND waiter = ?`

	// qLockRelease frees a lock row if, and only if, it is still held by
	// this acquisition. Idempotent, so it also undoes an acquire whose
	// outcome is unknown. Args: name, lease id, token. RowsAffected 1: freed;
	// 0: this acquisition did not hold it (never landed, or lost).
	// LastInsertId 1 when it freed the row while sessions wait for it
	// (wanted_until, and waiter <> 0: one said so during this hold, or
	// before it and was then woken, see qLockBell): the releaser then
	// rings its doorbell.
	qLockRelease = `UPDATE {lock} SET holder = 0, token = 0 + 0 * LAST_INSERT_ID(wanted_until > UTC_TIMESTAMP(6) AND waiter <> 0)
WHERE name = ? AND holder = ? AND token = ?`

	// qLockReleaseRing is qLockRelease on the connection that holds the
	// session's doorbell, ringing it in the same statement when sessions
	// wait (see lockRows.freeRinging): it takes the next generation and lets
	// the current one go, as qBellRing does. Args: next doorbell name
	// (twice), current doorbell name, name, lease id, token. LastInsertId 0: nobody
	// waited (or nothing was freed); 2: rung, the next generation taken; 1:
	// rung, the next generation not taken. With the binary log on, the
	// statement is logged as rows (dsync's connections run at READ
	// COMMITTED, which the server does not log as statements), so replicas
	// never run its GET_LOCK.
	//
	// GET_LOCK runs only when the connection does not hold the next
	// generation yet: MariaDB counts a lock taken twice on one connection,
	// and a ring lets it go once. (A statement rolled back after its SET
	// ran, and run again, would take it twice; an UPDATE of one row by its
	// key waits for the row, and is rolled back, before that.)
	qLockReleaseRing = `UPDATE {lock} SET holder = 0, token = 0 + 0 * LAST_INSERT_ID(IF(wanted_until > UTC_TIMESTAMP(6) AND waiter <> 0,
    1 + IF(IS_USED_LOCK(?) <=> CONNECTION_ID(), 1, COALESCE(GET_LOCK(?, 0), 0)) + 0 * COALESCE(RELEASE_LOCK(?), 0), 0))
WHERE name = ? AND holder = ? AND token = ?`

	// qLockWant says that this session waits for the lock (see
	// wanted_until), and claims its next hold unless another waiter's claim
	// is current and that waiter began to wait no later than this one (or
	// renews its own). Args: want length in microseconds, lease id,
	// microseconds this session has waited, lease id, lease id, claim length
	// in microseconds, microseconds waited, name. The assignments run left
	// to right: waiter is decided on the old claimed_until and
	// waiter_since, then claimed_until and waiter_since are set when the
	// claim is this session's.
	qLockWant = `UPDATE {lock} SET
  wanted_until = GREATEST(wanted_until, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  waiter = IF(waiter = 0 OR waiter = ? OR claimed_until < UTC_TIMESTAMP(6)
              OR UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND < waiter_since
              OR NOT EXISTS (SELECT 1 FROM {lease} w
                             WHERE w.id = {lock}.waiter AND w.expires_at > UTC_TIMESTAMP(6)), ?, waiter),
  claimed_until = IF(waiter = ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, claimed_until),
  waiter_since = IF(waiter = ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, waiter_since)
WHERE name = ?`

	// qLockBell names the session a waiter of the lock waits on, and the
	// generation of its doorbell: the live holder, else the live waiter
	// whose claim is current (it takes the lock next; never the asking
	// session: a row it claimed and finds free it takes at once), or the
	// asking session itself when it holds the row under a token it no
	// longer knows (then it polls), and how long that session's lease has left in microseconds
	// (a waiter blocks no longer: a holder that stopped renewing, paused or
	// cut off, never rings); first, the row's fence, which tells the
	// waiter whether anyone acquired it since its last read; last, whether
	// a want is recorded since the row was last acquired (waiter <> 0; see
	// wanted_until): a waiter that said it waits and finds none recorded
	// lost its want to an acquisition that came after it, and says it
	// again before it blocks; whether the session named is the claimant,
	// not the holder; and whether the asking session holds the current
	// claim. Args: lease id, lease
	// id, name. No row: the lock has no row. NULL id: nobody live has the
	// lock or a claim on it; try to take it at once. bell 0: that session
	// has no doorbell; poll.
	qLockBell = `SELECT k.fence, l.id, l.bell, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at), k.waiter <> 0,
  l.id <> k.holder, k.waiter = ? AND k.claimed_until > UTC_TIMESTAMP(6) FROM {lock} k LEFT JOIN {lease} l
  ON l.id IN (k.holder, IF(k.claimed_until > UTC_TIMESTAMP(6) AND k.waiter <> ?, k.waiter, 0))
     AND l.expires_at > UTC_TIMESTAMP(6)
WHERE k.name = ?
ORDER BY l.id = k.holder DESC LIMIT 1`
)

// Transaction lock statements (Mutex.LockTx, see locktx.go). The first
// five run in the caller's transaction, at whatever isolation level and
// sql_mode it has; they read no other row (no subquery, so no shared locks
// on lease rows that a renewal would wait for), name their tables with the
// session's database (see txQueries), and lock by primary key only, which
// takes a record lock without a gap lock at READ COMMITTED and REPEATABLE
// READ alike.
const (
	// qTxLock locks the name's transaction-lock row for the transaction,
	// inserting it when missing: it waits while another transaction holds
	// it (innodb_lock_wait_timeout of the caller's connection; the database
	// reports a deadlock between such waits as 1213). Args: name.
	qTxLock = `INSERT INTO {txlock} (name, used_at) VALUES (?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE used_at = UTC_TIMESTAMP(6)`

	// qTxLockNoWait is qTxLock without waiting (MariaDB's per-statement
	// lock wait timeout; 1205 at once when another transaction holds the
	// row). Servers without SET STATEMENT (MySQL) answer 1064: TryLockTx
	// then reads the lock row first and runs qTxLock.
	qTxLockNoWait = `SET STATEMENT innodb_lock_wait_timeout = 0 FOR ` + qTxLock

	// qTxHold hands a lock row that the session holds (taken with
	// qLockAcquire as for Lock) to the transaction: it frees the row in the
	// transaction, so the row is free when the transaction commits, and
	// the transaction holds the row locked until it ends. Every other
	// acquirer writes the row and so waits for that end; a reader of the
	// committed row sees it held by the session. The freed row carries the
	// hold's mark, token = -token (with the acquisition's fence), which no
	// other write leaves, so that the transaction can tell its own write
	// from a row freed otherwise (qTxHeld). Args: name, lease id,
	// token. RowsAffected 1: handed over; 0: the session no longer holds
	// it, or tx's connection is in no transaction (tx ran a COMMIT or an
	// implicitly committing statement, or was rolled back by a lock wait
	// timeout): then the UPDATE would commit at once. @@in_transaction is
	// MariaDB's (see qTxInTransaction); elsewhere LockTx runs
	// qTxHoldAnyServer.
	qTxHold = qTxHoldAnyServer + ` AND @@in_transaction = 1`

	// qTxHoldAnyServer is qTxHold for a server without @@in_transaction
	// (MySQL): it cannot refuse to run outside a transaction, where it
	// commits at once, freeing the row with the hold's mark. LockTx then
	// reads the committed row on a session connection (qTxHoldPending):
	// still held by the session means the hand-over waits for tx's commit,
	// so tx is in a transaction; anything else means it committed at once,
	// and LockTx clears the mark (qTxHoldEnd) and reports no hold. Args and
	// RowsAffected as qTxHold's.
	qTxHoldAnyServer = `UPDATE {lock} SET holder = 0, token = -token WHERE name = ? AND holder = ? AND token = ?`

	// qTxHeld reads, in the transaction, the lock row as the transaction
	// sees it: whether it carries the hold's mark (see qTxHold). A plain
	// read: it locks nothing, so it never holds up anyone, whatever the
	// row's state. The transaction's own write shows until it is rolled
	// back (ROLLBACK TO a SAVEPOINT taken before the hold undoes it); the
	// mark also shows when the hold's transaction committed and the
	// connection reads committed rows (no transaction, or another one):
	// qTxHoldPending tells the two apart. Args: -token, fence, name. No
	// row: no hold.
	qTxHeld = `SELECT holder = 0 AND token = ? AND fence = ? FROM {lock} WHERE name = ?`

	// qTxInTransaction tells, once per session on one of its own
	// connections, whether the server has MariaDB's @@in_transaction
	// (qTxHold). Error 1193: it has not (MySQL); LockTx runs
	// qTxHoldAnyServer.
	qTxInTransaction = `SELECT @@in_transaction`

	// qTxRollbackOnTimeout reads, in the caller's transaction after a lock
	// wait timeout, whether that timeout rolled back the whole transaction
	// (then LockTx must not run another statement in it: it would run
	// outside any transaction).
	qTxRollbackOnTimeout = `SELECT @@innodb_rollback_on_timeout`

	// qTxSession reads, once per session on one of its own connections,
	// the database its tables are in (see txQueries) and whether a lock
	// wait timeout rolls back the whole transaction on this server.
	qTxSession = `SELECT DATABASE(), @@innodb_rollback_on_timeout`

	// qTxLockCreate creates the name's transaction-lock row, on a session
	// connection, unless it exists: its check is a plain read, which never
	// waits for a transaction holding the row. (Inserted in the caller's
	// transaction instead, a row that two transactions waited for would
	// vanish with a rollback of its inserter, and the two would meet in a
	// deadlock the database reports, 1213, though the names were locked in
	// one order.) Args: name, name. Error 1062: another session created it
	// meanwhile.
	qTxLockCreate = `INSERT INTO {txlock} (name, used_at)
SELECT ?, UTC_TIMESTAMP(6) FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {txlock} WHERE name = ?)`

	// qTxHoldEnd ends a LockTx hold in the lock table once its transaction
	// has ended, on a session connection, waiting for the transaction's
	// row lock while it runs. After a rollback (the row is back as the
	// session held it: lease id, token) it frees the row; after a commit
	// (the row is free, with the hold's mark: see qTxHold) it clears the
	// mark, so that a statement of a later transaction of the same
	// connection finds no mark of a hold that has ended (qTxHeld). Args:
	// name, lease id, token, -token, fence. RowsAffected 0: the row was
	// taken since (a lease that ended, or a commit and another holder).
	qTxHoldEnd = `UPDATE {lock} SET holder = 0, token = 0
WHERE name = ? AND ((holder = ? AND token = ?) OR (holder = 0 AND token = ? AND fence = ?))`

	// qTxHoldPending reads, on a session connection (a plain read at READ
	// COMMITTED: it never waits), whether the committed lock row is still
	// as the session held it before it handed the row to a transaction
	// (qTxHold): then the hand-over has not committed, and the hold's mark
	// that the transaction sees (qTxHeld) is its own write, standing, so
	// the transaction holds the row locked. A lease id and token name one
	// acquisition, so a row committed since (the mark, the row freed or
	// taken by another acquisition) never matches. Args: name, lease id,
	// token. No row: the hand-over committed, or was undone and the row
	// freed since.
	qTxHoldPending = `SELECT 1 FROM {lock} WHERE name = ? AND holder = ? AND token = ?`

	// qTxLockIdle lists up to limit transaction-lock rows unused for age
	// microseconds, for the sweep (a plain read: no locks). Args: age,
	// limit.
	qTxLockIdle = `SELECT name FROM {txlock} WHERE used_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND LIMIT ?`

	// qTxLockSweepDelete deletes one transaction-lock row still unused for
	// age microseconds (the sweep runs its no-wait variant, which skips a
	// row a transaction holds). A LockTx that finds its row gone meanwhile
	// creates it again in its transaction (qTxLock). Args: name, age.
	qTxLockSweepDelete = `DELETE FROM {txlock} WHERE name = ? AND used_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`
)

// Doorbell statements (see doorbell.go). GET_LOCK names are per server (not per
// database) and at most 64 characters: "dsync:" and the lease id and
// generation in hexadecimal.
const (
	// qLeaseBell publishes the generation of the session's doorbell.
	// Args: generation, lease id.
	qLeaseBell = `UPDATE {lease} SET bell = ? WHERE id = ?`

	// qBellTake takes the first doorbell of a session. Args: its name.
	// Result 1: taken.
	qBellTake = `SELECT GET_LOCK(?, 0)`

	// qBellRing takes the session's next doorbell and rings the current
	// one: whoever waits on it (qBellWait) wakes. Args: next name, current
	// name. Result: 1 when the next one was taken.
	qBellRing = `SELECT GET_LOCK(?, 0) + 0 * COALESCE(RELEASE_LOCK(?), 0)`

	// qBellWait waits until a doorbell rings (or is already rung, or its
	// session's connection went away), at most timeout seconds, and lets
	// it go at once. Args: name, timeout in seconds (fractional), name. Result 1: rung;
	// 0: timed out.
	qBellWait = `SELECT IF(GET_LOCK(?, ?) = 1, RELEASE_LOCK(?), 0)`
)

// Queued lock statements.
const (
	// qQueueCreate makes sure the per-name row of a queued lock exists,
	// seeding its counter and fence with qFenceSeed. Args: name, permits
	// (the semaphore's limit, else 0). It runs only in the transaction of
	// qQueueBind, after it bound the name to the kind and permits (see
	// "One name, one kind"), so a row there already has the same.
	qQueueCreate = `INSERT IGNORE INTO {queue} (name, seq, fence, permits) VALUES (?, ` + qFenceSeed + `, ` + qFenceSeed + `, ?)`

	// qTicketInsert enqueues a waiter on a single server, in one statement,
	// holding the per-name row locked while it inserts: a ticket is
	// therefore committed before the next ticket of the name is numbered,
	// and is numbered above every ticket of the name (the row lock is taken
	// before the MAX is read, so the MAX sees every ticket committed before
	// it). A number can come again only after every ticket above it is
	// gone, at the end of the line, where nobody is behind it. Args: mode,
	// lease id, token, mode, name, name, mode. LastInsertId: twice the ticket's number,
	// plus 1 when something the ticket conflicts with is ahead of it (see
	// ticketConflictQ; 0 added: the ticket holds the lock, unless it is
	// exclusive, which still takes the fence with qTicketTake); 0 when the
	// per-name row is missing (run qQueueCreate, then again). The flag is
	// read under the per-name row's lock, which every enqueue and every
	// take of the head slot (qQueueTake) holds until it commits, so nothing
	// it did not see can be ahead of the ticket. (INSERT ... SELECT reads
	// the other tables without locks at READ COMMITTED.)
	//
	// In the same statement it leaves the waiter's marker (see qTicketWant)
	// behind the nearest live ticket ahead that the new one conflicts with,
	// if any, so that the waiter need not send qTicketWant before it blocks
	// on that ticket's doorbell: the second SELECT locks that ticket (FOR
	// UPDATE, a current read), as qTicketWant does, so its release either
	// comes after the marker's commit and finds it, or commits first, and
	// the marker goes behind the next live ticket ahead, or nowhere. (A
	// marker that goes behind a ticket nobody waits on costs its release a
	// ring.) A marker there already, another waiter's or one left by an
	// earlier holder of the same number (whose ticket went without it:
	// purged by the sweep, or deleted after an enqueue of unknown outcome;
	// numbers come again once the line empties), gets the token of the
	// ticket's holder, the ON DUPLICATE KEY UPDATE: the release rings only
	// for a marker with its holder's token (qTicketReleaseRing), so a
	// stale one kept as it was would leave the waiter unrung until
	// bellWait. VALUES(token), not a row alias: the alias form (MySQL
	// 8.0.19+, where VALUES() is deprecated but still works) is not
	// accepted after a SELECT nor by MariaDB, and MySQL cannot refer to a
	// UNION's columns there. The update is for markers only (holder 0): a
	// ticket number taken already would mean that the numbering read a
	// stale MAX (see qTicketNumber), and the waiter would take another
	// session's ticket for its own, so there the statement fails on
	// purpose, with an overflow of the ticket's seq (error 1690, which the
	// server raises only where it evaluates that branch, as in
	// qTicketReleaseRing), as the plain insert failed with 1062 before the
	// marker joined it. Locks are taken in the order of the other
	// statements that take both: the per-name row, then tickets. More
	// args: name, mode. The marker's insert sets no LastInsertId.
	qTicketInsert = ticketInsertSQL + `(` + ticketNumberedSQL + `)
UNION ALL
(SELECT t.name, t.seq + ` + markerBaseSQL + `, 0, t.holder, 0, '1970-01-01 00:00:00' FROM {ticket} t
WHERE t.name = ? AND t.seq < ` + markerBaseSQL + ` AND (t.mode = 1 OR ? = 1)
  AND EXISTS (SELECT 1 FROM {lease} l WHERE l.id = t.holder AND l.expires_at > UTC_TIMESTAMP(6))
ORDER BY t.seq DESC LIMIT 1 FOR UPDATE)
` + markerUpsert

	// qSemInsert is qTicketInsert for a Semaphore's ticket (mode 2, see
	// qCreateTicket), with the semaphore's rule: the flag says that the
	// live tickets' weights and the new one's add up to more than the
	// limit, and only then does the marker go in, behind the ticket that
	// qSemAhead will block on: when the live tickets (all of them ahead)
	// weigh more than the limit, the nearest one, which waits too (the
	// first marker SELECT); else they all hold, the new ticket is the
	// first waiter, and it goes behind the oldest (the second). Each
	// SELECT reads the line in its own order and locks the one ticket it
	// takes; the sums (semWeights) name the name by argument, so each is
	// computed once, not once per ticket read (MySQL has no subquery
	// cache). Args: name, weight, lease id, token, weight, name, limit,
	// name, name, limit, name, name, limit, name, weight, limit.
	// LastInsertId as qTicketInsert's; 0 also when the row has other
	// permits (a semaphore of another limit: createQueueRow says so).
	qSemInsert = `INSERT INTO {ticket} (name, seq, holder, token, mode, weight, held_since)
(SELECT q.name, LAST_INSERT_ID(2 * (` + ticketNumberQ + `)
       + IF(` + semWeights + ` + ? > q.permits, 1, 0)) DIV 2, ?, ?, 2, ?, UTC_TIMESTAMP(6)
FROM {queue} q WHERE q.name = ? AND q.permits = ? FOR UPDATE)
UNION ALL
(` + semMarkerSQL + ` AND ` + semWeights + ` > ?
ORDER BY t.seq DESC LIMIT 1 FOR UPDATE)
UNION ALL
(` + semMarkerSQL + ` AND ` + semWeights + ` <= ? AND ` + semWeights + ` + ? > ?
ORDER BY t.seq LIMIT 1 FOR UPDATE)
` + markerUpsert

	// semMarkerSQL is a marker behind a live ticket of a name, for
	// qSemInsert. Args: name.
	semMarkerSQL = `SELECT t.name, t.seq + ` + markerBaseSQL + `, 0, t.holder, 0, 0, '1970-01-01 00:00:00' FROM {ticket} t
WHERE t.name = ? AND t.seq < ` + markerBaseSQL + `
  AND EXISTS (SELECT 1 FROM {lease} l WHERE l.id = t.holder AND l.expires_at > UTC_TIMESTAMP(6))`

	// qTicketInsertAlone is qTicketInsert without the marker: the enqueue
	// of a name that the session has not found busy (see tickets.busy),
	// where nothing is likely to be ahead. The marker's SELECT costs an
	// uncontended reader's enqueue about a fifth of its time (the reader
	// holds with a ticket; a writer takes the head slot); a waiter whose
	// enqueue left no marker sends qTicketWant before it blocks, as
	// ticketAhead tells it (marked). Args: mode, lease id, token, mode,
	// name. LastInsertId: as qTicketInsert's.
	qTicketInsertAlone = ticketInsertSQL + ticketNumberedSQL

	// qTicketInsertBell is qTicketInsertAlone that also takes the new
	// ticket's own doorbell (see ticketBellName), without waiting, in the
	// same statement, so the bell is held before the ticket commits and
	// before any waiter can see it. It is sent only on the session's
	// doorbell connection (doorbell.lend), whose release of the ticket
	// (qTicketReleaseRing) lets the bell go in its own statement; a waiter
	// behind the ticket blocks on the bell, so no marker is left. The
	// GET_LOCK sits in the holder column, which it leaves as it is. A
	// connection takes a named lock once per GET_LOCK and the release lets
	// it go once: the bell is taken only when this connection does not
	// hold it already, since an enqueue run again after a rollback
	// (retryRolledBackN) may number the ticket with the same token. A bell
	// another connection holds (none should) leaves the ticket without
	// one: its waiters wait as for a ticket enqueued elsewhere. Args: mode,
	// lease id, bell name (twice), token, mode, name. LastInsertId as
	// qTicketInsertAlone's.
	qTicketInsertBell = ticketInsertSQL + `SELECT q.name, LAST_INSERT_ID(2 * (` + ticketNumberQ + `)
       + IF(` + ticketConflictQ + `, 1, 0)) DIV 2,
       ? + 0 * COALESCE(IF(IS_USED_LOCK(?) <=> CONNECTION_ID(), 1, GET_LOCK(?, 0)), 0), ?, ?, UTC_TIMESTAMP(6)
FROM {queue} q WHERE q.name = ? FOR UPDATE`

	// qTicketBellLetGo lets go a ticket's own doorbell that the doorbell's
	// connection holds, after the ticket's release ran on another
	// connection. Args: bell name.
	qTicketBellLetGo = `DO RELEASE_LOCK(?)`

	// ticketBellSQL is the GET_LOCK name of the own doorbell of ticket t (see
	// ticketBellName), made from its row.
	ticketBellSQL = `CONCAT('dsynct:', LOWER(HEX(t.holder)), ':', LOWER(HEX(t.token)))`

	// ticketInsertSQL and ticketNumberedSQL are qTicketInsert's insert and
	// its SELECT of the new ticket, numbered under the per-name row's
	// lock. Args of the SELECT: mode, lease id, token, mode, name.
	ticketInsertSQL   = "INSERT INTO {ticket} (name, seq, holder, token, mode, held_since)\n"
	ticketNumberedSQL = `SELECT q.name, LAST_INSERT_ID(2 * (` + ticketNumberQ + `)
       + IF(` + ticketConflictQ + `, 1, 0)) DIV 2, ?, ?, ?, UTC_TIMESTAMP(6)
FROM {queue} q WHERE q.name = ? FOR UPDATE`

	// qTicketNumber and qTicketAdd enqueue a waiter on a Galera cluster, in
	// one transaction. Row locks are local to a node there, so the order
	// comes from the counter instead: every enqueue of a name writes its
	// per-name row, so two enqueues on different nodes that did not see each
	// other conflict at certification (one is rolled back and retried), and
	// a ticket is numbered only on a node that has applied every lower one
	// (it read the counter they set, in the transaction that inserted them).
	// qTicketNumber: args mode, name; LastInsertId: twice the new number,
	// plus 1 when something a ticket of the mode conflicts with is ahead
	// of it (as for qTicketInsert; every enqueue and every take of the
	// head slot writes the per-name row, so one committed meanwhile on
	// another node fails this transaction's certification); 0: the
	// per-name row is missing. qTicketAdd: args name, ticket, lease id,
	// token, mode (the ticket is half the LastInsertId of qTicketNumber,
	// rounded down).
	//
	// Every subquery names the row being updated ({queue}.name), never an
	// argument: at READ COMMITTED a statement's plain reads share one view,
	// made at its first plain read, and a subquery that depends on no
	// column of the row may be evaluated before the row is locked (MariaDB
	// 10.11 does), making the view before the wait for the row. With the
	// name as an argument, an enqueue that waited for the row behind
	// another one's transaction read the seq that transaction wrote but
	// not the ticket it inserted: its reader saw no writer ahead and held
	// the lock with it (TestClusterEnqueueSeesTicketCommittedWhileWaiting).
	qTicketNumber = `UPDATE {queue} SET seq = LAST_INSERT_ID(2 * (` + ticketNumberQueue + `)
  + IF(` + ticketConflictQueue + `, 1, 0)) DIV 2
WHERE name = ?`
	qTicketAdd = `INSERT INTO {ticket} (name, seq, holder, token, mode, weight, held_since) VALUES (?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))`

	// qSemNumber is qTicketNumber for a Semaphore's ticket, with the rule
	// of qSemInsert. Args: name, weight, name, limit. qTicketAdd follows
	// it, with mode 2 and the weight.
	qSemNumber = `UPDATE {queue} SET seq = LAST_INSERT_ID(2 * (` + ticketNumberQueue + `)
  + IF(` + semWeights + ` + ? > permits, 1, 0)) DIV 2
WHERE name = ? AND permits = ?`

	// qTicketTake takes the lock for an exclusive ticket when no live ticket
	// is ahead of it, and with it the next fence. Args: ticket, name. It
	// writes only then: LastInsertId is the new fence, or notAtHead (the row
	// is matched but left unchanged, which writes and replicates nothing).
	// 0 (no row matched): the per-name row is missing (an operator deleted
	// it); run qQueueCreate, then again. Once no live ticket is ahead, none
	// ever is again (later tickets are numbered higher, a lease that
	// ended never lives again, and the head slot is taken only while no
	// live ticket exists), so a read-only count of 0 (qTicketConflicts)
	// followed by this statement cannot be overtaken. A live holder of the
	// head slot is ahead of every ticket; the statement reads holder on the
	// row it has locked, so it sees the latest take of the slot. When it
	// takes the lock it also writes held_since (see qCreateQueue): the
	// fence's assignment runs first and sets LAST_INSERT_ID() to the new
	// fence, or to notAtHead, which no fence reaches.
	qTicketTake = `UPDATE {queue} SET
  fence = IF(EXISTS (SELECT 1 FROM {ticket} t JOIN {lease} l ON l.id = t.holder
                     WHERE t.name = {queue}.name AND t.seq < ? AND l.expires_at > UTC_TIMESTAMP(6))
             OR ` + slotHeldQueue + `,
             fence + 0 * LAST_INSERT_ID(` + notAtHeadSQL + `), LAST_INSERT_ID(fence + 1)),
  held_since = IF(LAST_INSERT_ID() = fence, UTC_TIMESTAMP(6), held_since)
WHERE name = ?`

	// qSemTake takes a fence for a Semaphore's ticket when it holds: when
	// the weights of the live tickets up to and including it add up to at
	// most the limit (the prefix rule). Args: name, ticket, name, limit.
	// LastInsertId as qTicketTake's (0 also for a row of other permits,
	// see qSemInsert). Once a ticket holds, it holds until it goes: the
	// tickets ahead of it only go (or shrink, qSemShrink), later ones are
	// numbered behind it, and an ended lease never lives again. So the
	// holders are always a prefix of the live line, and their weights add
	// up to at most the limit; a large request at the head is not
	// overtaken by smaller ones behind it, whose prefix includes it. Each
	// take adds one to the name's fence, under the row's lock, so the
	// holders' fences are strictly increasing in the order of their takes.
	qSemTake = `UPDATE {queue} SET
  fence = IF((SELECT COALESCE(SUM(st.weight), 0)` + semLive + ` AND st.seq <= ?) > permits,
             fence + 0 * LAST_INSERT_ID(` + notAtHeadSQL + `), LAST_INSERT_ID(fence + 1))
WHERE name = ? AND permits = ?`

	// qSemShrink gives back part of a Semaphore's hold (Release of fewer
	// permits than the ticket's weight): the ticket's weight becomes the
	// new one, if this acquisition still has the ticket and it weighs
	// more. Args: new weight, name, lease id, token, new weight.
	// RowsAffected 1: shrunk (idempotent: run again, it changes nothing).
	qSemShrink = `UPDATE {ticket} SET weight = ? WHERE name = ? AND holder = ? AND token = ? AND weight > ?`

	// qQueueTake takes the head slot (see qCreateQueue) for an exclusive
	// hold, with the next fence, when no live session holds it and no live
	// ticket of the name exists: an uncontended Lock in one statement, no
	// ticket. Args: -lease id, token, lease id, name. LastInsertId: the new
	// fence; notAtHead when the lock is held or the line is not empty (the
	// row is matched but left unchanged, which writes and replicates
	// nothing); 0 (no row matched): the per-name row is missing, run
	// qQueueCreate, then again. As in qLockAcquire the first assignment
	// makes the decision, marking the row taken with the negative lease id,
	// and the later ones test for the mark. The ticket check reads without
	// locks, after the row lock is granted: every enqueue holds that lock
	// (single server) or writes the row (cluster) until it commits, so a
	// ticket it does not see is numbered after the take and waits for it.
	// A slot held by this session itself counts as held (see qLockAcquire).
	qQueueTake = `UPDATE {queue} SET
  holder = IF(NOT ` + slotHeldQueue + `
              AND NOT EXISTS (SELECT 1 FROM {ticket} t JOIN {lease} l ON l.id = t.holder
                              WHERE t.name = {queue}.name AND l.expires_at > UTC_TIMESTAMP(6)),
              ?, holder),
  fence = IF(holder < 0, LAST_INSERT_ID(fence + 1), fence + 0 * LAST_INSERT_ID(` + notAtHeadSQL + `)),
  token = IF(holder < 0, ?, token),
  held_since = IF(holder < 0, UTC_TIMESTAMP(6), held_since),
  holder = IF(holder < 0, ?, holder)
WHERE name = ?`

	// qQueueRelease frees the head slot if, and only if, this acquisition
	// still holds it. Idempotent, so it also undoes a take whose outcome is
	// unknown. Args: name, lease id, token. RowsAffected 1: freed; 0: this
	// acquisition did not hold it. LastInsertId 1 when tickets of the name
	// exist: they all waited for the slot (a ticket is only ever inserted
	// behind it), so the releaser rings its doorbell. A waiter that read
	// the slot's holder (qTicketAhead) did so after its ticket committed,
	// so a release that comes after sees the ticket and rings.
	qQueueRelease = `UPDATE {queue} SET holder = 0,
  token = 0 + 0 * LAST_INSERT_ID(EXISTS (SELECT 1 FROM {ticket} t WHERE t.name = {queue}.name))
WHERE name = ? AND holder = ? AND token = ?`

	// qTicketRelease removes a ticket (a hold that is over, or a waiter
	// leaving the line) and the marker that a waiter behind it left
	// (qTicketWant). Args: name, lease id, token, ticket + markerBase.
	// RowsAffected 2: a waiter waits on this session's doorbell; ring it.
	// The marker's key is above every ticket's, so the DELETE, which scans
	// the name's rows in key order, reaches it after the ticket: a
	// qTicketWant that locked the ticket first has committed its marker by
	// then.
	qTicketRelease = `DELETE FROM {ticket} WHERE name = ? AND ((holder = ? AND token = ?) OR (seq = ? AND holder = 0))`

	// The handoff statements: a release on the connection that holds the
	// session's doorbell rings it in the same statement when a waiter waits
	// (as qLockReleaseRing does for a Mutex), and a waiter that a doorbell
	// woke checks its turn with a statement that first waits for the
	// release that woke it to commit. The ring comes before the release's
	// commit, and a plain read at READ COMMITTED sees the last committed
	// rows, so a woken waiter's plain check could still see the hold it
	// waited for; its check therefore locks what a release writes (the
	// per-name row, and the ticket it waited behind, in share mode) before
	// its reads: the lock wait ends with the release's commit, and the
	// reads, whose snapshot is taken at their first row (READ COMMITTED),
	// come after. The ring's GET_LOCK runs only when the connection does not
	// hold the next generation yet (see qLockReleaseRing), so a statement
	// rolled back (1213) and run again, or a condition the server evaluates
	// twice, takes it once.

	// qQueueReleaseRing is qQueueRelease on the doorbell's connection,
	// ringing the doorbell in the same statement when tickets of the name
	// exist: it takes the next generation and lets the current one go.
	// Args: next doorbell name (twice), current doorbell name, name, lease
	// id, token. RowsAffected as qQueueRelease's. LastInsertId 0: no ticket
	// (or nothing freed); 2: rung, the next generation taken; 1: rung, the
	// next generation not taken.
	qQueueReleaseRing = `UPDATE {queue} SET holder = 0,
  token = 0 + 0 * LAST_INSERT_ID(IF(EXISTS (SELECT 1 FROM {ticket} t WHERE t.name = {queue}.name),
    1 + IF(IS_USED_LOCK(?) <=> CONNECTION_ID(), 1, COALESCE(GET_LOCK(?, 0), 0)) + 0 * COALESCE(RELEASE_LOCK(?), 0), 0))
WHERE name = ? AND holder = ? AND token = ?`

	// qTicketReleaseRing is qTicketRelease on the doorbell's connection:
	// it removes the session's ticket and, when a waiter left its marker
	// behind it (qTicketWant), rings the doorbell and removes the marker, in
	// one statement. It also lets the ticket's own doorbell go (see
	// qTicketInsertBell; a ticket enqueued elsewhere has none, and
	// RELEASE_LOCK of a name this connection does not hold does nothing),
	// as it deletes the ticket and before it commits: a waiter it wakes
	// waits for that commit (see qTicketTakeWoken). Args: name, lease id,
	// token, the ticket's bell name (see ticketBellName), ticket +
	// markerBase, lease id, next doorbell name (twice), current doorbell
	// name. A DELETE
	// reports no LAST_INSERT_ID, so the rows say what it did: 2, the ticket
	// and the marker: rung, the next generation taken; 1: the ticket alone,
	// nobody waited; 0: the ticket was not this acquisition's (free it with
	// qTicketRelease, which decides as before). The ring is the last term
	// of the marker's condition, so the server, which evaluates the
	// conditions in order and stops at the first false one, runs it on that
	// marker only, never on another of the name's rows (another ticket's
	// marker). It lets the current generation go only once the connection
	// holds the next one; when the next one cannot be taken (another
	// connection holds it), it rings nothing and fails on purpose, with an
	// overflow of the marker's seq (error 1690, which the server raises
	// only where it evaluates that branch), so the statement is rolled back
	// and says so: the caller drops the doorbell's connection, which wakes
	// the waiters, and frees the ticket on another connection (a ring that
	// let the current generation go without the next one, reported as rows
	// 1, left the lease row publishing a generation nobody held). The
	// marker must name this session as the holder of the ticket it waits
	// behind (token, see qTicketWant; 1: a marker of a version before), so
	// that a marker behind a number that came again for another session
	// (this one's release of it committed, and the reaper runs it again) is
	// not rung for: a ring reported as none would leave the doorbell's
	// generations astray. Rows as qTicketRelease's, read in key order: the
	// ticket before its marker.
	qTicketReleaseRing = `DELETE FROM {ticket} WHERE name = ? AND ((holder = ? AND token = ?
      AND COALESCE(RELEASE_LOCK(?), 0) >= 0)
  OR (seq = ? AND holder = 0 AND token IN (1, ?)
      AND IF(IS_USED_LOCK(?) <=> CONNECTION_ID() OR GET_LOCK(?, 0) = 1, COALESCE(RELEASE_LOCK(?), 0) >= 0, seq + ~0 > 0)))`

	// qTicketTakeWoken is qTicketTake for a waiter that a doorbell woke: it
	// first waits for the release it was woken by to commit (see above), by
	// the per-name row's lock (a head slot's release) and a share lock on
	// the ticket it waited behind (a ticket's release; there is no row to
	// wait for once it is gone), then decides as qTicketTake does. Args:
	// ticket, name, the ticket waited behind (0: the head slot). Results as
	// qTicketTake's.
	qTicketTakeWoken = qTicketTake + wokenCond

	// qSemTakeWoken is qSemTake for a waiter that a doorbell woke, as
	// qTicketTakeWoken is qTicketTake. Args: name, ticket, name, limit,
	// the ticket waited behind.
	qSemTakeWoken = qSemTake + wokenCond

	// wokenCond is the condition of the woken takes: a share lock on the
	// ticket waited behind, which waits for its release to commit.
	wokenCond = ` AND (SELECT COUNT(*) FROM {ticket} w WHERE w.name = {queue}.name AND w.seq = ? LOCK IN SHARE MODE) >= 0`

	// qTicketConflictsWoken is qTicketConflicts (after 0) for a shared
	// waiter that a doorbell woke: it reads the per-name row and the ticket
	// it waited behind in share mode first, which waits for the release
	// it was woken by to commit (see above). Args: before, mode, name, the
	// ticket waited behind (0: the head slot). No row: the per-name row is
	// missing (use qTicketConflicts).
	qTicketConflictsWoken = `SELECT (SELECT COUNT(*) FROM {ticket} t JOIN {lease} l ON l.id = t.holder
  WHERE t.name = q.name AND t.seq > 0 AND t.seq < ? AND (t.mode = 1 OR ? = 1) AND l.expires_at > UTC_TIMESTAMP(6))
  + IF(` + slotHeldQ + `, 1, 0)
FROM {queue} q
WHERE q.name = ? AND (SELECT COUNT(*) FROM {ticket} w WHERE w.name = q.name AND w.seq = ? LOCK IN SHARE MODE) >= 0
LOCK IN SHARE MODE`

	// qTicketAhead finds the nearest live ticket ahead of a waiting one
	// that it conflicts with (see qTicketConflicts), its session's doorbell
	// and how long that session's lease has left in microseconds: the
	// waiter blocks on that doorbell (see doorbell.go). When no such ticket is
	// ahead, a live holder of the head slot is, with seq 0: its release
	// (qQueueRelease) rings whenever tickets exist, so the waiter leaves no
	// marker. Last, whether a marker is behind that ticket already (left
	// by the waiter's enqueue, see qTicketInsert, or by another waiter)
	// with the token of that ticket's holder (or 1, see
	// qTicketReleaseRing): then its release rings, and the waiter leaves
	// none. A marker with another token was left by an earlier holder of
	// the number and is not rung for; the waiter's qTicketWant makes it
	// its own. That holds
	// because the read locks each ticket it reports (in share mode, a
	// current read) before it reports it: a release of it under way, which
	// may have rung already inside its statement and taken the marker with
	// it, is waited for, and the ticket, gone then, is not reported; a
	// release that comes after the read finds the marker, which was
	// committed before the read, and rings the generation read or a later
	// one (the one read is then free already). The generation of a
	// ticket's doorbell is the next one when a connection holds it: a
	// ring of that session's doorbell that is not published yet (the
	// doorbell goroutine publishes after the statement that rang it). A
	// ring not published yet cannot be the one this waiter is owed, which
	// only the ticket's release sends, after it locked the ticket; so the
	// waiter does not block on the rung generation, which would wake it at
	// once for nothing (a take, a read and a block more). Another
	// connection holds the next generation only for a moment (a waiter
	// blocking on it before it is taken lets it go in the same statement);
	// a block on it then ends at once, as for a ring for nothing. Behind
	// the head slot the published generation is read: that read takes no
	// lock, and the slot's release may have rung for this waiter. A
	// sixth column is the token of the ticket's holder when the ticket's
	// own doorbell is held (see qTicketInsertBell); it is 0 when that bell
	// is not held, and for the head slot. When it is not 0, the waiter
	// blocks on that bell instead
	// (qBellWait on ticketBellName, a statement that reads no table) and
	// leaves no marker. The bell is read after the ticket's share lock is
	// granted, so a release under way has let it go and committed by
	// then (the ticket is gone); a release after the read lets it go
	// after the read, which the block then sees. Args: name, ticket,
	// mode, name. No row: nothing conflicting is ahead.
	qTicketAhead = ticketAheadCols + `,
  IF(IS_USED_LOCK(` + ticketBellSQL + `) IS NULL, 0, t.token)` + ticketAheadFrom + `
WHERE t.name = ? AND t.seq < ? AND (t.mode = 1 OR ? = 1) AND l.expires_at > UTC_TIMESTAMP(6)
  AND (SELECT COUNT(*) FROM {ticket} w WHERE w.name = t.name AND w.seq = t.seq LOCK IN SHARE MODE) > 0
UNION ALL
SELECT 0, l.id, l.bell, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at), 1, 0
FROM {queue} q JOIN {lease} l ON l.id = q.holder
WHERE q.name = ? AND l.expires_at > UTC_TIMESTAMP(6)
ORDER BY 1 DESC LIMIT 1`

	// ticketAheadCols is what qTicketAhead and qSemAhead read of the
	// ticket a waiter blocks on, from ticketAheadFrom.
	ticketAheadCols = `SELECT t.seq, l.id, IF(l.bell = 0, 0, l.bell + (IS_USED_LOCK(` + bellNextNameSQL + `) IS NOT NULL)),
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at),
  EXISTS (SELECT 1 FROM {ticket} m WHERE m.name = t.name AND m.seq = t.seq + ` + markerBaseSQL + ` AND m.token IN (1, t.holder))`
	ticketAheadFrom = `
FROM {ticket} t JOIN {lease} l ON l.id = t.holder`

	// qSemAhead is qTicketAhead for a Semaphore's waiting ticket, which
	// every live ticket ahead holds back: when the weights ahead of it add
	// up to more than the limit, the nearest ticket ahead waits too, and
	// the waiter blocks on it (whose grant rings, see acquireTicket);
	// else every ticket ahead holds (holders are a prefix of the line, see
	// qSemTake), the waiter is the first that waits, and it blocks on the
	// oldest of them, the head of the line: with holds of like length,
	// granted in order, the first to end. A release by another holder
	// does not ring for it (one blocked connection waits on one doorbell),
	// so a sixth column says that the waiter is that first waiter and
	// more than one live ticket, all holding, is ahead of it: then it
	// blocks for at most semHeadWait at a time (see Semaphore, "Waking").
	// One branch or the other finds it, each from its end of the line,
	// and share-locks only the first live ticket it reads (the IF keeps
	// the other branch from locking any: an AND may be evaluated in any
	// order); the weights ahead name the name by argument, so they are
	// summed once, not once per ticket read. Args: name, ticket, name,
	// ticket, limit, name, ticket, name, ticket, name, ticket, limit.
	// Results as qTicketAhead's, and that flag; no row: nothing live is
	// ahead.
	qSemAhead = `(` + ticketAheadCols + `, FALSE` + semAheadFrom + `
WHERE t.name = ? AND t.seq < ? AND l.expires_at > UTC_TIMESTAMP(6)
  AND IF(` + semWeightsAhead + ` > ?, ` + semAheadLocked + `, FALSE)
ORDER BY t.seq DESC LIMIT 1)
UNION ALL
(` + ticketAheadCols + `, (SELECT COUNT(*) > 1` + semLive + ` AND st.seq < ?)` + semAheadFrom + `
WHERE t.name = ? AND t.seq < ? AND l.expires_at > UTC_TIMESTAMP(6)
  AND IF(` + semWeightsAhead + ` <= ?, ` + semAheadLocked + `, FALSE)
ORDER BY t.seq LIMIT 1)`

	// semAheadFrom is ticketAheadFrom with the lease read by its key, so
	// that the line is read in its order up to the first ticket that
	// matches: a join buffer (which a small lease table invites) would
	// read, and share-lock, every ticket ahead and sort them.
	semAheadFrom = `
FROM {ticket} t JOIN {lease} l FORCE INDEX (PRIMARY) ON l.id = t.holder`

	// semWeightsAhead: the weights of the live tickets of a name ahead of
	// a ticket. Args: name, ticket.
	semWeightsAhead = `(SELECT COALESCE(SUM(st.weight), 0)` + semLive + ` AND st.seq < ?)`

	// semAheadLocked: ticket t, share-locked, so that the read waits for a
	// release of it under way (see qTicketAhead).
	semAheadLocked = `(SELECT COUNT(*) FROM {ticket} w WHERE w.name = t.name AND w.seq = t.seq LOCK IN SHARE MODE) > 0`

	// qTicketWant leaves a marker behind a ticket (seq ticket + markerBase,
	// holder 0, never live, and above every ticket number, so every check
	// and numbering skips it) that says a waiter waits for it, when
	// there is none (the enqueue leaves one behind the nearest conflicting
	// ticket ahead; a waiter whose nearest one went meanwhile leaves one
	// behind the next):
	// its release (qTicketRelease) deletes the marker too and rings. It
	// locks the ticket it reads, so a release either comes after it and
	// finds the marker, or came before and the ticket is gone. Args: name,
	// ticket. LastInsertId 1: the ticket was there (marker left, or left
	// already by another waiter); 0: it is gone, check again at once. The
	// marker's token is the lease id of the ticket's holder, whose release
	// rings for it (see qTicketReleaseRing); a marker there already gets
	// it too (the ON DUPLICATE KEY UPDATE, see qTicketInsert), since one
	// left by an earlier holder of the number has another.
	qTicketWant = `INSERT INTO {ticket} (name, seq, holder, token, mode)
SELECT t.name, t.seq + ` + markerBaseSQL + `, 0, t.holder + 0 * LAST_INSERT_ID(1), 0 FROM {ticket} t WHERE t.name = ? AND t.seq = ? FOR UPDATE
ON DUPLICATE KEY UPDATE token = VALUES(token)`

	// qTicketDelete removes a ticket (leaving the line, or releasing the
	// lock), found by its holder and token so that it also removes a ticket
	// whose insert had an unknown outcome. Args: name, lease id, token.
	// RowsAffected 1: removed; 0: there was none.
	qTicketDelete = `DELETE FROM {ticket} WHERE name = ? AND holder = ? AND token = ?`

	// qTicketConflicts counts the live tickets of a name between two ticket
	// numbers (exclusive) that a ticket of the given mode conflicts with:
	// all of them for an exclusive ticket, exclusive ones for a shared one;
	// plus 1 for a live holder of the head slot, which is ahead of every
	// ticket and conflicts with all. Args: name, after, before, mode, name.
	// It is the read-only poll of a waiter (its place in line); a reader's
	// check after waiting (no fence to take, so no write); TryRLock counts
	// the whole line; a reader joining a hold of its process counts the
	// writers queued after that hold (the slot is never held then: it is
	// taken only while no live ticket exists, and the hold's ticket is).
	qTicketConflicts = `SELECT (SELECT COUNT(*) FROM {ticket} t JOIN {lease} l ON l.id = t.holder
  WHERE t.name = ? AND t.seq > ? AND t.seq < ? AND (t.mode = 1 OR ? = 1) AND l.expires_at > UTC_TIMESTAMP(6))
  + (SELECT COUNT(*) FROM {queue} q JOIN {lease} l ON l.id = q.holder
     WHERE q.name = ? AND l.expires_at > UTC_TIMESTAMP(6))`

	// qTicketGranted records when a shared ticket that waited began to
	// hold (see qCreateTicket's held_since): its holder runs it once, when
	// its check (qTicketConflicts) finds nothing conflicting ahead any more;
	// so does a Semaphore's, once its take (qSemTake) took a fence after a
	// wait. Only a reader or Semaphore that waited runs it, so the
	// uncontended paths pay nothing; it is sent in the background, after
	// the call returned (see tickets.granted), and finds nothing to update
	// when the release came first. Args: name, ticket, lease id, token.
	// RowsAffected is not used: the ticket's hold does not depend on it.
	qTicketGranted = `UPDATE {ticket} SET held_since = UTC_TIMESTAMP(6) WHERE name = ? AND seq = ? AND holder = ? AND token = ?`

	// qTicketsOrphaned lists up to 1000 tickets whose lease row is gone
	// (crashed sessions, purged by qLeasePurge), and markers (qTicketWant)
	// whose ticket is gone (left by a waiter after the release, which could
	// not delete them). They are skipped anyway;
	// removing them only keeps the table small. A plain read at READ
	// COMMITTED takes no locks, so it never waits for, or holds up, lock
	// traffic; each ticket is then removed by its key (qTicketPurge). (One
	// DELETE with this condition would lock its way through the whole
	// table, waiting behind every ticket being written and making lock
	// traffic wait behind it.)
	qTicketsOrphaned = `SELECT t.name, t.seq, t.holder FROM {ticket} t LEFT JOIN {lease} l ON l.id = t.holder
WHERE (t.holder <> 0 AND l.id IS NULL)
   OR (t.holder = 0 AND NOT EXISTS (SELECT 1 FROM {ticket} x WHERE x.name = t.name AND x.seq = t.seq - ` + markerBaseSQL + `))
LIMIT 1000`

	// qTicketPurge removes one ticket of a lease that is gone. Args: name,
	// ticket, lease id. The lease id matters: on a single server a number
	// comes again once the tickets above it are gone, so between the listing
	// and the delete the number can belong to a live ticket of another
	// lease (lease ids are random and never reused).
	qTicketPurge = `DELETE FROM {ticket} WHERE name = ? AND seq = ? AND holder = ?`
)

// Conditions of the queued lock statements, spliced into them, on the
// per-name row (alias q, or the {queue} table itself). slotHeld*: a live
// session holds the head slot (a holder of 0 names no lease: lease ids are
// positive). ticketConflict*: a ticket of the mode given by the one
// argument would have something ahead that it conflicts with: a live
// ticket of the name (an exclusive one, for a shared ticket), or a live
// holder of the head slot. Every ticket of the name is ahead of one being
// numbered.
const (
	slotHeldQ     = `EXISTS (SELECT 1 FROM {lease} hl WHERE hl.id = q.holder AND hl.expires_at > UTC_TIMESTAMP(6))`
	slotHeldQueue = `EXISTS (SELECT 1 FROM {lease} hl WHERE hl.id = {queue}.holder AND hl.expires_at > UTC_TIMESTAMP(6))`

	// ticketNumberQ and ticketNumberQueue: the number of a ticket being
	// inserted, one above the row's counter and every ticket of the name.
	ticketNumberQ = `GREATEST(q.seq,
         COALESCE((SELECT MAX(t.seq) FROM {ticket} t WHERE t.name = q.name AND t.seq < ` + markerBaseSQL + `), 0)) + 1`
	ticketNumberQueue = `GREATEST(seq,
  COALESCE((SELECT MAX(t.seq) FROM {ticket} t WHERE t.name = {queue}.name AND t.seq < ` + markerBaseSQL + `), 0)) + 1`

	// semLive: the live tickets of a name (markers have no lease), named
	// by argument, not by the statement's row, so that a sum over them is
	// computed once per statement (a correlated subquery runs once per
	// row, as MySQL has no subquery cache); every sum of a Semaphore's
	// weights reads them through it. Args: name. Unlike qTicketNumber's
	// subqueries (see there), such a sum may be read in a view made before
	// its statement waited for the queue row, and is sound all the same,
	// as a stale view only makes it larger: the tickets ahead of one were
	// committed before it was numbered; a release or shrink that the view
	// misses counts weight that is gone; and a renewal it misses cannot
	// make a live lease look ended, as a lease is renewed only before it
	// ends, which is after the statement's UTC_TIMESTAMP(6) (the time the
	// statement began).
	semLive = ` FROM {ticket} st STRAIGHT_JOIN {lease} sl ON sl.id = st.holder
          WHERE st.name = ? AND sl.expires_at > UTC_TIMESTAMP(6)`
	// semWeights: the weights of the live tickets of a name, which are all
	// ahead of one being numbered. Args: name.
	semWeights = `(SELECT COALESCE(SUM(st.weight), 0)` + semLive + `)`

	// markerUpsert ends the enqueues' insert of a marker (see
	// qTicketInsert).
	markerUpsert = `ON DUPLICATE KEY UPDATE token = IF({ticket}.holder = 0, VALUES(token), {ticket}.seq + ~0)`

	ticketConflictQ = `(EXISTS (SELECT 1 FROM {ticket} ct JOIN {lease} cl ON cl.id = ct.holder
          WHERE ct.name = q.name AND (ct.mode = 1 OR ? = 1) AND cl.expires_at > UTC_TIMESTAMP(6))
        OR ` + slotHeldQ + `)`
	ticketConflictQueue = `(EXISTS (SELECT 1 FROM {ticket} ct JOIN {lease} cl ON cl.id = ct.holder
          WHERE ct.name = {queue}.name AND (ct.mode = 1 OR ? = 1) AND cl.expires_at > UTC_TIMESTAMP(6))
        OR ` + slotHeldQueue + `)`
)

// One name, one kind. A name is one lock whatever kind of lock uses it:
// the name's row in the lock table binds it to one kind while the row
// exists (kind: 0 Mutex, including Mutex.LockTx; 1 the queued locks,
// FairMutex and RWMutex, which share one lock space; 4 Election, see
// "Elections" below; 5 Semaphore, whose line is the queued locks'
// machinery with a weight per ticket), and the other kinds get
// ErrOtherKind. An Election and a Semaphore bind like a queued lock
// (qQueueBind, with their kind, and a Semaphore with its limit), and keep
// their queue rows and tickets under queue keys of their own (see "Queue
// keys"), so that no statement of the queued locks, which do not read the
// lock row, ever meets them. Every row of either kind is created through a write
// of that one row, so two sessions racing with different kinds on a name
// meet on its primary key, on a single server (the row lock) and on a
// Galera cluster (certification: the loser's transaction is rolled back,
// 1213, and runs again):
//
//   - A Mutex creates its row by inserting it (qLockAcquire), with kind 0;
//     a row of another kind it leaves unchanged and reports (otherKind).
//   - A queued lock creates its queue row (qQueueCreate) only in one
//     transaction with qQueueBind, which writes the lock row: inserts it
//     with kind 1, or adds one to the fence of a kind-1 row; a kind-0 row
//     (or any other kind's) it leaves unchanged and reports. An Election
//     or a Semaphore binds with its kind, and creates the queue row of
//     its queue key. Before that it reads the row
//     (qLockKind), so that a Mutex's name fails without a write, and
//     without waiting for a transaction that holds the row (LockTx). A
//     Mutex may create the row after that read and hand it to a
//     transaction: the bind does not wait for it (1205 at once), and the
//     row is read again (see createQueueRow).
//   - So a queue row exists only while the name's lock row has kind 1,
//     and its statements need not read the lock row: the uncontended
//     paths keep their statements. The sweep deletes a kind-1 row only
//     when the name has no queue row and no ticket (lockFree), under the
//     row lock its DELETE takes (on a cluster: a write of the row, which
//     certification orders against a qQueueBind), and checks both with the
//     locking reads of a DELETE's subqueries: a queue row is created only
//     with the lock row written, and a ticket inserted only while the queue
//     row exists (qTicketInsert reads it FOR UPDATE; qTicketNumber writes
//     it).
//
// The name stays bound until the sweep deletes the row (see "Clean-up of
// free rows"): a Mutex's the free-row age after its last use, the queued
// locks' about twice that (their queue row goes first, then the lock
// row); never with a free-row age of 0.
const (
	// qLockKind reads the kind of a name's lock row. A plain read: no
	// locks. Args: name. No row: the name is unbound.
	qLockKind = `SELECT kind FROM {lock} WHERE name = ?`

	// qQueueBind binds a name to the queued locks, in the transaction
	// that creates its queue row (qQueueCreate): it inserts the name's lock
	// row with kind 1, or adds one to the fence of its kind-1 row (a
	// change, so that on a Galera cluster the row is written, and
	// certified against any other write of it; the fence of a kind-1 row
	// is no lock's, and a change of it voids the sweep's mark). It runs as
	// its no-wait variant (noWaitSQL) where the server takes that, so that
	// a transaction holding the row (Mutex.LockTx) gives 1205 at once
	// instead of a wait of innodb_lock_wait_timeout. Args: name, kind
	// (kindRowQueued or kindRowSemaphore), permits (the semaphore's limit,
	// else 0). LastInsertId otherKind plus the row's kind: the name is
	// another kind's; limitMismatch: a semaphore of another limit's (in
	// both cases the row is left unchanged: roll back); else the row binds
	// the name to the kind and permits until the transaction ends. A
	// semaphore's limit is the one of the statement that inserted the
	// row: it stands while the name stays bound.
	qQueueBind = `INSERT INTO {lock} (name, kind, fence, permits) VALUES (?, ?, LAST_INSERT_ID(1), ?)
ON DUPLICATE KEY UPDATE fence = IF(kind = VALUES(kind) AND permits = VALUES(permits), LAST_INSERT_ID(fence + 1),
  fence + 0 * LAST_INSERT_ID(IF(kind = VALUES(kind), ` + limitMismatchSQL + `, ` + otherKindSQL + ` + kind)))`
)

// Elections (see election.go). An Election of name N is a queued lock,
// whose exclusive hold is the leadership and whose fence is the term, kept
// in the queue and ticket tables under its queue key: N with the byte 0xFF
// before it (see "Queue keys"), so that no FairMutex or RWMutex, of this
// version or an older one, ever reads or takes an Election's rows: their
// statements do not read the lock row's kind once the queue row exists. N
// itself is bound to the Election in the lock table, kind 4 (qQueueBind,
// see "One name, one kind"), so that a Mutex, FairMutex or RWMutex of the
// name gets ErrOtherKind, and an Election of a name they use gets it too.
// Why 4 and not 2 (and 5, not 3, for a Semaphore, which has the same
// hazards): the Mutex statement of schema version 6 (qLockAcquire) answered
// LAST_INSERT_ID(kind * otherKind) for a row of another kind, and only 1 *
// otherKind was its refusal; with 2 or 3 it answered a positive number,
// which that code took for a fence: a Mutex held without a row. From 4 on
// the product overflows a BIGINT, and that code gets error 1690 instead
// (not retried: its Lock returns it), so a process of that version never
// takes an Election's name for its own. Its FairMutex and RWMutex refuse
// the name at their bind (qQueueBind answers otherKind for any kind but 1).
// Its sweep treats the lock row of kind 4 or 5 as free while the name has
// no queue row of its own (an Election's and a Semaphore's are under their
// queue keys), and may delete it: then, with processes of both versions at
// work, another kind may bind the name while an Election or Semaphore runs
// under its queue key; the two never share a row, so neither's guarantees
// depend on it (a Semaphore's limit stays checked by its queue row's
// permits). Its value is in the leader table (qCreateLeader), written by
// the leader only while it holds (qLeaderRecord, qLeaderProclaim) and read
// together with the hold in one statement (qLeaderRead).
const (
	// qCreateLeader creates the leader table: one row per election name
	// and session that leads or led it, written by the leader once it
	// holds (qLeaderRecord): token, the acquisition token of the hold it
	// was written for (the queue row's head slot token, or the ticket's),
	// term the fence that hold took, ver the number of the value's
	// latest Proclaim in that term (0: the Campaign's), value the value.
	// A row counts only while its hold does: joined with the name's
	// current holder by holder and token (qLeaderRead), a row of an
	// ended hold or lease never matches, and is overwritten by the
	// session's next hold of the name, deleted by Resign, or by the sweep
	// once its lease has ended (qLeadersEnded).
	qCreateLeader = `CREATE TABLE IF NOT EXISTS {leader} (
  name   VARBINARY(255) NOT NULL,
  holder BIGINT         NOT NULL,
  token  BIGINT         NOT NULL,
  term   BIGINT         NOT NULL,
  ver    BIGINT         NOT NULL DEFAULT 0,
  value  BLOB           NOT NULL,
  PRIMARY KEY (name, holder)
) ENGINE=InnoDB`

	// qLeaderRecord records the leader of a hold that has taken its fence
	// (the head slot's qQueueTake, or an exclusive ticket's qTicketTake):
	// the row of this session and name, with the hold's token, its fence
	// as the term, ver 0 and the value, in place of any earlier one of the
	// session. It writes only while the hold is there (the head slot or
	// the ticket with this token), so that a statement that the client
	// gave up on and that lands late, after the hold ended, records
	// nothing. That check is a plain read at the statement's start, not
	// at its write: a record delayed in the server past its hold's end
	// and a later hold's record would still land, so it replaces only a
	// row of a lower term (terms of a name strictly increase with each
	// hold; each assignment is conditional, term's last, as the server
	// assigns them in order). Args: name, lease id, token, term, value,
	// queue key, lease id, token, queue key, lease id, token.
	// RowsAffected 0: the hold is gone (or a later one recorded).
	qLeaderRecord = `INSERT INTO {leader} (name, holder, token, term, ver, value)
SELECT ?, ?, ?, ?, 0, ? FROM DUAL
WHERE ` + leaderHeldSQL + `
ON DUPLICATE KEY UPDATE token = IF(VALUES(term) > term, VALUES(token), token), ver = IF(VALUES(term) > term, 0, ver),
  value = IF(VALUES(term) > term, VALUES(value), value), term = GREATEST(term, VALUES(term))`

	// qLeaderProclaim changes the leader's value, only while its lease is
	// live (the server's clock) and its hold is there, and only to a later
	// ver than the row has: ver is chosen by the client, one above the
	// last it sent, so that a Proclaim the client gave up on that lands
	// after a later one changes nothing. Args: value, ver, name, lease
	// id, token, ver, queue key, lease id, token, queue key, lease id,
	// token. RowsAffected 1: changed (ver always changes, whatever
	// clientFoundRows says); 0: not leading.
	qLeaderProclaim = `UPDATE {leader} SET value = ?, ver = ?
WHERE name = ? AND holder = ? AND token = ? AND ver < ?
  AND EXISTS (SELECT 1 FROM {lease} l WHERE l.id = {leader}.holder AND l.expires_at > UTC_TIMESTAMP(6))
  AND ` + leaderHeldSQL

	// leaderHeldSQL is true while a session's hold of an election is
	// there: the head slot of its queue key, or an exclusive ticket (not
	// a marker), with the session's lease id and the hold's token. It is
	// spliced into qLeaderRecord and qLeaderProclaim. Args: queue key,
	// lease id, token, queue key, lease id, token.
	leaderHeldSQL = `(EXISTS (SELECT 1 FROM {queue} q WHERE q.name = ? AND q.holder = ? AND q.token = ?)
  OR EXISTS (SELECT 1 FROM {ticket} t WHERE t.name = ? AND t.holder = ? AND t.token = ? AND t.seq < ` + markerBaseSQL + `))`

	// qLeaderRead reads an election's holder and its leader row in one
	// statement (one view of the tables): the live ticket whose record
	// has the name's current fence as its term (the hold that took the
	// fence: it holds while its ticket and lease are there), else the
	// live holder of the head slot, else the first live ticket (an
	// Election's tickets are all exclusive: the first live one holds once
	// it has taken the fence). The first of these makes the answer right
	// after the server's clock stepped back: a lease that had ended may
	// then be live again on that clock, and its ticket, still ahead of the
	// leader's, the first live one (found by the checker:
	// TestElectionClockBackRepro in internal/torture). The holder is
	// joined by lease id and token with its leader row, which exists only
	// once that hold has taken its fence and recorded it (qLeaderRecord).
	// So a term is never paired with another hold's value, nor reported
	// before its hold took it; a holder whose lease has ended on the
	// server's clock is no holder. Args: name, queue key, queue key,
	// queue key, name. Result: term, ver and value (NULL: the holder has not recorded
	// itself yet, so nobody leads), the holder's lease id, its doorbell's
	// generation (0: none), and how long its lease has left in
	// microseconds. No row: nobody holds or waits. Only the last member
	// of the UNION is in parentheses (its ORDER BY and LIMIT need them): a
	// derived table that starts with a parenthesized member does not parse
	// on MySQL 5.7 and MariaDB 10.3.
	qLeaderRead = `SELECT c.term, c.ver, c.value, l.id, l.bell, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at)
FROM (SELECT -1 AS pos, t.holder, t.token FROM {ticket} t
        JOIN {leader} rc ON rc.name = ? AND rc.holder = t.holder AND rc.token = t.token
        JOIN {queue} rq ON rq.name = t.name AND rq.fence = rc.term
      WHERE t.name = ? AND t.seq < ` + markerBaseSQL + `
      UNION ALL
      SELECT 0, q.holder, q.token FROM {queue} q WHERE q.name = ? AND q.holder > 0
      UNION ALL
      (SELECT 1, t.holder, t.token FROM {ticket} t JOIN {lease} tl ON tl.id = t.holder
       WHERE t.name = ? AND t.seq < ` + markerBaseSQL + ` AND tl.expires_at > UTC_TIMESTAMP(6)
       ORDER BY t.seq LIMIT 1)) h
JOIN {lease} l ON l.id = h.holder AND l.expires_at > UTC_TIMESTAMP(6)
LEFT JOIN {leader} c ON c.name = ? AND c.holder = h.holder AND c.token = h.token
ORDER BY h.pos LIMIT 1`

	// qLeaderDelete deletes the session's leader row of a hold that ended
	// (Resign, or a Campaign that failed after its hold). Args: name,
	// lease id, token.
	qLeaderDelete = `DELETE FROM {leader} WHERE name = ? AND holder = ? AND token = ?`

	// qLeadersEnded lists up to limit leader rows whose lease has ended
	// or is gone, for the sweep: a plain read, no locks. Lease ids are
	// never reused and an ended lease never lives again, so such a row
	// never counts again, and qLeaderPurge deletes it by its key. Args:
	// limit.
	qLeadersEnded = `SELECT c.name, c.holder FROM {leader} c
  LEFT JOIN {lease} l ON l.id = c.holder AND l.expires_at > UTC_TIMESTAMP(6)
WHERE l.id IS NULL LIMIT ?`

	// qLeaderPurge deletes one leader row of an ended lease (see
	// qLeadersEnded). Args: name, lease id.
	qLeaderPurge = `DELETE FROM {leader} WHERE name = ? AND holder = ?`
)

// Queue keys. The queue and ticket rows of a name are kept under its
// queue key: the name itself for the queued locks (kind 1), and for every
// kind from firstKeyedKind on (Election, Semaphore) the name with one
// byte before it, 0xFF for kind 4, 0xFE for kind 5, and so on down
// (keyPrefixBase - kind). No lock name has such a byte (names are UTF-8,
// where the bytes 0xF5 to 0xFF never occur), so no statement of another
// kind, of this version or an older one, ever reads or takes those rows:
// the queued locks' statements find a name's queue row by its key alone,
// without reading the lock row's kind (see "One name, one kind"). Hence
// a name of a keyed kind has at most 254 bytes. queueKey, boundAs and
// queueKeySQL are the one place that maps kinds to keys.
const (
	firstKeyedKind = kindRowElection
	keyPrefixBase  = 0xFF + firstKeyedKind // the prefix byte is keyPrefixBase - kind
)

// queueKeySQL is the queue key of a lock table row (see "Queue keys"),
// spliced into statements on the lock table. CHAR of one number is a
// binary string of that byte.
const queueKeySQL = `IF({lock}.kind >= 4, CONCAT(CHAR(259 - {lock}.kind), {lock}.name), {lock}.name)`

// queueKey returns the queue key of the name of a lock of kind (see
// "Queue keys").
func queueKey(kind int, name string) string {
	if kind < firstKeyedKind {
		return name
	}
	return string([]byte{byte(keyPrefixBase - kind)}) + name
}

// boundAs returns the name of the lock row that the queue row of key binds
// and the kind it binds it to (see "Queue keys"): the inverse of queueKey.
func boundAs(key string) (string, int) {
	if key != "" && key[0] > keyPrefixBase-kindRowMax-1 {
		return key[1:], keyPrefixBase - int(key[0])
	}
	return key, kindRowQueued
}

// Kinds of a lock row (the kind column).
const (
	kindRowNone      = -1 // no row: the name is unbound (not a value of the column)
	kindRowMutex     = 0  // Mutex
	kindRowQueued    = 1  // FairMutex, RWMutex
	kindRowElection  = 4  // Election (not 2 or 3: see "Elections" above)
	kindRowSemaphore = 5  // Semaphore (not 2 or 3 either)
	kindRowMax       = 5  // the highest kind
)

// otherKind plus the kind of the name's row is the answer of qLockAcquire
// and qQueueBind for a name that another kind of lock uses (see
// otherKindOf); limitMismatch is qQueueBind's for a semaphore's name
// bound with another limit. Fences start at qFenceSeed (about 2^51
// today) and grow by one per acquisition, so they never reach them.
const (
	otherKind        = 1 << 61
	otherKindSQL     = "2305843009213693952"
	limitMismatch    = 3 << 60
	limitMismatchSQL = "3458764513820540928"
)

// otherKindOf reports whether v, a LastInsertId of qLockAcquire or
// qQueueBind, says that another kind of lock uses the name, and which
// (the kind column of its row).
func otherKindOf(v int64) (int, bool) {
	if v >= otherKind && v < otherKind+128 {
		return int(v - otherKind), true
	}
	return 0, false
}

// Clean-up of free rows (see WithFreeRowAge and sweep.go). A sweep pass
// walks the lock table, then the queue table, in primary-key order, in
// batches of at most sweepBatch names: qLockBatchEnd finds the batch's last
// name, and every other statement of the batch is bounded by
// name > after AND name <= last. Per batch it reads
// what there is to do (qLockSweepRead: no locks), then, only when needed,
// records the fence floor (qSweepFloor, read back with qSweepFloorRead),
// deletes the rows that are ready (qLockSweepDelete) and marks the rows
// that are free now (qLockSweepMark).
// Each is its own short autocommit statement at READ COMMITTED, so lock
// traffic waits for the sweep at most one statement of one batch.
//
// A lock row is free when its holder is 0 or names a lease that has ended
// or is gone (lease ids are random and never reused, and an ended lease is
// never renewed, so such a holder never holds again), and no waiter's claim
// on it is current. A pass marks a free row with the time and its fence
// (idle_since, idle_fence); a later pass deletes it when the mark is at
// least the free-row age old and the fence is still the marked one: every
// acquisition adds one to the fence, so the row has not been taken since
// it was found free. The delete checks all of it again on the latest
// version of the row, under the row lock it takes, so an acquisition
// committed meanwhile keeps the row; one that comes after the delete finds
// no row and creates it (qLockAcquire), its fence seeded by qFenceSeed.
//
// A queue row is free when no ticket of its name exists and no live
// session holds its head slot. The delete and the mark check that too, but
// a ticket inserted while the delete runs may be missed (the check reads
// the ticket table as of the statement's start). That is harmless: the
// queue row only holds counters, the line is the ticket table, and every
// statement that needs the row (qTicketInsert, qTicketNumber, qTicketTake,
// qQueueTake) reports a missing row, which queue.go creates again with
// qQueueCreate, seeded above every earlier fence and ticket number, before
// it runs again. The head slot lives in the row itself, so the delete
// reads it on the latest version of the row, under the row lock: a take of
// the slot adds one to the fence, which voids the mark, and a take that
// comes after the delete finds no row.
const (
	// qSweepElect elects the session that runs the next sweep pass, once per
	// interval across every session of the tables: it succeeds only when no
	// pass started (or confirmed it was still running, qSweepHold) within
	// the interval. Args: interval in microseconds. RowsAffected 1: this
	// session runs a pass now (the value written always differs from the
	// one matched, so RowsAffected means the same with clientFoundRows).
	qSweepElect = `UPDATE {schema} SET swept_at = UTC_TIMESTAMP(6)
WHERE id = 1 AND swept_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`

	// qSweepHold tells the other sessions that a long pass is still
	// running, so none of them starts another. No args.
	qSweepHold = `UPDATE {schema} SET swept_at = UTC_TIMESTAMP(6) WHERE id = 1`

	// qSweepFloor records a fence the sweep is about to delete, so that rows
	// created anew start above it (qFenceSeed). Args: fence.
	qSweepFloor = `UPDATE {schema} SET deleted_fence = GREATEST(deleted_fence, ?) WHERE id = 1`

	// qSweepFloorRead reads the recorded floor back (no row: none is
	// recorded, and nothing may be deleted). A plain read, without locks.
	qSweepFloorRead = `SELECT deleted_fence FROM {schema} WHERE id = 1`

	// qLockBatchEnd returns the last name of the next batch: the limit-th
	// name after after, or the last name when fewer are left; NULL when
	// none is. Args: after, limit.
	qLockBatchEnd = `SELECT MAX(name) FROM (SELECT name FROM {lock} WHERE name > ? ORDER BY name LIMIT ?) b`

	// qLockSweepRead reads a batch without locking anything: the highest
	// fence of the rows ready to be deleted (NULL: none) and how many rows
	// are free and not marked with their current fence. Args: age in
	// microseconds, after, last.
	qLockSweepRead = `SELECT MAX(IF(` + lockReady + `, fence, NULL)), COUNT(IF(` + lockMarkable + `, 1, NULL))
FROM {lock} WHERE name > ? AND name <= ?`

	// qLockSweepDelete deletes the rows of a batch that are ready: marked at
	// least age ago with the fence they still have, free now, and with a
	// fence at or below the recorded floor (qSweepFloorRead, after
	// qSweepFloor). The lease check comes last, so it runs only for rows
	// whose mark still holds, whose holder's lease had therefore ended
	// already at the mark: the shared locks a DELETE's subquery takes (at
	// READ COMMITTED too) fall on ended leases, never on one a renewal
	// writes; the DELETE locks nothing else but its own rows. Args: after,
	// last, age in microseconds, floor. RowsAffected: rows deleted.
	qLockSweepDelete = `DELETE FROM {lock} WHERE name > ? AND name <= ? AND ` + lockReady + ` AND fence <= ?`

	// qLockSweepMark marks the rows of a batch that are free now and not
	// marked with their current fence: idle since now, with that fence.
	// Args: after, last. (An UPDATE's subqueries read without locks at READ
	// COMMITTED.)
	qLockSweepMark = `UPDATE {lock} SET idle_since = UTC_TIMESTAMP(6), idle_fence = fence
WHERE name > ? AND name <= ? AND ` + lockMarkable

	// qQueueBatchEnd is qLockBatchEnd for the queue table.
	qQueueBatchEnd = `SELECT MAX(name) FROM (SELECT name FROM {queue} WHERE name > ? ORDER BY name LIMIT ?) b`

	// qQueueSweepRead is qLockSweepRead for the queue table: the highest
	// fence of the rows ready to be deleted (NULL: none) and how many rows
	// are to be marked or unmarked. Args: age in microseconds, after, last.
	qQueueSweepRead = `SELECT MAX(IF(` + queueReady + `, fence, NULL)), COUNT(IF(` + queueMarkable + `, 1, NULL))
FROM {queue} WHERE name > ? AND name <= ?`

	// qQueueSweepDelete deletes the queue rows of a batch that are ready:
	// marked at least age ago with the fence they still have, without a
	// ticket, and with a fence at or below the recorded floor. The ticket
	// check comes last: its shared locks fall only on tickets of rows
	// otherwise ready (readers' tickets: a reader takes no fence). Args:
	// after, last, age in microseconds, floor. RowsAffected: rows deleted.
	qQueueSweepDelete = `DELETE FROM {queue} WHERE name > ? AND name <= ? AND ` + queueReady + ` AND fence <= ?`

	// qQueueSweepMark marks the queue rows of a batch that have no ticket
	// and are not marked with their current fence, and clears the mark of
	// rows that have a ticket now. Readers take no fence, so without the
	// clearing a row that readers use now and then, but that is free at
	// two passes an age apart, would be deleted while in use (harmlessly,
	// see above, but for nothing). Args: after, last.
	qQueueSweepMark = `UPDATE {queue} SET
  idle_since = IF(` + queueBusy + `, NULL, UTC_TIMESTAMP(6)),
  idle_fence = fence
WHERE name > ? AND name <= ? AND ` + queueMarkable
)

// Conditions of the sweep statements, spliced into them. lockReady and
// queueReady take the age (microseconds) as their one argument and check
// the cheap columns first: MariaDB evaluates them in order and stops at the
// first false one, so the subqueries run only for rows that are otherwise
// ready.
//
// A row of the queued locks (kind 1, see "One name, one kind"), or of an
// Election or a Semaphore (kinds 4 and 5, whose queue rows and tickets are
// under their queue keys, queueKeySQL), is free only when its name has no queue row and no ticket: its queue row goes
// first (the queue table's sweep, the age after that row was found
// free), then the next pass marks the lock row, and a pass the age later
// deletes it, unless a queue row was created meanwhile (qQueueBind adds one
// to the fence, which voids the mark). So the delete's check of the queue
// and ticket tables, whose subqueries take shared locks, meets no row in
// use but in a race with such a creation.
const (
	lockFree = `(waiter <= 0 OR claimed_until < UTC_TIMESTAMP(6))
  AND (holder = 0 OR NOT EXISTS (SELECT 1 FROM {lease} l
                                 WHERE l.id = {lock}.holder AND l.expires_at > UTC_TIMESTAMP(6)))
  AND (kind = 0 OR NOT (EXISTS (SELECT 1 FROM {queue} kq WHERE kq.name = ` + queueKeySQL + `)
                        OR EXISTS (SELECT 1 FROM {ticket} kt WHERE kt.name = ` + queueKeySQL + `)))`
	lockReady = `(idle_fence = fence AND idle_since <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND ` + lockFree + `)`
	lockMarkable = `((idle_since IS NULL OR idle_fence <> fence) AND ` + lockFree + `)`

	queueBusy = `(EXISTS (SELECT 1 FROM {ticket} t WHERE t.name = {queue}.name)
  OR (holder <> 0 AND ` + slotHeldQueue + `))`
	queueReady = `(idle_fence = fence AND idle_since <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND NOT ` + queueBusy + `)`
	queueMarkable = `IF(` + queueBusy + `, idle_since IS NOT NULL, idle_since IS NULL OR idle_fence <> fence)`
)

// markerBase is added to a ticket's number to make the key of a waiter's
// marker behind it (qTicketWant): above every ticket number (they start
// at qFenceSeed, about 2^51 today, and grow by one per ticket).
const (
	markerBase    = 1 << 62
	markerBaseSQL = "4611686018427387904"

	// bellNameSQL and bellNextNameSQL name the doorbell of the session of
	// lease row l (see doorbell.go): its published generation, and the
	// next one (held between a ring and its publication).
	bellNameSQL     = "CONCAT('dsync:', LOWER(HEX(l.id)), ':', LOWER(HEX(l.bell)))"
	bellNextNameSQL = "CONCAT('dsync:', LOWER(HEX(l.id)), ':', LOWER(HEX(l.bell + 1)))"
)

// notAtHead is qTicketTake's answer for a ticket with live tickets ahead.
// Fences and ticket numbers start at qFenceSeed (about 2^51 today) and grow
// by one per acquisition, so they never reach it.
const (
	notAtHead    = 1 << 62
	notAtHeadSQL = "4611686018427387904"
)

// noWaitSQL makes a statement that does not wait for row locks: a lock
// wait timeout (1205) at once when a row it must lock is locked. The lock
// rows that a caller's transaction holds (Mutex.LockTx) stay locked until
// it ends, so TryLock (which must not wait) and the sweep (whose batch
// statements must not hold other names' rows while they wait) use these
// variants of their lock table statements. It is MariaDB's syntax; where
// the server refuses it (1064, MySQL), the session uses the plain
// statements (see Session.noWait).
const noWaitSQL = `SET STATEMENT innodb_lock_wait_timeout = 0 FOR `

// briefWaitSQL makes a statement wait at most a second for a row lock: a
// waiter woken by a doorbell rung inside the release (qLockReleaseRing)
// meets the row still locked by that release until it commits, which
// takes a moment; a row held by a transaction (LockTx) costs it a second.
// Where the server refuses the syntax, the plain statement runs, as with
// noWaitSQL.
const briefWaitSQL = `SET STATEMENT innodb_lock_wait_timeout = 1 FOR `

// stmtIndex names the statements prepared on every session connection.
type stmtIndex int

const (
	sLeaseRenew stmtIndex = iota
	sLockAcquireFast
	sLockAcquire
	sLockRelease
	sLockClaim
	sLockUnclaim
	sTicketInsert
	sTicketInsertAlone
	sTicketInsertBell
	sTicketBellLetGo
	sTicketNumber
	sTicketAdd
	sTicketTake
	sTicketDelete
	sTicketConflicts
	sLeaseInsert
	sLeaseDelete
	sQueueCreate
	sLeasePurge
	sTicketPurge
	sTicketsOrphaned
	sLockWant
	sLockBell
	sLeaseBell
	sBellTake
	sBellRing
	sBellWait
	sTicketRelease
	sTicketAhead
	sTicketWant
	sQueueTake
	sQueueRelease
	sSweepElect
	sSweepHold
	sSweepFloor
	sSweepFloorRead
	sLockBatchEnd
	sLockSweepRead
	sLockSweepDelete
	sLockSweepMark
	sQueueBatchEnd
	sQueueSweepRead
	sQueueSweepDelete
	sQueueSweepMark
	sLockAcquireFastNoWait
	sLockAcquireNoWait
	sLockSweepDeleteNoWait
	sLockSweepMarkNoWait
	sLockWantNoWait
	sLockClaimNoWait
	sLockUnclaimNoWait
	sLockReleaseNoWait
	sLockReleaseRing
	sLockReleaseRingBrief
	sLockAcquireFastBrief
	sTxLockCreate
	sTxLockIdle
	sTxLockSweepDelete
	sTxLockSweepDeleteNoWait
	sTxHoldEnd
	sTxHoldEndNoWait
	sTxHoldPending
	sLockKind
	sQueueBind
	sQueueBindNoWait
	sLeaseLive
	sTicketGranted
	sQueueReleaseRing
	sTicketReleaseRing
	sTicketTakeWoken
	sTicketConflictsWoken
	sSemInsert
	sSemNumber
	sSemTake
	sSemTakeWoken
	sSemShrink
	sSemAhead
	sLeaderRecord
	sLeaderProclaim
	sLeaderRead
	sLeaderDelete
	sLeadersEnded
	sLeaderPurge
	numStmts
)

// queries holds the statements of one table prefix.
type queries struct {
	tables   [7]string        // schema, lease, lock, queue, ticket, txlock and leader table names, unquoted
	creates  [7]string        // their CREATE TABLE statements, in the same order
	record   string           // qSchemaRecord
	version  string           // qSchemaVersion
	upgrade5 string           // qUpgradeFrom5
	upgrade6 string           // qUpgradeFrom6
	prepared [numStmts]string // indexed by stmtIndex
}

func newQueries(prefix string) *queries {
	r := strings.NewReplacer("{lease}", "`"+prefix+"lease`", "{lock}", "`"+prefix+"lock`",
		"{queue}", "`"+prefix+"queue`", "{ticket}", "`"+prefix+"ticket`", "{schema}", "`"+prefix+"schema`",
		"{txlock}", "`"+prefix+"txlock`", "{leader}", "`"+prefix+"leader`")
	q := &queries{
		tables: [7]string{prefix + "schema", prefix + "lease", prefix + "lock", prefix + "queue", prefix + "ticket",
			prefix + "txlock", prefix + "leader"},
		creates: [7]string{r.Replace(qCreateSchema), r.Replace(qCreateLease), r.Replace(qCreateLock),
			r.Replace(qCreateQueue), r.Replace(qCreateTicket), r.Replace(qCreateTxLock), r.Replace(qCreateLeader)},
		record:   r.Replace(qSchemaRecord),
		version:  r.Replace(qSchemaVersion),
		upgrade5: r.Replace(qUpgradeFrom5),
		upgrade6: r.Replace(qUpgradeFrom6),
	}
	q.prepared[sLeaseRenew] = r.Replace(qLeaseRenew)
	q.prepared[sLockAcquireFast] = r.Replace(qLockAcquireFast)
	q.prepared[sLockAcquire] = r.Replace(qLockAcquire)
	q.prepared[sLockRelease] = r.Replace(qLockRelease)
	q.prepared[sLockClaim] = r.Replace(qLockClaim)
	q.prepared[sLockUnclaim] = r.Replace(qLockUnclaim)
	q.prepared[sTicketInsert] = r.Replace(qTicketInsert)
	q.prepared[sTicketInsertAlone] = r.Replace(qTicketInsertAlone)
	q.prepared[sTicketInsertBell] = r.Replace(qTicketInsertBell)
	q.prepared[sTicketBellLetGo] = r.Replace(qTicketBellLetGo)
	q.prepared[sTicketNumber] = r.Replace(qTicketNumber)
	q.prepared[sTicketAdd] = r.Replace(qTicketAdd)
	q.prepared[sTicketTake] = r.Replace(qTicketTake)
	q.prepared[sTicketDelete] = r.Replace(qTicketDelete)
	q.prepared[sTicketConflicts] = r.Replace(qTicketConflicts)
	q.prepared[sLeaseInsert] = r.Replace(qLeaseInsert)
	q.prepared[sLeaseDelete] = r.Replace(qLeaseDelete)
	q.prepared[sQueueCreate] = r.Replace(qQueueCreate)
	q.prepared[sLeasePurge] = r.Replace(qLeasePurge)
	q.prepared[sTicketPurge] = r.Replace(qTicketPurge)
	q.prepared[sTicketsOrphaned] = r.Replace(qTicketsOrphaned)
	q.prepared[sLockWant] = r.Replace(qLockWant)
	q.prepared[sLockBell] = r.Replace(qLockBell)
	q.prepared[sLeaseBell] = r.Replace(qLeaseBell)
	q.prepared[sBellTake] = qBellTake
	q.prepared[sBellRing] = qBellRing
	q.prepared[sBellWait] = qBellWait
	q.prepared[sTicketRelease] = r.Replace(qTicketRelease)
	q.prepared[sTicketAhead] = r.Replace(qTicketAhead)
	q.prepared[sTicketWant] = r.Replace(qTicketWant)
	q.prepared[sQueueTake] = r.Replace(qQueueTake)
	q.prepared[sQueueRelease] = r.Replace(qQueueRelease)
	q.prepared[sSweepElect] = r.Replace(qSweepElect)
	q.prepared[sSweepHold] = r.Replace(qSweepHold)
	q.prepared[sSweepFloor] = r.Replace(qSweepFloor)
	q.prepared[sSweepFloorRead] = r.Replace(qSweepFloorRead)
	q.prepared[sLockBatchEnd] = r.Replace(qLockBatchEnd)
	q.prepared[sLockSweepRead] = r.Replace(qLockSweepRead)
	q.prepared[sLockSweepDelete] = r.Replace(qLockSweepDelete)
	q.prepared[sLockSweepMark] = r.Replace(qLockSweepMark)
	q.prepared[sQueueBatchEnd] = r.Replace(qQueueBatchEnd)
	q.prepared[sQueueSweepRead] = r.Replace(qQueueSweepRead)
	q.prepared[sQueueSweepDelete] = r.Replace(qQueueSweepDelete)
	q.prepared[sQueueSweepMark] = r.Replace(qQueueSweepMark)
	q.prepared[sLockAcquireFastNoWait] = noWaitSQL + r.Replace(qLockAcquireFast)
	q.prepared[sLockAcquireNoWait] = noWaitSQL + r.Replace(qLockAcquire)
	q.prepared[sLockSweepDeleteNoWait] = noWaitSQL + r.Replace(qLockSweepDelete)
	q.prepared[sLockSweepMarkNoWait] = noWaitSQL + r.Replace(qLockSweepMark)
	q.prepared[sLockWantNoWait] = noWaitSQL + r.Replace(qLockWant)
	q.prepared[sLockClaimNoWait] = noWaitSQL + r.Replace(qLockClaim)
	q.prepared[sLockUnclaimNoWait] = noWaitSQL + r.Replace(qLockUnclaim)
	q.prepared[sLockReleaseNoWait] = noWaitSQL + r.Replace(qLockRelease)
	q.prepared[sLockReleaseRing] = r.Replace(qLockReleaseRing)
	q.prepared[sLockReleaseRingBrief] = briefWaitSQL + r.Replace(qLockReleaseRing)
	q.prepared[sLockAcquireFastBrief] = briefWaitSQL + r.Replace(qLockAcquireFast)
	q.prepared[sTxLockCreate] = r.Replace(qTxLockCreate)
	q.prepared[sTxLockIdle] = r.Replace(qTxLockIdle)
	q.prepared[sTxLockSweepDelete] = r.Replace(qTxLockSweepDelete)
	q.prepared[sTxLockSweepDeleteNoWait] = noWaitSQL + r.Replace(qTxLockSweepDelete)
	q.prepared[sTxHoldEnd] = r.Replace(qTxHoldEnd)
	q.prepared[sTxHoldEndNoWait] = noWaitSQL + r.Replace(qTxHoldEnd)
	q.prepared[sTxHoldPending] = r.Replace(qTxHoldPending)
	q.prepared[sLockKind] = r.Replace(qLockKind)
	q.prepared[sQueueBind] = r.Replace(qQueueBind)
	q.prepared[sQueueBindNoWait] = noWaitSQL + r.Replace(qQueueBind)
	q.prepared[sLeaseLive] = r.Replace(qLeaseLive)
	q.prepared[sTicketGranted] = r.Replace(qTicketGranted)
	q.prepared[sQueueReleaseRing] = r.Replace(qQueueReleaseRing)
	q.prepared[sTicketReleaseRing] = r.Replace(qTicketReleaseRing)
	q.prepared[sTicketTakeWoken] = r.Replace(qTicketTakeWoken)
	q.prepared[sTicketConflictsWoken] = r.Replace(qTicketConflictsWoken)
	q.prepared[sSemInsert] = r.Replace(qSemInsert)
	q.prepared[sSemNumber] = r.Replace(qSemNumber)
	q.prepared[sSemTake] = r.Replace(qSemTake)
	q.prepared[sSemTakeWoken] = r.Replace(qSemTakeWoken)
	q.prepared[sSemShrink] = r.Replace(qSemShrink)
	q.prepared[sSemAhead] = r.Replace(qSemAhead)
	q.prepared[sLeaderRecord] = r.Replace(qLeaderRecord)
	q.prepared[sLeaderProclaim] = r.Replace(qLeaderProclaim)
	q.prepared[sLeaderRead] = r.Replace(qLeaderRead)
	q.prepared[sLeaderDelete] = r.Replace(qLeaderDelete)
	q.prepared[sLeadersEnded] = r.Replace(qLeadersEnded)
	q.prepared[sLeaderPurge] = r.Replace(qLeaderPurge)
	return q
}

// txQueries are the statements LockTx runs in the caller's transaction,
// with the session's table names qualified by its database (the schema
// its connections use), so that they mean the same whatever database the
// transaction's connection has selected.
type txQueries struct {
	lock, lockNoWait, hold string
	held                   string // qTxHeld
	rollbackOnTimeout      bool   // as read when they were made (see qTxSession)
	// anyServer: the server has no @@in_transaction, and hold is
	// qTxHoldAnyServer, which LockTx follows with a read of the committed
	// row (qTxHoldPending).
	anyServer bool
}

func newTxQueries(database, prefix string, anyServer bool) *txQueries {
	db := "`" + strings.ReplaceAll(database, "`", "``") + "`."
	r := strings.NewReplacer("{lock}", db+"`"+prefix+"lock`", "{txlock}", db+"`"+prefix+"txlock`")
	hold := qTxHold
	if anyServer {
		hold = qTxHoldAnyServer
	}
	return &txQueries{lock: r.Replace(qTxLock), lockNoWait: r.Replace(qTxLockNoWait), hold: r.Replace(hold),
		held: r.Replace(qTxHeld), anyServer: anyServer}
}

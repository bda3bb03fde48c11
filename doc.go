// Package dsync provides the locks of package sync — [Mutex], [RWMutex] and
// a first-come-first-served [FairMutex] — shared by every process that
// reaches one MySQL-compatible database (tested on MariaDB 10.11 and
// Galera 4; MariaDB 10.6+ and MySQL 5.7/8 expected, untested: see the
// servers table in docs/OPERATIONS.md), and on the same locks a leader
// [Election].
//
// A [Session] holds a lease row that a background goroutine renews every
// TTL/3 (at most 2s apart); every lock taken through the session lives exactly as long as that
// lease. The lease ends on the database's own clock, in UTC, so neither clock
// skew between clients nor any time zone or daylight saving change breaks
// mutual exclusion, and a process that dies frees its locks at most one TTL
// later. A session that cannot renew in time learns it
// first: [Session.Done] closes before the database would let anyone else
// take its locks.
//
// Lock blocks until the lock is free, honours ctx, and hands out a fencing token ([Mutex.Fence]) that is
// strictly greater for every acquisition of a name. Ownership travels in the
// context ([WithOwner]): a lock taken with an owner is reentrant for it and
// only it may unlock. Goroutines of one process contend on an in-process
// mutex first, so only one of them at a time talks to the database.
//
// # Waiting
//
// A waiter in another process does not poll: it blocks on the holder's
// doorbell (GET_LOCK on a connection the holder's session keeps), which a
// release rings when someone waits, and then tries the row again. The row
// stays the only source of truth; a doorbell is only a hint, so a lost one
// costs time, never correctness. A Mutex waiter of another process also
// claims the next hold; FairMutex and RWMutex serve tickets in order.
// Where doorbells are not available (a Galera cluster; a *sql.DB limited
// to fewer than 8 connections) waiters poll with the back-off of
// [WithBackOff], within a budget of about 20 statements a second per
// waiter, keep-alives included. How
// waiting, claims, fairness and [Mutex.LockTx] work is in [docs/DESIGN.md].
//
// Errors are the sentinels of this package, wrapped with context: test them
// with [errors.Is]. Misuse, such as unlocking a lock that is not held, is an
// error, never a panic.
//
// # Tables
//
// NewSession creates, when they are missing, seven tables (names with the
// prefix of [WithTablePrefix], default "dsync_"): schema, lease, lock,
// queue, ticket, txlock and leader (the values of [Election] leaders; a
// version of the tables without it gets it added, no other change). Rows of lock and queue that have been free for
// an hour ([WithFreeRowAge]) are deleted in the background, and fences
// never go back. See queries.go for every statement dsync sends, [Session]
// for the connections dsync keeps, and [docs/OPERATIONS.md] for the tables, the
// clean-up, connections, clusters and the dsync command.
//
// A name is one lock. FairMutex and RWMutex share their names: a FairMutex
// is the write side of the RWMutex of the same name. A name is bound to
// the kind that used it first, Mutex, the queued locks or Election, and
// the other kinds get [ErrOtherKind] (never two of them hold it), until
// the clean-up has deleted the name's idle rows.
//
// # Operators
//
// [Schema] returns the statements that create the tables, [ListLocks] and
// [LockHolders] list the holds of live sessions, and [ForceRelease] frees
// a stuck Mutex. The dsync command (cmd/dsync) is built on them: it runs a
// command while holding a lock, and lists and frees locks from a shell.
//
// # Statistics
//
// [Session.Stats] counts a session's holds, waiters, acquisitions, waits,
// renewals and orphans without a database call; publish it with expvar or
// any metrics library (see the example of Session.Stats).
//
// # Logging
//
// A session logs to the [log/slog] logger of [WithLogger] (by default
// nowhere). Every record has the attribute session, the lease id
// ([Session.ID]); the others use these keys, each always with the same
// meaning and type:
//
//	lock         string         the lock name
//	kind         string         the kind of lock: "mutex" (Mutex), "queue" (FairMutex, RWMutex) or "election" (Election); a name is one kind's
//	op           string         the call: "lock" (Lock of any kind), "rlock" (RLock), "locktx" (LockTx) or "campaign" (Campaign)
//	err          error          what failed
//	waited       time.Duration  from the call to its return
//	acquired     bool           the call returned holding the lock
//	attempt      int            renewals failed in a row, this one included
//	deadline_in  time.Duration  time left before the session gives up on its lease
//	token        int64          the acquisition token of an orphan (the token column)
//	age          time.Duration  how long ago the orphan was recorded
//	lost         int64          the id of the lost lease that a new one replaced (WithReplaceLostLease)
//	retry_in     time.Duration  when the next try to open a new lease is due
//
// The records:
//
//	WARN  "dsync: waited long for a lock"            lock kind op waited acquired [err]
//	WARN  "dsync: lease renewal failed; retrying"    err attempt deadline_in
//	ERROR "dsync: session lost; its locks may belong to others now"  err
//	WARN  "dsync: opening a new lease failed; retrying"  err retry_in
//	INFO  "dsync: lost lease replaced"               lost
//	INFO  "dsync: orphan freed"                      lock kind token age
//	DEBUG "dsync: orphan not found; given up"        lock kind token age
//	DEBUG "dsync: acquire failed; retrying"          lock kind err
//	DEBUG "dsync: claim failed", "dsync: unclaim failed"  lock kind err
//	DEBUG "dsync: purge failed"                      err
//	INFO  "dsync: the server refuses GET_LOCK; waiters poll"  err
//	DEBUG "dsync: doorbell failed", "dsync: doorbell ring failed"  err
//	DEBUG "dsync: wait for doorbell failed"          lock kind err
//	INFO  "dsync: the server refuses SET STATEMENT; TryLock reads the lock row first"  err
//	DEBUG "dsync: waiting for a transaction's hold to end failed; retrying"  lock kind err
//
// A Lock or RLock that waited (see [Stats]) at least the session's TTL is
// logged when it returns, with the lock or without it (err). A renewal
// that failed is retried until the session gives up on its lease: then
// the session is lost; with [WithReplaceLostLease], the records of the new
// lease that replaces it carry its own id. An orphan is a lock row or ticket that the session
// frees in the background (see [Mutex.Unlock]); it is logged when freed,
// or when it was not found for a minute (another statement freed it, or
// the acquisition it was recorded for never landed).
//
// [docs/DESIGN.md]: https://github.com/dsynclock/dsync/blob/main/docs/DESIGN.md
// [docs/OPERATIONS.md]: https://github.com/dsynclock/dsync/blob/main/docs/OPERATIONS.md
package dsync

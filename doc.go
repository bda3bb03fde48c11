// Package dsync provides the locks of package sync — [Mutex], [RWMutex] and
// a first-come-first-served [FairMutex] — shared by every process that
// reaches one MySQL-compatible database (MySQL 5.7/8, MariaDB 10.6+).
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
// Lock blocks (polling with jittered exponential back-off) until the lock is
// free, honours ctx, and hands out a fencing token ([Mutex.Fence]) that is
// strictly greater for every acquisition of a name. Ownership travels in the
// context ([WithOwner]): a lock taken with an owner is reentrant for it and
// only it may unlock. Goroutines of one process contend on an in-process
// mutex first, so only one of them at a time talks to the database.
//
// Errors are the sentinels of this package, wrapped with context: test them
// with [errors.Is]. Misuse, such as unlocking a lock that is not held, is an
// error, never a panic.
//
// # Tables
//
// NewSession creates, when they are missing, four tables (names with the prefix of
// [WithTablePrefix], default "dsync_"): lease, one row per live session;
// lock, one row per Mutex name ever used; queue, one row per FairMutex or
// RWMutex name ever used; ticket, one row per waiter or holder of those.
// Rows of lock and queue are kept, and a row created anew starts its fences
// at the server's UTC clock in microseconds, so fences never go back. See
// queries.go for every statement dsync sends, and [Session] for the
// connections dsync keeps and the session settings it pins on them.
//
// Mutex has a lock space of its own; FairMutex and RWMutex share another,
// in which a FairMutex is the write side of the RWMutex of the same name.
//
// # Operators
//
// [Schema] returns the statements that create the tables, [ListLocks] and
// [LockHolders] list the holds of live sessions, and [ForceRelease] frees
// a stuck Mutex. The dsync command (cmd/dsync) is built on them: it runs a
// command while holding a lock, and lists and frees locks from a shell.
package dsync

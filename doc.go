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
// NewSession creates, when they are missing, five tables (names with the
// prefix of [WithTablePrefix], default "dsync_"): schema, the version of the
// tables and the state of their clean-up; lease, one row per live session;
// lock, one row per Mutex name in use; queue, one row per FairMutex or
// RWMutex name in use; ticket, one row per waiter or holder of those. Rows
// of lock and queue that have been free for an hour ([WithFreeRowAge]) are
// deleted in the background, and a row created anew starts its fences
// above every fence its name had, so fences never go back. See queries.go
// for every statement dsync sends, and [Session] for the connections dsync
// keeps and the session settings it pins on them.
//
// Mutex has a lock space of its own; FairMutex and RWMutex share another,
// in which a FairMutex is the write side of the RWMutex of the same name.
package dsync

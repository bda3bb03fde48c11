package dsync

import "github.com/cenkalti/backoff/v4"

// Acquiring returns how many goroutines of s are acquiring a lock on the
// database right now (as opposed to waiting in the local layer).
func Acquiring(s *Session) int64 { return s.acquiring.Load() }

// NewBackOff returns a new polling policy from s's back-off factory: the
// default one (defaultBackOff) unless the session was made WithBackOff.
func NewBackOff(s *Session) backoff.BackOff { return s.opts.newBackOff() }

// ExpireLocally moves s's local renewal deadline to its origin, that is into
// the past, without touching the keep-alive goroutine: what a process sees
// after a pause (SIGSTOP, a VM pause) longer than its lease.
func ExpireLocally(s *Session) { s.deadline.Store(0) }

package dsync

// Acquiring returns how many goroutines of s are acquiring a lock on the
// database right now (as opposed to waiting in the local layer).
func Acquiring(s *Session) int64 { return s.acquiring.Load() }

// Package torture is dsync's linearizability checker with a nemesis, in the
// manner of Jepsen: client processes run random lock operations through
// dsync's public API while a nemesis injects faults (paused and killed
// clients, killed connections, a slow, dark or lossy network, a killed
// database server); every operation's invocation and completion is
// recorded in a history, and porcupine decides whether some order of the
// operations is legal for a model of each lock, of the election and of
// the semaphore.
//
// All of its code is in test files, so that porcupine stays a test-only
// dependency: go test runs a short seeded run (skipped under -short), and
// make torture a long one (DURATION, SEED); make torture-galera runs it on
// a throwaway 3-node Galera cluster (build tag galera), with node faults. The models, the events and
// what the FairMutex order, Observe and Semaphore line checks promise are described in
// docs/VERIFICATION.md.
package torture

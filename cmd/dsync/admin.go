package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/dsynclock/dsync"
)

// lockJSON is one element of the array that ls --json prints.
type lockJSON struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`              // mutex, write (FairMutex or RWMutex writer), read, leader (Election), semaphore
	Holder  string `json:"holder"`            // the holder's label
	Session int64  `json:"session"`           // the holder's lease id
	Fence   int64  `json:"fence"`             // 0 for read
	HeldMS  int64  `json:"held_ms"`           // the hold's age (see lsColumns)
	Waiters int    `json:"waiters"`           // see lsColumns: for mutex, 1 means at least 1
	Permits int64  `json:"permits,omitempty"` // semaphore: the permits of the acquisition
}

// lsColumns is what dsync ls --help adds to lsUsage: what each column
// means for each kind of lock.
const lsColumns = `Lists the holds of live sessions, one row per hold, sorted by name; the
sessions that wait are counted (WAITERS), not listed. --json prints one
JSON array: name, kind, holder, session, fence, held_ms (HELD in
milliseconds), waiters, and for a semaphore permits.
Columns:
  NAME     the lock's name
  KIND     mutex: a Mutex (dsync run without --fair/--read/--write), also a
           Mutex.LockTx hold; write: a FairMutex or an RWMutex writer;
           read: an RWMutex reader, one row per reading session;
           leader: an Election's leader (FENCE its term);
           semaphore(N): a Semaphore's acquisition of N permits, one row
           per acquisition (FENCE 0: the tables keep no fence of it)
  HOLDER   the label of the holder's session (--label; default host:pid)
  SESSION  the holder's lease id (DSYNC_SESSION of dsync run's command)
  FENCE    the hold's fencing token (DSYNC_FENCE); 0 for read
  HELD     how long the lock has been held, on the database's clock: since
           the statement that took it. A LockTx hold counts from that take
           (right before the caller's transaction gets the lock) and lasts
           until the transaction ends. For write, read and semaphore, a
           waiter whose turn has come but who has not seen it yet (a poll
           or a doorbell away: milliseconds) is listed as the holder, its
           HELD counted from when it began to wait (or, for write, from
           when the write hold before it began, if that is later); so is
           a read or semaphore hold that waited, for the moment after its
           call returned until its record of the start lands.
  WAITERS  the sessions that wait for the lock, as far as the database
           records them:
           write, read, leader, semaphore: exact. Every session in line
             for the name, whichever side it waits for (a session's
             goroutines wait in one place); each holder of the name shows
             the same count.
           mutex: 1+ when a waiter has claimed the next hold, else 0. The
             tables record that one waiter only: the others block on the
             holder's doorbell (a GET_LOCK), which no table shows, and the
             server's process list does not say which lock such a wait is
             for. A waiter on a doorbell claims at once; one that polls
             (where there is no doorbell, e.g. on Galera) once it has
             waited 100ms (10ms on Galera). In --json, waiters is then 1.
`

// cmdLs lists the locks held now: dsync ls [--dsn DSN] [--prefix P] [--json].
func cmdLs(args []string) int {
	fs := newFlags("ls")
	var d dbFlags
	d.register(fs)
	asJSON := fs.Bool("json", false, "")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("ls: unexpected argument %q", fs.Arg(0)))
	}
	if msg := d.check(); msg != "" {
		return usageError(msg)
	}
	return withDB(&d, func(ctx context.Context, db *sql.DB) (int, error) {
		locks, err := dsync.ListLocks(ctx, db, d.prefix)
		if err != nil {
			return 0, err
		}
		if *asJSON {
			return exitOK, printJSON(locks)
		}
		return exitOK, printTable(locks)
	})
}

// printJSON prints locks as one JSON array.
func printJSON(locks []dsync.LockInfo) error {
	out := make([]lockJSON, 0, len(locks))
	for _, l := range locks {
		out = append(out, lockJSON{
			Name: l.Name, Kind: string(l.Kind), Holder: l.Holder, Session: l.Session,
			Fence: l.Fence, HeldMS: l.Held.Milliseconds(), Waiters: l.Waiters, Permits: l.Permits,
		})
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// printTable prints locks as an aligned table with a header.
func printTable(locks []dsync.LockInfo) error {
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tKIND\tHOLDER\tSESSION\tFENCE\tHELD\tWAITERS")
	for _, l := range locks {
		kind := string(l.Kind)
		if l.Kind == dsync.KindSemaphore {
			kind = fmt.Sprintf("%s(%d)", kind, l.Permits)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", cell(l.Name), kind, cell(l.Holder),
			l.Session, l.Fence, roughly(l.Held), waiters(l))
	}
	return w.Flush()
}

// waiters returns the WAITERS cell of l: the count, with a + for a Mutex
// that has one, since more may wait than the database records.
func waiters(l dsync.LockInfo) string {
	n := strconv.Itoa(l.Waiters)
	if l.Kind == dsync.KindMutex && l.Waiters > 0 {
		n += "+"
	}
	return n
}

// cell returns s as a table cell: as it is when it is printable without
// spaces, else quoted, so that every row keeps its columns.
func cell(s string) string {
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// roughly returns d to a tenth of a second, for people.
func roughly(d time.Duration) string {
	return d.Round(100 * time.Millisecond).String()
}

// cmdSchema prints the statements that create the tables:
// dsync schema [--prefix P].
func cmdSchema(args []string) int {
	fs := newFlags("schema")
	prefix := fs.String("prefix", "dsync_", "")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("schema: unexpected argument %q", fs.Arg(0)))
	}
	stmts, err := dsync.Schema(*prefix)
	if err != nil {
		return usageError(err.Error())
	}
	fmt.Fprintf(stdout, "-- dsync's tables for the table prefix %q, as NewSession creates them.\n", *prefix)
	for _, s := range stmts {
		fmt.Fprintf(stdout, "\n%s;\n", s)
	}
	return exitOK
}

// cmdRelease frees a Mutex that a live session holds:
// dsync release --force [--dsn DSN] [--prefix P] NAME.
func cmdRelease(args []string) int {
	fs := newFlags("release")
	var d dbFlags
	d.register(fs)
	force := fs.Bool("force", false, "")
	if code := parseFlags(fs, args); code >= 0 {
		return code
	}
	switch {
	case fs.NArg() == 0:
		return usageError("release: no lock name")
	case fs.NArg() > 1:
		return usageError(fmt.Sprintf("release: unexpected argument %q after the lock name (flags go before it)", fs.Arg(1)))
	case !*force:
		return usageError("release needs --force: it frees a lock that a live session holds, without telling that session")
	}
	if msg := d.check(); msg != "" {
		return usageError(msg)
	}
	name := fs.Arg(0)
	return withDB(&d, func(ctx context.Context, db *sql.DB) (int, error) {
		holders, err := dsync.LockHolders(ctx, db, d.prefix, name)
		if err != nil {
			return 0, err
		}
		freed, err := dsync.ForceRelease(ctx, db, d.prefix, name)
		if errors.Is(err, dsync.ErrOtherKind) {
			// A Semaphore's or an Election's name: nothing it can free.
			fmt.Fprintf(stderr, "%v; nothing done\n", err)
			return exitFailure, nil
		}
		if err != nil {
			return 0, err
		}
		if !freed {
			fmt.Fprintf(stderr, "dsync: the Mutex %q is not held by a live session; nothing done\n", name)
			return exitFailure, nil
		}
		who := ""
		for _, h := range holders {
			if h.Kind == dsync.KindMutex {
				who = fmt.Sprintf(" (it was held by %s, session %d, fence %d)", h.Holder, h.Session, h.Fence)
			}
		}
		fmt.Fprintf(stderr, "dsync: released the Mutex %q%s; its holder is not told\n", name, who)
		return exitOK, nil
	})
}

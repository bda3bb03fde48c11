package main

import (
	"context"
	"database/sql"
	"encoding/json"
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
	Kind    string `json:"kind"`    // mutex, write (FairMutex or RWMutex writer), read
	Holder  string `json:"holder"`  // the holder's label
	Session int64  `json:"session"` // the holder's lease id
	Fence   int64  `json:"fence"`   // 0 for read
	HeldMS  int64  `json:"held_ms"` // upper bound: the age of the holder's lease
	Waiters int    `json:"waiters"`
}

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
			Fence: l.Fence, HeldMS: l.Held.Milliseconds(), Waiters: l.Waiters,
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%d\n", cell(l.Name), l.Kind, cell(l.Holder),
			l.Session, l.Fence, roughly(l.Held), l.Waiters)
	}
	return w.Flush()
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

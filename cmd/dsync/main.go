// Command dsync runs a command while holding a dsync lock, and lets
// operators see and override the locks of a database.
//
//	dsync run [flags] NAME -- COMMAND [ARG...]   run COMMAND while holding the lock NAME
//	dsync elect [flags] NAME -- COMMAND [ARG...] run COMMAND while leading the election NAME
//	dsync elect --observe [--json] NAME          print each leader of the election NAME
//	dsync ls [--dsn DSN] [--prefix P] [--json]   locks held and waited for now
//	dsync schema [--prefix P]                    the CREATE TABLE statements
//	dsync release --force [--dsn DSN] [--prefix P] NAME   free a Mutex held by a live session
//	dsync --version                              the version of the dsync module
//
// Install it with
//
//	go install github.com/dsynclock/dsync/cmd/dsync@latest
//
// docs/OPERATIONS.md, section "The dsync command", describes the flags, the exit
// statuses, the environment of the command, and how signals and terminals
// are handled. Flags take one or two dashes (-ttl or --ttl) and go before
// the lock name.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
)

// erNoSuchTable is MySQL's ER_NO_SUCH_TABLE (the library names its error
// numbers in mysqlerr.go, unexported).
const erNoSuchTable = 1146

// Exit statuses (besides the command's own, and 128+N for a signal N).
// The numbers of 64 and up are those of BSD's sysexits.h.
const (
	exitOK          = 0
	exitFailure     = 1   // release: no live session held the lock
	exitUsage       = 64  // EX_USAGE: bad flags or arguments, or no DSN
	exitUnavailable = 69  // EX_UNAVAILABLE: the database could not be used (before the command started)
	exitLeaseLost   = 70  // EX_SOFTWARE: the lease was lost while the command ran
	exitNotObtained = 75  // EX_TEMPFAIL: the lock was not obtained (--nonblock, or --wait elapsed)
	exitOtherKind   = 78  // EX_CONFIG: another kind of lock uses the name (a Mutex, or --fair/--read/--write)
	exitCannotRun   = 126 // the command was found but could not be started (as in sh)
	exitNotFound    = 127 // the command was not found (as in sh)
	exitSignal      = 128 // plus the signal's number
)

// envDSN names the environment variable of the default DSN.
const envDSN = "DSYNC_DSN"

// defaultConnectTimeout bounds the setup: connecting, and for ls and
// release the whole command.
const defaultConnectTimeout = 10 * time.Second

// The usage, per command; dsync --help prints them all.
const (
	runUsage = `dsync run [flags] NAME -- COMMAND [ARG...]   run COMMAND while holding the lock NAME
      --dsn DSN        database (default: $DSYNC_DSN; go-sql-driver DSN syntax)
      --ttl D          lease TTL (default 15s)
      --prefix P       table prefix (default dsync_)
  -w, --wait D         give up after waiting D: seconds (5, 0.5) or a duration
                       (5s, 1m); default: wait forever; --wait 0 is --nonblock
  -n, --nonblock       fail at once if the lock is taken
  -E, --conflict-exit-code N
                       exit status when the lock is not obtained (default 75)
  -q, --quiet          no "waiting for NAME" line on stderr
      --fair | --read | --write | --limit N
                       FairMutex; RWMutex read side; RWMutex write side; one of the
                       N permits of a Semaphore: at most N commands run at once
                       (default: Mutex)
      --grace D        when renewals fail and the lease ends in D: SIGTERM to the
                       command's process group, SIGKILL D later, as the lease ends;
                       the group is dead and reaped before the database can give the
                       lock to another (at most TTL/4; default TTL/4, at most 10s)
      --label L        holder label (default host:pid)
      --connect-timeout D
                       give up connecting after D (default 10s)
  run holds the lock until COMMAND has exited and, on Linux, every process it
  left in its process group has ended (processes that left the group, with
  setsid or as daemons, are not waited for); meanwhile signals to dsync, and
  the terminal's keys, go to the group. While it waits, it says once on
  stderr for which lock and who holds it (-q: not).
  Exit status: the command's; 128+N when it died of signal N; 75 (or -E's)
  lock not obtained; 78 the name is used by another kind of lock (--fair,
  --read and --write against none of them), or --limit differs from the
  name's; 70 the hold was lost while the
  command ran: the lease lost or at risk, or the Mutex released by force
  (dsync release --force, seen within about 2 × TTL/3): dsync stopped the
  command (unless it had ended); 69 database unusable; 64 usage.
`
	electUsage = `dsync elect [flags] NAME -- COMMAND [ARG...] run COMMAND while leading the election NAME
      --value V        the leader's value (default: --label, else host:pid)
      the flags of dsync run but --fair, --read and --write, with its rules:
      elect campaigns (in arrival order), runs COMMAND once it leads, with
      DSYNC_TERM (and DSYNC_FENCE) set to its term, stops COMMAND before the
      lease can end, and resigns when COMMAND and its process group have
      ended; -n: fail at once unless nobody leads or campaigns.
      Exit status: as dsync run's.
dsync elect --observe [--json] [--dsn DSN] [--prefix P] NAME
                                             print the leader, then each change
      one line per leader or value: term T session S value "V" (--json: an
      object with time, term, session, value); until a signal (exit 128+N).
      Changes that come faster than a read are coalesced; a leader older
      than one printed is never printed after it.
`
	lsUsage = `dsync ls [--dsn DSN] [--prefix P] [--json]   locks held and waited for now
      --connect-timeout D   give up after D (default 10s)
      (dsync ls --help: what each column means)
`
	schemaUsage = `dsync schema [--prefix P]                    the CREATE TABLE statements
`
	releaseUsage = `dsync release --force [--dsn DSN] [--prefix P] NAME
                                             free a Mutex held by a live session
      --connect-timeout D   give up after D (default 10s)
`
	usage = "usage:\n" + runUsage + electUsage + lsUsage + schemaUsage + releaseUsage +
		"dsync --version                              the version of the dsync module\n"
)

// usages maps each command to its usage.
var usages = map[string]string{"run": runUsage, "elect": electUsage, "ls": lsUsage + lsColumns, "schema": schemaUsage, "release": releaseUsage}

var (
	stdout io.Writer = os.Stdout
	stderr io.Writer = os.Stderr
)

func main() {
	os.Exit(dsyncMain(os.Args[1:]))
}

// command is the command of the command line (run, ls, schema,
// release), or "" before it is known: usage errors name it.
var command string

// dsyncMain runs the command line args and returns the exit status.
func dsyncMain(args []string) int {
	if len(args) == 0 {
		return usageError("no command")
	}
	if _, ok := usages[args[0]]; ok {
		command = args[0]
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:])
	case "elect":
		return cmdElect(args[1:])
	case "ls":
		return cmdLs(args[1:])
	case "schema":
		return cmdSchema(args[1:])
	case "release":
		return cmdRelease(args[1:])
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "dsync", version())
		return exitOK
	}
	return usageError(fmt.Sprintf("unknown command %q", args[0]))
}

// version returns the version of the dsync module the binary was built
// from: its module version when installed with go install ...@version,
// else "(devel)" and the revision and time of the checkout it was built in
// (with "+dirty" when that had changes), as far as the build recorded them.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return versionOf(info)
}

// versionOf returns the version of the build that info describes.
func versionOf(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	if v != "(devel)" {
		return v
	}
	var rev, at, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		v += " " + rev + dirty
		if at != "" {
			v += " " + at
		}
	}
	return v
}

// usageError prints msg on stderr, in one line with where to find the
// usage, and returns exitUsage.
func usageError(msg string) int {
	msg = errText(msg)
	if command == "" {
		fmt.Fprintf(stderr, "dsync: %s (see 'dsync --help')\n", msg)
		return exitUsage
	}
	msg = strings.TrimPrefix(msg, command+": ")
	fmt.Fprintf(stderr, "dsync %s: %s (see 'dsync %s --help')\n", command, msg, command)
	return exitUsage
}

// errText returns the text of an error (or message) for dsync's stderr
// lines, which start with "dsync: " themselves: without the "dsync: " of
// the library's errors, at its start and after each ": " (outside double
// quotes, where a lock name may say anything), so that no line repeats
// the prefix.
func errText(text string) string {
	const prefix = "dsync: "
	var b strings.Builder
	quoted, escaped := false, false
	for i := 0; i < len(text); i++ {
		if !quoted && strings.HasPrefix(text[i:], prefix) && (i == 0 || strings.HasSuffix(text[:i], ": ")) {
			i += len(prefix) - 1
			continue
		}
		c := text[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		}
		b.WriteByte(c)
	}
	return b.String()
}

// newFlags returns an empty flag set for command; parse errors and -h are
// reported by parseFlags.
func newFlags(command string) *flag.FlagSet {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseFlags parses args into fs. It returns -1 when the command goes on,
// else the exit status: 0 after -h (the command's usage on stdout),
// exitUsage after a bad flag.
func parseFlags(fs *flag.FlagSet, args []string) int {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, "usage:\n"+usages[fs.Name()])
		return exitOK
	case err != nil:
		return usageError(err.Error())
	}
	return -1
}

// dbFlags are the flags of the commands that use the database.
type dbFlags struct {
	dsn            string
	prefix         string
	connectTimeout time.Duration
}

func (d *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.dsn, "dsn", os.Getenv(envDSN), "")
	fs.StringVar(&d.prefix, "prefix", "dsync_", "")
	fs.DurationVar(&d.connectTimeout, "connect-timeout", defaultConnectTimeout, "")
}

// check returns the usage error of the flags, or "".
func (d *dbFlags) check() string {
	switch {
	case d.dsn == "":
		return "no database: pass --dsn or set " + envDSN
	case d.connectTimeout <= 0:
		return "--connect-timeout must be positive"
	}
	return ""
}

// openDB returns the connection pool of the DSN, or an error when the DSN
// does not parse. It connects to nothing yet.
func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("bad DSN: %w", err)
	}
	// The driver logs some errors on stderr itself, as "[mysql] ...":
	// "closing bad idle connection: EOF" when the server closed an idle
	// connection, before database/sql retries on another one, for one.
	// It returns the errors it does not recover from, and dsync's own
	// messages say what matters: drop its log.
	cfg.Logger = log.New(io.Discard, "", 0)
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("bad DSN: %w", err)
	}
	return sql.OpenDB(c), nil
}

// unavailable reports err as the database being unusable and returns
// exitUnavailable.
func unavailable(err error) int {
	fmt.Fprintf(stderr, "dsync: database unusable: %s\n", errText(err.Error()))
	return exitUnavailable
}

// withDB runs f with the database of d, bounded by d.connectTimeout, and
// returns its exit status; errors of the database give exitUnavailable.
func withDB(d *dbFlags, f func(context.Context, *sql.DB) (int, error)) int {
	db, err := openDB(d.dsn)
	if err != nil {
		return unavailable(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d.connectTimeout)
	defer cancel()
	code, err := f(ctx, db)
	if errors.Is(err, dsync.ErrInvalidName) || errors.Is(err, dsync.ErrInvalidOption) {
		return usageError(err.Error()) // found before anything was sent
	}
	if err != nil {
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == erNoSuchTable {
			err = fmt.Errorf("%w (has no session used prefix %q yet?)", err, d.prefix)
		}
		return unavailable(err)
	}
	return code
}

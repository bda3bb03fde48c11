// Package mariadb starts and stops a throwaway MariaDB server for tests,
// benchmarks and the demo: a fresh data directory under a temporary
// directory, a free loopback port, a root account without a password, and
// nothing outside that directory touched.
//
// For fault tests a server can also run with extra arguments and
// environment, under a fake clock ([Config.FakeTime], or
// [Config.FakeTimeFile] for a clock stepped while it runs), and be killed and
// restarted on the same data directory ([Server.Kill], [Server.Restart]).
// Under a fake clock, libfaketime keeps a semaphore and a shared memory
// object named after the server's pid in /dev/shm while it runs; they are
// removed when the server ends, however it ends.
package mariadb

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

var (
	// ErrNotInstalled is returned by [Start] and [StartWith] when no MariaDB
	// server binary can be found. scripts/mariadb.sh installs one from
	// Debian's packages.
	ErrNotInstalled = errors.New("mariadb: mariadbd or mariadb-install-db not found; run scripts/mariadb.sh install (or set DSYNC_TEST_DSN)")

	// ErrFakeTimeNotInstalled is returned by [StartWith] when
	// [Config.FakeTime] is set and libfaketime cannot be found.
	// scripts/mariadb.sh installs it from Debian's faketime package.
	ErrFakeTimeNotInstalled = errors.New("mariadb: libfaketime not found; run scripts/mariadb.sh install")
)

// fakeTimeLibs are the libfaketime preload libraries, best first: the MT
// variant synchronises libfaketime's own state between threads, and
// mariadbd is multi-threaded.
var fakeTimeLibs = []string{"libfaketimeMT.so.1", "libfaketime.so.1"}

// fakeTimeDirs are the directory patterns searched for fakeTimeLibs.
var fakeTimeDirs = []string{"/usr/lib/*/faketime", "/usr/lib/faketime", "/usr/local/lib/faketime"}

// Config configures a server started by [StartWith]. The zero value starts
// the same server as [Start].
type Config struct {
	// Args are extra mariadbd arguments, placed after the defaults so that
	// they override them, e.g. "--sql-mode=STRICT_ALL_TABLES" or
	// "--default-time-zone=+00:00". They are not passed to
	// mariadb-install-db. Named zones such as "Europe/Berlin" need the
	// mysql.time_zone tables, which a fresh data directory lacks; set TZ in
	// Env instead and keep the default time_zone (SYSTEM).
	Args []string

	// Env is extra environment for mariadbd, as KEY=VALUE entries added to
	// the test process's environment, e.g. "TZ=Europe/Berlin".
	Env []string

	// FakeTime, when non-empty, runs mariadbd under libfaketime with
	// FAKETIME set to it. The usual form is "@2026-03-29 01:59:50": the
	// server's wall clock starts at that local time (in the server's TZ)
	// and advances in real time. Other libfaketime forms work too (an
	// offset such as "+10d"); an unparsable one makes StartWith fail with
	// libfaketime's message. Only the wall clock is faked: the monotonic
	// clock stays real (FAKETIME_DONT_FAKE_MONOTONIC=1), as mariadbd's
	// timed waits on it would otherwise never end. [Server.Restart]
	// continues the fake clock rather than starting it again. The
	// bootstrap (mariadb-install-db) runs on the real clock.
	FakeTime string

	// FakeTimeFile, when non-empty, runs mariadbd under libfaketime with
	// its fake time read from this file (FAKETIME_TIMESTAMP_FILE) instead,
	// which libfaketime re-reads in the running server about every second
	// (FAKETIME_CACHE_DURATION=1): writing an offset such as "-30" or
	// "+0.4" (seconds) to the file steps the server's wall clock while it
	// runs, and [Server.Restart] keeps the file's offset. The file must
	// exist before StartWith, e.g. holding "+0". libfaketime reads the file
	// only when FAKETIME is unset, so FakeTime and FakeTimeFile are not
	// both allowed. The monotonic clock stays real, as with FakeTime.
	FakeTimeFile string
}

// Server is a running throwaway MariaDB server, created by [Start] or
// [StartWith] and removed by [Server.Stop]. Its methods are not safe for
// concurrent use.
type Server struct {
	dir      string   // temporary directory holding datadir, socket and logs
	port     int      // loopback TCP port the server listens on; never changes
	mariadbd string   // path of the server binary
	args     []string // mariadbd's arguments, the same for every (re)start
	cfg      Config   // as given to StartWith

	// fakeOffset is the fake wall clock minus the real one, measured when
	// the server first came up; set only when cfg.FakeTime is a start-at
	// time ("@..."), which Restart replaces by this offset.
	fakeOffset time.Duration

	cmd *exec.Cmd // the running mariadbd process, or nil; reaped
	// with wait4 by exited, so that no goroutine waits on it (test binaries
	// check for leaked goroutines)
}

// find returns the path of the first of names found in PATH or in sbin
// directories, which are often missing from a non-root PATH.
func find(names ...string) (string, error) {
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin"} {
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
	}
	return "", ErrNotInstalled
}

// findFakeTime returns the path of the libfaketime preload library.
func findFakeTime() (string, error) {
	for _, lib := range fakeTimeLibs {
		for _, dir := range fakeTimeDirs {
			matches, _ := filepath.Glob(filepath.Join(dir, lib))
			for _, p := range matches {
				if st, err := os.Stat(p); err == nil && !st.IsDir() {
					return p, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%w (looked for %s in %s)", ErrFakeTimeNotInstalled,
		strings.Join(fakeTimeLibs, ", "), strings.Join(fakeTimeDirs, ", "))
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start initialises a data directory in a new temporary directory and starts
// mariadbd on a free 127.0.0.1 port. It returns once the server accepts
// connections, or with an error (and nothing left running) after ctx ends.
// It is [StartWith] with a zero [Config].
func Start(ctx context.Context) (*Server, error) {
	return StartWith(ctx, Config{})
}

// StartWith is [Start] with extra arguments, environment or a fake clock for
// mariadbd, as set in cfg. It returns an error without starting anything
// for an Env entry that is not KEY=VALUE, and an error wrapping
// [ErrFakeTimeNotInstalled] when cfg.FakeTime is set and libfaketime is
// missing. On failure nothing is left running and the temporary directory
// is removed.
func StartWith(ctx context.Context, cfg Config) (*Server, error) {
	for _, kv := range cfg.Env {
		if i := strings.IndexByte(kv, '='); i <= 0 {
			return nil, fmt.Errorf("mariadb: Config.Env entry %q is not KEY=VALUE", kv)
		}
	}
	cfg.Args = slices.Clone(cfg.Args) // kept for Restart
	cfg.Env = slices.Clone(cfg.Env)
	if cfg.FakeTime != "" && cfg.FakeTimeFile != "" {
		return nil, errors.New("mariadb: Config.FakeTime and Config.FakeTimeFile are both set; libfaketime reads the file only without FAKETIME")
	}
	if cfg.FakeTimeFile != "" {
		if _, err := os.Stat(cfg.FakeTimeFile); err != nil {
			return nil, fmt.Errorf("mariadb: Config.FakeTimeFile: %w", err)
		}
	}
	if cfg.FakeTime != "" || cfg.FakeTimeFile != "" {
		if _, err := findFakeTime(); err != nil {
			return nil, err
		}
	}
	installDB, err := find("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return nil, err
	}
	mariadbd, err := find("mariadbd", "mysqld")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dsync-mariadb-")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	userArgs := []string{}
	if os.Geteuid() == 0 {
		// mariadbd refuses to run as root unless told to.
		userArgs = append(userArgs, "--user=root")
	}
	// The bootstrap runs on the real clock and without cfg: it only has to
	// produce a data directory.
	// Each server has a temporary directory of its own: a starting mariadbd
	// removes the #sql* files it finds in its tmpdir, and with the shared
	// /tmp those can be another server's.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	install := exec.CommandContext(ctx, installDB, append([]string{
		"--no-defaults",
		"--datadir=" + data,
		"--tmpdir=" + tmp,
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
	}, userArgs...)...)
	if out, err := install.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb: %s: %w\n%s", installDB, err, out)
	}
	for attempt := 0; ; attempt++ {
		s, err := start(ctx, mariadbd, dir, userArgs, cfg)
		if err == nil {
			return s, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		// Most likely another process took the port between freePort and
		// mariadbd's bind: try another one.
	}
}

// start starts mariadbd on dir's data directory and a free port.
func start(ctx context.Context, mariadbd, dir string, userArgs []string, cfg Config) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--no-defaults",
		"--datadir=" + filepath.Join(dir, "data"),
		"--tmpdir=" + filepath.Join(dir, "tmp"),
		"--socket=" + filepath.Join(dir, "mariadb.sock"),
		"--pid-file=" + filepath.Join(dir, "mariadb.pid"),
		"--log-error=" + filepath.Join(dir, "error.log"),
		"--bind-address=127.0.0.1",
		"--port=" + strconv.Itoa(port),
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=128M",
		"--max-connections=500",
	}, userArgs...)
	s := &Server{
		dir:      dir,
		port:     port,
		mariadbd: mariadbd,
		args:     append(args, cfg.Args...),
		cfg:      cfg,
	}
	if err := s.launch(ctx, cfg.FakeTime); err != nil {
		return nil, err
	}
	if strings.HasPrefix(cfg.FakeTime, "@") {
		if err := s.measureFakeOffset(ctx); err != nil {
			s.kill()
			return nil, err
		}
	}
	return s, nil
}

// environ returns mariadbd's environment, or nil to inherit this process's
// unchanged. FakeTime's variables come last, so that they win over Env.
func (s *Server) environ(fakeTime string) ([]string, error) {
	if len(s.cfg.Env) == 0 && fakeTime == "" && s.cfg.FakeTimeFile == "" {
		return nil, nil
	}
	env := append(os.Environ(), s.cfg.Env...)
	if fakeTime != "" || s.cfg.FakeTimeFile != "" {
		lib, err := findFakeTime()
		if err != nil {
			return nil, err
		}
		if fakeTime != "" {
			env = append(env, fakeTimeEnv(lib, fakeTime)...)
		} else {
			env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "FAKETIME=") })
			env = append(env, fakeTimeFileEnv(lib, s.cfg.FakeTimeFile)...)
		}
	}
	return env, nil
}

// fakeTimeEnv returns the environment that runs mariadbd under libfaketime
// (0.9.10, Debian 12) with FAKETIME set to fakeTime.
//
// FAKETIME_DONT_FAKE_MONOTONIC=1 is required. By default libfaketime also
// shifts CLOCK_MONOTONIC to the fake date, and it compensates in the waits
// it intercepts (pthread_cond_timedwait, sem_timedwait, poll, ...) but not
// in pthread_cond_clockwait, which mariadbd calls through libstdc++'s
// std::condition_variable::wait_for: strace shows those waits asking the
// kernel for a monotonic deadline of about 1.77e9 s (the fake date) while
// the real monotonic clock reads a few hundred seconds, i.e. timed waits
// that would end decades later. With the monotonic clock left real they
// get the right deadline; timeouts on the wall clock (SLEEP,
// innodb_lock_wait_timeout, max_statement_time) work either way.
//
// FAKETIME_NO_CACHE is not needed: FAKETIME never changes during the
// server's life and libfaketime re-parses it only when it changes, so the
// clock showed no jump across its 10-second cache refreshes, and turning
// the cache off made no measurable difference to query throughput.
func fakeTimeEnv(lib, fakeTime string) []string {
	return []string{
		"LD_PRELOAD=" + lib,
		"FAKETIME=" + fakeTime,
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// fakeTimeFileEnv returns the environment that runs mariadbd under
// libfaketime with its fake time read from file (see Config.FakeTimeFile).
// FAKETIME must be absent: libfaketime prefers it to the file, and then
// never reads the file (environ drops an inherited one).
func fakeTimeFileEnv(lib, file string) []string {
	return []string{
		"LD_PRELOAD=" + lib,
		"FAKETIME_TIMESTAMP_FILE=" + file,
		"FAKETIME_CACHE_DURATION=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}
}

// launch starts mariadbd with s.args and waits until it accepts connections.
// On failure nothing is left running and s.cmd is nil.
func (s *Server) launch(ctx context.Context, fakeTime string) error {
	env, err := s.environ(fakeTime)
	if err != nil {
		return err
	}
	logFile := s.ErrorLog()
	logStart := int64(0)
	if st, err := os.Stat(logFile); err == nil {
		logStart = st.Size() // report only this run's errors
	}
	// mariadbd logs to logFile; its stdout and stderr, where libfaketime
	// reports its own errors, go to outFile.
	outFile := filepath.Join(s.dir, "mariadbd.out")
	out, err := os.OpenFile(outFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.mariadbd, s.args...)
	// The server dies with the process that started it, so a test binary
	// that exits abruptly leaves no server behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Env = env
	cmd.Stdout = out // an *os.File: no copying goroutine
	cmd.Stderr = out
	err = cmd.Start()
	out.Close()
	if err != nil {
		return fmt.Errorf("mariadb: start %s: %w", s.mariadbd, err)
	}
	s.cmd = cmd

	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		s.kill()
		return err
	}
	defer db.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pingCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.PingContext(pingCtx)
		cancel()
		if err == nil {
			return nil
		}
		if status, exited := s.exited(); exited {
			s.forget()
			return fmt.Errorf("mariadb: mariadbd exited (status %d): %s", status.ExitStatus(), failure(logFile, logStart, outFile))
		}
		select {
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("mariadb: server did not come up: %w (last ping: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// failure returns the last error mariadbd logged to logFile after offset
// from, or else what it wrote to outFile.
func failure(logFile string, from int64, outFile string) []byte {
	log, _ := os.ReadFile(logFile)
	if from <= int64(len(log)) {
		log = log[from:]
	}
	if i := bytes.LastIndex(log, []byte("[ERROR]")); i >= 0 {
		return bytes.TrimSpace(log[i:])
	}
	out, _ := os.ReadFile(outFile)
	if out = bytes.TrimSpace(out); len(out) > 0 {
		return out
	}
	return bytes.TrimSpace(log)
}

// measureFakeOffset sets s.fakeOffset from the server's UTC clock.
// UTC_TIMESTAMP, not NOW, so that the server's time zone plays no part.
func (s *Server) measureFakeOffset(ctx context.Context) error {
	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := db.Conn(ctx) // connect before t0, so t0..t1 spans one round trip
	if err != nil {
		return fmt.Errorf("mariadb: read fake clock: %w", err)
	}
	defer conn.Close()
	var fakeMicros int64
	t0 := time.Now()
	err = conn.QueryRowContext(ctx,
		"SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))").Scan(&fakeMicros)
	t1 := time.Now()
	if err != nil {
		return fmt.Errorf("mariadb: read fake clock: %w", err)
	}
	mid := t0.Add(t1.Sub(t0) / 2)
	s.fakeOffset = time.UnixMicro(fakeMicros).Sub(mid)
	return nil
}

// Port returns the loopback TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// DSN returns a go-sql-driver DSN for root on the server, selecting database
// dbName ("" for none).
func (s *Server) DSN(dbName string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	cfg.DBName = dbName
	return cfg.FormatDSN()
}

// ErrorLog returns the path of the server's error log, which lives in its
// temporary directory and is removed by [Server.Stop]. All runs of the
// server, across [Server.Restart], append to it.
func (s *Server) ErrorLog() string { return filepath.Join(s.dir, "error.log") }

// exited reaps the server process if it has exited, without blocking.
func (s *Server) exited() (syscall.WaitStatus, bool) {
	var status syscall.WaitStatus
	pid, err := syscall.Wait4(s.cmd.Process.Pid, &status, syscall.WNOHANG, nil)
	return status, pid == s.cmd.Process.Pid || err == syscall.ECHILD
}

// waitExit waits up to d for the server process to exit.
func (s *Server) waitExit(d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, ok := s.exited(); ok {
			return true
		}
	}
	return false
}

// kill ends the server process with SIGKILL and reaps it.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.waitExit(10 * time.Second)
	s.forget()
}

// forget drops the reaped (or unreapable) server process. libfaketime 0.9.10
// creates a POSIX semaphore and shared memory object named after the pid
// (/dev/shm/sem.faketime_sem_PID, /dev/shm/faketime_shm_PID) and removes
// them only when the process exits normally; forget removes what a killed
// server left behind.
func (s *Server) forget() {
	pid := s.cmd.Process.Pid
	_ = s.cmd.Process.Release()
	s.cmd = nil
	if s.cfg.FakeTime != "" || s.cfg.FakeTimeFile != "" {
		_ = os.Remove("/dev/shm/sem.faketime_sem_" + strconv.Itoa(pid))
		_ = os.Remove("/dev/shm/faketime_shm_" + strconv.Itoa(pid))
	}
}

// Kill ends the server abruptly with SIGKILL, as a crash or a power cut
// would, and returns once the process has gone. The data directory is kept:
// [Server.Restart] starts the server on it again, and [Server.Stop] removes
// it. Kill does nothing if the server is not running.
func (s *Server) Kill() { s.kill() }

// Restart starts mariadbd again after [Server.Kill] (or a crash), on the
// same data directory and port, so that [Server.DSN] is unchanged, and with
// the same arguments and environment. InnoDB runs crash recovery as it
// starts. A fake clock ([Config.FakeTime] "@...") continues from where it
// would be had the server never stopped, rather than starting again.
// Restart returns once the server accepts connections; on failure, or when
// ctx ends first, it returns an error and nothing is left running. It
// returns an error if the server is still running.
func (s *Server) Restart(ctx context.Context) error {
	if s.cmd != nil {
		if _, gone := s.exited(); !gone {
			return errors.New("mariadb: Restart: the server is still running; Kill it first")
		}
		s.forget()
	}
	fakeTime := s.cfg.FakeTime
	if strings.HasPrefix(fakeTime, "@") {
		// An offset from the real clock, which libfaketime counts from the
		// new process's start, keeps the fake clock continuous.
		fakeTime = strconv.FormatFloat(s.fakeOffset.Seconds(), 'f', 6, 64)
		if s.fakeOffset >= 0 {
			fakeTime = "+" + fakeTime
		}
	}
	return s.launch(ctx, fakeTime)
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 20 s) if it is
// running, and removes its temporary directory. It may be called after
// [Server.Kill].
func (s *Server) Stop() error {
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		if !s.waitExit(20 * time.Second) {
			_ = s.cmd.Process.Kill()
			s.waitExit(10 * time.Second)
		}
		s.forget()
	}
	return os.RemoveAll(s.dir)
}

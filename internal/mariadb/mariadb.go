// Package mariadb starts and stops a throwaway MariaDB server for tests,
// benchmarks and the demo: a fresh data directory under a temporary
// directory, a free loopback port, a root account without a password, and
// nothing outside that directory touched.
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
	"strconv"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// ErrNotInstalled is returned by [Start] when no MariaDB server binary can be
// found. scripts/mariadb.sh installs one from Debian's packages.
var ErrNotInstalled = errors.New("mariadb: mariadbd or mariadb-install-db not found; run scripts/mariadb.sh install (or set DSYNC_TEST_DSN)")

// Server is a running throwaway MariaDB server. Stop it with [Server.Stop].
type Server struct {
	dir  string    // temporary directory holding datadir, socket and logs
	port int       // loopback TCP port the server listens on
	cmd  *exec.Cmd // the mariadbd process; reaped with wait4 by exited, so
	// that no goroutine waits on it (test binaries check for leaked goroutines)
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
func Start(ctx context.Context) (*Server, error) {
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
	install := exec.CommandContext(ctx, installDB, append([]string{
		"--no-defaults",
		"--datadir=" + data,
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
	}, userArgs...)...)
	if out, err := install.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb: %s: %w\n%s", installDB, err, out)
	}
	for attempt := 0; ; attempt++ {
		s, err := start(ctx, mariadbd, dir, userArgs)
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

func start(ctx context.Context, mariadbd, dir string, userArgs []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile := filepath.Join(dir, "error.log")
	cmd := exec.Command(mariadbd, append([]string{
		"--no-defaults",
		"--datadir=" + filepath.Join(dir, "data"),
		"--socket=" + filepath.Join(dir, "mariadb.sock"),
		"--pid-file=" + filepath.Join(dir, "mariadb.pid"),
		"--log-error=" + logFile,
		"--bind-address=127.0.0.1",
		"--port=" + strconv.Itoa(port),
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=128M",
		"--max-connections=500",
	}, userArgs...)...)
	cmd.Stdout = nil
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("mariadb: start %s: %w", mariadbd, err)
	}
	s := &Server{dir: dir, port: port, cmd: cmd}

	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		s.kill()
		return nil, err
	}
	defer db.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pingCtx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.PingContext(pingCtx)
		cancel()
		if err == nil {
			return s, nil
		}
		if status, exited := s.exited(); exited {
			log, _ := os.ReadFile(logFile)
			if i := bytes.LastIndex(log, []byte("[ERROR]")); i > 0 {
				log = log[i:]
			}
			return nil, fmt.Errorf("mariadb: mariadbd exited (status %d): %s", status.ExitStatus(), bytes.TrimSpace(log))
		}
		select {
		case <-ctx.Done():
			s.kill()
			return nil, fmt.Errorf("mariadb: server did not come up: %w (last ping: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
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

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	s.waitExit(10 * time.Second)
	_ = s.cmd.Process.Release()
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 20 s) and removes
// its temporary directory.
func (s *Server) Stop() error {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	if !s.waitExit(20 * time.Second) {
		_ = s.cmd.Process.Kill()
		s.waitExit(10 * time.Second)
	}
	_ = s.cmd.Process.Release()
	return os.RemoveAll(s.dir)
}

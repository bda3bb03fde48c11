package dsync_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// testDSN returns the test database's DSN as a config to change.
func testDSN(t *testing.T) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// silentListener returns the address of a loopback listener that accepts
// connections and never answers: a server that does not respond. It and
// the connections it accepted are closed when the test ends.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// closedPort returns a loopback address where nothing listens: a port that
// was free a moment ago.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// userWithPassword creates a database user with a password on the test
// server, dropped when the test ends, and returns its name.
func userWithPassword(t *testing.T, password string) string {
	t.Helper()
	db := dbtest.Open(t)
	user := fmt.Sprintf("dsync_pw_%08x", rand.Uint32())
	if _, err := db.Exec("CREATE USER IF NOT EXISTS '" + user + "'@'%' IDENTIFIED BY '" + password + "'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	return user
}

// TestNewSessionConnectErrors: when no connection to the database can be
// opened, NewSession says so in the user's terms ("connect to the
// database"), not as the failure of its first statement, and wraps the
// driver's error, which names the address, user or database.
func TestNewSessionConnectErrors(t *testing.T) {
	const password = "right-s3cret"
	tests := []struct {
		name  string
		dsn   func(t *testing.T, cfg *mysql.Config)
		want  func(error) bool // the driver's error is wrapped
		names string           // what the message must name
	}{
		{"wrong password", func(t *testing.T, cfg *mysql.Config) {
			cfg.User, cfg.Passwd = userWithPassword(t, password), "wrong-s3cret"
		}, func(err error) bool {
			var me *mysql.MySQLError
			return errors.As(err, &me) && me.Number == 1045 // ER_ACCESS_DENIED_ERROR
		}, "Access denied for user 'dsync_pw_"},
		{"unknown database", func(t *testing.T, cfg *mysql.Config) {
			cfg.DBName = fmt.Sprintf("dsync_none_%08x", rand.Uint32())
		}, func(err error) bool {
			var me *mysql.MySQLError
			return errors.As(err, &me) && me.Number == 1049 // ER_BAD_DB_ERROR
		}, "Unknown database 'dsync_none_"},
		{"refused port", func(t *testing.T, cfg *mysql.Config) {
			cfg.Addr = closedPort(t)
		}, func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }, "connection refused"},
		{"server does not answer", func(t *testing.T, cfg *mysql.Config) {
			cfg.Addr = silentListener(t)
		}, func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }, "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testDSN(t)
			tt.dsn(t, cfg)
			db := dbtest.OpenDSN(t, cfg.FormatDSN())
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			s, err := dsync.NewSession(ctx, db)
			if s != nil {
				s.Close()
				t.Fatalf("NewSession: got a session; want an error")
			}
			msg := fmt.Sprint(err)
			t.Log(msg)
			if !strings.HasPrefix(msg, "dsync: connect to the database: ") || strings.Contains(msg, "wsrep") || strings.Count(msg, "dsync:") != 1 {
				t.Errorf("NewSession: got %q; want it to start %q, without wsrep, dsync: once", msg, "dsync: connect to the database: ")
			}
			if !strings.Contains(msg, tt.names) {
				t.Errorf("NewSession: got %q; want it to name %q", msg, tt.names)
			}
			if strings.Contains(msg, password) || cfg.Passwd != "" && strings.Contains(msg, cfg.Passwd) {
				t.Errorf("NewSession: got %q; want no password in it", msg)
			}
			if !tt.want(err) {
				t.Errorf("NewSession: got %#v; want the driver's error wrapped", err)
			}
		})
	}
}

// TestUnlockAfterForceRelease: the holder of a lock that ForceRelease
// freed learns from Unlock that it was released by force
// (ErrReleasedByForce, which is also ErrNotHeld), also when another session
// has taken the lock since.
func TestUnlockAfterForceRelease(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	for _, retaken := range []bool{false, true} {
		t.Run(fmt.Sprintf("retaken=%v", retaken), func(t *testing.T) {
			name := lockName(t)
			m := dsync.NewMutex(newSession(t), name)
			mustLock(t, m, bg)
			if ok, err := dsync.ForceRelease(bg, db, "dsync_", name); !ok || err != nil {
				t.Fatalf("ForceRelease: got %v, %v; want true, nil", ok, err)
			}
			if retaken {
				m2 := dsync.NewMutex(newSession(t), name)
				if ok, err := m2.TryLock(bg); !ok || err != nil {
					t.Fatalf("TryLock after ForceRelease: got %v, %v; want true, nil", ok, err)
				}
			}
			err := m.Unlock(bg)
			if !errors.Is(err, dsync.ErrReleasedByForce) || !errors.Is(err, dsync.ErrNotHeld) {
				t.Fatalf("Unlock after ForceRelease: got %v; want ErrReleasedByForce and ErrNotHeld", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, "released by force") || strings.Contains(msg, "lapse") || strings.Count(msg, "dsync:") != 1 {
				t.Errorf("Unlock after ForceRelease: got %q; want released by force, no lapse, dsync: once", msg)
			}
			t.Log(msg)
		})
	}
}

// TestUnlockAfterLapsedTakeover: when the holder's lease lapsed on the
// server (here ended by hand, so that its session has not noticed yet)
// and another session took the lock, Unlock says the lock was taken over
// after the lease lapsed, not that it was released by force.
func TestUnlockAfterLapsedTakeover(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	name := lockName(t)
	s := newSession(t, dsync.WithTTL(time.Hour)) // no renewal during the test
	m := dsync.NewMutex(s, name)
	mustLock(t, m, bg)
	if _, err := db.Exec("UPDATE dsync_lease SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?", s.ID()); err != nil {
		t.Fatal(err)
	}
	m2 := dsync.NewMutex(newSession(t), name)
	if ok, err := m2.TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock after the lease lapsed: got %v, %v; want true, nil (the takeover)", ok, err)
	}
	err := m.Unlock(bg)
	if !errors.Is(err, dsync.ErrNotHeld) || errors.Is(err, dsync.ErrReleasedByForce) {
		t.Fatalf("Unlock after the takeover: got %v; want ErrNotHeld, not ErrReleasedByForce", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "lease lapsed") || strings.Count(msg, "dsync:") != 1 {
		t.Errorf("Unlock after the takeover: got %q; want the lapsed lease named, dsync: once", msg)
	}
}

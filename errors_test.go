package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
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
			if !strings.HasPrefix(msg, "dsync: connect to the database: ") || strings.Contains(msg, "wsrep") {
				t.Errorf("NewSession: got %q; want it to start %q, without wsrep", msg, "dsync: connect to the database: ")
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

// TestErrorsCarryThePrefixOnce drives the common error paths and checks
// that each error says "dsync:" exactly once, and still matches its
// sentinel.
func TestErrorsCarryThePrefixOnce(t *testing.T) {
	bg := context.Background()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	tests := []struct {
		name string
		f    func(t *testing.T, s *dsync.Session, name string) error
		want error
	}{
		{"Mutex Unlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"Mutex Unlock twice", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			mustLock(t, m, bg)
			mustUnlock(t, m, bg)
			return m.Unlock(bg)
		}, dsync.ErrNotHeld},
		{"Mutex Unlock by another owner", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			owner := dsync.WithOwner(bg)
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			return m.Unlock(dsync.WithOwner(bg))
		}, dsync.ErrNotOwner},
		{"FairMutex Unlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewFairMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"RWMutex RUnlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewRWMutex(s, name).RUnlock(bg)
		}, dsync.ErrNotHeld},
		{"Unlock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			mustLock(t, m, bg)
			s.Close()
			return m.Unlock(bg)
		}, dsync.ErrSessionClosed},
		{"Lock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			return dsync.NewMutex(s, name).Lock(bg)
		}, dsync.ErrSessionClosed},
		{"Lock with cancelled ctx", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).Lock(cancelled)
		}, context.Canceled},
		{"Lock empty name", func(t *testing.T, s *dsync.Session, _ string) error {
			return dsync.NewMutex(s, "").Lock(bg)
		}, dsync.ErrInvalidName},
		{"back-off gives up", func(t *testing.T, _ *dsync.Session, name string) error {
			mustLock(t, dsync.NewMutex(newSession(t), name), bg)
			stop := func() backoff.BackOff { return &backoff.StopBackOff{} }
			return dsync.NewMutex(newSession(t, dsync.WithBackOff(stop)), name).Lock(bg)
		}, dsync.ErrNotObtained},
		{"Mutex of a name a FairMutex holds", func(t *testing.T, s *dsync.Session, name string) error {
			f := dsync.NewFairMutex(s, name)
			if err := f.Lock(bg); err != nil {
				t.Fatal(err)
			}
			defer f.Unlock(bg)
			return dsync.NewMutex(s, name).Lock(bg)
		}, dsync.ErrOtherKind},
		{"RWMutex upgrade", func(t *testing.T, s *dsync.Session, name string) error {
			rw, owner := dsync.NewRWMutex(s, name), dsync.WithOwner(bg)
			if err := rw.RLock(owner); err != nil {
				t.Fatal(err)
			}
			defer rw.RUnlock(owner)
			return rw.Lock(owner)
		}, dsync.ErrLockUpgrade},
		{"RWMutex downgrade", func(t *testing.T, s *dsync.Session, name string) error {
			rw, owner := dsync.NewRWMutex(s, name), dsync.WithOwner(bg)
			if err := rw.Lock(owner); err != nil {
				t.Fatal(err)
			}
			defer rw.Unlock(owner)
			return rw.RLock(owner)
		}, dsync.ErrLockDowngrade},
		{"LockTx nil tx", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).LockTx(bg, nil)
		}, dsync.ErrInvalidOption},
		{"LockTx by the owner holding it through Lock", func(t *testing.T, s *dsync.Session, name string) error {
			m, owner := dsync.NewMutex(s, name), dsync.WithOwner(bg)
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			return m.LockTx(owner, beginTx(t, dbtest.Open(t), sql.LevelDefault))
		}, dsync.ErrDeadlock},
		{"Unlock of a LockTx hold", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			if err := m.LockTx(bg, beginTx(t, dbtest.Open(t), sql.LevelDefault)); err != nil {
				t.Fatal(err)
			}
			return m.Unlock(bg)
		}, dsync.ErrNotOwner},
		{"NewSession bad TTL", func(t *testing.T, _ *dsync.Session, _ string) error {
			_, err := dsync.NewSession(bg, dbtest.Open(t), dsync.WithTTL(time.Millisecond))
			return err
		}, dsync.ErrInvalidOption},
		{"NewSession on tables of another schema version", func(t *testing.T, _ *dsync.Session, _ string) error {
			db := dbtest.Open(t)
			prefix := freshPrefix("prefixonce")
			if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("UPDATE `"+prefix+"schema` SET version = ?", dsync.SchemaVersion+1); err != nil {
				t.Fatal(err)
			}
			_, err := dsync.NewSession(bg, db, dsync.WithTablePrefix(prefix))
			return err
		}, dsync.ErrSchemaVersion},
		{"ForceRelease bad prefix", func(t *testing.T, _ *dsync.Session, name string) error {
			_, err := dsync.ForceRelease(bg, dbtest.Open(t), "é", name)
			return err
		}, dsync.ErrInvalidOption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.f(t, newSession(t), lockName(t))
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v; want %v", err, tt.want)
			}
			if n := strings.Count(err.Error(), "dsync:"); n != 1 {
				t.Errorf("got %q (dsync: %d times); want dsync: once", err, n)
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

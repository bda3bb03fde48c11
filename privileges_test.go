package dsync_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestLeastPrivileges: a user with SELECT, INSERT, UPDATE and DELETE on the
// seven tables of a prefix, and nothing else, runs every lock kind, LockTx
// (its transaction on the same user) and the operator calls on tables a
// DBA created from dsync.Schema (what dsync schema prints), as
// docs/OPERATIONS.md says; and NewSession on a prefix without tables
// fails with the server's 1142 naming CREATE.
func TestLeastPrivileges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := dbtest.Open(t)
	var b [4]byte
	rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	prefix, user := "priv"+suffix+"_", "dsync_priv_"+suffix

	// The DBA's part: the tables, the user and its grants.
	stmts, err := dsync.Schema(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range stmts {
		if _, err := root.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := root.ExecContext(ctx, "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'pw'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Exec("DROP USER '" + user + "'@'%'") })
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket", "txlock", "leader"} {
		grant := "GRANT SELECT, INSERT, UPDATE, DELETE ON `" + prefix + table + "` TO '" + user + "'@'%'"
		if _, err := root.ExecContext(ctx, grant); err != nil {
			t.Fatalf("%s: %v", grant, err)
		}
	}
	cfg, err := mysql.ParseDSN(dbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, "pw"
	db := dbtest.OpenDSN(t, cfg.FormatDSN())

	s, err := dsync.NewSession(ctx, db, dsync.WithTablePrefix(prefix), dsync.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("NewSession with the documented grants: got %v; want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s with the documented grants: got %v; want nil", what, err)
		}
	}
	m := dsync.NewMutex(s, "m")
	must("Lock", m.Lock(ctx))
	locks, err := dsync.ListLocks(ctx, db, prefix)
	must("ListLocks", err)
	if len(locks) != 1 {
		t.Fatalf("ListLocks: got %d locks; want 1", len(locks))
	}
	must("Unlock", m.Unlock(ctx))
	must("Lock again", m.Lock(ctx))
	released, err := dsync.ForceRelease(ctx, db, prefix, "m")
	must("ForceRelease", err)
	if !released {
		t.Fatal("ForceRelease: got false; want true")
	}
	m.Unlock(ctx) // the hold was released by force
	f := dsync.NewFairMutex(s, "f")
	must("FairMutex.Lock", f.Lock(ctx))
	must("FairMutex.Unlock", f.Unlock(ctx))
	rw := dsync.NewRWMutex(s, "rw")
	must("RLock", rw.RLock(ctx))
	must("RUnlock", rw.RUnlock(ctx))
	must("RWMutex.Lock", rw.Lock(ctx))
	must("RWMutex.Unlock", rw.Unlock(ctx))
	tx, err := db.BeginTx(ctx, nil)
	must("BeginTx", err)
	defer tx.Rollback()
	must("LockTx", dsync.NewMutex(s, "tx").LockTx(ctx, tx))
	must("Commit", tx.Commit())
	e := dsync.NewElection(s, "e")
	must("Campaign", e.Campaign(ctx, "v"))
	must("Proclaim", e.Proclaim(ctx, "w"))
	_, err = e.Leader(ctx)
	must("Leader", err)
	must("Resign", e.Resign(ctx))
	must("Close", s.Close())

	// Tables of this schema version made before Elections (no leader
	// table), for a user without CREATE: NewSession and the locks work on;
	// an Election fails with the server's error.
	if _, err := root.ExecContext(ctx, "DROP TABLE `"+prefix+"leader`"); err != nil {
		t.Fatal(err)
	}
	s, err = dsync.NewSession(ctx, db, dsync.WithTablePrefix(prefix), dsync.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("NewSession without CREATE on tables without the leader table: got %v; want nil", err)
	}
	t.Cleanup(func() { s.Close() })
	must("Lock without the leader table", dsync.NewMutex(s, "m").Lock(ctx))
	if err := dsync.NewElection(s, "e").Campaign(ctx, "v"); err == nil {
		t.Fatal("Campaign without the leader table: got nil; want an error")
	} else {
		t.Logf("Campaign without the leader table: %v", err)
	}
	must("Close", s.Close())

	// Without CREATE, a prefix whose tables do not exist.
	_, err = dsync.NewSession(ctx, db, dsync.WithTablePrefix("new"+suffix+"_"))
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1142 || !strings.Contains(err.Error(), "CREATE") || !strings.Contains(err.Error(), "dsync schema") {
		t.Fatalf("NewSession without CREATE on a new prefix: got %v; want error 1142 naming CREATE and the way out (dsync schema)", err)
	}
}

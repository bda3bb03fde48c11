package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// TestMissingTableCreatedAgain checks that NewSession creates a table that
// is missing beside ones that exist (TestNewSessionRunsNoDDLWhenTablesExist
// checks that it runs no DDL when none is missing).
func TestMissingTableCreatedAgain(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("missing")
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	if _, err := db.Exec("DROP TABLE `" + prefix + "ticket`"); err != nil {
		t.Fatal(err)
	}
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM `" + prefix + "ticket`").Scan(&n); err != nil {
		t.Fatalf("the dropped ticket table after NewSession: got %v; want it created again", err)
	}
}

// TestSchemaVersion checks that NewSession refuses tables of another
// schema version, and tables from before the version record, with
// ErrSchemaVersion, and leaves them as they are.
func TestSchemaVersion(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)

	prefix := freshPrefix("schemav")
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	var version int
	if err := db.QueryRow("SELECT version FROM `" + prefix + "schema`").Scan(&version); err != nil {
		t.Fatalf("the recorded schema version: got %v; want a row", err)
	}
	if version != dsync.SchemaVersion {
		t.Fatalf("recorded schema version: got %d; want %d", version, dsync.SchemaVersion)
	}
	if _, err := db.Exec("UPDATE `"+prefix+"schema` SET version = ?", version+1); err != nil {
		t.Fatal(err)
	}
	s, err := dsync.NewSession(bg, db, dsync.WithTablePrefix(prefix))
	if !errors.Is(err, dsync.ErrSchemaVersion) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewSession on tables of version %d: got %v; want ErrSchemaVersion", version+1, err)
	}
	t.Logf("newer tables: %v", err)

	// The tables of dsync before the version record: no schema table, and
	// the ticket table numbered by AUTO_INCREMENT.
	old := freshPrefix("schemav1")
	for _, q := range []string{
		"CREATE TABLE `" + old + "lease` (id BIGINT NOT NULL PRIMARY KEY, label VARCHAR(255) NOT NULL, created_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL)",
		"CREATE TABLE `" + old + "lock` (name VARBINARY(255) NOT NULL PRIMARY KEY, holder BIGINT NOT NULL DEFAULT 0, token BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)",
		"CREATE TABLE `" + old + "queue` (name VARBINARY(255) NOT NULL PRIMARY KEY, fence BIGINT NOT NULL DEFAULT 0, ahead BIGINT NOT NULL DEFAULT 0)",
		"CREATE TABLE `" + old + "ticket` (ticket BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, name VARBINARY(255) NOT NULL, holder BIGINT NOT NULL, token BIGINT NOT NULL, mode TINYINT NOT NULL)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	s, err = dsync.NewSession(bg, db, dsync.WithTablePrefix(old))
	if !errors.Is(err, dsync.ErrSchemaVersion) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewSession on tables without a version record: got %v; want ErrSchemaVersion", err)
	}
	t.Logf("older tables: %v", err)
	var tables int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
		old+"%").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 4 {
		t.Errorf("tables of the old prefix after the refused NewSession: got %d; want the 4 it had", tables)
	}
}

// TestSchemaVersion2Refused checks that NewSession refuses the tables of
// schema version 2 (before the clean-up columns) with ErrSchemaVersion,
// leaves them alone, and that the documented way out works: with no
// process of the old version left, drop the tables and start again.
func TestSchemaVersion2Refused(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("schemav2")
	v2 := []string{
		"CREATE TABLE `" + prefix + "schema` (id TINYINT NOT NULL PRIMARY KEY, version INT NOT NULL)",
		"INSERT INTO `" + prefix + "schema` VALUES (1, 2)",
		"CREATE TABLE `" + prefix + "lease` (id BIGINT NOT NULL PRIMARY KEY, label VARCHAR(255) NOT NULL, created_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL, KEY expires_at_idx (expires_at))",
		"CREATE TABLE `" + prefix + "lock` (name VARBINARY(255) NOT NULL PRIMARY KEY, holder BIGINT NOT NULL DEFAULT 0, token BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0, waiter BIGINT NOT NULL DEFAULT 0, claimed_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00')",
		"CREATE TABLE `" + prefix + "queue` (name VARBINARY(255) NOT NULL PRIMARY KEY, seq BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)",
		"CREATE TABLE `" + prefix + "ticket` (name VARBINARY(255) NOT NULL, seq BIGINT NOT NULL, holder BIGINT NOT NULL, token BIGINT NOT NULL, mode TINYINT NOT NULL, PRIMARY KEY (name, seq))",
		"INSERT INTO `" + prefix + "lock` (name, fence) VALUES ('old', 7)",
	}
	execAll(t, db, v2...)
	err := refusedVersion(t, db, prefix, 2)
	t.Logf("version 2 tables: %v", err)
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM `" + prefix + "lock`").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the version 2 lock table after the refused NewSession: got %d rows, %v; want its 1 row", n, err)
	}
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket"} { // no txlock: NewSession ran no DDL
		if _, err := db.Exec("DROP TABLE `" + prefix + table + "`"); err != nil {
			t.Fatal(err)
		}
	}
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatalf("Close of a session on the tables created again: got %v; want <nil>", err)
	}
}

// TestTicketNumberedAfterBlockingEnqueue checks the single-server enqueue's
// numbering against a stale read: an enqueue that waited for the name's row
// behind another transaction's enqueue must number its ticket above the
// ticket that transaction committed. (Were the highest ticket read before
// the wait, it could reuse the number of a ticket deleted meanwhile and
// jump the line.)
func TestTicketNumberedAfterBlockingEnqueue(t *testing.T) {
	bg := context.Background()
	db := dbtest.Open(t)
	s := newSession(t)
	name := lockName(t)
	rw := dsync.NewRWMutex(s, name)      // readers always take tickets (no head slot)
	if err := rw.RLock(bg); err != nil { // creates the name's row
		t.Fatalf("RLock: got %v; want <nil>", err)
	}
	var first int64
	if err := db.QueryRow("SELECT seq FROM dsync_ticket WHERE name = ?", name).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(bg); err != nil {
		t.Fatalf("RUnlock: got %v; want <nil>", err)
	}

	tx, err := db.BeginTx(bg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("SELECT name FROM dsync_queue WHERE name = ? FOR UPDATE", name); err != nil {
		t.Fatal(err)
	}
	// A ticket of no lease (dead, so it blocks nobody) far above the first.
	planted := first + 1000
	if _, err := tx.Exec("INSERT INTO dsync_ticket (name, seq, holder, token, mode) VALUES (?, ?, 0, 0, 1)", name, planted); err != nil {
		t.Fatal(err)
	}
	locked, unlock, errc := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		err := rw.RLock(bg)
		locked <- err
		if err == nil {
			<-unlock
			errc <- rw.RUnlock(bg)
		}
	}()
	// Wait until the enqueue is blocked on the row, then commit.
	awaitStatement(t, db, "INSERT INTO %dsync_ticket%FOR UPDATE%", 10*time.Second, "the enqueue never waited for the name's row")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("RLock behind the other enqueue: got %v; want <nil>", err)
	}
	var mine int64
	err = db.QueryRow("SELECT seq FROM dsync_ticket WHERE name = ? AND holder = ?", name, s.ID()).Scan(&mine)
	close(unlock)
	if uerr := <-errc; uerr != nil {
		t.Errorf("RUnlock: got %v; want <nil>", uerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if mine <= planted {
		t.Errorf("ticket of the enqueue that waited: got %d; want above the committed %d", mine, planted)
	}
}

// TestOlderSchemaGetsNoNewTable checks that NewSession on the tables of an
// older schema version that lack a table of this version (version 3 had no
// txlock table) refuses them with ErrSchemaVersion before any DDL: it
// creates no table.
func TestOlderSchemaGetsNoNewTable(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("schemaold")
	if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
		t.Fatalf("Close: got %v; want <nil>", err)
	}
	// The older tables: no txlock table, an older version recorded.
	if _, err := db.Exec("DROP TABLE `" + prefix + "txlock`"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE `"+prefix+"schema` SET version = ?", dsync.SchemaVersion-1); err != nil {
		t.Fatal(err)
	}
	tables := func() (n int) {
		t.Helper()
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
			prefix+"%").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := tables()
	s, err := dsync.NewSession(context.Background(), db, dsync.WithTablePrefix(prefix))
	if !errors.Is(err, dsync.ErrSchemaVersion) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewSession on tables of version %d: got %v; want ErrSchemaVersion", dsync.SchemaVersion-1, err)
	}
	if after := tables(); after != before {
		t.Errorf("tables of the prefix after the refused NewSession: got %d; want the %d it had", after, before)
	}
	var n int
	err = db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", prefix+"txlock").Scan(&n)
	if err != nil || n != 0 {
		t.Errorf("the txlock table after the refused NewSession: got %d, %v; want none", n, err)
	}
}

// TestUpperCasePrefixFoldedTableNames checks an upper-case table prefix on
// a server that stores table names in lower case (lower_case_table_names=1,
// a dedicated throwaway server): a second NewSession finds the tables the
// first one created, and the sessions exclude each other.
func TestUpperCasePrefixFoldedTableNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, admin := dedicatedServer(ctx, t, "--lower-case-table-names=1")
	var folds int
	if err := admin.QueryRowContext(ctx, "SELECT @@lower_case_table_names").Scan(&folds); err != nil || folds != 1 {
		t.Fatalf("lower_case_table_names: got %d, %v; want 1 (the server does not fold names)", folds, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE folded"); err != nil {
		t.Fatal(err)
	}
	db := dbtest.OpenDSN(t, srv.DSN("folded"))
	const prefix = "MyApp_"
	first := sessionOn(t, db, dsync.WithTablePrefix(prefix))
	var stored string
	if err := db.QueryRowContext(ctx, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() LIMIT 1").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != strings.ToLower(stored) {
		t.Fatalf("table name stored by the server: got %q; want it in lower case", stored)
	}
	second, err := dsync.NewSession(ctx, db, dsync.WithTablePrefix(prefix))
	if err != nil {
		t.Fatalf("second NewSession with prefix %q on tables stored as %q: got %v; want <nil>", prefix, stored, err)
	}
	t.Cleanup(func() { second.Close() })
	name := lockName(t)
	if err := dsync.NewMutex(first, name).Lock(ctx); err != nil {
		t.Fatalf("Lock: got %v; want <nil>", err)
	}
	if ok, err := dsync.NewMutex(second, name).TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock of the other session while the first holds: got %v, %v; want false, <nil>", ok, err)
	}
}

// TestSchemaForeignTable: a table of another application with one of the
// names dsync's tables would have (likely with the empty prefix: lock,
// queue) makes NewSession fail with ErrSchemaVersion, and the error names
// that table, not the lease table that is not there, and suggests a prefix
// of dsync's own. The table is left alone, and nothing is created beside it.
func TestSchemaForeignTable(t *testing.T) {
	db := dbtest.Open(t)
	prefix := freshPrefix("foreign")
	foreign := prefix + "queue"
	if _, err := db.Exec("CREATE TABLE `" + foreign + "` (id INT NOT NULL PRIMARY KEY, title VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec("DROP TABLE `" + foreign + "`") })
	s, err := dsync.NewSession(context.Background(), db, dsync.WithTablePrefix(prefix))
	if s != nil {
		s.Close()
	}
	if !errors.Is(err, dsync.ErrSchemaVersion) {
		t.Fatalf("NewSession beside another application's table %s: got %v; want ErrSchemaVersion", foreign, err)
	}
	for _, want := range []string{"found " + foreign + " ", "WithTablePrefix"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NewSession beside another application's table: got %q; want it to say %q", err, want)
		}
	}
	var tables int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
		prefix+"%").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 1 {
		t.Errorf("tables of the prefix after the refused NewSession: got %d; want the 1 it had", tables)
	}
}

// TestSchemaUpgradeFrom5 checks the in-place upgrade of tables of schema
// version 5 (without the held_since columns, nor version 7's Semaphore
// columns): NewSession refuses them with an ErrSchemaVersion that names
// the statements, which, run as they are, leave the tables that
// NewSession creates, and a session then starts on them.
func TestSchemaUpgradeFrom5(t *testing.T) {
	schemaUpgrade(t, 5, 6,
		"ALTER TABLE `{p}lock` DROP COLUMN held_since",
		"ALTER TABLE `{p}queue` DROP COLUMN held_since",
		"ALTER TABLE `{p}ticket` DROP COLUMN held_since")
}

// TestSchemaUpgradeFrom6 is TestSchemaUpgradeFrom5 for tables of schema
// version 6 (without the Semaphore columns).
func TestSchemaUpgradeFrom6(t *testing.T) {
	schemaUpgrade(t, 6, 3)
}

// schemaUpgrade makes tables of the current version into tables of
// version: it drops the columns later versions added (version 7's, then
// the statements drop) and records version; NewSession must refuse them
// with an ErrSchemaVersion that names alters ALTER TABLE statements,
// which, run as they are, leave the tables that NewSession creates.
func schemaUpgrade(t *testing.T, version, alters int, drop ...string) {
	bg := context.Background()
	db := dbtest.Open(t)
	old, fresh := freshPrefix(fmt.Sprintf("schemav%d", version)), freshPrefix("schemanew")
	for _, p := range []string{old, fresh} {
		if err := sessionOn(t, db, dsync.WithTablePrefix(p)).Close(); err != nil {
			t.Fatalf("Close: got %v; want <nil>", err)
		}
	}
	stmts := []string{
		"ALTER TABLE `{p}lock` DROP COLUMN permits",
		"ALTER TABLE `{p}queue` DROP COLUMN permits",
		"ALTER TABLE `{p}ticket` DROP COLUMN weight",
	}
	for _, q := range append(append(stmts, drop...), fmt.Sprintf("UPDATE `{p}schema` SET version = %d", version)) {
		execAll(t, db, strings.ReplaceAll(q, "{p}", old))
	}
	msg := refusedVersion(t, db, old, version).Error()
	_, upgradeText, ok := strings.Cut(msg, "run:\n")
	if !ok || strings.Count(upgradeText, "ALTER TABLE") != alters {
		t.Fatalf("ErrSchemaVersion of version %d: got %q; want the statements that upgrade the tables", version, msg)
	}
	var upgrade []string
	for _, q := range strings.SplitAfter(upgradeText, ";") {
		if q = strings.TrimSpace(q); q != "" {
			upgrade = append(upgrade, q)
		}
	}
	execAll(t, db, upgrade...)
	for _, table := range []string{"schema", "lease", "lock", "queue", "ticket", "txlock", "leader"} {
		u, c := showCreate(t, db, old+table), showCreate(t, db, fresh+table)
		if strings.ReplaceAll(u, old, fresh) != c {
			t.Errorf("table %s: the upgrade made\n%s\nNewSession makes\n%s", table, u, c)
		}
	}
	s := sessionOn(t, db, dsync.WithTablePrefix(old))
	if ok, err := dsync.NewMutex(s, "x").TryLock(bg); !ok || err != nil {
		t.Fatalf("TryLock on the upgraded tables: got %v, %v; want true, nil", ok, err)
	}
}

// execAll runs stmts on db, in order.
func execAll(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// refusedVersion starts a session on the tables of prefix, which are of
// schema version (for the message), and returns its error, which must
// be ErrSchemaVersion.
func refusedVersion(t *testing.T, db *sql.DB, prefix string, version int) error {
	t.Helper()
	s, err := dsync.NewSession(context.Background(), db, dsync.WithTablePrefix(prefix))
	if !errors.Is(err, dsync.ErrSchemaVersion) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("NewSession on tables of version %d: got %v; want ErrSchemaVersion", version, err)
	}
	return err
}

package mariadb_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsynclock/dsync/internal/mariadb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartStop starts a throwaway server, runs a query on it, stops it and
// checks that nothing is left listening.
func TestStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := mariadb.Start(ctx)
	if errors.Is(err, mariadb.ErrNotInstalled) && os.Getenv("DSYNC_TEST_DSN") != "" {
		// The suite runs on the user's server and never needs this helper.
		t.Skipf("DSYNC_TEST_DSN is set and no MariaDB is installed: %v", err)
	}
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	db, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	var one int
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	db.Close()
	if err != nil || one != 1 {
		t.Fatalf("SELECT 1: got %d, %v; want 1, nil", one, err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	db, err = sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

// Package dbtest gives a test package a real database: the server named by
// DSYNC_TEST_DSN when it is set, otherwise a throwaway MariaDB started for the
// run. It never skips: when no server can be had, Setup says how to get one.
package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// EnvDSN names the environment variable that points tests at an existing
// server, as a go-sql-driver DSN (for example "root@tcp(127.0.0.1:3306)/").
// Tests create and drop a database of their own on it.
const EnvDSN = "DSYNC_TEST_DSN"

var dsn string // DSN of this run's database; set by Setup

// DSN returns the DSN of the database Setup prepared for this run.
func DSN() string { return dsn }

// Setup prepares a fresh database for the calling test binary and returns the
// function that removes it (and stops the server, if Setup started one).
func Setup() (stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var server *mariadb.Server
	base := os.Getenv(EnvDSN)
	if base == "" {
		server, err = mariadb.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("dbtest: no database for the tests: %w\n"+
				"Either install MariaDB (scripts/mariadb.sh install; 'make test' does it) "+
				"or point %s at a MySQL/MariaDB server", err, EnvDSN)
		}
		base = server.DSN("")
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		if server != nil {
			server.Stop()
		}
		return nil, fmt.Errorf("dbtest: %s: %w", EnvDSN, err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	dbName := "dsync_test_" + hex.EncodeToString(b[:])

	adminDSN := cfg.FormatDSN()
	if err := exec(ctx, adminDSN, "CREATE DATABASE "+dbName); err != nil {
		if server != nil {
			server.Stop()
		}
		return nil, fmt.Errorf("dbtest: create database on %s: %w", cfg.Addr, err)
	}
	cfg.DBName = dbName
	dsn = cfg.FormatDSN()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = exec(ctx, adminDSN, "DROP DATABASE IF EXISTS "+dbName)
		if server != nil {
			server.Stop()
		}
	}, nil
}

// exec runs one statement on a connection of its own, so that nothing is
// left open between Setup and stop.
func exec(ctx context.Context, dsn, query string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, query)
	return err
}

// Open returns a new connection pool to this run's database, closed when the
// test ends.
func Open(tb testing.TB) *sql.DB {
	tb.Helper()
	return OpenDSN(tb, dsn)
}

// OpenDSN returns a new connection pool for dsn, closed when the test ends.
func OpenDSN(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatalf("open %s: %v", dsn, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// FaultProxy starts a fault proxy in front of the test server and returns
// it with the DSN that reaches the test database through it. The proxy is
// closed when the test ends.
func FaultProxy(tb testing.TB) (*faultproxy.Proxy, string) {
	tb.Helper()
	cfg, err := mysql.ParseDSN(DSN())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := faultproxy.New(cfg.Addr)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	cfg.Addr = p.Addr()
	return p, cfg.FormatDSN()
}

//go:build linux

package torture

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/faultproxy"
	"github.com/dsynclock/dsync/internal/mariadb"
)

// TestElectionClockBackRepro reproduces, step by step, the anomaly that
// make torture DURATION=5m SEED=21 found on e0: after a backward step of
// the server's clock, a lease that had ended less than the step ago is
// live again on the database's clock, and its ticket, ahead of the
// current leader's, makes Leader() report no leader while the leader
// leads, and its Proclaim succeeds. It failed on the code it was written
// against (before 54b0f2c: "Leader() returned ErrNoLeader while L
// leads"); the leader read now takes the hold that took the current
// fence first. About 8 s, so -short leaves it out.
func TestElectionClockBackRepro(t *testing.T) {
	if testing.Short() {
		t.Skip("about 8 s; -short leaves it out")
	}
	ctx := context.Background()
	path, err := clockFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	server, err := mariadb.StartWith(ctx, mariadb.Config{FakeTimeFile: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Stop() })
	admin, err := sql.Open("mysql", server.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE repro"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", server.DSN("repro"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg, err := mysql.ParseDSN(server.DSN("repro"))
	if err != nil {
		t.Fatal(err)
	}
	px, err := faultproxy.New(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	cfg.Addr = px.Addr()
	cfg.ReadTimeout, cfg.WriteTimeout = 5*time.Second, 5*time.Second
	dDB, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dDB.Close() })

	const ttl = 2 * time.Second
	session := func(db *sql.DB) *dsync.Session {
		s, err := dsync.NewSession(ctx, db, dsync.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	const name = "e-repro"
	h, d, l, r := session(db), session(dDB), session(db), session(db)
	eh, ed, el, er := dsync.NewElection(h, name), dsync.NewElection(d, name), dsync.NewElection(l, name), dsync.NewElection(r, name)
	if err := eh.Campaign(ctx, "h"); err != nil {
		t.Fatal(err)
	}
	campaign := func(e *dsync.Election, v string) <-chan error {
		ch := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			ch <- e.Campaign(cctx, v)
		}()
		return ch
	}
	dDone := campaign(ed, "d") // D waits first: its ticket is ahead of L's
	time.Sleep(500 * time.Millisecond)
	lDone := campaign(el, "l")
	time.Sleep(500 * time.Millisecond)

	// D's connection goes dark: its lease ends (Done), then ends on the
	// server too.
	px.Cut(true)
	<-d.Done()
	t.Logf("D's lease lost: %v", d.Err())
	time.Sleep(ttl)
	if err := eh.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-lDone; err != nil {
		t.Fatalf("L's Campaign: %v", err)
	}
	lead, err := er.Leader(ctx)
	t.Logf("after H resigned, D's lease having ended: L leads with term %d; Leader() = %+v, %v", el.Term(), lead, err)

	// The server's clock steps back 10 s.
	if err := os.WriteFile(path, []byte("-10.000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // libfaketime reads the file about every second
	lead, err = er.Leader(ctx)
	perr := el.Proclaim(ctx, "l2")
	t.Logf("after the server's clock stepped back 10 s: L's Term() = %d, L's Proclaim = %v, Leader() = %+v, %v", el.Term(), perr, lead, err)
	if errors.Is(err, dsync.ErrNoLeader) && perr == nil && l.Err() == nil {
		t.Errorf("Leader() returned ErrNoLeader while L leads (its session live, its Proclaim returned nil)")
	}
	px.Cut(false)
	<-dDone
}

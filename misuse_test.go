package dsync_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsynclock/dsync"
	"github.com/dsynclock/dsync/internal/dbtest"
)

// heldBy returns the lease id holding name in the default tables, or 0 when
// the row is free or missing (a row whose lease ended counts as free).
func heldBy(t *testing.T, db *sql.DB, name string) int64 {
	t.Helper()
	var holder int64
	err := db.QueryRow(`SELECT k.holder FROM dsync_lock k JOIN dsync_lease l ON l.id = k.holder
		WHERE k.name = ? AND l.expires_at > UTC_TIMESTAMP(6)`, name).Scan(&holder)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return holder
}

// TestMisuse is the misuse table: every wrong use returns the documented
// sentinel, with the dsync: prefix once, and leaves no lock row held.
func TestMisuse(t *testing.T) {
	bg := context.Background()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	stop := func() backoff.BackOff { return &backoff.StopBackOff{} }

	tests := []struct {
		name string
		f    func(t *testing.T, s *dsync.Session, name string) error
		want error
	}{
		{"Unlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"Unlock twice", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			mustLock(t, m, bg)
			mustUnlock(t, m, bg)
			return m.Unlock(bg)
		}, dsync.ErrNotHeld},
		{"Unlock through another Mutex of another session", func(t *testing.T, s *dsync.Session, name string) error {
			mustLock(t, dsync.NewMutex(newSession(t), name), bg)
			return dsync.NewMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"Unlock by another owner", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			owner := dsync.WithOwner(bg)
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			return m.Unlock(dsync.WithOwner(bg))
		}, dsync.ErrNotOwner},
		{"Unlock without owner of an owned lock", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			owner := dsync.WithOwner(bg)
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			return m.Unlock(bg)
		}, dsync.ErrNotOwner},
		{"Lock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			return dsync.NewMutex(s, name).Lock(bg)
		}, dsync.ErrSessionClosed},
		{"TryLock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			s.Close()
			_, err := dsync.NewMutex(s, name).TryLock(bg)
			return err
		}, dsync.ErrSessionClosed},
		{"Unlock after Close", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			mustLock(t, m, bg)
			s.Close()
			return m.Unlock(bg)
		}, dsync.ErrSessionClosed},
		{"Close twice", func(t *testing.T, s *dsync.Session, name string) error {
			if err := s.Close(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			return s.Close()
		}, dsync.ErrSessionClosed},
		{"Lock waiting when Close is called", func(t *testing.T, s *dsync.Session, name string) error {
			mustLock(t, dsync.NewMutex(newSession(t), name), bg)
			go func() { time.Sleep(50 * time.Millisecond); s.Close() }()
			return dsync.NewMutex(s, name).Lock(bg)
		}, dsync.ErrSessionClosed},
		{"Lock with cancelled ctx", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).Lock(cancelled)
		}, context.Canceled},
		{"TryLock with cancelled ctx", func(t *testing.T, s *dsync.Session, name string) error {
			_, err := dsync.NewMutex(s, name).TryLock(cancelled)
			return err
		}, context.Canceled},
		{"Lock held elsewhere until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			mustLock(t, dsync.NewMutex(newSession(t), name), bg)
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			return dsync.NewMutex(s, name).Lock(ctx)
		}, context.DeadlineExceeded},
		{"Lock held locally until deadline", func(t *testing.T, s *dsync.Session, name string) error {
			holder := dsync.NewMutex(s, name)
			mustLock(t, holder, bg)
			defer mustUnlock(t, holder, bg)
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			return dsync.NewMutex(s, name).Lock(ctx)
		}, context.DeadlineExceeded},
		{"second Lock without owner is not reentrant", func(t *testing.T, s *dsync.Session, name string) error {
			m := dsync.NewMutex(s, name)
			mustLock(t, m, bg)
			defer mustUnlock(t, m, bg)
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			return m.Lock(ctx)
		}, context.DeadlineExceeded},
		{"back-off gives up", func(t *testing.T, _ *dsync.Session, name string) error {
			mustLock(t, dsync.NewMutex(newSession(t), name), bg)
			return dsync.NewMutex(newSession(t, dsync.WithBackOff(stop)), name).Lock(bg)
		}, dsync.ErrNotObtained},
		{"Lock empty name", func(t *testing.T, s *dsync.Session, _ string) error {
			return dsync.NewMutex(s, "").Lock(bg)
		}, dsync.ErrInvalidName},
		{"TryLock name over 255 bytes", func(t *testing.T, s *dsync.Session, _ string) error {
			_, err := dsync.NewMutex(s, strings.Repeat("x", 256)).TryLock(bg)
			return err
		}, dsync.ErrInvalidName},
		{"Unlock invalid UTF-8 name", func(t *testing.T, s *dsync.Session, _ string) error {
			return dsync.NewMutex(s, "\xff\xfe").Unlock(bg)
		}, dsync.ErrInvalidName},
		{"FairMutex Unlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewFairMutex(s, name).Unlock(bg)
		}, dsync.ErrNotHeld},
		{"RWMutex RUnlock never locked", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewRWMutex(s, name).RUnlock(bg)
		}, dsync.ErrNotHeld},
		{"Mutex Lock of a name a FairMutex holds", func(t *testing.T, s *dsync.Session, name string) error {
			f := dsync.NewFairMutex(s, name)
			if err := f.Lock(bg); err != nil {
				t.Fatal(err)
			}
			defer f.Unlock(bg)
			return dsync.NewMutex(s, name).Lock(bg)
		}, dsync.ErrOtherKind},
		{"RWMutex Lock by the owner of a read lock", func(t *testing.T, s *dsync.Session, name string) error {
			rw, owner := dsync.NewRWMutex(s, name), dsync.WithOwner(bg)
			if err := rw.RLock(owner); err != nil {
				t.Fatal(err)
			}
			defer rw.RUnlock(owner)
			return rw.Lock(owner)
		}, dsync.ErrLockUpgrade},
		{"RWMutex RLock by the owner of the write lock", func(t *testing.T, s *dsync.Session, name string) error {
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
		{"Do nil fn", func(t *testing.T, s *dsync.Session, name string) error {
			return dsync.NewMutex(s, name).Do(bg, nil)
		}, dsync.ErrInvalidOption},
		{"Lead nil fn", func(t *testing.T, s *dsync.Session, name string) error {
			e := dsync.NewElection(s, name)
			err := e.Lead(bg, "v", nil)
			if e.Term() != 0 {
				t.Errorf("Term after Lead with a nil fn: got %d; want 0 (no campaign)", e.Term())
			}
			return err
		}, dsync.ErrInvalidOption},
		{"LockTx by the owner holding it through Lock", func(t *testing.T, s *dsync.Session, name string) error {
			m, owner := dsync.NewMutex(s, name), dsync.WithOwner(bg)
			mustLock(t, m, owner)
			defer mustUnlock(t, m, owner)
			return m.LockTx(owner, beginTx(t, dbtest.Open(t), sql.LevelDefault))
		}, dsync.ErrDeadlock},
		{"Unlock of a LockTx hold", func(t *testing.T, s *dsync.Session, name string) error {
			m, tx := dsync.NewMutex(s, name), beginTx(t, dbtest.Open(t), sql.LevelDefault)
			if err := m.LockTx(bg, tx); err != nil {
				t.Fatal(err)
			}
			err := m.Unlock(bg)
			if cerr := tx.Commit(); cerr != nil { // which ends the hold
				t.Fatal(cerr)
			}
			return err
		}, dsync.ErrNotOwner},
		{"NewSession on tables of another schema version", func(t *testing.T, _ *dsync.Session, _ string) error {
			db := dbtest.Open(t)
			prefix := freshPrefix("misuse")
			if err := sessionOn(t, db, dsync.WithTablePrefix(prefix)).Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("UPDATE `"+prefix+"schema` SET version = ?", dsync.SchemaVersion+1); err != nil {
				t.Fatal(err)
			}
			_, err := dsync.NewSession(bg, db, dsync.WithTablePrefix(prefix))
			return err
		}, dsync.ErrSchemaVersion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSession(t)
			name := lockName(t)
			err := tt.f(t, s, name)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v; want %v", err, tt.want)
			}
			if n := strings.Count(err.Error(), "dsync:"); n != 1 {
				t.Errorf("got %q (dsync: %d times); want dsync: once", err, n)
			}
			if id := heldBy(t, dbtest.Open(t), name); id == s.ID() {
				t.Fatalf("row %q: got held by this session (%d); want not held", name, id)
			}
		})
	}
}

func mustLock(t testing.TB, m *dsync.Mutex, ctx context.Context) {
	t.Helper()
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("Lock: %v", err)
	}
}

func mustUnlock(t testing.TB, m *dsync.Mutex, ctx context.Context) {
	t.Helper()
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

func TestNewSessionBadOptions(t *testing.T) {
	db := dbtest.Open(t)
	tests := []struct {
		name string
		db   *sql.DB
		opts []dsync.Option
	}{
		{"nil db", nil, nil},
		{"nil option", db, []dsync.Option{nil}},
		{"TTL below 1s", db, []dsync.Option{dsync.WithTTL(999 * time.Millisecond)}},
		{"negative TTL", db, []dsync.Option{dsync.WithTTL(-time.Second)}},
		{"prefix with a dash", db, []dsync.Option{dsync.WithTablePrefix("my-locks_")}},
		{"prefix with a quote", db, []dsync.Option{dsync.WithTablePrefix("x`; DROP TABLE y; --")}},
		{"prefix over 32 chars", db, []dsync.Option{dsync.WithTablePrefix(strings.Repeat("p", 33))}},
		{"nil back-off", db, []dsync.Option{dsync.WithBackOff(nil)}},
		{"nil logger", db, []dsync.Option{dsync.WithLogger(nil)}},
		{"label over 255 bytes", db, []dsync.Option{dsync.WithLabel(strings.Repeat("l", 256))}},
		{"label not UTF-8", db, []dsync.Option{dsync.WithLabel("\xff")}},
		{"negative free-row age", db, []dsync.Option{dsync.WithFreeRowAge(-time.Hour)}},
		{"free-row age below 1s", db, []dsync.Option{dsync.WithFreeRowAge(time.Millisecond)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := dsync.NewSession(context.Background(), tt.db, tt.opts...)
			if s != nil {
				s.Close()
			}
			if !errors.Is(err, dsync.ErrInvalidOption) {
				t.Fatalf("got %v; want ErrInvalidOption", err)
			}
			if n := strings.Count(err.Error(), "dsync:"); n != 1 {
				t.Errorf("got %q (dsync: %d times); want dsync: once", err, n)
			}
		})
	}
	// The good values next to the bad ones work.
	s, err := dsync.NewSession(context.Background(), db, dsync.WithTTL(time.Second),
		dsync.WithTablePrefix(""), dsync.WithLabel("worker-7"), dsync.WithLogger(slog.Default()),
		dsync.WithBackOff(func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }))
	if err != nil {
		t.Fatalf("good options: got %v; want nil", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

//go:build linux

package torture

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync/internal/mariadb"
)

// database is what a run's clients talk to: one server of the run's own
// (single), or the nodes of a Galera cluster (galera_test.go, build tag
// galera). Client process p is given node p % nodes(), through its own
// fault proxy.
type database interface {
	// nodes returns how many nodes there are (1 for a single server).
	nodes() int
	// dsn returns root's DSN straight to node i, selecting dbName ("" for
	// none).
	dsn(i int, dbName string) string
	// crash SIGKILLs the whole database and starts it again after down (the
	// nemesis's server fault); it fails where that is not meaningful.
	crash(ctx context.Context, down time.Duration) error
}

// nodeAddr returns the host:port of the DSN's server.
func nodeAddr(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	return cfg.Addr, nil
}

// single is one MariaDB server of the run's own, started by internal/mariadb.
type single struct{ server *mariadb.Server }

func (s single) nodes() int                      { return 1 }
func (s single) dsn(_ int, dbName string) string { return s.server.DSN(dbName) }

func (s single) crash(ctx context.Context, down time.Duration) error {
	s.server.Kill()
	time.Sleep(down)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return s.server.Restart(rctx)
}

// checkRegisterLog checks, on every node, that the register's log agrees
// with the register: each name's fence is the greatest fence its log has
// (the trigger logged every write that landed, and nothing else), and on
// a cluster that every node has the same log (on Galera, with ROW binlog,
// the trigger runs on the node of the write only and its row is
// replicated like the write's). It returns a line of figures for the run's
// log.
func checkRegisterLog(ctx context.Context, admins []*sql.DB) (string, error) {
	var first, figures string
	for i, db := range admins {
		var rows, names int
		var sum int64
		err := db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT name), COALESCE(SUM(CRC32(CONCAT_WS(',', id, name, fence, k))), 0) FROM torture.torture_log").
			Scan(&rows, &names, &sum)
		if err != nil {
			return "", fmt.Errorf("node %d: read the register's log: %w", i+1, err)
		}
		this := fmt.Sprintf("%d rows on %d names, checksum %d", rows, names, sum)
		if i == 0 {
			first, figures = this, this
		} else if this != first {
			return "", fmt.Errorf("node %d's register log (%s) differs from node 1's (%s)", i+1, this, first)
		}
		r, err := db.QueryContext(ctx, `SELECT r.name, r.fence, COALESCE((SELECT MAX(l.fence) FROM torture.torture_log l WHERE l.name = r.name), 0)
			FROM torture.torture_reg r`)
		if err != nil {
			return "", fmt.Errorf("node %d: read the register: %w", i+1, err)
		}
		var bad []string
		for r.Next() {
			var name string
			var fence, logged int64
			if err := r.Scan(&name, &fence, &logged); err != nil {
				r.Close()
				return "", err
			}
			if fence != logged {
				bad = append(bad, fmt.Sprintf("%s: register %d, log %d", name, fence, logged))
			}
		}
		err = r.Err()
		r.Close()
		if err != nil {
			return "", err
		}
		if len(bad) > 0 {
			return "", fmt.Errorf("node %d: the register's fences differ from its log's greatest: %s", i+1, strings.Join(bad, "; "))
		}
	}
	if len(admins) > 1 {
		figures += ", the same on " + strconv.Itoa(len(admins)) + " nodes"
	}
	return figures, nil
}

// nodeNemesis is a database with faults of its own nodes (a cluster's):
// nemesis injects faults of the given kinds, one at a time, until the
// clients stop, and returns once every node is back.
type nodeNemesis interface {
	nemesis(h *harness, kinds []string)
}

// The node faults of a cluster (galera_test.go): events of Proc -1 with
// G the node (from 0) and Err what proved the fault.
const (
	nemNodeKill  = "nodekill"  // SIGKILL a node, restarted after Dur
	nemPartition = "partition" // cut a node off the others' group communication for Dur
)

func isNodeFault(op string) bool { return op == nemNodeKill || op == nemPartition }

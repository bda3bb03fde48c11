package dsync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/dsynclock/dsync/internal/connpool"
)

// createTables creates whichever of the tables are missing, and checks the
// schema version they were created with. The version table is created (and
// the version recorded) before the others, so tables without it are of a
// dsync older than the version record. A version already recorded is
// checked before any DDL, so that tables of another version are left as
// they are (no table of this version is added beside them). Its errors
// name the step that failed.
func createTables(ctx context.Context, c *connpool.Conn, q *queries) error {
	present, err := tablesPresent(ctx, c, q)
	if err != nil {
		return opErrorf(err, "look for the tables of prefix %q", strings.TrimSuffix(q.tables[0], "schema"))
	}
	schema := q.tables[0]
	if !present[schema] && len(present) > 0 {
		var found []string
		for _, table := range q.tables[1:] {
			if present[table] {
				found = append(found, table)
			}
		}
		// With the empty prefix, another application's table called lock
		// or queue gets here as well as an old dsync's tables.
		return fmt.Errorf("%w: found %s but no version table %s: tables of a dsync before schema version %d, or another application's (give dsync a table prefix of its own: WithTablePrefix)",
			ErrSchemaVersion, strings.Join(found, ", "), schema, schemaVersion)
	}
	if present[schema] && len(present) < len(q.tables) {
		var version int
		err := c.QueryRowContext(ctx, q.version).Scan(&version)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			// Created by a session that has not recorded the version
			// yet; checked again below.
		case err != nil:
			return opErrorf(err, "check the schema version in %s", schema)
		case version != schemaVersion:
			return versionError(q, version)
		}
	}
	for i, table := range q.tables {
		if present[table] {
			continue
		}
		if _, err := c.ExecContext(ctx, q.creates[i]); err != nil {
			if isErrNo(err, errTableAccessDenied) && i == leaderTable && len(present) > 0 {
				// Tables of this version made before Elections, by a DBA
				// (dsync schema), for a user without CREATE: the locks
				// work on; an Election fails with the server's 1146
				// until the table is created.
				continue
			}
			if isErrNo(err, errTableAccessDenied) {
				return opErrorf(err, "create table %s (grant CREATE on it, or have it created from the output of dsync schema)", table)
			}
			return opErrorf(err, "create table %s", table)
		}
		if i == 0 {
			if _, err := c.ExecContext(ctx, q.record, schemaVersion); err != nil {
				return opErrorf(err, "record the schema version in %s", schema)
			}
		}
	}
	var version int
	err = c.QueryRowContext(ctx, q.version).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		// Created by a session that has not recorded the version yet.
		if _, err := c.ExecContext(ctx, q.record, schemaVersion); err != nil {
			return opErrorf(err, "record the schema version in %s", schema)
		}
		err = c.QueryRowContext(ctx, q.version).Scan(&version)
	}
	switch {
	case err != nil:
		return opErrorf(err, "check the schema version in %s", schema)
	case version != schemaVersion:
		return versionError(q, version)
	}
	return nil
}

// leaderTable is the index of the leader table (Elections) in
// queries.tables, the one table a version 6 made before Elections lacks.
const leaderTable = 6

// versionError is the ErrSchemaVersion of tables that record version, and
// says how to move them to this version: the statements that upgrade them
// in place, for the two versions before this one (version 5's upgrade,
// then version 6's), else dropping them.
func versionError(q *queries, version int) error {
	how := "to move to this version, stop the processes that use them, drop the tables of the prefix, and let NewSession create them again"
	switch {
	case version == 5 && schemaVersion == 7:
		how = "to upgrade them in place (the processes that use them may run on; each ALTER waits for the transactions using its table, LockTx's included, and lock statements queue behind it: the SET bounds that wait), run:\n" + q.upgrade5 + "\n" + q.upgrade6
	case version == 6 && schemaVersion == 7:
		how = "to upgrade them in place (the processes that use them may run on; each ALTER waits for the transactions using its table, LockTx's included, and lock statements queue behind it: the SET bounds that wait), run:\n" + q.upgrade6
	case version > schemaVersion:
		how = "they are a newer dsync's: use that version"
	}
	return fmt.Errorf("%w: table %s records version %d, this dsync uses version %d; %s",
		ErrSchemaVersion, q.tables[0], version, schemaVersion, how)
}

// tablesPresent reads which of q's tables exist, keyed by q's names for
// them. A server that compares table names without regard to case
// (lower_case_table_names) may return them in lower case whatever the
// prefix's case: its names are matched to q's without regard to case too.
func tablesPresent(ctx context.Context, c *connpool.Conn, q *queries) (map[string]bool, error) {
	t := q.tables
	rows, err := c.QueryContext(ctx, qTablesPresent, t[0], t[1], t[2], t[3], t[4], t[5], t[6])
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	present := make(map[string]bool)
	for rows.Next() {
		var name string
		var folds bool
		if err := rows.Scan(&name, &folds); err != nil {
			return nil, err
		}
		for _, table := range t {
			if name == table || folds && strings.EqualFold(name, table) {
				present[table] = true
			}
		}
	}
	return present, rows.Err()
}

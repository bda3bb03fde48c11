package dsync

import (
	"regexp"
	"testing"
)

// parenthesizedFirst matches a subquery or derived table whose query
// starts with a parenthesized member, as in FROM ((SELECT …) UNION ALL
// (SELECT …)) t, which MySQL 5.7 and MariaDB up to 10.3 do not parse:
// only a member that needs them (ORDER BY, LIMIT) after the first may be
// in parentheses there.
var parenthesizedFirst = regexp.MustCompile(`(?i)\b(FROM|JOIN|IN|EXISTS|ANY|ALL|SOME)\s*\(\s*\(\s*SELECT\b`)

// TestQueriesParseOnOlderServers: no statement of one session has a
// subquery or derived table that starts with a parenthesized member (the
// servers tests run on parse it; MySQL 5.7 does not).
func TestQueriesParseOnOlderServers(t *testing.T) {
	q := newQueries("dsync_")
	for i, s := range q.prepared {
		if m := parenthesizedFirst.FindString(s); m != "" {
			t.Errorf("statement %d has %q, which MySQL 5.7 does not parse:\n%s", i, m, s)
		}
	}
}

package connpool_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/dsynclock/dsync/internal/connpool"
)

func TestReusable(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, true},
		{sql.ErrNoRows, true},
		{&mysql.MySQLError{Number: 1062}, true},
		{fmt.Errorf("wrapped: %w", &mysql.MySQLError{Number: 1213}), true},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{driver.ErrBadConn, false},
		{errors.New("read tcp: connection reset by peer"), false},
	}
	for _, tt := range tests {
		if got := connpool.Reusable(tt.err); got != tt.want {
			t.Errorf("Reusable(%v): got %v; want %v", tt.err, got, tt.want)
		}
	}
}

// Package connpool keeps a few dedicated database connections, each set up
// once (session variables) and holding its own prepared statements, so that
// a prepared statement costs one round trip and runs under settings the
// caller chose, whatever the DSN of the *sql.DB says.
package connpool

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/go-sql-driver/mysql"
)

// Pool hands out set-up connections. It is safe for concurrent use.
type Pool struct {
	db      *sql.DB
	setup   []string   // statements run once on each new connection
	queries []string   // statements prepared on each new connection
	idle    chan *Conn // connections ready for use

	mu     sync.Mutex
	closed bool // guarded by mu; once true, Put closes what it is given
}

// Conn is one dedicated connection with its prepared statements. It is used
// by one goroutine at a time, between Get and Put.
type Conn struct {
	conn  *sql.Conn
	stmts []*sql.Stmt // indexed like Pool.queries
}

// New returns a pool over db keeping at most maxIdle idle connections.
func New(db *sql.DB, maxIdle int, setup, queries []string) *Pool {
	return &Pool{db: db, setup: setup, queries: queries, idle: make(chan *Conn, maxIdle)}
}

// ErrClosed is returned by Get after Close.
var ErrClosed = errors.New("connpool: closed")

// Get returns an idle connection, or opens and sets up a new one.
func (p *Pool) Get(ctx context.Context) (*Conn, error) {
	select {
	case c := <-p.idle:
		return c, nil
	default:
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	c := &Conn{conn: conn}
	for _, q := range p.setup {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			c.close()
			return nil, err
		}
	}
	for _, q := range p.queries {
		st, err := conn.PrepareContext(ctx, q)
		if err != nil {
			c.close()
			return nil, err
		}
		c.stmts = append(c.stmts, st)
	}
	return c, nil
}

// Put gives c back after a use whose error was err. A connection whose last
// error did not come from the server (a network error, a cancelled context:
// the driver has closed it) is closed instead of kept.
func (p *Pool) Put(c *Conn, err error) {
	if !Reusable(err) {
		c.close()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.close()
		return
	}
	select {
	case p.idle <- c:
	default:
		c.close()
	}
}

// Close closes the idle connections; connections in use are closed when they
// are put back.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for {
		select {
		case c := <-p.idle:
			c.close()
		default:
			return
		}
	}
}

// Reusable reports whether a connection whose last use returned err may be
// used again: true for nil, sql.ErrNoRows and errors reported by the server.
func Reusable(err error) bool {
	var me *mysql.MySQLError
	return err == nil || errors.Is(err, sql.ErrNoRows) || errors.As(err, &me)
}

// Stmt returns the connection's prepared statement number i.
func (c *Conn) Stmt(i int) *sql.Stmt { return c.stmts[i] }

// ExecContext runs a statement that is not prepared on the connection.
func (c *Conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.conn.ExecContext(ctx, query, args...)
}

func (c *Conn) close() {
	for _, st := range c.stmts {
		st.Close()
	}
	c.conn.Close()
}

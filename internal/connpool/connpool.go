// Package connpool keeps a small, fixed maximum of dedicated database
// connections taken from a caller's *sql.DB, each set up once (session
// variables) and holding its own prepared statements, so that a prepared
// statement costs one round trip and runs under settings the pool chose,
// whatever the DSN of the *sql.DB says.
//
// A connection never goes back to the caller's pool carrying those
// settings: when the pool is done with one (an error left it in an unknown
// state, or the pool closed) it is discarded, not returned.
//
// Priority users (lease renewals) are served before others, and when the
// pool may hold two or more connections, one of them is kept for priority
// users alone, so a renewal never waits behind lock statements, unless
// [Pool.KeepReserve] turned that off (the priority users have connections
// of their own).
package connpool

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Pool hands out set-up connections. It is safe for concurrent use.
type Pool struct {
	db      *sql.DB
	setup   []string // statements run once on each new connection
	queries []string // statements prepared on a connection at first use
	eager   []int    // indexes of queries prepared when a connection opens

	mu        sync.Mutex
	size      int       // guarded by mu; most connections open at once, at least 1
	normalMax int       // guarded by mu; see LimitNormal
	noReserve bool      // guarded by mu; no connection is kept for priority users (see KeepReserve)
	idle      []*Conn   // guarded by mu; ready for use
	open      int       // guarded by mu; connections open or being opened
	normal    int       // guarded by mu; of those, in use by non-priority users
	prio      int       // guarded by mu; of those, in use by priority users
	reserve   *Conn     // guarded by mu; an idle connection for priority users only
	waiting   []*waiter // guarded by mu; priority waiters first, each FIFO
	closed    bool      // guarded by mu; once true, Put discards what it is given

	dedicatedMax int // guarded by mu; most connections from Dedicated open at once; 0: no cap (see LimitDedicated)
	dedicated    int // guarded by mu; connections from Dedicated open or being opened

	refusedUntil time.Time     // guarded by mu; until then Get opens no connection for a non-priority user: the server refused one (1040)
	refusedErr   error         // guarded by mu; the server's refusal, which Get returns meanwhile
	refusedWait  time.Duration // guarded by mu; the last such wait; 0: the last connection opened

	idleFor   time.Duration // guarded by mu; an idle connection is closed after this long; 0: never (see CloseIdleAfter)
	idleTimer *time.Timer   // guarded by mu; runs closeIdle while connections are idle and idleFor is set
}

// waiter is a Get blocked until a connection, or room to open one, is
// handed to it on ch (nil: open one, the slot is counted already).
type waiter struct {
	priority bool
	ch       chan *Conn
}

// Conn is one dedicated connection with its prepared statements. It is used
// by one goroutine at a time, between Get and Put.
type Conn struct {
	conn     *sql.Conn
	stmts    []*sql.Stmt // indexed like Pool.queries; nil until first use
	priority bool        // the current use is a priority one
	counted  *Pool       // the pool whose count of dedicated connections c is in (see Dedicated); nil: none
	idleAt   time.Time   // when it was last put back idle (see CloseIdleAfter)
}

// New returns a pool over db that opens at most size connections (at least
// 1). When size is 2 or more, non-priority users get at most size-1 of them.
// Each new connection runs the setup statements, then prepares the queries
// numbered in eager (the others are prepared at first use).
func New(db *sql.DB, size int, setup, queries []string, eager ...int) *Pool {
	return &Pool{db: db, setup: setup, queries: queries, eager: eager, size: max(size, 1)}
}

// Resize sets the most connections the pool opens at once (at least 1).
// When it shrinks, connections in use beyond it are discarded as they come
// back, idle ones at once.
func (p *Pool) Resize(size int) {
	p.mu.Lock()
	p.size = max(size, 1)
	var drop []*Conn
	for p.open > p.size && len(p.idle) > 0 {
		drop = append(drop, p.idle[len(p.idle)-1])
		p.idle = p.idle[:len(p.idle)-1]
		p.open--
	}
	p.dispatchLocked()
	p.mu.Unlock()
	for _, c := range drop {
		c.discard()
	}
}

// ErrClosed is returned by Get after Close.
var ErrClosed = errors.New("connpool: closed")

// normalCap is the most connections non-priority users may hold at once:
// all of them when the pool holds one or keeps no reserve, else at most
// size-1, and at most normalMax when that is set.
func (p *Pool) normalCap() int {
	if p.size == 1 {
		return 1
	}
	if p.noReserve {
		if p.normalMax > 0 {
			return min(p.size, p.normalMax)
		}
		return p.size
	}
	if p.normalMax > 0 {
		return min(p.size-1, p.normalMax)
	}
	return p.size - 1
}

// LimitNormal caps the connections non-priority users may hold at once
// (0: size-1), so that the rest of the pool serves priority users.
func (p *Pool) LimitNormal(n int) {
	p.mu.Lock()
	p.normalMax = n
	p.mu.Unlock()
}

// KeepReserve sets whether the pool keeps one connection for priority users
// (the default): with keep false, every connection serves every user, and
// a kept reserve becomes an ordinary idle connection.
func (p *Pool) KeepReserve(keep bool) {
	p.mu.Lock()
	p.noReserve = !keep
	if p.noReserve && p.reserve != nil {
		p.idle = append(p.idle, p.reserve)
		p.reserve = nil
	}
	p.dispatchLocked()
	p.mu.Unlock()
}

// count adds d to the connections held (or being opened) by priority or
// non-priority users. Called with mu held.
func (p *Pool) count(priority bool, d int) {
	if priority {
		p.prio += d
	} else {
		p.normal += d
	}
}

// takeIdle returns a ready connection for a user, or nil: a priority user
// takes the reserve first, then any idle connection; a non-priority user
// takes idle connections only, never the reserve. Called with mu held.
func (p *Pool) takeIdle(priority bool) *Conn {
	if priority && p.reserve != nil {
		c := p.reserve
		p.reserve = nil
		return c
	}
	if n := len(p.idle); n > 0 {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return c
	}
	return nil
}

// Get returns an idle connection, opens and sets up a new one when the pool
// has room, or waits (priority users first) until one is put back, ctx ends
// (ctx's error) or the pool closes ([ErrClosed]).
func (p *Pool) Get(ctx context.Context, priority bool) (*Conn, error) {
	p.mu.Lock()
	for !p.closed && (priority || p.normal < p.normalCap()) {
		c := p.takeIdle(priority)
		if c == nil {
			break
		}
		p.count(priority, 1)
		p.mu.Unlock()
		if c.Alive(ctx) {
			c.priority = priority
			return c, nil
		}
		// The server or the network closed it while it was idle
		// (wait_timeout, a proxy): drop it, nothing was sent on it.
		c.discard()
		p.mu.Lock()
		p.open--
		p.count(priority, -1)
	}
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if !priority && p.open < p.size && time.Now().Before(p.refusedUntil) {
		// The server refused the last connection (too many connections):
		// a non-priority user is told so at once, for a while, instead of
		// each opening one more to be refused.
		err := p.refusedErr
		p.mu.Unlock()
		return nil, err
	}
	if (priority || p.normal < p.normalCap()) && p.open < p.size {
		p.open++
		p.count(priority, 1)
		p.mu.Unlock()
		return p.dial(ctx, priority)
	}
	w := &waiter{priority: priority, ch: make(chan *Conn, 1)}
	if priority {
		i := 0
		for i < len(p.waiting) && p.waiting[i].priority {
			i++
		}
		p.waiting = append(p.waiting[:i], append([]*waiter{w}, p.waiting[i:]...)...)
	} else {
		p.waiting = append(p.waiting, w)
	}
	p.mu.Unlock()

	select {
	case c, ok := <-w.ch:
		switch {
		case !ok:
			return nil, ErrClosed
		case c == nil:
			return p.dial(ctx, priority)
		case !c.Alive(ctx):
			c.discard() // its slot, already counted, opens a new one
			return p.dial(ctx, priority)
		}
		c.priority = priority
		return c, nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
			p.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	p.mu.Unlock()
	// Handed a connection (or a slot) just as the wait stopped, or the pool
	// closed: give it back.
	c, ok := <-w.ch
	switch {
	case !ok:
	case c == nil:
		p.mu.Lock()
		p.open--
		p.count(priority, -1)
		p.dispatchLocked()
		p.mu.Unlock()
	default:
		c.priority = priority
		p.Put(c, nil)
	}
	return nil, ctx.Err()
}

// dial opens and sets up a connection in a slot already counted in open
// and by count; on failure it gives the slot back.
func (p *Pool) dial(ctx context.Context, priority bool) (*Conn, error) {
	c, err := p.connect(ctx)
	p.mu.Lock()
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me) && me.Number == tooManyConnections:
		p.refusedWait = min(max(2*p.refusedWait, refusedMin), refusedMax)
		p.refusedUntil, p.refusedErr = time.Now().Add(p.refusedWait), err
	case err == nil:
		p.refusedWait = 0
	}
	if err != nil {
		p.open--
		p.count(priority, -1)
		p.dispatchLocked()
		p.mu.Unlock()
		return nil, err
	}
	p.mu.Unlock()
	c.priority = priority
	return c, nil
}

// After the server refuses a connection (tooManyConnections), Get opens
// none for non-priority users for refusedMin, doubling while the server
// goes on refusing, up to refusedMax.
const (
	tooManyConnections = 1040
	refusedMin         = 100 * time.Millisecond
	refusedMax         = 2 * time.Second
)

func (p *Pool) connect(ctx context.Context) (*Conn, error) {
	conn, err := p.db.Conn(ctx)
	if err != nil {
		return nil, ctxError(ctx, err)
	}
	c := &Conn{conn: conn, stmts: make([]*sql.Stmt, len(p.queries))}
	for _, q := range p.setup {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			c.discard()
			return nil, ctxError(ctx, err)
		}
	}
	for _, i := range p.eager {
		// A server error (the table does not exist yet) leaves the
		// statement to be prepared at first use.
		if _, err := c.Stmt(ctx, p, i); err != nil && !Reusable(err) {
			c.discard()
			return nil, ctxError(ctx, err)
		}
	}
	return c, nil
}

// ctxError returns err wrapped with ctx's error when ctx has ended, or its
// deadline has passed: a dial bounded by the deadline fails with an i/o
// timeout that may come just before ctx reports its end.
func ctxError(ctx context.Context, err error) error {
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); cerr == nil && ok && !time.Now().Before(dl) {
		cerr = context.DeadlineExceeded
	}
	if cerr == nil || errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w (%w)", cerr, err)
}

// dispatchLocked hands idle connections, and room to open new ones, to
// waiters in their order (priority waiters first): a priority waiter may
// have the reserve or any idle connection, a non-priority one idle
// connections only, and only while non-priority users hold fewer than
// normalCap. Called with mu held after any change those depend on.
func (p *Pool) dispatchLocked() {
	if p.closed {
		return
	}
	for i := 0; i < len(p.waiting); {
		w := p.waiting[i]
		if !w.priority && p.normal >= p.normalCap() {
			i++
			continue
		}
		c := p.takeIdle(w.priority)
		if c == nil {
			if p.open >= p.size {
				i++
				continue
			}
			p.open++ // a slot: the waiter opens a connection
		}
		p.waiting = append(p.waiting[:i], p.waiting[i+1:]...)
		p.count(w.priority, 1)
		w.ch <- c // buffered: never blocks
	}
}

// Put gives c back after a use whose error was err. A connection whose last
// use did not end cleanly (an error that did not come from the server: the
// driver may have closed it, or a statement may still be running on it) is
// discarded instead of kept; so is every connection once the pool is closed.
// When the pool may hold two or more connections and no priority user has
// one, the connection becomes the reserve, which only priority users take.
func (p *Pool) Put(c *Conn, err error) {
	p.mu.Lock()
	p.count(c.priority, -1)
	if !Reusable(err) || p.closed || p.open > p.size {
		p.open--
		p.dispatchLocked()
		p.mu.Unlock()
		c.discard()
		return
	}
	if p.needReserve() {
		p.reserve = c
	} else {
		c.idleAt = time.Now()
		p.idle = append(p.idle, c)
		if p.idleFor > 0 && p.idleTimer == nil {
			p.idleTimer = time.AfterFunc(p.idleFor, p.closeIdle)
		}
	}
	p.dispatchLocked()
	p.mu.Unlock()
}

// CloseIdleAfter makes the pool close a connection that has sat idle (not
// the reserve) for d; 0, the default, keeps idle connections open. A
// pool whose users have connections of their own to run statements on
// first keeps only what their bursts need.
func (p *Pool) CloseIdleAfter(d time.Duration) {
	p.mu.Lock()
	p.idleFor = d
	if d > 0 && len(p.idle) > 0 && p.idleTimer == nil && !p.closed {
		p.idleTimer = time.AfterFunc(d, p.closeIdle)
	}
	p.mu.Unlock()
}

// closeIdle closes the connections idle for idleFor or longer, and runs
// again when the oldest of the others is due.
func (p *Pool) closeIdle() {
	p.mu.Lock()
	p.idleTimer = nil
	if p.closed || p.idleFor <= 0 {
		p.mu.Unlock()
		return
	}
	// idle is kept in the order connections were put back, and Get takes
	// the newest: the oldest come first.
	now := time.Now()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleAt) >= p.idleFor {
		n++
	}
	drop := append([]*Conn(nil), p.idle[:n]...)
	p.idle = append(p.idle[:0], p.idle[n:]...)
	p.open -= n
	if len(p.idle) > 0 {
		p.idleTimer = time.AfterFunc(p.idle[0].idleAt.Add(p.idleFor).Sub(now), p.closeIdle)
	}
	p.dispatchLocked()
	p.mu.Unlock()
	for _, c := range drop {
		c.discard()
	}
}

// needReserve reports whether a connection put back should be kept for
// priority users: the pool may hold two or more, and no priority user has
// one or the reserve. Called with mu held.
func (p *Pool) needReserve() bool {
	return !p.noReserve && p.size >= 2 && p.reserve == nil && p.prio == 0
}

// Close discards the idle connections; connections in use are discarded
// when they are put back. Waiting Gets return [ErrClosed].
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	if p.idleTimer != nil {
		p.idleTimer.Stop()
		p.idleTimer = nil
	}
	idle := p.idle
	if p.reserve != nil {
		idle = append(idle, p.reserve)
		p.reserve = nil
	}
	p.idle = nil
	p.open -= len(idle)
	for _, w := range p.waiting {
		close(w.ch)
	}
	p.waiting = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.discard()
	}
}

// Open returns the number of connections the pool has open or is opening.
func (p *Pool) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

// Reusable reports whether a connection whose last use returned err may be
// used again: true for nil, sql.ErrNoRows and errors reported by the server.
func Reusable(err error) bool {
	var me *mysql.MySQLError
	return err == nil || errors.Is(err, sql.ErrNoRows) || errors.As(err, &me)
}

// Stmt returns the connection's prepared statement number i, preparing it
// on first use.
func (c *Conn) Stmt(ctx context.Context, p *Pool, i int) (*sql.Stmt, error) {
	if st := c.stmts[i]; st != nil {
		return st, nil
	}
	st, err := c.conn.PrepareContext(ctx, p.queries[i])
	if err != nil {
		return nil, err
	}
	c.stmts[i] = st
	return st, nil
}

// ExecContext runs a statement that is not prepared on the connection.
func (c *Conn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.conn.ExecContext(ctx, query, args...)
}

// QueryRowContext runs a query that is not prepared on the connection.
func (c *Conn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return c.conn.QueryRowContext(ctx, query, args...)
}

// Alive reports whether c is still usable, by the driver's own check of an
// idle connection (a non-blocking read of its socket, unless the DSN turned
// checkConnLiveness off; no round trip).
func (c *Conn) Alive(ctx context.Context) bool {
	err := c.conn.Raw(func(dc any) error {
		if r, ok := dc.(driver.SessionResetter); ok {
			return r.ResetSession(ctx)
		}
		return nil
	})
	return err == nil
}

// discard closes c's statements and closes the connection itself, rather
// than returning it to the *sql.DB's pool, so that the session variables
// set on it never reach the pool's other users.
func (c *Conn) discard() {
	for _, st := range c.stmts {
		if st != nil {
			st.Close()
		}
	}
	// Returning driver.ErrBadConn from Raw makes database/sql close the
	// driver connection instead of pooling it.
	_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	c.conn.Close()
}

// QueryContext runs a query that is not prepared on the connection.
func (c *Conn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.conn.QueryContext(ctx, query, args...)
}

// ErrNoRoom is returned by Dedicated when the pool's cap on dedicated
// connections is reached (see [Pool.LimitDedicated]).
var ErrNoRoom = errors.New("connpool: no room for another dedicated connection")

// LimitDedicated caps the connections from Dedicated open at once (0: no
// cap), so that they and the pool's own stay within a share of the
// *sql.DB's connection limit. Connections open beyond a lowered cap stay
// open until closed.
func (p *Pool) LimitDedicated(n int) {
	p.mu.Lock()
	p.dedicatedMax = n
	p.mu.Unlock()
}

// Dedicated opens a connection set up like the pool's, outside the pool's
// own count: the caller keeps it for as long as it likes (a connection that
// holds a named lock, or waits for one) and closes it with [Conn.Close].
// Its statements are the pool's queries, prepared at first use. It returns
// [ErrNoRoom] when the cap of [Pool.LimitDedicated] is reached.
func (p *Pool) Dedicated(ctx context.Context) (*Conn, error) {
	return p.DedicatedSpare(ctx, 0)
}

// DedicatedSpare is Dedicated that also leaves spare connections of the
// cap of [Pool.LimitDedicated] to others (the connections that waiters
// block on, where the holders' doorbells would take them all).
//
// It takes an idle connection of the pool's own (not the reserve), when
// there is one, instead of opening a new one: it leaves the pool's count
// for the dedicated one.
func (p *Pool) DedicatedSpare(ctx context.Context, spare int) (*Conn, error) {
	p.mu.Lock()
	if p.dedicatedMax > 0 && p.dedicated+spare >= p.dedicatedMax {
		p.mu.Unlock()
		return nil, ErrNoRoom
	}
	p.dedicated++
	var adopted *Conn
	if n := len(p.idle); n > 0 && !p.closed {
		adopted = p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.open--
		p.dispatchLocked() // room for a waiter of the pool to open one
	}
	p.mu.Unlock()
	if adopted != nil {
		if adopted.Alive(ctx) {
			adopted.counted = p
			return adopted, nil
		}
		adopted.discard() // the server or the network closed it while idle
	}
	c, err := p.connect(ctx)
	if err != nil {
		p.mu.Lock()
		p.dedicated--
		p.mu.Unlock()
		return nil, err
	}
	c.counted = p
	return c, nil
}

// DedicatedOpen returns how many connections from Dedicated are open or
// being opened.
func (p *Pool) DedicatedOpen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dedicated
}

// Close closes a connection from [Pool.Dedicated] without returning it to
// the *sql.DB's pool.
func (c *Conn) Close() {
	if p := c.counted; p != nil {
		c.counted = nil
		p.mu.Lock()
		p.dedicated--
		p.mu.Unlock()
	}
	c.discard()
}

// Kept keeps dedicated connections (see [Pool.Dedicated]) for reuse by
// one owner, with a cap on how many Get opens at once, idle or in use (Open
// opens one whatever the cap). Its zero value is empty and open. It is safe
// for concurrent use.
type Kept struct {
	mu     sync.Mutex
	idle   []*Conn // guarded by mu
	open   int     // guarded by mu; connections open, idle or in use
	closed bool    // guarded by mu; keep none from now on
}

// Get returns an idle connection (the one kept last), or opens one of p's
// dedicated connections while fewer than most are open. It returns nil
// when most are open, after Close, or when none can be opened.
func (k *Kept) Get(ctx context.Context, p *Pool, most int) *Conn {
	c, _ := k.GetErr(ctx, p, most)
	return c
}

// GetErr is Get that also returns the error of a connection it could not
// open (nil when it opened none: most are open, or after Close).
func (k *Kept) GetErr(ctx context.Context, p *Pool, most int) (*Conn, error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, nil
	}
	if n := len(k.idle); n > 0 {
		c := k.idle[n-1]
		k.idle = k.idle[:n-1]
		k.mu.Unlock()
		return c, nil
	}
	if k.open >= most {
		k.mu.Unlock()
		return nil, nil
	}
	k.open++
	k.mu.Unlock()
	c, err := p.Dedicated(ctx)
	if err != nil {
		k.mu.Lock()
		k.open--
		k.mu.Unlock()
		return nil, err
	}
	return c, nil
}

// Count returns how many connections from Get and Open are open, idle or
// in use.
func (k *Kept) Count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.open
}

// InUse returns how many connections from Get have not been put back.
func (k *Kept) InUse() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.open - len(k.idle)
}

// Put gives back c, from Get: it keeps it for the next Get when keep is
// set and Close was not called, else closes it.
func (k *Kept) Put(c *Conn, keep bool) { k.PutIdle(c, keep, math.MaxInt) }

// Close closes the idle connections and keeps none from now on: those in
// use are closed when put back, and Get returns nil.
func (k *Kept) Close() {
	k.mu.Lock()
	k.closed = true
	idle := k.idle
	k.idle = nil
	k.open -= len(idle)
	k.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// Idle returns the connection kept last, or nil when none is kept;
// unlike Get it never opens one.
func (k *Kept) Idle() *Conn {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := len(k.idle)
	if n == 0 {
		return nil
	}
	c := k.idle[n-1]
	k.idle = k.idle[:n-1]
	return c
}

// Open opens one of p's dedicated connections as Get does, but with no
// cap on how many are open, and returns the error when it cannot. Give it
// back with Put or PutIdle.
func (k *Kept) Open(ctx context.Context, p *Pool) (*Conn, error) {
	c, err := p.Dedicated(ctx)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.open++
	k.mu.Unlock()
	return c, nil
}

// PutIdle gives back c as Put does, but keeps it only while fewer than
// most connections are idle.
func (k *Kept) PutIdle(c *Conn, keep bool, most int) {
	k.mu.Lock()
	if keep && !k.closed && len(k.idle) < most {
		k.idle = append(k.idle, c)
		k.mu.Unlock()
		return
	}
	k.open--
	k.mu.Unlock()
	c.Close()
}

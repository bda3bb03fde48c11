// Package faultproxy is a TCP proxy for fault tests. It listens on a
// loopback port, forwards each connection to an upstream server (a MariaDB
// server, in dsync's tests) and, on demand, delays the bytes, drops them
// all as a network gone dark would, or loses one reply so that a statement
// runs on the server while its client never learns the outcome.
//
// The proxy forwards bytes in chunks, as its reads return them, and knows
// nothing of the protocol above TCP.
package faultproxy

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// chunkSize is the largest chunk read from one side in one go.
const chunkSize = 32 << 10

// queueLen is how many chunks may wait in one direction of one connection
// before the proxy stops reading from its source.
const queueLen = 64

// Proxy forwards TCP connections from [Proxy.Addr] to an upstream address,
// with faults injected by [Proxy.SetLatency], [Proxy.Cut], [Proxy.Refuse]
// and [Proxy.DropNextReply]. Create it with [New] (the zero value is not
// usable) and release it with [Proxy.Close]. Its methods are safe for
// concurrent use.
type Proxy struct {
	upstream string
	ln       net.Listener
	ctx      context.Context // ends at Close; bounds dials to upstream
	cancel   context.CancelFunc
	wg       sync.WaitGroup // every goroutine the proxy started

	latency atomic.Int64 // time.Duration added to each chunk, each way; >= 0
	cut     atomic.Bool  // all bytes are dropped while set
	refuse  atomic.Bool  // new connections are closed at once while set

	mu        sync.Mutex
	links     map[*link]struct{} // open connections; guarded by mu
	closed    bool               // Close was called; guarded by mu
	dropArmed bool               // the next reply is to be dropped; guarded by mu
	dropped   chan struct{}      // closed when the armed reply is dropped; guarded by mu

	// Counts for Stats.
	accepted  atomic.Int64
	toServer  atomic.Int64
	toClient  atomic.Int64
	lostBytes atomic.Int64
}

// Stats counts a proxy's traffic since [New].
type Stats struct {
	Accepted int64 // client connections accepted
	ToServer int64 // bytes forwarded from clients to the upstream server
	ToClient int64 // bytes forwarded from the upstream server to clients
	Dropped  int64 // bytes dropped by Cut or DropNextReply
}

// link is one proxied connection: a client and its upstream connection.
type link struct {
	client, server net.Conn
	done           chan struct{} // closed by close
	once           sync.Once
	blackholed     atomic.Bool  // server-to-client bytes are dropped (DropNextReply)
	ended          atomic.Int32 // directions whose end of stream has been handled
}

// close closes both connections, ending all of the link's goroutines.
func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		l.client.Close()
		l.server.Close()
	})
}

// chunk is a run of bytes read from one side, or the end of its stream.
type chunk struct {
	data []byte    // the bytes; none at the end
	end  bool      // the end of the stream (EOF or a read error)
	drop bool      // for an end: it was read while dropping (Cut, black hole)
	due  time.Time // when to write it: read time plus latency
}

// New starts a proxy on a free 127.0.0.1 port that forwards every
// connection to upstream ("host:port"), dialled when the client connects.
// It returns an error for an address that is not host:port or when it
// cannot listen.
func New(upstream string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(upstream); err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q: %w", upstream, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		upstream: upstream,
		ln:       ln,
		ctx:      ctx,
		cancel:   cancel,
		links:    make(map[*link]struct{}),
		dropped:  make(chan struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's listening address, "127.0.0.1:port", for
// clients to dial instead of the upstream address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every chunk of bytes by d in each direction, so that a
// request and its reply take at least 2d longer. A chunk read at time t is
// written at t+d, in order, however many chunks are in flight: throughput
// is not cut to one chunk per d. The new latency applies to chunks read
// from now on; d <= 0 means none.
func (p *Proxy) SetLatency(d time.Duration) {
	p.latency.Store(int64(max(d, 0)))
}

// Cut, while cut is true, silently drops all bytes in both directions,
// including those read earlier but still delayed by the latency, and the
// ends of streams: connections stay open, as on a network gone dark.
// Cut(false) forwards the bytes read from then on. A connection that lost
// bytes mid-stream is usually of no further use to its client; new
// connections work normally.
func (p *Proxy) Cut(cut bool) { p.cut.Store(cut) }

// Refuse, while refuse is true, closes each new client connection as soon
// as it is accepted, without dialling upstream: a server that is down, as
// its clients see it (every connection fails at once). Connections open
// before are left as they are (see Cut). Refused connections count in
// Accepted.
func (p *Proxy) Refuse(refuse bool) { p.refuse.Store(refuse) }

// DropNextReply drops the next chunk of bytes that the upstream server
// sends, on any connection, after this call, and from then on every byte
// and the end of stream that the server sends on that connection: the
// client never gets its reply, although its request reached the server and
// the client's further bytes still do. The returned channel is closed once
// a chunk has been dropped. Calling DropNextReply again before that returns
// the same channel; only one reply is dropped.
func (p *Proxy) DropNextReply() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropArmed {
		p.dropArmed = true
		p.dropped = make(chan struct{})
	}
	return p.dropped
}

// Stats returns the proxy's traffic counts so far.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted: p.accepted.Load(),
		ToServer: p.toServer.Load(),
		ToClient: p.toClient.Load(),
		Dropped:  p.lostBytes.Load(),
	}
}

// Close stops listening, closes every connection in both directions and
// returns once all of the proxy's goroutines have ended. Calling it again
// does nothing and returns nil.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()

	err := p.ln.Close()
	p.cancel()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

// accept accepts client connections until Close.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			// A transient error such as too many open files: back off.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.accepted.Add(1)
		if p.refuse.Load() {
			client.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve dials upstream for client and forwards between the two until both
// streams have ended, either side fails, or Close.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	d := net.Dialer{Timeout: 10 * time.Second}
	server, err := d.DialContext(p.ctx, "tcp", p.upstream)
	if err != nil {
		client.Close()
		return
	}
	l := &link{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()

	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() { defer pipes.Done(); p.pipe(l, client, server, true) }()
	go func() { defer pipes.Done(); p.pipe(l, server, client, false) }()
	pipes.Wait()
	l.close()

	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// pipe forwards one direction of l, from src to dst, through a queue that
// holds each chunk until it is due: a reader and a writer, so that reading
// goes on while chunks wait out the latency.
func (p *Proxy) pipe(l *link, src, dst net.Conn, toServer bool) {
	queue := make(chan chunk, queueLen)
	var writer sync.WaitGroup
	writer.Add(1)
	go func() { defer writer.Done(); p.write(l, dst, queue, toServer) }()
	p.read(l, src, queue, toServer)
	writer.Wait()
}

// read reads chunks from src and queues those not dropped, stamped with
// when they are due, followed by the end of the stream.
func (p *Proxy) read(l *link, src net.Conn, queue chan<- chunk, toServer bool) {
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.dropOnRead(l, toServer, true) {
				p.lostBytes.Add(int64(n))
			} else {
				c := chunk{data: append([]byte(nil), buf[:n]...), due: p.due()}
				select {
				case queue <- c:
				case <-l.done:
					return
				}
			}
		}
		if err != nil {
			// The end of the stream, or an error: either ends this
			// direction. A dropped end is queued too, for the writer to
			// count it.
			c := chunk{end: true, drop: p.dropOnRead(l, toServer, false), due: p.due()}
			select {
			case queue <- c:
			case <-l.done:
			}
			return
		}
	}
}

// due returns when a chunk read now is to be written.
func (p *Proxy) due() time.Time {
	return time.Now().Add(time.Duration(p.latency.Load()))
}

// dropOnRead reports whether a chunk just read (data, or else the end of
// the stream) in the given direction is to be dropped. When it is the
// reply that DropNextReply asked for, it black-holes the link's
// server-to-client direction and reports the drop.
func (p *Proxy) dropOnRead(l *link, toServer, data bool) bool {
	if p.cut.Load() {
		return true
	}
	if toServer {
		return false
	}
	if l.blackholed.Load() {
		return true
	}
	if !data {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropArmed {
		return false
	}
	p.dropArmed = false
	l.blackholed.Store(true)
	close(p.dropped)
	return true
}

// write writes the queued chunks to dst as they fall due, dropping those
// due while the proxy is cut. At the end of the stream it half-closes dst
// (unless that end is dropped) and, once both directions of the link have
// ended, closes the link. A write error closes the link.
func (p *Proxy) write(l *link, dst net.Conn, queue <-chan chunk, toServer bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var c chunk
		select {
		case c = <-queue:
		case <-l.done:
			return
		}
		if wait := time.Until(c.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if c.end {
			if !c.drop && !p.cut.Load() {
				if tcp, ok := dst.(*net.TCPConn); ok {
					_ = tcp.CloseWrite()
				}
			}
			if l.ended.Add(1) == 2 {
				l.close()
			}
			return
		}
		if p.cut.Load() {
			p.lostBytes.Add(int64(len(c.data)))
			continue
		}
		n, err := dst.Write(c.data)
		if toServer {
			p.toServer.Add(int64(n))
		} else {
			p.toClient.Add(int64(n))
		}
		if err != nil {
			l.close()
			return
		}
	}
}

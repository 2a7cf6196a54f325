package testenv

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy between a test's clients and one dependency, which
// fails the network on demand: Cut resets every connection, Blackhole hangs
// them, Flaky resets a fraction of them, Restore heals. Clients connect to Addr instead of the dependency.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // cancelled on Cleanup: ends pending dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the proxy

	mu      sync.Mutex
	state   proxyState
	resetP  float64               // while forwarding: probability of resetting at a chunk
	changed chan struct{}         // closed, and replaced, at every change of state
	conns   map[net.Conn]struct{} // open connections, both sides
	resets  atomic.Int64          // connections Flaky reset
}

type proxyState int

const (
	forwarding proxyState = iota
	cut
	blackholed
	closed
)

// StartProxy starts a proxy to target (host:port) on a free 127.0.0.1 port,
// forwarding. Each accepted connection gets its own connection to target;
// one that target refuses is reset. Cleanup closes every connection and
// waits for the proxy's goroutines to end.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target:  target,
		ln:      ln,
		ctx:     ctx,
		cancel:  cancel,
		changed: make(chan struct{}),
		conns:   make(map[net.Conn]struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address, 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut resets every open connection (both sides, RST) and, until Restore,
// every new one as soon as it is accepted: clients see the dependency as
// gone. Once Cut returns, no byte passes the proxy.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.state == closed {
		p.mu.Unlock()
		return
	}
	p.setLocked(cut)
	conns := p.conns
	p.conns = make(map[net.Conn]struct{})
	p.mu.Unlock()
	for c := range conns {
		abort(c)
	}
}

// Blackhole hangs the dependency: until Restore or Cut, connections stay
// open and new ones are accepted, but no byte and no close is forwarded in
// either direction, and new connections do not reach the target. What
// clients send is held, not lost: after Restore it is delivered, as after a
// healed network partition. Bytes already being written when Blackhole is
// called may still arrive.
func (p *Proxy) Blackhole() { p.set(blackholed) }

// Restore forwards again: held bytes and connections accepted while
// blackholed go through; connections reset by Cut or Flaky stay closed.
func (p *Proxy) Restore() { p.set(forwarding) }

// Flaky forwards, but resets connections at random, as a lossy network or a
// middlebox does: until Restore or Cut, each chunk of bytes read from either
// side is, with probability prob (0 to 1), dropped and its connection reset
// on both sides (RST). A chunk is what one read returned, so small
// exchanges (one query, its reply) are usually one chunk each way.
func (p *Proxy) Flaky(prob float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != closed {
		p.setLocked(forwarding)
		p.resetP = prob
	}
}

// Resets returns how many connections Flaky has reset so far (a test
// counts only if its fault fired).
func (p *Proxy) Resets() int64 { return p.resets.Load() }

func (p *Proxy) set(s proxyState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != closed {
		p.setLocked(s)
	}
}

func (p *Proxy) setLocked(s proxyState) {
	p.state = s
	p.resetP = 0
	close(p.changed)
	p.changed = make(chan struct{})
}

// pass waits while the proxy is blackholed and reports whether bytes may be
// forwarded: false once it is cut or closed, when the connection at hand
// has been (or is being) reset.
func (p *Proxy) pass() bool {
	for {
		p.mu.Lock()
		s, changed := p.state, p.changed
		p.mu.Unlock()
		switch s {
		case forwarding:
			return true
		case blackholed:
			<-changed
		default:
			return false
		}
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	if p.state == closed {
		p.mu.Unlock()
		return
	}
	p.setLocked(closed)
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()

	p.ln.Close()
	p.cancel()
	for c := range conns {
		abort(c)
	}
	p.wg.Wait()
}

// track registers c, or resets it if the proxy is cut or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	if p.state == cut || p.state == closed {
		p.mu.Unlock()
		abort(c)
		return false
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c) // a nil map after close: no-op
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of file descriptors, say: wait, not spin
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if p.track(c) {
			p.wg.Add(1)
			go p.handle(c)
		}
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	if !p.pass() { // a blackholed dependency is not even dialed
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		abort(client) // as close as we get to "connection refused"
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)

	p.wg.Add(1)
	done := make(chan struct{})
	go func() {
		defer p.wg.Done()
		defer close(done)
		p.pipe(server, client)
	}()
	p.pipe(client, server)
	<-done
}

// pipe copies src to dst until src ends, passing src's EOF on as a
// half-close. An error on either side resets both, which also ends the
// pipe in the other direction.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if p.unlucky() {
				p.resets.Add(1)
				abort(src)
				abort(dst)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				abort(src)
				abort(dst)
				return
			}
		}
		if err != nil {
			if !p.pass() {
				return
			}
			if errors.Is(err, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
				return
			}
			abort(src)
			abort(dst)
			return
		}
	}
}

// unlucky reports whether a flaky proxy resets the connection at this chunk.
func (p *Proxy) unlucky() bool {
	p.mu.Lock()
	prob := p.resetP
	p.mu.Unlock()
	return prob > 0 && rand.Float64() < prob
}

// abort closes c with a reset rather than an orderly FIN, as a broken
// network or a crashed peer does.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

package testenv

import (
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ResetProxy is a TCP proxy to one dependency that resets connections at
// random while the dependency stays up, as a flaky network does: each
// segment it forwards (one read, either direction) is, with the
// probability set by SetResetRate, replaced by a reset of both sides.
// Its methods are safe for concurrent use.
type ResetProxy struct {
	target string
	ln     net.Listener
	rate   atomic.Uint64 // math.Float64bits of the probability
	resets atomic.Int64
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// StartResetProxy starts a proxy to target on a free 127.0.0.1 port,
// resetting nothing until SetResetRate. Cleanup closes it.
func StartResetProxy(t testing.TB, target string) *ResetProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: reset proxy: %v", err)
	}
	p := &ResetProxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address, 127.0.0.1:port.
func (p *ResetProxy) Addr() string { return p.ln.Addr().String() }

// SetResetRate sets the probability (0 to 1) that a forwarded segment resets
// its connection instead.
func (p *ResetProxy) SetResetRate(prob float64) { p.rate.Store(math.Float64bits(prob)) }

// Resets returns how many connections the proxy has reset.
func (p *ResetProxy) Resets() int64 { return p.resets.Load() }

func (p *ResetProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *ResetProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		abort(c)
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *ResetProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *ResetProxy) handle(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		abort(client)
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.pipe(server, client)
	}()
	p.pipe(client, server)
	<-done
}

func (p *ResetProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if rand.Float64() < math.Float64frombits(p.rate.Load()) {
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
		if errors.Is(err, io.EOF) {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			return
		}
		if err != nil {
			abort(src)
			abort(dst)
			return
		}
	}
}

func (p *ResetProxy) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	p.ln.Close()
	for c := range conns {
		abort(c)
	}
	p.wg.Wait()
}

package testenv_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// echoServer starts a TCP server that echoes every connection until EOF and
// returns its address and the number of connections it has accepted.
func echoServer(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), accepted
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg to c and wants it echoed back within 5s.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	expectRead(t, c, msg)
}

func expectRead(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("read = %q, %v; want %q", got, err, want)
	}
}

// expectHang wants a read on c to time out: nothing arrives, and the
// connection is not closed either.
func expectHang(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	n, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a blackholed proxy = %d bytes, %v; want a timeout", n, err)
	}
}

// expectBroken wants a read on c to fail at once, and not by timing out.
func expectBroken(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a cut connection = %d bytes, %v; want EOF or a reset", n, err)
	}
}

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	target, accepted := echoServer(t)
	p := testenv.StartProxy(t, target)

	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	roundTrip(t, a, "hello")
	roundTrip(t, b, "world")
	big := strings.Repeat("0123456789", 100_000) // more than any socket buffer
	go a.Write([]byte(big))
	expectRead(t, a, big)

	// EOF travels through as a half-close: the echo server sees it, sends
	// the rest and closes, and that close comes back.
	if _, err := b.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	if err := b.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rest, err := io.ReadAll(b); err != nil || string(rest) != "last" {
		t.Fatalf("after CloseWrite: read %q, %v; want \"last\" then EOF", rest, err)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("target accepted %d connections, want 2", n)
	}
}

func TestProxyRefusedTargetResets(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there now
	p := testenv.StartProxy(t, target)
	// The reset may come before connect returns.
	if c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		defer c.Close()
		expectBroken(t, c)
	}
}

func TestProxyCut(t *testing.T) {
	t.Parallel()
	target, _ := echoServer(t)
	p := testenv.StartProxy(t, target)
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")

	p.Cut()
	expectBroken(t, old)
	// A new connection is accepted by the kernel, then reset at once.
	if c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		t.Cleanup(func() { c.Close() })
		_, _ = c.Write([]byte("x"))
		expectBroken(t, c)
	}
	p.Cut() // cutting twice is harmless

	p.Restore()
	roundTrip(t, dial(t, p.Addr()), "after")
}

func TestProxyBlackhole(t *testing.T) {
	t.Parallel()
	target, accepted := echoServer(t)
	p := testenv.StartProxy(t, target)
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")

	p.Blackhole()
	if _, err := old.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	expectHang(t, old)
	// New connections are accepted but go nowhere.
	fresh := dial(t, p.Addr())
	if _, err := fresh.Write([]byte("queued")); err != nil {
		t.Fatal(err)
	}
	expectHang(t, fresh)
	if n := accepted.Load(); n != 1 {
		t.Errorf("target accepted %d connections while blackholed, want 1 (from before)", n)
	}

	// Healed: what was held is delivered, late.
	p.Restore()
	expectRead(t, old, "held")
	expectRead(t, fresh, "queued")
	roundTrip(t, old, "after")

	// A Cut ends blackholed connections too.
	p.Blackhole()
	hung := dial(t, p.Addr())
	p.Cut()
	expectBroken(t, hung)
	expectBroken(t, old)
}

// TestProxyFlaky: at probability 1 every chunk resets its connection; at
// 0.3 some round trips of many connections fail with a reset and the others
// pass intact; Restore heals.
func TestProxyFlaky(t *testing.T) {
	t.Parallel()
	target, _ := echoServer(t)
	p := testenv.StartProxy(t, target)
	old := dial(t, p.Addr())
	roundTrip(t, old, "before")

	p.Flaky(1)
	if _, err := old.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, old)

	p.Flaky(0.3)
	const n = 200
	ok, broken := 0, 0
	for i := range n {
		c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("m%03d", i)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len(msg))
		_, werr := c.Write([]byte(msg))
		_, rerr := io.ReadFull(c, got)
		switch {
		case werr == nil && rerr == nil && string(got) == msg:
			ok++
		case errors.Is(rerr, os.ErrDeadlineExceeded):
			t.Fatalf("connection %d hung instead of being reset", i)
		case rerr == nil:
			t.Fatalf("connection %d: read %q, want %q", i, got, msg)
		default:
			broken++
		}
		c.Close()
	}
	// Each round trip is two chunks: about half of them break (1 - 0.7²).
	if broken < n/5 || ok < n/5 {
		t.Fatalf("%d of %d round trips broken, %d intact; want a fraction of each", broken, n, ok)
	}
	t.Logf("%d of %d round trips broken", broken, n)
	if p.Resets() < int64(broken) {
		t.Fatalf("Resets() = %d, want at least the %d broken round trips", p.Resets(), broken)
	}

	p.Restore()
	c := dial(t, p.Addr())
	for i := range 50 {
		roundTrip(t, c, fmt.Sprintf("after%d", i))
	}
}

// TestProxyCleanupLeavesNoGoroutines is not parallel, so that no other
// test's proxy is running while it looks at every goroutine.
func TestProxyCleanupLeavesNoGoroutines(t *testing.T) {
	var conns []net.Conn
	t.Run("proxy", func(t *testing.T) {
		target, _ := echoServer(t)
		p := testenv.StartProxy(t, target)
		// Connections the test leaves open, in every state: Cleanup
		// must end them all.
		for range 3 {
			c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		roundTrip(t, conns[0], "x")
		roundTrip(t, conns[1], "x")
		p.Blackhole()
		_, _ = conns[1].Write([]byte("held")) // waiting to be forwarded
		expectHang(t, conns[1])
		held, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second) // never dialed on
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, held)
		expectHang(t, held)
	})
	for _, c := range conns {
		expectBroken(t, c)
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "testenv.(*Proxy)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy goroutines left after Cleanup:\n%s", stacks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

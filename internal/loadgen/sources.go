package loadgen

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// MaxSources bounds Sources: the loopback addresses 127.0.0.1 to
// 127.0.0.254.
const MaxSources = 254

// A TCP connection is named by its two addresses and ports, so one source
// address reaches one server address and port through at most the
// ephemeral port range (net.ipv4.ip_local_port_range, 28,232 ports by
// default): the most connections one machine can hold to one loopback
// server from one address. Linux routes the whole of 127.0.0.0/8 to the
// loopback interface, so spreading the connections over n source addresses
// (127.0.0.1 to 127.0.0.n) lifts that bound n times, with no setup.

// sourceDialer returns a DialContext that binds each connection to a
// loopback IPv4 target to the next of the source addresses 127.0.0.1 to
// 127.0.0.n, in turn; connections to any other address, and every
// connection when n is 1 or less, are dialed as usual.
func sourceDialer(n int, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	plain := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if n <= 1 {
		return plain.DialContext
	}
	dialers := make([]*net.Dialer, n)
	for i := range dialers {
		dialers[i] = &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second,
			LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i+1))}}
	}
	var next atomic.Uint64
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return plain.DialContext(ctx, network, addr)
		}
		ip := net.ParseIP(host)
		if host == "localhost" {
			ip = net.IPv4(127, 0, 0, 1)
			addr = net.JoinHostPort(ip.String(), port)
		}
		if ip == nil || ip.To4() == nil || !ip.IsLoopback() {
			return plain.DialContext(ctx, network, addr)
		}
		d := dialers[(next.Add(1)-1)%uint64(n)]
		return d.DialContext(ctx, "tcp4", addr)
	}
}

// checkSources reports a Sources value out of range.
func checkSources(n int) error {
	if n < 0 || n > MaxSources {
		return fmt.Errorf("loadgen: source addresses must be 0..%d (127.0.0.1 to 127.0.0.n), got %d", MaxSources, n)
	}
	return nil
}

package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports for the servers tests start come from below the kernel's ephemeral
// range (net.ipv4.ip_local_port_range), where neither a listener on port 0
// nor the local end of an outgoing connection is ever placed. A server a
// test stops and starts again on its port (an outage, a restart) therefore
// finds it free again even while other tests, run in parallel, open
// thousands of connections; a port from the ephemeral range could be taken
// meanwhile (seen: a nats-server "not ready for connections within 10s"
// after a 30 s outage).
const lowestPort = 20000

var (
	ephemeralOnce sync.Once
	ephemeralLow  = 32768 // Linux's default, when the setting cannot be read
)

// ephemeralStart returns the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	ephemeralOnce.Do(func() {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return
		}
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > lowestPort+1000 {
				ephemeralLow = n
			}
		}
	})
	return ephemeralLow
}

// FreePort returns a TCP port on 127.0.0.1, below the ephemeral range, that
// was free a moment ago (a listener on it was opened and closed).
func FreePort() (int, error) {
	high := ephemeralStart()
	var err error
	for range 100 {
		p := lowestPort + rand.IntN(high-lowestPort)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			l.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("testenv: no free port below %d in 100 tries: %w", high, err)
}

// clusterBusOffset is what a Redis Cluster node adds to its port for its
// cluster bus (Redis' default).
const clusterBusOffset = 10000

// FreeClusterPort is FreePort for a Redis Cluster node: the port and its
// bus port (+10000) are both below the ephemeral range and were both free
// a moment ago. (A port from FreePort could have its bus port in the
// ephemeral range, where the local end of any outgoing connection may take
// it: seen as "Failed listening on port ... (cluster), aborting".)
func FreeClusterPort() (int, error) {
	high := ephemeralStart() - clusterBusOffset
	if high <= lowestPort {
		return 0, fmt.Errorf("testenv: no room for a cluster node and its bus below port %d", ephemeralStart())
	}
	var err error
	for range 100 {
		p := lowestPort + rand.IntN(high-lowestPort)
		var l1, l2 net.Listener
		if l1, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err != nil {
			continue
		}
		l2, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+clusterBusOffset)))
		l1.Close()
		if err == nil {
			l2.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("testenv: no free cluster port pair below %d in 100 tries: %w", high, err)
}

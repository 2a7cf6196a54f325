package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Proxies is the set of networks whose peers are trusted proxies: only a
// request whose socket peer is inside it may name the client in
// X-Forwarded-For (or, in trusted-gateway mode, the user in a header).
// The nil *Proxies trusts nobody. It is read-only after ParseProxies.
type Proxies struct{ nets []netip.Prefix }

// ParseProxies parses a list of CIDRs or single addresses separated by
// commas or spaces ("10.0.0.0/8, 192.0.2.7"). An empty list gives nil.
func ParseProxies(s string) (*Proxies, error) {
	var p Proxies
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if pf, err := netip.ParsePrefix(f); err == nil {
			p.nets = append(p.nets, pf.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("trusted proxies: %q is neither a CIDR nor an IP address", f)
		}
		a = a.Unmap()
		p.nets = append(p.nets, netip.PrefixFrom(a, a.BitLen()))
	}
	if len(p.nets) == 0 {
		return nil, nil
	}
	return &p, nil
}

// Contains reports whether a is a trusted proxy's address.
func (p *Proxies) Contains(a netip.Addr) bool {
	if p == nil || !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	for _, n := range p.nets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// peer returns the address of r's socket peer (invalid if unparsable).
func peer(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// PeerTrusted reports whether r came straight from a trusted proxy.
func (p *Proxies) PeerTrusted(r *http.Request) bool { return p.Contains(peer(r)) }

// ClientIP returns the address of the client that sent r: the socket peer,
// or, when the peer is a trusted proxy, the nearest X-Forwarded-For entry
// that is not one (walking from the right, since only the entries our own
// proxies appended can be believed: a client can write anything to the
// left). If every entry is a trusted proxy it is the leftmost; an entry that
// is not an address stops the walk at the last trusted one.
func (p *Proxies) ClientIP(r *http.Request) string {
	client := peer(r)
	if !client.IsValid() {
		return r.RemoteAddr
	}
	if !p.Contains(client) {
		return addrIn(client, r.RemoteAddr)
	}
	hops := r.Header.Values("X-Forwarded-For")
	for i := len(hops) - 1; i >= 0; i-- {
		entries := strings.Split(hops[i], ",")
		for j := len(entries) - 1; j >= 0; j-- {
			a, ok := parseHop(entries[j])
			if !ok {
				return client.String()
			}
			client = a
			if !p.Contains(a) {
				return client.String()
			}
		}
	}
	return client.String()
}

// addrIn is a.String(), or the same string as it begins hostPort (the
// usual "192.0.2.10:51234" of RemoteAddr), which costs no allocation.
func addrIn(a netip.Addr, hostPort string) string {
	var buf [64]byte
	b := a.AppendTo(buf[:0])
	if n := len(b); len(hostPort) >= n && hostPort[:n] == string(b) && (len(hostPort) == n || hostPort[n] == ':') {
		return hostPort[:n]
	}
	return string(b)
}

// parseHop parses one X-Forwarded-For entry: an address, optionally with a
// port ("192.0.2.1:443", "[2001:db8::1]:443").
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	return netip.Addr{}, false
}

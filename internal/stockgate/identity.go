package stockgate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Ping checks that Redis answers: on a Redis Cluster, every primary serving
// slots (a keyless PING would reach one arbitrary node, and a SKU on a dead
// primary can sell nothing).
func (g *Gate) Ping(ctx context.Context) error {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return g.c.Do(ctx, g.c.B().Ping().Build()).Error()
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return err
	}
	for _, p := range prim {
		if err := p.client.Do(ctx, p.client.B().Ping().Build()).Error(); err != nil {
			return fmt.Errorf("stockgate: primary %s: %w", p.addr, err)
		}
	}
	return nil
}

// RunID returns the identity of the Redis data the sales were loaded into:
// it changes whenever a server may have lost writes. On a single server it
// is the run id (a restart). On a Redis Cluster it is, for every primary
// serving slots, "addr=run_id/master_replid", sorted by address: the run id
// changes when the primary restarts, the replication id when a replica is
// promoted in its place (a failover, forced or not: asynchronous replication
// may have left the last writes behind), and the list when a primary is
// added, removed or replaced. Replicas are left out, so their restarts and
// re-syncs change nothing. A primary that is marked failed, or does not
// answer, is an error: the cluster is not settled, ask again later.
func (g *Gate) RunID(ctx context.Context) (string, error) {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return runID(ctx, g.c)
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return "", err
	}
	ids := make([]string, len(prim))
	for i, p := range prim {
		info, err := p.client.Do(ctx, p.client.B().Info().Section("server", "replication").Build()).ToString()
		if err != nil {
			return "", fmt.Errorf("stockgate: info on primary %s: %w", p.addr, err)
		}
		f := infoFields(info)
		if f["role"] != "master" {
			return "", fmt.Errorf("stockgate: primary %s answers role %q: the cluster is changing", p.addr, f["role"])
		}
		if f["run_id"] == "" || f["master_replid"] == "" {
			return "", fmt.Errorf("stockgate: primary %s: no run_id or master_replid in INFO", p.addr)
		}
		ids[i] = p.addr + "=" + f["run_id"] + "/" + f["master_replid"]
	}
	return strings.Join(ids, ","), nil
}

// primary is one primary of a Redis Cluster and the client of its node.
type primary struct {
	addr   string
	client rueidis.Client
}

// primaries returns the primaries serving slots, sorted by address, as the
// first node that answers CLUSTER NODES sees them: the client's own view
// (Nodes) may be stale after a failover.
func (g *Gate) primaries(ctx context.Context) ([]primary, error) {
	nodes := g.c.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	var out string
	var err error
	for _, addr := range addrs {
		c := nodes[addr]
		if out, err = c.Do(ctx, c.B().ClusterNodes().Build()).ToString(); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stockgate: cluster nodes: %w", err)
	}
	return parsePrimaries(out, nodes)
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// parsePrimaries reads the primaries serving slots from CLUSTER NODES'
// answer out. A view in which not every slot is served by a primary is an
// error: the cluster is changing (during a failover the node asked may
// list the promoted replica as a primary before the slots it took over,
// and the old primary as a replica: a list without either, which would
// count as one more change, and a rebuild, once the view settles).
func parsePrimaries(out string, nodes map[string]rueidis.Client) ([]primary, error) {
	var prim []primary
	served := 0
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
		if len(f) < 9 || !strings.Contains(f[2], "master") {
			continue // a replica, or a primary with no slots (replaced)
		}
		addr, c, ok := nodeAddr(f[1], nodes)
		if strings.Contains(f[2], "fail") && !strings.Contains(f[2], "fail?") {
			return nil, fmt.Errorf("stockgate: primary %s is marked failed: the cluster is failing over", addr)
		}
		if !ok {
			return nil, fmt.Errorf("stockgate: primary %s is not known to the client yet", addr)
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated: counted where it is served
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := a, error(nil)
			if isRange {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 != nil || err2 != nil || b < a {
				return nil, fmt.Errorf("stockgate: CLUSTER NODES: primary %s: bad slot range %q", addr, r)
			}
			served += b - a + 1
		}
		prim = append(prim, primary{addr: addr, client: c})
	}
	if len(prim) == 0 {
		return nil, errors.New("stockgate: CLUSTER NODES lists no primary with slots")
	}
	if served != clusterSlots {
		return nil, fmt.Errorf("stockgate: primaries serve %d of %d slots: the cluster is changing", served, clusterSlots)
	}
	sort.Slice(prim, func(i, j int) bool { return prim[i].addr < prim[j].addr })
	return prim, nil
}

// nodeAddr finds the client of the node CLUSTER NODES names as
// "ip:port@cport[,hostname[,aux=value...]]": the client knows it by ip:port,
// or by hostname:port when the cluster announces hostnames
// (cluster-preferred-endpoint-type hostname).
func nodeAddr(field string, nodes map[string]rueidis.Client) (string, rueidis.Client, bool) {
	ipport, rest, _ := strings.Cut(field, "@")
	if c, ok := nodes[ipport]; ok {
		return ipport, c, true
	}
	if _, after, ok := strings.Cut(rest, ","); ok {
		host, _, _ := strings.Cut(after, ",")
		if _, port, err := net.SplitHostPort(ipport); err == nil && host != "" && !strings.Contains(host, "=") {
			hp := net.JoinHostPort(host, port)
			if c, ok := nodes[hp]; ok {
				return hp, c, true
			}
		}
	}
	return ipport, nil, false
}

// Primaries returns the address and a client of every Redis Cluster
// primary serving slots (the one server on a single Redis, named ""): for
// work that must reach every primary, such as a SCAN over every key.
func (g *Gate) Primaries(ctx context.Context) (map[string]rueidis.Client, error) {
	if g.c.Mode() != rueidis.ClientModeCluster {
		return map[string]rueidis.Client{"": g.c}, nil
	}
	prim, err := g.primaries(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]rueidis.Client, len(prim))
	for _, p := range prim {
		out[p.addr] = p.client
	}
	return out, nil
}

// infoFields parses INFO's "key:value" lines.
func infoFields(info string) map[string]string {
	f := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			f[k] = v
		}
	}
	return f
}

func runID(ctx context.Context, c rueidis.Client) (string, error) {
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("stockgate: info: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", errors.New("stockgate: no run_id in INFO server")
}

// SwapRunID records id as the run id the sales were last loaded for and
// returns the one recorded before ("" if none: a new or emptied Redis).
// Of several instances noticing the same restart, exactly one sees the old id.
func (g *Gate) SwapRunID(ctx context.Context, id string) (string, error) {
	prev, err := g.c.Do(ctx, g.c.B().Set().Key(g.prefix+":runid").Value(id).Get().Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return prev, err
}

// TopologyRefresh is how often a Redis Cluster client made by ClientOption
// reads the cluster's shards again: a replica promoted by a failover is
// reachable through Nodes (and so checked by RunID and Ping) within it.
const TopologyRefresh = time.Second

// Dial connects to the Redis at url (see ClientOption) and checks that it
// is what the URL says: a URL naming several addresses must reach a Redis
// Cluster (rueidis falls back to one plain server when cluster support is
// disabled, which would leave the other addresses silently unused). Errors
// name the addresses tried.
func Dial(url string) (rueidis.Client, error) { return DialWithin(url, 0) }

// DialWithin is Dial with connections set up (TCP and handshake) within
// timeout (0: rueidis's default, 5 s), unless the URL names its own
// dial_timeout. Give it the gate's call deadline (FLASHSALE_REDIS_TIMEOUT):
// while a connection is set up again, every call that picks it waits for that set-up under the deadline
// of the caller that began it, whatever its own (rueidis shares one dial
// per connection), so a dial allowed rueidis's default 5 s would hold
// purchases and /readyz past their deadlines while Redis hangs.
func DialWithin(url string, timeout time.Duration) (rueidis.Client, error) {
	opt, err := ClientOption(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if !strings.Contains(url, "dial_timeout=") && timeout > 0 {
		opt.Dialer.Timeout = timeout
	}
	addrs := strings.Join(opt.InitAddress, ",")
	notCluster := fmt.Errorf("redis url names %d addresses (%s) but they are not a Redis Cluster: "+
		"name one server, or the nodes of a cluster", len(opt.InitAddress), addrs)
	c, err := rueidis.NewClient(opt)
	if err != nil {
		if len(opt.InitAddress) > 1 && strings.Contains(err.Error(), "cluster support disabled") {
			return nil, fmt.Errorf("%w (%w)", notCluster, err)
		}
		return nil, fmt.Errorf("redis %s: %w", addrs, err)
	}
	if len(opt.InitAddress) > 1 && c.Mode() != rueidis.ClientModeCluster {
		c.Close()
		return nil, notCluster
	}
	return c, nil
}

// ClientOption parses a Redis URL (rueidis form; redis://n1?addr=n2&addr=n3
// for a Redis Cluster) into the options the gate expects: no client-side
// caching, and on a cluster a topology refreshed every TopologyRefresh.
func ClientOption(url string) (rueidis.ClientOption, error) {
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return opt, err
	}
	opt.DisableCache = true
	opt.ClusterOption.ShardsRefreshInterval = TopologyRefresh
	return opt, nil
}

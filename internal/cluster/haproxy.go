// Package cluster is the cluster test's harness: it runs, on one machine,
// flashsale instances (the real binary) behind HAProxy with the shipped
// configuration (deploy/haproxy/haproxy.cfg, addresses changed), a Redis
// Cluster of three primaries with a replica each and a three-node JetStream
// cluster, injects faults (a rolling restart, a primary killed, a NATS node
// killed, an instance killed, an instance cut off from Redis in a network
// namespace) while buyers buy through the balancer, and checks the
// invariants from the database after each. It reuses internal/chaos's
// processes, buyers and checks. docs/faults.md ("Cluster test") describes
// what runs and the recovery times seen.
package cluster

import (
	"encoding/csv"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
)

// HAProxy is a haproxy process running the shipped configuration.
type HAProxy struct {
	*chaos.Proc
	URL       string // the frontend
	StatsURL  string
	Config    string // the file it runs
	Socket    string // the runtime API's socket
	CanaryMap string // the canary share's map file, as the configuration names it
}

// ShippedConfig returns deploy/haproxy/haproxy.cfg of the module the test
// runs in.
func ShippedConfig(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(shippedConfigPath(t))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// shippedConfigPath finds deploy/haproxy/haproxy.cfg from the working
// directory up to go.mod, so that it works in a build with -trimpath,
// whose source paths name no directory.
func shippedConfigPath(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "deploy", "haproxy", "haproxy.cfg")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("cluster: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Local is what LocalConfig puts in the shipped configuration for this
// machine.
type Local struct {
	Frontend, Stats string   // host:port of the two frontends
	Servers         []string // host:port of flashsale-1, flashsale-2, ...
	Canary          []string // host:port of flashsale-canary-1, ... (none: the canary backend has no server)
	Socket          string   // the runtime API's socket
	CanaryMap       string   // the canary share's map file
}

// LocalConfig turns the shipped configuration into one for this machine:
// the frontends bind l.Frontend and l.Stats, server flashsale-i is
// l.Servers[i-1] and flashsale-canary-i l.Canary[i-1] (a canary server
// beyond them is left out), the runtime socket and the canary map are
// l's, and Docker's resolvers go. Everything else (checks, retries,
// timeouts, the canary split) is the shipped file's, so the test runs what
// is deployed; a change of the file's shape that these rewrites no longer
// find fails here.
func LocalConfig(shipped string, l Local) (string, error) {
	const shippedMap, shippedSocket = "/usr/local/etc/haproxy/canary.map", "/var/run/haproxy/admin.sock"
	var out []string
	inResolvers := false
	replaced := map[string]int{}
	for _, line := range strings.Split(shipped, "\n") {
		f := strings.Fields(line)
		switch {
		case inResolvers:
			if len(f) == 0 {
				inResolvers = false
				out = append(out, line)
			}
			continue
		case len(f) >= 2 && f[0] == "resolvers":
			inResolvers = true
			replaced["resolvers"]++
			continue
		case len(f) == 2 && f[0] == "bind" && f[1] == ":8080":
			line = "    bind " + l.Frontend
			replaced["bind"]++
		case len(f) == 2 && f[0] == "bind" && f[1] == ":8404":
			line = "    bind " + l.Stats
			replaced["stats"]++
		case len(f) >= 3 && f[0] == "stats" && f[1] == "socket" && f[2] == shippedSocket:
			line = strings.Replace(line, shippedSocket, l.Socket, 1)
			replaced["socket"]++
		case strings.Contains(line, shippedMap) && !strings.HasPrefix(strings.TrimSpace(line), "#"):
			line = strings.Replace(line, shippedMap, l.CanaryMap, 1)
			replaced["map"]++
		case len(f) >= 1 && f[0] == "default-server":
			line = strings.Replace(line, " resolvers docker", "", 1)
			replaced["default-server"]++
		case len(f) == 3 && f[0] == "server" && strings.HasPrefix(f[1], "flashsale-canary-"):
			var i int
			if _, err := fmt.Sscanf(f[1], "flashsale-canary-%d", &i); err != nil || i < 1 {
				return "", fmt.Errorf("haproxy.cfg: server %q: not flashsale-canary-N", f[1])
			}
			replaced["canary"]++
			if i > len(l.Canary) {
				continue
			}
			line = fmt.Sprintf("    server %s %s", f[1], l.Canary[i-1])
		case len(f) == 3 && f[0] == "server" && strings.HasPrefix(f[1], "flashsale-"):
			var i int
			if _, err := fmt.Sscanf(f[1], "flashsale-%d", &i); err != nil || i < 1 || i > len(l.Servers) {
				return "", fmt.Errorf("haproxy.cfg: server %q has no address here", f[1])
			}
			line = fmt.Sprintf("    server %s %s", f[1], l.Servers[i-1])
			replaced["server"]++
		}
		out = append(out, line)
	}
	for what, want := range map[string]int{"resolvers": 1, "bind": 1, "stats": 1, "socket": 1, "map": 1,
		"default-server": 2, "server": len(l.Servers), "canary": max(1, len(l.Canary))} {
		if replaced[what] != want {
			return "", fmt.Errorf("haproxy.cfg: %d %q lines rewritten, want %d: the file changed shape", replaced[what], what, want)
		}
	}
	return strings.Join(out, "\n"), nil
}

// StartHAProxy runs haproxy in the foreground with the shipped
// configuration in front of servers (host:port each, flashsale-1 first),
// with no canary.
func StartHAProxy(t testing.TB, servers []string) *HAProxy {
	t.Helper()
	return StartHAProxyCanary(t, servers, nil)
}

// StartHAProxyCanary is StartHAProxy with canary servers (flashsale-canary-1
// first) and the canary share the shipped map file starts with (0).
func StartHAProxyCanary(t testing.TB, servers, canary []string) *HAProxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy not found: scripts/ensure-services.sh installs it")
	}
	dir := t.TempDir()
	l := Local{Frontend: chaos.FreeAddr(t), Stats: chaos.FreeAddr(t), Servers: servers, Canary: canary,
		Socket: filepath.Join(dir, "admin.sock"), CanaryMap: filepath.Join(dir, "canary.map")}
	shippedMap, err := os.ReadFile(filepath.Join(filepath.Dir(shippedConfigPath(t)), "canary.map"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.CanaryMap, shippedMap, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LocalConfig(ShippedConfig(t), l)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	h := &HAProxy{URL: "http://" + l.Frontend, StatsURL: "http://" + l.Stats, Config: path, Socket: l.Socket, CanaryMap: l.CanaryMap}
	h.Proc = chaos.StartProc(t, "haproxy", bin, []string{"-db", "-f", path}, nil)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := h.States(); err == nil {
			return h
		}
		if h.Exited(0) || time.Now().After(deadline) {
			t.Fatalf("haproxy did not start:\n%s", h.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SetCanaryShare sets the canary's share of buyers (percent) through the
// runtime API, as an operator does: no reload.
func (h *HAProxy) SetCanaryShare(percent int) error {
	return h.Command(fmt.Sprintf("set map %s share %d", h.CanaryMap, percent))
}

// Command sends one runtime API command and fails on an answer that is not
// empty (the runtime API answers a successful "set" with nothing).
func (h *HAProxy) Command(cmd string) error {
	c, err := net.DialTimeout("unix", h.Socket, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return err
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return fmt.Errorf("haproxy %q: %s", cmd, s)
	}
	return nil
}

// States returns the check state of each server of the flashsale backend
// ("UP", "DOWN", "UP 1/2", ...), from the stats page's CSV.
func (h *HAProxy) States() (map[string]string, error) { return h.BackendStates("flashsale") }

// BackendStates is States for the servers of backend.
func (h *HAProxy) BackendStates(backend string) (map[string]string, error) {
	resp, err := http.Get(h.StatsURL + "/;csv")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("stats: %s", resp.Status)
	}
	r := csv.NewReader(resp.Body)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("stats csv: %v", err)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[strings.TrimPrefix(strings.TrimSpace(name), "# ")] = i
	}
	pi, si, st := col["pxname"], col["svname"], col["status"]
	states := map[string]string{}
	for _, row := range rows[1:] {
		if len(row) > st && row[pi] == backend && row[si] != "BACKEND" {
			states[row[si]] = row[st]
		}
	}
	return states, nil
}

// WaitState waits until server's state is want ("UP" or "DOWN") and
// returns how long that took.
func (h *HAProxy) WaitState(server, want string, within time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		s, err := h.States()
		if err == nil && s[server] == want {
			return time.Since(start), nil
		}
		if time.Since(start) > within {
			return time.Since(start), fmt.Errorf("haproxy: %s is %q after %v, want %s (%v)", server, s[server], within, want, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package deploy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/redis/rueidis"
)

// loadCompose loads and validates a compose file as `docker compose` would,
// with an empty environment (the placeholders' defaults apply).
func loadCompose(t *testing.T, file string, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file}, cli.WithWorkingDirectory(filepath.Dir(file)), cli.WithProfiles(profiles))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("%s does not load: %v", file, err)
	}
	return p
}

// knownSettings returns every FLASHSALE_* variable the binary reads: the
// string literals of cmd/flashsale's non-test sources, where each setting
// names its variable (config.go and its neighbours).
func knownSettings(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../cmd/flashsale/*.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`"(FLASHSALE_[A-Z0-9_]+)"`)
	known := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			known[m[1]] = true
		}
	}
	// A parser that finds nothing would pass everything.
	for _, must := range []string{"FLASHSALE_DATABASE_URL", "FLASHSALE_REDIS_URL", "FLASHSALE_NATS_URL", "FLASHSALE_HTTP_ADDR", "FLASHSALE_USER_TOKEN_SECRET"} {
		if !known[must] {
			t.Fatalf("settings parser did not find %s in cmd/flashsale: %v", must, known)
		}
	}
	return known
}

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

func serviceNames(p *types.Project, match func(types.ServiceConfig) bool) []string {
	var names []string
	for name, s := range p.Services {
		if match(s) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func isFlashsale(s types.ServiceConfig) bool { return s.Image == "flashsale:dev" }

// checkFlashsaleServices checks what every flashsale service of a compose
// project must have: only settings the binary knows, the three URLs set, a
// reachable listen address, placeholder secrets, and healthy dependencies
// before it starts.
func checkFlashsaleServices(t *testing.T, p *types.Project, known map[string]bool) []string {
	t.Helper()
	names := serviceNames(p, isFlashsale)
	for _, name := range names {
		s := p.Services[name]
		if s.Build == nil || filepath.Clean(s.Build.Context) != filepath.Clean(filepath.Join(p.WorkingDir, "../..")) {
			t.Errorf("%s: build context %v, want the repository root (the Dockerfile's)", name, s.Build)
		}
		for v := range s.Environment {
			if strings.HasPrefix(v, "FLASHSALE_") && !known[v] {
				t.Errorf("%s sets %s, which flashsale does not read", name, v)
			}
		}
		for _, v := range []string{"FLASHSALE_DATABASE_URL", "FLASHSALE_REDIS_URL", "FLASHSALE_NATS_URL", "FLASHSALE_USER_TOKEN_SECRET"} {
			if env(s, v) == "" {
				t.Errorf("%s: %s not set", name, v)
			}
		}
		if got := env(s, "FLASHSALE_HTTP_ADDR"); got != "0.0.0.0:8080" {
			t.Errorf("%s: FLASHSALE_HTTP_ADDR %q, want 0.0.0.0:8080 (the default listens on loopback only)", name, got)
		}
		if got := env(s, "FLASHSALE_NATS_URL"); !strings.HasPrefix(got, "nats://") {
			t.Errorf("%s: FLASHSALE_NATS_URL %q: the embedded broker serves one instance only, and a container loses it", name, got)
		}
		for _, v := range []string{"FLASHSALE_ADMIN_TOKEN", "FLASHSALE_USER_TOKEN_SECRET", "FLASHSALE_PAYMENT_SECRET"} {
			if got := env(s, v); !strings.Contains(got, "change-me") {
				t.Errorf("%s: %s = %q, want an obvious placeholder (change-me...)", name, v, got)
			}
		}
		if !slices.Equal(s.Command, types.ShellCommand{"serve"}) {
			t.Errorf("%s: command %q, want [serve]", name, s.Command)
		}
		if len(s.DependsOn) == 0 {
			t.Errorf("%s: no depends_on", name)
		}
		for dep, d := range s.DependsOn {
			ds, ok := p.Services[dep]
			if !ok {
				t.Errorf("%s depends on %s, which is not a service", name, dep)
				continue
			}
			switch d.Condition {
			case types.ServiceConditionHealthy:
				if ds.HealthCheck == nil || len(ds.HealthCheck.Test) == 0 {
					t.Errorf("%s waits for %s to be healthy, which has no healthcheck", name, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
			default:
				t.Errorf("%s depends on %s with condition %q, want service_healthy (or service_completed_successfully for a job)", name, dep, d.Condition)
			}
		}
	}
	return names
}

func TestComposeSingle(t *testing.T) {
	known := knownSettings(t)
	p := loadCompose(t, "compose/compose.yaml")
	want := []string{"flashsale", "nats", "postgres", "redis"}
	if got := serviceNames(p, func(types.ServiceConfig) bool { return true }); !slices.Equal(got, want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	if got := checkFlashsaleServices(t, p, known); !slices.Equal(got, []string{"flashsale"}) {
		t.Fatalf("flashsale services %v, want [flashsale]", got)
	}
	fs := p.Services["flashsale"]
	for _, dep := range []string{"postgres", "redis", "nats"} {
		if fs.DependsOn[dep].Condition != types.ServiceConditionHealthy {
			t.Errorf("flashsale does not wait for %s to be healthy", dep)
		}
	}
	if got := env(fs, "FLASHSALE_DATABASE_URL"); !strings.HasPrefix(got, "postgres://postgres:change-me") || !strings.Contains(got, "@postgres:5432/") {
		t.Errorf("FLASHSALE_DATABASE_URL %q: want the postgres service with the placeholder password", got)
	}
	if got := env(fs, "FLASHSALE_REDIS_URL"); got != "redis://redis:6379/0" {
		t.Errorf("FLASHSALE_REDIS_URL %q", got)
	}
	if got := env(fs, "FLASHSALE_NATS_URL"); got != "nats://nats:4222" {
		t.Errorf("FLASHSALE_NATS_URL %q", got)
	}
	if cmd := p.Services["nats"].Command; !slices.Contains(cmd, "-js") || !slices.Contains(cmd, "-sd") {
		t.Errorf("nats command %q: want JetStream (-js) with a store directory (-sd) on the volume", cmd)
	}
	for _, s := range []string{"postgres", "redis", "nats"} {
		if len(p.Services[s].Volumes) == 0 {
			t.Errorf("%s keeps its data in no volume", s)
		}
	}
}

func TestComposeCluster(t *testing.T) {
	known := knownSettings(t)
	p := loadCompose(t, "compose/cluster.yaml")
	instances := checkFlashsaleServices(t, p, known)
	if want := []string{"flashsale-1", "flashsale-2", "flashsale-3"}; !slices.Equal(instances, want) {
		t.Fatalf("flashsale instances %v, want %v", instances, want)
	}

	redisNodes := serviceNames(p, func(s types.ServiceConfig) bool {
		return slices.Contains(s.Command, "--cluster-enabled")
	})
	if len(redisNodes) != 6 {
		t.Fatalf("cluster-enabled Redis nodes %v, want 6 (3 primaries, a replica each)", redisNodes)
	}
	init, ok := p.Services["redis-cluster-init"]
	if !ok {
		t.Fatal("no redis-cluster-init job")
	}
	if !slices.Equal(init.Entrypoint, types.ShellCommand{"sh", "-ec"}) || len(init.Command) != 1 {
		t.Fatalf("redis-cluster-init: entrypoint %q command %q, want sh -ec and one script", init.Entrypoint, init.Command)
	}
	script := init.Command[0]
	if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Errorf("redis-cluster-init's script does not parse: %v\n%s", err, out)
	}
	for _, w := range []string{"redis-cli --cluster create", "--cluster-replicas 1", "--cluster-yes"} {
		if !strings.Contains(script, w) {
			t.Errorf("redis-cluster-init does not run %q: %s", w, script)
		}
	}
	for _, n := range redisNodes {
		if !strings.Contains(script, n) {
			t.Errorf("redis-cluster-init leaves %s out", n)
		}
		if init.DependsOn[n].Condition != types.ServiceConditionHealthy {
			t.Errorf("redis-cluster-init does not wait for %s", n)
		}
	}

	natsNodes := serviceNames(p, func(s types.ServiceConfig) bool { return slices.Contains(s.Command, "--routes") })
	if len(natsNodes) != 3 {
		t.Fatalf("NATS nodes with routes %v, want 3", natsNodes)
	}
	for _, n := range natsNodes {
		cmd := p.Services[n].Command
		routes := cmd[slices.Index(cmd, "--routes")+1]
		if !slices.Contains(cmd, "-js") {
			t.Errorf("%s: no JetStream (-js)", n)
		}
		for _, other := range natsNodes {
			if !strings.Contains(routes, "nats://"+other+":6222") {
				t.Errorf("%s routes %q miss %s", n, routes, other)
			}
		}
	}

	for _, name := range instances {
		s := p.Services[name]
		// The URL must pick rueidis' cluster client: several seed nodes.
		opt, err := rueidis.ParseURL(env(s, "FLASHSALE_REDIS_URL"))
		if err != nil {
			t.Fatalf("%s: FLASHSALE_REDIS_URL: %v", name, err)
		}
		if len(opt.InitAddress) != 3 {
			t.Errorf("%s: Redis seed nodes %v, want the 3 primaries", name, opt.InitAddress)
		}
		for _, n := range natsNodes {
			if !strings.Contains(env(s, "FLASHSALE_NATS_URL"), "nats://"+n+":4222") {
				t.Errorf("%s: FLASHSALE_NATS_URL misses %s", name, n)
			}
		}
		if s.DependsOn["redis-cluster-init"].Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s starts before the Redis cluster is formed", name)
		}
	}

	hap, ok := p.Services["haproxy"]
	if !ok {
		t.Fatal("no haproxy service")
	}
	for _, f := range []string{"haproxy.cfg", "canary.map"} {
		mounted := false
		for _, v := range hap.Volumes {
			if filepath.Clean(v.Source) == filepath.Clean(filepath.Join(p.WorkingDir, "../haproxy", f)) && v.Target == "/usr/local/etc/haproxy/"+f {
				mounted = true
			}
		}
		if !mounted {
			t.Errorf("haproxy does not mount deploy/haproxy/%s: %+v", f, hap.Volumes)
		}
	}
	backends := haproxyServers(t)
	if got := backends["flashsale"]; !slices.Equal(got, []string{"flashsale-1:8080", "flashsale-2:8080", "flashsale-3:8080"}) {
		t.Errorf("haproxy backend servers %v, want every flashsale instance on port 8080", got)
	}
	if got := backends["flashsale-canary"]; !slices.Equal(got, []string{"flashsale-canary-1:8080"}) {
		t.Errorf("haproxy canary servers %v, want flashsale-canary-1:8080", got)
	}
	// The canary service exists, off by default (a compose profile).
	if _, ok := p.Services["flashsale-canary-1"]; ok {
		t.Error("flashsale-canary-1 starts by default; want it in the canary profile only")
	}
	cp := loadCompose(t, "compose/cluster.yaml", "canary")
	c, ok := cp.Services["flashsale-canary-1"]
	if !ok {
		t.Fatal("no flashsale-canary-1 in the canary profile")
	}
	// It runs as the canary group, with every other setting of the stable instances.
	env := func(s types.ServiceConfig, k string) string {
		if v := s.Environment[k]; v != nil {
			return *v
		}
		return ""
	}
	stable := cp.Services["flashsale-1"]
	if env(c, "FLASHSALE_RELEASE_GROUP") != "canary" || env(stable, "FLASHSALE_RELEASE_GROUP") == "canary" {
		t.Errorf("release groups: canary %q, flashsale-1 %q", env(c, "FLASHSALE_RELEASE_GROUP"), env(stable, "FLASHSALE_RELEASE_GROUP"))
	}
	for k := range stable.Environment {
		if env(c, k) != env(stable, k) {
			t.Errorf("the canary's %s is %q, the stable instances' %q", k, env(c, k), env(stable, k))
		}
	}
}

// haproxyServers returns the addresses of each backend's servers.
func haproxyServers(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("haproxy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	servers := map[string][]string{}
	backend := ""
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "backend":
			backend = f[1]
		case len(f) >= 1 && (f[0] == "frontend" || f[0] == "defaults" || f[0] == "global" || f[0] == "resolvers"):
			backend = ""
		case len(f) >= 3 && f[0] == "server" && backend != "":
			servers[backend] = append(servers[backend], f[2])
		}
	}
	return servers
}

// TestHAProxyConfig checks that HAProxy sends traffic only to ready
// instances (GET /readyz, checked on every server) and that haproxy itself
// accepts the file.
func TestHAProxyConfig(t *testing.T) {
	b, err := os.ReadFile("haproxy/haproxy.cfg")
	if err != nil {
		t.Fatal(err)
	}
	var httpchk, readyz, expect200, defaultCheck bool
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case slices.Equal(f, []string{"option", "httpchk"}):
			httpchk = true
		case len(f) >= 2 && f[0] == "http-check" && f[1] == "send":
			readyz = slices.Equal(f, []string{"http-check", "send", "meth", "GET", "uri", "/readyz"})
		case slices.Equal(f, []string{"http-check", "expect", "status", "200"}):
			expect200 = true
		case f[0] == "default-server":
			defaultCheck = slices.Contains(f, "check")
		}
	}
	if !httpchk || !readyz || !expect200 || !defaultCheck {
		t.Errorf("haproxy.cfg: option httpchk %v, http-check send meth GET uri /readyz %v, expect status 200 %v, default-server ... check %v; want all",
			httpchk, readyz, expect200, defaultCheck)
	}

	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy not found: scripts/ensure-services.sh installs it")
	}
	// The canary map is read at start from where the compose file mounts
	// it; here, from this directory.
	abs, err := filepath.Abs("haproxy/canary.map")
	if err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(b), "/usr/local/etc/haproxy/canary.map", abs)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-c", "-f", local).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Configuration file is valid") {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}

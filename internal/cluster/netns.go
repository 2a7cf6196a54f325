package cluster

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// NetNS is a network namespace joined to this machine by a veth pair: the
// machine's end has HostIP (services the namespace reaches) and RedisIP
// (the Redis nodes' address, so the namespace can be cut off from Redis
// alone), the namespace's end NSIP. Removed on Cleanup.
type NetNS struct {
	Name                  string
	HostIP, RedisIP, NSIP string
	hostLink              string
}

// NewNetNS makes the namespace, or skips the test when this machine cannot
// (not root, no ip).
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) not found")
	}
	id := rand.IntN(200) + 20
	tag := fmt.Sprintf("%d%04d", os.Getpid()%10000, rand.IntN(10000))
	n := &NetNS{
		Name:     "fs" + tag,
		HostIP:   fmt.Sprintf("10.%d.%d.1", 100+rand.IntN(100), id),
		hostLink: "fsh" + tag,
	}
	prefix := n.HostIP[:strings.LastIndex(n.HostIP, ".")]
	n.RedisIP, n.NSIP = prefix+".3", prefix+".2"
	peer := "fsn" + tag
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", n.hostLink).Run()
		_ = exec.Command("ip", "netns", "del", n.Name).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", n.Name},
		{"link", "add", n.hostLink, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", n.Name},
		{"addr", "add", n.HostIP + "/24", "dev", n.hostLink},
		{"addr", "add", n.RedisIP + "/24", "dev", n.hostLink},
		{"link", "set", n.hostLink, "up"},
		{"netns", "exec", n.Name, "ip", "addr", "add", n.NSIP + "/24", "dev", peer},
		{"netns", "exec", n.Name, "ip", "link", "set", peer, "up"},
		{"netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("cluster: ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return n
}

// Command returns the arguments that run bin inside the namespace (ip netns
// exec execs it: the process is bin itself, signals reach it).
func (n *NetNS) Command(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", n.Name, bin}, args...)
}

// CutRedis makes the namespace's route to RedisIP a blackhole: new
// connections fail at once (EINVAL), packets of open ones are dropped.
func (n *NetNS) CutRedis(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", n.Name, "ip", "route", "add", "blackhole", n.RedisIP+"/32").CombinedOutput(); err != nil {
		t.Fatalf("cluster: partition: %v\n%s", err, out)
	}
}

// HealRedis removes the blackhole.
func (n *NetNS) HealRedis(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", n.Name, "ip", "route", "del", "blackhole", n.RedisIP+"/32").CombinedOutput(); err != nil {
		t.Fatalf("cluster: heal: %v\n%s", err, out)
	}
}

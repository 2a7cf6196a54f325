package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ListenerPID returns the process listening on the TCP port of target (a
// URL of this machine), found from /proc/net/tcp{,6} and the processes'
// open sockets. Only processes this user may inspect are found (Linux).
func ListenerPID(target string) (int, error) {
	u, err := url.Parse(target)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 80
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, _ := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); err == nil && int(p) == port {
				inodes["socket:["+fs[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no process listens on port %d (or /proc is not readable)", port)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, d := range dirs {
		fds, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(d, fd.Name())); err == nil && inodes[link] {
				return strconv.Atoi(filepath.Base(filepath.Dir(d)))
			}
		}
	}
	return 0, fmt.Errorf("the process listening on port %d is not this user's (give -target-pid)", port)
}

// Memory is a process's memory from /proc/<pid>/status, in bytes.
type Memory struct {
	RSS int64 // VmRSS: resident now
	HWM int64 // VmHWM: the most resident since the process started
}

// ReadMemory reads pid's VmRSS and VmHWM (Linux).
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Memory{}, err
	}
	var m Memory
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("%s of %d: %q", k, pid, v)
		}
		if k == "VmRSS" {
			m.RSS = kb << 10
		} else {
			m.HWM = kb << 10
		}
	}
	if m.RSS == 0 {
		return Memory{}, fmt.Errorf("no VmRSS for process %d", pid)
	}
	return m, nil
}

// processFileLimit returns pid's soft limit of open files from
// /proc/<pid>/limits (0 if unknown).
func processFileLimit(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if fs := strings.Fields(rest); len(fs) > 0 {
				n, _ := strconv.Atoi(fs[0])
				return n
			}
		}
	}
	return 0
}

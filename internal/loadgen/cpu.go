package loadgen

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPU is where the machine's processor time went during a run, in cores
// (1.0 = one CPU busy for the whole run). Read from /proc on Linux; zero
// elsewhere. Processes that start and end within the run are counted in
// Machine only.
type CPU struct {
	Machine  float64 // every process, from /proc/stat
	Self     float64 // this process: the generator, and the servers when in-process
	Redis    float64 // redis-server processes
	Database float64 // database server processes: postgres (every backend), mariadbd or mysqld
	NATS     float64 // nats-server processes (an external broker; an embedded one is in its server)
	// Server is the process of Config.ServerPID (a flashsale serving in
	// its own process, -target): counted here, not in Other. Zero when
	// the server runs in this process (it is then in Self).
	Server    float64
	ServerPID int
	// Span is the time the figures average over (the measured window and
	// the answers after it).
	Span time.Duration
}

// Seconds returns the CPU seconds that cores busy on average over the
// span amount to.
func (c CPU) Seconds(cores float64) float64 { return cores * c.Span.Seconds() }

// Other returns the machine's busy cores not accounted to the named processes.
func (c CPU) Other() float64 { return max(c.Machine-c.Self-c.Redis-c.Database-c.NATS-c.Server, 0) }

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

type cpuSample struct {
	at      time.Time
	busy    float64 // machine busy seconds
	procs   map[int]procTicks
	samples bool
}

type procTicks struct {
	comm  string
	ticks int64
}

func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now(), procs: map[int]procTicks{}}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 8 || f[0] != "cpu" {
		return s
	}
	var total, idle float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i >= 8 { // guest time is already in user
			break
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	s.busy = (total - idle) / clockTicks
	s.samples = true
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15.
		open, end := bytes.IndexByte(raw, '('), bytes.LastIndexByte(raw, ')')
		if open < 0 || end < open {
			continue
		}
		rest := strings.Fields(string(raw[end+1:]))
		if len(rest) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(rest[11], 10, 64)
		st, _ := strconv.ParseInt(rest[12], 10, 64)
		s.procs[pid] = procTicks{comm: string(raw[open+1 : end]), ticks: ut + st}
	}
	return s
}

// cpuBetween returns the cores used between two samples; server, if not
// zero or this process, is the pid of a server process counted apart.
func cpuBetween(a, b cpuSample, server int) CPU {
	secs := b.at.Sub(a.at).Seconds()
	if !a.samples || !b.samples || secs <= 0 {
		return CPU{}
	}
	c := CPU{Machine: (b.busy - a.busy) / secs, Span: b.at.Sub(a.at)}
	self := os.Getpid()
	if server != self {
		c.ServerPID = server
	}
	for pid, pb := range b.procs {
		pa, ok := a.procs[pid]
		if !ok || pa.comm != pb.comm {
			continue
		}
		cores := float64(pb.ticks-pa.ticks) / clockTicks / secs
		switch {
		case pid == self:
			c.Self += cores
		case pid == server:
			c.Server += cores
		case pb.comm == "redis-server":
			c.Redis += cores
		case pb.comm == "postgres" || strings.HasPrefix(pb.comm, "postgres:") || pb.comm == "mariadbd" || pb.comm == "mysqld":
			c.Database += cores
		case pb.comm == "nats-server":
			c.NATS += cores
		}
	}
	return c
}

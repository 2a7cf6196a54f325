//go:build unix

package main

import (
	"log/slog"
	"syscall"
)

// Open files a serving process asks for, and the least it warns below:
// every client connection is a descriptor, and so is every connection to
// PostgreSQL, Redis and NATS; 10,000 keep-alive clients need about 10,500.
const (
	serveFileWant = 1 << 16
	serveFileWarn = 12_000
)

// raiseFileLimit raises the soft RLIMIT_NOFILE of the process towards
// serveFileWant (never above the hard limit) and warns when the result
// is below serveFileWarn. It returns the limit in force. Go already
// raises the soft limit to the hard one at start on Linux; the warning
// is what an operator sees when the hard limit (ulimit -Hn, systemd
// LimitNOFILE, the container's nofile) is too low.
func raiseFileLimit(log *slog.Logger) uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		log.Warn("reading RLIMIT_NOFILE", "err", err)
		return 0
	}
	if r.Cur < serveFileWant && r.Cur < r.Max {
		r.Cur = min(serveFileWant, r.Max)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			log.Warn("raising RLIMIT_NOFILE", "to", r.Cur, "err", err)
		}
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	}
	if r.Cur < serveFileWarn {
		log.Warn("open files limit is low: each client connection takes one, so fewer than about this many can be open at once; raise the hard limit (ulimit -Hn, LimitNOFILE)",
			"nofile", r.Cur, "hard", r.Max)
	}
	return r.Cur
}

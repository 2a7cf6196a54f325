package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// memoryLimitRatio is the share of a container's memory limit the Go
// runtime's soft limit is set to under "auto": the rest is for what the
// runtime does not count (the binary's text, C memory, the kernel's
// socket buffers charged to the cgroup).
const memoryLimitRatio = 0.9

// parseMemoryLimit reads a FLASHSALE_MEMORY_LIMIT value: "auto", "off" (or
// "0"), or a size in bytes with an optional unit (KiB, MiB, GiB; KB, MB, GB
// are read as the binary units too). auto is reported as -1, off as 0.
func parseMemoryLimit(s string) (int64, error) {
	v := strings.TrimSpace(s)
	switch strings.ToLower(v) {
	case "auto", "":
		return -1, nil
	case "off", "0":
		return 0, nil
	}
	mult := int64(1)
	lower := strings.ToLower(v)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suffix) {
			mult, v = u.mult, strings.TrimSpace(v[:len(v)-len(u.suffix)])
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("memory-limit %q: want auto, off, or a size such as 240MiB", s)
	}
	if n*mult < 32<<20 {
		return 0, fmt.Errorf("memory-limit %q: below 32MiB the garbage collector would run without pause", s)
	}
	return n * mult, nil
}

// applyMemoryLimit sets the Go runtime's soft memory limit
// (runtime/debug.SetMemoryLimit): the garbage collector works harder as the
// process nears it, so idle garbage does not inflate RSS; it is never a hard
// cap (past it the collector's CPU share is bounded at about half). A
// GOMEMLIMIT in the environment always wins. auto uses 90% of the memory
// limit of the process's cgroup (v1 or v2) and sets nothing outside a
// container with a limit. It returns the limit in force (0: none).
func applyMemoryLimit(limit int64, log *slog.Logger) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		cur := debug.SetMemoryLimit(-1)
		log.Info("memory limit from GOMEMLIMIT", "bytes", cur)
		return cur
	}
	switch {
	case limit == 0:
		return 0
	case limit < 0:
		c, err := memlimit.FromCgroup()
		if err != nil {
			if !errors.Is(err, memlimit.ErrNoLimit) && !errors.Is(err, memlimit.ErrNoCgroup) {
				log.Warn("memory limit: cgroup not readable; none set", "err", err)
			}
			return 0
		}
		limit = int64(float64(c) * memoryLimitRatio)
	}
	debug.SetMemoryLimit(limit)
	log.Info("memory limit set", "bytes", limit)
	return limit
}

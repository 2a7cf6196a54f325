//go:build unix

package loadgen

import "syscall"

// FileLimit returns the most file descriptors this process may open (0 if unknown).
func FileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0
	}
	return int(r.Cur)
}

// RaiseFileLimit raises this process's soft limit of open files
// (RLIMIT_NOFILE) to want, or to the hard limit if that is lower, and
// returns the limit then in force (0 if unknown). Go already raises the
// soft limit to the hard one at start on Linux; this is for the other
// systems and makes the figure explicit.
func RaiseFileLimit(want int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	if r.Cur < uint64(want) && r.Cur < r.Max {
		r.Cur = min(uint64(want), r.Max)
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
	return FileLimit()
}

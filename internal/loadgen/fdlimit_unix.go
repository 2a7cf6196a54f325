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

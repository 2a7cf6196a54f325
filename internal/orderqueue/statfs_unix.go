//go:build linux || darwin || freebsd

package orderqueue

import "syscall"

// freeBytes returns the space left to an unprivileged writer on dir's
// filesystem; false when it cannot tell.
func freeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

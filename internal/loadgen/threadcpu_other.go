//go:build !linux

package loadgen

import "time"

// threadCPU runs f; the CPU it used is not known here.
func threadCPU(f func()) time.Duration {
	f()
	return 0
}

//go:build !unix

package loadgen

// FileLimit returns the most file descriptors this process may open (0 if unknown).
func FileLimit() int { return 0 }

// RaiseFileLimit does nothing here and returns 0 (unknown).
func RaiseFileLimit(int) int { return 0 }

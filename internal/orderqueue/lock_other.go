//go:build !unix

package orderqueue

import "os"

// lockFile is a no-op where flock is missing: two instances on one data
// directory are not refused there.
func lockFile(f *os.File) error { return nil }

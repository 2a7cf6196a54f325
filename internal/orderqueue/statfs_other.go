//go:build !(linux || darwin || freebsd)

package orderqueue

// freeBytes cannot tell here: the watcher restarts on its backoff alone.
func freeBytes(string) (int64, bool) { return 0, false }

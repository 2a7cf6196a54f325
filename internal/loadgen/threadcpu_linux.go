package loadgen

import (
	"runtime"
	"syscall"
	"time"
)

// rusageThread is RUSAGE_THREAD: the calling thread's usage (Linux).
const rusageThread = 1

// threadCPU runs f on a thread of its own and returns the CPU time that
// thread spent in it (0 where the platform does not say).
func threadCPU(f func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var a, b syscall.Rusage
	errA := syscall.Getrusage(rusageThread, &a)
	f()
	if errA != nil || syscall.Getrusage(rusageThread, &b) != nil {
		return 0
	}
	used := func(r syscall.Rusage) time.Duration {
		return time.Duration(r.Utime.Nano() + r.Stime.Nano())
	}
	return used(b) - used(a)
}

//go:build unix

package main

import (
	"log/slog"
	"syscall"
	"testing"
)

// TestServeRaisesFileLimit: a serving process starting with a low soft
// limit of open files raises it (the hard limit allowing).
func TestServeRaisesFileLimit(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	if orig.Max <= 512 {
		t.Skipf("hard limit %d", orig.Max)
	}
	low := orig
	low.Cur = 512
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	got := raiseFileLimit(slog.New(slog.DiscardHandler))
	var now syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &now)
	if want := min(uint64(serveFileWant), orig.Max); got != want || now.Cur != want {
		t.Errorf("limit after raiseFileLimit: returned %d, in force %d; want %d", got, now.Cur, want)
	}
}

//go:build !linux

package testenv

import (
	"errors"
	"testing"
)

// SmallDisk needs Linux's tmpfs: elsewhere the test is Unavailable.
func SmallDisk(t testing.TB, size int64) string {
	t.Helper()
	Unavailable(t, "a tmpfs", errors.New("tmpfs needs Linux"))
	return ""
}

// Fill is SmallDisk's companion; see SmallDisk.
func Fill(t testing.TB, dir string, leave int64) string {
	t.Helper()
	Unavailable(t, "a tmpfs", errors.New("tmpfs needs Linux"))
	return ""
}

//go:build linux

package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// SmallDisk mounts a tmpfs of size bytes on a new temporary directory and
// returns the directory: a filesystem a test can fill (a full disk under a
// store). It needs root (mount(8)); otherwise the test is Unavailable, so it
// skips locally and fails where FLASHSALE_TEST_REQUIRE_SERVICES is set (CI
// runs as root). Cleanup unmounts it.
func SmallDisk(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "a tmpfs (mount needs root)", errors.New("not running as root"))
	}
	dir, err := os.MkdirTemp("", "flashsale-disk-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		_ = os.Remove(dir)
		Unavailable(t, "a tmpfs", fmt.Errorf("mount: %v: %s", err, strings.TrimSpace(string(out))))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("testenv: umount %s: %v: %s", dir, err, out)
			return
		}
		_ = os.Remove(dir)
	})
	return dir
}

// Fill writes a file under dir until the filesystem has at most leave bytes
// free, and returns its path: removing it frees the space again.
func Fill(t testing.TB, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("testenv: statfs %s: %v", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	f, err := os.CreateTemp(dir, "filler-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer f.Close()
	if n := free - leave; n > 0 {
		buf := make([]byte, 64<<10)
		for n > 0 {
			w := min(n, int64(len(buf)))
			if _, err := f.Write(buf[:w]); err != nil {
				break // full already: fine
			}
			n -= w
		}
	}
	return f.Name()
}

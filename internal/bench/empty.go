package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale/flashsale/internal/loadgen"
)

// EmptyServerBanner starts the line ServeEmpty prints once it listens; the
// URL follows.
const EmptyServerBanner = "empty handler listening on "

// ServeEmpty is `flashsale bench -empty-server ADDR`: the empty handler
// alone, in this process, until ctx ends (SIGTERM, SIGINT).
func ServeEmpty(ctx context.Context, addr string, stdout io.Writer) error {
	base, stop, err := loadgen.StartEmptyServerAt(addr)
	if err != nil {
		return fmt.Errorf("bench: -empty-server: %w", err)
	}
	defer stop()
	fmt.Fprintln(stdout, EmptyServerBanner+base)
	<-ctx.Done()
	return nil
}

// spawnEmpty starts the empty handler as a child process of this binary
// with args (`flashsale bench -empty-server 127.0.0.1:0`, which runs
// ServeEmpty), so that with -target it runs in its own process like the
// server it is compared with. It returns the handler's URL, the child's pid
// and a stop function.
func spawnEmpty(ctx context.Context, args []string) (base string, pid int, stop func(), err error) {
	if len(args) == 0 {
		return "", 0, nil, errors.New("no command runs the empty handler")
	}
	exe, err := os.Executable()
	if err != nil {
		return "", 0, nil, err
	}
	if strings.HasSuffix(filepath.Base(exe), ".test") {
		return "", 0, nil, errors.New("a test binary has no bench subcommand")
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line, ok := <-lines:
		if u, found := strings.CutPrefix(line, EmptyServerBanner); ok && found {
			return u, cmd.Process.Pid, stop, nil
		}
		stop()
		return "", 0, nil, fmt.Errorf("the empty handler process said %q", line)
	case <-time.After(10 * time.Second):
		stop()
		return "", 0, nil, errors.New("the empty handler process did not start within 10s")
	case <-ctx.Done():
		stop()
		return "", 0, nil, ctx.Err()
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// syncBuffer is a bytes.Buffer safe for the demo's writer and the test's reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// curlCmd is one printed curl command, as curl would send it.
type curlCmd struct {
	method, url, body string
	headers           []string
}

// shellWords splits a command line the way sh does for the demo's output:
// words separated by blanks, single quotes kept literally, a trailing
// comment dropped.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			cur.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == '#' && !inWord:
			i = len(line)
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// printedCommands returns the demo's "Try it" commands, continuation lines
// joined, as word lists.
func printedCommands(t *testing.T, out string) [][]string {
	t.Helper()
	out = strings.ReplaceAll(out, "\\\n", " ")
	var cmds [][]string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "curl ") {
			cmds = append(cmds, shellWords(t, line))
		}
		if rest, ok := strings.CutPrefix(line, "go run ./cmd/flashsale token "); ok {
			cmds = append(cmds, shellWords(t, "flashsale token "+rest))
		}
	}
	return cmds
}

func parseCurl(t *testing.T, words []string) curlCmd {
	t.Helper()
	c := curlCmd{method: http.MethodGet}
	for i := 1; i < len(words); i++ {
		switch words[i] {
		case "-X":
			i++
			c.method = words[i]
		case "-H":
			i++
			c.headers = append(c.headers, words[i])
		case "-d":
			i++
			c.body = words[i]
			if c.method == http.MethodGet {
				c.method = http.MethodPost
			}
		default:
			if strings.HasPrefix(words[i], "-") {
				t.Fatalf("curl option %s: the test does not know it", words[i])
			}
			c.url = words[i]
		}
	}
	return c
}

func (c curlCmd) do(t *testing.T) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(c.method, c.url, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range c.headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &body)
	return resp.StatusCode, body
}

// TestDemoCommands runs the demo as `flashsale demo` does and, while its
// background buyers run, executes every command it printed: reading the
// sale (200), restocking by 10 (200), buying as alice (202), minting a
// token with the printed `flashsale token` command and buying with it
// (202). The background buyers never touch the printed sale: several
// restock periods later it still has exactly the units the commands left.
func TestDemoCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo through several 3 s restock periods")
	}
	// Mostly waiting on restock periods, on its own database, prefix and
	// ports: it runs beside the other parallel tests.
	t.Parallel()
	redisURL, prefix := testenv.Redis(t)
	args := []string{"demo", "-buyers", "40", "-stock", "10", "-concurrency", "4",
		"-http-addr", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-database-url", testenv.Database(t), "-redis-url", redisURL, "-redis-prefix", prefix}
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(string) string { return "" }, out, testLogWriter{t}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("demo: %v", err)
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(out.String(), "keeps serving") {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("demo ended: %v\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo did not start serving:\n%s", out.String())
		}
	}
	text := out.String()
	t.Logf("demo printed:\n%s", text)
	cmds := printedCommands(t, text)
	if len(cmds) != 4 {
		t.Fatalf("want 4 printed commands (get, restock, buy, token), got %d: %q", len(cmds), cmds)
	}
	// Let the background buyers restock and sell their own sale a few times.
	time.Sleep(7 * time.Second)

	get, restock, buy := parseCurl(t, cmds[0]), parseCurl(t, cmds[1]), parseCurl(t, cmds[2])
	if code, body := get.do(t); code != http.StatusOK || body["available"] != 0.0 {
		t.Fatalf("printed GET: %d %v, want 200 and the sale sold out", code, body)
	}
	if code, body := restock.do(t); code != http.StatusOK || body["stock"] != 20.0 || body["ends_at"] == nil {
		t.Fatalf("printed restock: %d %v, want 200, stock 20, the end kept", code, body)
	}
	if code, body := buy.do(t); code != http.StatusAccepted {
		t.Fatalf("printed buy as alice: %d %v, want 202", code, body)
	}

	// The printed token command mints a token the demo accepts.
	if cmds[3][0] != "flashsale" {
		t.Fatalf("fourth command is %q, want flashsale token", cmds[3])
	}
	var tok bytes.Buffer
	if err := run(ctx, cmds[3][1:], func(string) string { return "" }, &tok, io.Discard); err != nil {
		t.Fatalf("printed %q: %v", cmds[3], err)
	}
	bob := buy
	bob.headers = []string{"Authorization: Bearer " + strings.TrimSpace(tok.String()), "Content-Type: application/json"}
	if code, body := bob.do(t); code != http.StatusAccepted {
		t.Fatalf("buy with the printed token command's token: %d %v, want 202", code, body)
	}

	// Two restock periods later the printed sale still has 20 - 12 units:
	// nothing else restocked it or bought from it.
	time.Sleep(7 * time.Second)
	if code, body := get.do(t); code != http.StatusOK || body["available"] != 8.0 {
		t.Errorf("printed sale after the background buyers ran: %d %v, want 8 available (20 - 10 sold - 2)", code, body)
	}
	if code, body := restock.do(t); code != http.StatusOK {
		t.Errorf("printed restock, again: %d %v, want 200", code, body)
	}

}

// TestDemoDrains: Ctrl-C while the demo serves is a clean stop that says
// it is draining, then that it stopped.
func TestDemoDrains(t *testing.T) {
	t.Parallel()
	redisURL, prefix := testenv.Redis(t)
	args := []string{"demo", "-buyers", "4", "-stock", "2", "-concurrency", "2", "-drain-delay", "200ms",
		"-http-addr", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-database-url", testenv.Database(t), "-redis-url", redisURL, "-redis-prefix", prefix}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(string) string { return "" }, out, testLogWriter{t}) }()
	for !strings.Contains(out.String(), "keeps serving") {
		select {
		case err := <-done:
			t.Fatalf("demo ended before serving: %v\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo stopped with %v, want a clean stop\n%s", err, out.String())
	}
	text := out.String()
	i, j := strings.Index(text, "\ndraining: "), strings.Index(text, "\nstopped\n")
	if i < 0 || j < i {
		t.Errorf("the demo did not say it was draining, then stopped:\n%s", text)
	}
}

package loadgen

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestLoadgenPartsAreDisjoint: the workers' parts of a run send every
// request of the sequence once, and each block of WorkBlock requests (a
// buyer's clicks) from one worker.
func TestLoadgenPartsAreDisjoint(t *testing.T) {
	const parts, each = 3, 10 * WorkBlock
	seen := map[int64]int{}
	for p := 0; p < parts; p++ {
		op := partOp(func(_ context.Context, seq int64) Outcome {
			if prev, ok := seen[seq]; ok {
				t.Fatalf("request %d sent by parts %d and %d", seq, prev, p)
			}
			seen[seq] = p
			return Outcome{}
		}, p, parts, 0)
		for s := int64(0); s < each; s++ {
			op(context.Background(), s)
		}
	}
	for seq := int64(0); seq < parts*each; seq++ {
		p, ok := seen[seq]
		if !ok {
			t.Fatalf("request %d sent by no part", seq)
		}
		if first := seen[seq/WorkBlock*WorkBlock]; p != first {
			t.Fatalf("request %d by part %d, its block's first by part %d", seq, p, first)
		}
	}
}

func startWorker(t *testing.T, wk *Worker) string {
	t.Helper()
	srv := httptest.NewServer(wk.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestLoadgenCoordinatorSplitsAndMerges: three workers (one whose clock
// is an hour ahead) each send their part of the hot scenario; the merged
// result counts every request once, in its histogram too, and holds every
// order the service accepted: what one generator would have measured.
func TestLoadgenCoordinatorSplitsAndMerges(t *testing.T) {
	f, _ := newFakeAPI(t, false)
	api := httptest.NewServer(f)
	t.Cleanup(api.Close)
	var workers []string
	for i := 0; i < 3; i++ {
		wk := &Worker{Token: "wt"}
		if i == 1 {
			wk.skew = time.Hour // were the start time sent on this clock, it would wait an hour
		}
		workers = append(workers, startWorker(t, wk))
	}
	sc, err := NewScenario(ScenarioConfig{Name: Hot, Stock: 1_000_000, RunID: "d"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f.stock[sc.SKUs()[0]] = 1_000_000
	const requests = 2 * 3 * WorkBlock * 7 // whole blocks for every worker
	co := Coordinator{Workers: workers, Token: "wt", StartIn: 200 * time.Millisecond}
	res, accepted, parts, err := co.Run(ctx, Work{Target: api.URL, UserSecret: "s", Scenario: sc.Config(),
		Mode: Closed, Concurrency: 7, Duration: time.Minute, Requests: requests})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != requests || res.Latency.TotalCount() != requests || res.Errors != 0 {
		t.Fatalf("merged: %d requests, %d in the histogram, %d errors; want %d, %d, 0", res.Requests, res.Latency.TotalCount(), res.Errors, requests, requests)
	}
	// Of every 7 requests: 5 first clicks and a double click accepted, one
	// second purchase refused: as one generator's run of the sequence.
	if res.Codes["accepted"] != requests*6/7 || res.Codes["limit_reached"] != requests/7 {
		t.Errorf("codes %v, want %d accepted and %d limit_reached", res.Codes, requests*6/7, requests/7)
	}
	var timeline int64
	for _, p := range res.Timeline {
		timeline += p.Completed
	}
	if timeline != requests {
		t.Errorf("the merged timeline counts %d answers, want %d", timeline, requests)
	}
	f.mu.Lock()
	orders := f.next
	f.mu.Unlock()
	ids := accepted[sc.SKUs()[0]]
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	if orders != requests*5/7 || len(distinct) != orders {
		t.Errorf("the service made %d orders, the workers report %d distinct accepted; want %d", orders, len(distinct), requests*5/7)
	}
	for _, p := range parts {
		if p.Requests != requests/3 {
			t.Errorf("worker %s sent %d requests, want a third: %d", p.Worker, p.Requests, requests/3)
		}
		if p.StartLag > 30*time.Minute {
			t.Errorf("worker %s started %v late: its clock offset was not applied", p.Worker, p.StartLag)
		}
	}
	sc.AddAccepted(accepted)
	if got := len(sc.Accepted()[sc.SKUs()[0]]); got != orders {
		t.Errorf("the scenario holds %d accepted orders after AddAccepted, want %d", got, orders)
	}
}

// TestLoadgenCoordinatorClockOffset: the offset read is the worker's
// clock's lead, to within the reading's round trip.
func TestLoadgenCoordinatorClockOffset(t *testing.T) {
	url := startWorker(t, &Worker{Token: "wt", skew: -90 * time.Second})
	co := Coordinator{Workers: []string{url}, Token: "wt"}
	off, rtt, err := co.ClockOffset(context.Background(), url, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d := off + 90*time.Second; d < -rtt || d > rtt {
		t.Errorf("offset %v (round trip %v), want -90s within the round trip", off, rtt)
	}
}

// TestLoadgenWorkerRefuses: a request without the token, a body that is
// not a Work, a Work that cannot run and a second run while one runs are
// each refused with a code, and run nothing.
func TestLoadgenWorkerRefuses(t *testing.T) {
	wk := &Worker{Token: "wt"}
	url := startWorker(t, wk)
	good := `{"target":"http://127.0.0.1:1","user_token_secret":"s","scenario":{"Name":"hot","Stock":10,"RunID":"x"},"part":0,"parts":1,"mode":"closed","concurrency":1,"duration_ns":1000000,"requests":1}`
	post := func(token, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/run", strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name, token, body string
		status            int
		code              string
	}{
		{"no token", "", good, 401, "unauthorized"},
		{"wrong token", "nope", good, 401, "unauthorized"},
		{"not JSON", "wt", "{", 400, "bad_work"},
		{"unknown field", "wt", strings.Replace(good, `"parts":1`, `"parts":1,"extra":1`, 1), 400, "bad_work"},
		{"part past parts", "wt", strings.Replace(good, `"part":0`, `"part":1`, 1), 400, "bad_work"},
		{"no secret", "wt", strings.Replace(good, `"s"`, `""`, 1), 400, "bad_work"},
		{"not a URL", "wt", strings.Replace(good, `http://127.0.0.1:1`, `ftp://x`, 1), 400, "bad_work"},
		{"unknown scenario", "wt", strings.Replace(good, `"hot"`, `"cold"`, 1), 400, "bad_work"},
		{"seq base off a block", "wt", strings.Replace(good, `"parts":1`, `"parts":1,"seq_base":7`, 1), 400, "bad_work"},
	} {
		status, body := post(c.token, c.body)
		if status != c.status || !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %s, want %d %s", c.name, status, body, c.status, c.code)
		}
	}
	wk.running.Store(MaxWorkRuns)
	if status, body := post("wt", good); status != 409 || !strings.Contains(body, `"busy"`) {
		t.Errorf("while busy: %d %s, want 409 busy", status, body)
	}
}

// TestLoadgenSourceAddresses: with Sources 4 the connections to a
// loopback server come from 127.0.0.1 to 127.0.0.4 in turn (each source
// address has its own ports: the per-address bound is lifted 4 times).
func TestLoadgenSourceAddresses(t *testing.T) {
	var mu sync.Mutex
	from := map[string]int{}
	base := connServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{}`)) }, func(c net.Conn) {
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		mu.Lock()
		from[host]++
		mu.Unlock()
	})
	res, err := HoldConnections(context.Background(), HoldConfig{Base: base, Conns: 8,
		Hold: 100 * time.Millisecond, Every: time.Second, Sources: 4, ServerPID: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Opened != 8 || len(from) != 4 {
		t.Fatalf("opened %d from %v, want 8 from 4 addresses", res.Opened, from)
	}
	for i := 1; i <= 4; i++ {
		if a := "127.0.0." + string(rune('0'+i)); from[a] != 2 {
			t.Errorf("%d connections from %s, want 2 (from %v)", from[a], a, from)
		}
	}
	if _, err := HoldConnections(context.Background(), HoldConfig{Base: base, Conns: 1,
		Hold: time.Millisecond, Every: time.Second, Sources: MaxSources + 1}); err == nil {
		t.Error("Sources past 254 accepted")
	}
}

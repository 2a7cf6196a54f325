package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

// TestLoadgenScenarioPaths: the purchase path's every request is a new
// buyer (accepted while stock lasts), the sold-out path's every request is
// refused once the set-up sold the sale out.
func TestLoadgenScenarioPaths(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, code string
		stock      int64
	}{{Purchase, "accepted", 1000}, {SoldOut, "sold_out", 30}} {
		_, cl := newFakeAPI(t, false)
		sc, err := NewScenario(ScenarioConfig{Name: c.name, Stock: c.stock, RunID: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if err := sc.Setup(ctx, cl); err != nil {
			t.Fatal(err)
		}
		setup := len(sc.Accepted()[sc.SKUs()[0]])
		op := sc.Op(cl)
		codes := map[string]int{}
		for seq := int64(0); seq < 70; seq++ {
			codes[op(ctx, seq).Code]++
		}
		if codes[c.code] != 70 || len(codes) != 1 || sc.PathCode() != c.code {
			t.Errorf("%s: answers %v (path code %q), want 70 %s", c.name, codes, sc.PathCode(), c.code)
		}
		want := 70 // a new buyer each
		if c.name == SoldOut {
			want = 0
		}
		if got := len(sc.Accepted()[sc.SKUs()[0]]) - setup; got != want {
			t.Errorf("%s: %d orders accepted by the run, want %d", c.name, got, want)
		}
		if c.name == SoldOut && setup != 30 {
			t.Errorf("sold-out: the set-up bought %d units, want all 30", setup)
		}
	}
}

// TestLoadgenRateOfOneCode: a path's figure counts only its own answers
// in the measured window.
func TestLoadgenRateOfOneCode(t *testing.T) {
	res, err := Run(context.Background(), Config{Mode: Closed, Concurrency: 4, Duration: time.Hour, Requests: 300},
		func(_ context.Context, seq int64) Outcome {
			switch seq % 3 {
			case 0:
				return Outcome{Code: "accepted"}
			case 1:
				return Outcome{Code: "sold_out"}
			}
			return Outcome{Code: "transport", Err: true}
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.WindowCodes["accepted"] != 100 || res.WindowCodes["sold_out"] != 100 || res.WindowCodes["transport"] != 0 || res.InWindow != 200 {
		t.Fatalf("window codes %v, in window %d: want 100 accepted, 100 sold_out, errors not counted", res.WindowCodes, res.InWindow)
	}
	r := NewStrategyResult("pipeline", res, &Verdict{Drained: true}, 100)
	r.SetPath(Purchase, "accepted", res.Throughput()*4, 0)
	p := r.Path
	if p.Answers != 100 || p.Other != 200 || p.Code != "accepted" || p.Name != Purchase {
		t.Errorf("path %+v: want 100 accepted answers, 200 others", p)
	}
	if got, want := p.RPS, round(100/res.Window.Seconds(), 1); got != want {
		t.Errorf("path rps %v, want %v (accepted answers only)", got, want)
	}
	if p.XEmpty <= 0 || p.XEmpty > 0.5 { // the empty handler here: 4x all answers without error
		t.Errorf("x empty %v, want about 1/8", p.XEmpty)
	}
}

func pathReport() *Report {
	rep := fakeReport()
	rep.Setup.Paths, rep.Setup.PurchaseStock = []string{Purchase, SoldOut}, 10_000_000
	rep.Baselines.EmptyHandlerP50Ms, rep.Baselines.EmptyHandlerP99Ms = 1, 20
	pur := NewStrategyResult("pipeline", fakeRun(time.Millisecond, 2*time.Millisecond, 40*time.Millisecond), &Verdict{Drained: true}, 3)
	pur.SetPath(Purchase, "accepted", 1000, 20)
	pur.Backlog = []BacklogPoint{{At: 100 * time.Millisecond, InFlight: 10}, {At: 600 * time.Millisecond, InFlight: 60}, {At: 1100 * time.Millisecond, InFlight: 110}}
	pur.SetDrain(DrainFigures{AtEnd: Backlog{InFlight: 1234, Outbox: 5}, ToZero: 750 * time.Millisecond, Drained: true}, 0, time.Second)
	pur.ProcessCPU = &ProcessCPU{ServerPID: 42, ServerS: 1.5, GeneratorS: 0.5, ServerUsPerReq: 300, GeneratorUsPerReq: 100,
		RedisUsPerReq: 60, DatabaseUsPerReq: 75, NATSUsPerReq: 25, SystemUsPerReq: 460}
	soRun := fakeRun(time.Millisecond)
	soRun.Codes, soRun.WindowCodes = map[string]int64{"sold_out": 1}, map[string]int64{"sold_out": 1}
	so := NewStrategyResult("pipeline", soRun, &Verdict{Drained: true}, 1000)
	so.SetPath(SoldOut, "sold_out", 1000, 20)
	so.ProcessCPU = &ProcessCPU{ServerPID: 42, ServerUsPerReq: 60}
	rep.Baselines.EmptyHandlerCPUUsPerReq = 40
	rep.Results = []*StrategyResult{pur, so}
	rep.SetHeadline()
	return rep
}

// TestLoadgenReportPaths: the headline and the paths' figures are in the
// JSON, the table and the page.
func TestLoadgenReportPaths(t *testing.T) {
	rep := pathReport()
	h := rep.Headline
	if h == nil || h.Strategy != "pipeline" || h.PurchaseRPS != 3 || h.PurchaseXEmpty != 0.003 || h.SoldOutRPS != 1 ||
		h.BacklogAtEnd != 1234 || h.BacklogGrowthPerS != 100 || h.DrainToZeroS != 0.75 || !h.DrainedToZero || h.ServerCPUUsPerPurchase != 300 || h.PurchaseP99XEmpty < 1.99 || h.PurchaseP99XEmpty > 2.01 ||
		h.SystemCPUUsPerPurchase != 460 || h.DatabaseCPUUsPerPurchase != 75 || h.ServerCPUPurchaseXEmpty != 7.5 || h.SystemCPUPurchaseXEmpty != 11.5 ||
		h.ServerCPUUsPerSoldOut != 60 || h.ServerCPUSoldOutXEmpty != 1.5 {
		t.Fatalf("headline %+v", h)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var got struct {
		Headline  map[string]any     `json:"headline"`
		Baselines map[string]float64 `json:"baselines"`
		Results   []struct {
			Path       map[string]any `json:"path"`
			ProcessCPU map[string]any `json:"process_cpu"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"purchase_x_empty", "sold_out_x_empty", "purchase_p99_x_empty", "backlog_at_end", "backlog_growth_per_s", "drain_to_zero_s", "server_cpu_us_per_purchase",
		"system_cpu_us_per_purchase", "redis_cpu_us_per_purchase", "database_cpu_us_per_purchase", "nats_cpu_us_per_purchase",
		"server_cpu_purchase_x_empty", "server_cpu_sold_out_x_empty", "system_cpu_purchase_x_empty"} {
		if _, ok := got.Headline[k]; !ok {
			t.Errorf("JSON headline lacks %s: %v", k, got.Headline)
		}
	}
	if got.Baselines["empty_handler_p99_ms"] != 20 {
		t.Errorf("baselines %v", got.Baselines)
	}
	if len(got.Results) != 2 || got.Results[0].Path["name"] != "purchase" || got.Results[1].Path["code"] != "sold_out" ||
		got.Results[0].Path["backlog_at_end"] != 1234.0 || got.Results[0].ProcessCPU["server_cpu_us_per_req"] != 300.0 {
		t.Errorf("results %+v", got.Results)
	}
	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	for _, want := range []string{"HEADLINE pipeline: purchase 3 req/s = 0.00x empty handler, p99", "backlog 1234 at the load's end (growing 100/s while measured), zero 0.75s after",
		"sold-out 1 req/s", "pipeline purchase", "pipeline sold-out", "CPU per purchase: server 300 µs (7.50x the empty handler's), redis 60 µs, database 75 µs, nats 25 µs, whole system 460 µs (11.50x), generator 100 µs",
		"server CPU per sold-out answer 60 µs (1.50x)", "p99 20.00 ms"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	var page bytes.Buffer
	if err := rep.renderHTML(&page, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Headline: pipeline", "purchase path (accepted answers only)", "sold-out path (sold_out answers only)",
		"1234 reservations (growing 100/s while measured), zero 0.75 s after", "<h2>Paths</h2>", "300 µs (generator process 100 µs)", "<b>7.50x</b>", "460 µs: server 300, redis 60, database 75, nats 25", "<b>11.50x</b>", "<b>1.50x</b>"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// TestLoadgenNotDrained: a backlog that never reaches zero is reported so,
// in the headline too.
func TestLoadgenNotDrained(t *testing.T) {
	rep := pathReport()
	rep.Results[0].SetDrain(DrainFigures{AtEnd: Backlog{InFlight: 9}, ToZero: time.Minute}, 0, time.Second)
	rep.SetHeadline()
	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	if !strings.Contains(tbl.String(), "NOT DRAINED") || !strings.Contains(tbl.String(), "backlog 9 at the load's end (growing 100/s while measured), NOT drained to zero") {
		t.Errorf("table:\n%s", tbl.String())
	}
}

// TestLoadgenWaitBacklogZero reads a gate's res hash and outbox in a real
// Redis: the backlog at the end, then zero once they are emptied.
func TestLoadgenWaitBacklogZero(t *testing.T) {
	url, prefix := testenv.Redis(t)
	c := testenv.RedisClient(t, url)
	gate := stockgate.New(c, prefix)
	ctx := context.Background()
	k := gate.KeysOf("bk")
	if err := c.Do(ctx, c.B().Hset().Key(k.Res).FieldValue().FieldValue("a", "1").FieldValue("b", "1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Zadd().Key(k.Outbox).ScoreMember().ScoreMember(1, "b").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// Emptied once the backlog at the end was read (a fixed 50 ms came
	// first on a starved CI machine, between the two reads it then took).
	d, err := waitBacklogZero(ctx, c, gate, []string{"bk"}, time.Minute, func() {
		go func() {
			time.Sleep(20 * time.Millisecond)
			c.Do(ctx, c.B().Del().Key(k.Res, k.Outbox).Build())
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.AtEnd != (Backlog{InFlight: 2, Outbox: 1}) || !d.Drained || d.ToZero <= 0 {
		t.Errorf("drain %+v: want 2 in flight and 1 in the outbox at the end, then drained", d)
	}
	d, err = WaitBacklogZero(ctx, c, gate, []string{"bk"}, time.Minute)
	if err != nil || d.AtEnd != (Backlog{}) || !d.Drained || d.ToZero != 0 {
		t.Errorf("an empty backlog: %+v %v, want drained at once", d, err)
	}
}

// TestLoadgenListenerPIDAndMemory finds this process from its listening
// port and reads its memory.
func TestLoadgenListenerPIDAndMemory(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pid, err := ListenerPID("http://" + ln.Addr().String())
	if err != nil || pid != os.Getpid() {
		t.Errorf("ListenerPID = %d, %v; want this process %d", pid, err, os.Getpid())
	}
	ln.Close()
	if pid, err := ListenerPID("http://" + ln.Addr().String()); err == nil {
		t.Errorf("a closed port: pid %d", pid)
	}
	m, err := ReadMemory(os.Getpid())
	if err != nil || m.RSS <= 0 || m.HWM < m.RSS {
		t.Errorf("ReadMemory = %+v, %v", m, err)
	}
}

// TestLoadgenHoldConnections: every connection is its own, kept alive and
// answering until the end of the hold.
func TestLoadgenHoldConnections(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	requests := 0
	base := connServer(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		w.Write([]byte(`{"status":"ok"}`))
	}, func(c net.Conn) {
		mu.Lock()
		conns[c] = true
		mu.Unlock()
	})
	res, err := HoldConnections(context.Background(), HoldConfig{Base: base, Conns: 40,
		Hold: 300 * time.Millisecond, Every: 100 * time.Millisecond, ServerPID: os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Opened != 40 || res.Held != 40 || res.Errors != 0 || len(conns) != 40 {
		t.Errorf("opened %d, held %d, errors %d, the server saw %d connections; want 40, 40, 0, 40", res.Opened, res.Held, res.Errors, len(conns))
	}
	if res.Requests != int64(requests) || res.Requests < 80 { // the first of each, then about 3 each
		t.Errorf("%d requests answered, the server counted %d; want at least 2 per connection", res.Requests, requests)
	}
	// The kernel updates VmHWM lazily (RSS is counted per CPU and folded in
	// batches), so it may trail an earlier VmRSS reading by a fraction of
	// a megabyte (seen: 77.3 after 77.4).
	if res.RSSMB <= 0 || res.HWMMB+1 < res.RSSBeforeMB || res.ServerPID != os.Getpid() || res.FileLimit <= 0 {
		t.Errorf("memory %+v", res)
	}
}

func TestLoadgenBacklogSlope(t *testing.T) {
	pts := func(vals ...int64) []BacklogPoint {
		var out []BacklogPoint
		for i, v := range vals {
			out = append(out, BacklogPoint{At: time.Duration(i) * 100 * time.Millisecond, InFlight: v})
		}
		return out
	}
	cases := []struct {
		name     string
		points   []BacklogPoint
		from, to time.Duration
		want     float64
	}{
		{"bounded", pts(50, 50, 50, 50), 0, time.Second, 0},
		{"growing 1000/s", pts(0, 100, 200, 300), 0, time.Second, 1000},
		{"warm-up excluded", pts(900, 0, 0, 0), 100 * time.Millisecond, time.Second, 0},
		{"one sample", pts(5), 0, time.Second, 0},
	}
	for _, c := range cases {
		if got := BacklogSlope(c.points, c.from, c.to); got < c.want-1e-6 || got > c.want+1e-6 {
			t.Errorf("%s: slope %v, want %v", c.name, got, c.want)
		}
	}
}

// TestLoadgenTablesCountAlike: the two tables count the same requests the
// same way: every answer after the warm-up, the ones after the time bound
// included, so a path's answers and other answers add up to the requests
// of the first table; only the rates are of the measured window.
func TestLoadgenTablesCountAlike(t *testing.T) {
	run := fakeRun(time.Millisecond, 2*time.Millisecond)
	run.Requests, run.Errors, run.InWindow = 110, 2, 96
	run.Codes = map[string]int64{"accepted": 100, "sold_out": 8, "transport": 2}
	run.WindowCodes = map[string]int64{"accepted": 90, "sold_out": 6} // 14 answered after the time bound
	r := NewStrategyResult("pipeline", run, &Verdict{Drained: true}, 100)
	r.SetPath(Purchase, "accepted", 1000, 20)
	if p := r.Path; p.Answers+p.Other != r.Requests || p.Answers != 100 || p.RPS != 90 {
		t.Errorf("path answers %d + other %d, requests %d, rps %v: want 100 + 10 = 110 answers, 90/s in the window", p.Answers, p.Other, r.Requests, p.RPS)
	}
	rep := fakeReport()
	rep.Setup.Paths, rep.Setup.PurchaseStock = []string{Purchase}, 1000
	rep.Results = []*StrategyResult{r}
	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	text := tbl.String()
	for _, want := range []string{"pipeline purchase 110", "pipeline purchase accepted 100 10", "answers after the warm-up: accepted 100, sold_out 8, transport 2"} {
		if !strings.Contains(strings.Join(strings.Fields(text), " "), want) {
			t.Errorf("tables lack %q:\n%s", want, text)
		}
	}
}

// TestLoadgenProcessCPU: the processes' cores over the span become CPU
// seconds and microseconds per answer; the whole system counts the server,
// Redis, the database and NATS, not the generator, and only when the
// server runs in its own process. cpuBetween puts each process in its
// column by name.
func TestLoadgenProcessCPU(t *testing.T) {
	run := &Result{Requests: 1000, CPU: CPU{Machine: 1.9, Self: 0.2, Server: 0.8, Redis: 0.3, Database: 0.4, NATS: 0.1, ServerPID: 42, Span: time.Second}}
	p := NewProcessCPU(run)
	if p.SameProcess || p.ServerUsPerReq != 800 || p.GeneratorUsPerReq != 200 || p.RedisUsPerReq != 300 || p.DatabaseUsPerReq != 400 ||
		p.NATSUsPerReq != 100 || p.SystemUsPerReq != 1600 {
		t.Errorf("separate processes: %+v", p)
	}
	if o := run.CPU.Other(); o < 0.099 || o > 0.101 {
		t.Errorf("other %v, want 0.1", o)
	}
	run.CPU.ServerPID, run.CPU.Server = 0, 0
	if p := NewProcessCPU(run); !p.SameProcess || p.ServerUsPerReq != 200 || p.SystemUsPerReq != 0 {
		t.Errorf("in-process: %+v", p)
	}

	a := cpuSample{at: time.Unix(0, 0), samples: true, procs: map[int]procTicks{
		1: {"redis-server", 0}, 2: {"postgres", 0}, 3: {"nats-server", 0}, 4: {"mariadbd", 0}, 5: {"flashsale", 0}, 6: {"other", 0}}}
	b := cpuSample{at: time.Unix(1, 0), busy: 3, samples: true, procs: map[int]procTicks{
		1: {"redis-server", 50}, 2: {"postgres", 20}, 3: {"nats-server", 30}, 4: {"mariadbd", 10}, 5: {"flashsale", 70}, 6: {"other", 40}}}
	c := cpuBetween(a, b, 5)
	if round(c.Redis, 6) != 0.5 || round(c.Database, 6) != 0.3 || round(c.NATS, 6) != 0.3 || round(c.Server, 6) != 0.7 || c.ServerPID != 5 {
		t.Errorf("cpuBetween: %+v", c)
	}
}

// connServer serves handler on a loopback port until the test ends, calls
// onNew with every new connection, and returns its base URL.
func connServer(t *testing.T, handler http.HandlerFunc, onNew func(net.Conn)) string {
	t.Helper()
	srv := &http.Server{Handler: handler, ConnState: func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			onNew(c)
		}
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

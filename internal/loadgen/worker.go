package loadgen

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Load from many processes and machines: a worker (flashsale bench
// -worker) runs on each load machine and waits; a coordinator (the bench
// with -workers) sets the sales up, splits the buyers and the rate between
// the workers, has them all start at one moment, merges what they measured
// (the HdrHistograms exactly, the counts, the timelines) and checks the
// invariants once, from the database and Redis.
//
// The workers' clocks need not agree with the coordinator's: before a run
// the coordinator reads each worker's clock over the network and sends
// each its start time on its own clock (the offset of the reading with the
// shortest round trip, as NTP does; the error is at most half of that
// round trip).
//
// The protocol is HTTP with JSON bodies, every request with the bearer
// token the worker was started with:
//
//	GET  /v1/clock  {"now_ns": ...}: the worker's clock
//	POST /v1/run    a Work: runs it and answers its WorkResult
//
// A worker runs up to MaxWorkRuns Works at once (409 busy past them): a
// drill sends every phase's part ahead, each to start at its moment.

// WorkBlock is the run of consecutive sequence numbers a worker keeps
// together: a multiple of every scenario's period (7 for the buyers' clicks,
// 4 for Mix's settling), so a buyer's double click and second purchase go
// out from the worker that sent its first. A Work's SeqBase is a multiple.
const WorkBlock = 28

// ParseWorkers reads a comma-separated list of workers' URLs (-workers):
// each an http:// or https:// URL with a host, a trailing slash dropped.
func ParseWorkers(list string) ([]string, error) {
	var out []string
	for _, w := range strings.Split(list, ",") {
		if w = strings.TrimRight(strings.TrimSpace(w), "/"); w == "" {
			continue
		}
		if err := CheckTarget(w, true); err != nil {
			return nil, fmt.Errorf("-workers: %w", err)
		}
		out = append(out, w)
	}
	return out, nil
}

// MaxWorkRuns is how many Works a worker runs at once.
const MaxWorkRuns = 16

// Work is one worker's part of a run.
type Work struct {
	Target     string         `json:"target"`
	UserSecret string         `json:"user_token_secret"`
	Scenario   ScenarioConfig `json:"scenario"`
	// Lifecycle: the service has the pay and cancel routes (Mix).
	Lifecycle bool `json:"lifecycle,omitempty"`
	// Part of Parts: which of the scenario's requests this worker sends.
	Part        int           `json:"part"`
	Parts       int           `json:"parts"`
	Mode        Mode          `json:"mode"`
	Concurrency int           `json:"concurrency"`
	Rate        float64       `json:"rate,omitempty"`
	Duration    time.Duration `json:"duration_ns"`
	Warmup      time.Duration `json:"warmup_ns,omitempty"`
	Requests    int64         `json:"requests,omitempty"`
	// SeqBase is added to every request's number: a drill's later phase
	// gets buyers of its own (a multiple of WorkBlock).
	SeqBase int64 `json:"seq_base,omitempty"`
	Sources int   `json:"sources,omitempty"`
	// StartAt is when the load starts, on the worker's clock.
	StartAt time.Time `json:"start_at"`
}

// Validate reports a Work that cannot run.
func (w Work) Validate() error {
	switch {
	case w.Parts < 1 || w.Part < 0 || w.Part >= w.Parts:
		return fmt.Errorf("part %d of %d: need 0 <= part < parts", w.Part, w.Parts)
	case w.UserSecret == "":
		return errors.New("the user token secret is required (it signs the buyers' tokens)")
	case w.SeqBase < 0 || w.SeqBase%WorkBlock != 0:
		return fmt.Errorf("seq_base %d: must be a multiple of %d, 0 or more", w.SeqBase, WorkBlock)
	}
	if err := CheckTarget(w.Target, true); err != nil {
		return err
	}
	if err := checkSources(w.Sources); err != nil {
		return err
	}
	if _, err := NewScenario(w.Scenario); err != nil {
		return err
	}
	return w.config().Validate()
}

func (w Work) config() Config {
	return Config{Mode: w.Mode, Concurrency: w.Concurrency, Rate: w.Rate, Duration: w.Duration, Warmup: w.Warmup,
		Requests: w.Requests, StartAt: w.StartAt}
}

// WorkResult is what a worker measured of its part.
type WorkResult struct {
	Worker      string                 `json:"worker"`
	StartLag    time.Duration          `json:"start_lag_ns"` // from StartAt to the first request's due time
	Elapsed     time.Duration          `json:"elapsed_ns"`
	Window      time.Duration          `json:"window_ns"`
	Requests    int64                  `json:"requests"`
	Errors      int64                  `json:"errors"`
	InWindow    int64                  `json:"in_window"`
	Late        int64                  `json:"late"`
	Codes       map[string]int64       `json:"codes"`
	WindowCodes map[string]int64       `json:"window_codes"`
	Latency     *hdrhistogram.Snapshot `json:"latency"`
	Service     *hdrhistogram.Snapshot `json:"service"`
	Timeline    []Point                `json:"timeline"`
	// CPU is the cores the worker's process used on average over CPUSpan.
	CPU     float64       `json:"cpu_cores"`
	CPUSpan time.Duration `json:"cpu_span_ns"`
	// Accepted are the order ids answered 202, by SKU.
	Accepted map[string][]string `json:"accepted"`
}

// partOp sends the part-th of every parts blocks of op's sequence, from
// base on.
func partOp(op Op, part, parts int, base int64) Op {
	p, n := int64(part), int64(max(parts, 1))
	return func(ctx context.Context, seq int64) Outcome {
		return op(ctx, base+(seq/WorkBlock*n+p)*WorkBlock+seq%WorkBlock)
	}
}

// RunWork runs w: its part of the scenario against its target, from its
// start time.
func RunWork(ctx context.Context, w Work) (*WorkResult, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	sc, err := NewScenario(w.Scenario)
	if err != nil {
		return nil, err
	}
	sc.lifecycle = w.Lifecycle
	conns := w.Concurrency
	if conns == 0 {
		conns = 10000
	}
	cl, err := NewClientWith(w.Target, "", w.UserSecret, conns, ClientOptions{Remote: true, Sources: w.Sources})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	res, err := Run(ctx, w.config(), partOp(sc.Op(cl), w.Part, w.Parts, w.SeqBase))
	if err != nil {
		return nil, err
	}
	return &WorkResult{StartLag: res.StartLag, Elapsed: res.Elapsed, Window: res.Window, Requests: res.Requests,
		Errors: res.Errors, InWindow: res.InWindow, Late: res.Late, Codes: res.Codes, WindowCodes: res.WindowCodes,
		Latency: res.Latency.Export(), Service: res.Service.Export(), Timeline: res.Timeline,
		CPU: res.CPU.Self, CPUSpan: res.CPU.Span, Accepted: sc.Accepted()}, nil
}

// Worker answers a coordinator's requests (the protocol above).
type Worker struct {
	// Token is the bearer token every request must carry.
	Token string
	// Logf, if set, logs each run.
	Logf    func(format string, args ...any)
	running atomic.Int32
	// skew sets this worker's clock ahead of the machine's (tests: a load
	// machine whose clock is off).
	skew time.Duration
}

// Handler returns the worker's HTTP handler.
func (wk *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/clock", func(w http.ResponseWriter, r *http.Request) {
		if !wk.authorized(w, r) {
			return
		}
		writeJSON(w, http.StatusOK, map[string]int64{"now_ns": time.Now().Add(wk.skew).UnixNano()})
	})
	mux.HandleFunc("POST /v1/run", func(w http.ResponseWriter, r *http.Request) {
		if !wk.authorized(w, r) {
			return
		}
		var work Work
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&work); err != nil {
			workError(w, http.StatusBadRequest, "bad_work", "the run's JSON: "+err.Error())
			return
		}
		if err := work.Validate(); err != nil {
			workError(w, http.StatusBadRequest, "bad_work", err.Error())
			return
		}
		if wk.running.Add(1) > MaxWorkRuns {
			wk.running.Add(-1)
			workError(w, http.StatusConflict, "busy", fmt.Sprintf("this worker is running %d parts already", MaxWorkRuns))
			return
		}
		defer wk.running.Add(-1)
		wk.logf("part %d of %d: %s %s for %s from %s", work.Part+1, work.Parts, work.Mode, work.Scenario.Name,
			work.Duration, work.StartAt.Format(time.RFC3339Nano))
		work.StartAt = work.StartAt.Add(-wk.skew)
		res, err := RunWork(r.Context(), work)
		if err != nil {
			workError(w, http.StatusInternalServerError, "run_failed", err.Error())
			return
		}
		wk.logf("part %d of %d: %d answers, %d errors", work.Part+1, work.Parts, res.Requests, res.Errors)
		writeJSON(w, http.StatusOK, res)
	})
	return mux
}

func (wk *Worker) logf(format string, args ...any) {
	if wk.Logf != nil {
		wk.Logf(format, args...)
	}
}

func (wk *Worker) authorized(w http.ResponseWriter, r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && wk.Token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(wk.Token)) == 1 {
		return true
	}
	workError(w, http.StatusUnauthorized, "unauthorized", "a worker request needs the worker's token: Authorization: Bearer TOKEN")
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func workError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// Coordinator runs a scenario's load on workers.
type Coordinator struct {
	// Workers are the workers' base URLs (http://host:port).
	Workers []string
	Token   string
	// StartIn is how long after the workers' clocks are read the load
	// starts (default 2 s): time for every worker to get its part.
	StartIn time.Duration
	HTTP    *http.Client
	// ServerPID is the server's process when it runs on this machine: the
	// run's CPU figures are this machine's (the server, Redis, the
	// database, NATS), with the workers' processes as the generator.
	ServerPID int
}

func (c *Coordinator) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// ClockOffset returns how far worker's clock is ahead of this one's, from
// the reading of n with the shortest round trip, and that round trip.
func (c *Coordinator) ClockOffset(ctx context.Context, worker string, n int) (offset, rtt time.Duration, err error) {
	rtt = -1
	for i := 0; i < n; i++ {
		t0 := time.Now()
		var got struct {
			NowNs int64 `json:"now_ns"`
		}
		if err := c.call(ctx, http.MethodGet, worker+"/v1/clock", nil, &got); err != nil {
			return 0, 0, err
		}
		t1 := time.Now()
		if d := t1.Sub(t0); rtt < 0 || d < rtt {
			rtt = d
			offset = time.Unix(0, got.NowNs).Sub(t0.Add(d / 2))
		}
	}
	return offset, rtt, nil
}

// Run splits base between the workers (buyers or rate, and the request
// bound, each worker its Part), starts them all at one moment (base.StartAt
// on this machine's clock if set, else StartIn from now) and merges
// their results: the run as one generator would have measured it (its CPU
// the workers' processes, summed), the orders accepted by SKU, and each
// worker's own result.
func (c *Coordinator) Run(ctx context.Context, base Work) (*Result, map[string][]string, []*WorkResult, error) {
	n := len(c.Workers)
	if n == 0 {
		return nil, nil, nil, errors.New("loadgen: no workers")
	}
	if base.Mode == Closed && base.Concurrency < n {
		return nil, nil, nil, fmt.Errorf("loadgen: %d buyers cannot be split between %d workers", base.Concurrency, n)
	}
	offsets := make([]time.Duration, n)
	var slowest time.Duration
	for i, wk := range c.Workers {
		off, rtt, err := c.ClockOffset(ctx, wk, 5)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("worker %s: %w", wk, err)
		}
		offsets[i], slowest = off, max(slowest, rtt)
	}
	startIn := c.StartIn
	if startIn <= 0 {
		startIn = 2 * time.Second
	}
	start := time.Now().Add(startIn + 2*slowest)
	if !base.StartAt.IsZero() {
		start = base.StartAt // the caller's moment, on this machine's clock
	}
	results := make([]*WorkResult, n)
	errs := make([]error, n)
	cpuAt := make(chan cpuSample, 1)
	cpuTimer := time.AfterFunc(time.Until(start.Add(base.Warmup)), func() { cpuAt <- sampleCPU() })
	defer cpuTimer.Stop()
	var wg sync.WaitGroup
	for i, wk := range c.Workers {
		w := base
		w.Part, w.Parts = i, n
		w.Concurrency = share(int64(base.Concurrency), i, n)
		w.Requests = share64(base.Requests, i, n)
		w.Rate = base.Rate / float64(n)
		w.StartAt = start.Add(offsets[i])
		wg.Go(func() {
			var r WorkResult
			if err := c.call(ctx, http.MethodPost, wk+"/v1/run", w, &r); err != nil {
				errs[i] = fmt.Errorf("worker %s: %w", wk, err)
				return
			}
			r.Worker = wk
			results[i] = &r
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, results, err
	}
	res, accepted := merge(base.Mode, results)
	select {
	case first := <-cpuAt:
		cpu := cpuBetween(first, sampleCPU(), c.ServerPID)
		cpu.Self = res.CPU.Self // the workers', not this process's
		res.CPU = cpu
	default: // ended during the warm-up
	}
	return res, accepted, results, nil
}

// share is part i of n of total, the remainder to the first parts.
func share(total int64, i, n int) int {
	return int(share64(total, i, n))
}

func share64(total int64, i, n int) int64 {
	s := total / int64(n)
	if int64(i) < total%int64(n) {
		s++
	}
	return s
}

// merge is the workers' results as one run's.
func merge(mode Mode, parts []*WorkResult) (*Result, map[string][]string) {
	res := &Result{Mode: mode, Latency: NewHistogram(), Service: NewHistogram(), Codes: map[string]int64{}, WindowCodes: map[string]int64{}}
	accepted := map[string][]string{}
	var cpuSpan time.Duration
	for _, p := range parts {
		res.Elapsed, res.Window = max(res.Elapsed, p.Elapsed), max(res.Window, p.Window)
		res.Requests += p.Requests
		res.Errors += p.Errors
		res.InWindow += p.InWindow
		res.Late += p.Late
		res.StartLag = max(res.StartLag, p.StartLag)
		mergeCodes(res.Codes, p.Codes)
		mergeCodes(res.WindowCodes, p.WindowCodes)
		if p.Latency != nil {
			res.Latency.Merge(hdrhistogram.Import(p.Latency))
		}
		if p.Service != nil {
			res.Service.Merge(hdrhistogram.Import(p.Service))
		}
		for i, pt := range p.Timeline {
			if i == len(res.Timeline) {
				res.Timeline = append(res.Timeline, Point{At: pt.At})
			}
			res.Timeline[i].Completed += pt.Completed
			res.Timeline[i].Errors += pt.Errors
		}
		res.CPU.Self += p.CPU
		cpuSpan = max(cpuSpan, p.CPUSpan)
		for sku, ids := range p.Accepted {
			accepted[sku] = append(accepted[sku], ids...)
		}
	}
	res.CPU.Span = cpuSpan
	return res, accepted
}

// call sends a request to a worker and decodes its JSON answer into out.
func (c *Coordinator) call(ctx context.Context, method, url string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<30))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
			return fmt.Errorf("HTTP %d %s: %s", resp.StatusCode, e.Error.Code, e.Error.Message)
		}
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.Unmarshal(raw, out)
}

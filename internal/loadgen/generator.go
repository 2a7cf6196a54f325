// Package loadgen is the load generator of flashsale bench: virtual buyers in closed or open loop, pacing, exact latency histograms, scenarios over the HTTP API, drain and invariant checks, and the reports.
//
// Closed loop: Concurrency virtual buyers, each sending its next request when
// the previous one is answered (the throughput a fixed population gets).
// Open loop: requests are due at a fixed rate whatever the answers; latency
// is measured from the time each request was due, not from when it could be
// sent, so a stalled server is charged for the requests it held up (no
// coordinated omission). Both stop at a time bound and an optional count bound.
package loadgen

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Mode is how requests are paced.
type Mode string

// Modes.
const (
	Closed Mode = "closed"
	Open   Mode = "open"
)

// Config of one run of the generator.
type Config struct {
	Mode Mode
	// Concurrency: closed loop, the virtual buyers (requests in flight);
	// open loop, the most requests in flight (default 10000): past it a due
	// request waits, and its wait counts in its latency.
	Concurrency int
	// Rate is the open loop's requests per second.
	Rate float64
	// Duration: no request starts after it (required), counted after Warmup.
	Duration time.Duration
	// Warmup runs the load this long before measuring: connections are
	// opened, caches and pools filled. Requests answered during it are not
	// measured (their effects, such as orders, are real); those answered
	// after it are, so the measurement starts in the steady state.
	Warmup time.Duration
	// Requests, if positive, bounds the number of requests, warm-up included.
	Requests int64
	// Bucket is the resolution of the timeline (default 100ms).
	Bucket time.Duration
	// Progress, if set, is called about every ProgressEvery (default 500ms)
	// while the run lasts, and once at the end.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// ServerPID, if set, is the process of the server under load when it
	// is not this one: its CPU is counted apart (CPU.Server).
	ServerPID int
	// StartAt, if set, is when the load starts (Run waits for it): the
	// moment every worker of a distributed run starts at (worker.go).
	StartAt time.Time
}

// Validate reports a configuration that cannot run.
func (c Config) Validate() error {
	switch {
	case c.Mode != Closed && c.Mode != Open:
		return fmt.Errorf("loadgen: mode must be %q or %q, got %q", Closed, Open, c.Mode)
	case c.Duration <= 0:
		return fmt.Errorf("loadgen: a positive duration is required (it bounds the run)")
	case c.Warmup < 0:
		return fmt.Errorf("loadgen: warm-up must not be negative")
	case c.Requests < 0:
		return fmt.Errorf("loadgen: requests must be 0 (no count bound) or more")
	case c.Mode == Closed && c.Concurrency < 1:
		return fmt.Errorf("loadgen: closed loop needs at least 1 buyer")
	case c.Mode == Open && !(c.Rate > 0 && c.Rate <= 1e7):
		return fmt.Errorf("loadgen: open loop needs a rate in (0, 1e7] requests/s")
	case c.Concurrency < 0:
		return fmt.Errorf("loadgen: concurrency must not be negative")
	}
	return nil
}

// Outcome is what one request got: a short code ("accepted", "sold_out",
// "transport", ...) and whether it counts as an error.
type Outcome struct {
	Code string
	Err  bool
}

// Op sends request number seq (0, 1, 2, ...) and returns its outcome. It
// is called from many goroutines at once.
type Op func(ctx context.Context, seq int64) Outcome

// Progress is a live view of a run.
type Progress struct {
	Elapsed  time.Duration
	Duration time.Duration
	Done     int64 // requests answered
	Errors   int64
	InFlight int64
	Codes    map[string]int64
	Final    bool
}

// Point is one bucket of the timeline.
type Point struct {
	// At is the end of the bucket, from the start of the run.
	At        time.Duration
	Completed int64 // requests answered in the bucket
	Errors    int64
}

// Result of a run.
type Result struct {
	Mode Mode
	// Elapsed is from the start of the measurement (after the warm-up) to
	// the last answer.
	Elapsed time.Duration
	// Window is what Throughput divides by: the run's duration when the
	// time bound ended it, else Elapsed (count bound or ctx, sooner).
	Window   time.Duration
	Requests int64 // answered
	Errors   int64
	// InWindow counts the requests answered without error within Window.
	InWindow int64
	Codes    map[string]int64
	// WindowCodes counts the answers without error within Window, by code:
	// what RateOf divides (InWindow is their sum).
	WindowCodes map[string]int64
	// Latency of every request in microseconds: from the time it was due
	// (open loop) or sent (closed loop) to its answer.
	Latency *hdrhistogram.Histogram
	// Service is from the actual send to the answer (equal to Latency in
	// closed loop; below it in open loop when the generator fell behind).
	Service  *hdrhistogram.Histogram
	Timeline []Point
	// Late counts open-loop requests sent more than a millisecond after due.
	Late int64
	// CPU is where the machine's processor time went while measuring.
	CPU CPU
	// StartLag is how late the load started after Config.StartAt (the
	// most of any worker's, in a distributed run).
	StartLag time.Duration
}

// Throughput returns the requests answered without error per second of
// Window (the sustained rate; requests still in flight at the time bound
// do not count).
func (r *Result) Throughput() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.InWindow) / r.Window.Seconds()
}

// RateOf returns the answers with code (and no error) per second of
// Window: the throughput of one kind of answer, such as the accepted
// purchases of a run that also got refusals.
func (r *Result) RateOf(code string) float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.WindowCodes[code]) / r.Window.Seconds()
}

// Percentile returns the latency at percentile p (0-100).
func (r *Result) Percentile(p float64) time.Duration {
	return time.Duration(r.Latency.ValueAtPercentile(p)) * time.Microsecond
}

// Histogram bounds: 1 µs to 10 minutes, 3 significant digits (values are
// exact to 0.1%).
const (
	histMin    = 1
	histMax    = int64(10 * time.Minute / time.Microsecond)
	histDigits = 3
	shards     = 16
)

// NewHistogram returns an empty latency histogram in microseconds.
func NewHistogram() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// Schedule returns when request i of an open loop at rate per second is
// due, from the start: i/rate seconds, computed from i (never accumulated,
// so it does not drift).
func Schedule(rate float64, i int64) time.Duration {
	return time.Duration(math.Round(float64(i) * 1e9 / rate))
}

type shard struct {
	mu       sync.Mutex
	latency  *hdrhistogram.Histogram
	service  *hdrhistogram.Histogram
	codes    map[string]int64
	window   map[string]int64 // codes of the answers counted in inWindow
	errors   int64
	done     int64
	inWindow int64
}

type run struct {
	cfg      Config
	start    time.Time // of the load, warm-up included
	measure  time.Time // of the measurement: start + warm-up
	deadline time.Time
	shards   [shards]shard
	timeline []atomic.Int64
	tlErrors []atomic.Int64
	inFlight atomic.Int64
	late     atomic.Int64
	// timeBound is set when the time bound, not the count or ctx, ended sending.
	timeBound atomic.Bool
}

// Run drives op as cfg says and returns what it measured. It returns when
// every request sent has been answered; ctx ending stops sending (requests
// in flight see ctx too).
func Run(ctx context.Context, cfg Config, op Op) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Bucket <= 0 {
		cfg.Bucket = 100 * time.Millisecond
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 500 * time.Millisecond
	}
	if cfg.Mode == Open && cfg.Concurrency == 0 {
		cfg.Concurrency = 10000
	}
	r := &run{cfg: cfg}
	for i := range r.shards {
		r.shards[i].latency = NewHistogram()
		r.shards[i].service = NewHistogram()
		r.shards[i].codes = map[string]int64{}
		r.shards[i].window = map[string]int64{}
	}
	// Answers may come up to a request timeout after the time bound.
	n := int((cfg.Duration+time.Minute)/cfg.Bucket) + 1
	r.timeline = make([]atomic.Int64, n)
	r.tlErrors = make([]atomic.Int64, n)

	if !cfg.StartAt.IsZero() {
		if d := time.Until(cfg.StartAt); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
	}
	r.start = time.Now()
	r.measure = r.start.Add(cfg.Warmup)
	r.deadline = r.measure.Add(cfg.Duration)
	cpuAt := make(chan cpuSample, 1)
	cpuTimer := time.AfterFunc(cfg.Warmup, func() { cpuAt <- sampleCPU() })
	defer cpuTimer.Stop()
	stopProgress := r.progress()
	if cfg.Mode == Closed {
		r.closed(ctx, op)
	} else {
		r.open(ctx, op)
	}
	end := time.Now()
	stopProgress()
	res := r.result(end)
	if !cfg.StartAt.IsZero() {
		res.StartLag = max(r.start.Sub(cfg.StartAt), 0)
	}
	select {
	case first := <-cpuAt:
		res.CPU = cpuBetween(first, sampleCPU(), cfg.ServerPID)
	default: // ended during the warm-up
	}
	return res, nil
}

func (r *run) record(seq int64, due, sent, end time.Time, out Outcome) {
	if end.Before(r.measure) {
		return // answered during the warm-up
	}
	s := &r.shards[seq%shards]
	lat := max(end.Sub(due).Microseconds(), histMin)
	svc := max(end.Sub(sent).Microseconds(), histMin)
	i := int(end.Sub(r.measure) / r.cfg.Bucket)
	if i >= len(r.timeline) {
		i = len(r.timeline) - 1
	}
	r.timeline[i].Add(1)
	if out.Err {
		r.tlErrors[i].Add(1)
	}
	s.mu.Lock()
	_ = s.latency.RecordValue(min(lat, histMax))
	_ = s.service.RecordValue(min(svc, histMax))
	s.codes[out.Code]++
	s.done++
	if out.Err {
		s.errors++
	} else if !end.After(r.deadline) {
		s.inWindow++
		s.window[out.Code]++
	}
	s.mu.Unlock()
}

func (r *run) closed(ctx context.Context, op Op) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < r.cfg.Concurrency; w++ {
		wg.Go(func() {
			for ctx.Err() == nil {
				sent := time.Now()
				if !sent.Before(r.deadline) {
					r.timeBound.Store(true)
					return
				}
				seq := next.Add(1) - 1
				if r.cfg.Requests > 0 && seq >= r.cfg.Requests {
					return
				}
				r.inFlight.Add(1)
				out := op(ctx, seq)
				r.inFlight.Add(-1)
				r.record(seq, sent, sent, time.Now(), out)
			}
		})
	}
	wg.Wait()
}

func (r *run) open(ctx context.Context, op Op) {
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	defer wg.Wait()
	for i := int64(0); r.cfg.Requests <= 0 || i < r.cfg.Requests; i++ {
		due := r.start.Add(Schedule(r.cfg.Rate, i))
		if !due.Before(r.deadline) {
			r.timeBound.Store(true)
			return
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		sent := time.Now()
		if sent.Sub(due) > time.Millisecond {
			r.late.Add(1)
		}
		r.inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := op(ctx, i)
			r.inFlight.Add(-1)
			r.record(i, due, sent, time.Now(), out)
			<-sem
		}()
	}
}

// snapshot reads the counters of every shard.
func (r *run) snapshot() (done, errs int64, codes map[string]int64) {
	codes = map[string]int64{}
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		done += s.done
		errs += s.errors
		mergeCodes(codes, s.codes)
		s.mu.Unlock()
	}
	return done, errs, codes
}

// progress starts the progress reports; the returned func stops them after
// a final one.
func (r *run) progress() func() {
	if r.cfg.Progress == nil {
		return func() {}
	}
	report := func(final bool) {
		done, errs, codes := r.snapshot()
		r.cfg.Progress(Progress{Elapsed: time.Since(r.measure), Duration: r.cfg.Duration, Done: done, Errors: errs,
			InFlight: r.inFlight.Load(), Codes: codes, Final: final})
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(r.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report(false)
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		report(true)
	}
}

func (r *run) result(end time.Time) *Result {
	res := &Result{Mode: r.cfg.Mode, Elapsed: max(end.Sub(r.measure), 0), Latency: NewHistogram(), Service: NewHistogram(),
		Codes: map[string]int64{}, WindowCodes: map[string]int64{}, Late: r.late.Load()}
	for i := range r.shards {
		s := &r.shards[i]
		res.Latency.Merge(s.latency)
		res.Service.Merge(s.service)
		mergeCodes(res.Codes, s.codes)
		mergeCodes(res.WindowCodes, s.window)
		res.Requests += s.done
		res.Errors += s.errors
		res.InWindow += s.inWindow
	}
	res.Window = min(res.Elapsed, r.cfg.Duration)
	if r.timeBound.Load() {
		res.Window = r.cfg.Duration
	}
	last := int(res.Elapsed / r.cfg.Bucket)
	for i := 0; i <= last && i < len(r.timeline); i++ {
		res.Timeline = append(res.Timeline, Point{At: time.Duration(i+1) * r.cfg.Bucket,
			Completed: r.timeline[i].Load(), Errors: r.tlErrors[i].Load()})
	}
	return res
}

func mergeCodes(into, from map[string]int64) {
	for k, v := range from {
		into[k] += v
	}
}

package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// HoldConfig is a memory test: Conns keep-alive connections to Base, held
// open for Hold, each sending GET Path every Every.
type HoldConfig struct {
	Base  string // a loopback URL (CheckLoopback)
	Conns int
	Hold  time.Duration
	Every time.Duration
	Path  string // default /healthz
	// Sources spreads the connections over the source addresses 127.0.0.1
	// to 127.0.0.Sources (sources.go): past about 28,000 connections one
	// source address runs out of ports.
	Sources int
	// ServerPID is the server's process, whose memory is read.
	ServerPID int
	// Progress, if set, is called with what is open about every second.
	Progress func(opened, failed int64, holding bool)
}

// HoldResult is what a memory test measured. Sizes in MiB.
type HoldResult struct {
	Connections int     `json:"connections"`    // asked for
	Opened      int64   `json:"opened"`         // answered a first request
	Held        int64   `json:"held"`           // still open and answering at the end
	Requests    int64   `json:"requests"`       // answered, every connection
	Errors      int64   `json:"errors"`         // failed dials, requests or answers other than 2xx
	HoldS       float64 `json:"hold_s"`         // with every connection open
	EveryS      float64 `json:"every_s"`        // between two requests of one connection
	ServerPID   int     `json:"server_pid"`     // whose memory this is
	RSSBeforeMB float64 `json:"rss_before_mb"`  // VmRSS before the first connection
	RSSMB       float64 `json:"rss_mb"`         // VmRSS: the most seen while holding
	HWMMB       float64 `json:"hwm_mb"`         // VmHWM at the end: the peak since the server started
	PerConnKB   float64 `json:"kb_per_conn"`    // (RSSMB - RSSBeforeMB) / Opened
	FileLimit   int     `json:"nofile_limit"`   // RLIMIT_NOFILE of this (the client) process
	ServerLimit int     `json:"server_nofile"`  // the server's "Max open files" (0 unknown)
	Note        string  `json:"note,omitempty"` // why a figure is missing
}

// HoldConnections runs the memory test of cfg. It returns once the
// connections are closed.
func HoldConnections(ctx context.Context, cfg HoldConfig) (*HoldResult, error) {
	if err := CheckLoopback(cfg.Base); err != nil {
		return nil, err
	}
	if err := checkSources(cfg.Sources); err != nil {
		return nil, err
	}
	dial := sourceDialer(cfg.Sources, 10*time.Second)
	if cfg.Conns < 1 || cfg.Hold <= 0 || cfg.Every <= 0 {
		return nil, fmt.Errorf("loadgen: a memory test needs connections, a hold time and a request period")
	}
	if cfg.Path == "" {
		cfg.Path = "/healthz"
	}
	u, err := url.Parse(cfg.Base)
	if err != nil {
		return nil, err
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	res := &HoldResult{Connections: cfg.Conns, EveryS: cfg.Every.Seconds(), ServerPID: cfg.ServerPID,
		FileLimit: RaiseFileLimit(cfg.Conns + 256), ServerLimit: processFileLimit(cfg.ServerPID)}
	if res.FileLimit > 0 && res.FileLimit < cfg.Conns+64 {
		return nil, fmt.Errorf("loadgen: %d connections need about %d file descriptors, RLIMIT_NOFILE is %d (raise ulimit -n)", cfg.Conns, cfg.Conns+64, res.FileLimit)
	}
	before, err := ReadMemory(cfg.ServerPID)
	if err != nil {
		return nil, fmt.Errorf("loadgen: the server's memory: %w", err)
	}
	res.RSSBeforeMB = mib(before.RSS)

	req := []byte("GET " + cfg.Path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: flashsale-bench\r\n\r\n")
	var (
		opened, failed, held, requests, errs atomic.Int64
		dialing, all                         sync.WaitGroup
		holdStart                            = make(chan struct{})
		dialSem                              = make(chan struct{}, 128)
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var holdEnd atomic.Int64 // unix nanoseconds, set once the hold starts
	for i := 0; i < cfg.Conns; i++ {
		dialing.Add(1)
		all.Go(func() {
			dialSem <- struct{}{}
			c, br, ok := openConn(ctx, dial, host, req)
			<-dialSem
			if ok {
				opened.Add(1)
				requests.Add(1)
			} else {
				failed.Add(1)
				errs.Add(1)
			}
			dialing.Done()
			if !ok {
				return
			}
			defer c.Close()
			select {
			case <-holdStart:
			case <-ctx.Done():
				return
			}
			// Spread the connections' requests over the period.
			offset := time.Duration(int64(cfg.Every) * int64(i) / int64(cfg.Conns))
			next := time.Now().Add(offset)
			for {
				end := time.Unix(0, holdEnd.Load())
				if !next.Before(end) {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(next)):
				}
				if !roundTrip(c, br, req) {
					errs.Add(1)
					return
				}
				requests.Add(1)
				next = next.Add(cfg.Every)
			}
			held.Add(1)
			<-ctx.Done() // keep it open until every connection is counted
		})
	}
	stopProgress := holdProgress(cfg.Progress, &opened, &failed, holdStart)
	dialing.Wait()
	start := time.Now()
	holdEnd.Store(start.Add(cfg.Hold).UnixNano())
	close(holdStart)
	peak := before.RSS
	t := time.NewTicker(250 * time.Millisecond)
	for time.Now().Before(start.Add(cfg.Hold)) && ctx.Err() == nil {
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		if m, err := ReadMemory(cfg.ServerPID); err == nil {
			peak = max(peak, m.RSS)
		}
	}
	t.Stop()
	// Every connection has sent its last request or failed by now (plus an answer's time).
	deadline := time.Now().Add(10 * time.Second)
	for held.Load()+errs.Load()-failed.Load() < opened.Load() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	res.HoldS = round(time.Since(start).Seconds(), 3)
	end, err := ReadMemory(cfg.ServerPID)
	if err == nil {
		peak = max(peak, end.RSS)
		res.HWMMB = mib(end.HWM)
	} else {
		res.Note = "the server's memory could not be read at the end: " + err.Error()
	}
	stopProgress()
	cancel()
	all.Wait()
	res.Opened, res.Held, res.Requests, res.Errors = opened.Load(), held.Load(), requests.Load(), errs.Load()
	res.RSSMB = mib(peak)
	if res.Opened > 0 {
		res.PerConnKB = round(float64(peak-before.RSS)/1024/float64(res.Opened), 1)
	}
	return res, nil
}

// openConn dials host and sends the first request.
func openConn(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), host string, req []byte) (net.Conn, *bufio.Reader, bool) {
	c, err := dial(ctx, "tcp", host)
	if err != nil {
		return nil, nil, false
	}
	br := bufio.NewReaderSize(c, 1024)
	if !roundTrip(c, br, req) {
		c.Close()
		return nil, nil, false
	}
	return c, br, true
}

// roundTrip sends req on c and reads a 2xx answer that keeps c open.
func roundTrip(c net.Conn, br *bufio.Reader, req []byte) bool {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(req); err != nil {
		return false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode/100 == 2 && !resp.Close
}

func holdProgress(f func(opened, failed int64, holding bool), opened, failed *atomic.Int64, holding <-chan struct{}) (stop func()) {
	if f == nil {
		return func() {}
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			h := false
			select {
			case <-holding:
				h = true
			default:
			}
			f(opened.Load(), failed.Load(), h)
		}
	}()
	return func() { close(done); <-stopped }
}

func mib(b int64) float64 { return round(float64(b)/(1<<20), 1) }

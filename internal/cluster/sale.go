package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/chaos"
)

// Sale is the buyers of several SKUs buying through one client (the
// balancer), each SKU with its own history.
type Sale struct {
	Client *chaos.Client
	Loads  []chaos.Load
	Hist   map[string]*chaos.History

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartSale starts every load at once; Stop ends them.
func StartSale(c *chaos.Client, loads []chaos.Load) *Sale {
	s := &Sale{Client: c, Loads: loads, Hist: map[string]*chaos.History{}}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, l := range loads {
		h := &chaos.History{}
		s.Hist[l.SKU] = h
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			chaos.Drive(ctx, c, l, h)
		}()
	}
	return s
}

// Stop ends the buyers (a request in flight is dropped, not recorded) and
// waits for them.
func (s *Sale) Stop() {
	s.cancel()
	s.wg.Wait()
}

// Wait waits until every load is done (its buyers or its For bound).
func (s *Sale) Wait() { s.wg.Wait() }

// Failures lists, per SKU, the attempts buyers saw fail at the HTTP level:
// a 5xx, or no answer at all (connection refused or reset, a timeout).
func (s *Sale) Failures() []string {
	var out []string
	for _, l := range s.Loads {
		n := map[string]int{}
		for _, a := range s.Hist[l.SKU].Attempts() {
			switch {
			case a.Status == 0:
				n["no answer: "+shortErr(a.Err)]++
			case a.Status >= 500:
				n[fmt.Sprintf("%d %s", a.Status, a.Code)]++
			}
		}
		for k, v := range n {
			out = append(out, fmt.Sprintf("%s: %d x %s", l.SKU, v, k))
		}
	}
	sort.Strings(out)
	return out
}

// Accepted is the number of 202s over every SKU.
func (s *Sale) Accepted() int {
	n := 0
	for _, h := range s.Hist {
		_, a, _ := h.Counts()
		n += a
	}
	return n
}

// Summary is every SKU's outcomes, for the log.
func (s *Sale) Summary() string {
	var b strings.Builder
	for _, l := range s.Loads {
		fmt.Fprintf(&b, "%s %v; ", l.SKU, s.Hist[l.SKU].Summary())
	}
	return b.String()
}

// Verify checks I1-I7 and I9-I11 (I8 is the payment scenario's) for every
// SKU from the database and Redis: unknown outcomes are resolved with their
// keys (I9), each SKU must become idle with its invariants holding (the
// time that took is returned: the slowest SKU's) and no dead letters
// remain (I10). With buyRest, fresh buyers then buy what the database has
// left of each SKU, and no more (I7).
func Verify(ctx context.Context, ck *chaos.Checker, s *Sale, within time.Duration, buyRest bool) (time.Duration, []string) {
	var viol []string
	var slowest time.Duration
	for _, l := range s.Loads {
		h := s.Hist[l.SKU]
		if left := chaos.Settle(ctx, s.Client, l.SKU, h, within); left > 0 {
			viol = append(viol, fmt.Sprintf("%s: I9: %d keys still had no answer", l.SKU, left))
		}
		took, _, v := ck.Idle(ctx, l.SKU, h, within)
		slowest = max(slowest, took)
		for _, x := range v {
			viol = append(viol, l.SKU+": "+x)
		}
		if len(v) > 0 || !buyRest {
			continue
		}
		for _, x := range chaos.BuyRest(ctx, s.Client, ck, l.SKU, h) {
			viol = append(viol, l.SKU+": "+x)
		}
		if _, _, v := ck.Idle(ctx, l.SKU, h, 30*time.Second); len(v) > 0 {
			for _, x := range v {
				viol = append(viol, l.SKU+": after the fresh buyers: "+x)
			}
		}
	}
	if n, err := chaos.DeadLetters(ctx, s.Client); err != nil {
		viol = append(viol, "I10: "+err.Error())
	} else if n > 0 {
		viol = append(viol, fmt.Sprintf("I10: %d dead letters left", n))
	}
	return slowest, viol
}

func shortErr(e string) string {
	for _, k := range []string{"connection reset", "connection refused", "EOF", "timeout", "Client.Timeout"} {
		if strings.Contains(e, k) {
			return k
		}
	}
	if len(e) > 80 {
		return e[:80]
	}
	return e
}

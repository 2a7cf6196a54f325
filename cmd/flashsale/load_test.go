package main

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// history records what buyers were told, for checking afterwards.
type history struct {
	mu       sync.Mutex
	accepted map[string]string // order id -> user
	direct   int               // accepted by the database fallback
	codes    map[string]int
}

// unknown counts the answers that said nothing of the outcome (5xx,
// transport errors): each may be at most one order nobody was told of (I9).
func (hs *history) unknown() int {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	return hs.codes["unavailable"] + hs.codes["busy"] + hs.codes["internal"] + hs.codes["transport"] + hs.codes[""]
}

func (hs *history) ids() []string {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	out := make([]string, 0, len(hs.accepted))
	for id := range hs.accepted {
		out = append(out, id)
	}
	return out
}

// runBuyers sends buyers purchases of one unit at about rate per second
// (conc at a time), one in five clicking twice; each buyer's first click
// carries an Idempotency-Key and is sent again while answered 503 (an
// unknown outcome), as a client should, for up to 10 s. It returns when
// every buyer is done.
func runBuyers(t *testing.T, h *harness, sku string, buyers, rate, conc int) *history {
	hs := &history{accepted: map[string]string{}, codes: map[string]int{}}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				user := fmt.Sprintf("buyer-%d", i)
				clicks := 1
				if i%5 == 0 {
					clicks = 2
				}
				for c := 0; c < clicks; c++ {
					key := ""
					if c == 0 {
						key = fmt.Sprintf("%s-%d", sku, i)
					}
					var r reply
					if key != "" {
						r = h.buyUntilAnswered(user, sku, 1, key, 10*time.Second)
					} else {
						r = h.buy(user, sku, 1, key)
					}
					hs.mu.Lock()
					switch {
					case purchaseAccepted(r):
						hs.accepted[r.str("order_id")] = user
						hs.codes["accepted"]++
						if r.Status == http.StatusAccepted && r.str("status") == "pending_payment" {
							hs.direct++
						}
					case r.Status == 0:
						hs.codes["transport"]++
					default:
						hs.codes[r.code()]++
					}
					hs.mu.Unlock()
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for i := 0; i < buyers; i++ {
		<-tick.C
		jobs <- i
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	t.Logf("buyers: %v (database fallback accepted %d)", hs.codes, hs.direct)
	return hs
}

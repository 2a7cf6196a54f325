package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
)

// Attempt is one request a buyer sent and what came back: Status 0 means no
// answer (connection error or client timeout), an unknown outcome.
type Attempt struct {
	User, Key string
	Try       int
	Status    int
	Code      string // the error code of a 4xx/5xx body
	OrderID   string // of a 202
	OrderStat string // the status in a 202 body (queued, pending_payment)
	Err       string
}

// History records every attempt of a run. Its methods are safe for
// concurrent use.
type History struct {
	mu       sync.Mutex
	attempts []Attempt
}

func (h *History) add(a Attempt) {
	h.mu.Lock()
	h.attempts = append(h.attempts, a)
	h.mu.Unlock()
}

// Attempts returns a copy of the recorded attempts.
func (h *History) Attempts() []Attempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Attempt(nil), h.attempts...)
}

// Accepted returns the order id of every 202 (repeated ids included).
func (h *History) Accepted() []string {
	var ids []string
	for _, a := range h.Attempts() {
		if a.Status == http.StatusAccepted {
			ids = append(ids, a.OrderID)
		}
	}
	return ids
}

// Counts sums the attempts: requests, 202s, distinct accepted order ids.
func (h *History) Counts() (requests, accepted, orders int) {
	ids := map[string]bool{}
	for _, a := range h.Attempts() {
		requests++
		if a.Status == http.StatusAccepted {
			accepted++
			ids[a.OrderID] = true
		}
	}
	return requests, accepted, len(ids)
}

// Summary counts attempts by outcome ("202", "409 sold_out", "unknown", ...).
func (h *History) Summary() map[string]int {
	m := map[string]int{}
	for _, a := range h.Attempts() {
		switch {
		case a.Status == 0:
			m["unknown"]++
		case a.Code != "":
			m[fmt.Sprintf("%d %s", a.Status, a.Code)]++
		default:
			m[fmt.Sprint(a.Status)]++
		}
	}
	return m
}

// Client talks to one flashsale instance as buyers do.
type Client struct {
	URL    string
	Secret string // FLASHSALE_USER_TOKEN_SECRET, to sign buyer tokens
	Admin  string // FLASHSALE_ADMIN_TOKEN
	HC     *http.Client
	// Hold, if set, is taken shared by every request for its whole
	// length: a test that takes it exclusively waits for the requests in
	// flight and holds new ones back (while it stops the processes that
	// would answer them, say).
	Hold *sync.RWMutex
}

// NewClient returns a client whose requests give up after timeout: the
// outcome of such a request is unknown and the buyer retries it.
func NewClient(url, secret, admin string, timeout time.Duration) *Client {
	return &Client{URL: url, Secret: secret, Admin: admin,
		HC: &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
}

// Reply is a decoded answer.
type Reply struct {
	Status int
	Body   map[string]any
	Raw    string
	Err    error
}

// Str returns a string field of the body.
func (r Reply) Str(k string) string { s, _ := r.Body[k].(string); return s }

// Code returns the machine-readable error code of the body.
func (r Reply) Code() string {
	if e, ok := r.Body["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

// Do sends one request; headers are "Name: value".
func (c *Client) Do(ctx context.Context, method, path, body string, headers ...string) Reply {
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, strings.NewReader(body))
	if err != nil {
		return Reply{Err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, hv := range headers {
		k, v, _ := strings.Cut(hv, ": ")
		req.Header.Set(k, v)
	}
	if c.Hold != nil {
		c.Hold.RLock()
		defer c.Hold.RUnlock()
	}
	resp, err := c.HC.Do(req)
	if err != nil {
		return Reply{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Reply{Err: err}
	}
	r := Reply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &r.Body)
	return r
}

// User returns the Authorization header of user.
func (c *Client) User(user string) string {
	tok, err := httpapi.Sign(c.Secret, user, 24*time.Hour)
	if err != nil {
		panic(err) // only an empty secret fails
	}
	return "Authorization: Bearer " + tok
}

// PutSKU creates or changes a sale.
func (c *Client) PutSKU(ctx context.Context, sku string, stock, limit int) error {
	r := c.Do(ctx, http.MethodPut, "/admin/v1/skus/"+sku, fmt.Sprintf(`{"stock":%d,"per_user_limit":%d}`, stock, limit),
		"Authorization: Bearer "+c.Admin)
	if r.Status != http.StatusOK && r.Status != http.StatusCreated {
		return fmt.Errorf("put sku %s: %d %s %v", sku, r.Status, r.Raw, r.Err)
	}
	return nil
}

// Buy sends one purchase of qty units with key (none when empty).
func (c *Client) Buy(ctx context.Context, user, sku string, qty int, key string) Reply {
	hdr := []string{c.User(user)}
	if key != "" {
		hdr = append(hdr, "Idempotency-Key: "+key)
	}
	r := c.Do(ctx, http.MethodPost, "/api/v1/orders", fmt.Sprintf(`{"sku_id":%q,"quantity":%d}`, sku, qty), hdr...)
	if key != "" && r.Status == http.StatusOK && r.Str("order_id") != "" {
		// A retry of a purchase the database has decided answers 200 with
		// the order: the purchase was accepted, as a 202 says, and the
		// history counts it so.
		r.Status = http.StatusAccepted
	}
	return r
}

// retryable reports whether a client that wants its purchase asks again:
// no answer, a 5xx (the outcome is unknown) or 429 (shed, try later).
func retryable(r Reply) bool {
	return r.Status == 0 || r.Status >= 500 || r.Status == http.StatusTooManyRequests
}

// Load describes the buyers of a run.
type Load struct {
	SKU     string
	Buyers  int           // users, each buying once per key
	Workers int           // concurrent buyers
	Rate    int           // new buyers per second (0: as fast as the workers go)
	Tries   int           // attempts per key, first included (retries of unknown outcomes)
	For     time.Duration // bound on the whole run: no attempt starts after it
	// TwoKeys makes every n-th user buy a second time under a second key
	// (two purchases, as a user within a limit above 1 may make).
	TwoKeys int
	// DoubleClick makes every n-th user send its first key twice at once.
	DoubleClick int
	// Users names the users ("<Users>-<i>", default "b").
	Users string
}

// Drive runs the load against c and records every attempt in h. Each key is
// retried with backoff while the outcome is unknown, up to Tries attempts
// and within For. It returns when every buyer is done or ctx ends.
func Drive(ctx context.Context, c *Client, l Load, h *History) {
	if l.Tries == 0 {
		l.Tries = 6
	}
	if l.Users == "" {
		l.Users = "b"
	}
	ctx, cancel := context.WithTimeout(ctx, l.For)
	defer cancel()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < l.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				user := fmt.Sprintf("%s-%d", l.Users, i)
				keys := []string{fmt.Sprintf("%s-%s-k0", l.SKU, user)}
				if l.TwoKeys > 0 && i%l.TwoKeys == 0 {
					keys = append(keys, fmt.Sprintf("%s-%s-k1", l.SKU, user))
				}
				for k, key := range keys {
					if k == 0 && l.DoubleClick > 0 && i%l.DoubleClick == 0 {
						var dc sync.WaitGroup
						dc.Add(1)
						go func() { defer dc.Done(); buyKey(ctx, c, l, h, user, key) }()
						buyKey(ctx, c, l, h, user, key)
						dc.Wait()
						continue
					}
					buyKey(ctx, c, l, h, user, key)
				}
			}
		}()
	}
	var tick <-chan time.Time
	if l.Rate > 0 {
		tk := time.NewTicker(time.Second / time.Duration(l.Rate))
		defer tk.Stop()
		tick = tk.C
	}
feed:
	for i := 0; i < l.Buyers; i++ {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				break feed
			}
		}
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
}

func buyKey(ctx context.Context, c *Client, l Load, h *History, user, key string) {
	for try := 1; try <= l.Tries; try++ {
		if ctx.Err() != nil {
			return
		}
		r := c.Buy(ctx, user, l.SKU, 1, key)
		if errors.Is(r.Err, context.Canceled) || (r.Err != nil && ctx.Err() != nil) {
			return // the run ended under this request: not an answer
		}
		a := Attempt{User: user, Key: key, Try: try, Status: r.Status, Code: r.Code()}
		if r.Err != nil {
			a.Err = r.Err.Error()
		}
		if r.Status == http.StatusAccepted {
			a.OrderID, a.OrderStat = r.Str("order_id"), r.Str("status")
		}
		h.add(a)
		if !retryable(r) {
			return
		}
		select {
		case <-time.After(time.Duration(50*try*try) * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

// Settle retries every key whose last answer was unknown until it gets an
// answer, with the same key: after the faults heal a client learns what
// happened to its purchase. It returns how many keys stayed unknown.
func Settle(ctx context.Context, c *Client, sku string, h *History, within time.Duration) int {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	type uk struct{ user, key string }
	last := map[uk]Attempt{}
	for _, a := range h.Attempts() {
		last[uk{a.User, a.Key}] = a
	}
	for k, a := range last {
		if retryable(Reply{Status: a.Status}) {
			buyKey(ctx, c, Load{SKU: sku, Tries: 20}, h, k.user, k.key)
		}
	}
	clear(last)
	for _, a := range h.Attempts() {
		last[uk{a.User, a.Key}] = a
	}
	left := 0
	for _, a := range last {
		if retryable(Reply{Status: a.Status}) {
			left++
		}
	}
	return left
}

package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/flashsale/internal/httpapi"
)

// CheckLoopback returns nil if target is an http:// URL whose host is a
// loopback address (127.0.0.0/8, ::1) or "localhost": flashsale bench sends
// load to this machine only, never to a shared or remote service.
func CheckLoopback(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("target %q: %w", target, err)
	}
	if u.Scheme != "http" {
		return fmt.Errorf("target %q: only http:// URLs of this machine are accepted", target)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("target %q is not a loopback address: flashsale bench only sends load to this machine (127.0.0.0/8, [::1], localhost)", target)
}

// Client is a buyer's and an admin's view of one flashsale over HTTP. Safe
// for concurrent use.
type Client struct {
	base   string
	hc     *http.Client
	admin  string
	secret string
	tokens sync.Map // user -> bearer token
	// sign makes a user's token (tests replace it).
	sign func(user string) string
}

// CheckTarget is CheckLoopback, or with remote any http:// or https:// URL
// with a host: a target the operator named as theirs (-remote-target), or
// one a coordinator sent a worker (flashsale bench -worker).
func CheckTarget(target string, remote bool) error {
	if !remote {
		return CheckLoopback(target)
	}
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("target %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("target %q: an http:// or https:// URL with a host is needed", target)
	}
	return nil
}

// ClientOptions are a Client's settings beyond its target and tokens.
type ClientOptions struct {
	// Remote accepts a target that is not a loopback address (CheckTarget).
	Remote bool
	// Sources spreads the connections to a loopback target over the source
	// addresses 127.0.0.1 to 127.0.0.Sources (0 or 1: the system's choice),
	// which lifts the per-address port bound (sources.go).
	Sources int
}

// NewClient returns a client of the API at base (a loopback URL, see
// CheckLoopback) keeping up to conns connections open. adminToken is the
// admin bearer token; userSecret signs the buyers' tokens.
func NewClient(base, adminToken, userSecret string, conns int) (*Client, error) {
	return NewClientWith(base, adminToken, userSecret, conns, ClientOptions{})
}

// NewClientWith is NewClient with o's settings.
func NewClientWith(base, adminToken, userSecret string, conns int, o ClientOptions) (*Client, error) {
	if err := CheckTarget(base, o.Remote); err != nil {
		return nil, err
	}
	if err := checkSources(o.Sources); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		Proxy:               nil, // never through a proxy: the load goes where it is told
		DialContext:         sourceDialer(o.Sources, 5*time.Second),
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	hc := &http.Client{
		Transport: tr,
		Timeout:   30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("loadgen: redirects are not followed")
		},
	}
	c := &Client{base: strings.TrimRight(base, "/"), hc: hc, admin: adminToken, secret: userSecret}
	c.sign = func(user string) string {
		t, err := httpapi.Sign(c.secret, user, 6*time.Hour)
		if err != nil {
			return "" // an empty secret: the server answers 401, counted as an error
		}
		return t
	}
	return c, nil
}

// Base returns the API's base URL.
func (c *Client) Base() string { return c.base }

// Close closes idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// token returns a bearer token for user, signed once.
func (c *Client) token(user string) string {
	if t, ok := c.tokens.Load(user); ok {
		return t.(string)
	}
	t := c.sign(user)
	c.tokens.Store(user, t)
	return t
}

// Reply is what the API answered.
type Reply struct {
	Status int
	// Code is "accepted" (202), "ok" (200), the error code of the body
	// ("sold_out", "limit_reached", ...), "transport" (no answer) or
	// "http_<status>" for a body without one.
	Code        string
	OrderID     string
	OrderStatus string
	Err         error
}

// Outcome classifies r for the generator: errors are no answer, 5xx
// (including 503 busy/unavailable: the buyer learned nothing) and 4xx other
// than 409 (the generator's requests are valid: a 400, 401 or 404 is a bug).
func (r Reply) Outcome() Outcome {
	switch {
	case r.Status == 0 || r.Status >= 500:
		return Outcome{Code: r.Code, Err: true}
	case r.Status >= 400 && r.Status != http.StatusConflict:
		return Outcome{Code: r.Code, Err: true}
	}
	return Outcome{Code: r.Code}
}

type replyBody struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
	Error   struct {
		Code string `json:"code"`
	} `json:"error"`
}

func (c *Client) do(ctx context.Context, method, path, bearer string, body []byte, header ...string) Reply {
	r, _ := c.doRaw(ctx, method, path, bearer, body, header...)
	return r
}

// doRaw is do that also returns the answer's body.
func (c *Client) doRaw(ctx context.Context, method, path, bearer string, body []byte, header ...string) (Reply, []byte) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return Reply{Code: "transport", Err: err}, nil
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return Reply{Code: "transport", Err: err}, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Reply{Status: resp.StatusCode, Code: "transport", Err: err}, nil
	}
	r := Reply{Status: resp.StatusCode}
	var b replyBody
	_ = json.Unmarshal(raw, &b)
	r.OrderID, r.OrderStatus, r.Code = b.OrderID, b.Status, b.Error.Code
	if r.Code == "" {
		switch resp.StatusCode {
		case http.StatusAccepted:
			r.Code = "accepted"
		case http.StatusOK, http.StatusCreated:
			r.Code = "ok"
		default:
			r.Code = "http_" + strconv.Itoa(resp.StatusCode)
		}
	}
	return r, raw
}

// Buy asks for qty units of sku as user, with an Idempotency-Key if key is set.
func (c *Client) Buy(ctx context.Context, user, sku string, qty int64, key string) Reply {
	body := []byte(`{"sku_id":"` + sku + `","quantity":` + strconv.FormatInt(qty, 10) + `}`)
	if key != "" {
		r := c.do(ctx, http.MethodPost, "/api/v1/orders", c.token(user), body, "Idempotency-Key", key)
		if r.Status == http.StatusOK && r.OrderID != "" {
			// A retry of a purchase the database has decided answers 200
			// with the order: the purchase was accepted, as a 202 says.
			r.Status, r.Code = http.StatusAccepted, "accepted"
		}
		return r
	}
	return c.do(ctx, http.MethodPost, "/api/v1/orders", c.token(user), body)
}

// Pay pays user's order id.
func (c *Client) Pay(ctx context.Context, user, id string) Reply {
	r := c.do(ctx, http.MethodPost, "/api/v1/orders/"+id+"/pay", c.token(user), nil)
	if r.Status == http.StatusOK {
		r.Code = "paid"
	}
	return r
}

// Cancel cancels user's order id.
func (c *Client) Cancel(ctx context.Context, user, id string) Reply {
	r := c.do(ctx, http.MethodPost, "/api/v1/orders/"+id+"/cancel", c.token(user), nil)
	if r.Status == http.StatusOK || r.Status == http.StatusAccepted {
		r.Code = "cancelled"
	}
	return r
}

// PutSKU creates or changes a sale through the admin API.
func (c *Client) PutSKU(ctx context.Context, sku string, stock, perUserLimit int64) error {
	body := []byte(fmt.Sprintf(`{"stock":%d,"per_user_limit":%d}`, stock, perUserLimit))
	r := c.do(ctx, http.MethodPut, "/admin/v1/skus/"+sku, c.admin, body)
	if r.Status != http.StatusOK && r.Status != http.StatusCreated {
		if r.Err != nil {
			return fmt.Errorf("put sku %s: %w", sku, r.Err)
		}
		return fmt.Errorf("put sku %s: HTTP %d %s", sku, r.Status, r.Code)
	}
	return nil
}

// HasLifecycle reports whether the API has the pay and cancel routes (an
// unknown order gets order_not_found from them, not_found without them).
func (c *Client) HasLifecycle(ctx context.Context) (bool, error) {
	r := c.do(ctx, http.MethodPost, "/api/v1/orders/00000000-0000-7000-8000-000000000000/pay", c.token("loadgen-probe"), nil)
	if r.Status == 0 {
		return false, fmt.Errorf("probing the pay route: %w", r.Err)
	}
	return r.Code != "not_found" && r.Code != "method_not_allowed", nil
}

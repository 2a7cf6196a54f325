package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// TestBuyerPage drives the buyers' page, /sale/{id}, in headless Chromium
// against an in-process flashsale, at desktop and at phone width: on a sale
// with tickets and a waiting room the real ALTCHA widget solves the
// service's challenge, the page joins the room, is admitted, moves the
// focus to the Buy button, which Enter presses, and follows the order to
// pending payment; the database then holds exactly those orders. A sold-out
// sale says so, and so does the page when the service goes away.
func TestBuyerPage(t *testing.T) {
	slowEndToEnd(t)
	t.Parallel()
	chrome := chromiumPath(t)
	h := newHarness(t, testConfig(t, "embedded"))
	const sku = "drop-1"
	if r := h.putSKUAnswered(sku, `{"stock":10,"per_user_limit":1,"ticket_required":true,"waiting_room":true,"admission_rate":1000}`); !saved(r) {
		t.Fatalf("put: %d %s", r.Status, r.Raw)
	}
	p := openBrowser(t, chrome)

	var ids []string
	for _, size := range []struct {
		name          string
		width, height int64
		phone         bool
	}{{"desktop", 1280, 800, false}, {"phone", 390, 844, true}} {
		t.Run("buys at "+size.name+" width", func(t *testing.T) {
			p.t = t
			if size.phone {
				p.do(chromedp.EmulateViewport(size.width, size.height, chromedp.EmulateScale(2), chromedp.EmulateMobile))
			} else {
				p.do(chromedp.EmulateViewport(size.width, size.height))
			}
			buyer := "page-buyer-" + size.name
			// A fresh tab state: the token comes in the fragment.
			p.do(chromedp.Navigate(h.srvURL+"/healthz"), chromedp.Evaluate[chromedp.Void](`sessionStorage.clear()`),
				chromedp.Navigate(h.srvURL+"/sale/"+sku+"#token="+userToken(t, buyer)))
			p.waitForWithin(30*time.Second, "the widget's proof, the ticket, the room and the admission",
				`!document.querySelector("#buy-box").hidden && document.activeElement === document.querySelector("#buy")`)
			if got := p.eval(`location.href`); strings.Contains(got, "token") {
				t.Fatalf("the token stayed in the URL: %s", got)
			}
			p.waitFor("the countdown and the words", `document.querySelector("#status").textContent.startsWith("It's your turn") &&
				/^\d+ s left to buy\.$/.test(document.querySelector("#countdown").textContent) &&
				sessionStorage.getItem("flashsale.ticket.`+sku+`") !== null`)
			p.waitFor("nothing sideways", `document.documentElement.scrollWidth <= innerWidth`)
			p.do(chromedp.KeyEvent(kb.Enter))
			p.waitForWithin(30*time.Second, "the order pending payment", `document.querySelector("#order-state").dataset.state === "pending_payment" &&
				document.querySelector("#status").textContent === "Order state: pending payment"`)
			id := p.eval(`document.querySelector("#order-id").textContent`)
			if key := p.eval(`sessionStorage.getItem("flashsale.key.` + sku + `") || ""`); key == "" {
				t.Error("no Idempotency-Key kept for the tab")
			}
			r := h.do(http.MethodGet, "/api/v1/orders/"+id, "", "Authorization: Bearer "+userToken(t, buyer))
			if r.Status != http.StatusOK || r.str("status") != "pending_payment" {
				t.Fatalf("the order %s: %d %s", id, r.Status, r.Raw)
			}
			ids = append(ids, id)
			// A reload shows the same order and buys nothing more.
			p.do(chromedp.Reload())
			p.waitFor("the same order after a reload", `document.querySelector("#order-id").textContent === `+jsString(id)+` &&
				document.querySelector("#order-state").dataset.state === "pending_payment"`)
			p.do(chromedp.EmulateReset())
		})
	}

	t.Run("the database holds exactly the orders", func(t *testing.T) {
		rep := settle(t, h.a, sku, ids, 30*time.Second)
		if rep.Orders != int64(len(ids)) || len(ids) != 2 {
			t.Errorf("%d orders in the database, want %d (%v)", rep.Orders, len(ids), ids)
		}
	})

	t.Run("waits in the queue", func(t *testing.T) {
		p.t = t
		// One buyer let through a second, a hundred already waiting: the
		// page shows a place behind them; then the room lets everyone
		// through (admission rate and stock raised: the room's rate follows
		// both) and the page shows the Buy button. With four waiting, a
		// loaded CI machine opened the page after the four had been let
		// through, and the page never showed a place.
		const slow = "slow-1"
		if r := h.putSKUAnswered(slow, `{"stock":20,"per_user_limit":1,"waiting_room":true,"admission_rate":1}`); !saved(r) {
			t.Fatalf("put: %d %s", r.Status, r.Raw)
		}
		for i := range 100 {
			if r := h.do(http.MethodPost, "/api/v1/skus/"+slow+"/queue", "", "Authorization: Bearer "+userToken(t, fmt.Sprint("early-", i))); r.Status != http.StatusCreated {
				t.Fatalf("join: %d %s", r.Status, r.Raw)
			}
		}
		p.do(chromedp.Navigate(h.srvURL + "/sale/" + slow + "#token=" + userToken(t, "patient-buyer")))
		p.waitForWithin(30*time.Second, "the place, the buyers ahead, the ETA and the progress", `!document.querySelector("#queue").hidden &&
			Number(document.querySelector("#position").textContent) >= 1 &&
			Number(document.querySelector("#ahead").textContent) >= 1 &&
			/^about \d+ (s|min)$/.test(document.querySelector("#eta").textContent) &&
			document.querySelector("#status").textContent === "You are in the queue. Keep this page open."`)
		if r := h.putSKUAnswered(slow, `{"stock":100000,"per_user_limit":1,"waiting_room":true,"admission_rate":1000}`); !saved(r) {
			t.Fatalf("put: %d %s", r.Status, r.Raw)
		}
		p.waitForWithin(30*time.Second, "the admission", `!document.querySelector("#buy-box").hidden && document.querySelector("#queue").hidden &&
			document.querySelector("#progress").value === 100 && document.activeElement === document.querySelector("#buy")`)
	})

	t.Run("sold out", func(t *testing.T) {
		p.t = t
		h.mustPutSKU("gone-1", 1, 1)
		if r := h.buy("early-bird", "gone-1", 1, ""); r.Status != http.StatusAccepted {
			t.Fatalf("buy: %d %s", r.Status, r.Raw)
		}
		settle(t, h.a, "gone-1", nil, 30*time.Second)
		p.do(chromedp.Navigate(h.srvURL + "/sale/gone-1"))
		p.waitFor("sold out, plainly", `document.querySelector("#status").textContent === "Sold out." &&
			document.querySelector("#buy-box").hidden && document.querySelector("#proof").hidden`)
	})

	t.Run("keyboard only: the token form", func(t *testing.T) {
		p.t = t
		h.mustPutSKU("plain-1", 5, 1)
		p.do(chromedp.Navigate(h.srvURL+"/healthz"), chromedp.Evaluate[chromedp.Void](`sessionStorage.clear()`),
			chromedp.Navigate(h.srvURL+"/sale/plain-1"))
		p.waitFor("the token asked for, focused", `!document.querySelector("#token-form").hidden && document.activeElement === document.querySelector("#token")`)
		// The token is pasted (set with an input event, as a paste fires):
		// typed key by key, its 150 characters outlast the browser's
		// budget on a busy machine. The rest is keys only.
		p.do(chromedp.SetValue(chromedp.ID("token"), userToken(t, "keyboard-buyer")),
			chromedp.Evaluate[chromedp.Void](`document.querySelector("#token").dispatchEvent(new Event("input", {bubbles: true}))`),
			chromedp.Focus(chromedp.ID("token")), chromedp.KeyEvent(kb.Tab))
		p.waitFor("the Continue button focused", `document.activeElement === document.querySelector("#token-submit")`)
		p.do(chromedp.KeyEvent(" "))
		p.waitForWithin(30*time.Second, "the Buy button of a sale without a room", `!document.querySelector("#buy-box").hidden &&
			document.activeElement === document.querySelector("#buy") && document.querySelector("#countdown").textContent === ""`)
		p.do(chromedp.KeyEvent(" "))
		p.waitForWithin(30*time.Second, "the order", `["queued", "pending_payment"].includes(document.querySelector("#order-state").dataset.state)`)
	})

	p.t = t
	p.noErrors()

	t.Run("service down is said", func(t *testing.T) {
		p.t = t
		// The page follows the pending order; the server goes away.
		h.srv.Close()
		p.waitForWithin(30*time.Second, "the banner", `!document.querySelector("#down").hidden &&
			document.querySelector("#down").textContent === "The service is not answering; your place is kept, retrying…"`)
	})
}

// The buyers' page of one sale: /sale/{id}. It talks to the public API only:
// the sale, a ticket (the ALTCHA proof of work), the waiting room, the order.
// What must survive a reload is kept in sessionStorage, per tab: the token,
// the ticket, the Idempotency-Key of the purchase and the order's id.
// The widget's minified script leaves globals of its own: everything here
// stays inside this function.
(() => {
"use strict";

const sku = decodeURIComponent(location.pathname.slice("/sale/".length));
const el = (id) => document.getElementById(id);
const zh = (navigator.language || "").toLowerCase().startsWith("zh");
const T = zh ? {
  loading: "正在载入…", noSale: "没有这场促销。", soldOut: "已售罄。", ended: "促销已结束。",
  upcoming: (t) => "促销尚未开始，开始时间：" + t + "。", ticketsNotOpen: (t) => "验证尚未开放，开放时间：" + t + "。",
  proving: "正在验证你的浏览器…", joining: "正在排队…", waiting: "排队中，请保持此页面打开。",
  admitted: "轮到你了：现在可以购买。", buying: "正在下单…", expired: "你的购买资格已过期。",
  blocked: "此账号不能购买这件商品。", limit: "你已达到此商品的购买上限。", needToken: "请粘贴你的买家令牌。",
  badToken: "令牌被拒绝，请重新粘贴。", down: "服务暂时没有响应；你的位置会保留，正在重试…",
  left: (s) => "剩余 " + s + " 秒下单。", again: "重试", order: "订单状态：",
  states: { queued: "已受理，正在处理", pending_payment: "待付款", paid: "已付款", cancelled: "已取消", failed: "失败" },
  eta: (s) => s < 60 ? "约 " + s + " 秒" : "约 " + Math.round(s / 60) + " 分钟", failed: "出错了：",
} : {
  loading: "Loading…", noSale: "There is no such sale.", soldOut: "Sold out.", ended: "This sale has ended.",
  upcoming: (t) => "The sale has not started yet. It starts at " + t + ".",
  ticketsNotOpen: (t) => "Checks open at " + t + ".",
  proving: "Checking your browser…", joining: "Joining the queue…", waiting: "You are in the queue. Keep this page open.",
  admitted: "It's your turn: you can buy now.", buying: "Placing your order…", expired: "Your turn to buy has expired.",
  blocked: "This account cannot buy in this sale.", limit: "You have reached this sale's limit per buyer.",
  needToken: "Paste your buyer token to continue.", badToken: "The token was refused; paste it again.",
  down: "The service is not answering; your place is kept, retrying…",
  left: (s) => s + " s left to buy.", again: "Try again", order: "Order state: ",
  states: { queued: "accepted, being processed", pending_payment: "pending payment", paid: "paid", cancelled: "cancelled", failed: "failed" },
  eta: (s) => s < 60 ? "about " + s + " s" : "about " + Math.round(s / 60) + " min", failed: "Something went wrong: ",
};
if (zh) document.documentElement.lang = "zh";

// Per-tab storage, one key per sale where it is the sale's.
const store = {
  get: (k) => sessionStorage.getItem("flashsale." + k),
  set: (k, v) => sessionStorage.setItem("flashsale." + k, v),
  del: (k) => sessionStorage.removeItem("flashsale." + k),
};
const saleKey = (k) => k + "." + sku;

// A token in the fragment (#token=...) is taken and removed from the URL, so
// it is neither in the history nor in a copied link. The fragment is never
// sent to the server.
function tokenFromFragment() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return false;
  store.set("token", decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}
tokenFromFragment();
// A link with a token followed from the page itself changes only the fragment.
addEventListener("hashchange", () => {
  if (tokenFromFragment() && !el("token-form").hidden) {
    show("token-form", false);
    run();
  }
});

function say(text, kind) {
  const s = el("status");
  s.textContent = text;
  s.className = kind || "";
}
function show(id, on) { el(id).hidden = !on; }
function fmtTime(iso) { return new Date(iso).toLocaleString(zh ? "zh-CN" : undefined); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class APIError extends Error {
  constructor(status, code, message) { super(message || code); this.status = status; this.code = code; }
}

// api calls the API, retrying while the service is unreachable or answers
// 503 (waiting Retry-After when given): after the second failure in a row
// it says so, and it keeps retrying, since the buyer's place is kept by the
// server. Any other answer is returned, or thrown as an APIError.
let failures = 0;
async function api(method, path, { body, headers = {} } = {}) {
  for (;;) {
    const h = { Accept: "application/json", ...headers };
    const tok = store.get("token");
    if (tok) h.Authorization = "Bearer " + tok;
    if (body !== undefined) h["Content-Type"] = "application/json";
    let resp = null;
    try {
      resp = await fetch(path, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
    } catch (e) {
      resp = null;
    }
    if (resp && resp.status === 429) { // the rate limit: not a failure, wait as told
      await sleep(Math.min(Number(resp.headers.get("Retry-After")) * 1000 || 1000, 30000));
      continue;
    }
    if (resp && resp.status !== 503) {
      failures = 0;
      show("down", false);
      let data = null;
      try { data = await resp.json(); } catch (e) { data = null; }
      if (resp.ok) return data;
      const err = (data && data.error) || {};
      throw new APIError(resp.status, err.code || "http_" + resp.status, err.message);
    }
    failures++;
    if (failures >= 2) {
      el("down").textContent = T.down;
      show("down", true);
    }
    let wait = Math.min(1000 * 2 ** Math.min(failures - 1, 3), 5000);
    const ra = resp && Number(resp.headers.get("Retry-After"));
    if (ra > 0) wait = Math.min(ra * 1000, 30000);
    await sleep(wait);
  }
}

function askToken(refused) {
  show("token-form", true);
  say(refused ? T.badToken : T.needToken, refused ? "bad" : "");
  el("token").focus();
}
el("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const v = el("token").value.trim();
  if (!v) return;
  store.set("token", v);
  el("token").value = "";
  show("token-form", false);
  run();
});
el("retry").addEventListener("click", () => { show("retry", false); run(); });

// finish shows a final message, with a way to start again where it helps.
function finish(text, kind, retry) {
  say(text, kind || "bad");
  show("proof", false);
  show("queue", false);
  show("buy-box", false);
  if (retry) {
    el("retry").textContent = T.again;
    show("retry", true);
  }
}

// failed turns an API refusal into a plain message; unknown ones are shown
// with their code.
function failed(e) {
  if (!(e instanceof APIError)) { finish(T.failed + e.message, "bad", true); return; }
  switch (e.code) {
    case "unauthenticated": store.del("token"); askToken(true); return;
    case "sold_out": finish(T.soldOut); return;
    case "sale_ended": finish(T.ended); return;
    case "blocked": finish(T.blocked); return;
    case "limit_reached": finish(T.limit); return;
    case "not_found": case "unknown_sku": finish(T.noSale); return;
    case "sale_not_started": finish(e.message, "bad", true); return;
    case "tickets_not_open": finish(e.message, "", true); return;
    case "not_in_queue": finish(T.expired, "bad", true); return;
    case "not_admitted": case "admission_expired": store.del(saleKey("admission")); finish(T.expired, "bad", true); return;
    case "ticket_required": case "ticket_expired": store.del(saleKey("ticket")); finish(T.failed + e.message, "bad", true); return;
  }
  finish(T.failed + (e.message || e.code), "bad", true);
}

let running = false;
async function run() {
  if (running) return;
  running = true;
  try {
    await flow();
  } catch (e) {
    failed(e);
  } finally {
    running = false;
  }
}

async function flow() {
  say(T.loading);
  el("title").textContent = sku;
  document.title = sku + " · Flash sale";
  const orderID = store.get(saleKey("order"));
  if (orderID) { await followOrder(orderID); return; }

  const s = await api("GET", "/api/v1/skus/" + encodeURIComponent(sku));
  el("facts").textContent = (zh ? "库存 " : "Available: ") + s.available + (zh ? "，每人限购 " : " · limit per buyer: ") + s.per_user_limit;
  if (s.state === "sold_out") { finish(T.soldOut); return; }
  if (s.state === "ended") { finish(T.ended); return; }
  if (s.state === "upcoming" && !s.waiting_room) {
    say(T.upcoming(fmtTime(s.starts_at)));
    await sleep(Math.min(Math.max(new Date(s.starts_at) - Date.now(), 1000), 30000));
    running = false;
    return run();
  }
  if (!store.get("token") && !(await signedIn())) { askToken(false); return; }

  const headers = {};
  if (s.ticket_required) headers["Flashsale-Ticket"] = await ticket(s);
  if (s.waiting_room) {
    const adm = await waitInRoom(headers);
    if (!adm) return;
    headers["Flashsale-Admission"] = adm.admission;
    await offer(headers, adm.expires_at);
  } else {
    await offer(headers, null);
  }
}

// signedIn tells whether the API knows the buyer without a token (a
// gateway in front of the service authenticates): an order that does not
// exist is 404 for a known buyer, 401 for an unknown one.
async function signedIn() {
  try {
    await api("GET", "/api/v1/orders/00000000-0000-0000-0000-000000000000");
    return true;
  } catch (e) {
    return e instanceof APIError && e.status !== 401;
  }
}

// ticket returns a ticket of the sale: the one kept for this tab while it
// has not expired, else a new one for a solved challenge. The widget
// fetches the challenge itself, with the buyer's token added to its fetch.
async function ticket(s) {
  const kept = store.get(saleKey("ticket"));
  if (kept) {
    const t = JSON.parse(kept);
    if (new Date(t.expires_at) - Date.now() > 5000) return t.ticket;
  }
  show("proof", true);
  say(T.proving);
  const w = el("widget");
  const payload = await new Promise((resolve, reject) => {
    w.addEventListener("verified", (e) => resolve(e.detail.payload), { once: true });
    w.configure({
      challenge: "/api/v1/skus/" + encodeURIComponent(sku) + "/challenge",
      fetch: async (input, init) => {
        const h = new Headers((init && init.headers) || {});
        const tok = store.get("token");
        if (tok) h.set("Authorization", "Bearer " + tok);
        const resp = await fetch(input, { ...init, headers: h, cache: "no-store" });
        if (resp.status === 409) {
          const body = await resp.clone().json().catch(() => ({}));
          if (body.error && body.error.code === "tickets_not_open") {
            reject(new APIError(409, "tickets_not_open", T.ticketsNotOpen(fmtTime(s.tickets_open_at))));
          }
        } else if (resp.status === 401) {
          reject(new APIError(401, "unauthenticated"));
        }
        return resp;
      },
    });
    w.verify().catch(reject);
  });
  const t = await api("POST", "/api/v1/skus/" + encodeURIComponent(sku) + "/ticket", { body: { payload } });
  store.set(saleKey("ticket"), JSON.stringify(t));
  show("proof", false);
  return t.ticket;
}

// waitInRoom joins the room (idempotent: a reload keeps the place) and
// polls it until the buyer is admitted (returned), or it is sold out or the
// admission expired (null, said).
async function waitInRoom(headers) {
  say(T.joining);
  const path = "/api/v1/skus/" + encodeURIComponent(sku) + "/queue";
  let st = await api("POST", path, { headers });
  show("queue", true);
  let first = null;
  for (;;) {
    if (st.state === "admitted") {
      el("progress").value = 100;
      show("queue", false);
      return st;
    }
    if (st.state === "sold_out") { finish(T.soldOut); return null; }
    if (st.state === "expired") { finish(T.expired, "bad", true); return null; }
    // Before the opening places are not drawn yet: position 0, ahead and
    // the ETA -1.
    const known = (n) => typeof n === "number" && n >= 0;
    el("position").textContent = st.position > 0 ? st.position : "—";
    el("ahead").textContent = known(st.ahead) ? st.ahead : "—";
    el("eta").textContent = known(st.eta_seconds) ? T.eta(Math.round(st.eta_seconds)) : "—";
    if (known(st.ahead)) {
      if (first === null || st.ahead > first) first = st.ahead;
      el("progress").value = first > 0 ? Math.round(100 * (first - st.ahead) / first) : 100;
    }
    if (el("status").textContent !== T.waiting) say(T.waiting);
    await sleep(Math.max(st.poll_after_ms || 1000, 250));
    st = await api("GET", path);
  }
}

// offer shows the Buy button (with the admission's countdown) and, once it
// is pressed, places the order with this tab's Idempotency-Key, so a retry
// after a lost answer is the same purchase.
async function offer(headers, expiresAt) {
  show("buy-box", true);
  say(T.admitted, "ok");
  const b = el("buy");
  b.disabled = false;
  b.focus();
  let timer = null;
  const tick = () => {
    const left = Math.round((new Date(expiresAt) - Date.now()) / 1000);
    el("countdown").textContent = left > 0 ? T.left(left) : "";
    if (left <= 0) clearInterval(timer);
  };
  if (expiresAt) { tick(); timer = setInterval(tick, 1000); }
  await new Promise((resolve) => b.addEventListener("click", resolve, { once: true }));
  clearInterval(timer);
  b.disabled = true;
  say(T.buying);
  let key = store.get(saleKey("key"));
  if (!key) { key = crypto.randomUUID(); store.set(saleKey("key"), key); }
  const o = await api("POST", "/api/v1/orders", { body: { sku_id: sku, quantity: 1 }, headers: { ...headers, "Idempotency-Key": key } });
  store.set(saleKey("order"), o.order_id);
  show("buy-box", false);
  await followOrder(o.order_id, o.status);
}

// followOrder shows the order's state, polling it while it may change.
async function followOrder(id, status) {
  show("order", true);
  el("order-id").textContent = id;
  for (;;) {
    if (status) {
      el("order-state").textContent = T.states[status] || status;
      el("order-state").dataset.state = status;
      const text = T.order + (T.states[status] || status);
      if (el("status").textContent !== text) say(text, status === "failed" || status === "cancelled" ? "bad" : "ok");
      if (status === "paid" || status === "cancelled" || status === "failed") return;
    }
    if (status) await sleep(status === "queued" ? 500 : 3000);
    status = (await api("GET", "/api/v1/orders/" + encodeURIComponent(id))).status;
  }
}

// The widget's workers are files of this server (the CSP allows no others).
for (const alg of ["PBKDF2/SHA-256", "PBKDF2/SHA-384", "PBKDF2/SHA-512"]) {
  $altcha.algorithms.set(alg, () => new Worker("/sale/assets/vendor/altcha/pbkdf2.js"));
}
for (const alg of ["SHA-256", "SHA-384", "SHA-512"]) {
  $altcha.algorithms.set(alg, () => new Worker("/sale/assets/vendor/altcha/sha.js"));
}
run();
})();

// flashsale operator dashboard: polls GET /admin/v1/overview every second
// and drives the admin API. No dependencies, no build step.
import { drawChart } from "./chart.js";

(() => {
  const $ = (sel, el = document) => el.querySelector(sel);

  const TOKEN_KEY = "flashsale.adminToken";
  const POLL_MS = 1000;
  const HIDDEN_POLL_MS = 5000;
  const READY_MS = 5000;
  const HISTORY_S = 600; // chart span: the history the server keeps (ten minutes)
  const RATE_WINDOW_S = 5; // key figures: average over this window
  const LATENCY_WINDOW_S = 10;
  const CHART_SMOOTH_S = 3;
  const MAX_CHART_SKUS = 6; // the sales whose stock the server samples (dashboard.ChartSales)
  const SKU_COLORS = ["#38bdf8", "#a78bfa", "#f472b6", "#facc15", "#34d399", "#fb923c"];
  const REASONS = { sold_out: "sold out", limit_reached: "limit", not_open: "not open", busy: "busy", rate_limited: "rate limited", unknown_sku: "unknown", invalid: "invalid", error: "error" };

  let token = null;
  try { token = sessionStorage.getItem(TOKEN_KEY); } catch (_) { /* storage disabled: memory only */ }

  let history = []; // samples: {t, purchases, applied, latency, avail: {sku: n}}
  let lastOverview = null;
  let lastOKAt = 0; // client clock
  let downSince = 0;
  let downError = null;
  let pollTimer = 0;
  let polling = false;
  let dlqCount = -1;
  const skuColors = new Map();

  // ---- API ----------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) { super(message); this.status = status; this.code = code; }
  }

  async function api(method, path, body, opts = {}) {
    const headers = { Accept: "application/json" };
    const tok = opts.token !== undefined ? opts.token : token;
    if (tok) headers.Authorization = "Bearer " + tok;
    let payload;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const ctl = new AbortController();
    const limit = opts.timeout || 8000;
    const timer = setTimeout(() => ctl.abort(), limit);
    let resp;
    try {
      resp = await fetch(path, { method, headers, body: payload, signal: ctl.signal, cache: "no-store", credentials: "omit" });
    } catch (_) {
      throw new ApiError(0, "unreachable", ctl.signal.aborted ? `no answer within ${limit / 1000} s` : "the server cannot be reached");
    } finally {
      clearTimeout(timer);
    }
    let data = null;
    try { data = await resp.json(); } catch (_) { /* not JSON */ }
    if (!resp.ok) {
      const e = (data && data.error) || {};
      throw new ApiError(resp.status, e.code || "http_" + resp.status, e.message || resp.statusText || "HTTP " + resp.status);
    }
    return data;
  }

  function describe(e) {
    if (e.status === 0) return e.message;
    return `${e.status} ${e.code}: ${e.message}`;
  }

  // ---- formatting ---------------------------------------------------------

  const fmtInt = (n) => (n == null ? "—" : Number(n).toLocaleString("en-US"));
  function fmtRate(r) {
    if (r == null || !isFinite(r)) return "—";
    if (r === 0) return "0";
    if (r < 10) return r.toFixed(1);
    return Math.round(r).toLocaleString("en-US");
  }
  function fmtMs(ms) {
    if (ms == null) return "—";
    if (ms < 1) return ms.toFixed(2);
    if (ms < 10) return ms.toFixed(1);
    return Math.round(ms).toLocaleString("en-US");
  }
  function fmtDur(ms) {
    let s = Math.max(0, Math.round(ms / 1000));
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s}s`;
    return `${s}s`;
  }
  const fmtTime = (t) => new Date(t).toLocaleTimeString([], { hour12: false });
  const fmtDateTime = (t) => new Date(t).toLocaleString([], { hour12: false });
  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function toast(msg, isErr) {
    const t = el("div", "toast" + (isErr ? " err" : ""), msg);
    $("#toasts").append(t);
    setTimeout(() => t.remove(), isErr ? 9000 : 5000);
  }

  function setResult(sel, msg, ok) {
    const p = $(sel);
    p.textContent = msg;
    p.className = "result " + (ok ? "ok" : "err");
  }

  // ---- token --------------------------------------------------------------

  function showLogin(message) {
    token = null;
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (_) { /* ignore */ }
    clearTimeout(pollTimer);
    history = [];
    lastOverview = null;
    dlqCount = -1;
    $("#main").hidden = true;
    $("#signout").hidden = true;
    $("#breaker").hidden = true;
    $("#db-outage").hidden = true;
    $("#banner").hidden = true;
    $("#login").hidden = false;
    setConn("locked");
    const err = $("#token-error");
    err.textContent = message || "";
    err.hidden = !message;
    $("#token").focus();
  }

  function refusal(e) {
    switch (e.status) {
      case 401: return "Token refused: the server answered 401 unauthenticated. Check FLASHSALE_ADMIN_TOKEN.";
      case 403: return "The admin API is disabled on this server (FLASHSALE_ADMIN_TOKEN is empty).";
      case 404: return "This server has no overview endpoint (GET /admin/v1/overview).";
      case 0: return "Server unreachable (" + e.message + "); try again when it is back.";
    }
    return "Error " + describe(e);
  }

  $("#token-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const input = $("#token");
    const tok = input.value.trim();
    if (!tok) return;
    const btn = ev.submitter || $("#token-form button");
    btn.disabled = true;
    $("#token-error").hidden = true;
    try {
      const ov = await api("GET", "/admin/v1/overview", undefined, { token: tok });
      token = tok;
      try { sessionStorage.setItem(TOKEN_KEY, tok); } catch (_) { /* memory only */ }
      input.value = "";
      unlock(ov);
    } catch (e) {
      const err = $("#token-error");
      err.textContent = refusal(e);
      err.hidden = false;
      input.select();
    } finally {
      btn.disabled = false;
    }
  });

  $("#signout").addEventListener("click", () => showLogin(""));

  function unlock(ov) {
    $("#login").hidden = true;
    $("#main").hidden = false;
    $("#signout").hidden = false;
    history = fromServer(ov.history);
    render(ov);
    loadDLQ();
    schedule();
  }

  // ---- polling ------------------------------------------------------------

  function schedule(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, ms || (document.hidden ? HIDDEN_POLL_MS : POLL_MS));
  }

  async function poll() {
    if (!token || polling) return;
    polling = true;
    try {
      render(await api("GET", "/admin/v1/overview", undefined, { timeout: 4000 }));
    } catch (e) {
      if (e.status === 401 || e.status === 403) {
        polling = false;
        showLogin(e.status === 401 ? "The server no longer accepts this token (401). Enter the current one." : refusal(e));
        return;
      }
      markDown(e);
    } finally {
      polling = false;
    }
    if (token) schedule();
  }

  function pollNow() { if (token) schedule(50); }

  document.addEventListener("visibilitychange", () => { if (!document.hidden) pollNow(); });

  function setConn(state, text) {
    const p = $("#conn");
    p.className = "pill " + ({ live: "ok live", down: "bad", locked: "", connecting: "" }[state] || "");
    p.textContent = text || { live: "live", down: "server down", locked: "locked", connecting: "connecting…" }[state];
    if (state === "live") { void p.offsetWidth; } // restart the pulse
  }

  function markDown(e) {
    if (!downSince) downSince = Date.now();
    downError = e;
    setConn("down", e.status === 0 ? "server down" : "server error " + e.status);
    $("#main").classList.add("stale");
    updateBanner();
  }

  function updateBanner() {
    const b = $("#banner");
    if (!token) { b.hidden = true; return; }
    if (downSince) {
      const since = fmtDur(Date.now() - downSince);
      const head = downError && downError.status === 0 ? "Server unreachable" : "Server error";
      const last = lastOKAt ? `Showing the last figures, received at ${fmtTime(lastOKAt)} (${fmtDur(Date.now() - lastOKAt)} ago).` : "";
      b.className = "banner down";
      b.replaceChildren(`${head} for ${since}: ${describe(downError)}. Retrying every second.`, el("small", "", last));
      b.hidden = false;
      return;
    }
    const errs = lastOverview && lastOverview.errors;
    if (errs && Object.keys(errs).length) {
      b.className = "banner";
      b.replaceChildren("Degraded: some figures could not be read and show —.",
        ...Object.entries(errs).map(([k, v]) => el("small", "", `${k}: ${v}`)));
      b.hidden = false;
      return;
    }
    b.hidden = true;
  }

  // The age of the data ticks even while requests hang.
  setInterval(() => {
    if (!token) return;
    if (lastOKAt) {
      const age = Date.now() - lastOKAt;
      $("#updated").textContent = downSince || age > 3000
        ? `Last update ${fmtTime(lastOKAt)} (${fmtDur(age)} ago)`
        : `Updated ${fmtTime(lastOKAt)}`;
    }
    if (downSince) updateBanner();
  }, 1000);

  async function pollReady() {
    const p = $("#ready");
    try {
      const ctl = new AbortController();
      const timer = setTimeout(() => ctl.abort(), 4000);
      const r = await fetch("/readyz", { cache: "no-store", signal: ctl.signal });
      clearTimeout(timer);
      const b = await r.json();
      const failing = Object.entries(b.checks || {}).filter(([, v]) => v !== "ok").map(([k]) => k);
      if (b.status === "ok") {
        p.className = "pill ok"; p.textContent = "ready";
      } else if (b.status === "degraded") {
        p.className = "pill warn"; p.textContent = "degraded" + (failing.length ? ": " + failing.join(", ") : "");
      } else {
        p.className = "pill bad"; p.textContent = "not ready" + (failing.length ? ": " + failing.join(", ") : "");
      }
      p.title = "GET /readyz: " + JSON.stringify(b.checks || {});
    } catch (_) {
      p.className = "pill bad"; p.textContent = "ready: no answer";
    }
    setTimeout(pollReady, READY_MS);
  }

  // ---- rendering ----------------------------------------------------------

  function render(ov) {
    lastOverview = ov;
    lastOKAt = Date.now();
    downSince = 0;
    downError = null;
    $("#main").classList.remove("stale");
    setConn("live");

    const t = Date.parse(ov.now);
    const c = ov.counters || {};
    const sample = { t, purchases: c.purchases || {}, applied: c.applied || {}, latency: c.order_latency, avail: {} };
    for (const s of ov.sales) if (s.redis_available != null) sample.avail[s.sku_id] = s.redis_available;
    const prev = history[history.length - 1];
    // A restarted server starts its counters again: so does the history.
    if (prev && (t <= prev.t || sum(sample.purchases) < sum(prev.purchases))) history = fromServer(ov.history);
    history.push(sample);
    while (history.length > 2 && t - history[0].t > (HISTORY_S + 5) * 1000) history.shift();

    renderKPIs(ov);
    renderSales(ov);
    renderRelease(ov.release, t);
    renderCrowd(ov.crowd);
    drawCharts();
    updateBanner();
    const n = ov.pipeline && ov.pipeline.dead_letters;
    if (n != null && n !== dlqCount) loadDLQ();
  }

  // fromServer turns the overview's history (one array per figure, aligned
  // with t) into samples, so that a page opened mid-sale charts at once.
  // The server's samples carry no latency: the latency figure waits for the
  // page's own samples.
  function fromServer(h) {
    if (!h || !Array.isArray(h.t)) return [];
    return h.t.map((t, i) => {
      const s = { t, purchases: {}, applied: {}, avail: {} };
      for (const [k, v] of Object.entries(h.purchases || {})) s.purchases[k] = v[i];
      for (const [k, v] of Object.entries(h.applied || {})) s.applied[k] = v[i];
      for (const [k, v] of Object.entries(h.available || {})) if (v[i] != null) s.avail[k] = v[i];
      return s;
    });
  }

  // sampleAgo returns the oldest sample at most s seconds older than the
  // latest (that has key, if given).
  function sampleAgo(s, key) {
    const last = history[history.length - 1];
    for (const h of history) if (last.t - h.t <= s * 1000 && (!key || h[key])) return h;
    return last;
  }

  function rates(from, to, key) {
    const dt = (to.t - from.t) / 1000;
    const out = {};
    if (dt <= 0) return null;
    const a = from[key], b = to[key];
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) out[k] = Math.max(0, (b[k] || 0) - (a[k] || 0)) / dt;
    return out;
  }

  // quantile mirrors metrics.Histogram.Quantile (Prometheus' histogram_quantile).
  function quantile(buckets, count, q) {
    if (!count || !buckets.length) return null;
    const rank = q * count;
    let i = buckets.findIndex((b) => b.count >= rank);
    if (i < 0) return buckets[buckets.length - 1].le * 1000;
    const lower = i > 0 ? buckets[i - 1].le : 0;
    const below = i > 0 ? buckets[i - 1].count : 0;
    const inside = buckets[i].count - below;
    if (!inside) return buckets[i].le * 1000;
    return (lower + (buckets[i].le - lower) * (rank - below) / inside) * 1000;
  }

  function windowLatency(from, to) {
    const a = from.latency, b = to.latency;
    if (!a || !b || from === to || a.count > b.count) return null;
    if (a.count > 0 && a.buckets.length !== b.buckets.length) return null;
    // Before the first purchase the histogram has no buckets at all.
    const count = b.count - a.count;
    const buckets = b.buckets.map((x, i) => ({ le: x.le, count: x.count - (a.count ? a.buckets[i].count : 0) }));
    return { count, p: [0.5, 0.95, 0.99].map((q) => quantile(buckets, count, q)) };
  }

  function renderKPIs(ov) {
    const last = history[history.length - 1];
    const from = sampleAgo(RATE_WINDOW_S);
    const r = from !== last ? rates(from, last, "purchases") : null;
    const p = ov.counters.purchases || {};
    $("#kpi-accepted").textContent = r ? fmtRate(r.accepted || 0) : "—";
    $("#kpi-accepted-total").textContent = `${fmtInt(p.accepted || 0)} since start`;
    if (r) {
      const rej = Object.entries(r).filter(([k]) => k !== "accepted");
      $("#kpi-rejected").textContent = fmtRate(rej.reduce((a, [, v]) => a + v, 0));
      const parts = rej.filter(([, v]) => v > 0).sort((x, y) => y[1] - x[1]).map(([k, v]) => `${REASONS[k] || k} ${fmtRate(v)}`);
      $("#kpi-rejected-why").textContent = parts.length ? parts.join(" · ") : `${fmtInt(sum(p) - (p.accepted || 0))} since start`;
    } else {
      $("#kpi-rejected").textContent = "—";
      $("#kpi-rejected-why").textContent = "measuring…";
    }

    const lat = windowLatency(sampleAgo(LATENCY_WINDOW_S, "latency"), last);
    const ol = ov.counters.order_latency || {};
    if (lat && lat.count > 0) {
      $("#kpi-latency").textContent = lat.p.map(fmtMs).join(" · ");
      $("#kpi-latency-note").textContent = `p50 · p95 · p99 (${LATENCY_WINDOW_S} s)`;
      $("#kpi-latency-note").title = `${fmtInt(lat.count)} purchases in the last ${LATENCY_WINDOW_S} s`;
    } else {
      $("#kpi-latency").textContent = "idle";
      $("#kpi-latency-note").textContent = ol.count
        ? `since start: p99 ${fmtMs(ol.p99_ms)} ms over ${fmtInt(ol.count)}`
        : "no purchase yet";
    }

    const pl = ov.pipeline || {};
    $("#kpi-queue").textContent = `${fmtInt(pl.queue_pending)} · ${fmtInt(pl.queue_ack_pending)}`;
    let outbox = 0, inflight = 0;
    for (const s of ov.sales) { outbox += s.outbox || 0; inflight += s.in_flight || 0; }
    // The stream acknowledging no publish (a full disk under its store):
    // purchases wait in the outbox until it stores again.
    const failing = pl.stream_publish === "failing";
    $("#kpi-queue-card").classList.toggle("bad", failing);
    $("#kpi-queue-note").textContent = failing
      ? `stream stores nothing: outbox ${fmtInt(outbox)}`
      : `in flight ${fmtInt(inflight)} · outbox ${fmtInt(outbox)}`;
    $("#kpi-queue-note").title = failing ? (pl.stream_publish_error || "") : "";

    $("#kpi-dlq").textContent = fmtInt(pl.dead_letters);
    $("#kpi-dlq-card").classList.toggle("bad", pl.dead_letters > 0);
    $("#kpi-dlq-card").classList.toggle("good", pl.dead_letters === 0);
    $("#kpi-dlq-note").textContent = pl.dead_letters > 0 ? "units held: replay below" : "every reservation applied";

    renderReconcile(ov.reconcile, Date.parse(ov.now));

    const br = $("#breaker");
    br.hidden = false;
    const state = pl.breaker || "?";
    br.className = "pill " + (state === "closed" ? "ok" : state === "open" ? "bad" : "warn");
    br.textContent = state === "open" ? "breaker open: selling from the database" : "breaker " + state;
    const out = $("#db-outage");
    out.hidden = !pl.database_outage;
    if (pl.database_outage) {
      out.textContent = "database refuses writes since " + new Date(pl.database_outage.since).toLocaleTimeString() + ": orders wait";
      out.title = pl.database_outage.reason;
    }
    $("#sales-count").textContent = `${ov.sales.length}${ov.more_sales ? ` (+${ov.more_sales} not shown)` : ""}`;
  }

  const RECONCILE_RANK = ["alert", "corrected", "watch", "loaded", "ok"];

  // renderReconcile shows the last reconcile pass: {at, skus: [{sku_id,
  // redis_available, db_stock, in_flight, drift, action}]}.
  function renderReconcile(rc, now) {
    const card = $("#kpi-reconcile-card");
    const last = $("#reconcile-last");
    if (!rc) {
      $("#kpi-reconcile").textContent = "—";
      $("#kpi-reconcile-note").textContent = "no pass yet";
      card.className = "card kpi";
      last.replaceChildren("No pass on this instance yet.");
      return;
    }
    const skus = rc.skus || [];
    const count = {};
    for (const s of skus) count[s.action] = (count[s.action] || 0) + 1;
    const worst = RECONCILE_RANK.find((a) => count[a]) || "ok";
    const ago = rc.at ? fmtDur(now - Date.parse(rc.at)) + " ago" : "";
    $("#kpi-reconcile").textContent = worst === "ok" || worst === "loaded" ? "ok" : worst;
    const parts = RECONCILE_RANK.filter((a) => a !== "ok" && count[a]).map((a) => `${count[a]} ${a}`);
    $("#kpi-reconcile-note").textContent = [ago, parts.length ? parts.join(", ") : `${skus.length} sales agree`].filter(Boolean).join(" · ");
    card.className = "card kpi " + (worst === "alert" ? "bad" : worst === "watch" || worst === "corrected" ? "warn" : "good");

    const off = skus.filter((s) => s.action !== "ok");
    const head = el("div", "", `Last pass ${rc.at ? fmtTime(rc.at) : ""} (${ago}): ${skus.length} sales, ` +
      (off.length ? `${off.length} not ok.` : "Redis agrees with the database everywhere."));
    const rows = off.slice(0, 8).map((s) => el("div", "drift " + s.action,
      `${s.sku_id}: ${s.action}, drift ${s.drift > 0 ? "+" : ""}${s.drift} (Redis ${fmtInt(s.redis_available)}, database ${fmtInt(s.db_stock)}, in flight ${fmtInt(s.in_flight)})`));
    last.replaceChildren(head, ...rows);
  }

  // renderRelease lists the instances that reported within the last 30 s
  // (group, version, shadow counts) and the canary trial's share and state.
  function renderRelease(rel, now) {
    const body = $("#instances tbody");
    if (!rel) {
      $("#release-count").textContent = "";
      body.replaceChildren();
      return;
    }
    const list = rel.instances || [];
    const groups = {};
    for (const i of list) groups[i.group] = (groups[i.group] || 0) + 1;
    $("#release-count").textContent = Object.keys(groups).map((g) => `${groups[g]} ${g}`).join(", ");
    const c = rel.canary;
    const state = $("#canary-state");
    if (c) {
      const steps = (c.steps || []).map((s) => s + "%").join(" → ");
      state.textContent = `Canary: ${c.share}% of buyers, ${c.state}` + (steps ? ` (steps ${steps})` : "") +
        (c.reason ? `: ${c.reason}` : "") + ` · updated ${fmtDur(now - Date.parse(c.updated_at))} ago`;
      state.className = "hint canary " + (c.state === "aborted" ? "bad" : c.state === "running" ? "warn" : "good");
    } else {
      state.textContent = "No canary trial has run: every buyer meets the stable group.";
      state.className = "hint";
    }
    body.replaceChildren(...list.map((i) => {
      const tr = el("tr", i.group === "canary" ? "canary" : "");
      const sh = i.shadow;
      const cells = [i.id, i.group, i.version, (i.commit || "").slice(0, 12),
        sh ? fmtInt(sh.match) : "–", sh ? fmtInt(sh.mismatch) : "–", sh ? fmtInt(sh.dropped) : "–",
        fmtDur(Math.max(0, now - Date.parse(i.seen_at))) + " ago"];
      cells.forEach((v, k) => {
        const td = el("td", k >= 4 && k <= 6 ? "num" : "", v);
        if (k === 5 && sh && sh.mismatch > 0) td.classList.add("bad");
        tr.append(td);
      });
      return tr;
    }));
  }

  // renderCrowd shows the challenges and refusals this instance counted and
  // every waiting room as its controller last wrote it.
  function renderCrowd(c) {
    if (!c) return;
    const ch = c.challenges || {};
    const refused = Object.entries(c.tickets_refused || {}).filter(([, n]) => n > 0)
      .sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ${fmtInt(n)}`);
    const eta = c.eta_error_p50_s == null ? "" :
      ` · ETA error p50 ${c.eta_error_p50_s.toFixed(1)} s, p90 ${c.eta_error_p90_s.toFixed(1)} s`;
    $("#crowd-tickets").textContent = (ch.issued ?
      `Challenges: ${fmtInt(ch.issued)} issued, ${fmtInt(ch.solved || 0)} solved, ${fmtInt(ch.refused || 0)} refused.` :
      "No challenge handed out yet.") + (refused.length ? ` Refused: ${refused.join(", ")}.` : "") + eta;
    const rooms = c.rooms || [];
    $("#crowd-count").textContent = rooms.length ? `${rooms.length} waiting room${rooms.length > 1 ? "s" : ""}` : "";
    $("#rooms-empty").hidden = rooms.length > 0;
    $("#rooms").hidden = rooms.length === 0;
    $("#rooms tbody").replaceChildren(...rooms.map((r) => {
      const tr = el("tr");
      tr.dataset.sku = r.sku_id;
      [r.sku_id, fmtInt(r.joined), fmtInt(r.waiting), fmtInt(r.admitted), r.rate.toFixed(1),
        r.avail == null ? "–" : fmtInt(r.avail), r.lottery == null ? "–" : fmtInt(r.lottery)]
        .forEach((v, k) => tr.append(el("td", k > 0 ? "num" : "", v)));
      return tr;
    }));
  }

  function colorOf(sku) {
    if (!skuColors.has(sku)) skuColors.set(sku, SKU_COLORS[skuColors.size % SKU_COLORS.length]);
    return skuColors.get(sku);
  }

  function windowText(s, now) {
    const st = s.starts_at ? Date.parse(s.starts_at) : 0;
    const en = s.ends_at ? Date.parse(s.ends_at) : 0;
    if (st && now < st) return `starts in ${fmtDur(st - now)}`;
    if (en && now >= en) return `ended ${fmtDur(now - en)} ago`;
    if (en) return `ends in ${fmtDur(en - now)}`;
    if (st) return `open since ${fmtDateTime(st)}`;
    return "always open";
  }

  const SALE_CELLS = [
    ["sku", "SKU"], ["state", "State"], ["window", "Window"], ["num limit", "Limit"], ["num avail", "Available"],
    ["num db", "DB stock"], ["num flight", "In flight"], ["num outbox", "Outbox"], ["bar-cell", "Stock"], ["row-actions", ""],
  ];

  function saleRow(sku) {
    const tr = el("tr");
    tr.dataset.sku = sku;
    for (const [cls, label] of SALE_CELLS) {
      const td = el("td", cls);
      if (label) td.dataset.label = label;
      tr.append(td);
    }
    const swatch = el("i", "swatch");
    $(".sku", tr).append(el("span", "", sku));
    $(".sku", tr).prepend(swatch);
    $(".state", tr).append(el("span", "badge"));
    const bar = el("div", "bar");
    bar.append(el("span", "sold"), el("span", "flight"), el("span", "left"));
    $(".bar-cell", tr).append(bar, el("div", "bar-label"));
    const edit = el("button", "ghost small edit", "Edit");
    edit.type = "button";
    edit.title = "Fill the form below with this sale (restock, change the limit or window)";
    edit.addEventListener("click", () => editSale(sku));
    const warm = el("button", "ghost small warm", "Warm up");
    warm.type = "button";
    warm.title = "Load or re-sync this sale in Redis from the database (never re-sells units in flight)";
    warm.addEventListener("click", () => warmUp(sku, warm));
    $(".row-actions", tr).append(edit, warm);
    return tr;
  }

  function setCell(td, text, title) {
    if (td.textContent !== text) td.textContent = text;
    td.title = title || "";
  }

  function renderSales(ov) {
    const tbody = $("#sales tbody");
    const now = Date.parse(ov.now);
    const keep = new Set();
    ov.sales.forEach((s, i) => {
      keep.add(s.sku_id);
      let tr = [...tbody.children].find((r) => r.dataset.sku === s.sku_id);
      if (!tr) tr = saleRow(s.sku_id);
      if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);

      const inChart = i < MAX_CHART_SKUS;
      const sw = $(".swatch", tr);
      sw.style.background = inChart ? colorOf(s.sku_id) : "transparent";
      const st = $(".state span", tr);
      st.className = "badge " + s.state;
      st.textContent = s.state.replace("_", " ");
      setCell($(".window", tr), windowText(s, now),
        `starts ${s.starts_at ? fmtDateTime(s.starts_at) : "—"} · ends ${s.ends_at ? fmtDateTime(s.ends_at) : "—"}`);
      setCell($(".limit", tr), fmtInt(s.per_user_limit));
      if (s.redis_loaded === false) setCell($(".avail", tr), "not loaded", "Redis does not hold this sale: warm it up");
      else setCell($(".avail", tr), fmtInt(s.redis_available), s.redis_available == null ? "Redis could not be read" : "");
      setCell($(".db", tr), fmtInt(s.db_stock), `allocation ${fmtInt(s.total_stock)}`);
      setCell($(".flight", tr), fmtInt(s.in_flight), s.in_flight_units != null ? `${fmtInt(s.in_flight_units)} units` : "");
      setCell($(".outbox", tr), fmtInt(s.outbox));

      const total = Math.max(s.total_stock, 1);
      const sold = Math.max(0, s.total_stock - s.db_stock);
      const flight = s.in_flight_units || 0;
      const left = s.redis_available != null ? Math.max(0, s.redis_available) : Math.max(0, s.db_stock - flight);
      const [a, b, c] = $(".bar", tr).children;
      a.style.width = (100 * sold / total) + "%";
      b.style.width = (100 * Math.min(flight, total - sold) / total) + "%";
      c.style.width = (100 * Math.min(left, total) / total) + "%";
      setCell($(".bar-label", tr), `${fmtInt(sold)} sold · ${fmtInt(flight)} in flight · ${fmtInt(left)} left of ${fmtInt(s.total_stock)}`);
    });
    for (const tr of [...tbody.children]) if (!keep.has(tr.dataset.sku)) tr.remove();
    $("#sales-empty").hidden = ov.sales.length > 0;
  }

  // ---- charts -------------------------------------------------------------

  function legend(sel, series) {
    $(sel).replaceChildren(...series.map((s) => {
      const span = el("span");
      const i = el("i");
      i.style.background = s.color;
      span.append(i, s.name);
      return span;
    }));
  }

  function drawCharts() {
    if ($("#main").hidden) return;
    // Each point is the rate over the CHART_SMOOTH_S before it: one-second
    // counts of a slow sale are too jagged to read.
    const acc = [], rej = [], app = [];
    for (let i = 1, j = 0; i < history.length; i++) {
      while (j < i - 1 && history[i].t - history[j].t > CHART_SMOOTH_S * 1000 + 500) j++;
      const r = rates(history[j], history[i], "purchases");
      const a = rates(history[j], history[i], "applied");
      if (!r) continue;
      const t = history[i].t;
      acc.push([t, r.accepted || 0]);
      rej.push([t, Object.entries(r).reduce((s, [k, v]) => (k === "accepted" ? s : s + v), 0)]);
      app.push([t, (a && a.applied) || 0]);
    }
    const rateSeries = [
      { name: "accepted", color: "#22c55e", points: acc, fill: true },
      { name: "rejected", color: "#f59e0b", points: rej },
      { name: "applied to the database", color: "#38bdf8", points: app, dash: [5, 4], width: 1.5 },
    ];
    // The axis spans the data, from one minute up to HISTORY_S, in steps
    // the chart labels (30 s up to three minutes, then two minutes).
    const last = history[history.length - 1];
    const data = last ? (last.t - history[0].t) / 1000 : 0;
    const unit = data > 180 ? 120 : 30;
    const span = Math.min(HISTORY_S, Math.max(60, Math.ceil(data / unit) * unit));
    const axis = { tEnd: last ? last.t : 0, span };
    legend("#rate-legend", rateSeries);
    drawChart($("#rate-chart"), rateSeries, { ...axis, empty: "collecting data…" });

    const skus = (lastOverview ? lastOverview.sales : []).slice(0, MAX_CHART_SKUS).map((s) => s.sku_id);
    const stockSeries = skus.map((sku) => ({
      name: sku,
      color: colorOf(sku),
      points: history.filter((h) => sku in h.avail).map((h) => [h.t, h.avail[sku]]),
    }));
    legend("#stock-legend", stockSeries);
    drawChart($("#stock-chart"), stockSeries, { ...axis, empty: skus.length ? "collecting data…" : "no sale" });
  }

  window.addEventListener("resize", () => drawCharts());

  // ---- operator actions ---------------------------------------------------

  const form = $("#sku-form");
  const dirty = new Set();
  for (const id of ["f-limit", "f-starts", "f-ends"]) $("#" + id).addEventListener("input", () => dirty.add(id));

  function toLocalInput(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  // fillFrom puts an existing sale's limit and window in the form, so that
  // saving a restock keeps them (an omitted time means "no bound").
  function fillFrom(s, all) {
    for (const [id, iso] of [["f-starts", s.starts_at], ["f-ends", s.ends_at]]) {
      const inp = $("#" + id);
      if (all || !dirty.has(id)) {
        inp.value = toLocalInput(iso);
        inp.dataset.iso = iso || "";
        inp.dataset.local = inp.value;
      }
    }
    if (all || !dirty.has("f-limit")) $("#f-limit").value = s.per_user_limit;
    $("#f-stock").placeholder = `now ${s.total_stock}`;
  }

  function saleOf(sku) { return lastOverview && lastOverview.sales.find((s) => s.sku_id === sku); }

  function editSale(sku) {
    const s = saleOf(sku);
    if (!s) return;
    dirty.clear();
    $("#f-sku").value = sku;
    $("#f-stock").value = s.total_stock;
    fillFrom(s, true);
    setResult("#sku-result", `Editing ${sku}: allocation ${fmtInt(s.total_stock)} (${fmtInt(s.total_stock - s.db_stock)} sold). Raise it to restock.`, true);
    form.scrollIntoView({ block: "center" });
    $("#f-stock").focus();
    $("#f-stock").select();
  }

  $("#f-sku").addEventListener("change", () => {
    const s = saleOf($("#f-sku").value.trim());
    if (s) fillFrom(s, false);
    else $("#f-stock").placeholder = "100";
  });

  function timeField(id) {
    const inp = $("#" + id);
    if (!inp.value) return undefined;
    if (inp.dataset.local === inp.value && inp.dataset.iso) return inp.dataset.iso; // unchanged: exact
    const d = new Date(inp.value);
    if (isNaN(d)) throw new Error("bad date");
    return d.toISOString();
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const sku = $("#f-sku").value.trim();
    const body = { stock: Number($("#f-stock").value), per_user_limit: Number($("#f-limit").value) };
    try {
      const st = timeField("f-starts"), en = timeField("f-ends");
      if (st) body.starts_at = st;
      if (en) body.ends_at = en;
    } catch (_) {
      setResult("#sku-result", "A date is not valid.", false);
      return;
    }
    const btn = $("#f-submit");
    btn.disabled = true;
    try {
      const r = await api("PUT", "/admin/v1/skus/" + encodeURIComponent(sku), body);
      const msg = r.created
        ? `Created ${r.sku_id}: ${fmtInt(r.stock)} units, limit ${r.per_user_limit} per buyer.`
        : `Saved ${r.sku_id}: allocation ${fmtInt(r.stock)}, database stock ${fmtInt(r.db_stock)}, limit ${r.per_user_limit}.`;
      setResult("#sku-result", msg, true);
      toast(msg);
      dirty.clear();
      pollNow();
    } catch (e) {
      if (e.status === 401) { showLogin("The server refused the token (401)."); return; }
      setResult("#sku-result", "Refused: " + describe(e), false);
    } finally {
      btn.disabled = false;
    }
  });

  async function warmUp(sku, btn) {
    btn.disabled = true;
    try {
      const r = await api("POST", "/admin/v1/skus/" + encodeURIComponent(sku) + "/warmup");
      toast(`Warm-up ${sku}: ${r.seeded ? "loaded" : "re-synced"}, available ${fmtInt(r.available)} (database ${fmtInt(r.db_stock)}, in flight ${fmtInt(r.in_flight)}).`);
      pollNow();
    } catch (e) {
      if (e.status === 401) { showLogin("The server refused the token (401)."); return; }
      toast(`Warm-up ${sku} failed: ${describe(e)}`, true);
    } finally {
      btn.disabled = false;
    }
  }

  $("#reconcile").addEventListener("click", async (ev) => {
    const btn = ev.currentTarget;
    btn.disabled = true;
    setResult("#reconcile-result", "Running…", true);
    try {
      const r = await api("POST", "/admin/v1/reconcile", undefined, { timeout: 60000 });
      const off = (r.skus || []).filter((s) => s.action !== "ok");
      setResult("#reconcile-result", `Pass done: ${(r.skus || []).length} sales` +
        (off.length ? `; ${off.map((s) => `${s.sku_id} ${s.action} (drift ${s.drift})`).join(", ")}.` : ", all agree."), off.every((s) => s.action !== "alert"));
      pollNow();
    } catch (e) {
      if (e.status === 401) { showLogin("The server refused the token (401)."); return; }
      const hint = e.status === 404 && e.code === "not_found" ? " (this server has no reconcile endpoint yet)" : "";
      setResult("#reconcile-result", "Reconcile failed: " + describe(e) + hint, false);
    } finally {
      btn.disabled = false;
    }
  });

  async function loadDLQ() {
    try {
      const r = await api("GET", "/admin/v1/dlq?limit=100");
      dlqCount = r.count;
      renderDLQ(r);
    } catch (e) {
      if (e.status === 401) { showLogin("The server refused the token (401)."); return; }
      setResult("#dlq-result", "Could not list dead letters: " + describe(e), false);
    }
  }

  function renderDLQ(r) {
    const tbody = $("#dlq tbody");
    tbody.replaceChildren(...r.dead_letters.map((d) => {
      const tr = el("tr");
      tr.dataset.seq = d.seq;
      const cells = [
        ["num", "Seq", String(d.seq)], ["order", "Order", d.order_id], ["sku", "SKU", d.sku_id],
        ["reason", "Reason", d.reason], ["num", "Deliveries", String(d.deliveries)],
        ["when", "Failed at", d.failed_at ? fmtDateTime(d.failed_at) : "—"],
      ];
      for (const [cls, label, text] of cells) {
        const td = el("td", cls, text);
        td.dataset.label = label;
        tr.append(td);
      }
      const act = el("td", "row-actions");
      const replay = el("button", "small replay", "Replay");
      replay.type = "button";
      replay.title = "Send it back to the order stream: applied once, even if it already was";
      replay.addEventListener("click", () => dlqAction(d, "replay", replay));
      const discard = el("button", "ghost small discard", "Discard");
      discard.type = "button";
      discard.title = "Record the order failed and give its units back";
      discard.addEventListener("click", () => {
        if (confirm(`Discard order ${d.order_id}? It is recorded failed and its units go back on sale.`)) dlqAction(d, "discard", discard);
      });
      act.append(replay, discard);
      tr.append(act);
      return tr;
    }));
    $("#dlq-empty").hidden = r.dead_letters.length > 0;
    $("#dlq").hidden = r.dead_letters.length === 0;
    $("#dlq-count").textContent = r.count ? String(r.count) : "";
  }

  async function dlqAction(d, action, btn) {
    btn.disabled = true;
    try {
      const r = await api("POST", `/admin/v1/dlq/${d.seq}/${action}`);
      const msg = `Dead letter ${d.seq} (${d.order_id}): ${r.action.replace("_", " ")}` + (r.units_returned ? `, ${r.units_returned} units back on sale` : "") + ".";
      setResult("#dlq-result", msg, true);
      toast(msg);
    } catch (e) {
      if (e.status === 401) { showLogin("The server refused the token (401)."); return; }
      setResult("#dlq-result", `${action} ${d.seq} failed: ${describe(e)}`, false);
    } finally {
      btn.disabled = false;
    }
    loadDLQ();
    pollNow();
  }

  $("#dlq-refresh").addEventListener("click", loadDLQ);

  // ---- start --------------------------------------------------------------

  pollReady();
  if (token) {
    // A token from earlier in this tab: check it before showing anything.
    setConn("connecting");
    api("GET", "/admin/v1/overview", undefined, { timeout: 4000 }).then(unlock, (e) => {
      if (e.status === 0 || e.status >= 500) {
        $("#main").hidden = false;
        $("#signout").hidden = false;
        markDown(e);
        schedule(POLL_MS);
      } else {
        showLogin(refusal(e));
      }
    });
  } else {
    showLogin("");
  }
})();

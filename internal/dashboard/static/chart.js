// Line charts on a canvas for the flashsale dashboard: no library, sized
// for the device's pixel ratio, styled from the page's CSS variables.

// niceScale covers v with at most five grid steps of 1, 2, 2.5 or 5
// times a power of ten.
export function niceScale(v) {
  if (!(v > 0)) return { max: 1, step: 0.25 };
  const p = Math.pow(10, Math.floor(Math.log10(v / 5)));
  for (const m of [1, 2, 2.5, 5, 10, 20]) {
    const step = m * p;
    if (Math.ceil(v / step) <= 5) return { max: Math.ceil(v / step) * step, step };
  }
  return { max: v, step: v / 4 };
}

// drawChart draws series ({name, color, points: [[t ms, value]], fill,
// dash, width}) on canvas over the span seconds that end at tEnd, with a
// grid; empty is written instead when there is nothing to draw yet.
export function drawChart(canvas, series, { tEnd, span, empty }) {
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const css = getComputedStyle(document.documentElement);
  const muted = css.getPropertyValue("--muted").trim() || "#8b98a8";
  const grid = css.getPropertyValue("--border").trim() || "#2a3441";
  ctx.font = "11px system-ui, sans-serif";

  const points = series.flatMap((s) => s.points);
  // What is drawn, for tests and the curious: points and the oldest one's time.
  canvas.dataset.points = String(points.length);
  canvas.dataset.from = points.length ? String(Math.min(...points.map((p) => p[0]))) : "";
  if (!tEnd || points.length < 2) {
    ctx.fillStyle = muted;
    ctx.textAlign = "center";
    ctx.fillText(empty || "collecting data…", w / 2, h / 2);
    return;
  }
  const tStart = tEnd - span * 1000;
  const scale = niceScale(Math.max(...points.map((p) => p[1])) * 1.05);
  const maxY = scale.max;
  const padL = 44, padR = 10, padT = 8, padB = 20;
  const x = (t) => padL + (w - padL - padR) * (t - tStart) / (tEnd - tStart);
  const y = (v) => padT + (h - padT - padB) * (1 - v / maxY);

  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let v = 0; v <= maxY + scale.step / 2; v += scale.step) {
    ctx.strokeStyle = grid;
    ctx.beginPath();
    ctx.moveTo(padL, Math.round(y(v)) + 0.5);
    ctx.lineTo(w - padR, Math.round(y(v)) + 0.5);
    ctx.stroke();
    ctx.fillStyle = muted;
    ctx.fillText(v >= 1000 ? (v / 1000).toFixed(v % 1000 ? 1 : 0) + "k" : String(+v.toFixed(2)), padL - 6, y(v));
  }
  ctx.textBaseline = "alphabetic";
  ctx.textAlign = "center";
  const step = span <= 60 ? 15 : span <= 180 ? 30 : 120;
  for (let sec = span; sec >= 0; sec -= step) {
    const label = sec === 0 ? "now" : sec % 60 === 0 ? `-${sec / 60}m` : `-${sec}s`;
    ctx.fillStyle = muted;
    ctx.textAlign = sec === 0 ? "right" : sec === span ? "left" : "center";
    ctx.fillText(label, sec === span ? padL : sec === 0 ? w - padR : x(tEnd - sec * 1000), h - 5);
  }

  ctx.save();
  ctx.beginPath();
  ctx.rect(padL, 0, w - padL - padR, h);
  ctx.clip();
  for (const s of series) {
    const pts = s.points.filter((p) => p[0] >= tStart - 2000);
    if (!pts.length) continue;
    const path = new Path2D();
    let prevT = null, first = null;
    for (const [t, v] of pts) {
      // A gap (the server was down) breaks the line.
      if (prevT === null || t - prevT > 3500) path.moveTo(x(t), y(v));
      else path.lineTo(x(t), y(v));
      if (first === null) first = t;
      prevT = t;
    }
    if (s.fill && pts.length > 1) {
      const area = new Path2D(path);
      area.lineTo(x(prevT), y(0));
      area.lineTo(x(first), y(0));
      area.closePath();
      const g = ctx.createLinearGradient(0, padT, 0, h - padB);
      g.addColorStop(0, s.color + "55");
      g.addColorStop(1, s.color + "05");
      ctx.fillStyle = g;
      ctx.fill(area);
    }
    ctx.strokeStyle = s.color;
    ctx.lineWidth = s.width || 2;
    ctx.lineJoin = "round";
    ctx.setLineDash(s.dash || []);
    ctx.stroke(path);
    ctx.setLineDash([]);
  }
  ctx.restore();
}

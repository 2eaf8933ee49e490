// Osprey operations page. Lives on one Server-Sent Events feed (GET /ui/events, read with
// fetch so that the admin token travels in the Authorization header, never in a URL);
// every action calls the ordinary admin route behind a confirm(). No external fetch.
"use strict";

const TOKEN_KEY = "osprey.admin_token";
const HISTORY_MS = 15 * 60 * 1000;
const MAX_BUFFER = 8 * 1024 * 1024; // one snapshot is far smaller: a runaway feed is cut
const SVG = "http://www.w3.org/2000/svg";

const page = {
  loadedAt: Date.now(), // a reload changes it: tests check the page lived through a switch
  snapshots: 0,
  last: null,
  history: [], // {t, rps, eps, p50, p99}
  abort: null,
  retry: null,
};
window.__osprey = page;

const $ = (id) => document.getElementById(id);
const esc = (v) =>
  String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const fmt = (n, digits = 1) => (n == null || !isFinite(n) ? "–" : Number(n).toFixed(digits));
const ms = (n) => (n == null ? "–" : n >= 1000 ? fmt(n / 1000, 1) + " s" : n === 0 ? "0 ms" : fmt(n, n < 10 ? 2 : 0) + " ms");
const ago = (unixMs) => (unixMs ? new Date(unixMs).toLocaleTimeString() : "–");
const short = (s, n) => (s && s.length > n ? s.slice(0, n - 1) + "…" : s || "");

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

// ---- login ---------------------------------------------------------------------------

function showLogin(message) {
  stopFeed();
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("about").textContent = "";
  setFeed(false, "offline");
}

function showApp() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("token").value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    $("token").value = "";
    startFeed();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    clearData();
    showLogin("");
  });
  document.addEventListener("click", onAction);
  if (token()) startFeed();
  else showLogin("");
});

function clearData() {
  page.last = null;
  page.history = [];
  for (const id of ["clusters", "traffic-now", "chart-rate", "chart-latency", "traffic-errors", "traffic-groups", "groups", "blocked", "top", "throttle", "slowlog", "timeline"]) {
    $(id).replaceChildren();
  }
}

// ---- the feed ------------------------------------------------------------------------

function setFeed(on, text) {
  const f = $("feed");
  f.className = "feed " + (on ? "on" : "off");
  f.textContent = text;
}

function stopFeed() {
  if (page.abort) page.abort.abort();
  page.abort = null;
  clearTimeout(page.retry);
}

function later() {
  clearTimeout(page.retry);
  page.retry = setTimeout(() => token() && startFeed(), 2000);
}

async function startFeed() {
  stopFeed();
  const t = token();
  if (!t) return showLogin("");
  const abort = new AbortController();
  page.abort = abort;
  setFeed(false, "connecting");
  let resp;
  try {
    resp = await fetch("/ui/events", { headers: { Authorization: "Bearer " + t }, cache: "no-store", signal: abort.signal });
  } catch (e) {
    if (!abort.signal.aborted) { setFeed(false, "offline, retrying"); later(); }
    return;
  }
  if (resp.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    clearData();
    return showLogin("The dispatcher refused this token.");
  }
  if (!resp.ok || !resp.body) {
    setFeed(false, "HTTP " + resp.status + ", retrying");
    return later();
  }
  showApp();
  setFeed(true, "live");
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      if (buf.length > MAX_BUFFER) throw new Error("feed event too large");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (data) onSnapshot(JSON.parse(data));
      }
    }
  } catch (e) {
    if (abort.signal.aborted) return;
  }
  if (!abort.signal.aborted) { setFeed(false, "feed ended, reconnecting"); later(); }
}

function onSnapshot(s) {
  page.snapshots += 1;
  page.last = s;
  const tr = s.traffic || {};
  if (tr.rps != null) {
    page.history.push({ t: s.at_ms, rps: tr.rps, eps: tr.eps, p50: tr.p50_ms, p99: tr.p99_ms });
    const oldest = s.at_ms - HISTORY_MS;
    while (page.history.length && page.history[0].t < oldest) page.history.shift();
  }
  const st = s.status;
  $("about").textContent = `v${st.version} · pid ${st.pid} · up ${fmt(st.uptime_s / 60, 0)} min · ${st.clients.connections} client connections${st.draining ? " · DRAINING" : ""}`;
  for (const [name, f] of [["topology", renderTopology], ["traffic", renderTraffic], ["pool", renderPool], ["policy", renderPolicy], ["events", renderEvents]]) {
    try { f(s); } catch (e) { console.error(name, e); }
  }
}

// ---- topology ------------------------------------------------------------------------

const COLORS = { primary: "#1f7a4d", replica: "#2d62c8", down: "#c62f2f", fenced: "#6b4fa0", maintenance: "#b7791f", late: "#d9631e", unknown: "#8a93a3" };

/// What the node of a member shows: one of COLORS' keys, most urgent first.
function memberState(m, health, delay, threshold) {
  if (health && health.state === "down") return "down";
  if (m.role === "fenced") return "fenced";
  if (m.maintenance) return "maintenance";
  // Late: over the threshold, or its probe failing so that it left the read pool (a
  // probe still starting, `init`, says nothing yet).
  if (m.role === "replica" && delay && ((delay.delay_ms != null && delay.delay_ms > threshold) || (!delay.eligible && (delay.status === "error" || delay.status === "timeout")))) return "late";
  if (m.role === "primary" || m.role === "replica") return m.role;
  return "unknown";
}

function el(name, attrs, text) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

function renderTopology(s) {
  const root = $("clusters");
  root.replaceChildren();
  for (const c of s.clusters) {
    const delayView = (s.delay || []).find((d) => d.cluster === c.name && d.enabled) || null;
    const delays = new Map((delayView ? delayView.replicas : []).map((r) => [r.name, r]));
    const threshold = delayView ? delayView.threshold_ms : Infinity;
    const health = new Map((c.health || []).map((h) => [h.member, h]));
    const members = c.members.map((m) => ({ ...m, health: health.get(m.name), delay: delays.get(m.name) }));
    for (const m of members) m.shown = memberState(m, m.health, m.delay, threshold);

    const box = document.createElement("div");
    box.className = "cluster";
    box.dataset.cluster = c.name;
    box.dataset.primary = c.primary || "";
    const ok = c.status.status === "ok";
    const topo = { replication: "GTID replication", galera: "Galera (every Synced node can write)", group_replication: "Group Replication (the group elects)" }[c.topology] || c.topology;
    box.innerHTML =
      `<div class="cluster-head"><strong>${esc(c.name)}</strong><span class="muted">${esc(topo)}</span>` +
      `<span class="${ok ? "status-ok" : "status-bad"}" data-status="${esc(c.status.status)}">${esc(c.status.status)}${c.status.detail ? ": " + esc(c.status.detail) : ""}</span>` +
      `<span>primary: <b>${esc(c.primary || "none")}</b></span><span class="muted">epoch ${esc(c.epoch)}</span>` +
      (c.semi_sync ? `<span class="muted">semi-sync ${esc(c.semi_sync)}</span>` : "") +
      `<span class="muted">failover lock: ${c.lock_held ? "held by this dispatcher" : esc(c.lock_detail || "not held")}</span></div>`;
    box.append(drawCluster(c, members, delayView));
    const legend = document.createElement("div");
    legend.className = "legend";
    legend.innerHTML = Object.entries(COLORS).map(([k, v]) => `<span><i style="background:${v}"></i>${k}</span>`).join("");
    box.append(legend);
    for (const m of members) box.append(memberActions(c, m));
    root.append(box);
  }
}

function drawCluster(c, members, delayView) {
  const W = 200, H = 92, GAP = 24;
  const replication = c.topology === "replication";
  const top = replication ? members.filter((m) => m.role === "primary") : [];
  const bottom = replication ? members.filter((m) => m.role !== "primary") : members;
  const cols = Math.max(top.length, bottom.length, 1);
  const width = cols * (W + GAP) + GAP;
  const rows = top.length ? 2 : 1;
  const height = rows * (H + 50) + 10 + (replication ? 0 : 24);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": `cluster ${c.name}` });
  const defs = el("defs");
  const marker = el("marker", { id: `arrow-${c.name}`, viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "8", markerHeight: "8", orient: "auto-start-reverse" });
  marker.append(el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#5d6678" }));
  defs.append(marker);
  svg.append(defs);
  const pos = new Map();
  const place = (row, list, y) => {
    const offset = (width - list.length * (W + GAP) + GAP) / 2;
    list.forEach((m, i) => pos.set(m.name, { x: offset + i * (W + GAP), y }));
  };
  let y0 = 10;
  if (!replication) {
    const label = c.topology === "galera" ? "Galera cluster: one writer chosen, all Synced nodes equal" : "Group Replication group: the group elects its PRIMARY";
    svg.append(el("rect", { x: 4, y: 4, width: width - 8, height: height - 8, rx: 14, fill: "none", stroke: "#8a93a3", "stroke-dasharray": "6 4" }));
    svg.append(el("text", { x: 16, y: 22, "font-size": 13, fill: "#5d6678" }, label));
    y0 = 34;
  }
  if (top.length) { place(0, top, y0); place(1, bottom, y0 + H + 50); } else place(0, bottom, y0);
  // Replication arrows: from the member it replicates from (or the primary) to it.
  if (replication) {
    const primary = top[0];
    for (const m of bottom) {
      const from = pos.get(m.replicates_from) || (primary && m.role === "replica" ? pos.get(primary.name) : null);
      const to = pos.get(m.name);
      if (!from || !to) continue;
      const broken = m.io_running === false || m.sql_running === false;
      svg.append(el("line", { x1: from.x + W / 2, y1: from.y + H, x2: to.x + W / 2, y2: to.y - 2, stroke: broken ? COLORS.late : "#5d6678", "stroke-width": 2, "stroke-dasharray": broken ? "5 4" : "", "marker-end": `url(#arrow-${c.name})`, class: "replication", "data-from": m.replicates_from || "", "data-to": m.name }));
    }
  } else {
    for (let i = 1; i < members.length; i++) {
      const a = pos.get(members[i - 1].name), b = pos.get(members[i].name);
      svg.append(el("line", { x1: a.x + W, y1: a.y + H / 2, x2: b.x, y2: b.y + H / 2, stroke: "#8a93a3", "stroke-width": 2 }));
    }
  }
  for (const m of members) {
    const p = pos.get(m.name);
    const g = el("g", { class: "member", "data-member": m.name, "data-role": m.role, "data-state": m.shown, "data-health": m.health ? m.health.state : "unknown", transform: `translate(${p.x},${p.y})` });
    const color = COLORS[m.shown];
    g.append(el("rect", { width: W, height: H, rx: 10, fill: "#fff", stroke: color, "stroke-width": 3 }));
    g.append(el("rect", { width: W, height: 24, rx: 10, fill: color }));
    g.append(el("text", { x: 10, y: 17, fill: "#fff", "font-size": 14, "font-weight": 600 }, short(m.name, 16)));
    g.append(el("text", { x: W - 10, y: 17, fill: "#fff", "font-size": 12, "text-anchor": "end" }, m.shown === m.role ? m.role : `${m.shown} (${m.role})`));
    const lines = [];
    lines.push(short(m.addr, 26));
    if (m.role === "replica" && m.delay) {
      lines.push({ text: `delay ${m.delay.delay_ms == null ? "unknown" : ms(m.delay.delay_ms)} · ${m.delay.status}`, cls: "delay", ms: m.delay.delay_ms });
    } else if (m.role === "primary") {
      lines.push(c.topology === "replication" ? "writes" : `writes${m.state ? " · " + m.state : ""}`);
    } else if (m.state || m.reason) {
      lines.push(short(m.state || m.reason, 28));
    } else lines.push(m.health ? `health ${m.health.state}` : "");
    const gtid = m.role === "primary" ? m.gtid_binlog : m.gtid_applied || (m.delay && m.delay.gtid_applied);
    lines.push(gtid ? "gtid " + short(gtid, 22) : m.local_index != null ? `index ${m.local_index}` : "");
    lines.forEach((l, i) => {
      const text = typeof l === "string" ? l : l.text;
      const attrs = { x: 10, y: 42 + i * 16, "font-size": 12, fill: "#1d2330" };
      if (typeof l !== "string") { attrs.class = l.cls; attrs["data-delay-ms"] = l.ms == null ? "" : String(l.ms); }
      g.append(el("text", attrs, text));
    });
    const title = el("title", {}, `${m.name} ${m.addr}\nrole ${m.role}${m.reason ? " (" + m.reason + ")" : ""}\nhealth ${m.health ? m.health.state : "?"}\nreceived ${m.gtid_received || "–"}\napplied ${m.gtid_applied || "–"}\nbinlog ${m.gtid_binlog || "–"}`);
    g.append(title);
    svg.append(g);
  }
  return svg;
}

function memberActions(c, m) {
  const row = document.createElement("div");
  row.className = "member-actions";
  row.dataset.member = m.name;
  let html = `<span>${esc(m.name)}</span>`;
  html += `<button type="button" data-action="maintenance" data-cluster="${esc(c.name)}" data-member="${esc(m.name)}" data-on="${m.maintenance ? "false" : "true"}">Maintenance ${m.maintenance ? "off" : "on"}</button>`;
  if (c.topology === "replication" && m.role === "replica") {
    html += `<button type="button" data-action="switchover" data-cluster="${esc(c.name)}" data-member="${esc(m.name)}">Switch over to ${esc(m.name)}</button>`;
  }
  row.innerHTML = html;
  return row;
}

// ---- traffic -------------------------------------------------------------------------

function renderTraffic(s) {
  const t = s.traffic || {};
  $("traffic-now").innerHTML =
    `<span><b data-figure="rps">${fmt(t.rps)}</b> req/s</span><span><b data-figure="eps">${fmt(t.eps)}</b> errors/s</span>` +
    `<span>p50 <b>${ms(t.p50_ms)}</b></span><span>p99 <b>${ms(t.p99_ms)}</b></span>` +
    `<span class="muted">${esc(t.requests)} requests, ${esc(t.failed)} failed since start</span>`;
  const h = page.history;
  const now = s.at_ms;
  $("chart-rate").replaceChildren(chart(h, now, [["rps", "req/s", COLORS.replica], ["eps", "errors/s", COLORS.down]], (v) => fmt(v, v < 10 ? 1 : 0)));
  $("chart-latency").replaceChildren(chart(h, now, [["p50", "p50", COLORS.primary], ["p99", "p99", COLORS.late]], ms));
  const errs = Object.entries(t.errors || {});
  $("traffic-errors").innerHTML = errs.length ? "errors by outcome: " + errs.map(([k, v]) => `<span>${esc(k)} ${fmt(v)}/s</span>`).join(", ") : "";
  // Where requests went: by member and role, over the last snapshot's interval.
  const groups = (t.groups || []).filter((g) => g.requests > 0);
  $("traffic-groups").innerHTML = groups.length
    ? `<table><thead><tr><th>member</th><th>role</th><th>req/s</th><th>errors/s</th><th>p50</th><th>p99</th><th>requests</th></tr></thead><tbody>` +
      groups.map((g) => `<tr data-traffic="${esc(g.cluster + "/" + g.role + "/" + g.member)}"><td>${esc(g.cluster)} <b>${esc(g.member || "–")}</b></td><td>${esc(g.role)}</td>` +
        `<td data-figure="rps">${fmt(g.rps)}</td><td>${fmt(g.eps)}</td><td>${ms(g.p50_ms)}</td><td>${ms(g.p99_ms)}</td><td>${esc(g.requests)}</td></tr>`).join("") +
      `</tbody></table>`
    : "";
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function chart(points, now, series, label) {
  const W = 480, H = 130, L = 52, R = 8, T = 18, B = 18;
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  let max = 0;
  for (const p of points) for (const [k] of series) if (p[k] != null) max = Math.max(max, p[k]);
  max = niceMax(max);
  const x = (t) => L + ((t - (now - HISTORY_MS)) / HISTORY_MS) * (W - L - R);
  const y = (v) => T + (1 - v / max) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    svg.append(el("line", { x1: L, x2: W - R, y1: y(max * f), y2: y(max * f), stroke: "#e3e6ec" }));
    svg.append(el("text", { x: L - 4, y: y(max * f) + 4, "font-size": 10, "text-anchor": "end", fill: "#5d6678" }, label(max * f)));
  }
  for (const [label, at] of [["-15 min", now - HISTORY_MS], ["-10", now - 600000], ["-5", now - 300000], ["now", now]]) {
    svg.append(el("text", { x: x(at), y: H - 4, "font-size": 10, "text-anchor": at === now ? "end" : at === now - HISTORY_MS ? "start" : "middle", fill: "#5d6678" }, label));
  }
  series.forEach(([k, label, color], i) => {
    const pts = points.filter((p) => p[k] != null).map((p) => `${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`);
    if (pts.length) svg.append(el("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.5, "data-series": k }));
    svg.append(el("rect", { x: L + 4 + i * 90, y: 4, width: 10, height: 10, fill: color }));
    svg.append(el("text", { x: L + 18 + i * 90, y: 13, "font-size": 11, fill: "#1d2330" }, label));
  });
  return svg;
}

// ---- pool ----------------------------------------------------------------------------

function renderPool(s) {
  // Requests written to each group's workers ahead of the one they run (pipelining);
  // slot ids are the group's index times 65536 plus the slot.
  const pipelined = new Map();
  for (const sl of s.status.slots || []) {
    const gi = Math.floor(sl.slot / 65536);
    pipelined.set(gi, (pipelined.get(gi) || 0) + (sl.pipeline || 0));
  }
  const reads = new Map();
  for (const c of s.clusters) for (const r of c.read_pools || []) reads.set(c.name + "/" + r.member, r);
  const rows = s.status.groups.map((g, gi) => {
    const key = `${g.role}:${g.member || ""}`;
    const read = g.role === "read" ? reads.get(g.cluster + "/" + g.member) : null;
    const serving = g.role === "read" ? !!(read && read.serving) : !g.unavailable;
    const why = g.role === "read" ? (read && read.reason) || g.hold || "" : g.unavailable || g.hold || "";
    const cells = [];
    for (const [n, cls] of [[g.idle, "idle"], [g.busy, "busy"], [g.starting, "starting"], [g.quitting, "quitting"]]) for (let i = 0; i < n && cells.length < 128; i++) cells.push(`<i class="${cls}${cls === "busy" && i < g.sessions ? " pinned" : ""}"></i>`);
    return `<tr data-group="${esc(key)}" data-cluster="${esc(g.cluster)}" data-serving="${serving}" data-slots="${g.slots}" data-idle="${g.idle}" class="${serving ? "" : "off"}">` +
      `<td>${esc(g.cluster)} ${esc(g.role)}<br><b>${esc(g.member || "–")}</b></td>` +
      `<td class="why">${serving ? "serving" : "<b>not serving</b>"}${why ? "<br><span class='muted'>" + esc(short(why, 60)) + "</span>" : ""}</td>` +
      `<td><div class="slots">${cells.join("")}</div>${g.slots}/${g.size}</td>` +
      `<td>${g.idle}</td><td>${g.busy}</td><td>${g.starting}</td><td>${g.quitting}</td><td>${g.sessions}/${g.max_sessions}</td><td data-figure="pipelined">${pipelined.get(gi) || 0}</td>` +
      `<td>${g.queue_depth}/${g.queue_capacity}</td><td>${fmt(g.queue_bytes / 1024, 0)}/${fmt(g.queue_bytes_capacity / 1048576, 0)} MiB</td>` +
      `<td>${g.longest_wait_ms ? ms(g.longest_wait_ms) : "–"}</td><td>${g.respawns}</td><td>${g.recycles}</td></tr>`;
  });
  $("groups").innerHTML =
    `<table><thead><tr><th>group</th><th>state</th><th>slots</th><th>idle</th><th>busy</th><th>start</th><th>quit</th><th>pinned</th><th title="requests written to the workers behind the one they run">pipelined</th><th>queue</th><th>queue KiB</th><th>longest wait</th><th>respawns</th><th>recycles</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

// ---- policy --------------------------------------------------------------------------

function renderPolicy(s) {
  const d = s.digests || {};
  const blocked = d.blocked || [];
  $("blocked").innerHTML = blocked.length
    ? `<table><thead><tr><th>digest</th><th>statement</th><th>why</th><th>refused</th><th>expires</th><th></th></tr></thead><tbody>` +
      blocked.map((b) => `<tr data-digest="${esc(b.id)}"><td>${esc(b.id)}</td><td class="text">${esc(short(b.text, 160))}</td><td>${b.reason.by === "slow" ? `${esc(b.reason.count)} slow in ${esc(b.reason.window_s)} s` : "operator"}</td><td>${esc(b.rejected)}</td><td>${b.remaining_s == null ? "never" : esc(b.remaining_s) + " s"}</td>` +
        `<td><button type="button" class="unblock" data-action="unblock" data-digest="${esc(b.id)}">Unblock</button></td></tr>`).join("") + `</tbody></table>`
    : `<p class="muted" id="no-blocked">No digest is blocked${d.enabled === false ? " (interception off)" : ""}.</p>`;
  const top = d.by_time || [];
  $("top").innerHTML = top.length
    ? `<table><thead><tr><th>statement</th><th>count</th><th>total</th><th>max</th><th>slow</th><th>state</th></tr></thead><tbody>` +
      top.map((r) => `<tr data-top="${esc(r.id)}"><td class="text" title="${esc(r.id)}">${esc(short(r.text, 120))}</td><td>${esc(r.count)}</td><td>${ms(r.total_ms)}</td><td>${ms(r.max_ms)}</td><td>${esc(r.slow)}</td><td>${esc(r.state)}</td></tr>`).join("") + `</tbody></table>`
    : `<p class="muted">No statement counted yet.</p>`;
  const th = (s.throttle && s.throttle.members) || [];
  $("throttle").innerHTML = th.length
    ? `<table><thead><tr><th>member</th><th>rate</th><th>tokens</th><th>waiting</th><th>accepted</th><th>rejected</th></tr></thead><tbody>` +
      th.map((t) => `<tr><td>${esc(t.member)}</td><td>${fmt(t.max_qps, 0)}/s (burst ${fmt(t.burst, 0)})</td><td>${fmt(t.tokens)}</td><td>${esc(t.waiting)}</td><td>${esc(t.accepted)}</td><td>${esc(t.rejected_full + t.rejected_timeout)}</td></tr>`).join("") + `</tbody></table>`
    : `<p class="muted">No member is throttled.</p>`;
  const sl = s.slow_log;
  const latest = (sl && sl.latest) || [];
  $("slowlog").innerHTML = sl
    ? `<span>${esc(sl.written)} written to the slow-log table on the primary, ${esc(sl.queued)} queued, ${esc(sl.dropped_full + sl.dropped_failed)} dropped, ${esc(sl.write_errors)} write errors</span>` +
      (latest.length
        ? `<div class="scroll-x"><table><thead><tr><th>when</th><th>statement</th><th>time</th><th>rows</th><th>member</th></tr></thead><tbody>` +
          latest.map((e) => `<tr data-slow="${esc(e.digest)}"><td>${esc(new Date(e.at_ms).toLocaleTimeString())}</td><td class="text" title="${esc(e.digest)}">${esc(short(e.sample, 120))}</td><td>${ms(e.duration_ms)}</td><td>${esc(e.rows)}</td><td>${esc(e.member)}</td></tr>`).join("") +
          `</tbody></table></div>`
        : "")
    : `<span class="muted">Slow log off.</span>`;
}

// ---- events --------------------------------------------------------------------------

function renderEvents(s) {
  const list = (s.events || []).slice().reverse();
  $("timeline").innerHTML = list.length
    ? list.map((e) => {
        const total = Math.max(e.duration_ms, ...e.steps.map((st) => st.at_ms), 1);
        let prev = 0;
        const steps = e.steps.map((st) => {
          const left = (prev / total) * 100, width = Math.max(((st.at_ms - prev) / total) * 100, 0.5);
          const dur = st.at_ms - prev;
          prev = st.at_ms;
          return `<div class="step${st.ok ? "" : " bad"}" title="${esc(st.detail || "")}"><span class="name">${esc(st.step)}</span><span class="track"><span style="left:${left.toFixed(2)}%;width:${width.toFixed(2)}%"></span></span><span>${ms(dur)}</span></div>`;
        });
        return `<li class="event ${esc(e.kind)}${e.ok ? "" : " failed"}" data-kind="${esc(e.kind)}" data-cluster="${esc(e.cluster)}" data-old="${esc(e.old_primary || "")}" data-new="${esc(e.new_primary || "")}" data-ok="${e.ok}">` +
          `<b>${esc(e.kind)}</b> ${esc(e.cluster)}: ${esc(e.old_primary || "–")} → <b>${esc(e.new_primary || "–")}</b> ${e.ok ? "" : "<span class='error'>failed</span>"}` +
          `<br><span class="muted">${ago(e.started)} · ${ms(e.duration_ms)}${e.detail ? " · " + esc(e.detail) : ""}</span><div class="steps">${steps.join("")}</div></li>`;
      }).join("")
    : `<li class="muted">No switch yet.</li>`;
}

// ---- actions -------------------------------------------------------------------------

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: "no-store" });
    const text = await r.text();
    if (r.status === 401) { sessionStorage.removeItem(TOKEN_KEY); clearData(); showLogin("The dispatcher refused this token."); }
    return { ok: r.ok, status: r.status, text };
  } catch (e) {
    return { ok: false, status: 0, text: String(e) };
  }
}

function notice(text) {
  $("notice").textContent = text;
}

async function onAction(e) {
  const b = e.target.closest("button[data-action]");
  if (!b) return;
  const d = b.dataset;
  let ask, call;
  switch (d.action) {
    case "unblock":
      ask = `Unblock digest ${d.digest}? Its statements run again.`;
      call = () => api("POST", `/digests/${encodeURIComponent(d.digest)}/unblock`);
      break;
    case "maintenance":
      ask = `${d.on === "true" ? "Put" : "Take"} ${d.member} ${d.on === "true" ? "in" : "out of"} maintenance (cluster ${d.cluster})?`;
      call = () => api("POST", "/cluster/maintenance", { cluster: d.cluster, member: d.member, on: d.on === "true" });
      break;
    case "switchover":
      ask = `Switch cluster ${d.cluster}'s primary over to ${d.member}? Writes wait during the switch.`;
      call = () => api("POST", "/cluster/switchover", { cluster: d.cluster, to: d.member });
      break;
    default:
      return;
  }
  if (!window.confirm(ask)) return;
  b.disabled = true;
  notice(`${d.action}: sent…`);
  const r = await call();
  notice(`${d.action}: ${r.ok ? "done" : "refused (HTTP " + r.status + ")"} ${short(r.text.trim(), 300)}`);
  b.disabled = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("resize").addEventListener("click", async () => {
    const current = page.last ? page.last.status.pool.size : "";
    const v = window.prompt("New number of write slots (every cluster's write slots):", String(current));
    if (v == null) return;
    const size = Number.parseInt(v, 10);
    if (!(size >= 1)) return notice("resize: not a number of slots");
    if (!window.confirm(`Resize the write slots to ${size}?`)) return;
    const r = await api("POST", "/pool/size", { size });
    notice(`resize: ${r.ok ? "done" : "refused (HTTP " + r.status + ")"} ${short(r.text.trim(), 300)}`);
  });
});

// The lakeshore dashboard. Everything shown comes from the store and may be anyone's
// text: it is put on the page as text nodes (el() below), never as markup.
"use strict";

let session = null;
let timer = null;
let route = "";

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

const svgNS = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, seconds);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

function when(t) {
  if (t === null || t === undefined || t === 0) return "-";
  const d = new Date(t * 1000);  // a record may hold any finite number: not every one is a date
  return Number.isFinite(d.getTime()) ? d.toISOString().replace("T", " ").slice(0, 19) + " UTC" : String(t);
}

function q(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") u.set(k, v);
  return u.toString();
}

async function api(path, params) {
  const r = await fetch(`/api/${path}?${q(params || {})}`, {
    credentials: "same-origin",
    headers: { "X-Lakeshore-UI": "1" },
  });
  const data = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
}

function notice(text, kind) {
  const n = document.getElementById("notice");
  n.hidden = !text;
  n.className = kind || "";
  n.textContent = text || "";
}

let shown = "";  // what the page shows now: a page whose data did not change is not redrawn
// `route`: the page the data was read for; an answer that comes back after the reader moved
// to another page is dropped
function current(route) {
  return route === (location.hash || "#/");
}
function replace(node, signature, route) {
  if (!current(route)) return;
  if (signature !== undefined && signature === shown) return;
  shown = signature === undefined ? "" : signature;
  document.getElementById("main").replaceChildren(node);
}

function stateBadge(state) {
  return el("span", { class: `state s-${String(state).replace(/[^a-z]/g, "")}` }, state);
}

// -- overview ----------------------------------------------------------------------------

function chart(series) {
  const w = 320, h = 70, pad = 2;
  const box = svg("svg", { width: w, height: h + 14, viewBox: `0 0 ${w} ${h + 14}`, class: "chart", role: "img" });
  if (!series || series.length < 1) return box;
  const depth = series.map((p) => Number(p[1]) || 0);
  const left = series.map((p) => Number(p[4]) || 0);
  const top = Math.max(1, ...depth, ...left);
  const step = (w - 2 * pad) / Math.max(1, series.length - 1);
  left.forEach((v, i) => {
    if (!v) return;
    const bh = (v / top) * h;
    box.append(svg("rect", { x: pad + i * step - 1, y: h - bh, width: 2, height: bh, class: "done" }));
  });
  const pts = depth.map((v, i) => `${(pad + i * step).toFixed(1)},${(h - (v / top) * h).toFixed(1)}`);
  box.append(svg("polyline", { points: pts.join(" "), class: "depth" }));
  const label = svg("text", { x: 0, y: h + 12, class: "axis" });
  const span = series.length > 1 ? series[series.length - 1][0] - series[0][0] : 0;
  label.textContent = `last ${ago(span)} · max ${top} · line: live · bars: finished per round`;
  box.append(label);
  return box;
}

function admission(cfg) {
  // the queue record's settings that are set (the provider has a column of its own)
  if (!cfg) return "-";
  const parts = [];
  for (const [k, v] of Object.entries(cfg)) {
    if (k === "provider" || v === null || v === undefined) continue;
    if (k === "on_full" && cfg.max_depth === null) continue;  // means nothing without a depth
    parts.push(`${k}=${v}`);
  }
  return parts.join(", ") || "none";
}

function provider(cfg) {
  const p = cfg && cfg.provider;
  if (!p) return "-";
  return Object.entries(p).map(([k, v]) => `${k}=${v}`).join(", ");
}

async function showOverview(route) {
  const data = await api("overview");
  const sig = JSON.stringify(["overview", data.rounds, data.at]);
  if (sig === shown) return;
  const page = el("div", { id: "overview" });
  if (data.error) page.append(el("p", { class: "error" }, `the last round failed: ${data.error}`));
  if (data.at === null) page.append(el("p", { class: "muted" }, "reading the store…"));
  for (const space of data.namespaces || []) {
    page.append(el("h2", {}, "namespace ", el("code", {}, space.ns)));
    for (const problem of space.problems || []) page.append(el("p", { class: "error" }, problem));
    const rows = (space.queues || []).map((row) => row.error !== undefined
      ? el("tr", { "data-queue": row.queue },
        el("td", {}, row.queue), el("td", { colspan: 6, class: "error" }, `could not count: ${row.error}`))
      : el("tr", { "data-queue": row.queue },
        el("td", {}, el("a", { href: `#/q/${encodeURIComponent(space.ns)}/${encodeURIComponent(row.queue)}` }, row.queue)),
        el("td", { class: "num queued" }, (row.estimated ? "~" : "") + row.queued),
        el("td", { class: "num running" }, (row.estimated ? "~" : "") + row.running),
        el("td", { class: "num" }, (row.estimated && row.oldest_queued_s !== null ? "~" : "") + ago(row.oldest_queued_s)),
        el("td", {}, chart(row.series)),
        el("td", { class: "small" }, row.config_error ? `unreadable: ${row.config_error}` : admission(row.config)),
        el("td", { class: "small" }, provider(row.config))));
    page.append(el("table", { class: "queues" },
      el("thead", {}, el("tr", {}, ["queue", "queued", "running", "oldest queued", "live and finished", "settings", "provider"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
    const workers = space.workers || [];
    const alive = workers.filter((w) => w.status !== "stopped").length;
    page.append(el("h3", {}, `workers alive: ${alive}`, el("span", { class: "muted small" }, ` (${workers.length} seen in the last 5 minutes)`)));
    if (workers.length) {
      page.append(el("table", { class: "workers" },
        el("thead", {}, el("tr", {}, ["worker", "host", "status", "running", "done", "queues", "seen"].map((h) => el("th", {}, h)))),
        el("tbody", {}, workers.map((w) => el("tr", {},
          el("td", {}, w.worker || "?"), el("td", {}, w.host || ""), el("td", {}, w.status || ""),
          el("td", { class: "num" }, w.running ?? ""), el("td", { class: "num" }, w.done ?? ""),
          el("td", {}, (w.queues || []).join(", ")), el("td", {}, `${ago(w.age_s)} ago`))))));
    }
  }
  replace(page, sig, route);
  footer(`overview refreshed by the server every ${data.interval_s} s (round ${data.rounds}, store time ${when(data.at)})`);
}

// -- a queue -----------------------------------------------------------------------------

async function showQueue(ns, queue, params, route) {
  const data = await api("queue", { ns, queue, state: params.get("state"), fn: params.get("fn"), before: params.get("before") });
  const base = `#/q/${encodeURIComponent(ns)}/${encodeURIComponent(queue)}`;
  const stateSel = el("select", { name: "state" },
    ["", "queued", "running", "succeeded", "failed", "killed", "timeout"].map((s) =>
      el("option", { value: s, selected: s === (params.get("state") || "") ? "selected" : null }, s || "any state")));
  const fnInput = el("input", { name: "fn", placeholder: "function (module:qualname)", value: params.get("fn") || "" });
  const form = el("form", { class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `${base}?${q({ state: stateSel.value, fn: fnInput.value })}`;
  } }, stateSel, fnInput, el("button", { type: "submit" }, "filter"));
  const rows = data.invocations.map((r) => el("tr", {},
    el("td", {}, el("a", { href: `#/i/${encodeURIComponent(ns)}/${encodeURIComponent(r.id)}` }, r.id)),
    el("td", {}, stateBadge(r.state), r.state === "queued" && r.not_before > data.at
      ? el("span", { class: "muted small scheduled" }, ` scheduled in ${ago(r.not_before - data.at)}`) : null),
    el("td", { class: "num" }, r.attempt),
    el("td", {}, `${ago(data.at - r.submitted_at)} ago`),
    el("td", {}, el("code", {}, r.fn))));
  const nav = el("p", {},
    params.get("before") ? el("a", { href: `${base}?${q({ state: params.get("state"), fn: params.get("fn") })}` }, "← newest") : null,
    " ",
    data.next_before ? el("a", { href: `${base}?${q({ state: params.get("state"), fn: params.get("fn"), before: data.next_before })}`, class: "older" }, "older →") : null);
  const listing = el("div", { id: "listing" },
    el("table", { class: "invocations" },
      el("thead", {}, el("tr", {}, ["id", "state", "attempt", "submitted", "function"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 5, class: "muted" }, "nothing here")))),
    nav);
  if (!current(route)) return;
  const page = document.getElementById("queue");
  if (page && page.dataset.route === location.hash) {
    document.getElementById("listing").replaceWith(listing);  // the filters keep what is typed
  } else {
    const fresh = el("div", { id: "queue" },
      el("h2", {}, "queue ", el("code", {}, queue), el("span", { class: "muted" }, ` in ${ns}`)),
      form, listing);
    fresh.dataset.route = location.hash;
    replace(fresh, undefined, route);
  }
  footer(`newest first · refreshed every ${session.interval_s} s${data.stale ? " · stale: the read budget is spent" : ""}`);
}

// -- an invocation -----------------------------------------------------------------------

const stream = { key: "", attempt: -1, after: -1, frames: [] };

function valueBlock(title, value, ns, id, what) {
  if (!value) return el("div", {}, el("h3", {}, title), el("p", { class: "muted" }, "none"));
  const link = el("a", { href: `/api/download?${q({ ns, id, what })}`, download: "" }, "download");
  return el("div", { class: "value" },
    el("h3", {}, title, " ", el("span", { class: "muted small" }, `${value.size} bytes${value.spilled ? ", spilled" : ""} · `), link),
    value.problem ? el("p", { class: "error" }, value.problem) : null,
    value.shown !== null && value.shown !== undefined ? el("pre", { class: `shown ${what}` }, value.shown) : el("p", { class: "muted" }, "too large to show: download it"));
}

async function act(action, ns, id) {
  if (!window.confirm(`${action} ${id}?`)) return;
  const r = await fetch(`/api/${action}`, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf, "X-Lakeshore-UI": "1" },
    body: JSON.stringify({ ns, id }),
  });
  const data = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  notice(r.ok ? `${action}: ${data.message}` : `${action} refused: ${data.error}`, r.ok ? "ok" : "error");
  shown = "";
  tick();
}

async function showInvocation(ns, id, params, route) {
  const key = `${ns}/${id}`;
  if (stream.key !== key) {
    stream.key = key;
    stream.attempt = -1;
    const start = Number.parseInt(params.get("after") || "-1", 10);
    stream.after = Number.isFinite(start) && start >= -1 ? start : -1;
    stream.frames = [];
  }
  const data = await api("invocation", { ns, id });
  const frames = await api("frames", { ns, id, after: stream.after });
  if (!current(route) || stream.key !== key) return;  // the reader moved on meanwhile
  if (frames.attempt !== stream.attempt) {
    if (stream.attempt !== -1) { stream.frames = []; stream.after = -1; }
    stream.attempt = frames.attempt;
  }
  for (const f of frames.frames) {
    if (f.seq > stream.after) { stream.frames.push(f); stream.after = f.seq; }
  }
  if (stream.frames.length > 1000) stream.frames.splice(0, stream.frames.length - 1000);
  const sig = JSON.stringify([key, data.record, data.error, data.logs, data.history, stream.after, stream.attempt, data.stale, frames.problem, data.logs_problem]);
  if (sig === shown) return;
  const r = data.record;
  const fields = Object.entries(r).map(([k, v]) => el("tr", {},
    el("th", {}, k),
    el("td", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : (k.endsWith("_at") && v ? when(v) : String(v)))));
  const history = (data.history || []).map((t) => el("tr", {},
    el("td", { class: "num" }, t[0]), el("td", {}, t[1]), el("td", {}, when(t[2])),
    el("td", {}, t[3] ? when(t[3]) : "running"), el("td", {}, t[3] ? `${(t[3] - t[2]).toFixed(2)} s` : "-"),
    el("td", {}, t[4] ? stateBadge(t[4]) : "")));
  const err = data.error;
  const actions = el("p", { class: "actions" },
    el("button", { id: "cancel", onclick: () => act("cancel", ns, id), title: session.actions ? "" : "actions are off" }, "cancel"),
    " ",
    el("button", { id: "retry", onclick: () => act("retry", ns, id), title: session.actions ? "" : "actions are off" }, "retry"),
    session.actions ? null : el("span", { class: "muted small" }, " read-only: start lakeshore ui with --allow-actions to use these"));
  replace(el("div", { id: "invocation" },
    el("h2", {}, "invocation ", el("code", {}, r.id), " ", stateBadge(r.state)),
    el("p", {}, el("a", { href: `#/q/${encodeURIComponent(ns)}/${encodeURIComponent(r.queue)}` }, `queue ${r.queue}`), " · ", el("code", {}, r.fn)),
    actions,
    r.state === "queued" && r.not_before > data.at
      ? el("p", { class: "scheduled" }, `scheduled: not before ${when(r.not_before)} (in ${ago(r.not_before - data.at)})`) : null,
    err ? el("div", { class: "failure" },
      el("h3", {}, "error ", el("code", { class: "etype" }, err.type || "")),
      el("pre", { class: "message" }, err.message || ""),
      err.traceback ? el("pre", { class: "traceback" }, err.traceback) : null) : null,
    el("h3", {}, "attempts"),
    el("table", { class: "history" },
      el("thead", {}, el("tr", {}, ["#", "worker", "started", "ended", "took", "outcome"].map((h) => el("th", {}, h)))),
      el("tbody", {}, history.length ? history : el("tr", {}, el("td", { colspan: 6, class: "muted" }, "not started")))),
    valueBlock("arguments", data.args, ns, id, "args"),
    valueBlock("result", data.result, ns, id, "result"),
    el("h3", {}, `stream (attempt ${stream.attempt}, ${stream.frames.length} frames)`),
    (() => {
      const last = stream.frames.slice(-500);
      return el("ol", { class: "frames", start: last.length ? last[0].seq : 0 },
        last.map((f) => el("li", { "data-seq": f.seq }, f.value)));
    })(),
    frames.problem ? el("p", { class: "error" }, frames.problem) : null,
    el("h3", {}, "logs"),
    el("pre", { class: "logs" }, (data.logs || []).map((l) => `--- attempt ${l.attempt} ---\n${l.text}`).join("\n") || "(no output)"),
    data.logs_problem ? el("p", { class: "error" }, data.logs_problem) : null,
    el("h3", {}, "record"),
    el("table", { class: "record" }, el("tbody", {}, fields))), sig, route);
  footer(`live: refreshed every ${session.live_s} s · store time ${when(data.at)}${data.stale ? " · stale: the read budget is spent" : ""}`);
}

// -- routing -----------------------------------------------------------------------------

function footer(text) {
  document.getElementById("footer").textContent = text;
}

async function tick() {
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "q" && parts.length === 3) await showQueue(parts[1], parts[2], params, hash);
    else if (parts[0] === "i" && parts.length === 3) await showInvocation(parts[1], parts[2], params, hash);
    else await showOverview(hash);
    if (document.getElementById("notice").className === "error-load") notice("");
  } catch (e) {
    notice(`could not refresh: ${e.message}`, "error-load");
  }
}

function schedule() {
  clearTimeout(timer);
  const hash = location.hash || "#/";
  const live = hash.startsWith("#/i/");
  const every = 1000 * (live ? session.live_s : session.interval_s);
  const mine = hash;
  tick().finally(() => {
    if (route === mine) timer = setTimeout(schedule, every);
  });
}

window.addEventListener("hashchange", () => {
  route = location.hash || "#/";
  notice("");
  schedule();
});

window.addEventListener("DOMContentLoaded", async () => {
  try {
    session = await api("session");
  } catch (e) {
    notice(`cannot reach the dashboard: ${e.message}`, "error");
    return;
  }
  document.getElementById("store").textContent = session.store;
  const mode = document.getElementById("mode");
  mode.textContent = session.actions ? "actions allowed" : "read-only";
  mode.className = session.actions ? "badge warn" : "badge";
  route = location.hash || "#/";
  schedule();
});

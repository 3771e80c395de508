// skilljobs queue dashboard. Plain DOM, no framework, no network beyond this origin.
// Everything that comes from the API is put on the page with textContent (via el() and
// svg()), never parsed as HTML: a skill that returns "<script>" shows that text, nothing
// more. Every page has an address (#/jobs?status=failed, #/jobs/<id>, #/schedules/<id>,
// #/chain-runs/<id>, …): back/forward and reload show the same thing again.
"use strict";

const TABS = ["overview", "jobs", "schedules", "deliveries", "incidents", "workers", "audit"];
const JOB_FILTERS = ["q", "status", "skill", "channel", "role", "since", "until"];
const FINISHED = ["succeeded", "failed", "timed_out", "cancelled"];
const state = {
  me: null,
  canChange: true,
  page: "overview",
  id: null,
  params: new URLSearchParams(),
  listKey: null, // the job filters the list shows (their address form)
  cursors: [null], // cursor of each page seen; the last is the current page
  nextCursor: null,
  detailId: null,
  detail: null,
  events: null,
  chartWindow: "1h",
  auditBefore: [null],
  auditNext: null,
  blobs: [],
  timers: {},
};

// --- DOM helpers ---------------------------------------------------------------------

function $(sel) { return document.querySelector(sel); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

function fillRows(container, rows, emptyText, cols) {
  clear(container);
  if (!rows.length) {
    container.append(container.tagName === "TBODY"
      ? el("tr", { class: "empty" }, el("td", { colspan: cols }, emptyText))
      : el("li", { class: "empty muted" }, emptyText));
    return;
  }
  for (const r of rows) container.append(r);
}

function pad2(n) { return String(n).padStart(2, "0"); }

// The browser's time zone as it names it ("UTC", "GMT+8", "CET"), shown with every time.
function zoneName(d) {
  try {
    const part = new Intl.DateTimeFormat("en", { timeZoneName: "short" }).formatToParts(d)
      .find((p) => p.type === "timeZoneName");
    return part ? part.value : "";
  } catch (_) { return ""; }
}

function fmtTime(ts) {
  if (!ts) return "–";
  const d = new Date(ts * 1000);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ` +
    `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())} ${zoneName(d)}`.trim();
}

function fmtClock(ts) {
  const d = new Date(ts * 1000);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 600000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  return fmtAge(ms / 1000);
}

function pct(x) { return `${(100 * (x || 0)).toFixed(1)} %`; }

function statusBadge(status) {
  return el("span", { class: `badge st-${String(status || "").replace(/[^a-z_]/g, "")}` },
    status || "–");
}

// What a running job does before its skill runs ("preparing environment"), next to its status.
function phaseNote(job) {
  return job.phase ? [" ", el("span", { class: "phase", title: job.phase_detail || "" }, job.phase)] : [];
}

function pretty(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function isoTime(value) {
  if (!value) return "–";
  const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(d.getTime()) ? String(value) : fmtTime(d.getTime() / 1000);
}

// A time as the schedule's own timezone reads it (the cron is written in that zone).
function zoned(value, timeZone) {
  try {
    return new Date(value).toLocaleString([], {
      timeZone, year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
      hour12: false, timeZoneName: "short",
    });
  } catch (_) { return timeZone; }
}

// A server's message is English: in another language the page says it itself.
function said(r, own) {
  return LANG === "en" && r && r.message ? r.message : own;
}

function flash(message, isError) {
  const node = $("#flash");
  node.textContent = message;
  node.className = isError ? "flash error" : "flash";
  node.hidden = false;
  clearTimeout(state.timers.flash);
  state.timers.flash = setTimeout(() => { node.hidden = true; }, 6000);
}

function report(err) {
  if (err instanceof Unauthorized) return;
  flash(err.message || String(err), true);
}

// A button that changes something: never made for a token that may not change anything
// (the API refuses such a token's actions with 403 anyway).
function action(label, onclick, attrs) {
  if (!state.canChange) return null;
  return el("button", Object.assign({ type: "button", class: "small action", onclick }, attrs || {}),
    label);
}

function jobLink(id, text) {
  return el("a", { href: `#/jobs/${encodeURIComponent(id)}`, class: "mono" }, text || String(id).slice(0, 8));
}

// --- addresses -------------------------------------------------------------------------

function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const cut = raw.indexOf("?");
  const path = cut < 0 ? raw : raw.slice(0, cut);
  const query = cut < 0 ? "" : raw.slice(cut + 1);
  const parts = path.split("/").filter(Boolean).map((p) => {
    try { return decodeURIComponent(p); } catch (e) { return p; }
  });
  return { page: parts[0] || "overview", id: parts[1] || null, params: new URLSearchParams(query) };
}

function address(page, id, params) {
  const q = params && String(params) ? `?${params}` : "";
  return `#/${page}${id ? `/${encodeURIComponent(id)}` : ""}${q}`;
}

function navigate(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash; // hashchange → route()
}

function route() {
  const { page, id, params } = parseHash();
  const known = TABS.includes(page) || page === "chain-runs";
  const previous = state.page;
  state.page = known ? page : "overview";
  if (previous && previous !== state.page) $("#flash").hidden = true; // a note about the page left
  state.id = id;
  state.params = params;
  const tab = state.page === "chain-runs" ? "schedules" : state.page;
  for (const b of document.querySelectorAll("#tabs button")) {
    const on = b.dataset.tab === tab;
    b.classList.toggle("active", on);
    if (on) b.setAttribute("aria-current", "page"); else b.removeAttribute("aria-current");
  }
  for (const s of document.querySelectorAll("main .tab")) s.hidden = s.id !== `tab-${state.page}`;
  document.title = `skilljobs — ${state.page}${id ? ` ${id}` : ""}`;
  refreshCurrent();
}

const LOADERS = {
  overview: () => loadOverview(),
  jobs: () => loadJobsPage(),
  schedules: () => loadSchedules(),
  "chain-runs": () => loadChainRun(state.id),
  deliveries: () => loadDeliveries(),
  incidents: () => loadIncidents(),
  workers: () => Promise.all([loadWorkers(), loadLimits()]),
  audit: () => loadAudit(),
};

function refreshCurrent() {
  const run = LOADERS[state.page];
  if (run) run().catch(report);
}

function fillForm(form, params, names) {
  for (const name of names) {
    if (form.elements[name]) form.elements[name].value = params.get(name) || "";
  }
}

function formParams(form, names) {
  const out = new URLSearchParams();
  for (const name of names) {
    const v = form.elements[name] ? form.elements[name].value.trim() : "";
    if (v) out.set(name, v);
  }
  return out;
}

// --- token and API -------------------------------------------------------------------

class Unauthorized extends Error {}

// The token is sent once, to POST /api/v1/session, which answers with an HttpOnly,
// SameSite=Strict cookie: every tab of this browser is signed in until it closes, and no
// script on the page can read the token back.
function takeTokenFromAddress() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token === null) return null;
  url.searchParams.delete("token");
  // Drop it from the address bar (and history) at once.
  history.replaceState(null, "", url.pathname + url.search + url.hash);
  return token || null;
}

async function signIn(token) {
  const resp = await fetch("/api/v1/session", {
    method: "POST",
    headers: { accept: "application/json", authorization: `Bearer ${token}`,
      "x-requested-with": "skilljobs-dashboard" },
  });
  return resp.ok;
}

async function signOut() {
  try {
    await fetch("/api/v1/session", { method: "DELETE", headers: { "x-requested-with": "skilljobs-dashboard" } });
  } catch (_) { /* signed out locally anyway */ }
}

async function api(path, options) {
  const opts = Object.assign({ method: "GET" }, options || {});
  // The custom header marks the page's own requests (the server refuses body-less
  // state-changing requests without it: a cross-site form cannot send one).
  const headers = { accept: "application/json", "x-requested-with": "skilljobs-dashboard" };
  if (opts.json !== undefined) {
    headers["content-type"] = "application/json";
    opts.body = JSON.stringify(opts.json);
  }
  const resp = await fetch(path, { method: opts.method, headers, body: opts.body });
  if (resp.status === 401) {
    showLogin(t("The token was not accepted."));
    throw new Unauthorized("unauthorized");
  }
  let body = null;
  const type = resp.headers.get("content-type") || "";
  if (type.includes("application/json")) body = await resp.json();
  if (!resp.ok) {
    const reason = body && body.error ? body.error : `HTTP ${resp.status}`;
    const err = new Error(reason);
    err.status = resp.status;
    err.body = body;
    throw err;
  }
  return body;
}

function showLogin(message) {
  stopEvents();
  $("#app").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#login-token").focus();
}

async function start(token) {
  $("#login").hidden = true;
  if (token && !(await signIn(token))) {
    showLogin(t("The token was not accepted."));
    return;
  }
  let me;
  try {
    me = await api("/api/v1/session");
  } catch (err) {
    if (!(err instanceof Unauthorized)) showLogin(`${t("Cannot reach the API:")} ${err.message}`);
    return;
  }
  if (!state.languageChosen) { chooseLanguage(me.language); state.languageChosen = true; }
  state.canChange = Boolean(me.can_change);
  document.body.classList.toggle("read-only", !state.canChange);
  $("#who").hidden = state.canChange;
  $("#who").textContent = state.canChange ? "" : `${me.actor}: ${t("read only")}`;
  $("#app").hidden = false;
  $("#logout").hidden = !me.browser_session;
  state.me = me;
  startEvents();
  route();
  clearInterval(state.timers.poll);
  state.timers.poll = setInterval(refreshCurrent, 10000);
}

// --- live events -----------------------------------------------------------------------

function startEvents() {
  stopEvents();
  const source = new EventSource("/api/v1/events");
  state.events = source;
  source.addEventListener("open", () => { $("#live").className = "live on"; });
  source.addEventListener("error", () => { $("#live").className = "live off"; });
  source.addEventListener("job", (ev) => {
    let data;
    try { data = JSON.parse(ev.data); } catch (e) { return; }
    onJobEvent(data);
  });
}

function stopEvents() {
  if (state.events) state.events.close();
  state.events = null;
  $("#live").className = "live off";
}

function debounce(name, fn, ms) {
  clearTimeout(state.timers[name]);
  state.timers[name] = setTimeout(fn, ms);
}

function onJobEvent(data) {
  const row = document.querySelector(`#jobs tbody tr[data-job-id="${CSS.escape(data.id)}"]`);
  if (row && data.status) {
    const cell = row.querySelector("td.status");
    clear(cell).append(statusBadge(data.status), ...phaseNote(data));
  }
  if (state.page === "jobs") {
    // A new job shows up on the first page; a known one gets its full row refreshed.
    if (row || state.cursors.length === 1) debounce("jobs", () => loadJobs().catch(report), 300);
  }
  if (state.detailId === data.id) debounce("detail", () => openDetail(data.id), 200);
  if (state.page === "overview") debounce("overview", () => loadOverview().catch(report), 500);
}

// --- charts (inline SVG) ---------------------------------------------------------------

const CHART_W = 600;
const CHART_H = 150;
const PAD = { l: 40, r: 8, t: 8, b: 20 };

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function fmtNum(v) { return Number.isInteger(v) ? String(v) : v.toFixed(v < 10 ? 1 : 0); }

// series: [{name, values}] drawn as lines over the bucket starts in t.
function lineChart(container, t, step, series, label) {
  clear(container);
  const all = series.flatMap((s) => s.values);
  const top = niceMax(Math.max(0, ...all));
  const n = Math.max(1, t.length - 1);
  const x = (i) => PAD.l + ((CHART_W - PAD.l - PAD.r) * i) / n;
  const y = (v) => CHART_H - PAD.b - ((CHART_H - PAD.t - PAD.b) * v) / top;
  const totals = series.map((s) => `${s.name} ${s.total !== undefined ? s.total
    : fmtNum(s.values.reduce((a, b) => a + b, 0))}`);
  const root = svg("svg", {
    viewBox: `0 0 ${CHART_W} ${CHART_H}`, class: "chart-svg", role: "img",
    "aria-label": `${label}: ${totals.join(", ")}`,
  });
  for (const frac of [0, 0.5, 1]) {
    const v = top * frac;
    root.append(svg("line", { x1: PAD.l, x2: CHART_W - PAD.r, y1: y(v), y2: y(v), class: "grid-line" }),
      svg("text", { x: PAD.l - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" }, fmtNum(v)));
  }
  if (t.length) {
    const ticks = [[0, "start"], [Math.floor(t.length / 2), "middle"], [t.length - 1, "end"]];
    for (const [i, anchor] of ticks) {
      root.append(svg("text", { x: x(i), y: CHART_H - 4, class: "axis", "text-anchor": anchor },
        fmtClock(t[i])));
    }
  }
  series.forEach((s, k) => {
    const points = s.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { points, class: `series s${k} s-${s.name}` },
      svg("title", {}, `${s.name}: ${totals[k]}`)));
  });
  // one hover target per bucket, with the values of that bucket as its tooltip
  const width = (CHART_W - PAD.l - PAD.r) / Math.max(1, t.length);
  t.forEach((ts, i) => {
    const tip = `${fmtTime(ts)} · ` + series.map((s) => `${s.name} ${fmtNum(s.values[i])}`).join(", ");
    root.append(svg("rect", { x: x(i) - width / 2, y: PAD.t, width, height: CHART_H - PAD.t - PAD.b,
      class: "hover" }, svg("title", {}, tip)));
  });
  container.append(root, el("div", { class: "legend" }, series.map((s, k) =>
    el("span", { class: `key s${k} s-${s.name}` }, totals[k]))));
}

function sum(values) { return values.reduce((a, b) => a + b, 0); }

// Plotted per minute; the legend gives the count over the whole window.
function perMinute(name, counts, step) {
  return { name, values: counts.map((v) => (v * 60) / step), total: sum(counts) };
}

async function loadCharts() {
  const step = state.chartWindow === "24h" ? 600 : 60;
  const data = await api(`/api/v1/stats/timeseries?window=${state.chartWindow}&step=${step}`);
  const jobs = data.series.jobs;
  lineChart($("#chart-jobs"), data.t, step, [
    perMinute("succeeded", jobs.succeeded, step),
    perMinute("failed", jobs.failed, step),
    perMinute("cancelled", jobs.cancelled, step),
  ], "jobs finished per minute");
  const depth = data.series.queue_depth.queued;
  lineChart($("#chart-depth"), data.t, step, [{ name: "queued", values: depth,
    total: `now ${depth[depth.length - 1] || 0}, at most ${Math.max(0, ...depth)}` }], "jobs waiting");
  const dl = Object.entries(data.series.deliveries)
    .filter(([, v]) => v.some((n) => n > 0))
    .map(([name, v]) => perMinute(name, v, step));
  lineChart($("#chart-deliveries"), data.t, step,
    dl.length ? dl : [perMinute("sent", data.t.map(() => 0), step)], "deliveries per minute");
  $("#latency-window").textContent = t(state.chartWindow === "24h" ? "(jobs finished in the last 24 hours)" : "(jobs finished in the last hour)");
  fillRows($("#latency tbody"), data.latency.map((r) => el("tr", {},
    el("td", {}, el("a", { href: address("jobs", null, new URLSearchParams({ skill: r.skill })) }, r.skill)),
    el("td", {}, r.jobs), el("td", {}, fmtMs(r.wait_p50_ms)), el("td", {}, fmtMs(r.wait_p95_ms)),
    el("td", {}, fmtMs(r.run_p50_ms)), el("td", {}, fmtMs(r.run_p95_ms)))), "no finished jobs", 6);
  return data;
}

// --- overview --------------------------------------------------------------------------

async function loadOverview() {
  const [q] = await Promise.all([api("/api/v1/queue"), loadCharts()]);
  $("#c-queued").textContent = q.queued;
  $("#c-running").textContent = q.running;
  $("#c-oldest").textContent = q.queued ? fmtAge(q.oldest_queued_age_s) : "–";
  $("#c-workers").textContent = `${q.workers} / ${q.workers_total}`;
  rememberSkills(q.skills.map((s) => s.skill));
  // the 1 h / 24 h rates, the skills' 24 h figures and failing deliveries are a shared summary
  $("#summary-freshness").textContent = q.summary
    ? `(1 h, 24 h and the tables below as of ${fmtTime(q.summary.as_of).slice(11)}, at most ${q.summary.max_age_s} s old)`
    : "";

  fillRows($("#rates tbody"), Object.entries(q.rates).map(([win, r]) => el("tr", {},
    el("td", {}, win), el("td", {}, r.succeeded), el("td", {}, r.failed),
    el("td", {}, r.timed_out), el("td", {}, r.cancelled), el("td", {}, Number(r.per_min).toFixed(1)),
    el("td", { class: r.failure_rate > 0.1 ? "bad" : "" }, pct(r.failure_rate)))), "no data", 7);

  fillRows($("#skills tbody"), q.skills.map((s) => el("tr", { dataset: { skill: s.skill } },
    el("td", {}, el("a", { href: address("jobs", null, new URLSearchParams({ skill: s.skill })) }, s.skill)),
    el("td", {}, s.queued), el("td", {}, s.running), el("td", {}, s.succeeded),
    el("td", { class: s.failed ? "bad" : "" }, s.failed ? el("a", {
      href: address("jobs", null, new URLSearchParams({ skill: s.skill, status: "failed", since: "24h" })),
    }, s.failed) : 0), el("td", {}, s.cancelled),
    el("td", {}, fmtMs(s.p50_ms)), el("td", {}, fmtMs(s.p95_ms)),
    el("td", {}, s.failed ? action("Requeue failed", () => requeueFailed(s.skill), { class: "small requeue action" }) : ""))),
  "no jobs in the last 24 hours", 9);
  await loadSkillSwitches();

  const f = q.deliveries_failing;
  $("#deliveries-summary").textContent = f.total
    ? `${f.total} failed: ` + Object.entries(f.by_channel).map(([c, n]) => `${c || "?"} ${n}`).join(", ")
    : "None failed.";
  fillRows($("#deliveries-failing tbody"), f.latest.map((d) => el("tr", {},
    el("td", {}, fmtTime(d.created_at)), el("td", {}, d.recipient), el("td", {}, d.kind),
    el("td", {}, d.tries), el("td", { class: "bad" }, d.error || "–"),
    el("td", {}, d.job_id ? jobLink(d.job_id) : "–"))),
  "no failed deliveries", 6);
}

// The pause switch of each loaded skill: paused, workers take none of its jobs (they
// stay queued) until it is switched back on.
async function loadSkillSwitches() {
  await loadPaused();
  const items = (state.skills || []).filter((x) => !x.error);
  fillRows($("#skill-switches tbody"), items.map((x) => {
    const paused = state.paused.has(x.name);
    const box = el("input", { type: "checkbox", role: "switch", class: "action skill-switch",
      "aria-label": `${x.name} ${t("paused")}`, checked: paused, disabled: !state.canChange });
    box.addEventListener("change", () => pauseSkill(x.name, box.checked, box));
    return el("tr", { dataset: { skill: x.name, paused: paused ? "yes" : "no" } },
      el("td", {}, el("a", { href: address("jobs", null, new URLSearchParams({ skill: x.name })) }, x.name)),
      el("td", {}, x.async ? t("yes") : t("no")),
      el("td", {}, paused ? el("span", { class: "badge st-paused" }, t("paused")) : el("span", { class: "muted" }, "–")),
      el("td", {}, el("label", { class: "switch" }, box, t("Pause"))));
  }), t("no skills"), 4);
}

async function pauseSkill(skill, pause, box) {
  if (pause && !window.confirm(t("Pause skill {skill}? Its queued jobs wait until it is resumed.", { skill }))) {
    box.checked = false;
    return;
  }
  try {
    await api(`/api/v1/skills/${encodeURIComponent(skill)}/${pause ? "pause" : "resume"}`, { method: "POST" });
    flash(t(pause ? "{skill}: paused" : "{skill}: resumed", { skill }));
  } catch (err) { report(err); }
  loadSkillSwitches().catch(report);
}

async function requeueFailed(skill) {
  if (!window.confirm(t("Requeue every failed job of {skill}?", { skill }))) return;
  try {
    const r = await api(`/api/v1/skills/${encodeURIComponent(skill)}/requeue-failed`, { method: "POST" });
    flash(said(r, t("requeued")));
    loadOverview().catch(report);
  } catch (err) { report(err); }
}

function rememberSkills(names) {
  const list = $("#skill-names");
  const known = new Set([...list.options].map((o) => o.value));
  for (const name of names) if (!known.has(name)) list.append(el("option", { value: name }));
}

// --- jobs ------------------------------------------------------------------------------

const SPAN = /^(\d+(?:\.\d+)?)([smhd])$/;
const UNIT = { s: 1, m: 60, h: 3600, d: 86400 };

function toEpoch(value) {
  if (!value) return null;
  const span = SPAN.exec(value);
  if (span) return Date.now() / 1000 - Number(span[1]) * UNIT[span[2]];
  if (/^\d+(\.\d+)?$/.test(value)) return Number(value);
  const t = new Date(value).getTime(); // datetime-local: the browser's local time
  return Number.isNaN(t) ? null : t / 1000;
}

function jobQuery(params) {
  const out = new URLSearchParams();
  for (const name of ["q", "status", "skill", "channel", "role"]) {
    if (params.get(name)) out.set(name, params.get(name));
  }
  for (const name of ["since", "until"]) {
    const t = toEpoch(params.get(name));
    if (t !== null) out.set(name, String(t));
  }
  return out;
}

function jobFilterParams() {
  const p = new URLSearchParams();
  for (const name of JOB_FILTERS) if (state.params.get(name)) p.set(name, state.params.get(name));
  return p;
}

async function loadJobsPage() {
  const filters = jobFilterParams();
  const key = String(filters);
  const form = $("#filters");
  if (key !== state.listKey) {
    fillForm(form, filters, JOB_FILTERS);
    const since = form.elements.since;
    if (filters.get("since") && since.value !== filters.get("since")) {
      since.append(el("option", { value: filters.get("since") }, filters.get("since")));
      since.value = filters.get("since");
    }
    state.listKey = key;
    state.cursors = [null];
  }
  updateBulk(filters);
  const jobsDone = loadJobs();
  if (state.id) await openDetail(state.id);
  else closeDetailPanel();
  await jobsDone;
}

// The rows picked with their checkboxes (kept across refreshes of the list).
const selection = new Set();
// The column the list is sorted by (on this page of results), and its direction.
const sorting = { key: null, dir: 1 };
const SORT_KEYS = {
  created: (j) => j.created_at || 0, id: (j) => j.id, skill: (j) => j.skill,
  status: (j) => j.status, attempts: (j) => j.attempts, channel: (j) => j.origin.channel || "",
  role: (j) => j.origin.role_id || "", took: (j) => j.duration_ms || 0, error: (j) => j.error || "",
};

function jobRow(j) {
  const href = address("jobs", j.id, jobFilterParams());
  const paused = j.status === "queued" && state.paused && state.paused.has(j.skill);
  const box = state.canChange ? el("input", {
    type: "checkbox", class: "pick", "aria-label": `select ${j.id}`, checked: selection.has(j.id),
  }) : null;
  if (box) {
    box.addEventListener("click", (e) => e.stopPropagation());
    box.addEventListener("change", () => {
      if (box.checked) selection.add(j.id); else selection.delete(j.id);
      updateSelection();
    });
  }
  return el("tr", {
    dataset: { jobId: j.id }, class: j.id === state.detailId ? "selected" : "",
    onclick: (e) => { if (e.target.tagName !== "A" && e.target.tagName !== "INPUT") navigate(href); } },
  el("td", { class: "pick-cell" }, box),
  el("td", {}, fmtTime(j.created_at)),
  el("td", {}, el("a", { href, class: "mono" }, j.id.slice(0, 12))),
  el("td", {}, j.skill), el("td", { class: "status" }, statusBadge(j.status), ...phaseNote(j),
    paused ? [" ", el("span", { class: "badge st-paused", title: t("this skill is paused") }, t("paused"))] : "",
    j.partial ? [" ", el("span", { class: "badge st-partial" }, "partial")] : ""),
  el("td", {}, j.attempts), el("td", {}, j.origin.channel || "–"),
  el("td", {}, j.origin.role_id || "–"), el("td", {}, fmtMs(j.duration_ms)),
  el("td", { class: "error-cell", title: j.error || "" }, j.error ? String(j.error).slice(0, 140) : ""));
}

function sortedJobs(items) {
  const key = SORT_KEYS[sorting.key];
  if (!key) return items;
  return [...items].sort((a, b) => {
    const x = key(a), y = key(b);
    return (x < y ? -1 : x > y ? 1 : 0) * sorting.dir;
  });
}

function renderJobs() {
  const items = sortedJobs(state.jobItems || []);
  fillRows($("#jobs tbody"), items.map(jobRow), t("no jobs match"), 10);
  for (const th of document.querySelectorAll("#jobs thead th[data-sort]")) {
    const on = th.dataset.sort === sorting.key;
    th.setAttribute("aria-sort", on ? (sorting.dir > 0 ? "ascending" : "descending") : "none");
    th.classList.toggle("sorted", on);
  }
  const all = $("#pick-all");
  if (all) all.checked = items.length > 0 && items.every((j) => selection.has(j.id));
  updateSelection();
}

function sortBy(key) {
  if (sorting.key === key) sorting.dir = -sorting.dir;
  else { sorting.key = key; sorting.dir = key === "created" || key === "took" ? -1 : 1; }
  renderJobs();
}

function updateSelection() {
  const n = selection.size;
  const bar = $("#selection");
  if (!bar) return;
  bar.hidden = n === 0 || !state.canChange;
  $("#selection-count").textContent = t("{n} selected", { n });
}

async function actOnSelection(actionName) {
  const ids = [...selection];
  if (!ids.length) return;
  const verbs = { retry: t("Retry"), cancel: t("Cancel"), delete: t("Delete") };
  if (!window.confirm(t("{verb} {n} selected job(s)?", { verb: verbs[actionName], n: ids.length }))) return;
  try {
    const r = await api("/api/v1/jobs/bulk", { method: "POST", json: { action: actionName, ids } });
    const refused = (r.refused || []).length;
    flash(t("{verb}: {done} of {n} job(s)", { verb: verbs[actionName], done: r.affected, n: r.selected })
      + (refused ? t(", {k} refused", { k: refused }) : ""));
    selection.clear();
  } catch (err) { report(err); }
  loadJobs().catch(report);
}

async function loadPaused() {
  try {
    const skills = await api("/api/v1/skills");
    state.paused = new Set(skills.paused || []);
    state.skills = skills.items || [];
  } catch (err) { if (!(err instanceof Unauthorized)) state.paused = new Set(); }
}

async function loadJobs() {
  const params = jobQuery(jobFilterParams());
  params.set("limit", "50");
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const [page] = await Promise.all([api(`/api/v1/jobs?${params}`), loadPaused()]);
  state.nextCursor = page.next_cursor;
  state.jobItems = page.items;
  rememberSkills(page.items.map((j) => j.skill));
  renderJobs();
  $("#page-newer").disabled = state.cursors.length <= 1;
  $("#page-older").disabled = !state.nextCursor;
  $("#page-info").textContent = t("page {n}", { n: state.cursors.length });
}

// Bulk actions take the list's own filter (the API's bulk filter is the job list's), so
// the count confirmed is the count of jobs the list shows, on every page.
function bulkFilter(filters) {
  return Object.fromEntries(jobQuery(filters));
}

function updateBulk(filters) {
  const ok = Object.keys(bulkFilter(filters)).length > 0;
  for (const id of ["#bulk-retry", "#bulk-cancel"]) $(id).disabled = !ok;
  $("#bulk-note").textContent = ok
    ? "Acts on every job this filter matches (not only this page), at most 10,000 at once."
    : "Filter the list to act on every matching job.";
}

async function bulk(actionName) {
  const shown = jobFilterParams();
  const filter = bulkFilter(shown);
  try {
    const dry = await api("/api/v1/jobs/bulk", { method: "POST", json: { action: actionName, filter, dry_run: true } });
    const what = [...shown].map(([k, v]) => `${k}=${v}`).join(", ");
    if (!dry.matched) { flash(t("No job matches {what}.", { what })); return; }
    const verb = actionName === "retry" ? "Retry" : "Cancel";
    const capped = dry.capped ? ` The oldest ${dry.limit} are taken now; run it again for the rest.` : "";
    if (!window.confirm(t("{verb} {n} job(s) matching {what}?", { verb: t(verb), n: dry.matched, what }) + capped)) return;
    const r = await api("/api/v1/jobs/bulk", { method: "POST", json: { action: actionName, filter, dry_run: false } });
    const refused = (r.refused || []).length;
    flash(t("{verb}: {done} of {n} job(s)", { verb: t(verb), done: r.affected, n: r.matched }) + (refused ? t(", {k} refused", { k: refused }) : ""));
  } catch (err) { report(err); }
  loadJobs().catch(report);
}

// --- job detail --------------------------------------------------------------------------

function closeDetailPanel() {
  state.detailId = null;
  state.detail = null;
  $("#detail").hidden = true;
  for (const tr of document.querySelectorAll("#jobs tbody tr.selected")) tr.classList.remove("selected");
}

async function openDetail(jobId) {
  state.detailId = jobId;
  let job;
  try {
    job = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
  } catch (err) { report(err); return; }
  if (state.detailId !== jobId) return;
  state.detail = job;
  for (const tr of document.querySelectorAll("#jobs tbody tr")) {
    // the freshest copy of this job also refreshes its row in the list
    if (tr.dataset.jobId === jobId) tr.replaceWith(jobRow(job));
    else tr.classList.remove("selected");
  }
  const panel = $("#detail");
  const wasHidden = panel.hidden;
  panel.hidden = false;
  panel.dataset.jobId = job.id;
  panel.dataset.status = job.status;
  $("#act-delete").hidden = !FINISHED.includes(job.status);
  // On a phone the detail comes first (CSS order); opening it shows its top.
  if (wasHidden && window.matchMedia("(max-width: 900px)").matches) panel.scrollIntoView({ block: "start" });
  clear($("#detail-title")).append(job.skill, " ", statusBadge(job.status), ...phaseNote(job),
    ...(job.paused && job.status === "queued"
      ? [" ", el("span", { class: "badge st-paused", title: t("this skill is paused") }, t("paused"))] : []),
    ...(job.partial ? [" ", el("span", { class: "badge st-partial" }, "partial")] : []));
  $("#detail-link").setAttribute("href", address("jobs", job.id));
  $("#detail-link").textContent = `#/jobs/${job.id.slice(0, 8)}…`;

  const fields = [
    ["id", job.id], ["attempts", job.attempts], ["created", fmtTime(job.created_at)],
    ["started", fmtTime(job.started_at)], ["finished", fmtTime(job.finished_at)],
    ["took", fmtMs(job.duration_ms)], ["channel", job.origin.channel],
    ["session", job.origin.session_id], ["actor", job.origin.actor_key],
    ["role / org", `${job.origin.role_id || "–"} / ${job.origin.org_id || "–"}`],
    ["external id", job.origin.external_id], ["wall clock", `${job.wall_sec} s`],
  ];
  if (job.run_at) fields.splice(3, 0, ["runs at", fmtTime(job.run_at)]); // a delayed job
  if (job.error_type) fields.push(["error type", job.error_type]);
  const trace = job.context && (job.context.trace_id || job.context.request_id);
  if (trace) fields.push(["trace id", trace]);
  if (job.chain_run_id) {
    fields.push(["chain run", el("a", { href: address("chain-runs", job.chain_run_id), class: "mono" }, job.chain_run_id)]);
  }
  if (job.cancel_requested) fields.push(["cancel", "requested"]);
  const dl = clear($("#detail-fields"));
  for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {}, v === "" ? "–" : v));

  fillRows($("#detail-attempts"), job.attempt_log.map((a) => el("li", { dataset: { outcome: a.outcome } },
    el("strong", {}, `#${a.number}`), " ", statusBadge(a.outcome), " ",
    `${fmtTime(a.started_at)} → ${fmtTime(a.finished_at)} (${fmtMs(a.duration_ms)})`,
    a.worker_id ? ` on ${a.worker_id}` : "",
    a.error ? el("pre", { class: "bad log" }, a.error) : "",
    ["stdout", "stderr"].map((name) => a[`${name}_tail`]
      ? el("details", { class: `tail tail-${name}` }, el("summary", {}, `${name} (last lines)`),
        el("pre", { class: "log" }, a[`${name}_tail`]))
      : ""))), "not started yet", 1);

  $("#detail-input").textContent = pretty(job.input);
  const failed = job.error && job.status !== "succeeded";
  $("#detail-outcome-title").textContent = failed ? "Error" : "Result";
  $("#detail-outcome").textContent = failed
    ? job.error + (job.result ? "\n\n" + pretty(job.result) : "")
    : pretty(job.result);
  $("#detail-outcome").classList.toggle("bad", Boolean(failed));

  for (const url of state.blobs.splice(0)) URL.revokeObjectURL(url);
  fillRows($("#detail-artifacts"), job.artifacts.map((a) => {
    const item = el("li", {},
      el("button", { type: "button", class: "small", onclick: () => download(a) }, "download"), " ",
      a.link ? [el("a", { href: a.link, class: "small signed-link", title: "a signed link, valid for a day: no token needed" }, "link"), " "] : "",
      a.filename, el("span", { class: "muted" }, ` ${a.media}, ${a.size} bytes`),
      a.source_url ? el("div", { class: "muted mono" }, `from ${a.source_url}`) : "");
    if (a.media === "image") preview(a, item);
    return item;
  }), "none", 1);

  fillRows($("#detail-deliveries tbody"), job.deliveries.map((d) => el("tr", { dataset: { deliveryId: d.id, status: d.status } },
    el("td", {}, d.recipient), el("td", {}, d.kind), el("td", {}, statusBadge(d.status)),
    el("td", {}, d.tries), el("td", {}, d.error || "–"),
    el("td", { class: "nowrap" }, deliveryActions(d, () => openDetail(job.id))))), "none", 6);

  fillRows($("#detail-fetches tbody"), (job.fetches || []).map((f) => el("tr", {},
    el("td", { class: "mono wrap" }, f.url), el("td", {}, f.field || "–"),
    el("td", {}, statusBadge(f.status)), el("td", {}, f.reason || "–"))), "none", 4);

  const finished = FINISHED.includes(job.status);
  $("#act-retry").disabled = !finished;
  $("#act-cancel").disabled = finished;
}

async function fetchBlob(artifact) {
  const resp = await fetch(artifact.download_url);  // (the session cookie signs it)
  if (!resp.ok) {
    let reason = `HTTP ${resp.status}`;
    try { reason = (await resp.json()).error || reason; } catch (e) { /* not JSON */ }
    throw new Error(reason);
  }
  return resp.blob();
}

const PREVIEWABLE = ["image/png", "image/jpeg", "image/gif", "image/webp"];

// Images are shown from a blob of the downloaded bytes (the API serves every artifact as
// an attachment): an <img> decodes them as a raster picture only, never as a page.
async function preview(artifact, item) {
  const mime = String(artifact.mime || "").toLowerCase();
  if (!PREVIEWABLE.includes(mime)) return;
  try {
    const blob = new Blob([await fetchBlob(artifact)], { type: mime });
    const url = URL.createObjectURL(blob);
    state.blobs.push(url);
    item.append(el("div", {}, el("img", { src: url, alt: artifact.filename || "image", class: "preview" })));
  } catch (err) { /* the download button reports errors */ }
}

async function download(artifact) {
  try {
    const url = URL.createObjectURL(await fetchBlob(artifact));
    const a = el("a", { href: url, download: artifact.filename || "artifact" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) { report(err); }
}

async function jobAction(actionName) {
  const job = state.detail;
  if (!job) return;
  const verb = { retry: t("Retry"), cancel: t("Cancel"), delete: t("Delete") }[actionName];
  if (!window.confirm(t("{verb} job {id} ({skill})?", { verb, id: job.id, skill: job.skill }))) return;
  try {
    if (actionName === "delete") {
      const r = await api(`/api/v1/jobs/${encodeURIComponent(job.id)}`, { method: "DELETE" });
      flash(said(r, t("deleted")));
      selection.delete(job.id);
      navigate(address("jobs", null, jobFilterParams()));
      loadJobs().catch(report);
      return;
    }
    const r = await api(`/api/v1/jobs/${encodeURIComponent(job.id)}/${actionName}`, { method: "POST" });
    flash(said(r, t("{verb} done", { verb })));
  } catch (err) { report(err); }
  openDetail(job.id);
  loadJobs().catch(report);
}

// --- schedules ---------------------------------------------------------------------------

async function loadSchedules() {
  const data = await api("/api/v1/schedules");
  fillRows($("#schedules tbody"), data.items.map((s) => el("tr", {
    dataset: { scheduleId: s.id }, class: s.id === state.id ? "selected" : "" },
  el("td", {}, el("a", { href: address("schedules", s.id) }, s.name)),
  el("td", { class: "mono" }, s.cron), el("td", {}, s.timezone),
  el("td", {}, s.enabled ? "yes" : el("span", { title: s.paused_reason || "" }, s.paused_reason ? "paused" : "no")),
  el("td", {}, s.enabled && s.next_fire_at ? zoned(s.next_fire_at, s.timezone) : "–"),
  el("td", {}, s.last_run ? [statusBadge(s.last_run.status), " ", isoTime(s.last_run.fire_at)] : "–"),
  el("td", { class: "nowrap" },
    action(s.enabled ? "Disable" : "Enable", () => toggleSchedule(s)), " ",
    action("Run now", () => runSchedule(s)), " ",
    action(t("Edit"), () => editSchedule(s), { class: "small action edit" }), " ",
    action(t("Delete"), () => deleteSchedule(s), { class: "small action danger delete" })))),
  "no schedules", 7);
  if (state.page === "schedules" && state.id) {
    const s = data.items.find((x) => x.id === state.id);
    if (s) await loadRuns(s);
    else { $("#runs").hidden = false; $("#runs-title").textContent = t("No schedule {id}", { id: state.id }); clear($("#runs-list")); }
  } else {
    $("#runs").hidden = true;
  }
}

// The fields of a schedule file (what POST takes and PATCH changes), from its JSON.
const SCHEDULE_FIELDS = ["name", "cron", "timezone", "identity", "deliver", "policy", "misfire",
  "overlap", "alert", "steps", "enabled"];
const SCHEDULE_EXAMPLE = {
  name: "daily-report", cron: "0 9 * * 1-5", timezone: "Asia/Shanghai",
  deliver: { target: "ops" }, steps: [{ skill: "sales_report", input: { region: "north" } }],
};

function editSchedule(s) {
  const editor = $("#schedule-editor");
  editor.hidden = false;
  editor.dataset.scheduleId = s ? s.id : "";
  $("#schedule-editor-title").textContent = s ? `${t("Edit")} ${s.name}` : t("New schedule");
  const fields = s ? Object.fromEntries(SCHEDULE_FIELDS.filter((k) => s[k] !== null && s[k] !== undefined)
    .map((k) => [k, s[k]])) : SCHEDULE_EXAMPLE;
  $("#schedule-json").value = JSON.stringify(fields, null, 2);
  $("#schedule-problems").textContent = "";
  $("#schedule-json").focus();
}

async function saveSchedule(e) {
  e.preventDefault();
  const id = $("#schedule-editor").dataset.scheduleId;
  let body;
  try { body = JSON.parse($("#schedule-json").value); } catch (err) {
    $("#schedule-problems").textContent = t("JSON: {error}", { error: err.message });
    return;
  }
  try {
    const saved = id
      ? await api(`/api/v1/schedules/${encodeURIComponent(id)}`, { method: "PATCH", json: body })
      : await api("/api/v1/schedules", { method: "POST", json: body });
    $("#schedule-editor").hidden = true;
    flash(t("{name}: saved", { name: saved.name }));
  } catch (err) {
    const problems = err.body && err.body.problems;
    $("#schedule-problems").textContent = problems && problems.length ? problems.join("\n") : err.message;
    return;
  }
  loadSchedules().catch(report);
}

async function deleteSchedule(s) {
  if (!window.confirm(t("Delete schedule {name} and its run history?", { name: s.name }))) return;
  try {
    await api(`/api/v1/schedules/${encodeURIComponent(s.id)}`, { method: "DELETE" });
    flash(t("{name}: deleted", { name: s.name }));
    if (state.id === s.id) navigate("#/schedules");
  } catch (err) { report(err); }
  loadSchedules().catch(report);
}

async function toggleSchedule(s) {
  const verb = s.enabled ? "Disable" : "Enable";
  if (!window.confirm(t("{verb} schedule {name}?", { verb: t(verb), name: s.name }))) return;
  try {
    await api(`/api/v1/schedules/${encodeURIComponent(s.id)}`, { method: "PATCH", json: { enabled: !s.enabled } });
    flash(`${s.name}: ${t(verb.toLowerCase() + "d")}`);
  } catch (err) { report(err); }
  loadSchedules().catch(report);
}

async function runSchedule(s) {
  if (!window.confirm(t("Run schedule {name} now?", { name: s.name }))) return;
  try {
    const r = await api(`/api/v1/schedules/${encodeURIComponent(s.id)}/run`, { method: "POST" });
    flash(t("{name}: run {run} started", { name: s.name, run: r.run_id.slice(0, 8) }));
    setTimeout(() => navigate(address("schedules", s.id)), 800);
  } catch (err) { report(err); }
}

function runLine(run) {
  return el("div", {}, statusBadge(run.status), " ",
    el("a", { href: address("chain-runs", run.id) }, `${run.trigger || ""} fire ${isoTime(run.fire_at)}`),
    run.finished_at ? ` — finished ${isoTime(run.finished_at)}` : "",
    run.error ? el("span", { class: "bad" }, ` ${run.error}`) : "");
}

async function loadRuns(s) {
  const data = await api(`/api/v1/schedules/${encodeURIComponent(s.id)}/runs?limit=20`);
  $("#runs").hidden = false;
  $("#runs-title").textContent = t("Runs of {name}", { name: s.name });
  const dl = clear($("#schedule-fields"));
  const fields = [
    ["cron", `${s.cron} (${s.timezone})`], ["enabled", s.enabled ? "yes" : "no"],
    ["next fires", s.enabled && (s.next_fires || []).length
      ? el("ol", { id: "next-fires", class: "fires" }, s.next_fires.map((t) => el("li", {}, isoTime(t),
        el("span", { class: "muted" }, ` (${zoned(t, s.timezone)})`))))
      : "– (disabled)"],
    ["last fire", isoTime(s.last_fire_at)],
    ["steps", (s.steps || []).map((st, i) => st.id || `#${i}`).join(" → ") || "–"],
  ];
  if (s.paused_reason) fields.push(["paused", s.paused_reason]);
  if (s.misfire) fields.push(["misfire", pretty(s.misfire)]);
  if (s.overlap) fields.push(["overlap", s.overlap]);
  for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {}, v));
  const list = clear($("#runs-list"));
  if (!data.items.length) { list.append(el("p", { class: "muted" }, "no runs yet")); return; }
  for (const run of data.items) {
    list.append(el("div", { class: "run", dataset: { runId: run.id, status: run.status } }, runLine(run),
      el("ol", { class: "steps" }, run.steps.map((st) => el("li", {},
        statusBadge(st.status), " ", el("strong", {}, st.id), ` (${st.skill})`,
        st.status === "stopped_empty" ? el("span", { class: "muted" }, " — stopped by the empty-result guard") : "",
        st.error ? el("div", { class: "bad" }, st.error) : "")))));
  }
}

// --- chain run ---------------------------------------------------------------------------

async function loadChainRun(runId) {
  if (!runId) { navigate("#/schedules"); return; }
  const run = await api(`/api/v1/chain-runs/${encodeURIComponent(runId)}`);
  clear($("#chain-title")).append("Chain run ", el("span", { class: "mono" }, run.id.slice(0, 12)), " ",
    statusBadge(run.status));
  $("#chain-schedule").setAttribute("href", address("schedules", run.schedule_id));
  $("#chain-schedule").textContent = "its schedule";
  const dl = clear($("#chain-fields"));
  for (const [k, v] of [["trigger", run.trigger], ["fire", isoTime(run.fire_at)],
    ["started", isoTime(run.started_at)], ["finished", isoTime(run.finished_at)],
    ["took", run.started_at && run.finished_at ? fmtMs((run.finished_at - run.started_at) * 1000) : "–"],
    ["error", run.error || "–"]]) {
    dl.append(el("dt", {}, k), el("dd", {}, v || "–"));
  }
  drawGraph($("#chain-graph"), run.steps);
  const done = !["running", "queued"].includes(run.status);
  fillRows($("#chain-steps"), run.steps.map((st, i) => el("li", { class: "step", dataset: { step: st.id, status: st.status } },
    el("div", { class: "step-head" }, statusBadge(st.status), " ", el("strong", {}, st.id), ` (${st.skill})`,
      el("span", { class: "muted" }, ` ${fmtMs(st.duration_ms)}`), " ",
      done ? action("Re-run from here", () => rerun(run, st, i)) : null),
    st.status === "stopped_empty" ? el("p", { class: "muted" }, "stopped by the empty-result guard") : "",
    st.error ? el("pre", { class: "bad" }, st.error) : "",
    el("details", {}, el("summary", {}, "input"), el("pre", {}, pretty(st.input))),
    el("details", {}, el("summary", {}, "output"),
      el("pre", {}, pretty(st.output))))), "no steps", 1);
  fillRows($("#chain-artifacts"), (run.artifacts || []).map((a) => el("li", {},
    a.filename, el("span", { class: "muted" }, ` ${a.media}, ${a.size} bytes`),
    a.source_url ? el("div", { class: "muted mono" }, `from ${a.source_url}`) : "")), "none", 1);
  fillRows($("#chain-deliveries tbody"), (run.deliveries || []).map((d) => el("tr", { dataset: { deliveryId: d.id, status: d.status } },
    el("td", {}, d.recipient), el("td", {}, d.kind), el("td", {}, statusBadge(d.status)),
    el("td", {}, d.tries), el("td", {}, d.error || "–"),
    el("td", { class: "nowrap" }, deliveryActions(d, () => loadChainRun(run.id))))), "none", 6);
}

// The graph of a run whose schedule has needs / for_each: a column per depth, an edge per
// need, each node in its state (items done / all for a for_each step).
function drawGraph(box, steps) {
  clear(box);
  const graph = steps.some((s) => s.needs || s.for_each);
  box.hidden = !graph;
  if (!graph) return;
  const explicit = steps.some((s) => s.needs);
  const index = new Map(steps.map((s, i) => [s.id, i]));
  const deps = steps.map((s, i) => (explicit ? (s.needs || []).map((n) => index.get(n)).filter((j) => j !== undefined)
    : (i > 0 ? [i - 1] : [])));
  const depth = [];
  const depthOf = (i) => {
    if (depth[i] === undefined) depth[i] = deps[i].length ? 1 + Math.max(...deps[i].map(depthOf)) : 0;
    return depth[i];
  };
  const columns = [];
  steps.forEach((_, i) => { (columns[depthOf(i)] = columns[depthOf(i)] || []).push(i); });
  const W = 170, H = 44, GX = 60, GY = 16;
  const pos = [];
  columns.forEach((col, c) => col.forEach((i, r) => { pos[i] = { x: 10 + c * (W + GX), y: 10 + r * (H + GY) }; }));
  const width = 20 + columns.length * (W + GX) - GX;
  const height = 20 + Math.max(...columns.map((c) => c.length)) * (H + GY) - GY;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "graph of the chain run" });
  steps.forEach((_, i) => deps[i].forEach((j) => {
    const a = pos[j], b = pos[i];
    const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
    root.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`,
      "data-from": steps[j].id, "data-to": steps[i].id }));
  }));
  steps.forEach((s, i) => {
    const p = pos[i];
    const items = s.items ? ` · ${s.items.succeeded || 0}/${s.items.total} items` : (s.for_each ? " · for each" : "");
    const node = svg("g", { class: `node st-${s.status}`, transform: `translate(${p.x},${p.y})`,
      "data-step": s.id, "data-status": s.status },
    svg("title", {}, `${s.id} (${s.skill}): ${s.status}${s.error ? ` — ${s.error}` : ""}`),
    svg("rect", { width: W, height: H }),
    svg("text", { x: 8, y: 18 }, s.id.length > 22 ? `${s.id.slice(0, 21)}…` : s.id),
    svg("text", { x: 8, y: 34, class: "sub" }, `${s.status}${items}`));
    root.append(node);
  });
  box.append(root);
}

async function rerun(run, step, index) {
  if (!window.confirm(t("Re-run this chain from step {step} (earlier steps keep their recorded outputs)?", { step: step.id }))) return;
  try {
    const r = await api(`/api/v1/chain-runs/${encodeURIComponent(run.id)}/rerun`, { method: "POST", json: { from_step: index } });
    flash(t("new run {run} from step {step}", { run: r.run_id.slice(0, 8), step: step.id }));
    navigate(address("chain-runs", r.run_id));
  } catch (err) { report(err); }
}

// --- deliveries --------------------------------------------------------------------------

const OPEN_DELIVERY = ["unknown", "failed"];

function deliveryActions(d, after) {
  const out = [];
  if (OPEN_DELIVERY.includes(d.status) || d.status === "dismissed") {
    out.push(action("Resend", () => deliveryAction([d], "resend", after)));
  }
  if (OPEN_DELIVERY.includes(d.status)) {
    out.push(" ", action("Dismiss", () => deliveryAction([d], "dismiss", after)));
  }
  return out;
}

// Resend: the stored content goes again to the same recipient as a new generation (an
// unknown one may have arrived already). Dismiss: never sent again.
async function deliveryAction(items, verb, after) {
  const what = items.length === 1
    ? t("delivery to {recipient} ({status})", { recipient: items[0].recipient, status: t(items[0].status) })
    : t("{n} deliveries", { n: items.length });
  const warn = verb === "resend" && items.some((d) => d.status === "unknown")
    ? t(" An unknown delivery may have arrived already: the recipient can get it twice.") : "";
  if (!window.confirm(t("{verb} {what}?", { verb: t(verb === "resend" ? "Resend" : "Dismiss"), what }) + warn)) return;
  let done = 0;
  const failures = [];
  for (const d of items) {
    try {
      await api(`/api/v1/deliveries/${encodeURIComponent(d.id)}/${verb}`, { method: "POST" });
      done += 1;
    } catch (err) {
      if (err instanceof Unauthorized) return;
      failures.push(err.message);
    }
  }
  flash(t("{verb}: {done} of {n}", { verb: t(verb), done, n: items.length })
    + (failures.length ? ` — ${failures[0]}` : ""), failures.length > 0);
  after();
}

async function loadDeliveries() {
  const form = $("#deliveries-filter");
  fillForm(form, state.params, ["status", "channel"]);
  const q = new URLSearchParams();
  for (const name of ["status", "channel"]) if (state.params.get(name)) q.set(name, state.params.get(name));
  q.set("limit", "100");
  const [list, stats] = await Promise.all([
    api(`/api/v1/deliveries?${q}`),
    api("/api/v1/stats/timeseries?metric=deliveries&window=24h&step=3600"),
  ]);
  const waits = new Map((stats.ratelimit_waits || []).map((w) => [w.channel, w]));
  const channels = [...stats.delivery_channels];
  for (const ch of waits.keys()) {
    if (!channels.some((c) => c.channel === ch)) channels.push({ channel: ch, total: 0, failed: 0, failure_rate: 0 });
  }
  fillRows($("#channel-health tbody"), channels.map((c) => {
    const w = waits.get(c.channel);
    return el("tr", { dataset: { channel: c.channel } },
      el("td", {}, el("a", { href: address("deliveries", null, new URLSearchParams({ channel: c.channel })) }, c.channel || "?")),
      el("td", {}, c.total), el("td", { class: c.failed ? "bad" : "" }, c.failed),
      el("td", { class: c.failure_rate > 0.1 ? "bad" : "" }, pct(c.failure_rate)),
      el("td", { class: "ratelimit" }, w ? t("{n} sends, {time} in all", { n: w.waits, time: fmtMs(w.waited_s * 1000) }) : "–"));
  }), "no deliveries in the last 24 hours", 5);
  const reload = () => loadDeliveries().catch(report);
  fillRows($("#deliveries tbody"), list.items.map((d) => el("tr", { dataset: { deliveryId: d.id, status: d.status } },
    el("td", {}, fmtTime(d.created_at)), el("td", {}, d.recipient), el("td", {}, d.kind),
    el("td", {}, statusBadge(d.status)), el("td", {}, d.tries), el("td", { class: "wrap" }, d.error || "–"),
    el("td", {}, d.job_id ? jobLink(d.job_id) : d.chain_run_id ? el("a", { href: address("chain-runs", d.chain_run_id) }, "chain run") : "–"),
    el("td", { class: "nowrap" }, deliveryActions(d, reload)))),
  "no deliveries match", 8);
  const open = list.items.filter((d) => OPEN_DELIVERY.includes(d.status));
  const bar = clear($("#deliveries-bulk"));
  if (open.length) {
    bar.append(action("Resend all matching…", () => deliveryBulk("resend", reload)), " ",
      action("Dismiss all matching…", () => deliveryBulk("dismiss", reload)));
  }
}

// Every delivery the list's filter matches (not only those shown), after a dry-run count.
async function deliveryBulk(verb, after) {
  const filter = {};
  for (const name of ["status", "channel"]) if (state.params.get(name)) filter[name] = state.params.get(name);
  const what = Object.entries(filter).map(([k, v]) => `${k}=${v}`).join(", ") || "status=failed,unknown";
  try {
    const dry = await api("/api/v1/deliveries/bulk", { method: "POST", json: { action: verb, filter, dry_run: true } });
    if (!dry.matched) { flash(t("No delivery matches {what}.", { what })); return; }
    const warn = verb === "resend" && (!filter.status || filter.status.includes("unknown"))
      ? t(" An unknown delivery may have arrived already: its recipient can get it twice.") : "";
    const capped = dry.capped ? t(" The oldest {n} are taken now; run it again for the rest.", { n: dry.limit }) : "";
    const label = t(verb === "resend" ? "Resend" : "Dismiss");
    const ask = t("{verb} {n} deliveries matching {what} (last 7 days)?", { verb: label, n: dry.matched, what });
    if (!window.confirm(`${ask}${warn}${capped}`)) return;
    const r = await api("/api/v1/deliveries/bulk", { method: "POST", json: { action: verb, filter, dry_run: false } });
    const refused = (r.refused || []).length;
    flash(t("{verb}: {done} of {n}", { verb: t(verb), done: r.affected, n: r.matched })
      + (refused ? ` — ${r.refused[0].error}` : ""), refused > 0);
  } catch (err) { report(err); }
  after();
}

// --- incidents ---------------------------------------------------------------------------

async function loadIncidents() {
  fillForm($("#incidents-filter"), state.params, ["status"]);
  const q = new URLSearchParams({ limit: "100" });
  if (state.params.get("status")) q.set("status", state.params.get("status"));
  const data = await api(`/api/v1/incidents?${q}`);
  $("#incidents-open").textContent = t("{n} open", { n: data.open });
  fillRows($("#incidents tbody"), data.items.map((i) => el("tr", { dataset: { incidentId: i.id, status: i.status } },
    el("td", {}, el("a", { href: address("jobs", null, new URLSearchParams({ skill: i.skill, status: "failed" })) }, i.skill)),
    el("td", { class: "wrap" }, i.error_type ? `${i.error_type}: ` : "", i.sample_error || i.pattern),
    el("td", {}, i.count), el("td", {}, fmtTime(i.first_seen)), el("td", {}, fmtTime(i.last_seen)),
    el("td", {}, (i.sample_job_ids || []).slice(0, 3).map((id) => [jobLink(id), " "])),
    el("td", {}, statusBadge(i.status), i.acked_by ? el("div", { class: "muted" }, `by ${i.acked_by}`) : ""),
    el("td", {}, i.status === "open" ? action("Ack", () => ackIncident(i)) : ""))),
  "no incidents", 8);
}

async function ackIncident(i) {
  try {
    await api(`/api/v1/incidents/${encodeURIComponent(i.id)}/ack`, { method: "POST" });
    flash(t("incident of {skill} acknowledged", { skill: i.skill }));
  } catch (err) { report(err); }
  loadIncidents().catch(report);
}

// --- workers -----------------------------------------------------------------------------

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(0)} KiB`;
  if (n < 1024 * 1024 * 1024) return `${(n / 1024 / 1024).toFixed(0)} MiB`;
  return `${(n / 1024 / 1024 / 1024).toFixed(2)} GiB`;
}

async function loadWorkers() {
  const [w, st] = await Promise.all([api("/api/v1/workers"), api("/api/v1/workers/state")]);
  const flags = new Map(st.items.map((x) => [x.id, x]));
  const now = Date.now() / 1000;
  fillRows($("#workers tbody"), w.items.map((x) => {
    const f = flags.get(x.id) || {};
    const mode = f.draining ? "draining" : f.paused ? "paused" : "taking";
    const acts = x.alive ? [
      mode === "taking" ? action(t("Pause"), () => workerAction(x, "pause"))
        : action(t("Resume"), () => workerAction(x, "resume")),
      " ",
      mode === "draining" ? "" : action(t("Drain"), () => workerAction(x, "drain")),
    ] : action(t("Forget"), () => workerAction(x, "forget"), { class: "small action forget" });
    const counts = x.processed === null || x.processed === undefined ? "–"
      : `${x.processed} / ${x.failed}`;
    return el("tr", { dataset: { workerId: x.id, paused: f.paused ? "yes" : "no", mode } },
      el("td", { class: "mono" }, x.id), el("td", {}, x.host), el("td", {}, x.pid),
      el("td", {}, el("span", { class: x.alive ? "badge st-succeeded" : "badge st-failed" },
        t(x.alive ? "alive" : (x.stopped_at ? "stopped" : "stale"))),
      mode !== "taking" && !x.stopped_at ? [" ", el("span", { class: "badge st-queued" }, t(mode))] : ""),
      el("td", { class: "concurrency" }, x.concurrency ?? "–"),
      el("td", { class: "running" }, x.running.length ? [`${x.running.length}: `, x.running.map((id) => [jobLink(id), " "])] : "0"),
      el("td", { class: "counts", title: t("processed") + " / " + t("failed") }, counts),
      el("td", { class: "rss" }, fmtBytes(x.rss_bytes)),
      el("td", {}, fmtTime(x.started_at)),
      el("td", {}, `${fmtTime(x.last_heartbeat)} (${fmtAge(now - x.last_heartbeat)})`),
      el("td", { class: "version" }, x.version || "–"),
      el("td", { class: "actions" }, acts));
  }), t("no worker has reported yet"), 12);
}

async function loadLimits() {
  const got = await api("/api/v1/limits");
  fillRows($("#limits tbody"), got.items.map((x) => el("tr", { dataset: { limitKey: x.key } },
    el("td", { class: "mono" }, x.key),
    el("td", {}, x.rate || "–"),
    el("td", {}, x.tokens === null || x.tokens === undefined ? "–" : x.tokens.toFixed(2)),
    el("td", {}, x.concurrency ? String(x.concurrency) : "–"),
    el("td", {}, x.running === null || x.running === undefined ? "–" : String(x.running)),
    el("td", {}, x.source === "runtime" ? `set by ${x.updated_by || "?"}` : "SKILLJOBS_LIMITS"),
    el("td", { class: "actions" }, x.source === "runtime"
      ? action("Unset", () => limitAction(x.key, null)) : ""),
  )), "no limits", 7);
}

async function limitAction(key, body) {
  const path = `/api/v1/limits/${encodeURIComponent(key)}`;
  try {
    if (body === null) {
      if (!window.confirm(t("Remove the run-time limit of {key}?", { key }))) return;
      await api(path, { method: "DELETE" });
      flash(t("{key}: run-time limit removed", { key }));
    } else {
      await api(path, { method: "PUT", json: body });
      flash(t("{key}: limit set", { key }));
    }
  } catch (err) { report(err); }
  loadLimits().catch(report);
}

const WORKER_ASK = {
  forget: "It is removed from this list (it has stopped).",
  pause: "It finishes what it runs and takes no new jobs until resumed.",
  drain: "It takes no new jobs, finishes what it runs, then exits.",
};
const WORKER_DONE = {
  pause: "paused", resume: "resumed", drain: "draining: it exits once its jobs finish", forget: "forgotten",
};

async function workerAction(w, name) {
  if (WORKER_ASK[name] && !window.confirm(t("{verb} worker {id}?", { verb: t(name[0].toUpperCase() + name.slice(1)), id: w.id }) + " " + t(WORKER_ASK[name]))) return;
  try {
    await api(`/api/v1/workers/${encodeURIComponent(w.id)}/${name}`, { method: "POST" });
    flash(`${w.id}: ${t(WORKER_DONE[name])}`);
  } catch (err) { report(err); }
  loadWorkers().catch(report);
}

// --- audit -------------------------------------------------------------------------------

async function loadAudit() {
  fillForm($("#audit-filter"), state.params, ["actor", "action", "target"]);
  const q = new URLSearchParams({ limit: "50" });
  for (const name of ["actor", "action", "target", "before"]) {
    if (state.params.get(name)) q.set(name, state.params.get(name));
  }
  const data = await api(`/api/v1/audit?${q}`);
  state.auditNext = data.next_before;
  $("#audit-older").disabled = !data.next_before;
  fillRows($("#audit tbody"), data.items.map((a) => el("tr", { dataset: { action: a.action } },
    el("td", {}, fmtTime(a.at)), el("td", {}, a.actor || "–"), el("td", {}, a.action),
    el("td", { class: "mono wrap" }, /^[0-9a-f]{32}$/.test(a.target) && !a.action.startsWith("incident")
      && !a.action.startsWith("schedule") ? jobLink(a.target, a.target) : a.target),
    el("td", { class: a.result === "ok" ? "" : "bad" }, a.result))), "nothing recorded yet", 5);
}

// --- wiring ------------------------------------------------------------------------------

function onKey(e) {
  const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (e.key === "/" && !typing) {
    e.preventDefault();
    if (state.page !== "jobs") navigate("#/jobs");
    setTimeout(() => $("#filters").elements.q.focus(), 0);
  } else if (e.key === "Escape" && state.page === "jobs" && state.id) {
    navigate(address("jobs", null, jobFilterParams()));
  }
}

function wireFilterForm(form, page, names) {
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    navigate(address(page, null, formParams(form, names)));
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const fromAddress = takeTokenFromAddress();
  chooseLanguage(null);
  $("#lang").addEventListener("change", (e) => { setLanguage(e.target.value, true); refreshCurrent(); });
  $("#login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("#login-token").value.trim();
    if (!token) return;
    $("#login-token").value = "";
    start(token);
  });
  $("#logout").addEventListener("click", async () => {
    await signOut();
    showLogin("");
  });
  for (const b of document.querySelectorAll("#tabs button")) {
    b.addEventListener("click", () => navigate(`#/${b.dataset.tab}`));
  }
  for (const b of document.querySelectorAll("#chart-window button")) {
    b.addEventListener("click", () => {
      state.chartWindow = b.dataset.window;
      for (const o of document.querySelectorAll("#chart-window button")) o.classList.toggle("active", o === b);
      loadCharts().catch(report);
    });
  }
  wireFilterForm($("#filters"), "jobs", JOB_FILTERS);
  $("#filters").addEventListener("reset", () => { setTimeout(() => navigate("#/jobs"), 0); });
  wireFilterForm($("#deliveries-filter"), "deliveries", ["status", "channel"]);
  wireFilterForm($("#incidents-filter"), "incidents", ["status"]);
  wireFilterForm($("#audit-filter"), "audit", ["actor", "action", "target"]);
  $("#limit-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const body = {};
    if (f.rate.value.trim()) body.rate = f.rate.value.trim();
    if (f.concurrency.value.trim()) body.concurrency = Number(f.concurrency.value.trim());
    limitAction(f.key.value.trim(), body);
  });
  $("#audit-older").addEventListener("click", () => {
    if (!state.auditNext) return;
    const p = formParams($("#audit-filter"), ["actor", "action", "target"]);
    p.set("before", String(state.auditNext));
    navigate(address("audit", null, p));
  });
  $("#page-older").addEventListener("click", () => {
    if (!state.nextCursor) return;
    state.cursors.push(state.nextCursor);
    loadJobs().catch(report);
  });
  $("#page-newer").addEventListener("click", () => {
    if (state.cursors.length > 1) state.cursors.pop();
    loadJobs().catch(report);
  });
  $("#detail-close").addEventListener("click", () => navigate(address("jobs", null, jobFilterParams())));
  $("#act-retry").addEventListener("click", () => jobAction("retry"));
  $("#act-cancel").addEventListener("click", () => jobAction("cancel"));
  $("#act-delete").addEventListener("click", () => jobAction("delete"));
  $("#schedule-new").addEventListener("click", () => editSchedule(null));
  $("#schedule-form").addEventListener("submit", saveSchedule);
  $("#schedule-cancel").addEventListener("click", () => { $("#schedule-editor").hidden = true; });
  for (const th of document.querySelectorAll("#jobs thead th[data-sort]")) {
    th.addEventListener("click", () => sortBy(th.dataset.sort));
  }
  $("#pick-all").addEventListener("change", (e) => {
    for (const j of state.jobItems || []) {
      if (e.target.checked) selection.add(j.id); else selection.delete(j.id);
    }
    renderJobs();
  });
  $("#sel-retry").addEventListener("click", () => actOnSelection("retry"));
  $("#sel-cancel").addEventListener("click", () => actOnSelection("cancel"));
  $("#sel-delete").addEventListener("click", () => actOnSelection("delete"));
  $("#sel-clear").addEventListener("click", () => { selection.clear(); renderJobs(); });
  $("#bulk-retry").addEventListener("click", () => bulk("retry"));
  $("#bulk-cancel").addEventListener("click", () => bulk("cancel"));
  window.addEventListener("hashchange", () => { if (!$("#app").hidden) route(); });
  document.addEventListener("keydown", onKey);
  start(fromAddress);
});

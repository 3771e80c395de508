// skilljobs queue dashboard. Plain DOM, no framework, no network beyond this origin.
// Everything that comes from the API is put on the page with textContent (via el()),
// never parsed as HTML: a skill that returns "<script>" shows that text, nothing more.
"use strict";

const TOKEN_KEY = "skilljobs.token";
const state = {
  token: null,
  tab: "overview",
  filters: {},
  cursors: [null], // cursor of each page seen; the last is the current page
  nextCursor: null,
  detailId: null,
  detail: null,
  events: null,
  scheduleRunsId: null,
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
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
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

function fmtTime(ts) {
  if (!ts) return "–";
  const d = new Date(ts * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
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
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

function pct(x) { return `${(100 * (x || 0)).toFixed(1)} %`; }

function statusBadge(status) {
  return el("span", { class: `badge st-${String(status || "").replace(/[^a-z_]/g, "")}` },
    status || "–");
}

function pretty(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function flash(message, isError) {
  const node = $("#flash");
  node.textContent = message;
  node.className = isError ? "flash error" : "flash";
  node.hidden = false;
  clearTimeout(state.timers.flash);
  state.timers.flash = setTimeout(() => { node.hidden = true; }, 6000);
}

// --- token and API -------------------------------------------------------------------

class Unauthorized extends Error {}

function takeTokenFromAddress() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token !== null) {
    url.searchParams.delete("token");
    // Drop it from the address bar (and history) at once.
    history.replaceState(null, "", url.pathname + url.search + url.hash);
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
  }
  state.token = sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, options) {
  const opts = Object.assign({ method: "GET" }, options || {});
  // The custom header marks the page's own requests (the server refuses body-less
  // state-changing requests without it: a cross-site form cannot send one).
  const headers = { accept: "application/json", "x-requested-with": "skilljobs-dashboard" };
  if (state.token) headers.authorization = `Bearer ${state.token}`;
  if (opts.json !== undefined) {
    headers["content-type"] = "application/json";
    opts.body = JSON.stringify(opts.json);
  }
  const resp = await fetch(path, { method: opts.method, headers, body: opts.body });
  if (resp.status === 401) {
    showLogin("The token was not accepted.");
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

async function start() {
  $("#login").hidden = true;
  try {
    await api("/api/v1/queue");
  } catch (err) {
    if (!(err instanceof Unauthorized)) showLogin(`Cannot reach the API: ${err.message}`);
    return;
  }
  $("#app").hidden = false;
  $("#logout").hidden = !state.token;
  startEvents();
  selectTab(state.tab);
  clearInterval(state.timers.poll);
  state.timers.poll = setInterval(refreshCurrent, 10000);
}

// --- live events -----------------------------------------------------------------------

function startEvents() {
  stopEvents();
  const url = "/api/v1/events" + (state.token ? `?token=${encodeURIComponent(state.token)}` : "");
  const source = new EventSource(url);
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
    clear(cell).append(statusBadge(data.status));
  }
  if (state.tab === "jobs") {
    // A new job shows up on the first page; a known one gets its full row refreshed.
    if (row || state.cursors.length === 1) debounce("jobs", () => loadJobs().catch(report), 300);
  }
  if (state.detailId === data.id) debounce("detail", () => openDetail(data.id), 200);
  if (state.tab === "overview") debounce("overview", () => loadOverview().catch(report), 500);
}

// --- tabs ------------------------------------------------------------------------------

function selectTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll("#tabs button")) {
    b.classList.toggle("active", b.dataset.tab === tab);
  }
  for (const s of document.querySelectorAll("main .tab")) s.hidden = s.id !== `tab-${tab}`;
  refreshCurrent();
}

function refreshCurrent() {
  const run = { overview: loadOverview, jobs: loadJobs, schedules: loadSchedules }[state.tab];
  if (run) run().catch(report);
}

function report(err) {
  if (err instanceof Unauthorized) return;
  flash(err.message || String(err), true);
}

// --- overview --------------------------------------------------------------------------

async function loadOverview() {
  const [q, w] = await Promise.all([api("/api/v1/queue"), api("/api/v1/workers")]);
  $("#c-queued").textContent = q.queued;
  $("#c-running").textContent = q.running;
  $("#c-oldest").textContent = q.queued ? fmtAge(q.oldest_queued_age_s) : "–";
  $("#c-workers").textContent = `${q.workers} / ${q.workers_total}`;

  fillRows($("#rates tbody"), Object.entries(q.rates).map(([win, r]) => el("tr", {},
    el("td", {}, win), el("td", {}, r.succeeded), el("td", {}, r.failed),
    el("td", {}, r.timed_out), el("td", {}, r.cancelled), el("td", {}, Number(r.per_min).toFixed(1)),
    el("td", { class: r.failure_rate > 0.1 ? "bad" : "" }, pct(r.failure_rate)))), "no data", 7);

  fillRows($("#skills tbody"), q.skills.map((s) => el("tr", { dataset: { skill: s.skill } },
    el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); showJobs({ skill: s.skill }); } }, s.skill)),
    el("td", {}, s.queued), el("td", {}, s.running), el("td", {}, s.succeeded),
    el("td", { class: s.failed ? "bad" : "" }, s.failed), el("td", {}, s.cancelled),
    el("td", {}, fmtMs(s.p50_ms)), el("td", {}, fmtMs(s.p95_ms)),
    el("td", {}, s.failed ? el("button", { type: "button", class: "small requeue",
      onclick: () => requeueFailed(s.skill) }, "Requeue failed") : ""))),
  "no jobs in the last 24 hours", 9);

  const now = Date.now() / 1000;
  fillRows($("#workers tbody"), w.items.map((x) => el("tr", {},
    el("td", {}, x.id), el("td", {}, x.host), el("td", {}, x.pid),
    el("td", {}, `${fmtTime(x.last_heartbeat)} (${fmtAge(now - x.last_heartbeat)} ago)`),
    el("td", {}, el("span", { class: x.alive ? "badge st-succeeded" : "badge st-failed" },
      x.alive ? "alive" : (x.stopped_at ? "stopped" : "silent"))),
    el("td", {}, x.running.length ? x.running.map((id) => el("a", { href: "#", class: "mono",
      onclick: (e) => { e.preventDefault(); showJobs({}); openDetail(id); } }, String(id).slice(0, 8))) : "–"))),
  "no worker has reported yet", 6);

  const f = q.deliveries_failing;
  $("#deliveries-summary").textContent = f.total
    ? `${f.total} failed: ` + Object.entries(f.by_channel).map(([c, n]) => `${c || "?"} ${n}`).join(", ")
    : "None failed.";
  fillRows($("#deliveries-failing tbody"), f.latest.map((d) => el("tr", {},
    el("td", {}, fmtTime(d.created_at)), el("td", {}, d.recipient), el("td", {}, d.kind),
    el("td", {}, d.tries), el("td", { class: "bad" }, d.error || "–"),
    el("td", {}, d.job_id ? el("a", { href: "#", class: "mono",
      onclick: (e) => { e.preventDefault(); showJobs({}); openDetail(d.job_id); } }, d.job_id.slice(0, 8)) : "–"))),
  "no failed deliveries", 6);
}

async function requeueFailed(skill) {
  if (!window.confirm(`Requeue every failed job of ${skill}?`)) return;
  try {
    const r = await api(`/api/v1/skills/${encodeURIComponent(skill)}/requeue-failed`, { method: "POST" });
    flash(r.message || "requeued");
    loadOverview().catch(report);
  } catch (err) { report(err); }
}

// --- jobs ------------------------------------------------------------------------------

function showJobs(filters) {
  const form = $("#filters");
  form.reset();
  for (const [k, v] of Object.entries(filters || {})) if (form.elements[k]) form.elements[k].value = v;
  state.filters = readFilters();
  state.cursors = [null];
  selectTab("jobs");
}

function readFilters() {
  const form = $("#filters");
  const out = {};
  for (const name of ["status", "skill", "channel", "role", "q"]) {
    const v = form.elements[name].value.trim();
    if (v) out[name] = v;
  }
  const range = form.elements.range.value;
  if (range) out.since = String(Date.now() / 1000 - Number(range));
  const until = form.elements.until.value; // local time, as the browser shows it
  if (until && !Number.isNaN(new Date(until).getTime())) {
    out.until = String(new Date(until).getTime() / 1000);
  }
  return out;
}

function jobRow(j) {
  return el("tr", {
    dataset: { jobId: j.id }, class: j.id === state.detailId ? "selected" : "",
    onclick: () => openDetail(j.id) },
  el("td", {}, fmtTime(j.created_at)), el("td", { class: "mono" }, j.id.slice(0, 12)),
  el("td", {}, j.skill), el("td", { class: "status" }, statusBadge(j.status),
    j.partial ? [" ", el("span", { class: "badge st-partial" }, "partial")] : ""),
  el("td", {}, j.attempts), el("td", {}, j.origin.channel || "–"),
  el("td", {}, j.origin.role_id || "–"), el("td", {}, fmtMs(j.duration_ms)));
}

async function loadJobs() {
  const params = new URLSearchParams(state.filters);
  params.set("limit", "50");
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const page = await api(`/api/v1/jobs?${params}`);
  state.nextCursor = page.next_cursor;
  fillRows($("#jobs tbody"), page.items.map(jobRow), "no jobs match", 8);
  $("#page-newer").disabled = state.cursors.length <= 1;
  $("#page-older").disabled = !state.nextCursor;
  $("#page-info").textContent = `page ${state.cursors.length}`;
}

// --- job detail --------------------------------------------------------------------------

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
  panel.hidden = false;
  panel.dataset.jobId = job.id;
  panel.dataset.status = job.status;
  clear($("#detail-title")).append(job.skill, " ", statusBadge(job.status),
    ...(job.partial ? [" ", el("span", { class: "badge st-partial" }, "partial")] : []));

  const fields = [
    ["id", job.id], ["attempts", job.attempts], ["created", fmtTime(job.created_at)],
    ["started", fmtTime(job.started_at)], ["finished", fmtTime(job.finished_at)],
    ["took", fmtMs(job.duration_ms)], ["channel", job.origin.channel],
    ["session", job.origin.session_id], ["actor", job.origin.actor_key],
    ["role / org", `${job.origin.role_id || "–"} / ${job.origin.org_id || "–"}`],
    ["external id", job.origin.external_id], ["wall clock", `${job.wall_sec} s`],
  ];
  if (job.error_type) fields.push(["error type", job.error_type]);
  if (job.chain_run_id) fields.push(["chain run", job.chain_run_id]);
  if (job.cancel_requested) fields.push(["cancel", "requested"]);
  const dl = clear($("#detail-fields"));
  for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {}, v === "" ? "–" : v));

  fillRows($("#detail-attempts"), job.attempt_log.map((a) => el("li", { dataset: { outcome: a.outcome } },
    el("strong", {}, `#${a.number}`), " ", statusBadge(a.outcome), " ",
    `${fmtTime(a.started_at)} → ${fmtTime(a.finished_at)} (${fmtMs(a.duration_ms)})`,
    a.worker_id ? ` on ${a.worker_id}` : "",
    a.error ? el("div", { class: "bad" }, a.error) : "")), "not started yet", 1);

  $("#detail-input").textContent = pretty(job.input);
  const failed = job.error && job.status !== "succeeded";
  $("#detail-outcome-title").textContent = failed ? "Error" : "Result";
  $("#detail-outcome").textContent = failed
    ? job.error + (job.result ? "\n\n" + pretty(job.result) : "")
    : pretty(job.result);
  $("#detail-outcome").classList.toggle("bad", Boolean(failed));

  fillRows($("#detail-artifacts"), job.artifacts.map((a) => el("li", {},
    el("button", { type: "button", class: "small", onclick: () => download(a) }, "download"), " ",
    a.filename, el("span", { class: "muted" }, ` ${a.media}, ${a.size} bytes`),
    a.source_url ? el("div", { class: "muted mono" }, `from ${a.source_url}`) : "")), "none", 1);

  fillRows($("#detail-deliveries tbody"), job.deliveries.map((d) => el("tr", {},
    el("td", {}, d.recipient), el("td", {}, d.kind), el("td", {}, statusBadge(d.status)),
    el("td", {}, d.tries), el("td", {}, d.error || "–"))), "none", 5);

  fillRows($("#detail-fetches tbody"), (job.fetches || []).map((f) => el("tr", {},
    el("td", { class: "mono wrap" }, f.url), el("td", {}, f.field || "–"),
    el("td", {}, statusBadge(f.status)), el("td", {}, f.reason || "–"))), "none", 4);

  const finished = ["succeeded", "failed", "timed_out", "cancelled"].includes(job.status);
  $("#act-retry").disabled = !finished;
  $("#act-cancel").disabled = finished;
}

async function download(artifact) {
  try {
    const headers = state.token ? { authorization: `Bearer ${state.token}` } : {};
    const resp = await fetch(artifact.download_url, { headers });
    if (!resp.ok) {
      let reason = `HTTP ${resp.status}`;
      try { reason = (await resp.json()).error || reason; } catch (e) { /* not JSON */ }
      throw new Error(reason);
    }
    const url = URL.createObjectURL(await resp.blob());
    const a = el("a", { href: url, download: artifact.filename || "artifact" });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) { report(err); }
}

async function jobAction(action) {
  const job = state.detail;
  if (!job) return;
  const verb = action === "retry" ? "Retry" : "Cancel";
  if (!window.confirm(`${verb} job ${job.id} (${job.skill})?`)) return;
  try {
    const r = await api(`/api/v1/jobs/${encodeURIComponent(job.id)}/${action}`, { method: "POST" });
    flash(r.message || `${verb} done`);
  } catch (err) { report(err); }
  openDetail(job.id);
  loadJobs().catch(report);
}

// --- schedules ---------------------------------------------------------------------------

function isoTime(value) {
  if (!value) return "–";
  const d = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(d.getTime()) ? String(value) : fmtTime(d.getTime() / 1000);
}

async function loadSchedules() {
  const data = await api("/api/v1/schedules");
  fillRows($("#schedules tbody"), data.items.map((s) => el("tr", { dataset: { scheduleId: s.id } },
    el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); loadRuns(s); } }, s.name)),
    el("td", { class: "mono" }, s.cron), el("td", {}, s.timezone),
    el("td", {}, s.enabled ? "yes" : "no"), el("td", {}, isoTime(s.next_fire_at)),
    el("td", {}, s.last_run ? [statusBadge(s.last_run.status), " ", isoTime(s.last_run.fire_at)] : "–"),
    el("td", {},
      el("button", { type: "button", class: "small", onclick: () => toggleSchedule(s) },
        s.enabled ? "Disable" : "Enable"), " ",
      el("button", { type: "button", class: "small", onclick: () => runSchedule(s) }, "Run now")))),
  "no schedules", 7);
  if (state.scheduleRunsId) {
    const s = data.items.find((x) => x.id === state.scheduleRunsId);
    if (s) await loadRuns(s);
  }
}

async function toggleSchedule(s) {
  const verb = s.enabled ? "Disable" : "Enable";
  if (!window.confirm(`${verb} schedule ${s.name}?`)) return;
  try {
    await api(`/api/v1/schedules/${encodeURIComponent(s.id)}`, { method: "PATCH", json: { enabled: !s.enabled } });
    flash(`${s.name}: ${verb.toLowerCase()}d`);
  } catch (err) { report(err); }
  loadSchedules().catch(report);
}

async function runSchedule(s) {
  if (!window.confirm(`Run schedule ${s.name} now?`)) return;
  try {
    const r = await api(`/api/v1/schedules/${encodeURIComponent(s.id)}/run`, { method: "POST" });
    flash(`${s.name}: run ${r.run_id.slice(0, 8)} started`);
    state.scheduleRunsId = s.id;
    setTimeout(() => loadSchedules().catch(report), 1000);
  } catch (err) { report(err); }
}

async function loadRuns(s) {
  state.scheduleRunsId = s.id;
  const data = await api(`/api/v1/schedules/${encodeURIComponent(s.id)}/runs?limit=20`);
  $("#runs").hidden = false;
  $("#runs-title").textContent = `Runs of ${s.name}`;
  const list = clear($("#runs-list"));
  if (!data.items.length) { list.append(el("p", { class: "muted" }, "no runs yet")); return; }
  for (const run of data.items) {
    list.append(el("div", { class: "run", dataset: { runId: run.id } },
      el("div", {}, statusBadge(run.status), " ", `${run.trigger || ""} fire ${isoTime(run.fire_at)}`,
        run.finished_at ? ` — finished ${isoTime(run.finished_at)}` : "",
        run.error ? el("span", { class: "bad" }, ` ${run.error}`) : ""),
      el("ol", { class: "steps" }, run.steps.map((st) => el("li", {},
        statusBadge(st.status), " ", el("strong", {}, st.id), ` (${st.skill})`,
        st.status === "stopped_empty" ? el("span", { class: "muted" }, " — stopped by the empty-result guard") : "",
        st.error ? el("div", { class: "bad" }, st.error) : "")))));
  }
}

// --- wiring ------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  takeTokenFromAddress();
  $("#login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("#login-token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    state.token = token;
    $("#login-token").value = "";
    start();
  });
  $("#logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    showLogin("");
  });
  for (const b of document.querySelectorAll("#tabs button")) {
    b.addEventListener("click", () => selectTab(b.dataset.tab));
  }
  $("#filters").addEventListener("submit", (e) => {
    e.preventDefault();
    state.filters = readFilters();
    state.cursors = [null];
    loadJobs().catch(report);
  });
  $("#filters").addEventListener("reset", () => {
    setTimeout(() => { state.filters = {}; state.cursors = [null]; loadJobs().catch(report); }, 0);
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
  $("#detail-close").addEventListener("click", () => {
    state.detailId = null;
    state.detail = null;
    $("#detail").hidden = true;
  });
  $("#act-retry").addEventListener("click", () => jobAction("retry"));
  $("#act-cancel").addEventListener("click", () => jobAction("cancel"));
  start();
});

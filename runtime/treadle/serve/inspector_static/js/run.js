// One run's page ("/runs/<id>"): its facts, what it waits on, the Gantt of its
// steps and waits, its input / output / error, the actions (actions.js: cancel,
// wake, resume a hook, re-run), its streams (streams.js: chunks read live on
// demand) and its raw events on demand (events.js). /api/runs/<id>/stream tells it when
// the log grew; it then re-reads the run and its timeline.

import { mountActions } from "./actions.js";
import { ApiError, get, query, stream } from "./api.js";
import { formatDuration, h, jsonText, pick, replace, statusBadge, timeNode, toDate } from "./dom.js";
import { mountEvents } from "./events.js";
import { countsOf, renderGantt } from "./gantt.js";
import { loadDeployments, revisionOf, runDuration, runLink } from "./runs.js";
import { mountStreams } from "./streams.js";

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** Mounts the run page into main; returns the cleanup (stream, timers). */
export function mountRun(main, ctx, runId) {
  const base = `/api/runs/${encodeURIComponent(runId)}`;
  const readOnly = ctx.session && ctx.session.role === "read_only";
  let run = null;
  let timeline = null;
  let closed = false;
  let pending = null;
  const title = h("h1", { class: "run-title" }, h("span", { class: "mono" }, runId));
  const facts = h("dl", { class: "facts" });
  const problem = h("p", { class: "error", role: "alert", hidden: true });
  const waiting = h("section", { class: "card waiting", "aria-labelledby": "waiting-title" });
  const counts = h("p", { class: "counts muted" });
  const chart = h("div", { class: "chart" });
  const io = h("div", { class: "io" });
  const actions = readOnly ? null : mountActions({ runId, base, authFailed: ctx.authFailed, onDone: () => load() });
  const events = mountEvents({ base, authFailed: ctx.authFailed, isClosed: () => closed });
  const streams = mountStreams({ base, authFailed: ctx.authFailed, isClosed: () => closed });

  // Everything but the title and the problem line waits for the first answer.
  const body = h("div", { class: "run-body", hidden: true },
    facts, waiting,
    h("section", { class: "card", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, "Timeline"), counts, chart),
    actions ? actions.node
      : h("p", { class: "muted read-only-note" }, "Read-only access: actions are not available."),
    io, streams.node, events.node);
  replace(main,
    h("p", { class: "crumbs" }, h("a", { href: "/", "data-nav": "" }, "← All runs")),
    title, problem, body);

  async function load() {
    let detail;
    let bars;
    try {
      [detail, bars] = await Promise.all([get(base), get(`${base}/timeline`)]);
    } catch (err) {
      if (closed) return;
      if (err instanceof ApiError && err.status === 401) return ctx.authFailed(err);
      problem.hidden = false;
      problem.textContent = err instanceof ApiError && err.status === 404
        ? `No run ${runId}.` : `Could not read the run: ${err.message}`;
      return;
    }
    if (closed) return;
    problem.hidden = true;
    body.hidden = false;
    run = detail;
    timeline = bars;
    await loadDeployments();
    if (!closed) render();
    if (!closed) await streams.refresh();
  }

  function render() {
    const status = pick(run, "status");
    replace(title, h("span", { class: "mono" }, runId), " ", statusBadge(status));
    document.title = `${runId} · treadle inspector`;
    const fact = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
    replace(facts,
      // The workflow and the revision link to the runs list filtered by them.
      fact("Workflow", filterLink({ workflow: pick(run, "workflow") })),
      fact("Revision", filterLink({ deployment: pick(run, "deployment_id") }, revisionOf(run), "mono")),
      fact("Spec version", String(pick(run, "spec_version") ?? "")),
      fact("Created", timeNode(pick(run, "created_at"))),
      fact("Started", timeNode(pick(run, "started_at"))),
      fact("Ended", timeNode(pick(run, "ended_at"))),
      fact("Duration", formatDuration(runDuration(run))));
    renderWaiting();
    renderChart();
    renderIo();
    if (actions) actions.update(status, pick(run, "waiting_on"));
  }

  function renderChart() {
    const { refusals, handoffs } = countsOf(timeline);
    const parts = [];
    if (refusals !== null) parts.push(`Fence refusals survived: ${refusals}`);
    if (handoffs !== null) parts.push(`Handoffs: ${handoffs}`);
    counts.textContent = parts.join(" · ");
    counts.hidden = !parts.length;
    // A hook's bar is named "hook"; while it is waited on, waiting_on knows its token.
    const labels = {};
    for (const item of pick(run, "waiting_on") || []) {
      if (item.kind === "hook" && item.token && item.token !== "<hidden>") labels[item.id] = item.token;
    }
    replace(chart, renderGantt(timeline, {
      runStart: toDate(pick(run, "started_at", "created_at")),
      runEnd: toDate(pick(run, "ended_at")),
      labels,
    }));
  }

  function renderWaiting() {
    const items = pick(run, "waiting_on") || [];
    waiting.hidden = !items.length;
    replace(waiting, h("h2", { id: "waiting-title" }, "Waiting on"),
      h("ul", {}, items.map((item) => h("li", {}, describeWait(item)))));
  }

  function renderIo() {
    const error = pick(run, "error");
    const attributes = pick(run, "attributes") || {};
    replace(io,
      error ? renderError(error) : null,
      h("section", { class: "card", "aria-labelledby": "input-title" },
        h("h2", { id: "input-title" }, "Input"), h("pre", { class: "json" }, jsonText(pick(run, "input")))),
      h("section", { class: "card", "aria-labelledby": "output-title" },
        h("h2", { id: "output-title" }, "Output"),
        TERMINAL.has(pick(run, "status")) || pick(run, "output") !== undefined
          ? h("pre", { class: "json" }, jsonText(pick(run, "output")))
          : h("p", { class: "muted" }, "Not finished yet.")),
      Object.keys(attributes).length ? h("section", { class: "card", "aria-labelledby": "attrs-title" },
        h("h2", { id: "attrs-title" }, "Attributes"), h("pre", { class: "json" }, jsonText(attributes))) : null,
      renderTree());
  }

  // Child workflows: the parent link and the children (docs/children.md).
  function renderTree() {
    const parent = pick(run, "parent_run_id");
    const children = pick(run, "children") || [];
    if (!parent && !children.length) return null;
    return h("section", { class: "card", "aria-labelledby": "tree-title" },
      h("h2", { id: "tree-title" }, "Workflow tree"),
      parent ? h("p", {}, "Parent: ", runLink(parent)) : null,
      children.length ? h("ul", {}, children.map((c) => h("li", {},
        runLink(c.run_id), ` ${c.workflow} · ${c.status}`,
        c.on_parent_close === "abandon" ? " · abandon on parent close" : ""))) : null);
  }

  // ---- live updates ----
  const reload = (data) => {
    // A report of slots this page has already read changes nothing.
    if (data && run && typeof data.slot === "number" && data.slot <= (run.event_count || 0)) return;
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      load();
      events.refresh();
    }, 150);
  };
  const closeStream = stream(`${base}/stream`, reload, ctx.setLive);
  // While the run is live its open bars and duration grow with the clock.
  const ticker = setInterval(() => {
    if (run && timeline && !TERMINAL.has(pick(run, "status"))) {
      renderChart();
      facts.lastElementChild.lastElementChild.textContent = formatDuration(runDuration(run));
    }
  }, 1000);
  load();

  return () => {
    closed = true;
    clearTimeout(pending);
    clearInterval(ticker);
    closeStream();
    streams.close();
  };
}

/** A link to the runs list filtered by `params` (text: the value itself). */
function filterLink(params, text, cls) {
  const value = Object.values(params)[0];
  if (!value) return "";
  return h("a", { href: `/${query(params)}`, "data-nav": "", class: cls, title: "Runs like this" },
    text || String(value));
}

/** One "waiting on" item as text: "hook approve:o-1", "wait until 18:50", ... */
function describeWait(item) {
  if (!item || typeof item !== "object") return String(item);
  const kind = pick(item, "kind") || "wait";
  const what = pick(item, "name", "token", "id") || "";
  const until = pick(item, "until");
  const since = pick(item, "since");
  const attempt = pick(item, "attempt");
  return [h("span", { class: `tag kind-${String(kind).replace(/[^a-z_-]/gi, "")}` }, kind), " ",
    h("span", { class: "mono" }, what),
    kind === "hook" && item.token && item.token !== what ? [" token ", h("span", { class: "mono" }, item.token)] : null,
    kind === "step" && typeof item.inline === "boolean" ? ` (${item.inline ? "inline" : "background"})` : null,
    attempt > 1 ? ` (attempt ${attempt})` : null,
    since ? [" since ", timeNode(since)] : null,
    until ? [" until ", timeNode(until)] : null];
}

/** The run's error: message and type; the stack only inside a closed "details". */
function renderError(error) {
  const info = typeof error === "object" ? error : { message: String(error) };
  const stack = pick(info, "stack");
  return h("section", { class: "card error-card", "aria-labelledby": "error-title" },
    h("h2", { id: "error-title" }, "Error"),
    h("p", {}, h("strong", {}, pick(info, "type") || "Error"), ": ", pick(info, "message") || ""),
    pick(info, "code") ? h("p", { class: "muted" }, `code ${info.code}`) : null,
    stack ? h("details", { class: "stack" }, h("summary", {}, "details"), h("pre", {}, stack)) : null);
}

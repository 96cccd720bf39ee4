// One run's page ("/runs/<id>"): its facts, what it waits on, the Gantt of its
// steps and waits, its input / output / error, the actions (cancel, wake, resume a
// hook, re-run) and its raw events on demand. /api/runs/<id>/stream tells it when
// the log grew; it then re-reads the run and its timeline.

import { ApiError, get, post, stream } from "./api.js";
import { formatDuration, h, jsonText, pick, replace, statusBadge, timeNode, toDate } from "./dom.js";
import { countsOf, renderGantt } from "./gantt.js";
import { revisionOf, runDuration, runLink } from "./runs.js";

const TERMINAL = new Set(["completed", "failed", "cancelled"]);

/** Mounts the run page into main; returns the cleanup (stream, timers). */
export function mountRun(main, ctx, runId) {
  const base = `/api/runs/${encodeURIComponent(runId)}`;
  const readOnly = ctx.session && ctx.session.role === "read_only";
  let run = null;
  let timeline = null;
  let closed = false;
  let pending = null;
  // The action controls (made by renderActions, absent for the read-only role).
  let cancelButton;
  let wakeButton;
  let rerunButton;
  let resumeButton;
  let hookToken;
  let hookTokens;
  let actionStatus;
  let resumeBox;
  let hookSeen = false;
  let eventsList;

  const title = h("h1", { class: "run-title" }, h("span", { class: "mono" }, runId));
  const facts = h("dl", { class: "facts" });
  const problem = h("p", { class: "error", role: "alert", hidden: true });
  const waiting = h("section", { class: "card waiting", "aria-labelledby": "waiting-title" });
  const counts = h("p", { class: "counts muted" });
  const chart = h("div", { class: "chart" });
  const io = h("div", { class: "io" });
  const actions = readOnly ? h("p", { class: "muted read-only-note" },
    "Read-only access: actions are not available.") : renderActions();
  const eventsBox = renderEvents();

  // Everything but the title and the problem line waits for the first answer.
  const body = h("div", { class: "run-body", hidden: true },
    facts, waiting,
    h("section", { class: "card", "aria-labelledby": "timeline-title" },
      h("h2", { id: "timeline-title" }, "Timeline"), counts, chart),
    actions, io, eventsBox);
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
    render();
  }

  function render() {
    const status = pick(run, "status");
    replace(title, h("span", { class: "mono" }, runId), " ", statusBadge(status));
    document.title = `${runId} · treadle inspector`;
    const fact = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
    replace(facts,
      fact("Workflow", pick(run, "workflow", "workflow_name") || ""),
      fact("Revision", h("span", { class: "mono" }, revisionOf(run))),
      fact("Spec version", String(pick(run, "spec_version") ?? "")),
      fact("Created", timeNode(pick(run, "created_at"))),
      fact("Started", timeNode(pick(run, "started_at"))),
      fact("Ended", timeNode(pick(run, "ended_at", "completed_at"))),
      fact("Duration", formatDuration(runDuration(run))));
    renderWaiting();
    renderChart();
    renderIo();
    if (!readOnly) updateActions(status);
  }

  function renderChart() {
    const { refusals, handoffs } = countsOf(timeline);
    const parts = [];
    if (refusals !== null) parts.push(`Fence refusals survived: ${refusals}`);
    if (handoffs !== null) parts.push(`Handoffs: ${handoffs}`);
    counts.textContent = parts.join(" · ");
    counts.hidden = !parts.length;
    replace(chart, renderGantt(timeline, {
      runStart: toDate(pick(run, "started_at", "created_at")),
      runEnd: toDate(pick(run, "ended_at", "completed_at")),
    }));
  }

  function renderWaiting() {
    const items = pick(run, "waiting_on") || [];
    waiting.hidden = !items.length;
    replace(waiting, h("h2", { id: "waiting-title" }, "Waiting on"),
      h("ul", {}, items.map((item) => h("li", {}, describeWait(item)))));
    if (!readOnly) {
      const tokens = items.map((i) => i && typeof i === "object" && pick(i, "token")).filter(Boolean);
      replace(hookTokens, tokens.map((t) => h("option", { value: t })));
      if (tokens.length && !hookToken.value) hookToken.value = tokens[0];
      // The first time a hook is waited on, show the form (never fold it under the user).
      if (tokens.length && !hookSeen) resumeBox.open = true;
      hookSeen = hookSeen || tokens.length > 0;
    }
  }

  function renderIo() {
    const error = pick(run, "error");
    replace(io,
      error ? renderError(error) : null,
      h("section", { class: "card", "aria-labelledby": "input-title" },
        h("h2", { id: "input-title" }, "Input"), h("pre", { class: "json" }, jsonText(pick(run, "input")))),
      h("section", { class: "card", "aria-labelledby": "output-title" },
        h("h2", { id: "output-title" }, "Output"),
        TERMINAL.has(pick(run, "status")) || pick(run, "output") !== undefined
          ? h("pre", { class: "json" }, jsonText(pick(run, "output")))
          : h("p", { class: "muted" }, "Not finished yet.")));
  }

  // ---- actions (hidden for the read-only role) ----
  function renderActions() {
    actionStatus = h("p", { class: "action-status", role: "status", "aria-live": "polite" });
    cancelButton = h("button", { type: "button", class: "danger", onclick: () => act("cancel") }, "Cancel run");
    wakeButton = h("button", { type: "button", onclick: () => act("wake") }, "Wake");
    rerunButton = h("button", { type: "button", onclick: () => act("rerun") }, "Re-run");
    hookTokens = h("datalist", { id: "hook-tokens" });
    hookToken = h("input", { id: "hook-token", name: "token", type: "text", list: "hook-tokens",
      autocomplete: "off", required: true, spellcheck: "false" });
    const payload = h("textarea", { id: "hook-payload", name: "payload", rows: "3", spellcheck: "false" });
    payload.value = "{}";
    resumeButton = h("button", { type: "submit" }, "Resume hook");
    const form = h("form", { class: "resume", "aria-label": "Resume a hook" },
      h("div", { class: "field" }, h("label", { for: "hook-token" }, "Hook token"), hookToken, hookTokens),
      h("div", { class: "field grow" }, h("label", { for: "hook-payload" }, "Payload (JSON)"), payload),
      resumeButton);
    // Folded away unless the run waits on a hook (renderWaiting opens it then).
    resumeBox = h("details", { class: "resume-box" }, h("summary", {}, "Resume a hook"), form);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      let body;
      try {
        body = JSON.parse(payload.value || "null");
      } catch (err) {
        say(`The payload is not valid JSON: ${err.message}`, true);
        payload.focus();
        return;
      }
      const token = hookToken.value.trim();
      // The API's ResumeRequest: {"payload": <the hook's payload>}.
      perform("resume", () => post(`/api/hooks/${encodeURIComponent(token)}/resume`, { payload: body }),
        () => `Hook ${token} resumed.`);
    });
    return h("section", { class: "card actions", "aria-labelledby": "actions-title" },
      h("h2", { id: "actions-title" }, "Actions"),
      h("div", { class: "buttons" }, cancelButton, wakeButton, rerunButton),
      resumeBox, actionStatus);
  }

  function updateActions(status) {
    const done = TERMINAL.has(status);
    cancelButton.disabled = done;
    wakeButton.disabled = done;
    resumeButton.disabled = done;
  }

  function act(name) {
    if (name === "cancel" && !window.confirm(`Cancel run ${runId}?`)) return;
    perform(name, () => post(`${base}/${name}`), (answer) => {
      if (name !== "rerun") return name === "cancel" ? "Cancel requested." : "Wake sent.";
      const newId = pick(answer, "run_id", "new_run_id");
      return newId ? ["Re-run started: ", runLink(newId)] : "Re-run started.";
    });
  }

  async function perform(name, call, done) {
    say(`${name}…`, false);
    try {
      const answer = await call();
      say(done(answer), false);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return ctx.authFailed(err);
      say(err instanceof ApiError && err.status === 403
        ? `Not allowed: ${err.message}` : `${name} failed: ${err.message}`, true);
    }
    load();
  }

  function say(message, isError) {
    replace(actionStatus, message);
    actionStatus.className = `action-status ${isError ? "error" : "ok"}`;
  }

  // ---- live updates ----
  const reload = (data) => {
    // A report of slots this page has already read changes nothing.
    if (data && run && typeof data.slot === "number" && data.slot <= (run.event_count || 0)) return;
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      load();
      if (eventsBox.open) loadEvents();
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

  // ---- the raw events, loaded when first opened ----
  function renderEvents() {
    eventsList = h("ol", { class: "events" });
    const box = h("details", { class: "card events-box" },
      h("summary", {}, "Events"), eventsList);
    box.addEventListener("toggle", () => box.open && loadEvents());
    return box;
  }

  async function loadEvents() {
    const all = [];
    let after = "";
    try {
      for (let page = 0; page < 20; page++) {
        const answer = await get(`${base}/events${after ? `?after=${encodeURIComponent(after)}` : ""}`);
        all.push(...((answer && answer.events) || []));
        after = answer && answer.next_cursor;
        if (!after) break;
      }
    } catch (err) {
      if (closed) return;
      if (err instanceof ApiError && err.status === 401) return ctx.authFailed(err);
      replace(eventsList, h("li", { class: "error" }, `Could not read the events: ${err.message}`));
      return;
    }
    if (closed) return;
    replace(eventsList, all.map((e) => {
      const event = pick(e, "event") || e;
      const data = h("pre", { class: "json" }, jsonText(event));
      return h("li", {},
        h("span", { class: "mono slot" }, `#${pick(e, "slot") ?? ""}`), " ",
        h("strong", {}, pick(event, "type") || pick(e, "type") || "event"), " ",
        event.correlation_id ? h("span", { class: "mono muted" }, event.correlation_id) : null, " ",
        timeNode(pick(e, "created_at")),
        h("details", {}, h("summary", {}, "data"), data));
    }));
  }

  return () => {
    closed = true;
    clearTimeout(pending);
    clearInterval(ticker);
    closeStream();
  };
}

/** One "waiting on" item as text: "hook approve:o-1", "wait until 18:50", ... */
function describeWait(item) {
  if (!item || typeof item !== "object") return String(item);
  const kind = pick(item, "kind", "type") || "wait";
  const what = pick(item, "name", "token", "id", "correlation_id") || "";
  const until = pick(item, "until", "resume_at");
  const since = pick(item, "since");
  const attempt = pick(item, "attempt");
  return [h("span", { class: `tag kind-${String(kind).replace(/[^a-z_-]/gi, "")}` }, kind), " ",
    h("span", { class: "mono" }, what),
    kind === "hook" && item.token && item.token !== what ? [" token ", h("span", { class: "mono" }, item.token)] : null,
    attempt > 1 ? ` (attempt ${attempt})` : null,
    since ? [" since ", timeNode(since)] : null,
    until ? [" until ", timeNode(until)] : null];
}

/** The run's error: message and type; the stack only inside a closed "details". */
function renderError(error) {
  const info = typeof error === "object" ? error : { message: String(error) };
  const stack = pick(info, "stack", "traceback");
  return h("section", { class: "card error-card", "aria-labelledby": "error-title" },
    h("h2", { id: "error-title" }, "Error"),
    h("p", {}, h("strong", {}, pick(info, "type") || "Error"), ": ", pick(info, "message") || ""),
    pick(info, "code") ? h("p", { class: "muted" }, `code ${info.code}`) : null,
    stack ? h("details", { class: "stack" }, h("summary", {}, "details"), h("pre", {}, stack)) : null);
}

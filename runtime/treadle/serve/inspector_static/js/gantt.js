// One run's timeline as a Gantt chart: a row per step, wait or hook (from
// GET /api/runs/<id>/timeline), each attempt a segment on a shared time axis.
// Inline and background steps are marked, retries show as several segments, and
// the fence refusals / handoffs the API counts are shown beside the chart.

import { formatDuration, formatTime, h, pick, toDate } from "./dom.js";

/** The bars of a timeline answer (GET /api/runs/<id>/timeline). */
export function barsOf(timeline) {
  return (timeline && timeline.bars) || [];
}

/** A bar's attempts as [{attempt, start, end, outcome}] (a wait/hook: one span). */
function spansOf(bar, now) {
  const attempts = Array.isArray(bar.attempts) ? bar.attempts : [];
  const spans = attempts.map((a, i) => ({
    attempt: pick(a, "attempt") ?? i + 1,
    start: toDate(pick(a, "started_at")),
    end: toDate(pick(a, "ended_at")),
    outcome: pick(a, "outcome") || (pick(a, "ended_at") ? "completed" : "running"),
    error: typeof a.error === "string" ? a.error : null,
  })).filter((s) => s.start);
  if (!spans.length) {
    const start = toDate(pick(bar, "start"));
    if (start) {
      spans.push({ attempt: null, start, end: toDate(pick(bar, "end")),
        outcome: pick(bar, "status") || "running" });
    }
  }
  for (const span of spans) {
    span.open = !span.end;
    // An open span ends now; a browser clock behind the server's never makes it negative.
    if (!span.end) span.end = now;
    if (span.end < span.start) span.end = span.start;
  }
  return spans;
}

/** The fence refusals and handoffs the log shows (null where the API gives none). */
export function countsOf(timeline) {
  const count = (key) => (timeline && typeof timeline[key] === "number" ? timeline[key] : null);
  return { refusals: count("refusals"), handoffs: count("handoffs") };
}

/**
 * The chart for a timeline. runStart/runEnd (Dates or null) widen the axis to the
 * run's own span; open spans end at `now` (re-rendered each second while live);
 * labels[bar id] is added to a row's name (a hook's token, which bars lack).
 */
export function renderGantt(timeline, { runStart = null, runEnd = null, now = new Date(), labels = {} } = {}) {
  const bars = barsOf(timeline);
  // Once the run has ended, whatever was still open ended with it.
  const until = runEnd || now;
  const rows = bars.map((bar) => ({ bar, spans: spansOf(bar, until) }));
  const times = rows.flatMap((r) => r.spans.flatMap((s) => [s.start.getTime(), s.end.getTime()]));
  if (runStart) times.push(runStart.getTime());
  if (runEnd) times.push(runEnd.getTime());
  if (!rows.length) {
    return h("p", { class: "muted empty-timeline" }, "No steps or waits yet.");
  }
  const t0 = Math.min(...times);
  const t1 = Math.max(...times, t0 + 1);
  const span = t1 - t0;
  const pct = (t) => `${(((t - t0) / span) * 100).toFixed(3)}%`;

  const axis = h("div", { class: "axis", "aria-hidden": "true" },
    [0, 0.25, 0.5, 0.75, 1].map((f) => {
      const tick = h("span", { class: "tick" }, `+${formatDuration(span * f)}`);
      tick.style.left = `${f * 100}%`;
      return tick;
    }));

  const list = h("ol", { class: "gantt", "aria-label": "Timeline: steps and waits" },
    rows.map(({ bar, spans }) => renderRow(bar, spans, pct, now, labels[bar.id])));
  // The colours' key (each row also says its status in words, for screen readers).
  const legend = h("p", { class: "legend muted", "aria-hidden": "true" },
    [["completed", "completed"], ["running", "running"], ["retrying", "retried"],
      ["failed", "failed"], ["superseded", "superseded"]].map(([outcome, text]) =>
      h("span", {}, h("span", { class: `swatch seg outcome-${outcome}` }), text)),
    h("span", { class: "kind-wait" }, h("span", { class: "swatch seg" }), "sleep"),
    h("span", { class: "kind-hook" }, h("span", { class: "swatch seg" }), "hook"));
  return h("div", { class: "gantt-wrap" }, h("div", { class: "gantt-head" },
    h("span", { class: "label-col" }, "Step / wait"), axis), list, legend);
}

/** "18:53:41" today, "12-03 18:53:41" on another day. */
function shortTime(date, now) {
  const text = formatTime(date);
  return text.slice(0, 10) === formatTime(now).slice(0, 10) ? text.slice(11) : text.slice(5);
}

function renderRow(bar, spans, pct, now, extra) {
  const kind = pick(bar, "kind") || "step";
  const name = pick(bar, "name", "id") || "?";
  // A sleep is named "sleep until <ISO time>" by the API: show the time readably.
  const sleepUntil = kind === "wait" && /^sleep until /.test(name) ? toDate(name.slice(12)) : null;
  let label = sleepUntil ? `sleep until ${shortTime(sleepUntil, now)}` : name;
  if (extra) label = `${label} ${extra}`; // e.g. a waited-on hook's token
  const status = pick(bar, "status") || (spans.some((s) => s.open) ? "running" : "completed");
  const inline = pick(bar, "inline");
  const tags = [h("span", { class: `tag kind-${kind}` }, kind)];
  if (kind === "step" && inline !== undefined) {
    tags.push(h("span", { class: `tag ${inline ? "inline" : "background"}` },
      inline ? "inline" : "background"));
  }
  const attempts = spans.filter((s) => s.attempt !== null).length;
  if (attempts > 1) tags.push(h("span", { class: "tag attempts" }, `${attempts} attempts`));
  for (const key of ["refusals", "handoffs"]) {
    if (typeof bar[key] === "number" && bar[key] > 0) {
      tags.push(h("span", { class: `tag ${key}` }, `${bar[key]} ${key}`));
    }
  }
  const first = spans[0];
  const last = spans[spans.length - 1];
  const took = first ? formatDuration(last.end - first.start) : "";
  // The sentence a screen reader hears for the row (the segments are drawn only).
  const summary = `${kind} ${label}, ${status}` +
    (kind === "step" && inline !== undefined ? `, ${inline ? "inline" : "background"}` : "") +
    (attempts > 1 ? `, ${attempts} attempts` : "") + (took ? `, ${took}` : "");

  const track = h("div", { class: "track", "aria-hidden": "true" }, spans.map((s) => {
    const seg = h("span", {
      class: `seg outcome-${String(s.outcome).replace(/[^a-z_-]/gi, "")}${s.open ? " open" : ""}`,
      title: `${s.attempt ? `attempt ${s.attempt}: ` : ""}${s.outcome}, ${formatDuration(s.end - s.start)}` +
        (s.error ? ` (${s.error})` : ""),
    });
    seg.style.left = pct(s.start.getTime());
    seg.style.width = `calc(${pct(s.end.getTime())} - ${pct(s.start.getTime())})`;
    return seg;
  }));
  return h("li", {
    class: `bar kind-${kind} status-${String(status).replace(/[^a-z_-]/gi, "")}`,
    dataset: { id: pick(bar, "id") || "", name, kind, status },
  },
  h("div", { class: "label-col" },
    h("span", { "aria-hidden": "true" },
      h("span", { class: "name", title: name }, label), " ", tags, " ", h("span", { class: "took muted" }, took)),
    h("span", { class: "visually-hidden" }, summary)),
  track);
}

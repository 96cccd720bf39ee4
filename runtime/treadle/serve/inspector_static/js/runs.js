// The runs list ("/"): GET /api/runs with the status / workflow / search filters
// and cursor paging, re-read whenever /api/stream says a run changed.

import { ApiError, get, query, stream } from "./api.js";
import { formatDuration, h, pick, replace, statusBadge, timeNode, toDate } from "./dom.js";

const STATUSES = ["pending", "running", "completed", "failed", "cancelled"];
const PAGE_SIZE = 25;

/** The run's duration in ms: the API's, else end (or now, while live) minus start. */
export function runDuration(run) {
  const given = pick(run, "duration_ms");
  if (typeof given === "number") return given;
  const start = toDate(pick(run, "started_at", "created_at"));
  if (!start) return null;
  const end = toDate(pick(run, "ended_at")) || new Date();
  return end - start;
}

/** A link to one run's page, followed without a reload. */
export function runLink(runId, text = runId) {
  return h("a", { href: `/runs/${encodeURIComponent(runId)}`, "data-nav": "", class: "mono" }, text);
}

// deployment_id -> its record from GET /api/deployments (name, latest, retired).
const deployments = new Map();
let deploymentsRead = null;

/** Reads the deployments once per page load (a failure leaves the ids shown bare). */
export function loadDeployments() {
  deploymentsRead = deploymentsRead || get("/api/deployments").then((answer) => {
    for (const d of (answer && answer.deployments) || []) deployments.set(d.deployment_id, d);
  }).catch(() => {
    deploymentsRead = null;
  });
  return deploymentsRead || Promise.resolve();
}

/** The revision a run is pinned to: "orders · orders-7f3a9c", or the bare id. */
export function revisionOf(run) {
  const id = String(pick(run, "deployment_id") || "");
  const known = deployments.get(id);
  return known && known.name && known.name !== id ? `${known.name} · ${id}` : id;
}

/** Mounts the list into main; returns the cleanup (closes the stream). */
export function mountRuns(main, ctx, params) {
  const filters = {
    status: params.get("status") || "",
    workflow: params.get("workflow") || "",
    q: params.get("q") || "",
    deployment: params.get("deployment") || "",
    attributes: params.get("attributes") || "",
  };
  // ?limit=N in the page's URL sets the page size (kept in the URL with the filters).
  const limit = Math.min(Math.max(parseInt(params.get("limit"), 10) || PAGE_SIZE, 1), 500);
  if (params.get("limit")) filters.limit = String(limit);
  const cursors = [""]; // cursors[i] is page i's cursor; the last entry is the shown page
  let nextCursor = null;
  let closed = false;
  let pending = null;

  const statusSelect = h("select", { id: "f-status", name: "status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((s) => h("option", { value: s }, s)));
  statusSelect.value = filters.status;
  const workflowInput = h("input", { id: "f-workflow", name: "workflow", type: "text",
    value: filters.workflow, list: "workflow-names", autocomplete: "off" });
  const workflowNames = h("datalist", { id: "workflow-names" });
  const deploymentSelect = h("select", { id: "f-deployment", name: "deployment" },
    h("option", { value: "" }, "any"));
  const searchInput = h("input", { id: "f-q", name: "q", type: "search", value: filters.q,
    placeholder: "run id, workflow, deployment" });
  // Attributes (docs/attributes.md): "plan=pro stage=active", each value JSON when it
  // parses, else a string; sent as the API's attributes= JSON object (ANDed).
  const attributesInput = h("input", { id: "f-attributes", name: "attributes", type: "text",
    value: attributesText(filters.attributes), placeholder: "key=value ...", autocomplete: "off" });
  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter runs" },
    h("div", { class: "field" }, h("label", { for: "f-status" }, "Status"), statusSelect),
    h("div", { class: "field" }, h("label", { for: "f-workflow" }, "Workflow"), workflowInput,
      workflowNames),
    h("div", { class: "field" }, h("label", { for: "f-deployment" }, "Revision"), deploymentSelect),
    h("div", { class: "field" }, h("label", { for: "f-attributes" }, "Attributes"),
      attributesInput),
    h("div", { class: "field grow" }, h("label", { for: "f-q" }, "Search"), searchInput),
    h("button", { type: "submit" }, "Apply"));
  const message = h("p", { class: "muted", role: "status", "aria-live": "polite" });
  const body = h("tbody");
  const table = h("table", { class: "runs", "aria-label": "Runs" },
    h("thead", {}, h("tr", {},
      ["Status", "Run", "Workflow", "Revision", "Started", "Duration"].map(
        (name) => h("th", { scope: "col" }, name)))),
    body);
  const prev = h("button", { type: "button", disabled: true }, "← Previous");
  const next = h("button", { type: "button", disabled: true }, "Next →");
  const pageInfo = h("span", { class: "muted page-info" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages" }, pageInfo, prev, next);

  replace(main, h("h1", {}, "Runs"), form, message, h("div", { class: "table-wrap" }, table), pager);
  document.title = "Runs · treadle inspector";

  const applyFilters = () => {
    filters.status = statusSelect.value;
    filters.workflow = workflowInput.value.trim();
    filters.q = searchInput.value.trim();
    filters.deployment = deploymentSelect.value;
    filters.attributes = attributesJson(attributesInput.value);
    cursors.length = 1;
    history.replaceState(null, "", `/${query(filters)}`);
    load();
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    applyFilters();
  });
  statusSelect.addEventListener("change", applyFilters);
  deploymentSelect.addEventListener("change", applyFilters);
  prev.addEventListener("click", () => {
    if (cursors.length > 1) cursors.pop();
    load();
  });
  next.addEventListener("click", () => {
    if (nextCursor) cursors.push(nextCursor);
    load();
  });

  async function load() {
    const cursor = cursors[cursors.length - 1];
    let page;
    try {
      page = await get(`/api/runs${query({ ...filters, limit, cursor })}`);
    } catch (err) {
      if (closed) return;
      if (err instanceof ApiError && err.status === 401) return ctx.authFailed(err);
      message.textContent = `Could not list runs: ${err.message}`;
      message.className = "error";
      return;
    }
    if (closed) return;
    const runs = (page && page.runs) || [];
    nextCursor = (page && page.next_cursor) || null;
    prev.disabled = cursors.length <= 1;
    next.disabled = !nextCursor;
    message.className = "muted";
    const filtered = filters.status || filters.workflow || filters.q || filters.deployment ||
      filters.attributes;
    pageInfo.textContent = cursors.length > 1 || nextCursor ? `Page ${cursors.length}` : "";
    message.textContent = runs.length ? "" : filtered ? "No runs match these filters." : "No runs yet.";
    replace(body, runs.map(renderRow));
    const names = new Set([...workflowNames.options].map((o) => o.value));
    for (const run of runs) names.add(pick(run, "workflow") || "");
    replace(workflowNames, [...names].filter(Boolean).sort().map((n) => h("option", { value: n })));
  }

  function renderRow(run) {
    const runId = pick(run, "run_id");
    const status = pick(run, "status");
    return h("tr", { dataset: { runId, status } },
      h("td", { "data-label": "Status" }, statusBadge(status)),
      h("td", { "data-label": "Run" }, runLink(runId)),
      h("td", { "data-label": "Workflow" }, pick(run, "workflow") || ""),
      h("td", { "data-label": "Revision", class: "mono" }, revisionOf(run)),
      h("td", { "data-label": "Started" }, timeNode(pick(run, "started_at", "created_at"))),
      h("td", { "data-label": "Duration" }, formatDuration(runDuration(run))));
  }

  // A change anywhere re-reads the shown page, at most every 300 ms.
  const reload = () => {
    if (pending) return;
    pending = setTimeout(() => {
      pending = null;
      load();
    }, 300);
  };
  const closeStream = stream("/api/stream", reload, ctx.setLive);
  // The revision filter's choices (newest first, as the API lists them), then the page.
  loadDeployments().then(() => {
    if (closed) return;
    for (const d of deployments.values()) {
      const notes = [d.latest ? "latest" : "", d.retired ? "retired" : ""].filter(Boolean);
      const label = `${d.name && d.name !== d.deployment_id ? `${d.name} · ` : ""}${d.deployment_id}` +
        (notes.length ? ` (${notes.join(", ")})` : "");
      deploymentSelect.append(h("option", { value: d.deployment_id }, label));
    }
    deploymentSelect.value = filters.deployment;
    load();
  });
  return () => {
    closed = true;
    clearTimeout(pending);
    closeStream();
  };
}

/** "plan=pro n=3" as the API's attributes= JSON ("" for none). */
export function attributesJson(text) {
  const out = {};
  for (const pair of text.trim().split(/\s+/).filter(Boolean)) {
    const at = pair.indexOf("=");
    if (at < 1) continue;
    const raw = pair.slice(at + 1);
    let value = raw;
    try {
      const parsed = JSON.parse(raw);
      if (parsed === null || typeof parsed !== "object") value = parsed;
    } catch (err) {
      value = raw;
    }
    out[pair.slice(0, at)] = value;
  }
  return Object.keys(out).length ? JSON.stringify(out) : "";
}

/** The attributes= JSON of a page URL back as "key=value ..." for the input. */
function attributesText(json) {
  if (!json) return "";
  try {
    return Object.entries(JSON.parse(json))
      .map(([k, v]) => `${k}=${typeof v === "string" && !isScalarJson(v) ? v : JSON.stringify(v)}`)
      .join(" ");
  } catch (err) {
    return "";
  }
}

function isScalarJson(text) {
  try {
    const parsed = JSON.parse(text);
    return parsed === null || typeof parsed !== "object";
  } catch (err) {
    return false;
  }
}

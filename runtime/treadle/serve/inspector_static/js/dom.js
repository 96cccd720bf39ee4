// DOM helpers for the inspector. Every piece of data reaches the page as a text
// node (textContent): nothing here ever assigns innerHTML, so a run's input, output
// or error cannot inject markup.

/**
 * h("a", {href: "/x", class: "c", onclick: fn}, "text", child, ...): a new element.
 * Props starting with "on" become listeners; `hidden`/`disabled` booleans; `dataset`
 * an object; anything else an attribute. Children: strings (text nodes), nodes,
 * arrays, null/undefined/false (skipped).
 */
export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (key === "hidden" || key === "disabled" || key === "checked" || key === "open") {
      node[key] = Boolean(value);
    } else if (key === "value") {
      node.value = value;
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

/** Appends children (see h) to node. */
export function append(node, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replaces every child of node with the given children. */
export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** A Date from an ISO string or epoch milliseconds; null when absent or unreadable. */
export function toDate(value) {
  if (value === null || value === undefined || value === "") return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : date;
}

const pad = (n) => String(n).padStart(2, "0");

/** "2026-12-01 18:45:53" in the browser's time zone, "" when absent. */
export function formatTime(value) {
  const d = toDate(value);
  if (!d) return "";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A <time> element for a timestamp (machine-readable datetime, readable text). */
export function timeNode(value) {
  const d = toDate(value);
  if (!d) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: d.toISOString(), title: d.toISOString() }, formatTime(d));
}

/** Milliseconds as "340 ms", "4.2 s", "3 min 4 s", "2 h 5 min", "3 d 4 h". */
export function formatDuration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  if (ms < 0) ms = 0;
  if (ms < 10) return `${ms.toFixed(1).replace(/\.0$/, "")} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** The first of obj's keys holding a value (the API's names, with older spellings). */
export function pick(obj, ...keys) {
  if (!obj) return undefined;
  for (const key of keys) {
    if (obj[key] !== undefined && obj[key] !== null) return obj[key];
  }
  return undefined;
}

/** A JSON value pretty-printed for a <pre> (long values cut, saying so). */
export function jsonText(value, limit = 20000) {
  let text;
  try {
    text = value === undefined ? "null" : JSON.stringify(value, null, 2);
    // Arrays of plain values on one line: ["tea", "pot"] rather than a line each.
    text = text.replace(/\[\s*\n([^[\]{}]*?)\n\s*\]/g,
      (all, inner) => (inner.length > 120 ? all : `[${inner.trim().split(/,\s*\n\s*/).join(", ")}]`));
  } catch {
    text = String(value);
  }
  if (text.length > limit) {
    text = `${text.slice(0, limit)}\n… (${text.length - limit} more characters)`;
  }
  return text;
}

/** A status badge: text plus a class per status so colour is never the only cue. */
export function statusBadge(status) {
  const name = String(status || "unknown");
  return h("span", { class: `badge status-${name.replace(/[^a-z_-]/gi, "")}` }, name);
}

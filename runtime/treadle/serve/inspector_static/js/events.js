// The run page's raw log: every event (slot, type, correlation id, time, its data
// folded), read from /api/runs/<id>/events when the box is first opened, and again
// on each live update while it stays open.

import { ApiError, get } from "./api.js";
import { h, jsonText, pick, replace, timeNode } from "./dom.js";

const MAX_PAGES = 20;

/** Returns {node, refresh()}; authFailed(err) on a 401, isClosed() once the page left. */
export function mountEvents({ base, authFailed, isClosed }) {
  const list = h("ol", { class: "events" });
  const node = h("details", { class: "card events-box" }, h("summary", {}, "Events"), list);
  node.addEventListener("toggle", () => node.open && load());

  async function load() {
    const all = [];
    let after = 0;
    try {
      for (let page = 0; page < MAX_PAGES; page++) {
        const answer = await get(`${base}/events${after ? `?after=${after}` : ""}`);
        all.push(...((answer && answer.events) || []));
        after = answer && answer.next_cursor;
        if (!after) break;
      }
    } catch (err) {
      if (isClosed()) return;
      if (err instanceof ApiError && err.status === 401) return authFailed(err);
      replace(list, h("li", { class: "error" }, `Could not read the events: ${err.message}`));
      return;
    }
    if (isClosed()) return;
    // Re-read on each live update: the events whose data the reader opened stay open.
    const opened = new Set([...list.querySelectorAll("li[data-slot] > details[open]")]
      .map((d) => d.parentElement.dataset.slot));
    replace(list, all.map((e) => {
      const event = pick(e, "event") || e;
      const slot = String(pick(e, "slot") ?? "");
      return h("li", { dataset: { slot } },
        h("span", { class: "mono slot" }, `#${pick(e, "slot") ?? ""}`), " ",
        h("strong", {}, pick(e, "type") || pick(event, "type") || "event"), " ",
        pick(e, "correlation_id") ? h("span", { class: "mono muted" }, e.correlation_id) : null, " ",
        timeNode(pick(e, "created_at")),
        h("details", { open: opened.has(slot) }, h("summary", {}, "data"),
          h("pre", { class: "json" }, jsonText(event))));
    }));
  }
  return { node, refresh: () => node.open && load() };
}

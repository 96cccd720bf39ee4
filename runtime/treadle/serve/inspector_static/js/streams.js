// The run page's streams (docs/streams.md): the run's named streams, read from
// /api/runs/<id>/streams (name, chunk count, closed) with the rest of the page, and,
// once a stream is opened, its chunks live from /api/runs/<id>/streams/<name>
// (server-sent events: one per chunk, then "end" once it is closed or the run ended).
// Each chunk shows its index, the step attempt that wrote it and its value as text.

import { ApiError, get, stream } from "./api.js";
import { h, jsonText, replace } from "./dom.js";

const MAX_SHOWN = 2000;

/** Returns {node, refresh(), close()}; authFailed(err) on a 401, isClosed() once the page left. */
export function mountStreams({ base, authFailed, isClosed }) {
  const list = h("ul", { class: "streams" });
  const node = h("section", { class: "card streams-card", "aria-labelledby": "streams-title", hidden: true },
    h("h2", { id: "streams-title" }, "Streams"), list);
  const views = new Map(); // name -> {item, count, chunks, state, close}

  async function refresh() {
    let answer;
    try {
      answer = await get(`${base}/streams`);
    } catch (err) {
      if (isClosed()) return;
      if (err instanceof ApiError && err.status === 401) return authFailed(err);
      node.hidden = false;
      replace(list, h("li", { class: "error" }, `Could not read the streams: ${err.message}`));
      return;
    }
    if (isClosed()) return;
    const streams = (answer && answer.streams) || [];
    node.hidden = !streams.length;
    const seen = new Set();
    for (const s of streams) {
      seen.add(s.name);
      const view = views.get(s.name) || newView(s.name);
      view.count.textContent = `${s.count} chunk${s.count === 1 ? "" : "s"}${s.closed ? " · closed" : ""}`;
      view.item.dataset.count = String(s.count);
      view.item.dataset.closed = String(Boolean(s.closed));
    }
    for (const [name, view] of views) {
      if (!seen.has(name)) {
        view.close();
        view.item.remove();
        views.delete(name);
      }
    }
  }

  function newView(name) {
    const count = h("span", { class: "muted stream-count" });
    const chunks = h("ol", { class: "chunks", hidden: true });
    const state = h("p", { class: "muted stream-state", hidden: true });
    const button = h("button", { type: "button", "aria-expanded": "false" }, "Show chunks");
    const view = { count, chunks, state, close: () => {} };
    button.addEventListener("click", () => (view.open ? hide(view, button) : show(name, view, button)));
    view.item = h("li", { dataset: { stream: name } },
      h("span", { class: "mono stream-name" }, name), " ", count, " ", button, state, chunks);
    views.set(name, view);
    list.append(view.item);
    return view;
  }

  function show(name, view, button) {
    view.open = true;
    button.textContent = "Hide chunks";
    button.setAttribute("aria-expanded", "true");
    replace(view.chunks);
    view.chunks.hidden = false;
    view.state.hidden = false;
    view.state.textContent = "Reading…";
    const onChunk = (chunk) => {
      if (!chunk || typeof chunk.index !== "number") return;
      if (view.chunks.querySelector(`li[data-index="${chunk.index}"]`)) return; // a resumed read
      if (view.chunks.childElementCount >= MAX_SHOWN) {
        view.state.textContent = `Showing the first ${MAX_SHOWN} chunks.`;
        return;
      }
      view.chunks.append(h("li", { dataset: { index: String(chunk.index), attempt: String(chunk.attempt) } },
        h("span", { class: "mono slot" }, `#${chunk.index}`), " ",
        h("span", { class: "muted" }, `attempt ${chunk.attempt} of ${chunk.step_id}`), " ",
        h("pre", { class: "json chunk" }, jsonText(chunk.data))));
      view.state.textContent = "Live: new chunks appear as the step writes them.";
    };
    const onEnd = (end) => {
      view.close();
      const why = end && end.closed ? "Closed by its writer" : "The run ended";
      view.state.textContent = `${why}: ${end ? end.count : view.chunks.childElementCount} chunks.`;
      view.state.dataset.ended = "true";
    };
    const onState = (s) => {
      if (s === "reconnecting" && view.open) view.state.textContent = "Reconnecting…";
    };
    delete view.state.dataset.ended;
    view.close = stream(`${base}/streams/${encodeURIComponent(name)}`, onChunk, onState, { end: onEnd });
  }

  function hide(view, button) {
    view.open = false;
    view.close();
    view.close = () => {};
    view.chunks.hidden = true;
    view.state.hidden = true;
    button.textContent = "Show chunks";
    button.setAttribute("aria-expanded", "false");
  }

  return {
    node,
    refresh,
    close: () => {
      for (const view of views.values()) view.close();
    },
  };
}

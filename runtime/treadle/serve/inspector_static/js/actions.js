// The run page's actions (full role only): cancel, wake, re-run, and resume a hook
// with a JSON payload. Each is one POST to the API; the answer (or the refusal's
// message) is said in a live region, and the page then re-reads the run.

import { ApiError, post } from "./api.js";
import { h, pick, replace } from "./dom.js";
import { runLink } from "./runs.js";

/**
 * The actions card for one run. onDone() is called after every action (the page
 * re-reads); authFailed(err) on a 401. Returns {node, update(status, waitingOn)}.
 */
export function mountActions({ runId, base, authFailed, onDone }) {
  const status = h("p", { class: "action-status", role: "status", "aria-live": "polite" });
  const say = (message, isError) => {
    replace(status, message);
    status.className = `action-status ${isError ? "error" : "ok"}`;
  };

  async function perform(name, call, done) {
    say(`${name}…`, false);
    try {
      say(done(await call()), false);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return authFailed(err);
      say(err instanceof ApiError && err.status === 403
        ? `Not allowed: ${err.message}` : `${name} failed: ${err.message}`, true);
    }
    onDone();
  }

  const said = {
    cancel: () => "Cancel requested.",
    wake: (answer) => (typeof pick(answer, "waits") === "number"
      ? `Wake sent (${answer.waits} sleep${answer.waits === 1 ? "" : "s"}).` : "Wake sent."),
    rerun: (answer) => {
      const newId = pick(answer, "run_id");
      return newId ? ["Re-run started: ", runLink(newId)] : "Re-run started.";
    },
  };
  const act = (name) => {
    // Cancelling cannot be undone: ask first (the other actions are harmless).
    if (name === "cancel" && !window.confirm(`Cancel run ${runId}?`)) return;
    perform(name, () => post(`${base}/${name}`), said[name]);
  };
  const cancel = h("button", { type: "button", class: "danger", onclick: () => act("cancel") }, "Cancel run");
  const wake = h("button", { type: "button", onclick: () => act("wake") }, "Wake");
  const rerun = h("button", { type: "button", onclick: () => act("rerun") }, "Re-run");

  // Resume a hook: its token (offered from what the run waits on) and a JSON payload.
  const tokens = h("datalist", { id: "hook-tokens" });
  const token = h("input", { id: "hook-token", name: "token", type: "text", list: "hook-tokens",
    autocomplete: "off", required: true, spellcheck: "false" });
  const payload = h("textarea", { id: "hook-payload", name: "payload", rows: "3", spellcheck: "false" });
  payload.value = "{}";
  const resume = h("button", { type: "submit" }, "Resume hook");
  const form = h("form", { class: "resume", "aria-label": "Resume a hook" },
    h("div", { class: "field" }, h("label", { for: "hook-token" }, "Hook token"), token, tokens),
    h("div", { class: "field grow" }, h("label", { for: "hook-payload" }, "Payload (JSON)"), payload),
    resume);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    let value;
    try {
      value = JSON.parse(payload.value || "null");
    } catch (err) {
      say(`The payload is not valid JSON: ${err.message}`, true);
      payload.focus();
      return;
    }
    const chosen = token.value.trim();
    // The API's ResumeRequest: {"payload": <the hook's payload>}.
    perform("resume", () => post(`/api/hooks/${encodeURIComponent(chosen)}/resume`, { payload: value }),
      () => `Hook ${chosen} resumed.`);
  });
  // Folded away unless the run waits on a hook (update opens it the first time).
  const resumeBox = h("details", { class: "resume-box" }, h("summary", {}, "Resume a hook"), form);
  let hookSeen = false;

  const node = h("section", { class: "card actions", "aria-labelledby": "actions-title" },
    h("h2", { id: "actions-title" }, "Actions"),
    h("div", { class: "buttons" }, cancel, wake, rerun), resumeBox, status);

  /** Follows the run: a finished run cannot be cancelled, woken or resumed. */
  function update(runStatus, waitingOn) {
    const done = ["completed", "failed", "cancelled"].includes(runStatus);
    cancel.disabled = done;
    wake.disabled = done;
    resume.disabled = done;
    const offered = (waitingOn || []).map((i) => i && pick(i, "token")).filter(Boolean);
    replace(tokens, offered.map((t) => h("option", { value: t })));
    if (offered.length && !token.value) token.value = offered[0];
    // The first time a hook is waited on, show the form (never fold it under the user).
    if (offered.length && !hookSeen) resumeBox.open = true;
    hookSeen = hookSeen || offered.length > 0;
  }
  return { node, update };
}

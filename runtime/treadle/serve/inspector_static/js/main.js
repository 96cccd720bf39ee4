// The inspector's entry point: who is logged in, which view the URL asks for
// ("/" the runs list, "/runs/<id>" one run), and moving between them without a
// reload (history.pushState). Views live in runs.js and run.js; login.js asks for
// the token when the API answers 401.

import { ApiError, getToken, setToken, whoami } from "./api.js";
import { h, replace } from "./dom.js";
import { mountLogin } from "./login.js";
import { mountRun } from "./run.js";
import { mountRuns } from "./runs.js";

const main = document.getElementById("main");
const roleNode = document.getElementById("role");
const liveNode = document.getElementById("live");
const logoutButton = document.getElementById("logout");

let cleanup = () => {};
let session = null;

/** Shows the view for the current URL (closing the previous one's streams). */
function route() {
  cleanup();
  cleanup = () => {};
  liveNode.textContent = "";
  const ctx = { session, navigate, authFailed, setLive };
  const match = location.pathname.match(/^\/runs\/([^/]+)\/?$/);
  if (match) {
    cleanup = mountRun(main, ctx, decodeURIComponent(match[1]));
  } else {
    cleanup = mountRuns(main, ctx, new URLSearchParams(location.search));
  }
}

/** Goes to an inspector URL (pushes history unless replacing). */
function navigate(url, { replace: replaceState = false } = {}) {
  if (replaceState) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  route();
  main.focus({ preventScroll: true });
}

/** The live-updates indicator in the header: "live", "reconnecting" or "". */
function setLive(state) {
  liveNode.textContent = state === "live" ? "● live" : state ? `○ ${state}` : "";
  liveNode.dataset.state = state || "";
}

/** Called by a view when the API answered 401: forget the token, ask for one. */
function authFailed(err) {
  cleanup();
  cleanup = () => {};
  session = null;
  // Say "refused" only when a token was sent; with none, the form is the first step.
  const hadToken = Boolean(getToken());
  setToken("");
  showSession();
  mountLogin(main, { error: hadToken ? err : null, onToken: login });
}

/** Tries a token (or none): on success shows the route, else the login form. */
async function login(token) {
  setToken(token);
  try {
    session = await whoami();
  } catch (err) {
    session = null;
    setToken("");
    if (err instanceof ApiError && err.status === 401) {
      // A token was typed and refused, or none was stored: say which.
      mountLogin(main, { error: token ? err : null, onToken: login });
    } else {
      replace(main, h("p", { class: "error", role: "alert" }, `The API is not answering: ${err.message}`));
    }
    showSession();
    return;
  }
  showSession();
  route();
}

/** The header's role badge and log-out button. */
function showSession() {
  const readOnly = session && session.role === "read_only";
  roleNode.textContent = readOnly ? "read-only" : "";
  roleNode.hidden = !readOnly;
  logoutButton.hidden = !session || !getToken();
}

logoutButton.addEventListener("click", () => {
  setToken("");
  authFailed(null);
});

// Links inside the page are followed without a reload (modifier-clicks still open tabs).
document.addEventListener("click", (event) => {
  const link = event.target.closest && event.target.closest("a[data-nav]");
  if (!link || event.defaultPrevented || event.button !== 0) return;
  if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  navigate(link.getAttribute("href"));
});
window.addEventListener("popstate", route);

login(getToken());

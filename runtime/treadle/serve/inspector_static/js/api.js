// The inspector's client of the JSON API (/api/...): the bearer token, requests,
// errors and the server-sent event streams. The token lives in sessionStorage only
// (gone when the tab closes); EventSource cannot send headers, so streams carry it
// as ?access_token=, which the server accepts on /api/*stream only.

const TOKEN_KEY = "treadle.token";

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

/** An API refusal: the HTTP status and the {"error": {code, message}} it carried. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Calls the API; resolves to the parsed JSON body, rejects with an ApiError. */
export async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "network", `The server did not answer (${err.message}).`);
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    // The API's errors are {"error": {"code", "message"}}; anything else (a proxy's
    // page, say) is reduced to its status line, never shown raw.
    const error = (data && data.error) || {};
    const message = typeof error.message === "string" && error.message
      ? error.message : `${response.status} ${response.statusText}`.trim();
    throw new ApiError(response.status, error.code || `http_${response.status}`, message);
  }
  return data;
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body === undefined ? {} : body);

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, value);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/**
 * Opens a server-sent event stream and calls onEvent(data) for each message
 * (data is the parsed {"run_id", "slot"}, null on a resync); onState follows
 * the connection; named: {eventName: handler(data)} for named events (a
 * stream's "end"). Returns a function that closes it.
 */
export function stream(path, onEvent, onState = () => {}, named = {}) {
  const token = getToken();
  const url = token ? `${path}${path.includes("?") ? "&" : "?"}access_token=${encodeURIComponent(token)}` : path;
  const source = new EventSource(url);
  source.onopen = () => onState("live");
  source.onerror = () => onState(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  // The list stream's "resync": the World cannot say what changed; re-read it all.
  source.addEventListener("resync", () => onEvent(null));
  const parsed = (message) => {
    try {
      return JSON.parse(message.data);
    } catch {
      return null;
    }
  };
  source.onmessage = (message) => onEvent(parsed(message));
  for (const [name, handler] of Object.entries(named)) {
    source.addEventListener(name, (message) => handler(parsed(message)));
  }
  return () => source.close();
}

/**
 * The caller: {role: "full" | "read_only", user}. /inspector/session answers with
 * the role the auth layer gave these credentials (401 without valid ones).
 */
export async function whoami() {
  const me = await get("/inspector/session");
  const role = me && (me.role === "read" || me.role === "read_only") ? "read_only" : "full";
  return { role, user: (me && me.user) || "" };
}

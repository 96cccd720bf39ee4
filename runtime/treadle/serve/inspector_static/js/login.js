// The login form: takes the bearer token (TREADLE_SERVE_TOKEN or the read-only
// one) and hands it to main.js, which keeps it in sessionStorage for this tab.

import { h, replace } from "./dom.js";

/** Renders the form into main; onToken(token) is called on submit. */
export function mountLogin(main, { error, onToken }) {
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "current-password",
    required: true, spellcheck: "false", "aria-describedby": "token-help",
  });
  const problem = h("p", { id: "login-error", class: "error", role: "alert" });
  if (error) problem.textContent = `That token was refused: ${error.message}`;
  problem.hidden = !error;
  const form = h("form", { class: "login card", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title" }, "Log in"),
    // A fixed user name beside the password field, as password managers expect.
    h("input", { type: "text", name: "username", autocomplete: "username", value: "treadle",
      hidden: true, "aria-hidden": "true", tabindex: "-1" }),
    h("label", { for: "token" }, "Access token"),
    input,
    h("p", { id: "token-help", class: "muted" },
      "The server's TREADLE_SERVE_TOKEN (or its read-only token). It is kept for this tab only."),
    problem,
    h("button", { type: "submit", class: "primary" }, "Log in"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    problem.hidden = true;
    onToken(input.value.trim());
  });
  replace(main, form);
  input.focus();
}

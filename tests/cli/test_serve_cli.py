"""``treadle serve`` (issue 13 item 1): a real process serving the API over the World of
``--world``, refusing to start without auth, warning under --insecure-no-auth, and
stopping gracefully on SIGTERM."""

from __future__ import annotations

import re
import secrets
import signal
import subprocess

import httpx

from .conftest import Cli, one_error_line

LISTENING = re.compile(r"listening on (http://\S+)")


def _url_of(proc: subprocess.Popen[str]) -> tuple[str, list[str]]:
    """The URL the server printed, and the lines it printed up to it."""
    assert proc.stderr is not None
    seen: list[str] = []
    while True:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"treadle serve exited ({proc.wait()}): {''.join(seen)}")
        seen.append(line)
        found = LISTENING.search(line)
        if found:
            return found.group(1), seen


def test_serve_answers_with_its_token_and_stops_on_sigterm(cli: Cli) -> None:
    """With TREADLE_SERVE_TOKEN set: /healthz without it, /api/runs with it (401 without),
    and SIGTERM ends the process with exit 0 after "stopped"."""
    token = secrets.token_hex(16)
    cli.env["TREADLE_SERVE_TOKEN"] = token
    proc = cli.background("serve", "--port", "0", "--log-level", "warning")
    url, _ = _url_of(proc)
    assert url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    assert httpx.get(f"{url}/api/runs", timeout=10).status_code == 401
    runs = httpx.get(f"{url}/api/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert runs.status_code == 200
    assert runs.json() == {"runs": [], "next_cursor": None}
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=20)
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    assert token not in rest


def test_serve_refuses_to_start_without_auth(cli: Cli) -> None:
    """No token, no trusted header, no --insecure-no-auth: one error line naming the
    settings, exit 2, nothing served."""
    result = cli("serve", "--port", "0")
    assert result.returncode == 2
    line = one_error_line(result)
    assert "TREADLE_SERVE_TOKEN" in line
    assert "--insecure-no-auth" in line


def test_serve_insecure_no_auth_warns_and_serves_everyone(cli: Cli) -> None:
    """--insecure-no-auth: a loud WARNING line, then /api/runs answers without credentials."""
    proc = cli.background("serve", "--port", "0", "--insecure-no-auth", "--log-level", "warning")
    url, seen = _url_of(proc)
    assert any("WARNING: --insecure-no-auth" in line for line in seen)
    assert httpx.get(f"{url}/api/runs", timeout=10).status_code == 200
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_serve_refuses_a_short_token(cli: Cli) -> None:
    """A token under 16 characters: one error line naming the setting, not the value."""
    cli.env["TREADLE_SERVE_TOKEN"] = "tiny-secret"
    result = cli("serve", "--port", "0")
    assert result.returncode == 2
    line = one_error_line(result)
    assert "TREADLE_SERVE_TOKEN" in line
    assert "tiny-secret" not in line


def test_settings_lists_the_serve_settings_with_the_token_masked(cli: Cli) -> None:
    """``treadle settings --json`` has the TREADLE_SERVE_* rows; the token is masked."""
    token = secrets.token_hex(16)
    cli.env["TREADLE_SERVE_TOKEN"] = token
    rows = {r["name"]: r for r in cli.json("settings")}
    assert rows["TREADLE_SERVE_TOKEN"]["from_environment"] is True
    assert rows["TREADLE_SERVE_TOKEN"]["value"] == "**********"
    assert rows["TREADLE_SERVE_PORT"]["default"] == 8080
    assert token not in str(rows)

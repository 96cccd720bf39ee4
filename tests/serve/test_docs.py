"""docs/serve.md keeps up with the code: every TREADLE_SERVE_* setting and every API
route is written down (issue 13 item 1)."""

from __future__ import annotations

from pathlib import Path

from treadle.serve import openapi
from treadle.serve.settings import ServeSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
# Addresses, not auth or behaviour: the CLI's --host/--port name them.
LISTED_ELSEWHERE = {"TREADLE_SERVE_HOST", "TREADLE_SERVE_PORT"}


def test_every_serve_setting_is_documented() -> None:
    """Each setting (its _FILE variant with it) appears in docs/serve.md."""
    for name in ServeSettings.model_fields:
        if name in LISTED_ELSEWHERE or name.endswith("_FILE"):
            assert name in DOC or name.removesuffix("_FILE") in DOC, name
            continue
        assert f"`{name}" in DOC, name


def test_every_api_route_is_documented() -> None:
    """Each route of the OpenAPI table has an example or a line in docs/serve.md."""
    for op in openapi.OPERATIONS:
        stem = op.path.split("{", 1)[0].rstrip("/")
        tail = op.path.rsplit("}", 1)[-1]
        assert stem in DOC, op.path
        assert tail in DOC, op.path

"""The CLI and real ``treadle worker`` processes under type-directed decoding (security.md H1).

- ``--input`` holding a ``$t`` key is refused in one line, before anything is recorded.
- The review's exploit, a gadget run input written with ``start_encoded``, reaches a
  plain ``treadle worker``: the run fails with the clear error, no command runs, and
  ``inspect`` still shows the stored value as raw JSON.
- A step returning a dataclass declared only by the app's own module (no annotation
  names it) and a model named only by an annotation replay in a second worker process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.cli.conftest import Cli, one_error_line

SHOP = '''
"""A shop whose value types cross the log between worker processes."""

import dataclasses
from typing import Any

from treadle import Workflows, create_hook

from shop_types import Total

app = Workflows()


@dataclasses.dataclass
class Receipt:
    """Declared by being defined in the app's module; no annotation names it."""

    number: str
    lines: list[str]


@app.step
async def receipt(number: str) -> Any:
    return Receipt(number, ["tea", "cake"])


@app.step
async def total(count: int) -> Total:
    return Total(amount=count * 3)


@app.workflow
async def checkout(number: str) -> dict[str, Any]:
    got = await receipt(number)
    assert isinstance(got, Receipt), type(got)
    summed = await total(len(got.lines))
    assert isinstance(summed, Total), type(summed)
    await create_hook(f"pay:{number}").payload()
    return {"receipt": got, "total": summed}
'''

SHOP_TYPES = '''
"""Named only by an annotation of shop.py: not an app module."""

from pydantic import BaseModel


class Total(BaseModel):
    amount: int
'''


def _has(kind: str) -> Any:
    return lambda run: any(e["type"] == kind for e in run["events"])


def _ended(run: dict[str, Any]) -> bool:
    return run["status"] in ("completed", "failed", "cancelled")


def _stop(worker: subprocess.Popen[str]) -> str:
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=20)
    assert worker.returncode == 0, stderr
    assert "Traceback" not in stderr
    return stderr


@pytest.mark.parametrize("command", ["start", "run"])
def test_input_holding_a_tag_key_is_refused_in_one_line(
    cli: Cli, command: str, tmp_path: Path
) -> None:
    marker = tmp_path / "MARKER"
    gadget = {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": ["touch", str(marker)]}}
    result = cli(command, "flows.py:hi", "--input", json.dumps({"name": [gadget]}))
    assert result.returncode == 2
    line = one_error_line(result)
    assert "--input.name[0] has a '$t' key, which treadle reserves" in line
    assert cli.json("runs", "list") == []
    assert not marker.exists()


def test_a_forged_run_input_fails_in_a_plain_worker_and_inspect_shows_it_raw(
    cli: Cli, tmp_path: Path
) -> None:
    """H1's evidence: ``start_encoded`` with the Popen gadget, then ``treadle worker``
    wrote ``id > MARKER``. Now the run fails naming the class, and nothing runs."""
    marker = tmp_path / "MARKER"
    gadget = {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": ["touch", str(marker)]}}
    forge = (
        "import asyncio, json, sys\n"
        "from treadle import Workflows\n"
        "async def main():\n"
        "    app = Workflows(worker=False)\n"
        "    run = await app.start_encoded('hi', json.loads(sys.argv[1]))\n"
        "    print(run.run_id)\n"
        "    await app.close()\n"
        "asyncio.run(main())\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", forge, json.dumps({"args": [gadget], "kwargs": {}})],
        cwd=cli.cwd,
        env=cli.environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    run_id = started.stdout.strip()
    shown = cli.json("inspect", run_id)  # the CLI shows the stored value, never decodes it
    assert shown["input"] == {"args": [gadget], "kwargs": {}}
    worker = cli.background("worker", "flows.py", "--grace", "1")
    done = cli.wait_for_run(run_id, _ended)
    _stop(worker)
    assert done["status"] == "failed"
    assert done["error"]["type"] == "SerializationError"
    assert (
        "workflow hi input argument 0: the stored value names class 'subprocess:Popen'"
        in (done["error"]["message"])
    )
    assert cli.json("runs", "get", run_id)["status"] == "failed"
    assert not marker.exists()


def test_app_module_and_annotated_types_replay_in_a_second_worker_process(cli: Cli) -> None:
    """A step's dataclass result (declared by the app's own module) and a model result
    (declared by an annotation) written by one worker process are decoded by another."""
    (cli.cwd / "shop.py").write_text(SHOP)
    (cli.cwd / "shop_types.py").write_text(SHOP_TYPES)
    run_id = cli("start", "shop.py:checkout", "--input", '{"number": "r-1"}').stdout.strip()
    first = cli.background("worker", "shop.py", "--grace", "1")
    waiting = cli.wait_for_run(run_id, _has("hook_created"))
    _stop(first)
    results = [e for e in waiting["events"] if e["type"] == "step_completed"]
    assert [r["event"]["result"]["cls"] for r in results] == ["shop:Receipt", "shop_types:Total"]

    second = cli.background("worker", "shop.py", "--grace", "1")
    resumed = cli("hooks", "resume", "pay:r-1", "--payload", '{"paid": true}')
    assert resumed.returncode == 0, resumed.stderr
    done = cli.wait_for_run(run_id, _ended)
    _stop(second)
    assert done["status"] == "completed", done.get("error")
    assert done["output"] == {
        "receipt": {
            "$t": "dataclass",
            "cls": "shop:Receipt",
            "v": {"number": "r-1", "lines": ["tea", "cake"]},
        },
        "total": {"$t": "model", "cls": "shop_types:Total", "v": {"amount": 6}},
    }

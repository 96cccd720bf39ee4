"""Workflows the worker pods of the operator tests serve (``treadle worker`` loads this file).

Each step reports the image its pod runs, so a test can tell which revision
served it: the process kubelet sets ``TREADLE_POD_IMAGE``; on the real node each
image of a tag holds it in ``/app/pod-image`` (``pod_node.py``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from treadle import Hook, Workflows, sleep

app = Workflows()


class Approval(Hook):
    approved: bool


def _pod_image() -> str:
    image = os.environ.get("TREADLE_POD_IMAGE")
    if image:
        return image
    try:
        return Path("/app/pod-image").read_text().strip()
    except OSError:
        return "?"


@app.step
async def where() -> str:
    return _pod_image()


@app.workflow
async def greet(name: str) -> dict[str, str]:
    return {"hello": name, "image": await where()}


# Every image of this file runs the same code: its runs may move between revisions
# (``spec.revisions.<id>: {action: MoveRuns}``, tests/k8s/test_operator_moves.py).
@app.workflow(compatible="approval-v1")
async def approval(order_id: str) -> dict[str, object]:
    before = await where()
    answer = await Approval.wait(token=f"approve:{order_id}")
    after = await where()
    return {"approved": bool(answer and answer.approved), "before": before, "after": after}


@app.step
async def nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return os.environ.get("TREADLE_POD_NAME", "?")


@app.workflow
async def naps(count: int, seconds: float) -> list[str]:
    """``count`` background steps at once: a backlog on the step queue."""
    return list(await asyncio.gather(*(nap(seconds) for _ in range(count))))


@app.workflow
async def fanout(count: int) -> int:
    """``count`` hooks open at once (``fanout:<i>``): a long ``waitingOn``."""
    answers = await asyncio.gather(*(Approval.wait(token=f"fanout:{i}") for i in range(count)))
    return sum(1 for a in answers if a and a.approved)


@app.workflow
async def snooze(seconds: float) -> str:
    """One long durable sleep: a WorkflowSignal ``Wake`` cuts it short."""
    await sleep(seconds)
    return "awake"


@app.step(max_retries=0)
async def marker_exists(path: str) -> bool:
    return os.path.exists(path)


@app.workflow
async def needs_marker(path: str) -> str:
    """Fails while the file ``path`` does not exist: a ``Rerun`` once it does succeeds."""
    if not await marker_exists(path):
        raise RuntimeError(f"no marker file at {path}")
    return "found"


@app.workflow
async def signed_approval(order_id: str) -> bool:
    """A hook created with ``require_signature``: a resume must be signed."""
    answer = await Approval.wait(token=f"signed:{order_id}", require_signature=True)
    return bool(answer and answer.approved)

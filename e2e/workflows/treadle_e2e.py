"""Workflows the e2e suite deploys in a WorkflowDeployment (module ``treadle_e2e``).

``greet`` finishes at once; ``nap`` sleeps durably for as long as it is told, so a
test can roll out a new image, or delete the WorkflowRun, while it sleeps.
"""

from __future__ import annotations

from treadle import Workflows, sleep

app = Workflows()


@app.step
async def greeting(name: str) -> str:
    return f"hello, {name}"


@app.workflow
async def greet(name: str) -> str:
    return await greeting(name)


@app.workflow
async def nap(seconds: int) -> str:
    await greeting("before the nap")
    await sleep(f"{seconds}s")
    return await greeting("after the nap")

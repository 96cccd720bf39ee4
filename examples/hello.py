"""Two steps and a durable sleep: the smallest useful workflow."""

from __future__ import annotations

from treadle import Workflows, sleep

app = Workflows()


@app.step
async def greet(name: str) -> str:
    return f"hello, {name}"


@app.step
def shout(text: str) -> str:  # a sync step runs in a thread
    return text.upper() + "!"


@app.workflow
async def hello(name: str = "world") -> str:
    greeting = await greet(name)
    await sleep("1s")
    return await shout(greeting)

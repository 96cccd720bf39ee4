"""A step streams its progress while it works; the caller reads it live.

``python examples/streams.py`` starts the run and prints each token as the step
writes it (``run.stream("tokens")``), then the run's result. The chunks are durable:
``treadle runs stream RUN tokens`` prints them again later, from any process.
"""

from __future__ import annotations

import asyncio

from treadle import Workflows, get_writable

app = Workflows()

WORDS = ["durable", "streams", "survive", "crashes"]


@app.step
async def generate(prompt: str) -> str:
    """Stand-in for a model: one token at a time, each written to the stream."""
    async with get_writable("tokens") as tokens:  # closed when the block ends
        for word in WORDS:
            await tokens.write(word + " ")
            await tokens.flush()  # readers see it now, not when the step ends
    return " ".join(WORDS)


@app.step
async def summarize(text: str) -> dict[str, int]:
    progress = get_writable("progress")
    await progress.write({"stage": "counting", "done": 0})
    counts = {"words": len(text.split()), "letters": sum(c.isalpha() for c in text)}
    await progress.write({"stage": "counting", "done": 1})
    return counts


@app.workflow
async def answer(prompt: str = "tell me about streams") -> dict[str, int]:
    text = await generate(prompt)
    return await summarize(text)


async def main() -> None:
    async with app:
        run = await app.start(answer)
        async for token in run.stream("tokens"):  # live: ends when the stream closes
            print(token, end="", flush=True)
        print()
        print("progress:", [chunk async for chunk in run.stream("progress")])
        print("result:", await run.result(timeout=60))


if __name__ == "__main__":
    asyncio.run(main())

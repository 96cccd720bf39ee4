"""A real uvicorn server over ``create_app`` and an app whose workflows wait on webhooks.

Used by the webhook tests (issue 13 item 1). The server runs in the test's event
loop on 127.0.0.1 with an ephemeral port; HTTP goes through httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from treadle import (
    HmacSignature,
    StripeSignature,
    WebhookResponse,
    Workflows,
    create_hook,
    create_webhook,
    settings,
)
from treadle.serve.app import create_app
from treadle.serve.context import ServeContext
from treadle.world import contract, events

SECRET_ENV = "TREADLE_TEST_WEBHOOK_SECRET"
SECRET = "whsec_test-only-secret"
FAST = {
    "WORKFLOW_ORCHESTRATOR_LINGER_MS": 300,
    "WORKFLOW_ORCHESTRATOR_POLL_INTERVAL_MS": 200,
    "WORKFLOW_STEP_RETRY_DELAY_SECONDS": 0.05,
}


@contextlib.asynccontextmanager
async def serving(world: contract.World, **overrides: Any) -> AsyncIterator[str]:
    """``create_app`` over ``world`` under a real uvicorn on 127.0.0.1; yields its base URL."""
    ctx = ServeContext(world=world, settings=settings.load({}, **overrides))
    config = uvicorn.Config(
        create_app(ctx), host="127.0.0.1", port=0, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@dataclass
class WebhookApp:
    """An app with the test workflows; ``urls`` gets each webhook's URL as it is made."""

    app: Workflows
    world: contract.World
    urls: asyncio.Queue[str] = field(default_factory=asyncio.Queue)


def webhook_app(world: contract.World, public_url: str, **overrides: Any) -> WebhookApp:
    tuned = settings.load({}, **{**FAST, "TREADLE_PUBLIC_URL": public_url, **overrides})
    app = Workflows(world=world, settings_=tuned, worker=True)
    made = WebhookApp(app, world)

    @app.step
    async def announce(url: str) -> str:
        made.urls.put_nowait(url)
        return url

    @app.workflow
    async def callback(kind: str) -> dict[str, Any]:
        signature: HmacSignature | StripeSignature | None = None
        respond: WebhookResponse | None = None
        if kind == "hmac":
            signature = HmacSignature(header="X-Signature", secret_env=SECRET_ENV)
        elif kind == "stripe":
            signature = StripeSignature(secret_env=SECRET_ENV, tolerance_seconds=300)
        elif kind == "text-reply":
            respond = WebhookResponse(status=200, body="ok", headers={"X-Reply": "yes"})
        hook = create_webhook(signature=signature, respond_with=respond)
        announced = await announce(hook.url)
        request = await hook.request()
        return {"url": hook.url, "announced": announced, "request": request.model_dump(mode="json")}

    @app.workflow
    async def plain() -> Any:
        hook = create_hook()
        await announce(hook.token)
        return await hook.payload()

    return made


async def log_of(world: contract.World, run_id: str) -> list[events.LoggedEvent]:
    page = await world.events.list(run_id)
    return list(page.events)


async def waiting(
    world: contract.World, run_id: str, timeout: float = 20
) -> list[events.LoggedEvent]:
    """The run's log once it waits on the webhook: the step that announced the URL has
    completed (the pass after it only awaits the hook and writes nothing), so a refused
    call can be shown to add nothing."""
    done = asyncio.Event()

    def on_event(event: events.LoggedEvent) -> None:
        if event.type == "step_completed":
            done.set()

    sub = world.events.subscribe(run_id, 0, on_event, lambda exc: done.set())
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        sub.close()
    return await log_of(world, run_id)


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=10)

"""Workflows that wait on webhooks, and helpers to watch their runs' logs.

Used by the webhook tests (issue 13 item 1) over the real uvicorn server of
``tests/serve/conftest.py`` (``start_serve``): ``register(served.app)`` adds the
workflows to the app whose worker runs on the served World.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from treadle import (
    HmacSignature,
    StripeSignature,
    WebhookResponse,
    Workflows,
    create_hook,
    create_webhook,
)
from treadle.world import contract, events

SECRET_ENV = "TREADLE_TEST_WEBHOOK_SECRET"
SECRET = "whsec_test-only-secret"
# serve's own body limit, above the webhooks' default (1 MiB), so theirs is what refuses.
SERVE_LIMIT = {"TREADLE_SERVE_MAX_BODY_BYTES": 8 * 1024 * 1024}


@dataclass
class Flows:
    """``urls`` gets each webhook's URL (and a plain hook's token) as a step announces it."""

    urls: asyncio.Queue[str] = field(default_factory=asyncio.Queue)


def register(app: Workflows) -> Flows:
    flows = Flows()

    @app.step
    async def announce(url: str) -> str:
        flows.urls.put_nowait(url)
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
    async def expiring(seconds: float) -> Any:
        hook = create_webhook()
        await announce(hook.url)
        request = await hook.request(timeout=seconds)
        return None if request is None else request.body

    @app.workflow
    async def plain() -> Any:
        hook = create_hook()
        await announce(hook.token)
        return await hook.payload()

    return flows


async def log_of(world: contract.World, run_id: str) -> list[events.LoggedEvent]:
    out: list[events.LoggedEvent] = []
    after = 0
    while True:
        page = await world.events.list(run_id, after_slot=after)
        out.extend(page.events)
        if not page.has_more:
            return out
        after = page.cursor


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

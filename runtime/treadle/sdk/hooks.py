"""Hooks: durable promises resolved from outside by a token.

Subclass ``Hook`` (a pydantic model) to describe the payload; in a workflow,
``await Approval.wait(token=..., timeout="1d")`` returns the validated payload,
or None on timeout. ``app.resume_hook(token, payload)`` resolves it.

``create_hook()`` without a token mints an unguessable one (``HookHandle.token``);
a token you choose is as guessable as what it is made of. ``require_signature=True``
makes a resume carry ``treadle.hook_signature(token, key)`` (``treadle.hooktokens``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Self

from pydantic import BaseModel, JsonValue

from treadle import errors, hooktokens, limits
from treadle.replay import operations
from treadle.sdk import context
from treadle.sdk.durations import Duration, to_seconds
from treadle.serde_registry import register_annotations

MAX_TOKEN_RETENTION_SECONDS: Final = 366 * 86_400


class HookHandle:
    """A created hook: await ``payload()``; ``conflict()`` says at once if the token is taken.

    ``conflict()`` answers from the log, the same on every pass the run acts on: a
    live pass whose hook creation the World answers with ``hook_conflict`` is
    discarded before any of its other decisions is written, and the workflow is
    replayed with the conflict recorded (seed 003 "Hook conflicts"). A hook takes
    one payload; once it is recorded the token is free, so the run may wait on the
    same token again.
    """

    def __init__(self, op: operations.HookWait, token: str | None = None) -> None:
        self._op = op
        self._token = token if token is not None else hooktokens.bare(op.token)

    @property
    def token(self) -> str:
        """The token to resume with (without ``TREADLE_HOOK_TOKEN_NAMESPACE``'s prefix)."""
        return self._token

    def conflict(self) -> errors.HookConflictError | None:
        if not self._op.conflicted:
            return None
        return errors.HookConflictError(self._op.token, holder_run_id=self._op.conflict_holder)

    async def payload(self) -> JsonValue:
        result: JsonValue = await self._op.future
        return result

    def dispose(self) -> None:
        """Release the token early (it is released anyway when its payload is recorded
        or the run ends); the token may be used again, even later in the same pass."""
        replay = context.require_replay("Hook.dispose()")
        replay.dispose_hook(self._op)


def create_hook(
    token: str | None = None,
    *,
    metadata: JsonValue = None,
    require_signature: bool = False,
    force: bool = False,
    retain_token_for: Duration | None = None,
) -> HookHandle:
    """Create a hook in workflow code.

    Without ``token``, an unguessable one is minted (128 bits; ``HookHandle.token``;
    the same on every replay). A chosen token must be unique among live hooks and is
    only as secret as what it is made of: never derive one from data others know if
    a public endpoint resumes hooks; mint it, or ask for a signature.
    ``require_signature=True``: ``resume_hook`` must carry
    ``treadle.hook_signature(token, key)`` with the app's ``TREADLE_HOOK_KEY``.

    ``force=True`` takes ``token`` from another run holding it (docs/hooks.md): that
    run's await of its hook raises ``HookForceClaimedError``. ``retain_token_for``
    (a duration) keeps the token reserved for that long after this run ends, so a
    late ``resume_hook`` hears ``HookRunEnded`` instead of reaching a new holder;
    ``dispose()`` releases it early. Both need a spec 9 run.
    """
    if token is not None:
        limits.check_hook_token(token)
    if force and token is None:
        raise ValueError("create_hook(force=True) needs a token: a minted token is never held")
    if not isinstance(force, bool):
        raise ValueError(f"create_hook(force=...) must be a bool, not {type(force).__name__}")
    retain = None
    if retain_token_for is not None:
        retain = to_seconds(retain_token_for, what="create_hook(retain_token_for=...)")
        if not 0 < retain <= MAX_TOKEN_RETENTION_SECONDS:
            raise ValueError(
                f"create_hook(retain_token_for=...) must be more than 0 and at most 366 days, "
                f"got {retain_token_for!r}"
            )
    if metadata is not None:
        limits.check_value(metadata, "hook metadata")
    replay = context.require_replay("create_hook()")
    spec = replay.spec_version
    if (force or retain is not None) and spec is not None and spec < 9:
        feature = "hook force-claim" if force else "hook token retention"
        raise errors.FeatureNeedsSpec9(feature, run_id=replay.run_id, spec_version=spec)
    op = replay.create_hook(
        token,
        hooktokens.wrap_metadata(metadata, require_signature),
        namespace=limits.active().hook_token_namespace,
    )
    op.force = force
    if retain is not None:
        now = datetime.fromtimestamp(replay.loop.time(), tz=UTC)
        op.token_retention_until = now + timedelta(seconds=retain)
    return HookHandle(op, token)


class Hook(BaseModel):
    """Base class of a hook's payload model (each subclass, and the classes its fields
    name, is declared to ``serde``: see ``treadle.serde_registry``)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        register_annotations(cls)

    @classmethod
    async def wait(
        cls, *, token: str, timeout: Duration | None = None, require_signature: bool = False
    ) -> Self | None:
        """Wait for the payload sent to ``token``; None if ``timeout`` passes first.
        (For a minted token, use ``create_hook()`` and ``model_validate`` its payload.)"""
        hook = create_hook(token, require_signature=require_signature)
        if timeout is None:
            return cls.model_validate(await hook.payload())
        seconds = to_seconds(timeout, what="hook timeout")
        try:
            data: Any = await asyncio.wait_for(hook.payload(), seconds)
        except TimeoutError:
            hook.dispose()
            return None
        return cls.model_validate(data)

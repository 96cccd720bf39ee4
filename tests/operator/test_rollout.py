"""The World's latest follows the operator's across a rollback (review R12 with tpl's reuse)."""

from __future__ import annotations

from treadle.testing.memory import MemoryBackend, MemoryWorld
from treadle_operator import rollout


async def test_a_rolled_back_revision_is_promoted_again_over_the_bad_one() -> None:
    """Revision a (good), then b (bad) made latest; a rollback reuses a, promoted before:
    the World's latest must become a again, or start_on_latest chains land on b."""
    world = await MemoryWorld(MemoryBackend()).open()
    try:
        for rev in ("rev-a", "rev-b"):
            await world.deployments.register(rev, catalogue={})
        own = frozenset({"rev-a", "rev-b"})
        await rollout.promote(world, "rev-a", own)
        await rollout.promote(world, "rev-b", own)
        assert await world.deployments.latest() == "rev-b"
        await rollout.promote(world, "rev-a", own)  # the rollback
        assert await world.deployments.latest() == "rev-a"
    finally:
        await world.close()


async def test_another_deployments_newer_revision_is_left_latest() -> None:
    """Two WorkflowDeployments on one World do not take turns promoting every tick."""
    world = await MemoryWorld(MemoryBackend()).open()
    try:
        for rev in ("shop-1", "billing-1"):
            await world.deployments.register(rev, catalogue={})
        await rollout.promote(world, "shop-1", frozenset({"shop-1"}))
        await rollout.promote(world, "billing-1", frozenset({"billing-1"}))
        await rollout.promote(world, "shop-1", frozenset({"shop-1"}))  # shop's next tick
        assert await world.deployments.latest() == "billing-1"
    finally:
        await world.close()

"""A small app whose workflow, step and Hook annotations declare ``annotated_types``.

Being an app module, its own module-level dataclasses and models are declared too
(``Local``, never annotated), but a class it only re-exports (``Unnamed``) is not.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from treadle import Hook, Workflows

from .annotated_types import (
    BesideAnUnresolvable,
    Branch,
    InDict,
    InList,
    InOptional,
    InTuple,
    Order,
    Returned,
    Tagged,
    Unnamed,
)
from .annotated_types import InHookField as InHookField

if TYPE_CHECKING:
    from typing_only_module import OnlyForTypeCheckers  # type: ignore[import-not-found]

__all__ = ["Unnamed"]

app = Workflows(worker=False)


@dataclasses.dataclass
class Local:
    """Defined in the app's module, named by no annotation."""

    n: int


class Signed(Hook):
    by: InHookField


@app.step
async def price(
    order: Order, extra: dict[str, InDict], maybe: InOptional | None = None
) -> Returned:
    return Returned(total=len(order.lines))


@app.workflow
async def shop(
    items: list[InList], pair: tuple[InTuple, ...], note: Tagged, tree: Branch
) -> Returned | None:
    return None


@app.step
async def partly(ghost: OnlyForTypeCheckers, real: BesideAnUnresolvable) -> None:
    return None


def helper() -> None:
    """Not a class: a tag naming it is refused."""

"""Value types of ``test_safe_decoding``: declared only by the annotations that name them.

No workflow, step or Hook lives here, so nothing in this module decodes unless a
workflow, step or Hook annotation (or a field of one of those classes) names it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal

from pydantic import BaseModel


@dataclasses.dataclass(frozen=True)
class Item:
    sku: str
    qty: int


class Customer(BaseModel):
    name: str
    since: dt.date | None = None


@dataclasses.dataclass
class Basket:
    items: list[Item]
    customer: Customer
    note: str | None = None


@dataclasses.dataclass
class Quote:
    total: Decimal
    lines: tuple[Item, ...]
    by_sku: dict[str, Item]


@dataclasses.dataclass
class Gift:
    """Named only as a raw hook's expected payload, through ``Optional``."""

    to: str

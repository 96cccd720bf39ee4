"""Classes that only annotations (in ``declared_app``) or ``register_types`` declare.

This module defines no workflow, step or Hook, so it is not an app module: a
class here decodes only if something names it (security.md H1).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated

from pydantic import BaseModel


@dataclasses.dataclass
class Leaf:
    """Named only as a field of ``Branch`` (a nested dataclass field)."""

    name: str


@dataclasses.dataclass
class Branch:
    leaves: list[Leaf]
    when: dt.date | None = None


@dataclasses.dataclass
class InList:
    n: int


@dataclasses.dataclass
class InDict:
    n: int


@dataclasses.dataclass
class InOptional:
    n: int


@dataclasses.dataclass
class InTuple:
    n: int


@dataclasses.dataclass
class InAnnotated:
    n: int


@dataclasses.dataclass
class FromModelField:
    """Named only by a field of the pydantic model ``Order``."""

    sku: str


class Order(BaseModel):
    number: str
    lines: list[FromModelField]


@dataclasses.dataclass
class Returned:
    total: int


@dataclasses.dataclass
class InHookField:
    who: str


@dataclasses.dataclass
class BesideAnUnresolvable:
    """Named by a parameter beside one whose annotation never resolves."""

    n: int


@dataclasses.dataclass
class Unnamed:
    """Named by nothing: stays undeclared."""

    n: int


@dataclasses.dataclass
class Explicit:
    """Declared only by ``treadle.register_types`` in the test."""

    n: int


Tagged = Annotated[InAnnotated, "a note"]

"""``serde.decode`` never imports or calls a name found in the data (security.md H1).

A ``{"$t": "dataclass" | "model", "cls": "module:qualname"}`` tag used to be
imported and called: ``subprocess:Popen`` ran a command on any worker. Now a tag
decodes only to a class the app declares (``treadle.serde_registry``); any other
name is a ``SerializationError`` naming the class and where the value sits, with
nothing imported and nothing run. This module defines no workflow, step or Hook,
so its own classes are declared only when a test registers them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from treadle import SerializationError, register_types, serde, serde_registry
from treadle.sdk import functions

from . import annotated_types as at
from . import declared_app

GADGETS = ["subprocess:Popen", "os:system", "builtins:eval", "builtins:exec"]


def _children() -> set[int]:
    """The pids whose parent is this process (read from /proc)."""
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            found.add(int(entry.name))
    return found


def _fields(gadget: str, marker: Path) -> dict[str, Any]:
    """The arguments that would make ``gadget`` create ``marker`` if it were called."""
    if gadget == "subprocess:Popen":
        return {"args": ["touch", str(marker)]}
    if gadget == "os:system":
        return {"command": f"touch {marker}"}
    return {"source": f"open({str(marker)!r}, 'w').close()"}


@pytest.mark.parametrize("tag", ["dataclass", "model"])
@pytest.mark.parametrize("gadget", GADGETS)
def test_a_tag_naming_a_gadget_is_refused_and_nothing_runs(
    tag: str, gadget: str, tmp_path: Path
) -> None:
    """H1's evidence: the Popen tag ran ``touch MARKER``; now it is a clear error."""
    marker = tmp_path / "MARKER"
    data = {"order": [1, {"$t": tag, "cls": gadget, "v": _fields(gadget, marker)}]}
    before = _children()
    with pytest.raises(SerializationError) as caught:
        serde.decode(data)
    assert caught.value.path == "value.order[1]"
    assert repr(gadget) in caught.value.reason
    assert "not imported or called" in caught.value.reason
    assert "\n" not in str(caught.value)
    assert not marker.exists()
    assert _children() <= before


def test_a_gadget_as_a_dict_key_or_inside_a_tuple_is_refused_with_its_path(
    tmp_path: Path,
) -> None:
    """The review's ``{"$t":"dict","v":[[<pathlib:Path tag>, 1]]}`` built a PosixPath key."""
    key = {"$t": "dataclass", "cls": "pathlib:Path", "v": {}}
    with pytest.raises(SerializationError, match=r"^value\[0\]\[0\]: .*'pathlib:Path'"):
        serde.decode({"$t": "dict", "v": [[key, 1]]})
    inner = {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": ["true"]}}
    with pytest.raises(SerializationError, match=r"^value\.a\[2\]: "):
        serde.decode({"a": {"$t": "tuple", "v": [0, 1, inner]}})


@pytest.mark.parametrize("tag", ["dataclass", "model"])
def test_a_tag_naming_a_module_with_import_side_effects_imports_nothing(
    tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H1: ``{"$t":"model","cls":"antigravity:x"}`` imported the module before failing."""
    marker = tmp_path / "IMPORTED"
    name = f"treadle_h1_gadget_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "import dataclasses, pydantic\n"
        f"open({str(marker)!r}, 'w').close()\n"
        "@dataclasses.dataclass\nclass Thing:\n    n: int = 0\n"
        "class Model(pydantic.BaseModel):\n    n: int = 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    cls = "Thing" if tag == "dataclass" else "Model"
    with pytest.raises(SerializationError, match=rf"'{name}:{cls}'.*not imported or called"):
        serde.decode({"$t": tag, "cls": f"{name}:{cls}", "v": {"n": 1}})
    assert name not in sys.modules
    assert not marker.exists()
    # The gadget is live: importing the module (what the old decoder did) runs it.
    try:
        importlib.import_module(name)
        assert marker.exists()
    finally:
        sys.modules.pop(name, None)


def test_a_dataclass_of_a_loaded_library_module_is_refused() -> None:
    """Being importable, or even imported, declares nothing: ``treadle.limits:Limits`` is a
    real dataclass in a loaded module, yet the app never named it."""
    assert dataclasses.is_dataclass(sys.modules["treadle.limits"].Limits)
    with pytest.raises(SerializationError, match=r"'treadle\.limits:Limits'"):
        serde.decode({"$t": "dataclass", "cls": "treadle.limits:Limits", "v": {}})


def test_annotations_declare_classes_through_containers_and_fields() -> None:
    """Workflow and step parameter and return annotations, walked: ``list[X]``,
    ``dict[str, X]``, ``X | None``, ``tuple[X, ...]``, ``Annotated``, dataclass fields,
    pydantic fields and a Hook's fields."""
    assert declared_app.app.workflows  # the app is loaded: its decorators ran
    for cls in (
        at.InList,
        at.InDict,
        at.InOptional,
        at.InTuple,
        at.InAnnotated,
        at.Branch,
        at.Leaf,
        at.Order,
        at.FromModelField,
        at.Returned,
        at.InHookField,
        at.BesideAnUnresolvable,  # beside an annotation that only resolves for type checkers
    ):
        assert serde_registry.lookup(serde_registry.class_path(cls)) is cls, cls
    tree = at.Branch(leaves=[at.Leaf("a"), at.Leaf("b")], when=dt.date(2026, 1, 2))
    order = at.Order(number="o-1", lines=[at.FromModelField(sku="tea")])
    value = {"tree": tree, "order": order, "pair": (at.InTuple(1), None)}
    assert serde.decode(serde.encode(value)) == value


def test_a_class_no_annotation_names_is_refused_and_cannot_be_encoded() -> None:
    """``annotated_types`` is not an app module, so its unnamed class stays undeclared;
    encode refuses it too, so nothing a worker could not read is ever written."""
    path = serde_registry.class_path(at.Unnamed)
    with pytest.raises(SerializationError, match=f"'{path}'"):
        serde.decode({"$t": "dataclass", "cls": path, "v": {"n": 1}})
    with pytest.raises(SerializationError, match=r"^step s result: .*register_types\(Unnamed\)"):
        serde.encode(at.Unnamed(1), "step s result")


def test_the_apps_own_module_level_classes_decode_but_not_what_it_reexports() -> None:
    """The app-module rule: ``declared_app.Local`` is defined there (declared); ``Unnamed``
    is only imported there (its ``__module__`` is elsewhere); a function is no class."""
    local = declared_app.Local(3)
    assert serde.decode(serde.encode(local)) == local
    for name in ("Unnamed", "helper", "app", "Local.__init__"):
        with pytest.raises(SerializationError, match=f"'tests.serde.declared_app:{name}'"):
            serde.decode({"$t": "dataclass", "cls": f"tests.serde.declared_app:{name}", "v": {}})


@dataclasses.dataclass
class Listed:
    n: int
    at: dt.datetime


class ListedModel(BaseModel):
    n: int


@dataclasses.dataclass
class NeverListed:
    n: int


@dataclasses.dataclass
class KindDataclass:
    n: int
    at: dt.datetime | None


class KindModel(BaseModel):
    n: int


def test_register_types_declares_and_values_already_in_logs_still_decode() -> None:
    """Compatibility: the stored format is unchanged (``"cls": "module:qualname"``), so a
    value written before this change decodes once its class is declared."""
    stored = {
        "$t": "dataclass",
        "cls": "tests.serde.test_safe_decoding:Listed",
        "v": {"n": 1, "at": {"$t": "datetime", "v": "2026-01-02T03:04:05+00:00"}},
    }
    with pytest.raises(SerializationError, match="Listed"):
        serde.decode(stored)
    register_types(Listed, ListedModel, at.Explicit)
    assert serde.decode(stored) == Listed(1, dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    model = {"$t": "model", "cls": "tests.serde.test_safe_decoding:ListedModel", "v": {"n": 2}}
    assert serde.decode(model) == ListedModel(n=2)
    assert serde.encode(ListedModel(n=2)) == model
    assert serde.decode(serde.encode(at.Explicit(4))) == at.Explicit(4)
    with pytest.raises(SerializationError, match="NeverListed"):
        serde.encode(NeverListed(1))


def test_register_types_refuses_what_is_not_a_model_or_dataclass() -> None:
    with pytest.raises(TypeError, match="pydantic models and dataclasses"):
        register_types(int)

    @dataclasses.dataclass
    class Inner:
        n: int

    with pytest.raises(TypeError, match="inside a function"):
        register_types(Inner)


def test_a_tag_kind_that_does_not_match_the_declared_class_is_refused() -> None:
    """The old ``assert issubclass(cls, BaseModel)`` vanished under ``python -O``; these are
    real checks now."""
    register_types(KindDataclass, KindModel)
    dc = "tests.serde.test_safe_decoding:KindDataclass"
    model = "tests.serde.test_safe_decoding:KindModel"
    with pytest.raises(SerializationError, match="is not a pydantic model"):
        serde.decode({"$t": "model", "cls": dc, "v": {"n": 1}})
    with pytest.raises(SerializationError, match="is not a dataclass"):
        serde.decode({"$t": "dataclass", "cls": model, "v": {"n": 1}})
    with pytest.raises(SerializationError, match=r"cannot rebuild .*unexpected keyword"):
        serde.decode({"$t": "dataclass", "cls": dc, "v": {"n": 1, "at": None, "x": 2}})
    with pytest.raises(SerializationError, match=r"cannot rebuild .*validation error"):
        serde.decode({"$t": "model", "cls": model, "v": {"n": "many"}})
    with pytest.raises(SerializationError, match="are not an object"):
        serde.decode({"$t": "model", "cls": model, "v": [1]})
    with pytest.raises(SerializationError, match="names no class"):
        serde.decode({"$t": "model", "v": {}})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"$t": "timedelta", "v": [1]}, "must be \\[days, seconds, microseconds\\]"),
        ({"$t": "dict"}, "holds NoneType, not a list"),
        ({"$t": "dict", "v": [[1, 2, 3]]}, "key, value\\] pairs"),
        ({"$t": "tuple", "v": "ab"}, "not a list"),
        ({"$t": "bytes", "v": "!!!"}, "malformed 'bytes'"),
        ({"$t": "datetime", "v": "yesterday"}, "malformed 'datetime'"),
        ({"$t": "set", "v": [{"a": 1}]}, "malformed 'set'"),
        ({"$t": "nope", "v": 1}, "unknown tag 'nope'"),
    ],
)
def test_malformed_tagged_values_are_one_line_errors_with_their_path(
    data: dict[str, Any], reason: str
) -> None:
    """security.md "Bad inputs tried": malformed ``$t`` values gave bare AssertionErrors,
    OverflowErrors or a silent ``b''``."""
    with pytest.raises(SerializationError, match=rf"^input argument 'x'\.y: .*{reason}"):
        functions.decode_arguments({"args": [], "kwargs": {"x": {"y": data}}})


def test_decode_arguments_names_the_argument_holding_a_gadget() -> None:
    gadget = {"$t": "dataclass", "cls": "subprocess:Popen", "v": {"args": ["true"]}}
    with pytest.raises(SerializationError, match=r"^step s input argument 1: .*Popen"):
        functions.decode_arguments({"args": [1, gadget], "kwargs": {}}, "step s input")
    with pytest.raises(SerializationError, match="not an args/kwargs object"):
        functions.decode_arguments({"args": {}, "kwargs": {}})

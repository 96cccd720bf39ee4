"""``treadle operator`` and ``treadle crds``: the Kubernetes side, from ``treadle_operator``.

Both need the ``operator`` extra (kopf, kubernetes-asyncio); without it they
say so in one line instead of failing on an import.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from pathlib import Path
from types import ModuleType

from treadle.cli import common


def _operator_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"treadle_operator.{name}")
    except ModuleNotFoundError as exc:
        raise common.UsageError(
            f"`treadle {name}` needs the operator extra ({exc.name} is missing): "
            "pip install 'treadle[operator]'"
        ) from None


async def cmd_operator(args: argparse.Namespace) -> int:
    main = _operator_module("main")
    errors = _operator_module("errors")
    try:
        await main.run(args.namespace or ())
    except errors.OperatorError as exc:
        raise common.UsageError(str(exc)) from None
    return common.OK


async def cmd_crds(args: argparse.Namespace) -> int:
    return await asyncio.to_thread(_crds, args)


def _crds(args: argparse.Namespace) -> int:
    crds = _operator_module("crds")
    root = Path(args.root)
    if not root.is_dir():
        raise common.UsageError(f"--root {root} is not a directory")
    if args.check:
        stale = crds.stale(root)
        for path in stale:
            print(f"stale: {path} (run `treadle crds` and commit the result)", file=sys.stderr)
        return common.FAILED if stale else common.OK
    for path in crds.write(root):
        print(f"wrote {path}")
    return common.OK

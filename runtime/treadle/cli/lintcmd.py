"""``treadle lint PATH...``: the determinism linter's command (docs/lint.md).

Prints one line per finding (``file:line:col: CODE message; replacement``) or, with
``--format json``, one JSON object ``{"findings": [...], "files": N}``. Exit 0 when
nothing was found, 1 on findings, 2 for a path that does not exist or a file that does
not parse (one ``treadle: error:`` line naming the file and line).
"""

from __future__ import annotations

import argparse
import asyncio

from treadle import errors, lint
from treadle.cli import common, output

FINDINGS = 1


async def cmd_lint(args: argparse.Namespace) -> int:
    try:
        findings, files = await asyncio.to_thread(lint.lint_paths, args.paths)
    except errors.LintInputInvalid as exc:
        raise common.UsageError(str(exc)) from None
    if args.format == "json":
        output.emit_json({"findings": [f.as_dict() for f in findings], "files": files})
    else:
        for finding in findings:
            output.out(finding.text())
        noun = "file" if files == 1 else "files"
        output.err(f"{len(findings)} finding(s) in {files} {noun}")
    return FINDINGS if findings else common.OK

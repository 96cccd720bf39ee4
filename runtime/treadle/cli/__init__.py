"""The ``treadle`` command line: ``main(argv)`` parses, runs one command, and maps
every mistake a user can make to one ``treadle: error: ...`` line and exit 2.

Exit codes: 0 done; 1 a run failed, was cancelled or outlived ``--timeout``
(or an unexpected error); 2 a usage error; 130 interrupted; 141 the reader of
stdout went away (``treadle runs list | head``: quiet, as other CLIs are).
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from treadle import errors
from treadle.cli import common, output
from treadle.cli.parser import build_parser
from treadle.telemetry import logs

__all__ = ["main"]

# What a user's request can run into in the World: each one line, exit 2.
USER_ERRORS: tuple[type[BaseException], ...] = (
    errors.SettingsError,
    errors.SerializationError,
    errors.WorkflowNotFound,
    errors.RunNotFound,
    errors.RunExpired,
    errors.HookNotFound,
    errors.HookSignatureInvalid,
    errors.DeadLetterNotFound,
    errors.StorageUnavailable,
)


def main(argv: list[str] | None = None) -> int:
    """Run the ``treadle`` command ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else common.USAGE
    handler: Callable[..., Coroutine[Any, Any, int]] = args.handler
    try:
        logs.configure_logging()  # TREADLE_LOG_FORMAT=json: one JSON object per log line
        return asyncio.run(handler(args))
    except common.UsageError as exc:
        output.error_line(str(exc))
        return common.USAGE
    except USER_ERRORS as exc:
        output.error_line(str(exc))
        return common.USAGE
    except errors.TreadleError as exc:
        output.error_line(f"{type(exc).__name__}: {exc}")
        return common.FAILED
    except KeyboardInterrupt:
        output.error_line("interrupted")
        return common.INTERRUPTED
    except BrokenPipeError:
        # Nothing left to print to: silence the flush at exit too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return common.BROKEN_PIPE
    except UnicodeError as exc:  # e.g. non-UTF-8 bytes in an argument (lone surrogates)
        reason = getattr(exc, "reason", None) or type(exc).__name__
        output.error_line(
            f"a value is not valid UTF-8 text ({reason}); pass text, or escape the bytes"
        )
        return common.USAGE
    except RecursionError:
        output.error_line("a value nests too deep to handle (see TREADLE_MAX_VALUE_DEPTH)")
        return common.USAGE
    except Exception as exc:
        if os.environ.get("TREADLE_DEBUG"):
            traceback.print_exc()
        output.error_line(
            f"unexpected {type(exc).__name__}: {exc} (set TREADLE_DEBUG=1 for the traceback)"
        )
        return common.FAILED

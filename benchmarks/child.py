"""One scenario of one system, in a fresh process: ``python -m benchmarks.child SYSTEM SCENARIO
PARAMS.json``. Prints one line ``BENCH-RESULT {json}`` on stdout: the metrics, or
``unsupported`` with the reason, or ``error``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any

from benchmarks.systems import Unsupported

RESULT_PREFIX = "BENCH-RESULT "
MODULES = {
    "treadle": "benchmarks.systems.treadle_bench",
    "dbos": "benchmarks.systems.dbos_bench",
    "vercel": "benchmarks.systems.vercel_bench",
}


def main(argv: list[str]) -> int:
    system, scenario, params_path = argv
    params: dict[str, Any] = json.loads(Path(params_path).read_text())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        module = importlib.import_module(MODULES[system])
        result = asyncio.run(module.run(scenario, params))
        code = 0
    except Unsupported as exc:
        result, code = {"unsupported": str(exc)}, 0
    except ModuleNotFoundError as exc:
        result, code = {"error": f"{exc.name} is not installed (pip install -e '.[bench]')"}, 1
    except Exception as exc:
        traceback.print_exc()
        result, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The determinism linter's rules (issue 17 item 9, docs/lint.md): each rule found in a
workflow (and only there), import aliases followed, local names shadowing, and the
``# treadle: ignore[CODE]`` suppression. Sources are linted as text: nothing imported."""

from __future__ import annotations

import textwrap

import pytest

from treadle import lint
from treadle.errors import LintInputInvalid


def codes(body: str, *, header: str = "", decorator: str = "@app.workflow") -> list[str]:
    """The codes found in a workflow whose body is ``body`` (imports in ``header``)."""
    source = textwrap.dedent(header) + "\n" + decorator + "\nasync def flow():\n"
    source += textwrap.indent(textwrap.dedent(body), "    ")
    return [f.code for f in lint.lint_source(source, "flow.py")]


# (rule code, header, a workflow body that breaks it, a body that does not)
CASES = [
    ("TRD101", "import time", "t = time.time()", "t = treadle.now()"),
    ("TRD101", "import time", "t = time.monotonic()", "t = treadle.now()"),
    ("TRD102", "import time", "time.sleep(1)", "await treadle.sleep(1)"),
    ("TRD103", "import datetime", "d = datetime.datetime.now()", "d = treadle.now()"),
    (
        "TRD103",
        "from datetime import datetime",
        "d = datetime.utcnow()",
        "d = datetime(2020, 1, 1)",
    ),
    ("TRD103", "from datetime import date", "d = date.today()", "d = date(2020, 1, 1)"),
    ("TRD104", "import random", "x = random.random()", "x = treadle.random()"),
    ("TRD104", "import random", "x = random.choice([1, 2])", "x = [1, 2][0]"),
    ("TRD105", "import uuid", "u = uuid.uuid4()", "u = treadle.uuid4()"),
    ("TRD105", "import uuid", "u = uuid.uuid1()", "u = uuid.uuid5(uuid.NAMESPACE_DNS, 'x')"),
    ("TRD106", "import os", "b = os.urandom(8)", "b = os.path.join('a', 'b')"),
    ("TRD106", "import secrets", "t = secrets.token_hex(8)", "t = 'fixed'"),
    ("TRD107", "import asyncio", "await asyncio.sleep(1)", "await treadle.sleep(1)"),
    ("TRD201", "import requests", "r = requests.get('http://x')", "r = await fetch('http://x')"),
    ("TRD201", "import httpx", "r = httpx.get('http://x')", "r = await fetch('http://x')"),
    ("TRD201", "import aiohttp", "s = aiohttp.ClientSession()", "s = None"),
    ("TRD201", "import socket", "s = socket.socket()", "s = None"),
    ("TRD201", "import urllib.request", "urllib.request.urlopen('http://x')", "pass"),
    ("TRD202", "", "f = open('x')", "f = await read('x')"),
    ("TRD202", "from pathlib import Path", "t = Path('x').read_text()", "p = Path('x').name"),
    ("TRD202", "import pathlib", "f = pathlib.Path('x').open()", "p = pathlib.Path('x')"),
    ("TRD203", "import threading", "threading.Thread(target=print).start()", "pass"),
    ("TRD203", "import asyncio", "await asyncio.to_thread(print)", "await asyncio.gather()"),
    ("TRD203", "import concurrent.futures", "concurrent.futures.ThreadPoolExecutor()", "pass"),
    ("TRD203", "import asyncio", "await loop.run_in_executor(None, print)", "await run(print)"),
    ("TRD301", "COUNT = 0", "global COUNT\nCOUNT = 1", "count = 1"),
    ("TRD302", "CACHE = {}", "CACHE['k'] = 1", "cache = {}\ncache['k'] = 1"),
    ("TRD302", "SEEN = []", "SEEN.append(1)", "seen = []\nseen.append(1)"),
    ("TRD302", "import os", "os.environ['X'] = '1'", "x = os.environ.get('X')"),
]


@pytest.mark.parametrize(("code", "header", "bad", "good"), CASES)
def test_each_rule_finds_its_call_and_not_the_replacement(
    code: str, header: str, bad: str, good: str
) -> None:
    prefix = "import treadle\n" + header
    assert code in codes(bad, header=prefix), bad
    assert codes(good, header=prefix) == [], good


def test_nonlocal_is_reported() -> None:
    source = textwrap.dedent(
        """
        @app.workflow
        async def flow():
            n = 0
            def bump():
                nonlocal n
                n += 1
            bump()
        """
    )
    assert [f.code for f in lint.lint_source(source)] == ["TRD301"]


def test_import_aliases_are_followed() -> None:
    assert codes("x = t()", header="from time import time as t") == ["TRD101"]
    assert codes("x = dt.datetime.now()", header="import datetime as dt") == ["TRD103"]
    assert codes("x = r.randint(1, 2)", header="import random as r") == ["TRD104"]
    assert codes("x = randint(1, 2)", header="from random import randint") == ["TRD104"]
    assert codes("x = u4()", header="from uuid import uuid4 as u4") == ["TRD105"]
    assert codes("x = futures.ThreadPoolExecutor()", header="from concurrent import futures") == [
        "TRD203"
    ]
    # treadle's own names under the library's: not the stdlib module
    assert codes("x = random()", header="from treadle import random") == []
    assert codes("await sleep(1)", header="from treadle import sleep") == []
    # an import inside the workflow counts too
    assert codes("import time as clock\nx = clock.time()") == ["TRD101"]


def test_a_local_name_shadows_the_module_one() -> None:
    assert codes("random = make_rng()\nx = random.random()", header="import random") == []
    source = "import time\n@app.workflow\nasync def flow(time):\n    return time.time()\n"
    assert lint.lint_source(source) == []


def test_only_workflow_functions_are_checked() -> None:
    source = textwrap.dedent(
        """
        import time

        @app.step
        async def step_one():
            return time.time()

        async def helper():
            return time.time()

        @app.workflow(name="named")
        async def flow():
            return time.time()

        @deep.registry.workflow
        async def other():
            return time.time()

        class Holder:
            @app.workflow
            async def method(self):
                time.sleep(1)
        """
    )
    found = lint.lint_source(source, "m.py")
    assert [(f.code, f.workflow, f.line) for f in found] == [
        ("TRD101", "named", 13),
        ("TRD101", "other", 17),
        ("TRD102", "method", 22),
    ]


def test_a_finding_names_file_line_column_code_and_replacement() -> None:
    source = "import time\n@app.workflow\nasync def flow():\n    x = 1; y = time.time()\n"
    (finding,) = lint.lint_source(source, "pkg/flow.py")
    assert (finding.path, finding.line, finding.col, finding.code) == (
        "pkg/flow.py",
        4,
        16,
        "TRD101",
    )
    assert finding.replacement == "use treadle.now()"
    assert finding.text() == (
        "pkg/flow.py:4:16: TRD101 time.time() reads the real clock in workflow 'flow'; "
        "use treadle.now()"
    )
    assert finding.as_dict()["workflow"] == "flow"


def test_suppression_comments() -> None:
    header = "import time\nimport random"
    assert codes("x = time.time()  # treadle: ignore[TRD101]", header=header) == []
    assert codes("x = time.time()  # treadle: ignore[TRD104]", header=header) == ["TRD101"]
    assert codes("x = time.time() + random.random()  # treadle: ignore[TRD101, TRD104]",
                 header=header) == []  # fmt: skip
    assert codes("x = time.time()  # treadle: ignore", header=header) == []
    assert codes("# treadle: ignore[TRD101]\nx = time.time()", header=header) == ["TRD101"]


def test_a_syntax_error_is_one_line_naming_file_and_line() -> None:
    with pytest.raises(LintInputInvalid) as caught:
        lint.lint_source("def broken(:\n    pass\n", "bad.py")
    assert str(caught.value).startswith("bad.py:1: syntax error")
    assert "\n" not in str(caught.value)

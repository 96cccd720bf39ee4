"""The linter's rules: what each code reports and what to write instead.

A call is matched by its *qualified name*, the dotted name it resolves to once import
aliases are followed (``from time import time as t`` makes ``t()`` ``time.time``;
``import datetime as dt`` makes ``dt.datetime.now()`` ``datetime.datetime.now``). A rule
matches a name exactly (``names``) or a whole module (``prefixes``: ``random.`` takes
``random.randint`` and ``random.Random``). Some rules match a method name on any
receiver (``methods``: ``.read_text()``, ``.run_in_executor()``), which needs no type.

Used by ``treadle.lint.analyzer``; documented in docs/lint.md (keep the two alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NOW = "treadle.now()"
STEP = "move it into a step (@app.step), whose result the log records"


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    replacement: str
    names: frozenset[str] = field(default_factory=frozenset)
    prefixes: tuple[str, ...] = ()
    methods: frozenset[str] = field(default_factory=frozenset)

    def matches(self, qualified: str) -> bool:
        return qualified in self.names or any(qualified.startswith(p) for p in self.prefixes)


CLOCK = Rule(
    "TRD101",
    "reads the real clock",
    NOW,
    names=frozenset(
        {
            "time.time",
            "time.time_ns",
            "time.monotonic",
            "time.monotonic_ns",
            "time.perf_counter",
            "time.perf_counter_ns",
            "time.process_time",
            "time.localtime",
            "time.gmtime",
            "time.ctime",
            "time.asctime",
            "time.strftime",
        }
    ),
)
BLOCKING_SLEEP = Rule(
    "TRD102", "sleeps in real time (and blocks the loop)", "await treadle.sleep(...)",
    names=frozenset({"time.sleep"}),
)  # fmt: skip
DATETIME_NOW = Rule(
    "TRD103",
    "reads the real clock",
    NOW,
    names=frozenset(
        {
            "datetime.datetime.now",
            "datetime.datetime.utcnow",
            "datetime.datetime.today",
            "datetime.date.today",
        }
    ),
)
RANDOM = Rule(
    "TRD104", "draws real randomness", "treadle.random()", prefixes=("random.", "numpy.random.")
)
UUID = Rule(
    "TRD105",
    "makes an id from the clock or real randomness",
    "treadle.uuid4()",
    names=frozenset({"uuid.uuid1", "uuid.uuid4"}),
)
ENTROPY = Rule(
    "TRD106",
    "reads the system's entropy",
    f"treadle.random() / treadle.uuid4(), or {STEP}",
    names=frozenset({"os.urandom", "os.getrandom"}),
    prefixes=("secrets.",),
)
ASYNCIO_SLEEP = Rule(
    "TRD107",
    "is asyncio's sleep, not treadle's",
    "await treadle.sleep(...) (durable, takes '1h 30m' or until=)",
    names=frozenset({"asyncio.sleep"}),
)
NETWORK = Rule(
    "TRD201",
    "does network I/O",
    STEP,
    prefixes=(
        "socket.",
        "requests.",
        "httpx.",
        "aiohttp.",
        "urllib.request.",
        "urllib3.",
        "http.client.",
        "websockets.",
        "grpc.",
        "smtplib.",
        "ftplib.",
    ),
    names=frozenset({"asyncio.open_connection", "asyncio.start_server"}),
)
FILES = Rule(
    "TRD202",
    "does file I/O",
    STEP,
    names=frozenset({"open", "io.open", "os.open", "os.listdir", "os.scandir", "os.remove"}),
    prefixes=("shutil.", "tempfile."),
    methods=frozenset({"read_text", "write_text", "read_bytes", "write_bytes"}),
)
THREADS = Rule(
    "TRD203",
    "runs code on a thread, a process or an executor",
    STEP,
    names=frozenset({"asyncio.to_thread", "os.system", "os.fork", "os.popen"}),
    prefixes=("threading.", "concurrent.futures.", "multiprocessing.", "_thread.", "subprocess."),
    methods=frozenset({"run_in_executor"}),
)
GLOBAL_STATEMENT = Rule(
    "TRD301",
    "rebinds a variable outside the workflow (global/nonlocal)",
    "keep workflow state in local variables; pass data in and return it",
)
MODULE_MUTATION = Rule(
    "TRD302",
    "mutates a module-level object, which a replay in another process does not see",
    "keep workflow state in local variables; pass data in and return it",
)

CALL_RULES: tuple[Rule, ...] = (
    CLOCK,
    BLOCKING_SLEEP,
    DATETIME_NOW,
    RANDOM,
    UUID,
    ENTROPY,
    ASYNCIO_SLEEP,
    NETWORK,
    FILES,
    THREADS,
)
ALL_RULES: tuple[Rule, ...] = (*CALL_RULES, GLOBAL_STATEMENT, MODULE_MUTATION)
BY_CODE: dict[str, Rule] = {rule.code: rule for rule in ALL_RULES}

# Methods that change the object they are called on (TRD302 on a module-level object).
MUTATING_METHODS: frozenset[str] = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "update",
        "add",
        "discard",
        "setdefault",
        "popitem",
        "sort",
        "reverse",
        "appendleft",
        "extendleft",
        "popleft",
        "__setitem__",
        "__delitem__",
    }
)
# pathlib classes whose ``.open()`` is file I/O too.
PATH_CLASSES: frozenset[str] = frozenset(
    {"pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath"}
)


def call_rule(qualified: str | None, method: str | None) -> Rule | None:
    """The rule a call breaks: by its qualified name, else by its method name."""
    if qualified is not None:
        for rule in CALL_RULES:
            if rule.matches(qualified):
                return rule
    if method is not None:
        for rule in CALL_RULES:
            if method in rule.methods:
                return rule
    return None

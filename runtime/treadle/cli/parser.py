"""The argument parser: every command, its options, and the function that runs it."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, get_args

from treadle import __version__
from treadle.cli import execute, kube, lintcmd, manage, schedules, serving, streamcmd
from treadle.world import records

TARGET_HELP = "path/to/file.py:WORKFLOW or package.module:WORKFLOW"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"treadle: error: {message} (see: {self.prog} --help)\n")
        raise SystemExit(2)


def _common(json_output: bool = True) -> Parser:
    shared = Parser(add_help=False)
    shared.add_argument(
        "--world",
        metavar="URL",
        help="the World to use, e.g. local:PATH (default: $TREADLE_WORLD or local:.treadle)",
    )
    if json_output:
        shared.add_argument("--json", action="store_true", help="print one JSON value on stdout")
    return shared


def build_parser() -> Parser:
    parser = Parser(
        prog="treadle",
        description="Run, inspect and serve treadle durable workflows.",
    )
    parser.add_argument("--version", action="version", version=f"treadle {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    shared = [_common()]

    run = commands.add_parser(
        "run",
        parents=shared,
        help="start a run, execute it in this process and print its output",
        description="Start a run with an in-process worker, show its steps as they finish "
        "and print its output. Exit 0 when it completes, 1 when it fails, is cancelled "
        "or outlives --timeout, 2 for a usage error.",
    )
    run.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    run.add_argument(
        "--input", metavar="JSON", help="keyword arguments as a JSON object (or an array)"
    )
    run.add_argument("--timeout", type=float, metavar="S", help="give up waiting after S seconds")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    run.set_defaults(handler=execute.cmd_run)

    worker = commands.add_parser(
        "worker",
        parents=[_common(json_output=False)],
        help="serve the World's queue until stopped",
        description="A long-running worker for one app's workflows and steps; "
        "SIGINT or SIGTERM stops it.",
    )
    worker.add_argument(
        "module", metavar="MODULE_OR_FILE", help="path/to/file.py or package.module (:APP)"
    )
    worker.add_argument("--role", choices=["all", "orchestrator", "steps"], default="all")
    worker.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="deliveries at once (default: TREADLE_WORKER_CONCURRENCY, else derived from "
        "the CPUs and the step bodies: 256 per CPU, 32 to 1,024, for async steps)",
    )
    worker.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="on stop, let running deliveries finish for S seconds (default 30)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    worker.add_argument(
        "--metrics-host", default="0.0.0.0", metavar="HOST", help="(default 0.0.0.0)"
    )
    worker.set_defaults(handler=execute.cmd_worker)

    start = commands.add_parser(
        "start", parents=shared, help="record a run for a worker to execute; print its id"
    )
    start.add_argument("target", metavar="TARGET", help=TARGET_HELP)
    start.add_argument(
        "--input", metavar="JSON", help="keyword arguments as a JSON object (or an array)"
    )
    start.set_defaults(handler=execute.cmd_start)

    runs = commands.add_parser("runs", help="list, show, cancel, wake or move runs")
    runs_commands = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    listing = runs_commands.add_parser("list", parents=shared, help="runs, newest first")
    listing.add_argument("--status", choices=sorted(get_args(records.RunStatus)))
    listing.add_argument("--workflow", metavar="NAME")
    listing.add_argument("--limit", type=int, default=100, metavar="N")
    listing.set_defaults(handler=manage.cmd_runs_list)
    get = runs_commands.add_parser("get", parents=shared, help="one run's status and outcome")
    get.add_argument("run", metavar="RUN")
    get.set_defaults(handler=manage.cmd_runs_get)
    cancel = runs_commands.add_parser("cancel", parents=shared, help="cancel a run")
    cancel.add_argument("run", metavar="RUN")
    cancel.add_argument("--reason", metavar="TEXT")
    cancel.set_defaults(handler=manage.cmd_runs_cancel)
    wake = runs_commands.add_parser("wake", parents=shared, help="end a run's sleeps now")
    wake.add_argument("run", metavar="RUN")
    wake.set_defaults(handler=manage.cmd_runs_wake)
    move = runs_commands.add_parser(
        "move", parents=shared,
        help="move a run to another deployment whose workflow declares the same compatible tag",
    )  # fmt: skip
    move.add_argument("run", metavar="RUN")
    move.add_argument("--to", required=True, metavar="DEPLOYMENT")
    move.add_argument("--reason", metavar="TEXT")
    move.set_defaults(handler=manage.cmd_runs_move)
    streamcmd.add_parser(runs_commands, shared)  # issue 17 item 6: treadle runs stream

    schedules.add_commands(commands, shared)  # issue 17 item 3: treadle schedules ...

    inspect = commands.add_parser("inspect", parents=shared, help="a run's event timeline")
    inspect.add_argument("run", metavar="RUN")
    inspect.set_defaults(handler=manage.cmd_inspect)

    hooks = commands.add_parser("hooks", help="resume hooks")
    hooks_commands = hooks.add_subparsers(dest="hooks_command", metavar="COMMAND", required=True)
    resume = hooks_commands.add_parser(
        "resume", parents=shared, help="send a payload to the hook holding TOKEN"
    )
    resume.add_argument("token", metavar="TOKEN")
    resume.add_argument("--payload", metavar="JSON", help="the payload, as JSON (default null)")
    resume.add_argument(
        "--signature",
        metavar="HEX",
        help="the hook's signature (treadle.hook_signature), for a hook that requires one",
    )
    resume.set_defaults(handler=manage.cmd_hooks_resume)

    dead = commands.add_parser(
        "dead-letters",
        help="queue messages that failed too often: list, requeue or drop them",
        description="A queue message whose handler raised on "
        "TREADLE_QUEUE_MAX_FAILED_DELIVERIES deliveries, or that is not a treadle message, "
        "is moved to the dead letters instead of retried for ever.",
    )
    dead_commands = dead.add_subparsers(dest="dead_command", metavar="COMMAND", required=True)
    dead_list = dead_commands.add_parser("list", parents=shared, help="the dead letters")
    dead_list.add_argument("--limit", type=int, default=100, metavar="N")
    dead_list.set_defaults(handler=manage.cmd_dead_letters_list)
    requeue = dead_commands.add_parser(
        "requeue", parents=shared, help="send a dead letter again, its counts from zero"
    )
    requeue.add_argument("message", metavar="MESSAGE_ID")
    requeue.set_defaults(handler=manage.cmd_dead_letters_requeue)
    drop = dead_commands.add_parser("drop", parents=shared, help="delete a dead letter")
    drop.add_argument("message", metavar="MESSAGE_ID")
    drop.set_defaults(handler=manage.cmd_dead_letters_drop)

    config = commands.add_parser(
        "settings", parents=shared, help="every setting: default, current value, meaning"
    )
    config.set_defaults(handler=manage.cmd_settings)

    key = commands.add_parser(
        "payload-key",
        help="print a new payload encryption key entry for TREADLE_PAYLOAD_KEY",
        description="Print <key id>:<base64 of 32 random bytes>. Put it first in "
        "TREADLE_PAYLOAD_KEY (comma separated) to encrypt with it; keep older entries "
        "after it while runs started under them may still replay.",
    )
    key.add_argument("--kid", default=None, help="the key id (default: k<YYYYMMDD>)")
    key.set_defaults(handler=manage.cmd_payload_key)

    migrate = commands.add_parser(
        "migrate", parents=[_common()], help="apply the Postgres World's pending migrations"
    )
    migrate.add_argument(
        "--database-url-file",
        metavar="PATH",
        help="a file whose first line is the database URL ('-': read it from stdin); "
        "default: $TREADLE_DATABASE_URL or $TREADLE_DATABASE_URL_FILE",
    )
    migrate.add_argument(
        "--database-url",
        metavar="DSN",
        help="the database URL on the command line (discouraged: argv is visible to every "
        "user in the process list and lands in shell history; a warning is printed)",
    )
    migrate.set_defaults(handler=manage.cmd_migrate)

    operator = commands.add_parser(
        "operator",
        parents=[_common(json_output=False)],
        help="run the Kubernetes operator (needs the operator extra)",
        description="Reconcile WorkflowDeployment and WorkflowRun objects until SIGINT or "
        "SIGTERM; the cluster comes from the Pod's service account or $KUBECONFIG.",
    )
    operator.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help="serve only this namespace (repeatable; default: every namespace)",
    )
    operator.set_defaults(handler=kube.cmd_operator)

    serve = commands.add_parser(
        "serve",
        parents=[_common(json_output=False)],
        help="serve the HTTP API, webhooks and the inspector page (needs the serve extra)",
        description="One HTTP server over the World: the JSON API, webhooks and the "
        "inspector (docs/serve.md). Needs TREADLE_SERVE_TOKEN, TREADLE_SERVE_READONLY_TOKEN "
        "or TREADLE_SERVE_TRUSTED_HEADER, or --insecure-no-auth. SIGINT or SIGTERM stops it.",
    )
    serve.add_argument("--host", metavar="ADDR", help="default: $TREADLE_SERVE_HOST or 127.0.0.1")
    serve.add_argument(
        "--port", type=int, metavar="N", help="default: $TREADLE_SERVE_PORT or 8080 (0: any)"
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without any credentials (only where you alone can reach it)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(handler=serving.cmd_serve)

    crds = commands.add_parser(
        "crds",
        help="write the CRD YAML (crds/ and the Helm chart) from the operator's models",
    )
    crds.add_argument("--root", default=".", help="the repository root (default: .)")
    crds.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    crds.set_defaults(handler=kube.cmd_crds)

    # Run attributes (issue 17 item 2, docs/attributes.md) and the determinism linter
    # (issue 17 item 9, docs/lint.md).
    attr_help = "KEY=VALUE (repeatable; VALUE read as JSON when it parses, else a string)"
    start.add_argument("--attr", action="append", metavar="KEY=VALUE", help=attr_help)
    listing.add_argument(
        "--attr",
        action="append",
        metavar="KEY=VALUE",
        help=f"only runs with it: {attr_help}, ANDed",
    )
    lint = commands.add_parser(
        "lint",
        help="report non-deterministic calls in workflow code (docs/lint.md)",
        description="Read Python files (or every .py file under a directory) without "
        "importing them and report, in @...workflow functions, calls that break replay "
        "(time, random, uuid, I/O, threads, global state), each with file:line:col, a rule "
        "code and the treadle replacement. Exit 0: nothing found; 1: findings; 2: a path "
        "that does not exist or a file that does not parse.",
    )
    lint.add_argument("paths", nargs="+", metavar="PATH")
    lint.add_argument("--format", choices=["text", "json"], default="text")
    lint.set_defaults(handler=lintcmd.cmd_lint)
    return parser

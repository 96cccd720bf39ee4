"""``kubectl treadle``: WorkflowSignals from the command line, through kubectl alone.

A kubectl plugin (the ``kubectl-treadle`` executable on PATH; kubectl runs it for
``kubectl treadle ...``). It only writes a WorkflowSignal with ``kubectl create``
and waits for the operator's outcome with ``kubectl get``: no database or NATS
credentials, no network path but the API server's, authorised by the user's RBAC on
``workflowsignals``. ``docs/operator-day2.md`` describes the signals::

    kubectl treadle resume RUN [--token T | --hook ID] [--payload JSON |
                               --payload-from-configmap NAME:KEY] [--signature S]
    kubectl treadle wake RUN [--wait ID ...]
    kubectl treadle rerun RUN [--name NEW] [--input JSON]
    kubectl treadle cancel RUN [--reason TEXT]

Each takes ``-n/--namespace``, ``--no-wait`` and ``--timeout SECONDS``; the exit
status is 0 when the signal is Done, 1 when it Failed (its message on stderr), 2 for
bad arguments or a kubectl error, 3 when the wait timed out. kubectl is ``$KUBECTL``
or ``kubectl`` on PATH, with the user's ``$KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from treadle_operator import models

DONE, FAILED, USAGE, TIMED_OUT = 0, 1, 2, 3


class PluginError(Exception):
    """A bad argument or a kubectl failure: the message is the one line shown."""


def _json(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise PluginError(f"{flag}: not JSON: {exc}") from None


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kubectl treadle", description=__doc__.split("\n\n")[0])
    actions = top.add_subparsers(dest="action", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("run", metavar="RUN", help="the WorkflowRun")
    common.add_argument("-n", "--namespace", help="its namespace (default: kubectl's)")
    common.add_argument("--no-wait", action="store_true", help="do not wait for the outcome")
    common.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (60)")
    resume = actions.add_parser("resume", parents=[common], help="resume a hook of the run")
    which = resume.add_mutually_exclusive_group()
    which.add_argument("--token", help="the hook's token (default: the run's only open hook)")
    which.add_argument("--hook", help="the hook's correlation id")
    payload = resume.add_mutually_exclusive_group()
    payload.add_argument("--payload", metavar="JSON", help="the payload (default null)")
    payload.add_argument("--payload-from-configmap", metavar="NAME:KEY")
    resume.add_argument("--signature", help="hook_signature(token, key) of a signed hook")
    wake = actions.add_parser("wake", parents=[common], help="end the run's sleeps now")
    wake.add_argument("--wait", action="append", dest="waits", metavar="ID",
                      help="only this sleep (repeatable)")  # fmt: skip
    rerun = actions.add_parser("rerun", parents=[common], help="run a failed run again")
    rerun.add_argument("--name", help="the new WorkflowRun's name")
    rerun.add_argument("--input", metavar="JSON", help="a new input (default: the same)")
    cancel = actions.add_parser("cancel", parents=[common], help="cancel the run")
    cancel.add_argument("--reason")
    return top


def signal(args: argparse.Namespace) -> dict[str, Any]:
    """The WorkflowSignal these arguments ask for."""
    spec: dict[str, Any] = {"run": args.run}
    if args.action == "resume":
        hook: dict[str, Any] = {}
        if args.token:
            hook["token"] = args.token
        if args.hook:
            hook["hook"] = args.hook
        if args.payload is not None:
            hook["payload"] = _json(args.payload, "--payload")
        if args.payload_from_configmap:
            name, sep, key = args.payload_from_configmap.partition(":")
            if not (name and sep and key):
                raise PluginError("--payload-from-configmap: give NAME:KEY")
            hook["payloadFrom"] = {"configMapKeyRef": {"name": name, "key": key}}
        if args.signature:
            hook["signature"] = args.signature
        spec.update(action="ResumeHook", resumeHook=hook)
    elif args.action == "wake":
        spec.update(action="Wake", wake={"waits": args.waits} if args.waits else {})
    elif args.action == "rerun":
        rerun: dict[str, Any] = {}
        if args.name:
            rerun["name"] = args.name
        if args.input is not None:
            rerun["input"] = _json(args.input, "--input")
        spec.update(action="Rerun", rerun=rerun)
    else:
        spec.update(action="Cancel", cancel={"reason": args.reason} if args.reason else {})
    stem = f"{args.run[:40].rstrip('-.')}-{args.action}-"
    return {"apiVersion": models.API_VERSION, "kind": "WorkflowSignal",
            "metadata": {"generateName": stem}, "spec": spec}  # fmt: skip


def _kubectl(args: argparse.Namespace, *argv: str, stdin: str | None = None) -> str:
    binary = os.environ.get("KUBECTL", "kubectl")
    namespace = ["--namespace", args.namespace] if args.namespace else []
    try:
        done = subprocess.run([binary, *namespace, *argv], input=stdin, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PluginError(f"{binary}: {exc}") from None
    if done.returncode != 0:
        raise PluginError(done.stderr.strip() or f"{binary} {argv[0]} failed")
    return done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        made = _kubectl(args, "create", "-f", "-", "-o", "name", stdin=json.dumps(signal(args)))
        name = made.strip()
        print(name, flush=True)
        if args.no_wait:
            return DONE
        deadline = time.monotonic() + args.timeout
        while True:
            status = json.loads(_kubectl(args, "get", name, "-o", "json")).get("status") or {}
            phase = status.get("phase")
            if phase in models.SIGNAL_HANDLED_PHASES:
                line = f"{phase}: {status.get('reason', '')}: {status.get('message', '')}"
                print(line, file=sys.stdout if phase == "Done" else sys.stderr)
                return DONE if phase == "Done" else FAILED
            if time.monotonic() > deadline:
                print(f"{name} still {phase or 'Pending'}: {status.get('message', '')}",
                      file=sys.stderr)  # fmt: skip
                return TIMED_OUT
            time.sleep(0.5)
    except PluginError as exc:
        print(f"kubectl treadle: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())

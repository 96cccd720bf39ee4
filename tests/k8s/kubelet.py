"""A process kubelet: runs the Pods bound to the fake Node as local processes.

``ProcessKubelet`` owns an asyncio loop in a background thread (so it serves
sync and async tests alike, whatever their loop scope). It lists, then watches,
the Pods whose ``spec.nodeName`` is its node and, per Pod, runs the first
container's ``command`` + ``args`` in the Pod's own directory with stdout and
stderr in log files, the environment resolved as a kubelet does
(``podenv.py``) over the test's extra env, plus ``TREADLE_POD_IMAGE`` and
``TREADLE_POD_NAME``. Secret and ConfigMap volumes the container mounts are
written (items, modes) to ``volumes/<name>`` in the Pod's directory at each
(re)start, and since a process cannot see a mount path, every env value and
argument under a ``mountPath`` is rewritten to that directory; a missing Secret
or key keeps the container waiting in ``ContainerCreating`` (FailedMount) as a
kubelet does. It reports through ``pods/status``: Running and Ready
while the process runs; on exit ``restartCount``, ``lastState.terminated``
(exit code, reason, the stderr tail) and ``CrashLoopBackOff`` while it backs off
(1 s doubling to 8 s) under restartPolicy Always. An image under
``UNPULLABLE`` (``unpullable.invalid/...``) is never pulled: the container waits
in ``ErrImagePull``, then ``ImagePullBackOff``, as a registry without it makes a
kubelet do. A deletionTimestamp means
SIGTERM, the grace period (capped at 10 s), SIGKILL, then deleting the Pod with
grace period 0, as a kubelet does. Used by ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from . import podenv
from .cluster import NODE_NAME
from .processes import die_with_parent, tail

log = logging.getLogger("treadle.tests.kubelet")

BACKOFF_START = 1.0
BACKOFF_MAX = 8.0
# A container that ran this long restarts after BACKOFF_START again.
BACKOFF_RESET_AFTER = 10.0
CONFIG_RETRY_SECONDS = 1.0
UNPULLABLE = "unpullable.invalid/"
GRACE_CAP_SECONDS = 10.0
MESSAGE_LIMIT = 1024
START_SECONDS = 30.0
MERGE_PATCH = "application/merge-patch+json"


def api_configuration(server: str, token: str) -> client.Configuration:
    """A kubernetes_asyncio configuration for the test API server (admin token, no TLS check)."""
    config = client.Configuration(host=server)
    config.api_key = {"BearerToken": token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    config.verify_ssl = False
    return config


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodState:
    """What the kubelet knows of one Pod (by uid) and the process it runs for it."""

    pod: dict[str, Any]
    directory: Path
    deleting: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False
    process: asyncio.subprocess.Process | None = None
    start_time: str = field(default_factory=_now)
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.pod["spec"]["containers"][0])

    def conditions(self, ready: bool) -> list[dict[str, str]]:
        """Pod conditions whose lastTransitionTime changes only when their status does."""
        wanted = {
            "PodScheduled": True,
            "Initialized": True,
            "ContainersReady": ready,
            "Ready": ready,
        }
        out = []
        for kind, value in wanted.items():
            status = "True" if value else "False"
            previous = self.transitions.get(kind)
            if previous is None or previous[0] != status:
                self.transitions[kind] = (status, _now())
            out.append(
                {"type": kind, "status": status, "lastTransitionTime": self.transitions[kind][1]}
            )
        return out


class ProcessKubelet:
    """Serves ``node_name`` from a thread; ``start``/``stop`` from the test's thread."""

    def __init__(
        self, server: str, token: str, root: Path, *, node_name: str = NODE_NAME,
        extra_env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.server = server
        self.token = token
        self.root = root
        self.node_name = node_name
        # Added to every container's environment at its (re)start; tests may change it.
        self.extra_env: dict[str, str] = dict(extra_env or {})
        self._pods: dict[str, PodState] = {}
        self._finished: set[str] = set()  # uids whose Pod the kubelet is done with
        # (namespace, name) -> the directory of the latest Pod so named, kept after it goes.
        self._directories: dict[tuple[str, str], Path] = {}
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._stopped = False

    # --- the test's side -------------------------------------------------------------------

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._serve, name="process-kubelet", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_SECONDS) or self._failure is not None:
            self.stop()
            raise RuntimeError(f"the process kubelet did not start: {self._failure!r}")

    def stop(self) -> None:
        """Kills every pod process and ends the thread."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(GRACE_CAP_SECONDS + 5)
            self._thread = None

    def _current(self, name: str, namespace: str) -> PodState:
        found = [s for s in list(self._pods.values()) if (s.name, s.namespace) == (name, namespace)]
        if not found:
            raise LookupError(f"the process kubelet runs no pod {namespace}/{name}")
        return found[-1]

    def pod_directory(self, name: str, namespace: str = "default") -> Path:
        """The Pod's working directory (its cwd and HOME), holding stdout.log and stderr.log.

        It outlives the Pod, so a test can read a deleted Pod's logs.
        """
        try:
            return self._directories[namespace, name]
        except KeyError:
            raise LookupError(f"the process kubelet never ran a pod {namespace}/{name}") from None

    def logs_tail(self, namespace: str, limit: int = 2000) -> str:
        """The end of every stream of every Pod run in ``namespace``: for failure messages."""
        parts = []
        for (ns, name), directory in sorted(self._directories.items()):
            for stream in ("stdout", "stderr") if ns == namespace else ():
                text = tail(directory / f"{stream}.log", limit)
                if text:
                    parts.append(f"--- pod {name} {stream}:\n{text}")
        return "\n".join(parts)

    def pod_log(self, name: str, namespace: str = "default", stream: str = "stdout") -> str:
        """Everything the Pod's container wrote to ``stream`` ("stdout" or "stderr"), all runs."""
        path = self.pod_directory(name, namespace) / f"{stream}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pod_pid(self, name: str, namespace: str = "default") -> int | None:
        """The pid of the Pod's running process; None while none runs (or no such Pod yet)."""
        try:
            process = self._current(name, namespace).process
        except LookupError:
            return None
        return None if process is None or process.returncode is not None else process.pid

    def kill_pod_process(self, name: str, sig: int, namespace: str = "default") -> int:
        """Sends ``sig`` to the Pod's running process (its main pid); returns that pid."""
        pid = self.pod_pid(name, namespace)
        if pid is None:
            raise LookupError(f"pod {namespace}/{name} has no running process")
        os.kill(pid, sig)
        return pid

    # --- the kubelet's thread --------------------------------------------------------------

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self._failure = error
            log.exception("the process kubelet failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        async with client.ApiClient(api_configuration(self.server, self.token)) as api:
            self.core = client.CoreV1Api(api)
            watcher = asyncio.create_task(self._watch_pods())
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({watcher, stopping}, return_when=asyncio.FIRST_COMPLETED)
            watcher.cancel()
            stopping.cancel()
            self._stopped = True
            for state in list(self._pods.values()):
                state.gone = True
                state.deleting.set()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.gather(*tasks, return_exceptions=True)
            if watcher.done() and not watcher.cancelled() and watcher.exception():
                raise watcher.exception()  # type: ignore[misc]

    async def _list(self) -> str:
        reply = await self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        listing = await _json(reply)
        for pod in listing["items"]:
            self._observe("ADDED", pod)
        listed = {pod["metadata"]["uid"] for pod in listing["items"]}
        for uid, state in list(self._pods.items()):
            if uid not in listed:  # deleted while the watch was down
                self._observe("DELETED", state.pod)
        return str(listing["metadata"]["resourceVersion"])

    async def _watch_pods(self) -> None:
        version = await self._list()
        self._ready.set()
        while True:
            try:
                async with watch.Watch(return_type="object") as pods:
                    stream = pods.stream(
                        self.core.list_pod_for_all_namespaces,
                        field_selector=f"spec.nodeName={self.node_name}",
                        resource_version=version,
                        allow_watch_bookmarks=True,
                    )
                    async for event in stream:
                        if event["type"] != "BOOKMARK":
                            self._observe(event["type"], event["raw_object"])
                        version = pods.resource_version or version
            except ApiException as error:
                if error.status != 410:
                    raise
                log.info("pod watch expired (410), listing again")
                version = await self._list_again()
            except (TimeoutError, OSError, aiohttp.ClientError) as error:
                log.warning("pod watch broke (%r), listing again", error)
                version = await self._list_again()

    async def _list_again(self) -> str:
        """Lists the node's Pods again, retrying while the API server cannot be reached."""
        while True:
            try:
                return await self._list()
            except (TimeoutError, OSError, aiohttp.ClientError) as error:
                log.warning("listing pods failed (%r), retrying", error)
                await asyncio.sleep(CONFIG_RETRY_SECONDS)

    def _observe(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        state = self._pods.get(uid)
        if state is None:
            if (
                kind == "DELETED"
                or uid in self._finished
                or pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
            ):
                return
            name = f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_{uid[:8]}"
            state = PodState(pod=pod, directory=self.root / name)
            state.directory.mkdir(parents=True, exist_ok=True)
            self._directories[state.namespace, state.name] = state.directory
            self._pods[uid] = state
            state.task = asyncio.create_task(self._run_pod(uid, state), name=f"pod {name}")
        state.pod = pod
        if kind == "DELETED":
            state.gone = True
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            state.deleting.set()

    async def _run_pod(self, uid: str, state: PodState) -> None:
        try:
            await self._run_container(state)
            await self._terminate(state)
        except Exception:
            log.exception("pod %s/%s: the process kubelet failed it", state.namespace, state.name)
        finally:
            if state.process is not None and state.process.returncode is None:
                _kill_group(state.process.pid, signal.SIGKILL)
                await state.process.wait()
            self._pods.pop(uid, None)
            self._finished.add(uid)

    async def _run_container(self, state: PodState) -> None:
        """Starts, watches and restarts the container until the Pod is being deleted."""
        policy = state.pod["spec"].get("restartPolicy", "Always")
        restarts, backoff = 0, BACKOFF_START
        last: dict[str, Any] = {}
        image = str(state.container.get("image", ""))
        if image.startswith(UNPULLABLE):
            reason = "ErrImagePull"
            while not state.deleting.is_set():
                message = f"rpc error: pull access denied for {image}: repository does not exist"
                waiting = {"reason": reason, "message": message}
                await self._report(state, "Pending", {"waiting": waiting}, last, restarts)
                await self._pause(state, CONFIG_RETRY_SECONDS)
                reason = "ImagePullBackOff"
            return
        while not state.deleting.is_set():
            try:
                argv, env = await self._prepare(state)
            except podenv.ContainerError as error:
                waiting = {"reason": error.reason, "message": error.message}
                await self._report(state, "Pending", {"waiting": waiting}, last, restarts)
                await self._pause(state, CONFIG_RETRY_SECONDS)
                continue
            terminated = await self._run_once(state, argv, env, last, restarts)
            if terminated is None:
                return
            last = {"terminated": terminated}
            code = terminated["exitCode"]
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                phase = "Succeeded" if code == 0 else "Failed"
                await self._report(state, phase, last, {}, restarts)
                await state.deleting.wait()
                return
            restarts += 1
            if (
                _seconds_between(terminated["startedAt"], terminated["finishedAt"])
                >= BACKOFF_RESET_AFTER
            ):
                backoff = BACKOFF_START
            name = state.container["name"]
            message = f"back-off {backoff:.0f}s restarting failed container={name} pod={state.name}"
            waiting = {"reason": "CrashLoopBackOff", "message": message}
            await self._report(state, "Running", {"waiting": waiting}, last, restarts)
            await self._pause(state, backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _mount(self, state: PodState) -> dict[str, Path]:
        """Writes the container's Secret/ConfigMap volumes; mountPath -> local directory."""
        volumes = {v["name"]: v for v in state.pod["spec"].get("volumes") or []}
        mounted: dict[str, Path] = {}
        for mount in state.container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            kind, source = next(
                ((k, volume[f]) for f, k in _VOLUME_KINDS.items() if f in volume), (None, None)
            )
            if kind is None or source is None:
                continue  # emptyDir and the rest: the process writes where it likes
            name = source.get("secretName") or source.get("name") or ""
            found = await self._lookup(kind, state.namespace, name)
            where = f"{'Secret' if kind == 'secrets' else 'ConfigMap'} {state.namespace}/{name}"
            if found is None and not source.get("optional"):
                raise podenv.ContainerError(
                    "ContainerCreating",
                    f'MountVolume.SetUp failed for volume "{mount["name"]}": {where} not found',
                )
            data = _volume_data(kind, found or {})
            items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
            directory = state.directory / "volumes" / mount["name"]
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            for item in items:
                if item["key"] not in data:
                    if source.get("optional"):
                        continue
                    raise podenv.ContainerError(
                        "ContainerCreating",
                        f'MountVolume.SetUp failed for volume "{mount["name"]}": '
                        f"couldn't find key {item['key']} in {where}",
                    )
                path = directory / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[item["key"]])
                path.chmod(item.get("mode", source.get("defaultMode", 0o644)))
            mounted[str(mount["mountPath"]).rstrip("/")] = directory
        return mounted

    async def _prepare(self, state: PodState) -> tuple[list[str], dict[str, str]]:
        container = state.container
        mounted = await self._mount(state)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(state.directory),
            "HOSTNAME": state.name,
            **self.extra_env,
            **await podenv.container_env(state.pod, container, self._lookup),
            "TREADLE_POD_IMAGE": str(container.get("image", "")),
            "TREADLE_POD_NAME": state.name,
        }
        env = {k: _local(v, mounted) for k, v in env.items()}
        return [_local(a, mounted) for a in podenv.container_argv(container, env)], env

    async def _run_once(
        self, state: PodState, argv: list[str], env: dict[str, str],
        last: dict[str, Any], restarts: int,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Runs the container once: its ``terminated`` state, or None when the Pod goes."""
        started = _now()
        stdout = (state.directory / "stdout.log").open("ab")
        stderr = (state.directory / "stderr.log").open("ab")
        offset = stderr.tell()
        try:
            state.process = await asyncio.create_subprocess_exec(
                *argv, cwd=state.directory, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout, stderr=stderr, start_new_session=True, preexec_fn=die_with_parent,
            )  # fmt: skip
        except OSError as error:
            return {"exitCode": 128, "reason": "StartError", "message": str(error)[:MESSAGE_LIMIT],
                    "startedAt": started, "finishedAt": _now()}  # fmt: skip
        finally:
            stdout.close()
            stderr.close()
        process = state.process
        running = {"running": {"startedAt": started}}
        await self._report(state, "Running", running, last, restarts, ready=True)
        exited = asyncio.create_task(process.wait())
        deleting = asyncio.create_task(state.deleting.wait())
        await asyncio.wait({exited, deleting}, return_when=asyncio.FIRST_COMPLETED)
        deleting.cancel()
        if not exited.done():
            exited.cancel()
            return None
        _kill_group(process.pid, signal.SIGKILL)  # what the container runtime does to leftovers
        code = process.returncode or 0
        if code < 0:  # killed by a signal: a container runtime reports 128 + signal
            code = 128 - code
        message = tail(state.directory / "stderr.log", MESSAGE_LIMIT, start=offset)
        return {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "message": message, "startedAt": started, "finishedAt": _now()}  # fmt: skip

    async def _terminate(self, state: PodState) -> None:
        """SIGTERM, the grace period, SIGKILL; then the Pod is deleted with grace period 0."""
        process = state.process
        if process is not None and process.returncode is None:
            grace = state.pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = state.pod["spec"].get("terminationGracePeriodSeconds", 30)
            if self._stopped:
                grace = 0
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), min(float(grace), GRACE_CAP_SECONDS))
            except TimeoutError:
                log.info("pod %s/%s ignored SIGTERM: SIGKILL", state.namespace, state.name)
            _kill_group(process.pid, signal.SIGKILL)
            await process.wait()
        if not state.gone:
            options = client.V1DeleteOptions(
                grace_period_seconds=0,
                preconditions=client.V1Preconditions(uid=state.pod["metadata"]["uid"]),
            )
            with contextlib.suppress(ApiException):  # gone already, or replaced (uid differs)
                await self.core.delete_namespaced_pod(state.name, state.namespace, body=options)

    async def _pause(self, state: PodState, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.deleting.wait(), seconds)

    async def _lookup(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        read = (
            self.core.read_namespaced_secret
            if kind == "secrets"
            else self.core.read_namespaced_config_map
        )
        try:
            return await _json(await read(name, namespace, _preload_content=False))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def _report(
        self, state: PodState, phase: str, current: dict[str, Any], last: dict[str, Any],
        restarts: int, *, ready: bool = False,
    ) -> None:  # fmt: skip
        if state.gone:
            return
        container = state.container
        pid = state.process.pid if state.process is not None else None
        status = {
            "phase": phase,
            "conditions": state.conditions(ready),
            "hostIP": podenv.POD_IP,
            "podIP": podenv.POD_IP,
            "podIPs": [{"ip": podenv.POD_IP}],
            "startTime": state.start_time,
            "containerStatuses": [{
                "name": container["name"], "image": container.get("image", ""), "imageID": "",
                "containerID": f"process://{pid}" if pid else None, "ready": ready,
                "started": "running" in current, "restartCount": restarts,
                "state": current, "lastState": last,
            }],
        }  # fmt: skip
        try:
            await self.core.patch_namespaced_pod_status(
                state.name, state.namespace, {"status": status}, _content_type=MERGE_PATCH
            )
        except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as error:
            # The next report carries the whole status again; a missed one is not fatal.
            if getattr(error, "status", None) != 404:
                log.warning(
                    "pod %s/%s: status not reported: %r", state.namespace, state.name, error
                )


_VOLUME_KINDS = {"secret": "secrets", "configMap": "configmaps"}


def _volume_data(kind: str, obj: dict[str, Any]) -> dict[str, bytes]:
    """A Secret's or ConfigMap's keys as the bytes a volume file holds."""
    if kind == "secrets":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    binary = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
    return {**binary, **{k: v.encode() for k, v in (obj.get("data") or {}).items()}}


def _local(value: str, mounted: dict[str, Path]) -> str:
    """``value`` with a mount path at its start replaced by the volume's local directory."""
    for mount_path, directory in mounted.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(directory) + value[len(mount_path) :]
    return value


async def _json(reply: aiohttp.ClientResponse) -> dict[str, Any]:
    """The body of a ``_preload_content=False`` reply, which is not checked for errors."""
    body = await reply.read()
    if reply.status >= 400:
        raise ApiException(status=reply.status, reason=body.decode(errors="replace")[:500])
    result: dict[str, Any] = json.loads(body)
    return result


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _seconds_between(start: str, end: str) -> float:
    parse = datetime.datetime.fromisoformat
    return (parse(end) - parse(start)).total_seconds()


@contextlib.contextmanager
def extra_env(kubelet: ProcessKubelet, **variables: str) -> Iterator[None]:
    """Adds ``variables`` to the environment of containers started inside the block."""
    saved = dict(kubelet.extra_env)
    kubelet.extra_env.update(variables)
    try:
        yield
    finally:
        kubelet.extra_env.clear()
        kubelet.extra_env.update(saved)

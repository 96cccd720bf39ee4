"""Builds an image from a Dockerfile without Docker: the instructions ``docker/Dockerfile`` uses.

``Dockerfile.parse`` reads the file (parser directives, ``\\`` continuations,
comments); ``plan`` evaluates it against build arguments and the offline base
images it may name (``FROM``), checking everything before any work: an
instruction, a flag, a substitution, a ``FROM`` or ``--mount`` naming no stage
or image, or a build argument no ``ARG`` declares fails with one line naming
``docker/Dockerfile:LINE``. ``Plan.execute`` then builds it: each stage's root
filesystem is a copy of its base's; ``COPY`` copies from the build context
through the Dockerfile's ``.dockerignore``; ``RUN`` runs by ``chroot`` in that
tree, under ``unshare --mount --net`` (its bind mounts, read-only, and a
``/proc`` exist only in that namespace, and it has no network: the build
fetches nothing); the last stage's tree and its OCI config (Env, WorkingDir,
User, Entrypoint, Cmd) are the image, which ``oci_image.write_oci_archive``
packs.

Supported: ``ARG`` (before the first ``FROM`` for ``FROM`` lines, or in a
stage), ``FROM image-or-stage [AS name]``, ``ENV``, ``WORKDIR``, ``COPY src...
dest`` from the context, ``RUN`` (shell or exec form, ``--mount=type=bind,
from=STAGE,source=..,target=..``), ``USER``, ``ENTRYPOINT``, ``CMD``; ``$VAR``,
``${VAR}``, ``${VAR:-word}``, ``${VAR:+word}`` in their arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .oci_image import ImageBuildError, ImageConfig

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_PATH = DEFAULT_PATH
RUN_SECONDS = 600
SUPPORTED = ("ARG", "FROM", "ENV", "WORKDIR", "COPY", "RUN", "USER", "ENTRYPOINT", "CMD")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC = re.compile(r"(^|\s)<<-?[\"']?[A-Za-z_]")
# Runs one RUN: $1 the stage's tree, $2 a uid:gid or "", $3 the workdir, $4 and $5 the
# host's mount and chroot, $6 the number of bind mounts, then (source, target) pairs, then
# the command's argv; the environment is the RUN's. unshare --mount: the mounts vanish
# with the process; --net: only a loopback that is down.
_RUNNER = r"""set -e
root=$1 userspec=$2 workdir=$3 mount=$4 chroot=$5 n=$6
shift 6
"$mount" --make-rprivate /
while [ "$n" -gt 0 ]; do
  "$mount" --bind "$1" "$root$2"
  "$mount" -o remount,bind,ro "$root$2"
  shift 2
  n=$((n - 1))
done
if [ -d "$root/proc" ]; then "$mount" -t proc proc "$root/proc"; fi
exec "$chroot" ${userspec:+--userspec=$userspec} "$root" /bin/sh -c 'cd "$0" && exec "$@"' \
  "$workdir" "$@"
"""


class DockerfileError(ImageBuildError):
    """The Dockerfile uses what this builder does not support, or fails to build."""


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass(frozen=True)
class BaseImage:
    """An offline image a ``FROM`` may name: its root filesystem and config."""

    rootfs: Path
    config: ImageConfig = field(default_factory=ImageConfig)


@dataclass(frozen=True)
class Copy:
    where: str
    sources: tuple[str, ...]
    dest: str  # absolute, in the stage's tree


@dataclass(frozen=True)
class Mount:
    stage: int
    source: str
    target: str


@dataclass(frozen=True)
class Run:
    where: str
    text: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    user: str
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class Workdir:
    path: str


Step = Copy | Run | Workdir


@dataclass
class Stage:
    index: int
    name: str | None
    base: str  # the image's name, or "stage N"
    base_rootfs: Path | None  # None: FROM an earlier stage (base_stage)
    base_stage: int | None
    env: dict[str, str]
    args: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def config(self) -> ImageConfig:
        return ImageConfig(
            entrypoint=list(self.entrypoint),
            cmd=list(self.cmd),
            env=[f"{key}={value}" for key, value in self.env.items()],
            user=self.user,
            working_dir=self.workdir if self.workdir != "/" else "",
        )


@dataclass(frozen=True)
class Built:
    rootfs: Path
    config: ImageConfig


def _env_dict(env: Sequence[str]) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in env)
    return {pair[0]: pair[1] if len(pair) > 1 else "" for pair in pairs}


class Dockerfile:
    """A parsed Dockerfile: its instructions with their first line numbers."""

    def __init__(self, path: Path, display: str, instructions: list[Instruction]) -> None:
        self.path = path
        self.display = display
        self.instructions = instructions

    @classmethod
    def parse(cls, path: Path, display: str | None = None) -> Dockerfile:
        name = display or str(path)
        lines = path.read_text().splitlines()
        instructions: list[Instruction] = []
        directives = True
        pending: list[str] = []
        start = 0
        for number, raw in enumerate(lines, start=1):
            stripped = raw.strip()
            if directives and (found := re.fullmatch(r"#\s*([a-zA-Z]+)\s*=\s*(\S+)", stripped)):
                key = found.group(1).lower()
                if key != "syntax":
                    raise DockerfileError(
                        f"{name}:{number}: parser directive {key} is not supported"
                    )
                continue
            directives = False
            if not pending and (not stripped or stripped.startswith("#")):
                continue
            if pending and (not stripped or stripped.startswith("#")):
                continue  # a comment or an empty line inside a continuation
            if not pending:
                start = number
                raw = raw.lstrip()
            # BuildKit's joining: the trailing backslash goes, the next line follows as it is.
            continued = re.search(r"\\[ \t]*$", raw)
            pending.append(raw[: continued.start()] if continued else raw)
            if continued:
                continue
            keyword, *rest = "".join(pending).split(None, 1)
            pending = []
            instructions.append(
                Instruction(start, keyword.upper(), rest[0].strip() if rest else "")
            )
        if pending:
            raise DockerfileError(f"{name}:{start}: the last instruction ends with a continuation")
        return cls(path, name, instructions)

    def plan(self, build_args: Mapping[str, str], images: Mapping[str, BaseImage]) -> Plan:
        return _Planner(self, build_args, images).plan()


class _Planner:
    def __init__(
        self, dockerfile: Dockerfile, build_args: Mapping[str, str], images: Mapping[str, BaseImage]
    ) -> None:
        self.file = dockerfile
        self.build_args = dict(build_args)
        self.images = images
        self.globals: dict[str, str] = {}
        self.declared: dict[str, int] = {}  # ARG name: its first line
        self.stages: list[Stage] = []

    def where(self, item: Instruction) -> str:
        return f"{self.file.display}:{item.line}"

    def fail(self, item: Instruction, what: str) -> DockerfileError:
        return DockerfileError(f"{self.where(item)}: {item.keyword} {what}")

    def plan(self) -> Plan:
        for item in self.file.instructions:
            if item.keyword not in SUPPORTED:
                raise DockerfileError(
                    f"{self.where(item)}: {item.keyword} is not supported by "
                    f"tests/k8s/dockerfile.py (supported: {', '.join(SUPPORTED)})"
                )
            if not self.stages and item.keyword not in ("ARG", "FROM"):
                raise self.fail(item, "before the first FROM")
            if item.keyword in ("RUN", "COPY") and _HEREDOC.search(item.args):
                raise self.fail(item, "with a heredoc is not supported")
            getattr(self, "_" + item.keyword.lower())(item)
        if not self.stages:
            raise DockerfileError(f"{self.file.display}: no FROM")
        unused = sorted(set(self.build_args) - set(self.declared))
        declared = ", ".join(
            f"{name} at line {line}" for name, line in sorted(self.declared.items())
        )
        if unused:
            raise DockerfileError(
                f"{self.file.display}: build arg {', '.join(unused)} is declared by no ARG "
                f"(declared: {declared or 'none'})"
            )
        return Plan(self.file, self.stages, self.build_args)

    # -- helpers

    def variables(self) -> dict[str, str]:
        if not self.stages:
            return dict(self.globals)
        stage = self.stages[-1]
        return {**stage.args, **stage.env}

    def flags(self, item: Instruction, allowed: Sequence[str] = ()) -> tuple[list[str], str]:
        """The leading ``--name=value`` flags of ``item`` (only ``allowed`` names) and the rest."""
        rest = item.args
        found: list[str] = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            rest = rest.lstrip()
            name = flag[2:].split("=", 1)[0]
            if name not in allowed:
                raise self.fail(item, f"flag --{name} is not supported")
            found.append(flag)
        return found, rest

    def words(self, item: Instruction, text: str) -> list[str]:
        try:
            return _lex(text, self.variables())
        except ValueError as error:
            raise self.fail(item, str(error)) from None

    def exec_form(self, text: str) -> list[str] | None:
        if not text.startswith("["):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(part, str) for part in value):
            return value
        return None

    def command(self, text: str) -> list[str]:
        exec_form = self.exec_form(text)
        return exec_form if exec_form is not None else ["/bin/sh", "-c", text]

    def absolute(self, path: str) -> str:
        stage = self.stages[-1]
        joined = PurePosixPath(stage.workdir) / path
        normal = os.path.normpath(str(joined))
        return normal + ("/" if path.endswith("/") and normal != "/" else "")

    # -- instructions

    def _arg(self, item: Instruction) -> None:
        self.flags(item)
        for word in self.words(item, item.args) or [""]:
            name, has_default, default = word.partition("=")
            if not _NAME.fullmatch(name):
                raise self.fail(item, f"{word!r}: not NAME or NAME=default")
            self.declared.setdefault(name, item.line)
            if name in self.build_args:
                value: str | None = self.build_args[name]
            elif has_default:
                value = default
            else:
                value = self.globals.get(name) if self.stages else None
            if self.stages:
                if value is not None:
                    self.stages[-1].args[name] = value
            elif value is not None:
                self.globals[name] = value

    def _from(self, item: Instruction) -> None:
        self.flags(item)
        try:  # FROM sees only the ARGs before the first FROM
            words = _lex(item.args, self.globals)
        except ValueError as error:
            raise self.fail(item, str(error)) from None
        if len(words) not in (1, 3) or (len(words) == 3 and words[1].lower() != "as"):
            raise self.fail(item, f"{item.args!r}: not 'image' or 'image AS name'")
        image = words[0]
        name = words[2].lower() if len(words) == 3 else None
        if not image:
            raise self.fail(item, f"{item.args!r} names no image (an empty build arg?)")
        if name is not None and any(stage.name == name for stage in self.stages):
            raise self.fail(item, f"stage name {name!r} is used twice")
        index = len(self.stages)
        earlier = self.stage_named(image)
        if earlier is not None:
            stage = Stage(index, name, f"stage {earlier.index}", None, earlier.index,
                          dict(earlier.env), workdir=earlier.workdir, user=earlier.user,
                          entrypoint=list(earlier.entrypoint), cmd=list(earlier.cmd))  # fmt: skip
        elif image in self.images:
            base = self.images[image]
            config = base.config
            stage = Stage(index, name, image, base.rootfs, None, _env_dict(config.env),
                          workdir=config.working_dir or "/", user=config.user,
                          entrypoint=list(config.entrypoint), cmd=list(config.cmd))  # fmt: skip
        else:
            known = ", ".join(sorted(self.images)) or "none"
            raise self.fail(
                item, f"{image}: no earlier stage and no offline image of that name "
                f"(offline images: {known}; stages: {self.stage_names() or 'none'})",
            )  # fmt: skip
        stage.env.setdefault("PATH", DEFAULT_PATH)
        self.stages.append(stage)

    def stage_named(self, name: str) -> Stage | None:
        for stage in self.stages:
            if stage.name == name.lower() or str(stage.index) == name:
                return stage
        return None

    def stage_names(self) -> str:
        return ", ".join(stage.name or str(stage.index) for stage in self.stages)

    def _env(self, item: Instruction) -> None:
        self.flags(item)
        words = self.words(item, item.args)
        if words and "=" not in words[0]:
            if len(words) < 2:
                raise self.fail(item, f"{item.args!r}: not NAME=value")
            pairs = [(words[0], " ".join(words[1:]))]
        else:
            pairs = []
            for word in words:
                name, equals, value = word.partition("=")
                if not equals or not _NAME.fullmatch(name):
                    raise self.fail(item, f"{word!r}: not NAME=value")
                pairs.append((name, value))
        if not pairs:
            raise self.fail(item, "sets nothing")
        self.stages[-1].env.update(pairs)

    def _workdir(self, item: Instruction) -> None:
        self.flags(item)
        words = self.words(item, item.args)
        if len(words) != 1:
            raise self.fail(item, f"{item.args!r}: one path")
        stage = self.stages[-1]
        stage.workdir = self.absolute(words[0]).rstrip("/") or "/"
        stage.steps.append(Workdir(stage.workdir))

    def _copy(self, item: Instruction) -> None:
        _, rest = self.flags(item)
        exec_form = self.exec_form(rest)
        words = exec_form if exec_form is not None else self.words(item, rest)
        if len(words) < 2:
            raise self.fail(item, f"{rest!r}: needs a source and a destination")
        *sources, dest = words
        for source in sources:
            if any(char in source for char in "*?["):
                raise self.fail(item, f"{source}: wildcards are not supported")
            if os.path.normpath(source).startswith(".."):
                raise self.fail(item, f"{source}: outside the build context")
        if len(sources) > 1 and not dest.endswith("/"):
            raise self.fail(item, f"with {len(sources)} sources needs a destination ending in /")
        self.stages[-1].steps.append(Copy(self.where(item), tuple(sources), self.absolute(dest)))

    def _run(self, item: Instruction) -> None:
        flags, rest = self.flags(item, allowed=("mount",))
        mounts = tuple(self.mount(item, flag.split("=", 1)[1] if "=" in flag else "")
                       for flag in flags)  # fmt: skip
        if not rest:
            raise self.fail(item, "has no command")
        stage = self.stages[-1]
        env = {**stage.args, **stage.env}
        stage.steps.append(Run(self.where(item), rest, tuple(self.command(rest)),
                               tuple(env.items()), stage.workdir, stage.user, mounts))  # fmt: skip

    def mount(self, item: Instruction, spec: str) -> Mount:
        fields: dict[str, str] = {}
        for part in spec.split(","):
            key, equals, value = part.partition("=")
            key = {"src": "source", "dst": "target", "destination": "target"}.get(key, key)
            if not equals or key not in ("type", "from", "source", "target"):
                raise self.fail(item, f"--mount={spec}: {part!r} is not supported "
                                "(type=bind,from=STAGE,source=..,target=..)")  # fmt: skip
            fields[key] = value
        if fields.get("type") != "bind":
            raise self.fail(item, f"--mount={spec}: only type=bind is supported")
        if "from" not in fields or "target" not in fields:
            raise self.fail(item, f"--mount={spec}: needs from=STAGE and target=")
        stage = self.stage_named(fields["from"])
        if stage is None:
            raise self.fail(item, f"--mount={spec}: from={fields['from']} names no earlier stage "
                            f"(stages: {self.stage_names()})")  # fmt: skip
        source = "/" + fields.get("source", "/").strip("/")
        return Mount(stage.index, source, self.absolute(fields["target"]).rstrip("/") or "/")

    def _user(self, item: Instruction) -> None:
        self.flags(item)
        words = self.words(item, item.args)
        if len(words) != 1:
            raise self.fail(item, f"{item.args!r}: one user[:group]")
        self.stages[-1].user = words[0]

    def _entrypoint(self, item: Instruction) -> None:
        self.flags(item)
        self.stages[-1].entrypoint = self.command(item.args)
        self.stages[-1].cmd = []  # Docker: a new ENTRYPOINT resets the base's CMD

    def _cmd(self, item: Instruction) -> None:
        self.flags(item)
        self.stages[-1].cmd = self.command(item.args)


def _lex(text: str, variables: Mapping[str, str]) -> list[str]:
    """Docker's word processing: quotes, backslashes, ``$`` substitutions; words on blanks."""
    words: list[str] = []
    current: list[str] = []
    started = False
    index = 0
    while index < len(text):
        char = text[index]
        if char in " \t":
            if started:
                words.append("".join(current))
                current, started = [], False
            index += 1
            continue
        started = True
        if char == "\\":
            current.append(text[index + 1 : index + 2])
            index += 2
        elif char == "'":
            end = text.find("'", index + 1)
            if end < 0:
                raise ValueError(f"{text!r}: unterminated '")
            current.append(text[index + 1 : end])
            index = end + 1
        elif char == '"':
            index += 1
            while True:
                if index >= len(text):
                    raise ValueError(f'{text!r}: unterminated "')
                char = text[index]
                if char == '"':
                    index += 1
                    break
                if char == "\\" and text[index + 1 : index + 2] in ('"', "$", "\\"):
                    current.append(text[index + 1])
                    index += 2
                elif char == "$":
                    value, index = _substitute(text, index, variables)
                    current.append(value)
                else:
                    current.append(char)
                    index += 1
        elif char == "$":
            value, index = _substitute(text, index, variables)
            current.append(value)
        else:
            current.append(char)
            index += 1
    if started:
        words.append("".join(current))
    return words


def _substitute(text: str, index: int, variables: Mapping[str, str]) -> tuple[str, int]:
    """The value of the substitution at ``text[index]`` (a ``$``) and the index after it."""
    if text.startswith("${", index):
        end = text.find("}", index)
        if end < 0:
            raise ValueError(f"{text!r}: unterminated ${{")
        body = text[index + 2 : end]
        name = _NAME.match(body)
        if name is None:
            raise ValueError(f"${{{body}}}: not a variable name")
        rest = body[name.end() :]
        value = variables.get(name.group())
        if not rest:
            return value or "", end + 1
        if rest.startswith(":-"):
            return value or rest[2:], end + 1
        if rest.startswith(":+"):
            return (rest[2:] if value else ""), end + 1
        raise ValueError(f"${{{body}}}: substitution {rest[:2]!r} is not supported")
    name = _NAME.match(text, index + 1)
    if name is None:
        return "$", index + 1
    return variables.get(name.group(), ""), name.end()


class Ignore:
    """A ``.dockerignore``: the last pattern matching a path (or a parent of it) decides."""

    def __init__(self, text: str) -> None:
        self.patterns: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
            self.patterns.append((negated, re.compile(_glob_regex(pattern))))

    def excluded(self, relative: str) -> bool:
        parts = PurePosixPath(relative).parts
        candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
        verdict = False
        for negated, pattern in self.patterns:
            if any(pattern.fullmatch(path) for path in candidates):
                verdict = not negated
        return verdict


def _glob_regex(pattern: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return "".join(out)


class Plan:
    """A Dockerfile evaluated against its build arguments: stages, steps, the final config."""

    def __init__(
        self, dockerfile: Dockerfile, stages: list[Stage], build_args: Mapping[str, str]
    ) -> None:
        self.file = dockerfile
        self.stages = stages
        self.build_args = dict(build_args)

    @property
    def config(self) -> ImageConfig:
        return self.stages[-1].config()

    def ignore(self, context: Path) -> Ignore:
        beside = self.file.path.with_name(self.file.path.name + ".dockerignore")
        for candidate in (beside, context / ".dockerignore"):
            if candidate.is_file():
                return Ignore(candidate.read_text())
        return Ignore("")

    def context_files(self, context: Path, copy: Copy) -> Iterator[tuple[str, Path, str]]:
        """(source, file or directory in the context, its path under the destination)."""
        ignore = self.ignore(context)
        for source in copy.sources:
            relative = os.path.normpath(source)
            root = context / relative
            # A directory excluded itself may hold files a ! pattern admits (BuildKit walks it).
            gone = not root.exists() or (root.is_file() and ignore.excluded(relative))
            if relative.startswith("..") or gone:
                raise DockerfileError(
                    f"{copy.where}: COPY {source}: not in the build context {context} "
                    "or excluded by its .dockerignore"
                )
            if root.is_file():
                into_dir = copy.dest.endswith("/") or len(copy.sources) > 1
                yield source, root, root.name if into_dir else ""
                continue
            for path in sorted(root.rglob("*")):
                if not ignore.excluded(path.relative_to(context).as_posix()) and (
                    path.is_file() or path.is_dir()
                ):
                    yield source, path, path.relative_to(root).as_posix()

    def digest(self, context: Path, extra: Sequence[str] = ()) -> str:
        """Of the Dockerfile, build args, .dockerignore, every file its COPYs read, ``extra``."""
        digest = hashlib.sha256(self.file.path.read_bytes() + b"\0")
        digest.update(json.dumps(sorted(self.build_args.items())).encode() + b"\0")
        for item in (*extra, self.ignore_text(context), Path(__file__).read_text()):
            digest.update(item.encode() + b"\0")
        for stage in self.stages:
            for copy in (step for step in stage.steps if isinstance(step, Copy)):
                for _, path, inner in self.context_files(context, copy):
                    digest.update(f"{copy.dest}\0{inner}\0{path.stat().st_mode:o}\0".encode())
                    if path.is_file():
                        digest.update(path.read_bytes() + b"\0")
        return digest.hexdigest()[:16]

    def ignore_text(self, context: Path) -> str:
        beside = self.file.path.with_name(self.file.path.name + ".dockerignore")
        for candidate in (beside, context / ".dockerignore"):
            if candidate.is_file():
                return candidate.read_text()
        return ""

    def execute(
        self, context: Path, work: Path, log: Path,
        run_env: Mapping[str, str] = {}, run_mounts: Sequence[tuple[Path, str]] = (),
    ) -> Built:  # fmt: skip
        """Builds every stage under ``work``; the last stage's tree and config.

        ``run_env`` is added to every RUN's environment and ``run_mounts`` (host
        directory, target) are bind-mounted read-only into every RUN: the
        builder's pip configuration and wheelhouse.
        """
        trees: list[Path] = []
        work.mkdir(parents=True, exist_ok=True)
        for stage in self.stages:
            rootfs = work / f"stage-{stage.index}"
            source = (
                stage.base_rootfs if stage.base_rootfs is not None else trees[stage.base_stage or 0]
            )
            if not source.is_dir():
                raise DockerfileError(
                    f"{self.file.display}: the image {stage.base} has no tree {source}"
                )
            run_logged(["cp", "-a", "--", str(source), str(rootfs)], log,
                        f"{self.file.display}: copying {stage.base}'s tree")  # fmt: skip
            trees.append(rootfs)
            for step in stage.steps:
                if isinstance(step, Workdir):
                    _inside(rootfs, step.path).mkdir(parents=True, exist_ok=True)
                elif isinstance(step, Copy):
                    self.copy(context, rootfs, step)
                else:
                    mounts = [
                        (trees[m.stage] / m.source.lstrip("/"), m.target) for m in step.mounts
                    ]
                    _run_step(rootfs, step, [*mounts, *((p, t) for p, t in run_mounts)],
                              {**dict(step.env), **run_env}, log)  # fmt: skip
        return Built(trees[-1], self.config)

    def copy(self, context: Path, rootfs: Path, copy: Copy) -> None:
        for _, path, inner in self.context_files(context, copy):
            target = _inside(rootfs, copy.dest.rstrip("/") + ("/" + inner if inner else ""))
            if not inner and target.is_dir():  # COPY file dir: into the existing directory
                target = target / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                target.mkdir(exist_ok=True)
                shutil.copystat(path, target)
            else:
                shutil.copy2(path, target)


def _inside(rootfs: Path, path: str) -> Path:
    return rootfs / path.lstrip("/")


def run_logged(
    argv: list[str], log: Path, what: str, env: Mapping[str, str] | None = None,
    shown: str = "",
) -> None:  # fmt: skip
    """``argv`` run with its output appended to ``log``; a failure or a run past
    ``RUN_SECONDS`` is one line naming ``what`` and the log (node_images uses it too)."""
    with log.open("a") as sink:
        sink.write(f"{shown or '$ ' + ' '.join(argv)}\n")
        sink.flush()
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                env=None if env is None else dict(env), timeout=RUN_SECONDS, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise DockerfileError(f"{what} took over {RUN_SECONDS} s; see {log}") from None
    if done.returncode != 0:
        raise DockerfileError(f"{what} failed (exit {done.returncode}); see {log}")


def _run_step(
    rootfs: Path, step: Run, mounts: Sequence[tuple[Path, str]], env: Mapping[str, str], log: Path
) -> None:
    user = step.user
    if user and not re.fullmatch(r"\d+(:\d+)?", user):
        raise DockerfileError(
            f"{step.where}: RUN after USER {user}: only numeric users are supported"
        )
    if user and ":" not in user:
        user = f"{user}:{user}"
    created: list[Path] = []
    for source, target in mounts:
        if not source.is_dir():
            raise DockerfileError(f"{step.where}: RUN --mount source {source} is not a directory")
        point = _inside(rootfs, target)
        missing = [point, *point.parents]
        missing = [path for path in missing if not path.exists() and rootfs in path.parents]
        point.mkdir(parents=True, exist_ok=True)
        created.extend(missing)  # deepest first: removed in this order after the RUN
    environment = {"HOME": "/root", **env}
    pairs = [str(part) for source, target in mounts for part in (source, target)]
    tools = [shutil.which(tool, path=HOST_PATH) for tool in ("unshare", "mount", "chroot")]
    if None in tools:
        raise DockerfileError(f"{step.where}: RUN needs unshare, mount and chroot on the host")
    unshare, mount, chroot = (str(tool) for tool in tools)
    argv = [unshare, "--mount", "--net", "--", "/bin/sh", "-c", _RUNNER, "run", str(rootfs),
            user, step.workdir, mount, chroot, str(len(mounts)), *pairs, *step.argv]  # fmt: skip
    shown = f"== {step.where}: RUN {step.text}  (in {rootfs}, mounts {pairs or 'none'})"
    try:
        run_logged(argv, log, f"{step.where}: RUN", environment, shown)
    finally:
        for path in created:
            path.rmdir()

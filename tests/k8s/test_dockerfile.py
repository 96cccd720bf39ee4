"""The Dockerfile executor (``dockerfile.py``) that builds the tests' treadle image, no node needed.

It reads the real ``docker/Dockerfile``; its plan's config is the file's
(user 10001:10001, entrypoint, cmd, the venv on PATH, workdir); bad input fails
with one line naming the Dockerfile's line; COPY honours the .dockerignore; a
RUN runs in the stage's tree with its bind mounts read-only and no network.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from .dockerfile import BaseImage, Dockerfile, DockerfileError, Plan
from .harness import Kube
from .node import RealNode
from .node_images import BASE_IMAGE, DOCKERFILE, REPO
from .oci_image import DEFAULT_ENV_PATH, ImageConfig

BASE_CONFIG = ImageConfig(cmd=["python3"])


def _public_plan(tmp_path: Path, **build_args: str) -> Plan:
    dockerfile = Dockerfile.parse(DOCKERFILE, "docker/Dockerfile")
    images = {BASE_IMAGE: BaseImage(tmp_path, BASE_CONFIG)}
    return dockerfile.plan(build_args, images)


def _line(keyword: str) -> tuple[int, str]:
    """The line number and arguments of ``keyword``'s last line in docker/Dockerfile."""
    found = [(number, line.split(None, 1)[1])
             for number, line in enumerate(DOCKERFILE.read_text().splitlines(), start=1)
             if line.startswith(keyword + " ")]  # fmt: skip
    assert found, keyword
    return found[-1]


def test_the_public_dockerfile_gives_the_config_it_declares(tmp_path: Path) -> None:
    plan = _public_plan(tmp_path, BASE=BASE_IMAGE)
    config = plan.config
    # What the chart (runAsUser 10001) and the operator's pods rely on.
    assert config.user == "10001:10001" == _line("USER")[1]
    assert config.entrypoint == ["treadle"] == json.loads(_line("ENTRYPOINT")[1])
    assert config.cmd == ["--help"] == json.loads(_line("CMD")[1])
    assert config.working_dir == "/home/treadle" == _line("WORKDIR")[1]
    env = dict(item.split("=", 1) for item in config.env)
    # The venv first, then the base image's PATH ($PATH expanded from the base's Env).
    assert env["PATH"] == "/opt/treadle/bin:" + DEFAULT_ENV_PATH.removeprefix("PATH=")
    assert env["PYTHONUNBUFFERED"] == "1" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    chart = (REPO / "charts" / "treadle" / "templates" / "deployment.yaml").read_text()
    assert "runAsUser: 10001" in chart and "runAsGroup: 10001" in chart
    # Two stages FROM the base build arg; the final one's install binds the build's wheels.
    build, final = plan.stages
    assert (build.name, build.base, final.base) == ("build", BASE_IMAGE, BASE_IMAGE)
    mounts = [mount for step in final.steps for mount in getattr(step, "mounts", ())]
    assert [(m.stage, m.source, m.target) for m in mounts] == [(0, "/wheels", "/wheels")]


def test_the_public_default_base_is_python_slim(tmp_path: Path) -> None:
    """Without the build arg both stages are FROM python:3.11-slim, as `docker build` does."""
    with pytest.raises(DockerfileError) as raised:
        Dockerfile.parse(DOCKERFILE, "docker/Dockerfile").plan({}, {})
    line = next(number for number, text in enumerate(DOCKERFILE.read_text().splitlines(), 1)
                if text.startswith("FROM "))  # fmt: skip
    assert str(raised.value).startswith(f"docker/Dockerfile:{line}: FROM python:3.11-slim: ")
    images = {"python:3.11-slim": BaseImage(tmp_path, BASE_CONFIG)}
    plan = Dockerfile.parse(DOCKERFILE, "docker/Dockerfile").plan({}, images)
    assert [stage.base for stage in plan.stages] == ["python:3.11-slim"] * 2


def _fails(tmp_path: Path, text: str, build_args: dict[str, str] | None = None) -> str:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    images = {"base": BaseImage(tmp_path, BASE_CONFIG)}
    with pytest.raises(DockerfileError) as raised:
        Dockerfile.parse(path, "Dockerfile").plan(build_args or {}, images)
    message = str(raised.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("text", "build_args", "expected"),
    [
        ("FROM base\nLABEL a=b\n", None,
         r"Dockerfile:2: LABEL is not supported by tests/k8s/dockerfile\.py \(supported: ARG, "),
        ("FROM base AS one\n\nFROM two\n", None,
         r"Dockerfile:3: FROM two: no earlier stage and no offline image of that name "
         r"\(offline images: base; stages: one\)"),
        ("FROM base\nRUN --mount=type=bind,from=nope,target=/w true\n", None,
         r"Dockerfile:2: RUN --mount=type=bind,from=nope,target=/w: from=nope names no "
         r"earlier stage"),
        ("FROM base\nRUN --mount=type=cache,target=/w true\n", None,
         r"Dockerfile:2: RUN --mount=type=cache,target=/w: only type=bind is supported"),
        ("FROM base\nRUN --network=none true\n", None,
         r"Dockerfile:2: RUN flag --network is not supported"),
        ("FROM base\nCOPY --chown=1:1 a /a\n", None,
         r"Dockerfile:2: COPY flag --chown is not supported"),
        ("FROM base\nENV A=${B:?unset}\n", None,
         r"Dockerfile:2: ENV \$\{B:\?unset\}: substitution ':\?' is not supported"),
        ("FROM base\nRUN <<EOF\ntrue\nEOF\n", None,
         r"Dockerfile:2: RUN with a heredoc is not supported"),
        ("ENV A=1\nFROM base\n", None, r"Dockerfile:1: ENV before the first FROM"),
        # Bad build args: one no ARG declares, one naming no image, an empty one.
        ("ARG BASE=base\nFROM ${BASE}\n", {"BSAE": "base"},
         r"Dockerfile: build arg BSAE is declared by no ARG \(declared: BASE at line 1\)$"),
        ("ARG BASE=base\nFROM ${BASE}\n", {"BASE": "python:3.11-slim"},
         r"Dockerfile:2: FROM python:3\.11-slim: no earlier stage and no offline image"),
        ("ARG BASE=base\nFROM ${BASE}\n", {"BASE": ""},
         r"Dockerfile:2: FROM '\$\{BASE\}' names no image \(an empty build arg\?\)"),
    ],
)  # fmt: skip
def test_bad_input_fails_with_one_line_naming_the_line(
    tmp_path: Path, text: str, build_args: dict[str, str] | None, expected: str
) -> None:
    message = _fails(tmp_path, text, build_args)
    assert re.match(expected, message), message


def test_copy_follows_the_dockerignore_and_the_workdir(tmp_path: Path) -> None:
    context, base, work = tmp_path / "context", tmp_path / "base", tmp_path / "work"
    for path, body in {"pyproject.toml": "p", "README.md": "r", "secret.txt": "s",
                       "pkg/a.py": "a", "pkg/sub/b.py": "b", "pkg/__pycache__/a.pyc": "c",
                       "pkg/x.egg-info/PKG-INFO": "e"}.items():  # fmt: skip
        (context / path).parent.mkdir(parents=True, exist_ok=True)
        (context / path).write_text(body)
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "os-release").write_text("base")
    work.mkdir()
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(
        "FROM base AS build\nWORKDIR /src\nCOPY pyproject.toml README.md ./\nCOPY pkg pkg\n"
        'FROM build\nENV A=1 B="two words"\nUSER 5:6\n'
    )
    # The public file's own ignore patterns, beside this Dockerfile (BuildKit's rule).
    shutil.copyfile(REPO / "docker" / "Dockerfile.dockerignore",
                    context / "Dockerfile.dockerignore")  # fmt: skip
    (context / "Dockerfile.dockerignore").write_text(
        (context / "Dockerfile.dockerignore").read_text().replace("runtime", "pkg")
    )
    plan = Dockerfile.parse(dockerfile, "Dockerfile").plan({}, {"base": BaseImage(base)})
    built = plan.execute(context, work, tmp_path / "build.log")
    files = sorted(str(p.relative_to(built.rootfs)) for p in built.rootfs.rglob("*") if p.is_file())
    assert files == ["etc/os-release", "src/README.md", "src/pkg/a.py", "src/pkg/sub/b.py",
                     "src/pyproject.toml"]  # fmt: skip
    assert built.config.user == "5:6" and built.config.working_dir == "/src"
    assert "B=two words" in built.config.env
    # Excluded by the .dockerignore: an error naming the line, as BuildKit's.
    dockerfile.write_text("FROM base\nCOPY secret.txt /\n")
    plan = Dockerfile.parse(dockerfile, "Dockerfile").plan({}, {"base": BaseImage(base)})
    with pytest.raises(DockerfileError, match=r"^Dockerfile:2: COPY secret\.txt: not in the "):
        plan.execute(context, tmp_path / "work2", tmp_path / "build.log")


def test_a_run_has_no_network_and_its_mounts_are_read_only(
    tmp_path: Path, kube: Kube, real_node: RealNode
) -> None:
    """In a copy of the real node's Debian tree (skipped, with the reason, without it).

    ``real_node`` builds that tree first (a session fixture, so at most once). Without it
    a fresh machine skipped this test: it ran before any node test had built the tree."""
    del real_node
    base_rootfs = kube.control_plane.binaries.cache / "node" / "base-rootfs"
    if not (base_rootfs / ".complete").is_file() or not shutil.which("unshare"):
        pytest.skip(f"no debootstrap tree at {base_rootfs} (tests/k8s/build_node.sh builds it)")
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "w.whl").write_text("w")
    probe = (
        "import os, socket\n"
        "print('env', os.environ['PIP_FIND_LINKS'], os.environ['NAME'], os.getcwd())\n"
        "print('files', sorted(os.listdir('/wheelhouse')), sorted(os.listdir('/from-build')))\n"
        "try: open('/wheelhouse/x', 'w')\n"
        "except OSError as error: print('write', error.strerror)\n"
        "try: socket.create_connection(('192.0.2.1', 80), timeout=3)\n"
        "except OSError as error: print('net', error.strerror)\n"
    )
    (tmp_path / "probe.py").write_text(probe)
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM base AS build\nRUN mkdir /out && echo made > /out/made.txt\n"
        "FROM base\nARG NAME=default\nWORKDIR /work\nCOPY probe.py ./\n"
        "RUN --mount=type=bind,from=build,source=/out,target=/from-build \\\n"
        "    python3 probe.py > /work/result.txt\n"
    )
    images = {"base": BaseImage(base_rootfs, ImageConfig())}
    plan = Dockerfile.parse(dockerfile, "Dockerfile").plan({"NAME": "given"}, images)
    work = tmp_path / "work"
    work.mkdir()
    try:
        built = plan.execute(
            tmp_path, work, tmp_path / "build.log",
            run_env={"PIP_FIND_LINKS": "/wheelhouse"}, run_mounts=[(wheelhouse, "/wheelhouse")],
        )  # fmt: skip
        lines = (built.rootfs / "work" / "result.txt").read_text().splitlines()
        assert lines == [
            "env /wheelhouse given /work",
            "files ['w.whl'] ['made.txt']",
            "write Read-only file system",
            "net Network is unreachable",
        ], (tmp_path / "build.log").read_text()[-2000:]
        # The mount points the build made are gone; nothing was written to the wheelhouse.
        assert not (built.rootfs / "wheelhouse").exists()
        assert not (built.rootfs / "from-build").exists()
        assert sorted(p.name for p in wheelhouse.iterdir()) == ["w.whl"]
        # A failing RUN: one line naming its line and the log.
        dockerfile.write_text("FROM base\n\nRUN exit 7\n")
        failing = Dockerfile.parse(dockerfile, "Dockerfile").plan({}, images)
        with pytest.raises(DockerfileError) as raised:
            failing.execute(tmp_path, tmp_path / "work2", tmp_path / "build.log")
        assert str(raised.value) == (
            f"Dockerfile:3: RUN failed (exit 7); see {tmp_path / 'build.log'}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp_path / "work2", ignore_errors=True)

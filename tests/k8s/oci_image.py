"""Writes an OCI image archive from a root filesystem, without Docker.

``write_oci_archive`` packs a directory (a debootstrap tree, say) as one
uncompressed layer with GNU tar (numeric owners, sorted names, so the same tree
gives the same digest), writes the image config and manifest, and puts the
whole OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/…``) in
one tar file that ``ctr images import`` reads. The index names the image with
the ``io.containerd.image.name`` annotation, the name pods use (with
``imagePullPolicy: Never``: nothing is ever pulled).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CHUNK = 1 << 20
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
DEFAULT_ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildError(RuntimeError):
    """An image could not be packed."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config the test images set."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=lambda: [DEFAULT_ENV_PATH])
    user: str = ""
    working_dir: str = ""

    def as_json(self, diff_id: str) -> dict[str, object]:
        config: dict[str, object] = {"Env": self.env}
        if self.entrypoint:
            config["Entrypoint"] = self.entrypoint
        if self.cmd:
            config["Cmd"] = self.cmd
        if self.user:
            config["User"] = self.user
        if self.working_dir:
            config["WorkingDir"] = self.working_dir
        return {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "tests/k8s/oci_image.py"}],
        }


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    data: bytes | None = None
    path: Path | None = None


def _json_blob(document: dict[str, object]) -> Blob:
    data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data)


def _names(name: str) -> dict[str, str]:
    """The index annotations ``ctr images import`` names an image by."""
    return {"io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}  # fmt: skip


def _layer(rootfs: Path, into: Path) -> Blob:
    """``rootfs`` as one tar layer in the file ``into``; its digest and size."""
    argv = ["tar", "--numeric-owner", "--sort=name", "--xattrs", "-C", str(rootfs), "-cf", "-", "."]
    digest = hashlib.sha256()
    size = 0
    with (
        into.open("wb") as sink,
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tar,
    ):
        assert tar.stdout is not None
        while chunk := tar.stdout.read(CHUNK):
            digest.update(chunk)
            sink.write(chunk)
            size += len(chunk)
        errors = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
    if tar.returncode != 0:
        raise ImageBuildError(f"tar of {rootfs} failed (exit {tar.returncode}): {errors[-500:]}")
    return Blob("sha256:" + digest.hexdigest(), size, path=into)


def _add(archive: tarfile.TarFile, name: str, blob: Blob) -> None:
    if blob.path is not None:
        archive.add(str(blob.path), arcname=name, recursive=False)
        return
    assert blob.data is not None
    info = tarfile.TarInfo(name)
    info.size = len(blob.data)
    archive.addfile(info, io.BytesIO(blob.data))


def write_oci_archive(rootfs: Path, out: Path, name: str, config: ImageConfig) -> str:
    """Packs ``rootfs`` as image ``name`` into the OCI archive ``out``; the manifest digest."""
    if not rootfs.is_dir():
        raise ImageBuildError(f"{rootfs} is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch:
        layer = _layer(rootfs, Path(scratch) / "layer.tar")
        image_config = _json_blob(config.as_json(layer.digest))
        manifest = _json_blob({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": image_config.digest,
                       "size": image_config.size},
            "layers": [{"mediaType": OCI_LAYER, "digest": layer.digest, "size": layer.size}],
        })  # fmt: skip
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": OCI_MANIFEST, "digest": manifest.digest, "size": manifest.size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": _names(name),
            }],
        }  # fmt: skip
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w") as archive:
            _add(archive, "oci-layout", _json_blob({"imageLayoutVersion": "1.0.0"}))
            _add(archive, "index.json", _json_blob(index))
            for blob in (layer, image_config, manifest):
                _add(archive, "blobs/sha256/" + blob.digest.removeprefix("sha256:"), blob)
        partial.replace(out)
    return manifest.digest


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    if member is None:
        raise ImageBuildError(f"{archive.name!s}: no {name}")
    return member.read()


def extend_oci_archive(base: Path, layer_root: Path, out: Path, name: str) -> str:
    """``FROM base`` + ``COPY layer_root /``: the image ``name`` in ``out``, one layer more.

    The base's layers are copied as they are; its config (entrypoint, user, env)
    is kept, with the new layer's diff id added. Returns the new manifest digest.
    """
    if not layer_root.is_dir():
        raise ImageBuildError(f"{layer_root} is not a directory")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch:
        layer = _layer(layer_root, Path(scratch) / "layer.tar")
        with tarfile.open(base) as source:
            index = json.loads(_read_member(source, "index.json"))
            entry = index["manifests"][0]
            blob = "blobs/sha256/{}"
            manifest = json.loads(_read_member(source, blob.format(entry["digest"][7:])))
            config = json.loads(_read_member(source, blob.format(manifest["config"]["digest"][7:])))
            config["rootfs"]["diff_ids"].append(layer.digest)
            config["history"].append({"created_by": f"tests/k8s/oci_image.py: COPY {layer_root}"})
            image_config = _json_blob(config)
            manifest["config"] = {"mediaType": OCI_CONFIG, "digest": image_config.digest,
                                  "size": image_config.size}  # fmt: skip
            manifest["layers"].append(
                {"mediaType": OCI_LAYER, "digest": layer.digest, "size": layer.size}
            )
            new_manifest = _json_blob(manifest)
            entry = {**entry, "digest": new_manifest.digest, "size": new_manifest.size,
                     "annotations": _names(name)}  # fmt: skip
            partial = out.with_name(out.name + ".partial")
            with tarfile.open(partial, "w") as archive:
                _add(archive, "oci-layout", _json_blob({"imageLayoutVersion": "1.0.0"}))
                _add(archive, "index.json", _json_blob({"schemaVersion": 2, "manifests": [entry]}))
                for old in manifest["layers"][:-1]:
                    info = source.getmember(blob.format(old["digest"][7:]))
                    archive.addfile(info, source.extractfile(info))
                for new in (layer, image_config, new_manifest):
                    _add(archive, blob.format(new.digest.removeprefix("sha256:")), new)
            partial.replace(out)
    return new_manifest.digest


def manifest_digest(archive: Path) -> str:
    """The digest of the (first) image manifest in the OCI archive ``archive``."""
    with tarfile.open(archive) as source:
        index = json.loads(_read_member(source, "index.json"))
    return str(index["manifests"][0]["digest"])


def tagged_oci_archive(base: Path, layers: dict[str, Path], out: Path, *, thin: bool) -> None:
    """``FROM base`` + one layer each: the images ``layers`` names, in one archive ``out``.

    ``thin``: the base's layers are left out (a runtime that has imported ``base``
    holds them already, and importing them again reads the whole base); else they
    are in the archive once, shared by every image.
    """
    with (
        tempfile.TemporaryDirectory(dir=out.parent, prefix=".oci-") as scratch,
        tarfile.open(base) as source,
    ):
        index = json.loads(_read_member(source, "index.json"))
        entry = index["manifests"][0]
        blob = "blobs/sha256/{}"
        manifest = json.loads(_read_member(source, blob.format(entry["digest"][7:])))
        config = json.loads(_read_member(source, blob.format(manifest["config"]["digest"][7:])))
        entries: list[dict[str, object]] = []
        blobs: list[Blob] = []
        for number, (name, root) in enumerate(sorted(layers.items())):
            if not root.is_dir():
                raise ImageBuildError(f"{root} is not a directory")
            layer = _layer(root, Path(scratch) / f"layer-{number}.tar")
            image = json.loads(json.dumps(config))
            image["rootfs"]["diff_ids"].append(layer.digest)
            image["history"].append({"created_by": f"tests/k8s/oci_image.py: {name}"})
            image_config = _json_blob(image)
            made = json.loads(json.dumps(manifest))
            made["config"] = {"mediaType": OCI_CONFIG, "digest": image_config.digest,
                              "size": image_config.size}  # fmt: skip
            made["layers"].append(
                {"mediaType": OCI_LAYER, "digest": layer.digest, "size": layer.size}
            )
            new_manifest = _json_blob(made)
            entries.append({**entry, "digest": new_manifest.digest, "size": new_manifest.size,
                            "annotations": _names(name)})  # fmt: skip
            blobs += [layer, image_config, new_manifest]
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w") as archive:
            _add(archive, "oci-layout", _json_blob({"imageLayoutVersion": "1.0.0"}))
            _add(archive, "index.json", _json_blob({"schemaVersion": 2, "manifests": entries}))
            if not thin:
                for old in manifest["layers"]:
                    info = source.getmember(blob.format(old["digest"][7:]))
                    archive.addfile(info, source.extractfile(info))
            written = set()
            for new in blobs:
                if new.digest not in written:
                    written.add(new.digest)
                    _add(archive, blob.format(new.digest.removeprefix("sha256:")), new)
        partial.replace(out)

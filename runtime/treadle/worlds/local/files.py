"""The local World's directory and files: private to their owner, never through a symlink.

A local World holds run inputs, outputs, errors and stack traces, so its directory
is ``0700`` and its files (``treadle.db`` with its ``-wal`` and ``-shm``, the lock
files) ``0600``, whatever the umask; a directory another user owns is refused,
and an existing World made before this rule is tightened when its owner opens it.
The lock files are opened with ``O_NOFOLLOW``: a symlink planted at their path is
refused with a clear error instead of being truncated (security.md L2). A
``.gitignore`` holding ``*`` keeps the default ``.treadle/`` out of a checkout.

Called by ``database`` on the database thread (everything here blocks).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from treadle import errors

log = logging.getLogger("treadle.worlds.local")

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
SQLITE_SUFFIXES = ("", "-wal", "-shm")


def prepare_directory(directory: Path) -> None:
    """Create ``directory`` (``0700``), or check an existing one is ours and tighten it."""
    try:
        directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        info = os.stat(directory, follow_symlinks=True)
    except OSError as exc:
        raise errors.StorageUnavailable(
            f"cannot create the local World directory {directory}: {exc.strerror}"
        ) from exc
    if info.st_uid != os.getuid():
        raise errors.StorageUnavailable(
            f"the local World directory {directory} belongs to uid {info.st_uid}, not to this "
            f"user (uid {os.getuid()}); refusing to use a directory another user controls"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(directory, DIRECTORY_MODE)
        log.info("local World %s: directory made private (0700)", directory)
    _write_gitignore(directory / ".gitignore")


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of a regular file ``0600``, created if missing, never through a symlink."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if os.path.islink(path):
            raise errors.StorageUnavailable(
                f"{path} is a symbolic link; a local World never follows one (remove it)"
            ) from None
        raise errors.StorageUnavailable(f"cannot open {path}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise errors.StorageUnavailable(f"{path} is not a regular file; refusing to use it")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.fchmod(fd, FILE_MODE)
    return fd


def prepare_database(path: Path) -> None:
    """Create a missing database file ``0600`` before SQLite opens it (its ``-wal`` and
    ``-shm`` then get the same mode); refuse a symlink there. An existing file is left
    as it is until ``tighten_database`` (after it proved to be treadle's)."""
    if os.path.islink(path):
        raise errors.StorageUnavailable(
            f"{path} is a symbolic link; a local World never follows one (remove it)"
        )
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return
    except OSError as exc:
        raise errors.StorageUnavailable(f"cannot create {path}: {exc.strerror}") from None
    os.close(fd)


def tighten_database(path: Path) -> None:
    """``chmod 0600`` the database, WAL and SHM files that exist (not through symlinks)."""
    for suffix in SQLITE_SUFFIXES:
        one = path.with_name(path.name + suffix)
        try:
            info = os.lstat(one)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise errors.StorageUnavailable(
                f"{one} is a symbolic link; a local World never follows one (remove it)"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.chmod(one, FILE_MODE)


def _write_gitignore(path: Path) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        return
    except OSError as exc:  # a read-only directory still serves: the ignore file is a nicety
        log.debug("local World: no .gitignore written at %s: %s", path, exc.strerror)
        return
    with os.fdopen(fd, "w") as handle:
        handle.write("# A treadle local World: never commit it.\n*\n")

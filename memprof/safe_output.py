"""Writing an output file (an export, a report page, folded stacks) without following a
planted symbolic link: the one way `memprof report` and `memprof export` write files.

A path like `run.memprof.pftrace` sits in a folder its owner controls. Opened by name, a
symbolic link planted there would make whoever runs memprof (root, or a colleague) write
where the link points. So an output file is never opened by name: it is written to a fresh
temporary file, created exclusively (O_EXCL, O_NOFOLLOW) in the same folder, and renamed
over the final name when complete. rename(2) replaces a link, a hard link or a file at that
name; it never writes through it. A reader never sees a half-written file either.

Two things are written in place rather than replaced: a device or FIFO that already exists
(`-o /dev/null`, a named pipe), and a link that only root could have made (owned by root, in
a folder only root can write: `/dev/stdout`). Nothing else at the final name is followed.
The folders above it are opened one at a time (`open_folder`), following only links that
root or this process's user made: root run without sudo is not led into /etc by a folder a
user swapped for a link. (Run through sudo, memprof is that user by then: memprof.privileges.)

An output directory (`run.memprof.export/`) is created if missing and must be a real
directory: a link there is refused (UnsafeOutputError). Its files are written as above,
relative to the directory's file descriptor, so the directory cannot be swapped under them.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from memprof.errors import MemprofError

_TEMP_ATTEMPTS = 16
_NAME_KEPT = 200  # of the final name, in the temporary one (names are at most 255 bytes)
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links in one lookup (ELOOP past it)


class UnsafeOutputError(MemprofError):
    """An output path that memprof will not write through: a symbolic link where a directory
    is needed, another user's link on the way to the folder, a file where a directory is
    needed."""


@contextmanager
def output_file(path: str | os.PathLike, *, dir_fd: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write the output at `path` (relative to `dir_fd` when given). It
    takes the final name only when the block ends without an exception; on one, nothing is
    left behind. New files get mode 0666 less the umask, and belong to the process's user.
    OSError (no such folder, permission denied, a directory at `path`) propagates."""
    folder, name = _split(path)
    parent = open_folder(folder, dir_fd=dir_fd)
    try:
        in_place = _open_in_place(parent, name)
        if in_place is not None:
            with os.fdopen(in_place, "wb") as f:
                yield f
            return
        with _replacing(parent, name) as f:
            yield f
    finally:
        os.close(parent)


def write_output(path: str | os.PathLike, data: bytes | str, *, dir_fd: int | None = None) -> None:
    """Write `data` (str as UTF-8) to `path` as `output_file` does."""
    with output_file(path, dir_fd=dir_fd) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def output_directory(path: str | os.PathLike) -> Iterator[int]:
    """The file descriptor of the directory `path`, created (with its parents) if missing,
    for `output_file(name, dir_fd=fd)`. UnsafeOutputError when `path` is a symbolic link or
    not a directory; other OSError propagates."""
    folder, name = _split(path)
    parent = open_folder(folder, create=True)
    try:
        fd = _open_directory(parent, name, path)
    finally:
        os.close(parent)
    try:
        yield fd
    finally:
        os.close(fd)


def _split(path: str | os.PathLike) -> tuple[str, str]:
    """(folder, final name) of `path`; IsADirectoryError when it names no file ('x/', '.')."""
    text = os.fspath(path)
    folder, name = os.path.split(text)
    if name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), text)
    return folder or ".", name


def open_folder(folder: str, *, dir_fd: int | None = None, create: bool = False) -> int:
    """An O_PATH descriptor of the directory `folder` (relative to `dir_fd`), opened one
    component at a time, never through a link that someone other than root or this
    process's user made (UnsafeOutputError): a folder of the user's swapped for a link
    cannot lead root into /etc. With `create`, missing components are made (mode 0777 less
    the umask). OSError (no such folder, permission denied, not a directory) propagates."""
    start = os.open("/" if folder.startswith("/") else ".", _PATH_FLAGS, dir_fd=dir_fd)
    try:
        return _walk(start, folder, create, _MAX_LINKS)
    finally:
        os.close(start)


def _walk(start: int, path: str, create: bool, links_left: int) -> int:
    """A new descriptor of `path` from `start` (which stays open), one component at a time."""
    fd = os.dup(start)
    try:
        for name in (part for part in path.split("/") if part not in ("", ".")):
            step = _step(fd, name, create, links_left)
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(fd: int, name: str, create: bool, links_left: int) -> int:
    """The directory `name` under `fd`; a trusted link is followed (its target walked from
    `fd`), any other is UnsafeOutputError."""
    try:
        return os.open(name, _PATH_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        _make(fd, name)
        return _step(fd, name, False, links_left)
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        link = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISLNK(link.st_mode):
            raise
    return _follow(fd, name, link, create, links_left)


def _make(fd: int, name: str) -> None:
    try:
        os.mkdir(name, 0o777, dir_fd=fd)
    except FileExistsError:
        pass


def _follow(fd: int, name: str, link: os.stat_result, create: bool, links_left: int) -> int:
    """The directory a link leads to, when root or this process's user made the link."""
    if link.st_uid not in (0, os.geteuid()):
        raise UnsafeOutputError(f"{name} is a symbolic link of user {link.st_uid}: memprof does not write "
                                "through another user's link", "give the path without that link")
    if links_left <= 0:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
    target = os.readlink(name, dir_fd=fd)
    if target.startswith("/"):
        return _walk_absolute(target, create, links_left - 1)
    return _walk(fd, target, create, links_left - 1)


def _walk_absolute(target: str, create: bool, links_left: int) -> int:
    root = os.open("/", _PATH_FLAGS)
    try:
        return _walk(root, target, create, links_left)
    finally:
        os.close(root)


def _open_in_place(parent: int, name: str) -> int | None:
    """A write descriptor on what exists at `name` when it is written in place (module
    docstring): an existing device or FIFO, or a root-made link. None otherwise."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return _open_root_link(parent, name, info)
    if stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
        return _open_special(parent, name, os.O_NOFOLLOW)
    return None


def _open_root_link(parent: int, name: str, link: os.stat_result) -> int | None:
    """Through a link owned by root in a folder only root can write (`/dev/stdout`), to a
    file that must exist already; None for any other link (it is replaced)."""
    folder = os.fstat(parent)
    if link.st_uid != 0 or folder.st_uid != 0 or folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return _open_special(parent, name, 0)


def _open_special(parent: int, name: str, flags: int) -> int | None:
    """Open `name` for writing without creating or truncating it; None (so it is replaced
    instead) when it turns out to be a regular file, or was swapped for a link meanwhile."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC | flags, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None
        raise
    regular = stat.S_ISREG(os.fstat(fd).st_mode)
    if regular and flags & os.O_NOFOLLOW:
        os.close(fd)
        return None
    if regular:
        os.ftruncate(fd, 0)  # through a root-made link to a file (stdout sent to one): as `>` would
    os.set_blocking(fd, True)
    return fd


@contextmanager
def _replacing(parent: int, name: str) -> Iterator[BinaryIO]:
    """A fresh temporary file beside `name`, renamed over it when the block succeeds."""
    temp, fd = _create_temp(parent, name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        _unlink_quietly(parent, temp)
        raise


def _create_temp(parent: int, name: str) -> tuple[str, int]:
    """(name, descriptor) of a new file beside `name`, made with O_EXCL|O_NOFOLLOW: never
    an existing file, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMP_ATTEMPTS):
        temp = f".{name[:_NAME_KEPT]}.{secrets.token_hex(6)}.tmp"
        try:
            return temp, os.open(temp, flags, 0o666, dir_fd=parent)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _unlink_quietly(parent: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except OSError:
        pass


def _open_directory(parent: int, name: str, path) -> int:
    """The descriptor of directory `name` under `parent`, made if missing, never through a link."""
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    what = "a symbolic link" if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode) \
        else "not a directory"
    raise UnsafeOutputError(f"{Path(path)} is {what}: memprof writes its files only into a real directory",
                            "remove it, or give -o another directory") from None

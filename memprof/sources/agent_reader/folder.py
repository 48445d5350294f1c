"""The agent's folder inside a recording, made by a root recorder (docs/SECURITY.md).

`record -- CMD` puts `<recording>/agent/boot` first on the command's PYTHONPATH: whoever can
write there, or can swap any folder on the way to it, runs code in every Python process of
the command, as its user (as root, when root runs memprof without sudo). So:
  - its path is absolute and has no symlinks (a relative one follows the command into any
    folder it changes to);
  - no folder on that path may be writable by anyone but root and the command's user
    (`unsafe_ancestor`); where one is, no agent is started;
  - the folders are made 0700 and the boot files written with O_CREAT|O_EXCL|O_NOFOLLOW on
    the thread that has the user's filesystem credentials (memprof/asuser.py), so
    they are the user's from their first byte and nothing planted at those names is
    followed. memprof's own boot files are read as root: the user may not read its install.
`record --pid` needs only the folder the agent writes into (`make_attach_folder`).
"""
from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from memprof.asuser import UserThread

BOOT_FILES = ("sitecustomize.py", "memprof_agent.py")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def boot_dir() -> Path:
    from memprof.agent import BOOT
    return Path(BOOT)


def make_boot_folder(files: UserThread, folder: Path) -> None:
    """Create `folder` and `folder`/boot (0700, neither may exist) holding copies of
    memprof's boot files, on `files`: its user owns them. Raises OSError."""
    sources = {name: (boot_dir() / name).read_bytes() for name in BOOT_FILES}
    files.run(_write_boot_folder, os.fspath(folder), sources)


def _write_boot_folder(folder: str, sources: dict[str, bytes]) -> None:
    top = _make_private_dir(folder)
    try:
        boot = _make_private_dir("boot", dir_fd=top)
        try:
            for name, data in sources.items():
                _write_new_file(name, data, boot)
        finally:
            os.close(boot)
    finally:
        os.close(top)


def make_attach_folder(files: UserThread, folder: Path, chown_to: tuple[int, int] | None) -> None:
    """Create `folder` (0700; it must not exist) on `files`; with `chown_to` (uid, gid) it is
    then given to that user by fchown on its fd (root recording a process of another user)."""
    files.run(lambda: os.close(_make_private_dir(os.fspath(folder), chown_to=chown_to)))


def _make_private_dir(path: str, dir_fd: int | None = None, chown_to: tuple[int, int] | None = None) -> int:
    """mkdir `path` 0700 and return an fd of it (O_NOFOLLOW: never a symlink put in its place)."""
    os.mkdir(path, 0o700, dir_fd=dir_fd)
    fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        if chown_to is not None:
            os.fchown(fd, *chown_to)
        os.fchmod(fd, 0o700)  # after fchown, which may clear bits; and whatever the umask was
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_new_file(name: str, data: bytes, dir_fd: int) -> None:
    fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def unsafe_ancestor(path: str | os.PathLike, uid: int) -> str | None:
    """Why code at or under `path` could be changed by someone other than root and `uid`:
    the first folder from `/` down to `path` (included; symlinks resolved) that another
    user may write into, as text; None when there is none. A folder everyone may write
    into but with the sticky bit (/tmp) is safe: there only an entry's owner may rename or
    remove it. A group-writable folder is safe when the group is root's or `uid`'s own
    private group (the user's name, no other member)."""
    real = Path(os.path.realpath(path))
    for folder in (*reversed(real.parents), real):
        try:
            info = os.lstat(folder)
        except OSError as e:
            return f"{folder} cannot be checked ({e.strerror})"
        why = _writable_by_others(info, uid)
        if why:
            return f"{folder} {why}"
    return None


def _writable_by_others(info: os.stat_result, uid: int) -> str | None:
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid not in (0, uid):
        return f"belongs to uid {info.st_uid}"
    if info.st_mode & stat.S_ISVTX:
        return None
    if info.st_mode & stat.S_IWOTH:
        return "is writable by every user"
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, uid):
        return f"is writable by group {info.st_gid}"
    return None


def _private_group(gid: int, uid: int) -> bool:
    """Root's group, or `uid`'s own group: its primary group, named as the user, no members listed but it."""
    if gid == 0:
        return True
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def absolute_boot_path(folder: Path) -> str:
    """`folder`/boot as an absolute path without symlinks (what goes on PYTHONPATH)."""
    return os.path.join(os.path.realpath(folder), "boot")

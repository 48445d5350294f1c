"""Folders of root's own under /var/cache/memprof, where a recorder keeps across runs what
a warm start can skip (issue 24): bcc's compiled program and the kernel BTF's answers
(sources/ebpf/compiled_cache.py), large ELF symbol tables and the kernel's symbols
(sources/symbols/symbol_cache.py).

Root reads what these folders hold, so nothing in them may be another user's to write or
replace: a folder is used only when every folder on its path is root's and writable by no
one else, and it is made 0700; an entry is opened without following links and used only
when it is a regular file root owns and no one else may write. An entry is written whole or
not at all (a temporary file renamed over it). Callers treat every entry as untrusted
input all the same (no pickles; arrays checked before use): these rules keep out other
users, not a corrupt file.
"""
from __future__ import annotations

import hashlib
import os
import stat
import threading
from typing import BinaryIO, Callable, TypeVar

T = TypeVar("T")


def entry_name(*parts: object) -> str:
    """The name of an entry (a sha256, hex) for what decides its content, `parts` (each
    taken as its str(); callers put their format's version first)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(str(part).encode())
        h.update(b"\0\0")
    return h.hexdigest()


def read(folder: str, name: str, parse: Callable[[BinaryIO], T]) -> T | None:
    """`parse` of the entry `name` in the cache folder `folder`, where both are root's alone
    (open_folder, open_entry); None where either is not, or absent. What `parse` raises
    propagates: what an entry holds is the caller's to judge."""
    dir_fd = open_folder(folder, create=False)
    if dir_fd is None:
        return None
    try:
        f = open_entry(dir_fd, name)
        if f is None:
            return None
        with f:
            return parse(f)
    finally:
        os.close(dir_fd)


def keep(folder: str, name: str, write: Callable[[BinaryIO], None], suffix: str, keep_entries: int) -> None:
    """Make the entry `name` in the cache folder `folder` (made 0700 where absent) from what
    `write` writes, whole or not at all, then drop the `*suffix` entries beyond the newest
    `keep_entries`. Never raises OSError: a folder it may not use keeps nothing."""
    dir_fd = open_folder(folder, create=True)
    if dir_fd is None:
        return
    try:
        if write_entry(dir_fd, name, write):
            drop_oldest(dir_fd, suffix, keep_entries)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def open_folder(path: str, create: bool) -> int | None:
    """A descriptor of the folder `path` when every folder on its path is root's and
    writable by no one else, and `path` itself is root's alone (made 0700 where `create`
    and absent); None otherwise. The caller closes it."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in path.strip("/").split("/"):
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return _closed(fd)
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
            if not root_only(os.fstat(fd)):
                return _closed(fd)
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            return _closed(fd)  # the cache's own folder: root's alone, not even readable by others
        return fd
    except OSError:
        return _closed(fd)


def folder_state(path: str, off_env: str, suffix: str, kept: str, without: str) -> tuple[bool, str, str]:
    """(usable, in words, the remedy) of the cache folder `path` for `memprof doctor`: its
    entries are `*suffix`, counted as "N `kept`"; `without` says what a run does without
    the folder; `off_env`=0 turns the cache off."""
    if os.geteuid() != 0:
        return False, f"used by root only (you are uid {os.geteuid()})", "run memprof as root: sudo memprof …"
    if os.environ.get(off_env, "1") == "0":
        return False, f"off ({off_env}=0): {without}", f"unset {off_env}"
    if not os.path.lexists(path):
        return True, f"{path} not made yet: the first record fills it", ""
    dir_fd = open_folder(path, create=False)
    if dir_fd is None:
        return (False, f"{path} is not root's alone (a folder on its path is another's, writable by others, "
                f"or a link): {without}", f"remove {path} (root remakes it, 0700)")
    try:
        entries = sum(name.endswith(suffix) and not name.startswith(".") for name in os.listdir(dir_fd))
    finally:
        os.close(dir_fd)
    return True, f"{path}: {entries} {kept}", ""


def root_only(st: os.stat_result) -> bool:
    """Whether root owns what `st` describes and no one else may write it."""
    return st.st_uid == 0 and not (st.st_mode & 0o022)


def _closed(fd: int) -> None:
    os.close(fd)
    return None


def open_entry(dir_fd: int, name: str) -> BinaryIO | None:
    """The entry `name` in the folder `dir_fd`, opened for reading, if it is a regular file
    root owns and no one else may write (a link is not followed); None otherwise."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and root_only(st):
            return os.fdopen(fd, "rb")
    except OSError:
        pass
    os.close(fd)
    return None


def write_entry(dir_fd: int, name: str, write: Callable[[BinaryIO], None]) -> bool:
    """Make the entry `name` in the folder `dir_fd` from what `write` writes to a file (0600),
    whole or not at all. Returns whether it was written; OSError from `write` or the folder
    reads as not written."""
    temporary = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        return False


def drop_oldest(dir_fd: int, suffix: str, keep: int) -> None:
    """Remove the entries named `*suffix` beyond the `keep` newest (by mtime)."""
    names = [n for n in os.listdir(dir_fd) if n.endswith(suffix) and not n.startswith(".")]
    if len(names) <= keep:
        return
    aged = sorted(names, key=lambda n: os.stat(n, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns)
    for name in aged[:len(names) - keep]:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass  # another recorder dropped it first

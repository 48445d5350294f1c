"""File operations done with a user's credentials, for a root recorder (docs/SECURITY.md).

memprof runs as root for a user (`sudo memprof record`). Everything it does in a place that
user (or the profiled program, or any other local user) controls is done here: on one
dedicated thread whose *filesystem* credentials are the user's — fsuid, fsgid and the
user's supplementary groups — while the rest of the process stays root (it still loads eBPF
programs and reads /proc). The kernel then checks every path, symlink and permission on
that thread as it would for the user: a planted symlink leads only where the user could
write anyway, a directory is created only where the user could create it, and every file
created belongs to the user from its first byte (no chown afterwards, by name or by walk).

Linux credentials are per thread; glibc hides that for setuid()/setgroups() (it changes
every thread of the process), but not for setfsuid()/setfsgid(), and not for a raw
setgroups system call. Those three are what `UserThread` uses, on its own thread only.
Setting a non-zero fsuid also drops the thread's CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN and
the other file capabilities (capabilities(7)), so root's overrides do not apply there.

`UserThread.for_owner(None)` (memprof not run through sudo) does the same work on a thread
with the process's own credentials.
"""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import stat
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

from memprof.errors import MemprofError

T = TypeVar("T")

# setgroups(2) by number: glibc's wrapper would change the groups of every thread.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159, "ppc64le": 81, "s390x": 206, "riscv64": 159}


# Raised by a fault in the thread itself; never blocked (a blocked one would kill the process).
_SYNCHRONOUS_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
                        signal.SIGABRT}


class CredentialError(MemprofError):
    """memprof could not take on the user's credentials for its file operations."""


@dataclass(frozen=True)
class Owner:
    """Whose files a recording's are: uid, primary gid and supplementary groups."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def of_process(cls) -> "Owner":
        return cls(os.geteuid(), os.getegid(), tuple(os.getgroups()))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check_fs_id(previous_id_now: int, wanted: int, what: str) -> None:
    """setfsuid/setfsgid return the previous id and never fail loudly: ask again to verify."""
    if previous_id_now != wanted:
        raise CredentialError(f"could not set the {what} of memprof's file thread to {wanted} (it is {previous_id_now})",
                              "memprof needs root (CAP_SETUID, CAP_SETGID) to act for the user; run it with sudo")


def become_on_this_thread(owner: Owner) -> None:
    """Give the calling thread `owner`'s filesystem credentials (fsgid, groups, then fsuid:
    the groups need CAP_SETGID, which a non-zero fsuid does not remove). Raises
    CredentialError when the kernel refuses."""
    libc = _libc()
    if os.geteuid() != 0:
        if owner.uid != os.geteuid():
            raise CredentialError(f"memprof runs as uid {os.geteuid()} and cannot act as uid {owner.uid}",
                                  "run it with sudo")
        return
    _set_thread_groups(libc, owner.groups or (owner.gid,))
    libc.setfsgid(owner.gid)
    _check_fs_id(libc.setfsgid(ctypes.c_uint(-1 & 0xFFFFFFFF)), owner.gid, "fsgid")
    libc.setfsuid(owner.uid)
    _check_fs_id(libc.setfsuid(ctypes.c_uint(-1 & 0xFFFFFFFF)), owner.uid, "fsuid")


def _set_thread_groups(libc: ctypes.CDLL, groups: tuple[int, ...]) -> None:
    number = _SYS_SETGROUPS.get(platform.machine())
    if number is None:
        raise CredentialError(f"no setgroups system call number known for {platform.machine()}",
                              "report this machine's architecture to memprof's developers")
    array = (ctypes.c_uint * len(groups))(*groups)
    if libc.syscall(ctypes.c_long(number), ctypes.c_size_t(len(groups)), array) != 0:
        err = ctypes.get_errno()
        raise CredentialError(f"could not set the groups of memprof's file thread: {os.strerror(err)}",
                              "memprof needs root (CAP_SETGID) to act for the user; run it with sudo")


class UserThread:
    """One thread that runs callables with `owner`'s filesystem credentials, in order.

    `run(fn, …)` waits and returns fn's result (its exception is raised in the caller);
    `submit(fn, …)` returns a Future. Work is serialized: a file operation never races
    another memprof file operation. `close()` waits for queued work."""

    def __init__(self, owner: Owner | None, name: str = "memprof-files"):
        self.owner = owner
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=self._initialize)
        self.run(lambda: None)  # start the thread now: a credential failure shows here, not mid-recording
        if self._failure is not None:
            self._pool.shutdown(wait=True)
            raise self._failure

    @classmethod
    def for_owner(cls, owner: Owner | None, name: str = "memprof-files") -> "UserThread":
        return cls(owner, name)

    def _initialize(self) -> None:
        # Asynchronous signals go to the thread that takes them (the recorder's main loop):
        # the kernel hands a process's signal to any thread not blocking it, and a signal
        # taken here could not be passed on to the command.
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS_SIGNALS)
        try:
            if self.owner is not None:
                become_on_this_thread(self.owner)
        except BaseException as e:  # seen by __init__, which raises it
            self._failure = e

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> Future:
        if self._failure is not None:
            raise self._failure
        return self._pool.submit(fn, *args, **kwargs)

    def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "UserThread":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class UntrustedFileError(MemprofError):
    """A file memprof reads from a place others control is not a plain file it may trust."""


def open_untrusted_regular(path: str | os.PathLike, *, dir_fd: int | None = None, owner_uid: int | None = None) -> int:
    """An O_RDONLY fd of the regular file at `path`, opened so that nothing planted there
    can make memprof block or read elsewhere: no symlink is followed at the last component
    (O_NOFOLLOW), a FIFO or device does not block the open (O_NONBLOCK), and anything but
    a regular file — or, with `owner_uid`, one owned by another uid (a hard link to
    someone else's file) — raises UntrustedFileError. The fd is blocking again on return."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        raise UntrustedFileError(f"{os.fspath(path)}: cannot open it safely: {e.strerror}",
                                 "memprof follows no symlink in a folder others can write") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(f"{os.fspath(path)}: not a regular file; ignored", "remove it")
        if owner_uid is not None and info.st_uid != owner_uid:
            raise UntrustedFileError(f"{os.fspath(path)}: owned by uid {info.st_uid}, not {owner_uid}; ignored",
                                     "remove it")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise

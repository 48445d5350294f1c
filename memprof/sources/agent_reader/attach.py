"""`record --pid`: reaching the agent a running program installed, trusting nothing in /tmp.

The protocol (the agent's side is memprof/agent/boot/memprof_agent.py, `enable_attach`):
  1. `memprof.agent.install()` makes a private folder, `tempfile.mkdtemp(prefix=
     "memprof-agent-<pid>-")` (0700, the process's own uid, in its temporary folder), sets a
     SIGUSR2 handler, and writes `ready` in the folder: {"pid", "start_time"} (start_time:
     field 22 of /proc/<pid>/stat, clock ticks after boot, so a reused pid never matches).
  2. The recorder, for a process whose uid it may attach (`may_attach`), looks for such a
     folder with the target user's credentials (a UserThread: the kernel checks every path
     as for that user), keeps one only if it is a real folder owned by the target's uid
     that no one else can write into and its `ready` file — a regular file of that uid,
     opened with O_NOFOLLOW|O_NONBLOCK — names this very process.
  3. It writes `request.json` ({"dir", "options"}) into that folder, still as the target
     user, relative to the folder's fd, with O_CREAT|O_EXCL|O_NOFOLLOW (a stale request, or
     whatever was planted at that name, is unlinked first, never followed).
  4. It signals the process only if /proc/<pid>/status shows a SIGUSR2 handler (SigCgt),
     through a pidfd opened before the checks (the signal reaches the process checked, or
     none). The agent verifies the request (a regular file of its own uid) and writes
     into "dir".
Anything another user made (an old-style /tmp/memprof-agent-<pid>.ready, a folder of that
name) is never read, signalled on, or written through.
"""
from __future__ import annotations

import json
import os
import signal
import stat
from dataclasses import dataclass

from memprof.asuser import Owner, UntrustedFileError, UserThread, open_untrusted_regular
from memprof.proc_text import proc_text

ATTACH_SIGNAL = signal.SIGUSR2
READY, REQUEST = "ready", "request.json"
MAX_READY_BYTES = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_VARIABLES = (b"TMPDIR", b"TEMP", b"TMP")
_TEMP_DEFAULTS = ("/tmp", "/var/tmp", "/usr/tmp")


class NoAgent(Exception):
    """The process has no agent waiting to be reached (str: why, for a note)."""


class Refused(Exception):
    """The process may have an agent, but memprof will not reach it (str: why, for a note)."""


@dataclass(frozen=True)
class Target:
    """A process as /proc shows it: its effective user, and when it started (clock ticks
    after boot: a later process with the same pid has another)."""

    pid: int
    owner: Owner
    start_time: int
    handles_attach_signal: bool


def read_target(pid: int) -> Target:
    """`pid` from /proc/<pid>/status and /proc/<pid>/stat. Raises OSError (gone, say)."""
    fields = {}
    for line in proc_text(f"/proc/{pid}/status").splitlines():  # its Name: is the process's own bytes
        key, _, value = line.partition(":")
        fields[key] = value.split()
    with open(f"/proc/{pid}/stat", "rb") as f:
        start_time = int(f.read().rpartition(b")")[2].split()[19])  # field 22; field 3 is [0] after ')'
    owner = Owner(int(fields["Uid"][1]), int(fields["Gid"][1]), tuple(int(g) for g in fields.get("Groups", [])))
    caught = int(fields["SigCgt"][0], 16)
    return Target(pid, owner, start_time, bool(caught >> (ATTACH_SIGNAL - 1) & 1))


def may_attach(target: Target, recording_owner: Owner | None) -> str | None:
    """None when `recording_owner` (None: root's own recording) may have `target`'s agent
    write into the recording; else why not. A process of another user would write into a
    folder the recording's user controls, and read back what they put there."""
    if recording_owner is None or recording_owner.uid == 0 or recording_owner.uid == target.owner.uid:
        return None
    return (f"the agent of pid {target.pid} was not reached: it runs as uid {target.owner.uid}, not as the "
            f"recording's user (uid {recording_owner.uid}); its eBPF layers are recorded")


def temp_folders(pid: int) -> list[str]:
    """Where the agent of `pid` made its folder: its TMPDIR, TEMP or TMP (at its start;
    absolute ones only), then Python's defaults."""
    found = []
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = dict(item.partition(b"=")[::2] for item in f.read().split(b"\0") if item)
    except OSError:
        environ = {}
    for name in _TEMP_VARIABLES:
        value = os.fsdecode(environ.get(name, b""))
        if os.path.isabs(value):
            found.append(os.path.normpath(value))
    return list(dict.fromkeys([*found, *_TEMP_DEFAULTS]))


def find_agent_folder(thread: UserThread, target: Target) -> int:
    """An fd of `target`'s verified agent folder (see the module's step 2), found on `thread`
    (the target user's credentials). Raises NoAgent."""
    fd = thread.run(_find_agent_folder, target, temp_folders(target.pid))
    if fd is None:
        raise NoAgent(f"pid {target.pid} has no memprof agent waiting (memprof.agent.install())")
    return fd


def _find_agent_folder(target: Target, folders: list[str]) -> int | None:
    prefix = f"memprof-agent-{target.pid}-"
    for folder in folders:
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith(prefix))
        except OSError:
            continue
        for name in names:
            fd = _open_agent_folder(os.path.join(folder, name), target.owner.uid)
            if fd is not None and _names_target(fd, target):
                return fd
            if fd is not None:
                os.close(fd)
    return None


def _open_agent_folder(path: str, uid: int) -> int | None:
    """An fd of the folder at `path` if it is a real folder of `uid` no one else may write into."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return None
    info = os.fstat(fd)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o022:
        return fd
    os.close(fd)
    return None


def _names_target(folder_fd: int, target: Target) -> bool:
    """Whether the folder's `ready` file (a regular file of the target's uid) names this process."""
    try:
        fd = open_untrusted_regular(READY, dir_fd=folder_fd, owner_uid=target.owner.uid)
    except UntrustedFileError:
        return False
    try:
        ready = json.loads(os.read(fd, MAX_READY_BYTES))
    except ValueError:
        return False
    finally:
        os.close(fd)
    return isinstance(ready, dict) and ready.get("pid") == target.pid and ready.get("start_time") == target.start_time


def send_request(thread: UserThread, folder_fd: int, request: dict) -> None:
    """Write `request` as the folder's request.json on `thread` (the target user's). Raises OSError."""
    thread.run(_write_request, folder_fd, json.dumps(request).encode())


def _write_request(folder_fd: int, data: bytes) -> None:
    try:
        os.unlink(REQUEST, dir_fd=folder_fd)  # a stale request, or anything planted: removed, not followed
    except FileNotFoundError:
        pass
    fd = os.open(REQUEST, _NEW_FILE_FLAGS, 0o600, dir_fd=folder_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def open_process(pid: int) -> int | None:
    """A pidfd of `pid` (None where the kernel has none: Linux < 5.3). Opened before the
    checks, so the signal reaches the process checked or none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def signal_agent(pid: int, pidfd: int | None, checked: Target) -> None:
    """Send ATTACH_SIGNAL to `pid`, only if it is still the process `checked` (same start
    time) and catches the signal. Raises Refused, or OSError (ProcessLookupError: it is gone)."""
    now = read_target(pid)
    if now.start_time != checked.start_time:
        raise Refused(f"pid {pid} is another process than the one checked; not signalled")
    if not now.handles_attach_signal:
        raise Refused(f"pid {pid} has no {ATTACH_SIGNAL.name} handler; not signalled (it would die of it)")
    if pidfd is not None:
        signal.pidfd_send_signal(pidfd, ATTACH_SIGNAL)
    else:
        os.kill(pid, ATTACH_SIGNAL)

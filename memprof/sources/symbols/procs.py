"""The target's process tree as user space sees it: who is alive, their executables and
memory maps (kept so user stacks can be symbolized after a process has gone)."""
from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field

from memprof.proc_text import proc_text
from memprof.sources.symbols.symbolize import Mapping, parse_maps, reachable, snapshot_maps


@dataclass
class ProcessInfo:
    pid: int
    ppid: int | None = None
    comm: str = ""
    exe: str = ""
    maps: list[Mapping] = field(default_factory=list)
    start_ns: int | None = None
    exit_ns: int | None = None
    stale: bool = True  # maps need re-reading (new process, or it exec'd)


def read_comm(pid: int) -> str:
    try:
        return proc_text(f"/proc/{pid}/comm").strip()
    except OSError:
        return ""


def read_exe(pid: int) -> str:
    """The path of `pid`'s executable, as text to show (undecodable bytes escaped, as
    proc_text does): "" when it is gone."""
    try:
        return os.readlink(os.fsencode(f"/proc/{pid}/exe")).decode("utf-8", "backslashreplace")
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """`pid` and every live descendant process (via /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in found:
            continue
        found.append(p)
        todo.extend(_children(p))
    return found


def _children(pid: int) -> list[int]:
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return kids


def process_uids(pid: int) -> tuple[int, int, int] | None:
    """(real, effective, saved) uid of `pid` from /proc/PID/status; None if it is gone."""
    try:
        for line in proc_text(f"/proc/{pid}/status").splitlines():
            if line.startswith("Uid:"):
                real, effective, saved = (int(v) for v in line.split()[1:4])
                return real, effective, saved
    except (OSError, ValueError):
        return None
    return None


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = proc_text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


@functools.cache
def _vm_readv():
    """libc's process_vm_readv(pid, local iov, n, remote iov, n, flags), typed once."""
    call = ctypes.CDLL(None, use_errno=True).process_vm_readv
    call.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                     ctypes.c_ulong, ctypes.c_ulong]
    call.restype = ctypes.c_ssize_t
    return call


def read_process_memory(pid: int, address: int, length: int) -> bytes | None:
    """`length` bytes of process `pid`'s memory from virtual `address`, or None where they
    cannot all be read: the process is gone, the range is not mapped whole, or the kernel
    refuses (process_vm_readv asks ptrace's permission: root has it, unless Yama's
    ptrace_scope is 3). No path is opened. What comes back is the process's to choose:
    callers check it against what they already know before they believe it."""
    if pid <= 0 or address <= 0 or length <= 0:
        return None
    buffer = ctypes.create_string_buffer(length)
    local = _IoVec(ctypes.addressof(buffer), length)
    remote = _IoVec(address, length)
    read = _vm_readv()(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return buffer.raw if read == length else None


class ProcessTable:
    """Processes of the target tree, keyed by tgid. Maps are refreshed while alive."""

    def __init__(self):
        self.procs: dict[int, ProcessInfo] = {}

    def add(self, pid: int, ppid: int | None, ts_ns: int | None) -> ProcessInfo:
        info = self.procs.get(pid)
        if info is None or info.exit_ns is not None:
            info = ProcessInfo(pid=pid, ppid=ppid, start_ns=ts_ns)
            parent = self.procs.get(ppid) if ppid else None
            if parent is not None:
                info.maps = list(parent.maps)  # a fork shares its parent's mappings
            self.procs[pid] = info
        return info

    def exec_(self, pid: int, comm: str = "") -> None:
        """`pid` ran a new program, named `comm` (what the kernel's exec record says; "":
        unknown): its maps, executable and name are read again at the next refresh (the
        executable may be the same file, as when memprof's own Python runs a Python command,
        but the name is the new program's), and a program gone before then keeps `comm`."""
        info = self.add(pid, None, None)
        info.stale, info.exe, info.comm = True, "", comm

    def exit_(self, pid: int, ts_ns: int) -> None:
        info = self.procs.get(pid)
        if info is not None and info.exit_ns is None:
            info.exit_ns = ts_ns

    def live(self) -> list[int]:
        return [p for p, i in self.procs.items() if i.exit_ns is None]

    def mark_stale(self, pid: int) -> None:
        """Its mappings changed (a file mapped executable): re-read them at the next refresh."""
        info = self.procs.get(pid)
        if info is not None:
            info.stale = True

    def refresh(self, only_stale: bool = False) -> list[ProcessInfo]:
        """Re-read the maps of live processes (only the stale ones with `only_stale`);
        returns the processes whose maps were read."""
        refreshed = []
        for info in list(self.procs.values()):
            if info.exit_ns is not None or (only_stale and not info.stale):
                continue
            text = snapshot_maps(info.pid)
            if text is None:
                continue
            info.maps = reachable(info.pid, parse_maps(text))
            info.stale = False
            exe = read_exe(info.pid)
            if exe and exe != info.exe:
                info.exe, info.comm = exe, read_comm(info.pid) or info.comm
            refreshed.append(info)
        return refreshed

    def pids_mapping(self, file_name: str) -> list[int]:
        """The processes seen mapping a file named `file_name` (its last path component)."""
        return sorted(pid for pid, info in self.procs.items()
                      if any(m.path.rpartition("/")[2] == file_name for m in info.maps))

    def maps_of(self, pid: int) -> list[Mapping]:
        info = self.procs.get(pid)
        return info.maps if info else []

    def summary(self) -> list[dict]:
        return [
            {"pid": i.pid, "ppid": i.ppid, "comm": i.comm, "exe": i.exe, "start_ns": i.start_ns, "exit_ns": i.exit_ns}
            for i in self.procs.values()
        ]

"""bcc's compile in a forked child, so that the recorder never holds LLVM (issue 24: a first
run's size).

bcc compiles in the process that calls its BPF(): it loads the whole libbcc (clang and LLVM)
there, and LLVM keeps its pages and heap after the compile, ~110 MB that a recorder which
compiled held for its whole run (391 MB at its first reading against a warm start's 285 MB,
bench/RESULTS.md). Here a child forked at `early.begin` compiles, sends the compiled program
as a compiled_cache entry (JSON) with its maps' descriptors (SCM_RIGHTS, in the entry's
order), stores the entry in the cache after sending it, and exits. The recorder rebuilds a
CachedBPF on the child's maps, as a warm start does from the cache, and LLVM leaves with the
child.

The child is forked only from a process with a single thread (`fork_compile`): it then takes
no lock another thread held, and may import and dlopen as any process. It compiles with
kallsyms answered (early._kallsyms_answered: the child's mount namespace is its own), with
fd 2 on /dev/null and its own descriptors closed but the socket's; it dies with the recorder
(PR_SET_PDEATHSIG) and at the terminal's Ctrl-C. Any failure sends nothing: the recorder then
compiles in its own process, which shows the diagnostics (loading.compile_program).
"""
from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import socket
import struct
import threading
import warnings

_HEADER = struct.Struct("<QI")  # the entry's length in bytes, the number of map descriptors
_MAX_MAPS = 250  # SCM_MAX_FD is 253
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class CompileChild:
    """A forked child compiling one program. `receive()` waits for what it compiled."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid = pid
        self._sock = sock

    def receive(self) -> tuple[dict, list[int]] | None:
        """(the compiled_cache entry, its maps' descriptors, now this process's) once the child
        has compiled; None when it failed or died. Reaps the child behind (it stores the
        entry in the cache after sending it)."""
        try:
            return _receive(self._sock)
        except (OSError, ValueError):  # EOF mid-way, a malformed entry
            return None
        finally:
            self._sock.close()
            threading.Thread(target=_reap, args=(self.pid,), name="memprof-compile-reap", daemon=True).start()


def single_threaded() -> bool:
    """Whether this process has one thread (the kernel's count: native threads included)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def fork_compile(text: str, cflags: list[str], cache_key: str | None) -> CompileChild | None:
    """A child compiling `text` with `cflags`, storing the entry under `cache_key` (None: not
    stored); None when this process has other threads or the fork fails: compile here."""
    if not single_threaded():
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = os.getpid()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: single-threaded here, checked above
            pid = os.fork()
    except OSError:
        ours.close()
        theirs.close()
        return None
    if pid == 0:
        ours.close()
        _child(theirs, parent, text, cflags, cache_key)  # never returns
    theirs.close()
    return CompileChild(pid, ours)


def _child(sock: socket.socket, parent: int, text: str, cflags: list[str], cache_key: str | None) -> None:
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the terminal's Ctrl-C ends the compile with the recorder
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the recorder died before the prctl
            return
        _quiet_descriptors(sock.fileno())
        bpf = _compile(text, cflags)
        from memprof.sources.ebpf import compiled_cache
        entry, map_fds = compiled_cache.exported(bpf)
        _send(sock, entry, map_fds)
        sock.close()
        if cache_key is not None:
            compiled_cache.write_entry(cache_key, {"format": compiled_cache.FORMAT, "key": cache_key, **entry})
        code = 0
    except BaseException:  # nothing sent: the recorder compiles itself and says why
        pass
    finally:
        os._exit(code)


def _quiet_descriptors(keep: int) -> None:
    """fds 0, 1 and 2 on /dev/null (clang's diagnostics go to fd 2), every other closed but `keep`."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def _compile(text: str, cflags: list[str]):
    """bcc's BPF object, compiled with kallsyms answered, its autoloaded programs neither loaded
    nor attached: the recorder's CachedBPF loads and attaches them (on its own maps' copies)."""
    from bcc import BPF
    from memprof.sources.ebpf import early

    class CompileOnly(BPF):
        def _trace_autoload(self):
            pass

    with early._kallsyms_answered():
        return CompileOnly(text=text.encode(), cflags=cflags)  # bytes: bcc warns of str


def _send(sock: socket.socket, entry: dict, map_fds: list[int]) -> None:
    if len(map_fds) > _MAX_MAPS:
        raise ValueError(f"{len(map_fds)} maps: more than one message carries")
    data = json.dumps(entry).encode()
    socket.send_fds(sock, [_HEADER.pack(len(data), len(map_fds))], map_fds)
    sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[dict, list[int]] | None:
    header, fds = _receive_descriptors(sock, _HEADER.size, _MAX_MAPS)
    if not header:
        return None  # the child sent nothing
    try:
        if len(header) != _HEADER.size:
            raise ValueError("a short header")
        length, count = _HEADER.unpack(header)
        if count != len(fds):
            raise ValueError(f"{len(fds)} descriptors where {count} were sent")
        data = _receive_exactly(sock, length)
        entry = json.loads(data)
        if not isinstance(entry, dict) or len(entry.get("maps", ())) != len(fds):
            raise ValueError("the entry's maps are not the descriptors sent")
        return entry, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _receive_descriptors(sock: socket.socket, size: int, most: int) -> tuple[bytes, list[int]]:
    """(up to `size` bytes, the descriptors that came with them), each close-on-exec from the
    first instant (MSG_CMSG_CLOEXEC): the command memprof starts must never inherit a map.
    Not socket.recv_fds: Python 3.11's drops its flags argument (the maps came without it)."""
    fds = array.array("i")
    data, ancillary, _flags, _addr = sock.recvmsg(size, socket.CMSG_LEN(most * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _receive_exactly(sock: socket.socket, length: int) -> bytes:
    chunks, left = [], length
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ValueError("the entry ended early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass

"""bcc's compile in forked children, so that the recorder never holds LLVM, in two halves at
once (issue 24: a first run's size and start).

bcc compiles in the process that calls its BPF(): it loads the whole libbcc (clang and LLVM)
there, and LLVM keeps its pages and heap after the compile, ~110 MB that a recorder which
compiled held for its whole run (391 MB at its first reading against a warm start's 285 MB,
bench/RESULTS.md). Here two children forked at `early.begin` compile the program's halves
(bpf/parts.h, MP_HALF: the kernel's programs, the user-space probes'), each with every map;
each sends what it compiled as a compiled_cache entry (JSON) with its maps' descriptors
(SCM_RIGHTS, in the entry's order), and exits. `joined` makes one entry of the two on the
first half's maps: each map of the second must be the first's twin (its definition; the
second makes its maps at their smallest, SMALLEST_MAPS) and is closed, and the second's
programs name the first's maps. The recorder rebuilds a CachedBPF on
them, as a warm start does from the cache, stores the joined entry for the next run, and LLVM
leaves with the children. The halves' compiles take ~0.55-0.6 s each against ~0.8-0.9 s for
the whole (bench/RESULTS.md), on the two CPUs at once; their programs are instruction for
instruction the whole's.

The children are forked only from a process with a single thread (`fork_compile`): they then
take no lock another thread held, and may import and dlopen as any process. Each compiles
with kallsyms answered (early._kallsyms_answered: its mount namespace is its own), with fds
0-2 on /dev/null and its other descriptors closed but its socket; it dies with the recorder
(PR_SET_PDEATHSIG) and at the terminal's Ctrl-C, and is killed if it sends nothing within
RECEIVE_TIMEOUT_S. Any failure sends nothing: the recorder then compiles the whole program in
its own process, which shows the diagnostics (loading.compile_program).
"""
from __future__ import annotations

import array
import ctypes
import json
import os
import signal
import socket
import struct
import warnings

from memprof.sources.ebpf.forked import close_all_but, reap_behind

_HEADER = struct.Struct("<QI")  # the entry's length in bytes, the number of map descriptors
_MAX_MAPS = 250  # SCM_MAX_FD is 253
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# A half compiles in ~0.6 s here, a whole program in 1.3-2.9 s on slower days: a child that
# sent nothing in this long is stuck, and the recorder compiles the program itself.
RECEIVE_TIMEOUT_S = 120.0


# The maps whose size only their definition names (bpf/common.bpf.c, python.bpf.c): the second
# half's are made at their smallest, since `joined` closes them unused. At the recording's
# default sizes its maps are 237 MiB of kernel memory made and zeroed for nothing, 12 MiB at
# their smallest (the maps' fdinfo memlock, summed): the 128 MiB ring buffer, the kernel
# stacks' 32,768 buckets of 127 frames, the user and Python stacks' tables.
SMALLEST_MAPS = ["-DRINGBUF_PAGES=1", "-DSTACK_ENTRIES=64", "-DUSTACK_ENTRIES=64", "-DPY_STACK_ENTRIES=64",
                 "-DPY_CODE_ENTRIES=64"]
HALVES = (["-DMP_HALF=1"], ["-DMP_HALF=2", *SMALLEST_MAPS])  # bpf/parts.h: the kernel's programs, the user-space probes'


class CompileChild:
    """A forked child compiling one program (or half of one). `receive()` waits for it."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid = pid
        self._sock = sock

    def receive(self, timeout_s: float = RECEIVE_TIMEOUT_S) -> tuple[dict, list[int]] | None:
        """(the compiled_cache entry, its maps' descriptors, now this process's) once the child
        has compiled; None when it failed, died, or sent nothing within `timeout_s` (it is
        then killed: a stuck compile must not hold `record` forever). Reaps the child behind."""
        self._sock.settimeout(timeout_s)
        try:
            return _receive(self._sock)
        except TimeoutError:
            self.abandon()
            return None
        except (OSError, ValueError):  # EOF mid-way, a malformed entry
            return None
        finally:
            self._let_go()

    def abandon(self) -> None:
        """End the child's compile unused."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._let_go()

    def _let_go(self) -> None:
        """Close the socket and reap the child behind, once."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        reap_behind(self.pid, "memprof-compile-reap")


class SplitCompile:
    """The children compiling the program's HALVES. `receive()` waits for both and joins them."""

    def __init__(self, children: list[CompileChild]):
        self.children = children

    def receive(self) -> tuple[dict, list[int]] | None:
        """(the joined entry, its maps' descriptors), or None when a child failed or their
        halves do not join (every descriptor received is then closed)."""
        received = []
        for at, child in enumerate(self.children):
            part = child.receive()
            if part is None:  # the whole program is compiled in the recorder now: the others are no use
                for rest in self.children[at + 1:]:
                    rest.abandon()
                _close_all(received)
                return None
            received.append(part)
        try:
            return joined(received)
        except (ValueError, KeyError, TypeError):  # halves that do not join, or an entry not as exported
            _close_all(received)
            return None


def joined(parts: list[tuple[dict, list[int]]]) -> tuple[dict, list[int]]:
    """One entry of the halves' `parts` ((entry, map fds) each), on the first's maps: every
    program of each, whose map references name the first's maps by name. ValueError where a
    map is not in the first or differs from its twin there, or a program is in two halves;
    else the later halves' map descriptors are closed here."""
    (first, first_fds), later = parts[0], parts[1:]
    index_of = {m["name"]: i for i, m in enumerate(first["maps"])}
    functions = list(first["functions"])
    names = {f["name"] for f in functions}
    for entry, _fds in later:
        to_first = []
        for m in entry["maps"]:
            twin = first["maps"][index_of[m["name"]]] if m["name"] in index_of else None
            if twin is None or _definition(twin) != _definition(m):
                raise ValueError(f"map {m['name']!r} of a later half is not the first's")
            to_first.append(index_of[m["name"]])
        for f in entry["functions"]:
            if f["name"] in names:
                raise ValueError(f"program {f['name']!r} is in two halves")
            names.add(f["name"])
            functions.append({**f, "map_refs": [[at, to_first[i]] for at, i in f["map_refs"]]})
    for _entry, fds in later:
        for fd in fds:
            os.close(fd)
    return {**first, "functions": functions}, first_fds


def _definition(m: dict) -> tuple:
    """What makes two compiles' maps the same map to their programs: all but the BTF ids (each
    compile numbers its own types, and the first's maps keep the first's) and the size
    (max_entries: no instruction names it; a later half's are SMALLEST_MAPS, and a size
    constant used in code would change the instructions, which
    tests/integration/test_compile_child.py compares with the whole compile's)."""
    return m["type"], m["key_size"], m["value_size"], m["flags"], m["key_desc"], m["leaf_desc"]


def _close_all(received) -> None:
    for part in received:
        if part is not None:
            for fd in part[1]:
                os.close(fd)


def single_threaded() -> bool:
    """Whether this process has one thread (the kernel's count: native threads included)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def fork_compile(text: str, cflags: list[str]) -> SplitCompile | None:
    """Children compiling `text` with `cflags`, one per half (one for the whole on a single
    CPU); None when this process has other threads or a fork fails (a child already forked is
    then killed): compile here."""
    if not single_threaded():
        return None
    children = []
    for half in _parts_to_compile():
        child = _fork_one(text, [*cflags, *half])
        if child is None:
            for forked in children:
                forked.abandon()
            return None
        children.append(child)
    return SplitCompile(children)


def _parts_to_compile() -> list[list[str]]:
    """The flags of each child's part: the HALVES on two CPUs or more; the whole program on one,
    where two compiles would take turns and each pays the front end's fixed cost (~0.18 s)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        cpus = os.cpu_count() or 1
    return [list(half) for half in HALVES] if cpus >= 2 else [[]]


def _fork_one(text: str, cflags: list[str]) -> CompileChild | None:
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
        _child(theirs, parent, text, cflags)  # never returns
    theirs.close()
    return CompileChild(pid, ours)


def _child(sock: socket.socket, parent: int, text: str, cflags: list[str]) -> None:
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
    close_all_but([0, 1, 2, keep])


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


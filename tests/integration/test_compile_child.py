"""A first run's compile in forked children, one per half of the program (sources/ebpf/
compile_child.py): the recorder gets the children's maps and programs, joined, and never
loads LLVM; the halves' programs are the whole's; the joined entry is stored; a child dies
with the recorder, and what it sends wrongly is refused without a descriptor left open."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from memprof.sources.ebpf import compile_child

pytestmark = pytest.mark.integration

TESTS_ROOT = Path("/var/cache/memprof-tests")  # root's, like the real cache: /tmp is writable by all


def _run(script: str, **env: str) -> subprocess.CompletedProcess:
    """`script` in a Python of its own: a single-threaded process, as `record` is when it begins."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **env})


@pytest.fixture
def cache_dir():
    """A compile cache of this test's own, in a folder only root may write."""
    cache = TESTS_ROOT / uuid.uuid4().hex / "bpf"
    yield cache
    shutil.rmtree(cache.parent, ignore_errors=True)


def _begun(cache: Path, then: str, first: str = "") -> str:
    """A script that runs `first`, then begins the default program's compile with `cache` as
    the compile cache (text and cflags named so), then runs `then`; it prints "ok" at its end."""
    return f"""
import fcntl, os
{first}
from memprof.sources.ebpf import compile_child, compiled_cache, early
from memprof.sources.ebpf.loading import program_source
from memprof.sources.ebpf.options import EbpfOptions
compiled_cache.CACHE_DIR = {str(cache)!r}
options = EbpfOptions()
text, cflags = program_source(options, options.enabled)
early.begin(options)
{textwrap.dedent(then)}
print("ok")
"""


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr


def test_a_first_run_takes_the_childs_maps_and_stores_the_entry_for_the_next(cache_dir):
    """Cache empty: children compile; the recorder's object is built on the first half's maps,
    with every program before the command loaded, the maps close-on-exec, and no compiler
    mapped in the recorder. The joined entry is stored; the next start takes it and forks
    nothing."""
    _ok(_run(_begun(cache_dir, """
        assert early._pending.child is not None, "no child forked for an empty cache"
        bpf = early.take(text, cflags)
        assert bpf is not None and bpf.FROM_CACHE is False
        loaded = {name.decode() for name in bpf.funcs}
        missing = {name for name, _ in early.programs_before(options)} - loaded
        assert not missing, missing
        assert all(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC for fd in bpf._map_fds)
        with open("/proc/self/maps") as f:
            mapped = f.read()
        assert "libbcc.so" not in mapped and "libLLVM" not in mapped
        assert len(bpf._functions) >= 30  # both halves
        bpf.cleanup()
        assert compiled_cache.has_entry(text, cflags), "the joined entry was not stored"
        early.begin(options)
        assert early._pending.child is None
        again = early.take(text, cflags)
        assert again is not None and again.FROM_CACHE is True
        again.cleanup()
    """)))


def test_with_the_cache_off_the_children_compile_and_store_nothing(cache_dir):
    _ok(_run(_begun(cache_dir, """
        assert early._pending.child is not None
        bpf = early.take(text, cflags)
        assert bpf is not None and bpf.FROM_CACHE is False
        bpf.cleanup()
    """), MEMPROF_BPF_CACHE="0"))
    assert not cache_dir.exists()


def test_on_one_cpu_one_child_compiles_the_whole_program(cache_dir):
    _ok(_run(_begun(cache_dir, """
        assert len(early._pending.child.children) == 1
        bpf = early.take(text, cflags)
        assert bpf is not None and bpf.FROM_CACHE is False and len(bpf._functions) >= 30
        bpf.cleanup()
    """, first="os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})"), MEMPROF_BPF_CACHE="0"))


def test_no_child_is_forked_beside_another_thread():
    """A fork copies only the calling thread: a lock another thread held would stay held in
    the child. With a second thread the thread of early.py compiles, as before."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not compile_child.single_threaded()
        assert compile_child.fork_compile("int f(void *c) { return 0; }", ["-w"]) is None
    finally:
        stop.set()
        other.join()


def test_the_child_dies_with_the_recorder():
    """A recorder that exits (an early error, a kill) does not leave LLVM compiling."""
    proc = _run("""
        import os
        from memprof.sources.ebpf import compile_child, early
        from memprof.sources.ebpf.loading import program_source
        from memprof.sources.ebpf.options import EbpfOptions
        options = EbpfOptions()
        split = compile_child.fork_compile(*program_source(options, options.enabled))
        print(*[child.pid for child in split.children], flush=True)
        os._exit(0)
    """)
    pids = [int(pid) for pid in proc.stdout.split()]
    assert len(pids) == len(compile_child.HALVES), proc.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, pids)):
        time.sleep(0.05)
    assert not any(map(_alive, pids)), f"compile children {pids} outlived their recorder"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _open_fds() -> set[str]:
    """This process's open descriptors, less the one listing them."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("/proc/"):
                fds.add(fd)
        except FileNotFoundError:  # the listing's own, closed by now
            pass
    return fds


@pytest.mark.parametrize("case", ["nothing", "fewer descriptors", "entry cut short", "not an entry", "maps miscounted"])
def test_what_a_child_sends_wrongly_is_refused_with_no_descriptor_left_open(case):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    passed = [os.open(os.devnull, os.O_RDONLY) for _ in range(2)]
    entry = b'{"maps": [{}, {}]}'
    header = compile_child._HEADER.pack
    if case == "fewer descriptors":
        socket.send_fds(theirs, [header(len(entry), 3)], passed)
        theirs.sendall(entry)
    elif case == "entry cut short":
        socket.send_fds(theirs, [header(len(entry) + 10, 2)], passed)
        theirs.sendall(entry)
    elif case == "not an entry":
        socket.send_fds(theirs, [header(4, 2)], passed)
        theirs.sendall(b"[1,2")
    elif case == "maps miscounted":
        socket.send_fds(theirs, [header(len(b'{"maps": [{}]}'), 2)], passed)
        theirs.sendall(b'{"maps": [{}]}')
    theirs.close()
    for fd in passed:
        os.close(fd)  # the copies in flight are what receive() gets, at the lowest free numbers
    before = _open_fds() - {str(ours.fileno())}  # receive() closes the socket as well
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert compile_child.CompileChild(pid, ours).receive() is None
    assert _open_fds() == before


def test_a_record_with_the_cache_off_names_its_program_compiled(run_memprof, tmp_path):
    """End to end: `record` compiles in a child (no entry to take) and says the program was not
    from the cache; the command's own descriptors hold no BPF map."""
    probe = "ls -l /proc/self/fd/ | grep -c bpf-map || true"
    result = run_memprof("record", "-q", "-o", tmp_path / "c.memprof", "--", "sh", "-c", probe,
                         cwd=tmp_path, env={**os.environ, "MEMPROF_BPF_CACHE": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"]
    import json
    meta = json.loads((tmp_path / "c.memprof" / "meta.json").read_text())
    assert meta["sources"]["ebpf"]["detail"]["program_from_cache"] is False


def test_the_halves_programs_are_the_whole_programs_instruction_for_instruction():
    """Each program of a half is the whole compile's, byte for byte, naming the same maps
    (by index: both compiles declare every map, in one order); no program is in both halves,
    and none is left out."""
    from bcc import BPF
    from memprof.sources.ebpf import compiled_cache
    from memprof.sources.ebpf.loading import program_source
    from memprof.sources.ebpf.options import EbpfOptions
    options = EbpfOptions(families=("kmem", "torch", "cuda", "native"))
    text, cflags = program_source(options, options.enabled)
    compiled = {}
    for name, flags in [("whole", cflags), *((f"half {i}", [*cflags, *h]) for i, h in enumerate(compile_child.HALVES))]:
        bpf = BPF(text=text.encode(), cflags=flags)
        try:
            compiled[name] = compiled_cache.exported(bpf)[0]
        finally:
            bpf.cleanup()
    programs = lambda entry: {f["name"]: (f["insns"], f["map_refs"]) for f in entry["functions"]}  # noqa: E731
    whole = programs(compiled.pop("whole"))
    halves = [programs(entry) for entry in compiled.values()]
    assert all(len(half) >= 10 for half in halves)
    assert not set(halves[0]) & set(halves[1])
    assert {**halves[0], **halves[1]} == whole


def _entry(maps: list[str], functions: dict[str, list[list[int]]], size: int = 8, entries: int = 16) -> dict:
    return {"maps": [{"name": m, "type": 1, "key_size": 4, "value_size": size, "max_entries": entries, "flags": 0,
                      "key_desc": '"int"', "leaf_desc": '"long"'} for m in maps],
            "functions": [{"name": f, "insns": "", "map_refs": refs} for f, refs in functions.items()]}


def _fds(n: int) -> list[int]:
    return [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]


def test_joined_halves_name_the_first_halfs_maps():
    """The second half's maps, made at their smallest (SMALLEST_MAPS), are closed; its
    programs point at the first's maps by name."""
    first_fds, second_fds = _fds(2), _fds(2)
    first = _entry(["a", "b"], {"f": [[0, 1]]})
    entry, fds = compile_child.joined([(first, first_fds),
                                       (_entry(["b", "a"], {"g": [[3, 0], [5, 1]]}, entries=1), second_fds)])
    assert fds == first_fds and entry["maps"] == first["maps"]
    assert {f["name"]: f["map_refs"] for f in entry["functions"]} == {"f": [[0, 1]], "g": [[3, 1], [5, 0]]}
    for fd in second_fds:  # closed by joined
        with pytest.raises(OSError):
            os.fstat(fd)
    for fd in first_fds:
        os.close(fd)


@pytest.mark.parametrize("second", [_entry(["a", "c"], {"g": []}), _entry(["a", "b"], {"g": []}, size=16),
                                    _entry(["a", "b"], {"f": []})], ids=["a map the first lacks", "a map unlike its twin",
                                                                         "a program in both"])
def test_halves_that_do_not_join_are_refused(second):
    with pytest.raises(ValueError):
        compile_child.joined([(_entry(["a", "b"], {"f": []}), []), (second, [])])



def test_a_child_that_sends_nothing_in_time_is_killed():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # a stuck compile: holds its end open, sends nothing
        try:  # never back into pytest, whatever interrupts the sleep
            ours.close()
            time.sleep(60)
        finally:
            os._exit(0)
    theirs.close()
    started = time.monotonic()
    assert compile_child.CompileChild(pid, ours).receive(timeout_s=0.3) is None
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid)



def _fake_child(behaviour: str) -> compile_child.CompileChild:
    """A forked child as the recorder sees it: "sends" an entry of two maps and exits, "fails"
    (exits, sending nothing) or is "stuck" (holds its socket, sending nothing)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if behaviour == "sends":
        entry, passed = b'{"maps": [{}, {}]}', _fds(2)
        socket.send_fds(theirs, [compile_child._HEADER.pack(len(entry), 2)], passed)
        theirs.sendall(entry)
        for fd in passed:
            os.close(fd)  # the copies in flight remain
    pid = os.fork()
    if pid == 0:
        try:  # never back into pytest, whatever interrupts the sleep
            if behaviour == "stuck":
                time.sleep(60)
        finally:
            os._exit(0)
    theirs.close()
    return compile_child.CompileChild(pid, ours)


def test_when_a_half_fails_the_others_are_ended_and_nothing_is_left_open():
    """A half that fails means a compile in the recorder: a child still compiling is killed at
    once rather than waited for, and what an earlier one sent is closed."""
    children = [_fake_child("sends"), _fake_child("fails"), _fake_child("stuck")]
    sockets = {str(child._sock.fileno()) for child in children}
    before = _open_fds()
    started = time.monotonic()
    assert compile_child.SplitCompile(children).receive() is None
    assert time.monotonic() - started < 5
    stuck = children[-1].pid
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(stuck):
        time.sleep(0.05)
    assert not _alive(stuck)
    assert _open_fds() == before - sockets

"""bcc's compiled program kept across runs (sources/ebpf/compiled_cache.py, cached_bpf.py),
with real eBPF: an entry rebuilds the very instructions and maps bcc compiled, attaches what
bcc attaches, reads and writes its tables; a recording from it finds the known kernel leak
exactly as a compiled one does; and root uses no entry, and writes none, where anyone else
could have put or changed it."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import uuid
from pathlib import Path

import pytest

from memprof.sources.ebpf import compiled_cache as C
from memprof.sources.ebpf.bpfinfo import map_info
from memprof.sources.ebpf.loading import program_source
from memprof.sources.ebpf.options import EbpfOptions

from tests.integration.test_kernel import KERNEL_LEAK, PIPE_BUFFER_ARRAY_BYTES, functions, merged, pipe_info_finding, read_meta

pytestmark = pytest.mark.integration

NOBODY = 65534
TESTS_ROOT = Path("/var/cache/memprof-tests")  # root's, like the real cache: /tmp is writable by all


@pytest.fixture(scope="module")
def compiled():
    """(bcc's BPF object compiled from memprof's default program, its text, its flags)."""
    from bcc import BPF
    options = EbpfOptions()
    text, cflags = program_source(options, options.enabled)
    bpf = BPF(text=text.encode(), cflags=cflags)
    yield bpf, text, cflags
    bpf.cleanup()


@pytest.fixture
def cache_dir(monkeypatch):
    """A cache folder of this test's own, in a folder only root may write."""
    top = TESTS_ROOT / uuid.uuid4().hex
    monkeypatch.setattr(C, "CACHE_DIR", str(top / "bpf"))
    monkeypatch.delenv(C.OFF_ENV, raising=False)
    yield top / "bpf"
    shutil.rmtree(top, ignore_errors=True)


def _entry_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def _by_map_index(insns: bytes, index_of_fd: dict[int, int]) -> bytes:
    """`insns` with each map fd replaced by the map's index: comparable across objects."""
    out = bytearray(insns)
    for i in range(len(insns) // 8):
        code, regs, _off, imm = struct.unpack_from("<BBhi", insns, i * 8)
        if code == 0x18 and regs >> 4 == 1:
            struct.pack_into("<i", out, i * 8 + 4, index_of_fd[imm])
    return bytes(out)


def _compiled_map_fds(bpf) -> dict[int, int]:
    lib = C._libbcc()
    return {lib.bpf_table_fd_id(bpf.module, i): i for i in range(lib.bpf_num_tables(bpf.module))}


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_an_entry_rebuilds_the_instructions_and_maps_bcc_compiled(compiled, cache_dir):
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    assert len(_entry_files(cache_dir)) == 1
    cached = C.load(text, cflags)
    try:
        assert cached is not None and cached.FROM_CACHE
        # everything bcc's own __init__ gives a BPF object (a bcc upgrade that adds one fails here)
        assert set(vars(bpf)) <= set(vars(cached)), set(vars(bpf)) - set(vars(cached))
        compiled_fds = _compiled_map_fds(bpf)
        cached_fds = {fd: i for i, fd in enumerate(cached._map_fds)}
        lib = C._libbcc()
        names = [lib.bpf_function_name(bpf.module, i) for i in range(lib.bpf_num_functions(bpf.module))]
        assert sorted(names) == sorted(cached._functions) and len(names) > 30
        for name in names:
            rebuilt = cached._with_map_fds(cached._functions[name])
            assert _by_map_index(rebuilt, cached_fds) == _by_map_index(bpf.dump_func(name), compiled_fds), name
        for fd, i in compiled_fds.items():
            want, got = map_info(fd), map_info(cached._map_fds[i])
            assert (got.type, got.key_size, got.value_size, got.max_entries, got.map_flags, got.name) == \
                   (want.type, want.key_size, want.value_size, want.max_entries, want.map_flags, want.name)
        # bcc's own autoload, by the programs' names
        assert cached.tracepoint_fds == bpf.tracepoint_fds == {}
        assert sorted(cached.raw_tracepoint_fds) == sorted(bpf.raw_tracepoint_fds) == \
            [b"sched_process_exec", b"sched_process_exit", b"sched_process_fork", b"sched_switch", b"signal_deliver",
             b"sys_enter"]
    finally:
        if cached is not None:
            cached.cleanup()


def test_the_rebuilt_objects_tables_read_and_write(compiled, cache_dir):
    from bcc import BPF
    from bcc import table as T
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    cached = C.load(text, cflags)
    try:
        tracked = cached["tracked"]
        assert isinstance(tracked, T.Array) and len(tracked) == len(bpf[b"tracked"]) > 0
        tracked[ctypes.c_int(3)] = ctypes.c_ulonglong(0xABC)
        assert tracked[ctypes.c_int(3)].value == 0xABC
        counters = cached["counters"]
        assert isinstance(counters, T.PerCpuArray) and len(counters[ctypes.c_int(0)]) == counters.total_cpu
        assert isinstance(cached["stacks"], T.StackTrace) and isinstance(cached["py_learn_tp"], T.ProgArray)
        assert cached["events"].map_fd == cached._map_fds[cached._map_index[b"events"]]
        with pytest.raises(KeyError):
            cached["no_such_map"]
        program = cached.load_func(b"mp_kmalloc", BPF.RAW_TRACEPOINT)
        assert program.fd > 0 and cached.load_func("mp_kmalloc", BPF.RAW_TRACEPOINT) is program
        cached["py_learn_tp"][ctypes.c_int(0)] = ctypes.c_int(cached.load_func(b"mp_py_learn_tp", BPF.RAW_TRACEPOINT).fd)
    finally:
        cached.cleanup()


def test_the_cache_is_off_when_asked(compiled, cache_dir, monkeypatch):
    bpf, text, cflags = compiled
    monkeypatch.setenv(C.OFF_ENV, "0")
    C.store(bpf, text, cflags)
    assert not cache_dir.exists()
    monkeypatch.delenv(C.OFF_ENV)
    C.store(bpf, text, cflags)
    monkeypatch.setenv(C.OFF_ENV, "0")
    assert C.load(text, cflags) is None


def test_other_text_or_flags_find_no_entry(compiled, cache_dir):
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    assert C.load(text + "\n", cflags) is None
    assert C.load(text, [*cflags, "-DOTHER=1"]) is None
    assert C.cache_key(text, cflags) != C.cache_key(text, [*cflags, "-DOTHER=1"])


@pytest.mark.parametrize("spoil", ["not json", "wrong key", "wrong format"])
def test_a_spoiled_entry_is_not_used(compiled, cache_dir, spoil):
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    [path] = _entry_files(cache_dir)
    if spoil == "not json":
        path.write_text("{ half an entry")
    else:
        entry = json.loads(path.read_text())
        entry["key" if spoil == "wrong key" else "format"] = "0" * 64 if spoil == "wrong key" else 0
        path.write_text(json.dumps(entry))
    assert C.load(text, cflags) is None


def test_a_program_the_kernel_refuses_leaves_nothing_open(compiled, cache_dir):
    """An entry whose program the verifier refuses (here: one made to read an uninitialised
    register) is given up whole: None, every map and program it made closed, nothing left
    attached. The caller then compiles, and the compile says why, if the refusal is real."""
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    [path] = _entry_files(cache_dir)
    entry = json.loads(path.read_text())
    autoloaded = next(f for f in entry["functions"] if f["name"].startswith("raw_tracepoint__"))
    import base64
    insns = bytearray(base64.b64decode(autoloaded["insns"]))
    insns[0:8] = struct.pack("<BBhi", 0xbf, (9 << 4) | 0, 0, 0)  # r0 = r9: r9 was never written
    autoloaded["insns"] = base64.b64encode(bytes(insns)).decode()
    path.write_text(json.dumps(entry))
    before = _open_fds()
    assert C.load(text, cflags) is None
    assert _open_fds() == before


def _own_entry(compiled, cache_dir) -> tuple[str, list[str], Path]:
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    [path] = _entry_files(cache_dir)
    return text, cflags, path


def test_an_entry_someone_else_owns_is_not_used(compiled, cache_dir):
    text, cflags, path = _own_entry(compiled, cache_dir)
    os.chown(path, NOBODY, NOBODY)
    assert C.load(text, cflags) is None


def test_an_entry_others_may_write_is_not_used(compiled, cache_dir):
    text, cflags, path = _own_entry(compiled, cache_dir)
    path.chmod(0o622)
    assert C.load(text, cflags) is None


def test_a_link_in_place_of_an_entry_is_not_followed(compiled, cache_dir):
    text, cflags, path = _own_entry(compiled, cache_dir)
    real = path.with_name("elsewhere")
    path.rename(real)
    path.symlink_to(real)
    assert C.load(text, cflags) is None


@pytest.mark.parametrize("spoil", ["folder owned by a user", "folder writable by all", "folder is a link"])
def test_root_neither_reads_nor_writes_a_cache_folder_others_control(compiled, cache_dir, spoil):
    """The folder the cache is in, or the cache folder itself: where another user owns it,
    may write in it, or could have made it a link, root reads no entry from it and writes
    none into it."""
    bpf, text, cflags = compiled
    C.store(bpf, text, cflags)
    [path] = _entry_files(cache_dir)
    top = cache_dir.parent
    if spoil == "folder owned by a user":
        os.chown(top, NOBODY, NOBODY)
    elif spoil == "folder writable by all":
        top.chmod(0o777)
    else:
        cache_dir.rename(top / "real")
        cache_dir.symlink_to(top / "real")
        path = top / "real" / path.name
    assert C.load(text, cflags) is None
    path.unlink()
    C.store(bpf, text, cflags)
    assert not list((top / "real" if spoil == "folder is a link" else cache_dir).glob("*.json"))


def test_a_cache_folder_others_may_read_is_not_used(compiled, cache_dir):
    text, cflags, path = _own_entry(compiled, cache_dir)
    cache_dir.chmod(0o755)
    assert C.load(text, cflags) is None


def test_the_oldest_entries_go_beyond_the_kept_number(compiled, cache_dir, monkeypatch):
    bpf, text, cflags = compiled
    monkeypatch.setattr(C, "KEEP_ENTRIES", 2)
    for i in range(3):
        C.store(bpf, text, [*cflags, f"-DENTRY={i}"])
    kept = {p.stem for p in _entry_files(cache_dir)}
    assert kept == {C.cache_key(text, [*cflags, f"-DENTRY={i}"]) for i in (1, 2)}
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_what_the_cache_cannot_rebuild_is_not_stored():
    call = struct.pack("<BBhi", 0x85, 1 << 4, 0, 4)  # a BPF-to-BPF call
    value = struct.pack("<BBhi", 0x18, 2 << 4, 0, 7) + bytes(8)  # a map value's address
    with pytest.raises(C.NotCacheable):
        C._map_references(call, {})
    with pytest.raises(C.NotCacheable):
        C._map_references(value, {7: 0})
    map_fd = struct.pack("<BBhi", 0x18, 1 << 4, 0, 7) + bytes(8)
    assert C._map_references(map_fd, {7: 3}) == [[0, 3]]
    with pytest.raises(C.NotCacheable):
        C._map_references(map_fd, {})


def _leak_finding(run_memprof, leaks_json, tmp_path: Path, name: str, env: dict) -> tuple[dict, dict]:
    recording = tmp_path / f"{name}.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", KERNEL_LEAK, cwd=tmp_path, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    report = leaks_json(recording, "--layer", "kernel_slab", "--top", "1000")
    merged(report["findings"])  # one finding per chain
    return pipe_info_finding(report), read_meta(recording)


def test_a_recording_from_the_cache_finds_the_known_leak_as_a_compiled_one_does(run_memprof, leaks_json, tmp_path):
    """kernel_leak holds 257 pipes: compiled (cache off), then twice with the cache on, the
    second of which must come from it (the first stores the entry where there was none)."""
    compiled_finding, compiled_meta = _leak_finding(run_memprof, leaks_json, tmp_path, "compiled", {C.OFF_ENV: "0"})
    _leak_finding(run_memprof, leaks_json, tmp_path, "first", {})
    cached_finding, cached_meta = _leak_finding(run_memprof, leaks_json, tmp_path, "cached", {})
    detail = lambda meta: meta["sources"]["ebpf"]["detail"]  # noqa: E731
    assert detail(compiled_meta)["program_from_cache"] is False
    assert detail(cached_meta)["program_from_cache"] is True
    for finding in (compiled_finding, cached_finding):
        assert (finding["live_count"], finding["live_bytes"]) == (257, 257 * PIPE_BUFFER_ARRAY_BYTES)
    assert functions(cached_finding) == functions(compiled_finding)


def test_doctor_says_whether_a_warm_start_can_use_the_cache(compiled, cache_dir, monkeypatch):
    bpf, text, cflags = compiled
    ok, detail, _ = C.state()
    assert ok and "not made yet" in detail
    C.store(bpf, text, cflags)
    ok, detail, _ = C.state()
    assert ok and "1 compiled program(s) kept" in detail
    os.chown(cache_dir.parent, NOBODY, NOBODY)
    ok, detail, fix = C.state()
    assert not ok and "not root's alone" in detail and str(cache_dir) in fix
    monkeypatch.setenv(C.OFF_ENV, "0")
    ok, detail, fix = C.state()
    assert not ok and "every record compiles" in detail and C.OFF_ENV in fix


def _recorders_libraries(run_memprof, tmp_path: Path, name: str, env: dict) -> set[str]:
    """Which of libbcc.so, libbcc_bpf.so and libLLVM the recorder has mapped while its command
    runs: the command reads its parent's (the recorder's) maps."""
    probe = "grep -oE 'lib(LLVM|bcc|bcc_bpf)[-.0-9]*\\.so' /proc/$PPID/maps | sort -u"
    result = run_memprof("record", "-q", "-o", tmp_path / f"{name}.memprof", "--", "sh", "-c", probe,
                         cwd=tmp_path, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_the_recorder_never_loads_bccs_compiler_warm_or_cold(run_memprof, tmp_path):
    """bcc_import.py: from the cache, the recorder maps libbcc_bpf.so.0 alone (~60 MB less);
    a compile runs in a child (compile_child.py), so a cold recorder maps no more. Compiling
    in the recorder (MEMPROF_COMPILE_CHILD=0) maps the whole libbcc.so.0 with LLVM, and
    records as before."""
    _recorders_libraries(run_memprof, tmp_path, "first", {})  # stores the entry where there was none
    assert _recorders_libraries(run_memprof, tmp_path, "warm", {}) == {"libbcc_bpf.so"}
    assert _recorders_libraries(run_memprof, tmp_path, "cold", {C.OFF_ENV: "0"}) == {"libbcc_bpf.so"}
    in_recorder = _recorders_libraries(run_memprof, tmp_path, "in-recorder", {C.OFF_ENV: "0", "MEMPROF_COMPILE_CHILD": "0"})
    assert "libbcc.so" in in_recorder and any(name.startswith("libLLVM") for name in in_recorder), in_recorder

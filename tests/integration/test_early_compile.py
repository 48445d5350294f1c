"""bcc's compile, begun on a thread before the recorder is imported (sources/ebpf/early.py):
the foreground gets that very object with the start-up programs loaded, nothing of the
compile reaches the terminal, fd 2 is back before any command starts, and a failure is
reported once, by the foreground, as before."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from memprof.sources.ebpf import early
from memprof.sources.ebpf.loading import compile_program, program_source
from memprof.sources.ebpf.compiled_cache import OFF_ENV as NO_CACHE
from memprof.sources.ebpf.options import EbpfOptions


def _enabled(options):
    return options.enabled


def _fd2_identity() -> tuple[int, int]:
    st = os.fstat(2)
    return st.st_dev, st.st_ino


def test_the_foreground_takes_the_early_object_with_every_start_up_program_loaded():
    options = EbpfOptions()
    fd2 = _fd2_identity()
    early.begin(options)
    pending = early._pending
    before = early.programs_before(options)
    assert pending is not None and len(before) >= 10
    bpf = compile_program(options, _enabled(options))
    try:
        assert bpf is pending.bpf
        loaded = {name.decode() for name in bpf.funcs}
        assert {name for name, _ in before} <= loaded
        assert early._pending is None  # taken once
        assert _fd2_identity() == fd2
    finally:
        bpf.cleanup()


def test_an_early_compile_of_other_flags_is_released_and_not_used():
    options = EbpfOptions()
    early.begin(options)
    pending = early._pending
    text, cflags = program_source(options, _enabled(options))
    assert early.take(text, [*cflags, "-DOTHER_FLAGS=1"]) is None
    assert pending.done.is_set() and pending.bpf is not None
    assert pending.bpf.module is None  # bcc's cleanup() ran: its maps and programs are freed
    assert early._pending is None


def test_the_working_directory_stays_while_bcc_compiles(monkeypatch):
    """bcc's compile changes the working directory into the kernel's build folder and back;
    on its thread of its own (unshare(CLONE_FS)), memprof's main thread never sees it."""
    monkeypatch.setenv(NO_CACHE, "0")  # a compile, not the compiled_cache entry of an earlier one
    here, seen = os.getcwd(), set()
    options = EbpfOptions()
    early.begin(options)
    pending = early._pending
    while not pending.done.is_set():
        seen.add(os.getcwd())
    text, cflags = program_source(options, _enabled(options))
    early.take(text, cflags).cleanup()
    assert seen == {here}


def test_record_runs_a_relative_command_into_a_relative_output(run_memprof, tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran > ran.txt\n")
    script.chmod(0o755)
    proc = run_memprof("record", "-q", "-o", "rel.memprof", "--", "./run.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "rel.memprof" / "meta.json").is_file() and (tmp_path / "ran.txt").read_text() == "ran\n"


def test_take_without_begin_is_none():
    assert early.take("int f(void *c) { return 0; }", ["-w"]) is None


def _run(script: str) -> subprocess.CompletedProcess:
    """`script` in a Python of its own, compiling (the cache off): what it checks is the compile's."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, NO_CACHE: "0"})


def test_memprofs_own_messages_reach_the_terminal_while_the_compile_has_fd_2():
    proc = _run("""
        import os, sys
        from memprof.sources.ebpf import early
        from memprof.sources.ebpf.options import EbpfOptions
        early.begin(EbpfOptions())
        print("while compiling", file=sys.stderr, flush=True)
        assert sys.stderr.fileno() != 2
        early.take(*__import__("memprof.sources.ebpf.loading", fromlist=["x"]).program_source(
            EbpfOptions(), lambda f: f in EbpfOptions().families)).cleanup()
        os.write(2, b"fd 2 is back\\n")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["while compiling", "fd 2 is back"]


def test_a_program_that_fails_to_compile_is_reported_once_by_the_foreground():
    proc = _run("""
        import sys
        from memprof.errors import SourceUnavailableError
        from memprof.sources.ebpf import early, loading
        from memprof.sources.ebpf.options import EbpfOptions
        loading.program_source = lambda options, enabled: ("this is not C;", ["-w"])
        options = EbpfOptions()
        early.begin(options)
        try:
            loading.compile_program(options, lambda f: f in options.families)
        except SourceUnavailableError as e:
            print("typed:", e, file=sys.stderr)
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("typed: could not compile the eBPF probes: ") and "error" in lines[0]


def test_record_prints_no_compiler_text(run_memprof, tmp_path):
    proc = run_memprof("record", "-o", str(tmp_path / "t.memprof"), "--", "true", cwd=tmp_path,
                       env={**os.environ, NO_CACHE: "0"})  # compiling, not taking a cached object
    assert proc.returncode == 0, proc.stderr
    assert "loading probes" in proc.stderr
    assert "In file included" not in proc.stderr and "warning:" not in proc.stderr


def test_the_ring_buffer_is_the_size_asked_for(run_memprof, tmp_path):
    import json
    out = tmp_path / "r.memprof"
    proc = run_memprof("record", "-q", "--ring-buffer", "8MiB", "-o", str(out), "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    detail = json.loads((out / "meta.json").read_text())["sources"]["ebpf"]["detail"]
    assert detail["ring_buffer_bytes"] == 8 << 20


def test_from_the_cache_the_late_families_load_behind_the_start():
    """With bcc's compiled program in the cache, `take` returns once the programs attached
    before the command are loaded; the torch and cuda families' are loaded on behind it, and
    a foreground load (the first attach of such a library) waits for them."""
    options = EbpfOptions()
    text, cflags = program_source(options, _enabled(options))
    compile_program(options, _enabled(options)).cleanup()  # compiles where the cache has no entry yet: stores it
    before, late = early.programs_before(options), early.late_programs(options)
    assert late and not set(late) & set(before)
    early.begin(options)
    bpf = early.take(text, cflags)
    try:
        assert bpf is not None and bpf.FROM_CACHE and bpf.loads_behind
        assert {name for name, _ in before} <= {name.decode() for name in bpf.funcs}
        bpf.wait_behind()
        assert {name for name, _ in late} <= {name.decode() for name in bpf.funcs}
    finally:
        bpf.cleanup()


def test_kallsyms_is_read_while_bcc_compiles_and_not_when_the_cache_has_the_program(monkeypatch):
    """A compile leaves the main thread waiting: kallsyms' lasting part is read meanwhile, on a
    thread of its own, outside the compile thread's namespace where kallsyms reads as one line
    (the whole table, not that line); the first flush's load then reads nothing. From the
    cache (no compile, no wait) it is not read ahead."""
    from memprof.sources.symbols import symbolize
    from memprof.sources.symbols.symbol_cache import OFF_ENV as NO_SYMBOL_CACHE
    monkeypatch.setattr(symbolize, "_ahead", {})
    monkeypatch.setenv(NO_CACHE, "0")
    monkeypatch.setenv(NO_SYMBOL_CACHE, "0")  # no kept kallsyms: the thread must read the file itself
    options = EbpfOptions()
    text, cflags = program_source(options, _enabled(options))
    early.begin(options)
    bpf = early.take(text, cflags)
    try:
        entry = symbolize._kernel_entry()
        assert list(symbolize._ahead) == [entry]
        ahead = symbolize._ahead[entry].result(timeout=30)
        assert ahead is not None and len(ahead) > 10_000  # the kernel's table, not the answer's line
        assert same_symbols(ahead, symbolize.KernelSymbols.load().lasting())
        monkeypatch.setattr(symbolize.KernelSymbols, "load", classmethod(lambda cls, path=None: pytest.fail("read again")))
        assert len(symbolize.load_kernel_symbols(lambda: [])) == len(ahead)
    finally:
        bpf.cleanup()
    monkeypatch.undo()
    monkeypatch.setattr(symbolize, "_ahead", {})
    compile_program(options, _enabled(options)).cleanup()  # the cache has it now (or had it)
    early.begin(options)
    early.take(text, cflags).cleanup()
    assert symbolize._ahead == {}


def same_symbols(a, b) -> bool:
    return a.starts.tolist() == b.starts.tolist() and a.all_names() == b.all_names()


def _on_a_compile_thread(work, meanwhile=lambda: None):
    """(what the thread saw, what `meanwhile()` returned): `work()` runs on a thread set up
    as early's compile thread is, inside _kallsyms_answered, and `meanwhile()` on the calling
    thread while the thread is inside the block."""
    import threading
    result, inside, done_meanwhile = {}, threading.Event(), threading.Event()

    def run():
        assert early._own_working_directory()
        with early._kallsyms_answered() as answered:
            inside.set()
            done_meanwhile.wait(30)
            result["answered"], result["work"] = answered, work()
        result["after"] = open("/proc/kallsyms").readline()

    thread = threading.Thread(target=run)
    thread.start()
    inside.wait(30)
    seen = meanwhile()
    done_meanwhile.set()
    thread.join()
    return result, seen


def _mounts_over_kallsyms(mountinfo: str) -> list[str]:
    return [line for line in open(mountinfo) if " /proc/kallsyms " in line]


def test_bccs_kallsyms_question_is_answered_on_the_compile_thread_alone():
    """bcc reads all of /proc/kallsyms at each compile to ask for bpf_probe_read_kernel
    (~0.1 s); the compile thread reads the one line instead, in a mount namespace of its
    own: the process's other threads, and everyone else, read the kernel's file."""
    host_line = open("/proc/kallsyms").readline()
    result, seen_meanwhile = _on_a_compile_thread(
        lambda: (open("/proc/kallsyms").read(), open("/proc/thread-self/mountinfo").read()),
        meanwhile=lambda: (open("/proc/kallsyms").readline(), _mounts_over_kallsyms("/proc/1/mountinfo")))
    kallsyms, thread_mountinfo = result["work"]
    assert result["answered"] is True
    assert kallsyms == early.KALLSYMS_ANSWER.decode()
    assert " /proc/kallsyms " in thread_mountinfo
    assert seen_meanwhile == (host_line, [])  # the same moment, on this thread and in pid 1's namespace
    assert result["after"] == host_line  # the thread's own view, once the block ends
    assert _mounts_over_kallsyms("/proc/thread-self/mountinfo") == []


BPF_CALL, BPF_FUNC_PROBE_READ_KERNEL = 0x85, 113


def test_with_kallsyms_answered_bcc_still_calls_bpf_probe_read_kernel():
    """Had bcc not found bpf_probe_read_kernel in the line, it would have compiled
    bpf_probe_read in its place (helper 4, not 113)."""
    import ctypes
    from bcc import BPF, lib

    def compile_and_list_helpers():
        bpf = BPF(text=b"int f(void *ctx) { u64 x = 0; bpf_probe_read_kernel(&x, sizeof(x), ctx); return x; }")
        try:
            size = lib.bpf_function_size(bpf.module, b"f")
            code = ctypes.string_at(lib.bpf_function_start(bpf.module, b"f"), size)
            return [int.from_bytes(code[i + 4:i + 8], "little") for i in range(0, size, 8) if code[i] == BPF_CALL]
        finally:
            bpf.cleanup()

    result, _ = _on_a_compile_thread(compile_and_list_helpers)
    assert result["answered"] is True
    assert result["work"] == [BPF_FUNC_PROBE_READ_KERNEL]

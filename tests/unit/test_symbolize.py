"""Symbolization against real binaries: gcc-built programs, their /proc/PID/maps and libc."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memprof.sources.symbols.elfsyms import demangle
from memprof.sources.symbols.symbolize import (
    UNKNOWN, KernelSymbols, Mapping, UserSymbolizer, parse_maps, snapshot_maps,
)

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81000000 T srso_alias_untrain_ret
ffffffff81001000 t __pfx_do_one
ffffffff81001010 t do_one
ffffffff81001100 T do_two
ffffffff81001200 D some_data
ffffffff81001300 W weak_fn
0000000000000000 T hidden_by_kptr_restrict
ffffffffc0a00000 t mod_fn\t[nvidia]
ffffffffc0a00040 T mod_fn2\t[nvidia]
"""

C_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) int leaf_func(int x) { return x * 3 + 1; }
__attribute__((noinline)) int middle_func(int x) { return leaf_func(x) + 2; }
/* An assembly function: its symbol has no size. */
__asm__(".globl asm_func\n.type asm_func, @function\nasm_func:\n  ret\n");
void asm_func(void);
static const char message[] = "read-only data, after .fini";

int main(void) {
    void *(*volatile m)(size_t) = &malloc;  /* volatile: keep the runtime address of libc's malloc */
    printf("%lx %d %lx %d %lx %lx\n", (unsigned long)&leaf_func, (int)getpid(), (unsigned long)m,
           middle_func(1), (unsigned long)&asm_func, (unsigned long)message);
    fflush(stdout);
    char buf[16];
    while (fgets(buf, sizeof buf, stdin)) {}
    return 0;
}
"""

CXX_PROGRAM = r"""
#include <cstdio>
#include <unistd.h>
namespace c10 {
__attribute__((noinline)) void *alloc_cpu(unsigned long n) { return new char[n]; }
}
int main() {
    std::printf("%lx %d\n", (unsigned long)&c10::alloc_cpu, (int)getpid());
    std::fflush(stdout);
    char buf[16];
    while (std::fgets(buf, sizeof buf, stdin)) {}
}
"""


# --------------------------------------------------------------------------------------------
# kernel


def test_kallsyms_resolves_function_offset_and_module():
    syms = KernelSymbols.from_text(KALLSYMS)
    frames = syms.resolve(np.array([0xffffffff81001010, 0xffffffff81001015, 0xffffffff81001180,
                                    0xffffffffc0a00044, 0xffffffff81000004], dtype=np.uint64))
    assert [(f.function, f.module, f.offset) for f in frames] == [
        ("do_one", "vmlinux", 0),
        ("do_one", "vmlinux", 5),
        ("do_two", "vmlinux", 0x80),
        ("mod_fn2", "nvidia", 4),
        ("_stext", "vmlinux", 4),  # aliases: the first listed wins
    ]


def test_kallsyms_skips_padding_data_and_zero_addresses():
    syms = KernelSymbols.from_text(KALLSYMS)
    assert "__pfx_do_one" not in set(syms.all_names())
    assert "some_data" not in set(syms.all_names())
    assert "hidden_by_kptr_restrict" not in set(syms.all_names())
    # The padding before do_one belongs to the function before it, not to "__pfx_do_one".
    assert syms.resolve([0xffffffff81001004])[0].function == "_stext"


def test_kallsyms_below_first_symbol_and_zero_are_unknown():
    frames = KernelSymbols.from_text(KALLSYMS).resolve([0xffffffff80000000, 0])
    assert [f.function for f in frames] == [UNKNOWN, UNKNOWN]
    assert frames[0].offset == 0xffffffff80000000


def test_empty_kallsyms_resolves_everything_unknown():
    syms = KernelSymbols.from_text("0000000000000000 T foo\n")
    assert len(syms) == 0
    assert syms.resolve([0xffffffff81000000])[0].function == UNKNOWN


def test_real_kallsyms_loads_when_readable():
    try:
        syms = KernelSymbols.load()
    except OSError:
        pytest.skip("no /proc/kallsyms")
    if len(syms) == 0:
        pytest.skip("kallsyms addresses hidden (kptr_restrict, not root)")
    i = len(syms) // 2
    frame = syms.resolve([int(syms.starts[i]) + 1])[0]
    assert (frame.function, frame.offset) == (syms.name(i), 1)


# --------------------------------------------------------------------------------------------
# /proc/PID/maps


def test_parse_maps_keeps_executable_and_file_backed_mappings():
    text = (
        "00400000-00401000 r--p 00000000 08:01 12 /usr/bin/prog\n"
        "00401000-00402000 r-xp 00001000 08:01 12 /usr/bin/prog\n"
        "01000000-01021000 rw-p 00000000 00:00 0 [heap]\n"
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n"
        "7f0000001000-7f0000002000 rwxp 00000000 00:00 0 \n"
        "7f0000002000-7f0000003000 r-xp 00002000 08:01 99 /tmp/my lib.so (deleted)\n"
        "7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n"
    )
    maps = parse_maps(text)
    assert [(m.start, m.path, m.deleted) for m in maps] == [
        (0x400000, "/usr/bin/prog", False),
        (0x401000, "/usr/bin/prog", False),
        (0x1000000, "[heap]", False),
        (0x7f0000001000, "", False),
        (0x7f0000002000, "/tmp/my lib.so", True),
        (0x7fff00000000, "[vdso]", False),
    ]
    assert maps[1] == Mapping(0x401000, 0x402000, 0x1000, "/usr/bin/prog")
    assert [m.executable for m in maps] == [False, True, False, True, True, True]


def test_a_frame_pointer_walk_is_believed_up_to_its_first_address_outside_code():
    """Debian's python3.11 has no frame pointers: a walk from a thread's start read its
    real callers, then 126 "frames" in [heap] (2026-12-07). They are cut at the first return
    address in memory without execute permission; one in no mapping (a library mapped since
    the snapshot) is kept."""
    maps = parse_maps(
        "00400000-00401000 r--p 00000000 08:01 12 /usr/bin/prog\n"
        "00401000-00402000 r-xp 00001000 08:01 12 /usr/bin/prog\n"
        "01000000-01021000 rw-p 00000000 00:00 0 [heap]\n")
    symbolizer = UserSymbolizer()
    assert symbolizer.walk_valid_up_to(maps, [0x401010, 0x401020, 0x1000100, 0x401030, 0x1000200]) == 2
    assert symbolizer.walk_valid_up_to(maps, [0x401010, 0x5000000, 0x401030]) == 3
    assert symbolizer.walk_valid_up_to(maps, [0x400010]) == 0  # the program's headers are no code
    assert symbolizer.walk_valid_up_to(maps, []) == 0


def test_snapshot_maps_of_a_gone_process_is_none():
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert snapshot_maps(proc.pid) is None


# --------------------------------------------------------------------------------------------
# user space, real binaries


def _compile(tmp_path: Path, name: str, source: str, flags: list[str], compiler: str = "gcc") -> Path:
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not installed")
    src = tmp_path / (name + (".cc" if compiler == "g++" else ".c"))
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run([compiler, "-O0", "-g", *flags, "-o", str(exe), str(src)], check=True)
    return exe


class Running:
    """A test program waiting on stdin; `fields` is its first line of output, split."""

    def __init__(self, exe: Path):
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.fields = self.proc.stdout.readline().split()
        self.pid = int(self.fields[1])
        assert self.pid == self.proc.pid

    def maps(self):
        return parse_maps(snapshot_maps(self.pid))

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def run():
    started = []

    def start(exe: Path) -> Running:
        started.append(Running(exe))
        return started[-1]

    yield start
    for r in started:
        r.stop()


@pytest.mark.parametrize("pie", ["-no-pie", "-pie"])
def test_resolves_own_function_in_pie_and_non_pie(tmp_path, run, pie):
    exe = _compile(tmp_path, "prog" + pie, C_PROGRAM, [pie, "-fPIE" if pie == "-pie" else "-fno-pie"])
    target = run(exe)
    leaf = int(target.fields[0], 16)
    frames = UserSymbolizer().resolve(target.maps(), np.array([leaf, leaf + 5], dtype=np.uint64))
    assert frames[0].function == "leaf_func" and frames[0].offset == 0 and frames[0].module == exe.name
    assert (frames[1].function, frames[1].offset) == ("leaf_func", 5)


def test_resolves_libc_malloc(tmp_path, run):
    # PIE on purpose: a non-PIE program's &malloc is its own canonical PLT stub, not libc's malloc.
    target = run(_compile(tmp_path, "prog", C_PROGRAM, ["-pie", "-fPIE"]))
    frame = UserSymbolizer().resolve(target.maps(), [int(target.fields[2], 16)])[0]
    assert frame.function in {"malloc", "__libc_malloc"}
    assert frame.module == "libc.so.6"
    assert frame.offset == 0


def test_equal_addresses_and_unmapped_ones(tmp_path, run):
    target = run(_compile(tmp_path, "prog", C_PROGRAM, ["-pie", "-fPIE"]))
    leaf = int(target.fields[0], 16)
    malloc = int(target.fields[2], 16)
    frames = UserSymbolizer().resolve(target.maps(), [malloc, leaf, 8, leaf + 2, leaf, malloc])
    assert [f.function for f in frames[1:5]] == ["leaf_func", UNKNOWN, "leaf_func", "leaf_func"]
    assert frames[0].module == "libc.so.6"
    assert frames[1] is frames[4] and frames[0] is frames[5]
    assert (frames[2].module, frames[2].offset) == (UNKNOWN, 8)


def test_symbols_without_size_end_with_their_section(tmp_path, run):
    target = run(_compile(tmp_path, "prog", C_PROGRAM, ["-pie", "-fPIE"]))
    asm_func, message = int(target.fields[4], 16), int(target.fields[5], 16)
    frames = UserSymbolizer().resolve(target.maps(), [asm_func, message])
    assert (frames[0].function, frames[0].offset) == ("asm_func", 0)
    # .rodata follows .fini, whose `_fini` has no size: it must not claim the string.
    assert (frames[1].function, frames[1].module) == (UNKNOWN, "prog")


def test_pseudo_and_anonymous_mappings_are_named_not_read():
    maps = parse_maps("7f0000001000-7f0000002000 rwxp 00000000 00:00 0 \n"
                      "7fff00000000-7fff00002000 r-xp 00000000 00:00 0 [vdso]\n")
    frames = UserSymbolizer().resolve(maps, [0x7f0000001010, 0x7fff00000020])
    assert [(f.function, f.module, f.offset) for f in frames] == [
        (UNKNOWN, "[anon]", 0x10), (UNKNOWN, "[vdso]", 0x20)]


def test_demangles_cxx_names(tmp_path, run):
    assert demangle("_ZN3c109alloc_cpuEm") == "c10::alloc_cpu(unsigned long)"
    assert demangle("malloc") == "malloc"
    assert demangle("_Znot_really_mangled") == "_Znot_really_mangled"
    target = run(_compile(tmp_path, "cxxprog", CXX_PROGRAM, ["-pie", "-fPIE"], compiler="g++"))
    frame = UserSymbolizer().resolve(target.maps(), [int(target.fields[0], 16) + 1])[0]
    assert (frame.function, frame.module, frame.offset) == ("c10::alloc_cpu(unsigned long)", "cxxprog", 1)


def test_deleted_binary_resolves_unknown(tmp_path, run):
    exe = _compile(tmp_path, "prog", C_PROGRAM, ["-pie", "-fPIE"])
    target = run(exe)
    leaf = int(target.fields[0], 16)
    maps_before = target.maps()
    exe.unlink()
    maps_after = target.maps()
    assert any(m.deleted and m.path == str(exe) for m in maps_after)
    for maps in (maps_before, maps_after):
        frame = UserSymbolizer().resolve(maps, [leaf])[0]
        assert (frame.function, frame.module) == (UNKNOWN, "prog")


def test_replaced_binary_is_reread(tmp_path, run):
    exe = _compile(tmp_path, "prog", C_PROGRAM, ["-pie", "-fPIE"])
    target = run(exe)
    leaf = int(target.fields[0], 16)
    maps = target.maps()
    symbolizer = UserSymbolizer()
    assert symbolizer.resolve(maps, [leaf])[0].function == "leaf_func"
    replacement = tmp_path / "replacement"
    replacement.write_bytes(b"not an ELF file")
    os.replace(replacement, exe)
    frame = symbolizer.resolve(maps, [leaf])[0]
    assert (frame.function, frame.module) == (UNKNOWN, "prog")


def test_symbols_read_ahead_are_not_read_again(monkeypatch, tmp_path):
    """SymbolPrewarm reads each file once, on its thread; afterwards the symbolizer finds it
    cached, and a file it could not read stays 'no symbols' (None) without a retry."""
    import memprof.sources.symbols.symbolize as symbolize
    reads = []
    real = symbolize.ElfSymbols

    def counting(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(symbolize, "ElfSymbols", counting)
    libc = os.path.realpath(next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6") if os.path.exists(p)))
    garbage = tmp_path / "not-elf.so"
    garbage.write_bytes(b"not an ELF file")
    user = UserSymbolizer()
    ahead = symbolize.SymbolPrewarm(user, [libc, str(garbage)])
    ahead.wait()
    assert reads == [libc, str(garbage)]
    table = user.symbols_for(libc)
    assert table is not None and user.symbols_for(str(garbage)) is None
    assert reads == [libc, str(garbage)]  # nothing read twice



def test_a_processes_maps_are_read_up_to_a_bound_in_whole_lines(monkeypatch):
    """A process decides how long its maps file is (tens of thousands of mappings at long
    paths): the root recorder reads at most MAX_MAPS_BYTES of it, whole lines only."""
    from memprof.sources.symbols import symbolize
    # A process that says when it has started: its maps do not change after (a `sleep` just
    # exec'd may still be mapping its libraries between the snapshots below).
    settled = "import time; print(1, flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", settled], stdout=subprocess.PIPE) as proc:
        try:
            proc.stdout.readline()
            whole = snapshot_maps(proc.pid)
            monkeypatch.setattr(symbolize, "MAX_MAPS_BYTES", len(whole) // 2)
            cut = snapshot_maps(proc.pid)
            monkeypatch.setattr(symbolize, "MAX_MAPS_BYTES", len(whole))
            exactly = snapshot_maps(proc.pid)
        finally:
            proc.kill()
    assert 0 < len(cut) <= len(whole) // 2 and cut.endswith("\n") and whole.startswith(cut)
    assert parse_maps(cut) == parse_maps(whole)[:len(parse_maps(cut))]
    assert exactly == whole  # a file of just the bound is read whole


def test_a_mapped_files_name_that_is_not_utf8_is_read_with_its_bytes_escaped(tmp_path):
    """A target can map a file whose name is any bytes: they read as text ("\\xff"), which
    the recording can store, never as an error that stops the recorder."""
    name = os.fsencode(tmp_path) + b"/lib\xff\xfe.so"
    with open(name, "wb") as f:
        f.write(b"x" * 4096)
    code = "import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ); print(1, flush=True); time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE) as proc:
        try:
            proc.stdout.readline()
            text = snapshot_maps(proc.pid)
        finally:
            proc.kill()
    assert text.count(f"{tmp_path}/lib\\xff\\xfe.so\n") == 1

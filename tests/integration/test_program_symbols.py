"""The loaded BPF programs' symbols from the kernel's program info
(memprof/sources/ebpf/bpfinfo.py program_symbols) are the ones kallsyms lists: what lets a
warm recorder take kallsyms' lasting part from the cache and still name the programs on top
of its kernel stacks (sources/symbols/symbolize.py load_kernel_symbols). Real eBPF: a
program loaded here by the bpf() system call, and the real /proc/kallsyms."""
from __future__ import annotations

import os
import time

import pytest

from memprof.sources.ebpf.bpfinfo import program_symbols
from memprof.sources.ebpf.cached_bpf import load_program
from memprof.sources.symbols.symbolize import KernelSymbols, load_kernel_symbols

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="bpf() and kallsyms' addresses need root")]

_SOCKET_FILTER = 1
# r0 = 0; exit
_RETURN_ZERO = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


@pytest.fixture
def loaded_program():
    """The name of a program loaded for this test by memprof's own loader (closed after it)."""
    fd = load_program(_SOCKET_FILTER, b"mp_symtest", _RETURN_ZERO, b"GPL", 0)
    yield "mp_symtest"
    os.close(fd)


def kallsyms_programs() -> dict[int, str]:
    """kallsyms' BPF program symbols (not the trampolines or dispatchers), by address."""
    found = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4 and parts[3] == "[bpf]" and parts[2].startswith("bpf_prog_"):
                found[int(parts[0], 16)] = parts[2]
    return found


def settled_programs() -> tuple[dict[int, str], dict[int, str]]:
    """(program info's symbols, kallsyms' programs) read while no program came or went: an
    earlier test's recording lets go of its programs in the second after it returns."""
    for _ in range(40):
        before = kallsyms_programs()
        from_info = dict(program_symbols())
        if kallsyms_programs() == before:
            return from_info, before
        time.sleep(0.25)
    pytest.fail("BPF programs kept coming and going for 10 s")


def test_program_info_names_every_program_as_kallsyms_does(loaded_program):
    from_info, listed = settled_programs()
    ours = [name for name in from_info.values() if name.endswith("_" + loaded_program)]
    assert len(ours) == 1 and ours[0] in listed.values()
    assert from_info == listed


def test_a_kept_kallsyms_names_a_program_loaded_since(loaded_program):
    """The kernel's lasting symbols read now, the program's from its info: an address inside
    the program resolves to its kallsyms name, as a whole read of kallsyms would say."""
    whole = KernelSymbols.load()
    start, name = next((a, n) for a, n in program_symbols() if n.endswith("_" + loaded_program))
    for table in (whole, whole.lasting().with_symbols(program_symbols(), "bpf"),
                  load_kernel_symbols(program_symbols)):
        [frame] = table.resolve([start + 4])
        assert (frame.function, frame.module, frame.offset) == (name, "bpf", 4)


def test_a_program_bcc_compiled_is_named_by_its_btf_name_whole():
    """bcc loads its programs with BTF function info, and kallsyms then names a program by
    its function's BTF name, not by the 15 characters the kernel keeps of its name."""
    from bcc import BPF
    bpf = BPF(text=b"int mp_symtest_a_name_longer_than_fifteen(void *ctx) { return 0; }")
    try:
        bpf.load_func(b"mp_symtest_a_name_longer_than_fifteen", BPF.SOCKET_FILTER)
        ours = [name for name in dict(program_symbols()).values() if "mp_symtest_a_name" in name]
        assert len(ours) == 1 and ours[0].endswith("_mp_symtest_a_name_longer_than_fifteen")
        assert ours[0] in kallsyms_programs().values()
    finally:
        bpf.cleanup()

"""memprof/sources/ebpf/callsite.py: the one `call` an allocator makes with (address, size), found
in a real shared library built here with gcc, and in torch's own libc10 where installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from memprof.sources.ebpf import callsite as C
from memprof.sources.ebpf.callsite import CallSite, _read_vaddr, find_call_site
from memprof.sources.symbols import symbol_cache

pytest.importorskip("capstone")


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch):
    """Call sites are kept across runs in symbol_cache's folder: each test gets one of its
    own, in a folder only root may write (as the real one), so that none reads another's."""
    top = Path("/var/cache/memprof-tests") / uuid.uuid4().hex
    monkeypatch.setattr(symbol_cache, "CACHE_DIR", str(top / "symbols"))
    monkeypatch.delenv(symbol_cache.OFF_ENV, raising=False)
    yield top / "symbols"
    shutil.rmtree(top, ignore_errors=True)

LIBRARY = r"""
#include <stdlib.h>
/* Exported: calls from this library go through its PLT stub (semantic interposition). */
__attribute__((noipa)) void hook(void *p, unsigned long n, int node) { __asm__ volatile("" ::: "memory"); }
/* Local: called directly (noipa: no clone under another name). */
static __attribute__((noipa)) void local_hook(void *p, unsigned long n) { __asm__ volatile("" ::: "memory"); }

void *alloc_once(unsigned long n) { void *p = malloc(n); if (p) hook(p, n, 0); return p; }
void *alloc_twice(unsigned long n) { void *p = malloc(n); hook(p, n, 0); hook(p, n, 1); return p; }
void *alloc_never(unsigned long n) { void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; }
void *alloc_local(unsigned long n) { void *p = malloc(n); local_hook(p, n); return p; }
__attribute__((optimize("omit-frame-pointer"))) void *alloc_no_frame(unsigned long n)
{ void *p = malloc(n); hook(p, n, 0); return p; }
/* Longer than the finder decodes (64 KiB of nops after the call). */
void *alloc_huge(unsigned long n) { void *p = malloc(n); hook(p, n, 0); __asm__ volatile(".fill 70000,1,0x90"); return p; }
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    directory = tmp_path_factory.mktemp("callsite")
    (directory / "lib.c").write_text(LIBRARY)
    path = directory / "libsite.so"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared", "-o", str(path),
                    str(directory / "lib.c")], check=True, capture_output=True)
    return path


def symbol_address(path: Path, name: str) -> int:
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for section in (".dynsym", ".symtab"):
            table = elf.get_section_by_name(section)
            found = table and table.get_symbol_by_name(name)
            if found:
                return found[0]["st_value"]
    raise KeyError(name)


def call_target(path: Path, caller: str, offset: int) -> int:
    """Where the 5-byte `call rel32` at caller+offset goes."""
    from elftools.elf.elffile import ELFFile
    at = symbol_address(path, caller) + offset
    with open(path, "rb") as f:
        code, _ = _read_vaddr(ELFFile(f), at, 5)
    assert code[0] == 0xE8, code.hex()
    return at + 5 + int.from_bytes(code[1:], "little", signed=True)


def test_a_call_through_the_plt_is_found(library):
    site = find_call_site(str(library), "alloc_once", "hook")
    assert site.offset is not None, site.why
    target = call_target(library, "alloc_once", site.offset)
    assert target != symbol_address(library, "hook")  # the PLT stub, not hook itself
    assert site.why == f"one uprobe at alloc_once+{site.offset:#x}, its call to hook"


def test_a_direct_call_to_a_local_function_is_found(library):
    site = find_call_site(str(library), "alloc_local", "local_hook")
    assert site.offset is not None, site.why
    assert call_target(library, "alloc_local", site.offset) == symbol_address(library, "local_hook")


@pytest.mark.parametrize("caller, callee, why", [
    ("alloc_twice", "hook", "alloc_twice calls hook 2 times, not once"),
    ("alloc_never", "hook", "alloc_never calls hook 0 times, not once"),
    ("alloc_no_frame", "hook", "alloc_no_frame does not set up a frame pointer"),
    ("alloc_once", "no_such_function", "no_such_function is neither defined nor imported through the PLT"),
    ("no_such_caller", "hook", "no_such_caller is not defined here"),
])
def test_no_single_certain_call_gives_the_reason(library, caller, callee, why):
    assert find_call_site(str(library), caller, callee) == CallSite(None, why)


def test_a_function_longer_than_what_is_decoded_is_refused(library):
    site = find_call_site(str(library), "alloc_huge", "hook")
    assert site.offset is None and site.why.startswith("alloc_huge is 7") and site.why.endswith("(decoded: 1 to 65536)")


def test_an_unreadable_file_gives_the_reason(tmp_path):
    bogus = tmp_path / "not_elf.so"
    bogus.write_bytes(b"not an ELF file at all")
    site = find_call_site(str(bogus), "alloc_once", "hook")
    assert site.offset is None and site.why.startswith(f"cannot read {bogus}")


def test_torch_alloc_cpu_calls_numa_move_once():
    """The site the torch probe uses, in the installed torch: a `call` into NUMAMove's PLT stub."""
    torch_lib = pytest.importorskip("torch").__file__
    libc10 = Path(torch_lib).parent / "lib" / "libc10.so"
    site = find_call_site(str(libc10), "_ZN3c109alloc_cpuEm", "_ZN3c108NUMAMoveEPvmi")
    assert site.offset is not None, site.why
    assert site.why.startswith("one uprobe at c10::alloc_cpu(unsigned long)+0x")
    assert site.why.endswith("its call to c10::NUMAMove(void*, unsigned long, int)")


@pytest.mark.skipif(os.geteuid() != 0, reason="the cache serves root")
def test_a_call_site_found_once_is_kept_and_needs_no_decoding(library, cache_dir, monkeypatch):
    """The second recorder to probe the same file takes the call site kept by the first:
    capstone's import and the decoding were 20-30 ms of each start of a torch command."""
    first = find_call_site(str(library), "alloc_once", "hook")
    assert first.offset is not None
    assert len(list(cache_dir.glob("*.site"))) == 1

    def refuse(*args):
        raise AssertionError("decoded again, not taken from the cache")
    monkeypatch.setattr(C, "_decode", refuse)
    assert find_call_site(str(library), "alloc_once", "hook") == first


@pytest.mark.skipif(os.geteuid() != 0, reason="the cache serves root")
def test_a_kept_call_site_is_not_used_for_a_changed_file_or_other_symbols(library, cache_dir, tmp_path):
    """An entry is the file's (device, inode, size, mtime, ctime) and the two symbols': a
    copy of the library, or another caller, is decoded again; and a kept offset whose byte
    is no longer a `call` is not used."""
    first = find_call_site(str(library), "alloc_once", "hook")
    copy = tmp_path / "libcopy.so"
    shutil.copy(library, copy)
    assert find_call_site(str(copy), "alloc_once", "hook") == first  # decoded: the same code
    assert find_call_site(str(library), "alloc_local", "local_hook").offset is not None
    assert len(list(cache_dir.glob("*.site"))) == 3
    with open(library, "rb") as f:
        name = symbol_cache.file_key(os.fstat(f.fileno()), "alloc_once", "hook", kind="call-site-record")
        assert C._kept(f, name, "alloc_once", "hook") == first
    kept = symbol_cache.load_record(name, C._KEPT_SUFFIX)
    symbol_cache.store_record(name, {**kept, "file_offset": kept["file_offset"] + 1}, C._KEPT_SUFFIX)
    with open(library, "rb") as f:
        assert C._kept(f, name, "alloc_once", "hook") is None  # its byte is no `call`
    for spoiled in ({"offset": True, "file_offset": kept["file_offset"]}, {"offset": kept["offset"]}, {}):
        symbol_cache.store_record(name, spoiled, C._KEPT_SUFFIX)
        with open(library, "rb") as f:
            assert C._kept(f, name, "alloc_once", "hook") is None, spoiled

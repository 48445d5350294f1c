"""Symbol tables kept across runs (memprof/sources/symbols/symbol_cache.py): an ELF file's
arrays and kallsyms' lasting part come back from the cache exactly as a read gives them,
without the read; a changed file, a spoiled or foreign entry, or the cache turned off reads
the file again; the BPF programs' symbols taken from the kernel's program info are the ones
kallsyms lists. Real files (libc, torch's libtorch_cpu.so), the real kallsyms, a cache
folder of each test's own under /var/cache (root's, as the real one)."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from memprof.sources.symbols import symbol_cache as S
from memprof.sources.symbols.elfsyms import ElfSymbols
from memprof.sources.symbols.symbolize import KernelSymbols, kernel_entry_name, load_kernel_symbols

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cache serves root")

LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
ARRAYS = ("seg_offset", "seg_filesz", "seg_vaddr", "values", "sizes", "name_offsets")
NOBODY = 65534


@pytest.fixture
def cache_dir(monkeypatch):
    """A cache folder of this test's own, in a folder only root may write (as the real one)."""
    top = Path("/var/cache/memprof-tests") / uuid.uuid4().hex
    monkeypatch.setattr(S, "CACHE_DIR", str(top / "symbols"))
    monkeypatch.delenv(S.OFF_ENV, raising=False)
    yield top / "symbols"
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def keep_small(monkeypatch):
    """Keep every table, libc's (30 kB of names) too: the tests need not read libtorch's."""
    monkeypatch.setattr(ElfSymbols, "CACHED_STRTAB_BYTES", 0)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.npz")) if folder.is_dir() else []


def no_reads(monkeypatch) -> None:
    def refuse(self, f):
        raise AssertionError("the file's symbols were read, not taken from the cache")
    monkeypatch.setattr(ElfSymbols, "_read", refuse)


def same_tables(a: ElfSymbols, b: ElfSymbols) -> bool:
    return all(np.array_equal(getattr(a, name), getattr(b, name)) for name in ARRAYS)


def names_at(table: ElfSymbols, count: int = 50) -> list[str]:
    return [table.name(i) for i in range(0, len(table.values), max(1, len(table.values) // count))]


# -- ELF files ------------------------------------------------------------------------------

def test_a_kept_table_is_the_read_one_and_needs_no_read(cache_dir, keep_small, monkeypatch):
    read = ElfSymbols(LIBC)
    [entry] = entries(cache_dir)
    assert entry.stat().st_mode & 0o777 == 0o600 and entry.stat().st_uid == 0
    no_reads(monkeypatch)
    kept = ElfSymbols(LIBC)
    assert same_tables(read, kept) and len(kept.values) > 1000
    assert names_at(kept) == names_at(read) and "malloc" in {kept.name(i) for i in range(len(kept.values))}


def test_a_small_table_is_not_kept(cache_dir):
    ElfSymbols(LIBC)  # 30 kB of names: read in ~10 ms, less than an entry would save
    assert entries(cache_dir) == []


def test_a_changed_file_is_read_again_not_taken_from_its_old_entry(cache_dir, keep_small, tmp_path):
    copy = tmp_path / "libc.so.6"
    shutil.copyfile(LIBC, copy)
    ElfSymbols(str(copy))
    with open(copy, "r+b") as f:  # same size, same path, same inode: only the times tell
        magic = f.read(4)
        f.seek(0)
        f.write(magic)
    os.utime(copy, ns=(0, 0))  # an owner can set mtime back; ctime still moves
    ElfSymbols(str(copy))
    assert len(entries(cache_dir)) == 2


@pytest.mark.parametrize("spoil", ["garbage", "truncated", "wrong dtype", "missing array", "unsorted",
                                   "names outside the file"])
def test_a_spoiled_entry_reads_the_file_instead(cache_dir, keep_small, spoil):
    read = ElfSymbols(LIBC)
    [entry] = entries(cache_dir)
    arrays = dict(np.load(entry))
    if spoil == "garbage":
        entry.write_bytes(b"not a zip")
    elif spoil == "truncated":
        entry.write_bytes(entry.read_bytes()[:1000])
    else:
        if spoil == "wrong dtype":
            arrays["values"] = arrays["values"].astype(np.float64)
        elif spoil == "missing array":
            del arrays["sizes"]
        elif spoil == "names outside the file":
            arrays["strtab"] = np.array([-8, arrays["strtab"][1]], dtype=np.int64)
        else:
            arrays["values"] = arrays["values"][::-1].copy()
        with open(entry, "wb") as f:
            np.savez(f, **arrays)
    again = ElfSymbols(LIBC)  # read, and kept again
    assert same_tables(read, again) and names_at(again) == names_at(read)


@pytest.mark.parametrize("foreign", ["another's", "writable by others", "a link"])
def test_an_entry_root_alone_does_not_own_is_not_used(cache_dir, keep_small, monkeypatch, tmp_path, foreign):
    ElfSymbols(LIBC)
    [entry] = entries(cache_dir)
    if foreign == "another's":
        os.chown(entry, NOBODY, NOBODY)
    elif foreign == "writable by others":
        entry.chmod(0o666)
    else:
        target = tmp_path / "elsewhere.npz"
        shutil.copyfile(entry, target)
        entry.unlink()
        entry.symlink_to(target)
    read_again = []
    monkeypatch.setattr(ElfSymbols, "_read", lambda self, f, real=ElfSymbols._read: (read_again.append(1),
                                                                                     real(self, f)))
    ElfSymbols(LIBC)
    assert read_again == [1]


def test_a_folder_another_may_write_is_neither_read_nor_written(cache_dir, keep_small, monkeypatch, tmp_path):
    ElfSymbols(LIBC)
    os.chown(cache_dir.parent, NOBODY, NOBODY)
    copy = tmp_path / "libc.so.6"
    shutil.copyfile(LIBC, copy)
    ElfSymbols(str(copy))
    assert len(entries(cache_dir)) == 1  # nothing written for the copy
    read_again = []
    monkeypatch.setattr(ElfSymbols, "_read", lambda self, f, real=ElfSymbols._read: (read_again.append(1),
                                                                                     real(self, f)))
    ElfSymbols(LIBC)
    assert read_again == [1]
    ok, detail, fix = S.state()
    assert not ok and "not root's alone" in detail and str(cache_dir) in fix


def test_off_keeps_and_takes_nothing(cache_dir, keep_small, monkeypatch):
    monkeypatch.setenv(S.OFF_ENV, "0")
    ElfSymbols(LIBC)
    assert entries(cache_dir) == []
    ok, detail, fix = S.state()
    assert not ok and S.OFF_ENV in fix


def test_only_the_newest_entries_are_kept(cache_dir, keep_small, monkeypatch, tmp_path):
    monkeypatch.setattr(S, "KEEP_ENTRIES", 2)
    copies = []
    for i in range(3):
        copy = tmp_path / f"libc{i}.so"
        shutil.copyfile(LIBC, copy)
        copies.append(copy)
        ElfSymbols(str(copy))
    assert len(entries(cache_dir)) == 2
    ok, detail, _ = S.state()
    assert ok and "2 symbol table(s) kept" in detail


torch = pytest.importorskip("torch")
LIBTORCH_CPU = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")


def test_libtorch_is_kept_at_the_default_size_and_comes_back_whole(cache_dir, monkeypatch):
    read = ElfSymbols(LIBTORCH_CPU)
    [entry] = entries(cache_dir)
    assert entry.stat().st_size < len(read.values) * 24 + (1 << 20)  # the arrays, not the 84 MB of names
    no_reads(monkeypatch)
    kept = ElfSymbols(LIBTORCH_CPU)
    assert same_tables(read, kept) and names_at(kept, 200) == names_at(read, 200)


# -- kallsyms -------------------------------------------------------------------------------

FAKE_PROGRAMS = [(0xFFFFFFFFC0DE0000, "bpf_prog_0123456789abcdef_mp_test"),
                 (0xFFFFFFFFC0DE1000, "bpf_prog_fedcba9876543210_other")]


def kallsyms_with_programs() -> KernelSymbols:
    """The real kallsyms, less what is transient in it, plus FAKE_PROGRAMS: what a read would
    give if those programs were loaded."""
    return KernelSymbols.load().lasting().with_symbols(FAKE_PROGRAMS, "bpf")


def same_kernel_tables(a: KernelSymbols, b: KernelSymbols) -> bool:
    return (np.array_equal(a.starts, b.starts) and a.all_names() == b.all_names()
            and a.all_modules() == b.all_modules())


def test_kallsyms_kept_for_the_boot_with_the_programs_from_their_info(cache_dir, monkeypatch):
    first = load_kernel_symbols(lambda: FAKE_PROGRAMS)  # nothing kept yet: kallsyms, read whole
    assert len(first) > 10_000 and len(entries(cache_dir)) == 1
    with monkeypatch.context() as m:
        m.setattr(KernelSymbols, "load", classmethod(lambda cls, path=None: pytest.fail("kallsyms was read")))
        kept = load_kernel_symbols(lambda: FAKE_PROGRAMS)
    assert same_kernel_tables(kept, kallsyms_with_programs())
    frames = kept.resolve([FAKE_PROGRAMS[0][0] + 0x40])
    assert (frames[0].function, frames[0].module, frames[0].offset) == (FAKE_PROGRAMS[0][1], "bpf", 0x40)


def test_kallsyms_is_read_whole_where_the_programs_cannot_be_named(cache_dir, monkeypatch):
    load_kernel_symbols(lambda: [])
    reads = []
    real_load = KernelSymbols.load.__func__
    monkeypatch.setattr(KernelSymbols, "load", classmethod(lambda cls, path="/proc/kallsyms": (reads.append(1),
                                                                                              real_load(cls, path))[1]))
    load_kernel_symbols(lambda: None)  # a trampoline: only kallsyms names it
    assert reads == [1]


MODULES = "nf_tables 372736 3 nft_chain_nat, Live 0xffffffffc0a00000\nfuse 176128 1 - Live 0xffffffffc0900000\n"


def test_kallsyms_is_kept_per_boot_kernel_and_modules_text():
    """Another boot, kernel build, module or module address names another entry; a module's
    use count and state, which change while its text stays, do not."""
    name = kernel_entry_name("boot-a\n", MODULES, "6.18.44", "#1 SMP")
    assert name == kernel_entry_name("boot-a", MODULES.replace(" 3 ", " 7 ").replace("Live", "Loading"),
                                     "6.18.44", "#1 SMP")
    others = [kernel_entry_name("boot-b", MODULES, "6.18.44", "#1 SMP"),
              kernel_entry_name("boot-a", MODULES, "6.18.45", "#1 SMP"),
              kernel_entry_name("boot-a", MODULES, "6.18.44", "#2 SMP"),
              kernel_entry_name("boot-a", MODULES.replace("0xffffffffc0900000", "0xffffffffc0800000"), "6.18.44",
                                "#1 SMP"),
              kernel_entry_name("boot-a", MODULES.splitlines()[0], "6.18.44", "#1 SMP"),
              kernel_entry_name("boot-a", None, "6.18.44", "#1 SMP")]
    assert len({name, *others}) == 1 + len(others)


def test_a_spoiled_kallsyms_entry_reads_kallsyms(cache_dir):
    load_kernel_symbols(lambda: [])
    [entry] = entries(cache_dir)
    arrays = dict(np.load(entry))
    arrays["module_ids"] = np.full_like(arrays["module_ids"], 1 << 20)  # names no module
    with open(entry, "wb") as f:
        np.savez(f, **arrays)
    assert same_kernel_tables(load_kernel_symbols(lambda: []).lasting(), KernelSymbols.load().lasting())


# -- kallsyms read ahead, while bcc compiles (sources/ebpf/early.py) -------------------------

@pytest.fixture
def ahead(monkeypatch):
    """symbolize's reads ahead of this test's own, the cache off (a first run's), and a count
    of kallsyms' reads that a test may hold back until `release` is set."""
    from memprof.sources.symbols import symbolize
    import threading
    monkeypatch.setattr(symbolize, "_ahead", {})
    monkeypatch.setenv(S.OFF_ENV, "0")
    reads, started, release = [], threading.Event(), threading.Event()
    release.set()
    real_load = KernelSymbols.load.__func__

    def counted(cls, path="/proc/kallsyms"):
        reads.append(threading.current_thread().name)
        started.set()
        release.wait(30)
        return real_load(cls, path)

    monkeypatch.setattr(KernelSymbols, "load", classmethod(counted))
    return symbolize, reads, started, release


def test_kallsyms_read_ahead_serves_the_load_and_a_load_during_the_read_waits_for_it(ahead):
    import threading
    symbolize, reads, started, release = ahead
    release.clear()
    reader = threading.Thread(target=symbolize.read_kernel_symbols_ahead, name="ahead")
    reader.start()
    assert started.wait(30)
    loaded = {}
    loader = threading.Thread(target=lambda: loaded.update(k=load_kernel_symbols(lambda: FAKE_PROGRAMS)), name="load")
    loader.start()
    loader.join(0.2)
    assert loader.is_alive()  # waiting for the read ahead, not reading too
    release.set()
    reader.join(30)
    loader.join(30)
    assert reads == ["ahead"]
    assert same_kernel_tables(loaded["k"], kallsyms_with_programs())
    assert symbolize._ahead == {}  # handed over once: the load's table holds it now


def test_kallsyms_read_ahead_for_another_module_list_is_not_used(ahead, monkeypatch):
    symbolize, reads, _, _ = ahead
    monkeypatch.setattr(symbolize, "_kernel_entry", lambda: "kallsyms-before-a-module-loaded")
    symbolize.read_kernel_symbols_ahead()
    symbolize.read_kernel_symbols_ahead()  # read once per entry
    monkeypatch.setattr(symbolize, "_kernel_entry", lambda: "kallsyms-after")
    load_kernel_symbols(lambda: FAKE_PROGRAMS)
    assert len(reads) == 2


def test_kallsyms_is_read_whole_after_a_read_ahead_where_the_programs_cannot_be_named(ahead):
    symbolize, reads, _, _ = ahead
    symbolize.read_kernel_symbols_ahead()
    whole = load_kernel_symbols(lambda: None)  # a trampoline: only kallsyms names it
    assert len(reads) == 2 and len(whole) > 10_000

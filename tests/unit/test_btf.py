"""memprof.sources.ebpf.btf: a synthetic BTF blob, malformed blobs, and the running kernel's BTF."""
from __future__ import annotations

import os
import random
import struct

import pytest

from memprof.errors import SourceUnavailableError
from memprof.sources.ebpf.btf import Btf, BtfError

INT, PTR, STRUCT, UNION, TYPEDEF, CONST, FUNC_PROTO = 1, 2, 4, 5, 8, 10, 13
VMLINUX = "/sys/kernel/btf/vmlinux"


class _BlobBuilder:
    """Builds raw little-endian BTF one type at a time (ids count from 1)."""

    def __init__(self):
        self.types = b""
        self.strings = b"\0"
        self.next_id = 1

    def name(self, text: str) -> int:
        """Offset of `text` in the string section (empty names are offset 0)."""
        if not text:
            return 0
        self.strings += text.encode() + b"\0"
        return len(self.strings) - len(text) - 1

    def add(self, kind, name="", vlen=0, size_or_type=0, extra=b"", kind_flag=False) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kind_flag else 0)
        self.types += struct.pack("<III", self.name(name), info, size_or_type) + extra
        self.next_id += 1
        return self.next_id - 1

    def members(self, *entries) -> bytes:
        return b"".join(struct.pack("<III", self.name(n), t, off) for n, t, off in entries)

    def params(self, *types) -> bytes:
        return b"".join(struct.pack("<II", 0, t) for t in types)

    def blob(self) -> bytes:
        header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types),
                             len(self.types), len(self.strings))
        return header + self.types + self.strings


def _demo_blob() -> bytes:
    """struct demo { int count; void *ptr; union { int u_a; unsigned long u_b; };
    int bits:3; } and typedef void (*btf_trace_demo)(void *, unsigned long,
    const void *, size_t, struct demo *)."""
    b = _BlobBuilder()
    t_int = b.add(INT, "int", size_or_type=4, extra=struct.pack("<I", (1 << 24) | 32))
    t_ulong = b.add(INT, "long unsigned int", size_or_type=8, extra=struct.pack("<I", 64))
    t_void_p = b.add(PTR, size_or_type=0)
    t_const_void = b.add(CONST, size_or_type=0)
    t_const_void_p = b.add(PTR, size_or_type=t_const_void)
    t_size = b.add(TYPEDEF, "size_t", size_or_type=t_ulong)
    t_union = b.add(UNION, vlen=2, size_or_type=8,
                    extra=b.members(("u_a", t_int, 0), ("u_b", t_ulong, 0)))
    members = b.members(("count", t_int, 0), ("ptr", t_void_p, 64), ("", t_union, 128),
                        ("bits", t_int, (3 << 24) | 192))
    t_demo = b.add(STRUCT, "demo", vlen=4, size_or_type=32, extra=members, kind_flag=True)
    t_demo_p = b.add(PTR, size_or_type=t_demo)
    params = b.params(t_void_p, t_ulong, t_const_void_p, t_size, t_demo_p)
    t_proto = b.add(FUNC_PROTO, vlen=5, size_or_type=0, extra=params)
    t_proto_p = b.add(PTR, size_or_type=t_proto)
    b.add(TYPEDEF, "btf_trace_demo", size_or_type=t_proto_p)
    return b.blob()


def _all_lookups(btf: Btf) -> None:
    btf.has_type("demo")
    btf.struct_size("demo")
    btf.member_offset("demo", "u_b")
    btf.raw_tracepoint_params("demo")


def test_synthetic_struct_sizes_and_offsets():
    btf = Btf(_demo_blob())
    assert btf.has_type("demo") and btf.has_type("size_t", "typedef")
    assert not btf.has_type("demo", "union") and not btf.has_type("nope")
    assert btf.struct_size("demo") == 32
    assert btf.member_offset("demo", "count") == 0
    assert btf.member_offset("demo", "ptr") == 8
    assert btf.member_offset("demo", "u_a") == 16
    assert btf.member_offset("demo", "u_b") == 16


def test_synthetic_missing_names_and_bitfields_raise_btf_error():
    btf = Btf(_demo_blob())
    with pytest.raises(BtfError, match="bitfield"):
        btf.member_offset("demo", "bits")
    with pytest.raises(BtfError, match="no member"):
        btf.member_offset("demo", "absent")
    with pytest.raises(BtfError, match="nope"):
        btf.struct_size("nope")
    with pytest.raises(BtfError):
        btf.raw_tracepoint_params("absent_tp")
    with pytest.raises(ValueError):
        btf.has_type("demo", "klass")


def test_synthetic_func_proto_params():
    btf = Btf(_demo_blob())
    expected = ["unsigned long", "const void *", "size_t", "struct demo *"]
    assert btf.func_proto_params("btf_trace_demo") == ["void *"] + expected
    assert btf.raw_tracepoint_params("demo") == expected


def test_btf_error_is_a_source_unavailable_error_with_hint(tmp_path):
    with pytest.raises(SourceUnavailableError) as info:
        Btf.load(tmp_path / "missing")
    assert isinstance(info.value, BtfError)
    assert "CONFIG_DEBUG_INFO_BTF" in info.value.hint


@pytest.mark.parametrize("blob", [b"", b"\x9f\xeb", b"\0" * 64, b"garbage" * 100])
def test_garbage_raises_btf_error(blob):
    with pytest.raises(BtfError):
        Btf(blob)


def test_every_truncation_raises_btf_error():
    blob = _demo_blob()
    for length in range(len(blob)):
        with pytest.raises(BtfError):
            Btf(blob[:length])


def test_corrupted_blobs_raise_only_btf_error():
    """Random byte flips in the type section may parse or not, but never raise another
    exception type (from the constructor or any look-up)."""
    blob, rng = _demo_blob(), random.Random(1234)
    for _ in range(500):
        data = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(24, len(data))] = rng.randrange(256)
        try:
            _all_lookups(Btf(bytes(data)))
        except BtfError:
            pass


def test_load_from_file(tmp_path):
    path = tmp_path / "vmlinux"
    path.write_bytes(_demo_blob())
    assert Btf.load(path).struct_size("demo") == 32


@pytest.fixture(scope="module")
def kernel_btf() -> Btf:
    if not os.path.exists(VMLINUX):
        pytest.skip(f"{VMLINUX} absent: this kernel has no BTF")
    return Btf.load()


def test_kernel_struct_page(kernel_btf):
    assert kernel_btf.struct_size("page") == 64


def test_kernel_kmem_tracepoints(kernel_btf):
    assert kernel_btf.raw_tracepoint_params("kmalloc")[:2] == ["unsigned long", "const void *"]
    assert kernel_btf.raw_tracepoint_params("kmem_cache_alloc")[2] == "struct kmem_cache *"


def test_kernel_kmem_cache_size_offset(kernel_btf):
    offset = kernel_btf.member_offset("kmem_cache", "size")
    assert isinstance(offset, int) and 8 <= offset <= 64


# Every question memprof asks of the running kernel's BTF (loading.task_cflags, kmem.py,
# cpython/options.py, doctor), and a few that reach the spelling's other branches.
_MEMPROFS_QUESTIONS = [
    ("member_offset", "task_struct", "nvcsw"), ("member_offset", "task_struct", "nivcsw"),
    ("member_offset", "task_struct", "pid"), ("member_offset", "task_struct", "tgid"),
    ("member_offset", "task_struct", "signal"), ("member_offset", "signal_struct", "group_exit_code"),
    ("member_offset", "task_struct", "thread_info"),
    ("member_offset", "thread_info", "status"), ("member_offset", "k_sigaction", "sa"),
    ("member_offset", "sigaction", "sa_handler"), ("member_offset", "task_struct", "stack"),
    ("member_offset", "task_struct", "thread"), ("member_offset", "thread_struct", "fsbase"),
    ("member_offset", "kmem_cache", "size"), ("member_offset", "kmem_cache", "object_size"),
    *[("raw_tracepoint_params", tp) for tp in ("sched_process_exit", "kmalloc", "kmem_cache_alloc", "kfree",
                                               "kmem_cache_free", "mm_page_alloc", "mm_page_free",
                                               "mm_page_free_batched", "sys_enter")],
    ("struct_size", "task_struct"), ("has_type", "task_struct", "struct"),
    ("has_type", "memprof_no_such_type", "struct"), ("type_name", 1), ("type_name", 1000),
]


def test_the_kernels_btf_through_libbpf_answers_as_the_scan_does(kernel_btf):
    """Btf.load reads the running kernel's BTF through libbpf (bcc's library links it, so
    it is there wherever memprof records): every question memprof asks gets the scan's
    answer, a missing name the same BtfError."""
    from pathlib import Path
    from memprof.sources.ebpf.btf import _LibbpfIndex
    assert isinstance(kernel_btf._index, _LibbpfIndex)
    scanned = Btf(Path(VMLINUX).read_bytes(), origin=VMLINUX)
    for method, *args in _MEMPROFS_QUESTIONS:
        assert getattr(kernel_btf, method)(*args) == getattr(scanned, method)(*args), (method, args)
    for btf in (kernel_btf, scanned):
        with pytest.raises(BtfError, match="no struct/union named"):
            btf.member_offset("memprof_no_such_type", "x")
        with pytest.raises(BtfError, match="out of range"):
            btf.type_name(10**9)


def test_the_kernels_btf_is_read_without_numpy():
    """numpy's import (~80 ms) and the scan (~60 ms) sat before bcc's compile on a cold
    record; libbpf's parse takes ~10 ms and needs neither."""
    import subprocess
    import sys
    code = ("import sys\nfrom memprof.sources.ebpf.btf import Btf\n"
            "Btf.load().member_offset('task_struct', 'pid')\nprint('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]

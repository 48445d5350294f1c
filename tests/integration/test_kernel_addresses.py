"""Kernel addresses stay out of the user's files (issue 19, item 6): kernel_leak recorded
for real while a second BPF program watches the raw addresses the kernel hands it; not one
of them, nor any number that looks like a kernel address, is in the recording (events,
stacks, frames, samples, meta.json) or in the leak report, and the known leak is still
found exactly: 257 pipes, each one 1 KiB pipe_buffer array and one inode."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration

KERNEL_LEAK = str(Path(__file__).resolve().parents[2] / "examples" / "bin" / "kernel_leak")
HELD = 257
PIPE_BUFFER_ARRAY_BYTES = 1024  # 16 struct pipe_buffer of 40 bytes, from kmalloc-1k
KERNEL_FLOOR = 0xFFFF_8000_0000_0000  # the lowest kernel address on x86-64 (4-level paging)
SIGNED_FLOOR = KERNEL_FLOOR - (1 << 64)  # the same, read as an int64
# A kernel address written out as text: 16 hex digits from ffff8…, or its decimal.
_HEX = re.compile(r"(?i)(?<![0-9a-f])(?:0x)?ffff[89a-f][0-9a-f]{11}(?![0-9a-f])")
_DECIMAL = re.compile(r"(?<!\d)-?\d{15,20}(?!\d)")

# Watches kmalloc and page allocations of any task named kernel_leak, as the kernel hands
# them to every BPF program: raw slab object and struct page addresses.
_WATCHER = r"""
BPF_HASH(seen, u64, u8, 1 << 18);
static __always_inline int is_target(void)
{
    union { char c[16]; u64 w[2]; } comm = {};
    bpf_get_current_comm(&comm.c, sizeof(comm.c));
    return comm.w[0] == COMM_W0 && comm.w[1] == COMM_W1;
}
static __always_inline int note(u64 addr)
{
    u8 one = 1;
    if (addr && is_target())
        seen.update(&addr, &one);
    return 0;
}
int watch_kmalloc(struct bpf_raw_tracepoint_args *ctx) { return note(ctx->args[1]); }
int watch_page(struct bpf_raw_tracepoint_args *ctx) { return note(ctx->args[0]); }
"""


def _comm_words(name: str) -> list[str]:
    raw = name.encode().ljust(16, b"\0")
    return [f"-DCOMM_W{i}={int.from_bytes(raw[8 * i:8 * i + 8], 'little')}ULL" for i in range(2)]


@pytest.fixture(scope="module")
def watched_recording(tmp_path_factory, run_memprof) -> tuple[Path, np.ndarray]:
    """(recording of kernel_leak, the raw addresses a second BPF program saw it take)."""
    from bcc import BPF
    watcher = BPF(text=_WATCHER.encode(), cflags=_comm_words("kernel_leak"))
    try:
        watcher.attach_raw_tracepoint(tp=b"kmalloc", fn_name=b"watch_kmalloc")
        watcher.attach_raw_tracepoint(tp=b"mm_page_alloc", fn_name=b"watch_page")
        path = tmp_path_factory.mktemp("kaddr") / "leak.memprof"
        result = run_memprof("record", "-q", "-o", path, "--", KERNEL_LEAK, cwd=path.parent)
        raw = np.array([k.value for k in watcher[b"seen"].keys()], dtype=np.uint64)
    finally:
        watcher.cleanup()
    assert result.returncode == 0, result.stderr
    assert f"held={HELD} " in result.stdout
    return path, raw


def _kernel_looking(values: np.ndarray) -> np.ndarray:
    """The values of an integer column that would read as a kernel address."""
    if values.dtype.kind == "u":
        return values[values >= np.uint64(KERNEL_FLOOR)]
    return values[values <= SIGNED_FLOOR]


def _kernel_looking_in(value, where: str, found: list) -> None:
    """Walk a JSON value; note every number or text that reads as a kernel address."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if value >= KERNEL_FLOOR or value <= SIGNED_FLOOR:
            found.append((where, value))
    elif isinstance(value, str):
        found += [(where, m) for m in _HEX.findall(value)]
        found += [(where, m) for m in _DECIMAL.findall(value) if int(m) >= KERNEL_FLOOR or int(m) <= SIGNED_FLOOR]
    elif isinstance(value, dict):
        for key, item in value.items():
            _kernel_looking_in(key, f"{where}/{key}", found)
            _kernel_looking_in(item, f"{where}/{key}", found)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _kernel_looking_in(item, f"{where}[{i}]", found)


def test_raw_addresses_were_there_to_leak(watched_recording):
    """The control: the watcher saw the target's kernel allocations, all at kernel addresses."""
    _, raw = watched_recording
    assert raw.size > HELD  # 257 held pipes, each several kmallocs, and the churn
    assert (raw >= np.uint64(KERNEL_FLOOR)).all(), hex(int(raw.min()))


def test_kernel_rows_hold_no_kernel_address(watched_recording):
    from memprof.recording import open_recording
    path, raw = watched_recording
    events = open_recording(path).events
    kernel = events["layer"].isin(["kernel_slab", "kernel_page"]).to_numpy()
    addr = events["addr"].to_numpy().astype(np.uint64)[kernel]
    assert addr.size > 100_000  # the churn: every allocation and free of the run
    assert (addr < np.uint64(1 << 56)).all(), hex(int(addr.max()))  # images: top byte 0, never ffff8…
    assert not np.isin(raw, addr).any()  # none of the addresses the kernel handed out
    assert np.unique(addr).size > raw.size // 4  # still one key per object (distinct images)


def test_no_table_holds_a_kernel_looking_number(watched_recording):
    """Every integer column of every part (events, stacks, frames, samples) and every text
    cell: no value at or above ffff8000_00000000 (nor its int64 reading), no raw address
    the watcher saw."""
    path, raw = watched_recording
    parts = sorted(path.glob("*/part-*.parquet"))
    assert {p.parent.name for p in parts} >= {"events", "stacks", "frames", "samples"}
    found = []
    for part in parts:
        table = pq.read_table(part)
        for name in table.column_names:
            column, where = table.column(name), f"{part.parent.name}/{part.name}:{name}"
            if pa.types.is_integer(column.type):
                values = column.fill_null(0).to_numpy()
                found += [(where, int(v)) for v in _kernel_looking(values)[:3]]
                as_u64 = values.astype(np.uint64)
                found += [(where, int(v)) for v in as_u64[np.isin(as_u64, raw)][:3]]
            elif pa.types.is_string(column.type) or pa.types.is_dictionary(column.type):
                for value in set(column.to_pylist()) - {None}:
                    _kernel_looking_in(value, where, found)
    assert found == []


def test_meta_and_report_hold_no_kernel_looking_number(watched_recording, leaks_json):
    path, _ = watched_recording
    found = []
    _kernel_looking_in(json.loads((path / "meta.json").read_text()), "meta.json", found)
    _kernel_looking_in(leaks_json(path, "--top", "1000"), "report leaks", found)
    assert found == []


def test_the_known_leak_is_still_found_exactly(watched_recording, leaks_json):
    """Pairing works on the keyed addresses: the 257 pipe_buffer arrays and 257 inodes are
    held, with nothing of the churn's million events left unpaired beside them."""
    path, _ = watched_recording
    report = leaks_json(path, "--layer", "kernel_slab", "--top", "1000")
    findings = sorted(report["findings"], key=lambda f: (-f["live_bytes"], -f["live_count"]))
    kernel = lambda f: [x["function"] for x in f["stack"] if x["kind"] == "kernel"]  # noqa: E731
    arrays = [f for f in findings if "alloc_pipe_info" in kernel(f)]
    assert arrays, [(f["live_count"], kernel(f)[:4]) for f in findings]
    top = max(arrays, key=lambda f: f["live_bytes"])
    assert top == findings[0]
    assert (top["live_count"], top["live_bytes"]) == (HELD, HELD * PIPE_BUFFER_ARRAY_BYTES)
    assert top["released_at_exit"] is True and top["kind"] == "held_at_end"
    assert any(f["live_count"] == HELD for f in findings if "alloc_inode" in kernel(f))

"""Writes the hand-built CUDA memory snapshot fixtures of tests/data/ (deterministically), and
one hand-built torch.profiler Chrome trace with CUDA memory events.

    .venv/bin/python tests/data/make_snapshot_fixtures.py

None of these came from a GPU: each is hand-built from the format torch documents
(torch/cuda/memory.py `_snapshot` docstring, torch/cuda/_memory_viz.py, and the dicts
torch/csrc/cuda/Module.cpp builds), pickled as `torch.cuda.memory._dump_snapshot` does
(`pickle.dump` of plain dicts and lists, one shared list per distinct traceback). The
`handbuilt_hostile_*` files are pickles that run code when loaded with `pickle`; their payload
only creates HOSTILE_MARKER in the current directory, so a test can prove it never ran.
tests/unit/test_torch_snapshot.py checks that this script reproduces the committed files.
"""
from __future__ import annotations

import collections
import json
import os
import pickle
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOL = 4  # what pickle.dump uses by default on the Pythons torch supports
MiB = 1 << 20
T0_US = 1_700_000_000_000_000  # epoch µs of every fixture's first entry
STEP_US = 100_000              # 0.1 s between training steps
SNAPSHOT_US = T0_US + 3_000_000  # the leak fixture's snapshot, 3 s after its first entry
HOSTILE_MARKER = "memprof_hostile_marker"

SEG0 = 0x7F00_0000_0000        # a segment allocated before the trace began (20 MiB)
SEG1 = 0x7F00_0400_0000        # the segment the trace allocates (64 MiB)
LEAK_COUNT, LEAK_SIZE = 23, 1 * MiB
LEAK_BASE = SEG1 + 6 * MiB
LEAK_FILE, LEAK_LINE, LEAK_FUNCTION = "/work/job/train.py", 42, "cache_batch"


def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


# One list object per distinct traceback, shared by every entry that has it (as torch does).
LEAK_FRAMES = [frame(LEAK_FILE, LEAK_LINE, LEAK_FUNCTION), frame(LEAK_FILE, 88, "train_step"),
               frame(LEAK_FILE, 120, "main")]
ACTIVATION_FRAMES = [
    frame("/pytorch/c10/cuda/CUDACachingAllocator.cpp", 1190, "c10::cuda::CUDACachingAllocator::malloc"),
    frame("/work/job/model.py", 17, "forward"), frame(LEAK_FILE, 80, "train_step"), frame(LEAK_FILE, 120, "main")]
FREE_FRAMES = [frame(LEAK_FILE, 85, "train_step"), frame(LEAK_FILE, 120, "main")]
SEGMENT_FRAMES = [frame("/work/job/model.py", 17, "forward"), frame(LEAK_FILE, 80, "train_step")]
WEIGHT_FRAMES = [frame("/work/job/model.py", 10, "__init__"), frame(LEAK_FILE, 110, "main")]
TEMP_FRAMES = [frame("/work/job/model.py", 25, "loss"), frame(LEAK_FILE, 82, "train_step")]


def entry(action: str, addr: int, size: int, time_us: int | None, frames: list, **extra) -> dict:
    e = {"action": action, "addr": addr, "size": size, "stream": 0}
    if time_us is not None:
        e["time_us"] = time_us
    e["frames"] = frames
    e.update(extra)
    return e


def block(address: int, size: int, state: str, frames: list | None = None, requested: int | None = None) -> dict:
    return {"address": address, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": frames if frames is not None else []}


def segment(address: int, total: int, blocks: list, frames: list | None = None, expandable: bool = False) -> dict:
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    assert sum(b["size"] for b in blocks) == total, "blocks tile their segment"
    return {"device": 0, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": allocated, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": frames or [], "blocks": blocks}


def leak_snapshot() -> dict:
    """23 steps: each allocates a 4 MiB activation (freed in the step) and a 1 MiB block from
    train.py:42 that is never freed; one 2 MiB temporary is allocated and freed. SEG0 and two
    of its blocks (an 8 MiB weight held, a 2 MiB block awaiting its free) predate the trace."""
    trace = [entry("segment_alloc", SEG1, 64 * MiB, T0_US, SEGMENT_FRAMES)]
    for step in range(LEAK_COUNT):
        t = T0_US + step * STEP_US
        trace += [
            entry("alloc", SEG1, 4 * MiB, t + 10, ACTIVATION_FRAMES),
            entry("alloc", LEAK_BASE + step * LEAK_SIZE, LEAK_SIZE, t + 20, LEAK_FRAMES),
            entry("free_requested", SEG1, 4 * MiB, t + 30, FREE_FRAMES),
            entry("free_completed", SEG1, 4 * MiB, t + 31, FREE_FRAMES),
        ]
    t = T0_US + LEAK_COUNT * STEP_US
    trace += [entry("alloc", SEG1 + 4 * MiB, 2 * MiB, t, TEMP_FRAMES),
              entry("free_requested", SEG1 + 4 * MiB, 2 * MiB, t + 5, FREE_FRAMES),
              entry("free_completed", SEG1 + 4 * MiB, 2 * MiB, t + 6, FREE_FRAMES),
              entry("snapshot", 0, 0, SNAPSHOT_US, [])]
    seg0 = segment(SEG0, 20 * MiB, [block(SEG0, 8 * MiB, "active_allocated", WEIGHT_FRAMES, 8 * MiB - 100),
                                    block(SEG0 + 8 * MiB, 2 * MiB, "active_pending_free", TEMP_FRAMES),
                                    block(SEG0 + 10 * MiB, 10 * MiB, "inactive")], WEIGHT_FRAMES)
    leaks = [block(LEAK_BASE + i * LEAK_SIZE, LEAK_SIZE, "active_allocated", LEAK_FRAMES) for i in range(LEAK_COUNT)]
    seg1 = segment(SEG1, 64 * MiB, [block(SEG1, 6 * MiB, "inactive")] + leaks
                   + [block(LEAK_BASE + LEAK_COUNT * LEAK_SIZE, (64 - 6 - LEAK_COUNT) * MiB, "inactive")],
                   SEGMENT_FRAMES)
    annotations = [{"stage": "START", "name": "## forward ##", "device": 0, "time_us": T0_US + 5},
                   {"stage": "END", "name": "## forward ##", "device": 0, "time_us": T0_US + 25}]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512", "max_split_size": 512 * MiB,
                "garbage_collection_threshold": 0.0, "expandable_segments": False,
                "roundup_power2_divisions": {"1": 0, "2": 0}}
    return {"segments": [seg0, seg1], "device_traces": [trace], "allocator_settings": settings,
            "external_annotations": annotations}


EXP = 0x7F10_0000_0000  # expandable segment's reserved range
PAGE = 20 * MiB         # its mapping granule


def expandable_snapshot() -> dict:
    """expandable_segments:True: map 2 pages, then 1 more; use them; unmap pages 2-3 in one
    call (it cuts the first map in half and takes all of the second). One page stays mapped."""
    trace = [
        entry("segment_map", EXP, 2 * PAGE, T0_US, SEGMENT_FRAMES),
        entry("alloc", EXP, 30 * MiB, T0_US + 10, ACTIVATION_FRAMES),
        entry("segment_map", EXP + 2 * PAGE, PAGE, T0_US + 20, SEGMENT_FRAMES),
        entry("alloc", EXP + 30 * MiB, 25 * MiB, T0_US + 30, TEMP_FRAMES),
        entry("free_requested", EXP + 30 * MiB, 25 * MiB, T0_US + 40, FREE_FRAMES),
        entry("free_completed", EXP + 30 * MiB, 25 * MiB, T0_US + 41, FREE_FRAMES),
        entry("free_requested", EXP, 30 * MiB, T0_US + 50, FREE_FRAMES),
        entry("free_completed", EXP, 30 * MiB, T0_US + 51, FREE_FRAMES),
        entry("segment_unmap", EXP + PAGE, 2 * PAGE, T0_US + 60, []),
        entry("alloc", EXP, 1 * MiB, T0_US + 70, LEAK_FRAMES),
    ]
    seg = segment(EXP, PAGE, [block(EXP, 1 * MiB, "active_allocated", LEAK_FRAMES),
                              block(EXP + MiB, PAGE - MiB, "inactive")], SEGMENT_FRAMES, expandable=True)
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True}
    return {"segments": [seg], "device_traces": [trace], "allocator_settings": settings}


def oom_snapshot() -> dict:
    """A 1 GiB segment, a 900 MiB tensor in it, then a request for 80 GiB that fails."""
    trace = [entry("segment_alloc", SEG1, 1024 * MiB, T0_US, SEGMENT_FRAMES),
             entry("alloc", SEG1, 900 * MiB, T0_US + 1, WEIGHT_FRAMES)]
    oom = {"action": "oom", "device_free": 100 * MiB, "size": 80 * 1024 * MiB, "stream": 0,
           "time_us": T0_US + 2, "frames": TEMP_FRAMES}
    seg = segment(SEG1, 1024 * MiB, [block(SEG1, 900 * MiB, "active_allocated", WEIGHT_FRAMES),
                                     block(SEG1 + 900 * MiB, 124 * MiB, "inactive")])
    return {"segments": [seg], "device_traces": [trace + [oom]]}


def legacy_history_snapshot() -> dict:
    """torch 1.13: no device_traces; each block keeps `history`, newest first, without times.
    Block 1 (held) was used twice; block 2 (inactive) once."""
    blocks = [
        {"size": 2 * MiB, "state": "active_allocated",
         "history": [{"addr": SEG0, "real_size": 2 * MiB - 512, "frames": LEAK_FRAMES},
                     {"addr": SEG0, "real_size": MiB, "frames": TEMP_FRAMES}]},
        {"size": 18 * MiB, "state": "inactive",
         "history": [{"addr": SEG0 + 2 * MiB, "real_size": 4 * MiB, "frames": ACTIVATION_FRAMES}]},
    ]
    return {"segments": [{"device": 0, "address": SEG0, "total_size": 20 * MiB, "allocated_size": 2 * MiB,
                          "active_size": 2 * MiB, "stream": 0, "segment_type": "large", "blocks": blocks}]}


def truncated_ring_snapshot() -> dict:
    """The ring buffer wrapped: it opens with the frees of 3 blocks whose allocs it lost (one
    only free-requested: still pending at the snapshot), then a normal alloc/free pair."""
    lost = [SEG1 + i * MiB for i in range(3)]
    trace = [entry("free_requested", lost[0], MiB, T0_US, FREE_FRAMES),
             entry("free_completed", lost[0], MiB, T0_US + 1, FREE_FRAMES),
             entry("free_requested", lost[1], MiB, T0_US + 2, FREE_FRAMES),
             entry("free_completed", lost[1], MiB, T0_US + 3, FREE_FRAMES),
             entry("free_requested", lost[2], MiB, T0_US + 4, FREE_FRAMES),
             entry("alloc", SEG1 + 8 * MiB, MiB, T0_US + 10, TEMP_FRAMES),
             entry("free_requested", SEG1 + 8 * MiB, MiB, T0_US + 11, FREE_FRAMES),
             entry("free_completed", SEG1 + 8 * MiB, MiB, T0_US + 12, FREE_FRAMES)]
    seg = segment(SEG1, 20 * MiB, [block(SEG1, 2 * MiB, "inactive"),
                                   block(lost[2], MiB, "active_awaiting_free", LEAK_FRAMES),
                                   block(SEG1 + 3 * MiB, 17 * MiB, "inactive")])
    return {"segments": [seg], "device_traces": [trace]}


def no_time_snapshot() -> dict:
    """A torch 2.0-era trace: no time_us, and `free` where later versions say free_completed."""
    trace = [entry("segment_alloc", SEG1, 20 * MiB, None, SEGMENT_FRAMES),
             entry("alloc", SEG1, MiB, None, TEMP_FRAMES),
             entry("free_requested", SEG1, MiB, None, FREE_FRAMES),
             entry("free", SEG1, MiB, None, FREE_FRAMES),
             entry("alloc", SEG1 + MiB, 2 * MiB, None, LEAK_FRAMES)]
    seg = segment(SEG1, 20 * MiB, [block(SEG1, MiB, "inactive"),
                                   block(SEG1 + MiB, 2 * MiB, "active_allocated", LEAK_FRAMES),
                                   block(SEG1 + 3 * MiB, 17 * MiB, "inactive")])
    return {"segments": [seg], "device_traces": [trace]}


BASE_NS = 1_700_000_000_000_000_000  # the profiler trace's baseTimeNanoseconds
CUDA_LEAKS, CUDA_LEAK_SIZE = 5, 2 * MiB
CUDA_BASE = 0x7F20_0000_0000


def profiler_trace() -> dict:
    """A torch.profiler Chrome trace (export_chrome_trace, profile_memory=True, with_stack=True)
    on one GPU: 5 steps, each allocating a 2 MiB CUDA tensor inside train.py's `cache_batch`
    (kept) and a 1 MiB temporary (freed); a CPU tensor allocated and freed; a free of a block
    allocated before the window; an out-of-memory; one event of another device type (skipped).
    Events are listed out of time order, as merged traces can be."""
    def span(cat, name, ts, dur, tid=7):
        return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    def memory(ts, addr, nbytes, device_type=1, device_id=0, name="[memory]"):
        return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": 4242, "tid": 7, "ts": ts,
                "args": {"Total Reserved": 0, "Total Allocated": 0, "Bytes": nbytes, "Device Id": device_id,
                         "Device Type": device_type, "Addr": addr}}

    spans, events = [span("python_function", "/work/job/train.py(100): main", 0.0, 2_000_000.0)], []
    for step in range(CUDA_LEAKS):
        t = 1000.0 + step * 100_000.0
        spans += [span("python_function", "/work/job/train.py(40): cache_batch", t, 50.0),
                  span("cpu_op", "aten::empty", t + 10.0, 20.0),
                  span("python_function", "/work/job/model.py(15): forward", t + 60.0, 30.0),
                  span("cpu_op", "aten::ones", t + 61.0, 25.0), span("cpu_op", "aten::empty", t + 62.0, 10.0)]
        events += [memory(t + 15.5, CUDA_BASE + step * CUDA_LEAK_SIZE, CUDA_LEAK_SIZE),
                   memory(t + 65.25, CUDA_BASE + 64 * MiB, MiB), memory(t + 89.0, CUDA_BASE + 64 * MiB, -MiB)]
    events += [memory(600_000.0, 0x5555_0000, 4096, device_type=0, device_id=-1),
               memory(600_010.0, 0x5555_0000, -4096, device_type=0, device_id=-1),
               memory(600_020.0, CUDA_BASE + 80 * MiB, -3 * MiB),
               memory(600_030.0, 0, 80 * 1024 * MiB, name="[OutOfMemory]"),
               memory(600_040.0, 0x1000, 64, device_type=13)]
    trace_events = [{"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python"}}]
    trace_events += list(reversed(events)) + spans
    return {"schemaVersion": 1, "deviceProperties": [], "profile_memory": 1, "with_stack": 1,
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS, "traceEvents": trace_events}


class _RunsShell:
    """Unpickling calls os.system (pickled as posix.system)."""

    def __reduce__(self):
        return (os.system, (f"touch {HOSTILE_MARKER}",))


class _RunsEval:
    """Unpickling calls builtins.eval."""

    def __reduce__(self):
        import builtins
        return (builtins.eval, (f"open({HOSTILE_MARKER!r}, 'w').close()",))


def hostile_files() -> dict[str, bytes]:
    """Pickles that run code when loaded, each inside something shaped like a snapshot."""
    inst = (b"(dp0\nS'segments'\np1\n(lp2\nsS'device_traces'\np3\n(lp4\n"
            b"(S'touch " + HOSTILE_MARKER.encode() + b"'\nios\nsystem\np5\nas.")  # protocol 0 INST os.system
    return {
        "handbuilt_hostile_reduce_system.pickle": pickle.dumps(
            {"segments": [], "device_traces": [[_RunsShell()]]}, PROTOCOL),
        "handbuilt_hostile_reduce_eval.pickle": pickle.dumps(
            {"segments": [{"device": 0, "blocks": []}], "allocator_settings": _RunsEval()}, PROTOCOL),
        "handbuilt_hostile_inst_system.pickle": inst,
        "handbuilt_hostile_global_class.pickle": pickle.dumps({"segments": [], "device_traces": [],
                                                              "allocator_settings": _settings_as_class()}, PROTOCOL),
    }


def _settings_as_class() -> collections.OrderedDict:
    """Harmless in itself, but pickled as a reference to a global class: not plain data."""
    return collections.OrderedDict(expandable_segments=False)


FIXTURES = {
    "handbuilt_snapshot_leak.pickle": leak_snapshot,
    "handbuilt_snapshot_expandable.pickle": expandable_snapshot,
    "handbuilt_snapshot_oom.pickle": oom_snapshot,
    "handbuilt_snapshot_legacy_history.pickle": legacy_history_snapshot,
    "handbuilt_snapshot_truncated_ring.pickle": truncated_ring_snapshot,
    "handbuilt_snapshot_no_time.pickle": no_time_snapshot,
}


def all_files() -> dict[str, bytes]:
    """Every fixture's name and bytes."""
    files = {name: pickle.dumps(build(), PROTOCOL) for name, build in FIXTURES.items()}
    files["handbuilt_profiler_trace_cuda.json"] = json.dumps(profiler_trace(), indent=1).encode() + b"\n"
    files.update(hostile_files())
    return files


def main(directory: Path = HERE) -> None:
    write_files(all_files(), directory)


def write_files(files: dict[str, bytes], directory: Path) -> None:
    """Each fixture's bytes to directory/name, saying so on stderr."""
    for name, data in files.items():
        (directory / name).write_bytes(data)
        print(f"wrote {directory / name} ({len(data)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()

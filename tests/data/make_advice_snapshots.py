"""Writes the hand-built CUDA memory snapshots the advice rules are tested on (deterministically),
in the format and with the helpers of make_snapshot_fixtures.py:

    .venv/bin/python tests/data/make_advice_snapshots.py

- handbuilt_snapshot_fragmented.pickle: blocks of two sizes share 8 segments, every other
  one is freed, and larger requests that fit no hole take 4 new segments (the fragmentation
  expandable segments avoid);
- handbuilt_snapshot_tight.pickle: 8 segments each filled by its two blocks (reserved =
  allocated at the peak); one temporary's segment is cached after the peak.

None of these came from a GPU. tests/unit/test_advice_fragmentation.py checks that this
script reproduces the committed files.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_snapshot_fixtures import (  # noqa: E402
    FREE_FRAMES, PROTOCOL, T0_US, MiB, block, entry, frame, segment, write_files,
)

JOB = "/work/job/model.py"
SMALL_FRAMES = [frame(JOB, 30, "forward"), frame("/work/job/train.py", 80, "train_step")]
LARGE_FRAMES = [frame(JOB, 44, "attention"), frame(JOB, 31, "forward"), frame("/work/job/train.py", 80, "train_step")]
BASE = 0x7F30_0000_0000
SEGMENTS, SEGMENT_SIZE, HOLE, KEPT = 8, 512 * MiB, 200 * MiB, 300 * MiB   # 12 MiB tail left in each
LARGE, LARGE_SIZE = 4, 400 * MiB
SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}


def seg_addr(i: int) -> int:
    return BASE + i * 0x4000_0000  # 1 GiB apart


def alloc_in_new_segment(t: int, addr: int, seg_size: int, size: int, frames: list) -> list[dict]:
    """A segment made for a request, and the request's block at its start, in one µs."""
    return [entry("segment_alloc", addr, seg_size, t, frames), entry("alloc", addr, size, t, frames)]


def free(t: int, addr: int, size: int) -> list[dict]:
    return [entry("free_requested", addr, size, t, FREE_FRAMES), entry("free_completed", addr, size, t + 1, FREE_FRAMES)]


def fragmented_snapshot() -> dict:
    """Segment i (512 MiB) gets a 200 MiB block (hole-to-be) then a 300 MiB one; the 200s are
    freed; 4 requests of 400 MiB fit no 212 MiB hole and take new segments. At the peak (the
    last new segment): reserved 8·512 + 4·400 = 5696 MiB, allocated 8·300 + 4·400 = 4000 MiB,
    cached free 1696 MiB (8 segments with 212 MiB free each beside their 300 MiB block)."""
    trace = []
    for i in range(SEGMENTS):
        t = T0_US + i * 100
        trace += alloc_in_new_segment(t, seg_addr(i), SEGMENT_SIZE, HOLE, SMALL_FRAMES)
        trace.append(entry("alloc", seg_addr(i) + HOLE, KEPT, t + 10, SMALL_FRAMES))
    for i in range(SEGMENTS):
        trace += free(T0_US + 10_000 + i * 10, seg_addr(i), HOLE)
    for j in range(LARGE):
        trace += alloc_in_new_segment(T0_US + 20_000 + j * 100, seg_addr(SEGMENTS + j), LARGE_SIZE, LARGE_SIZE,
                                      LARGE_FRAMES)
    trace.append(entry("snapshot", 0, 0, T0_US + 30_000, []))
    tail = SEGMENT_SIZE - HOLE - KEPT
    segments = [segment(seg_addr(i), SEGMENT_SIZE, [block(seg_addr(i), HOLE, "inactive"),
                                                     block(seg_addr(i) + HOLE, KEPT, "active_allocated", SMALL_FRAMES),
                                                     block(seg_addr(i) + HOLE + KEPT, tail, "inactive")], SMALL_FRAMES)
                for i in range(SEGMENTS)]
    segments += [segment(seg_addr(SEGMENTS + j), LARGE_SIZE,
                         [block(seg_addr(SEGMENTS + j), LARGE_SIZE, "active_allocated", LARGE_FRAMES)], LARGE_FRAMES)
                 for j in range(LARGE)]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": SETTINGS}


def tight_snapshot() -> dict:
    """8 segments of 512 MiB, each filled by two 256 MiB blocks and kept: reserved = allocated
    = 4096 MiB at the peak. Then a 256 MiB temporary in a 9th segment, freed: its segment stays
    cached (256 MiB cached free after the peak, none at it)."""
    half = SEGMENT_SIZE // 2
    trace = []
    for i in range(SEGMENTS):
        t = T0_US + i * 100
        trace += alloc_in_new_segment(t, seg_addr(i), SEGMENT_SIZE, half, SMALL_FRAMES)
        trace.append(entry("alloc", seg_addr(i) + half, half, t + 10, SMALL_FRAMES))
    temp = seg_addr(SEGMENTS)
    trace += alloc_in_new_segment(T0_US + 10_000, temp, half, half, LARGE_FRAMES)
    trace += free(T0_US + 10_100, temp, half)
    trace.append(entry("snapshot", 0, 0, T0_US + 20_000, []))
    segments = [segment(seg_addr(i), SEGMENT_SIZE, [block(seg_addr(i), half, "active_allocated", SMALL_FRAMES),
                                                     block(seg_addr(i) + half, half, "active_allocated", SMALL_FRAMES)],
                        SMALL_FRAMES) for i in range(SEGMENTS)]
    segments.append(segment(temp, half, [block(temp, half, "inactive")], LARGE_FRAMES))
    return {"segments": segments, "device_traces": [trace], "allocator_settings": SETTINGS}


FIXTURES = {
    "handbuilt_snapshot_fragmented.pickle": fragmented_snapshot,
    "handbuilt_snapshot_tight.pickle": tight_snapshot,
}


def all_files() -> dict[str, bytes]:
    """Every fixture's name and bytes."""
    return {name: pickle.dumps(build(), PROTOCOL) for name, build in FIXTURES.items()}


def main(directory: Path = HERE) -> None:
    write_files(all_files(), directory)


if __name__ == "__main__":
    main()

"""Advice rule `allocator-fragmentation` (issue 22): through `memprof import` of hand-built CUDA
snapshots (tests/data/make_advice_snapshots.py) — a fragmented one gets the advice with its
figures, a tight one (reserved = allocated at the peak) and one already on expandable
segments get none — and on synthetic GPU recordings for the NVML peak, the segment count and
the thresholds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memprof.analysis.advice import fragmentation
from memprof.api import analyse
from tests.factories import ev
from tests.gpu_factories import (
    EQUATION_EVENTS, EQUATION_SAMPLES, GiB, MiB, S, cuda, timeline_of, write_recording,
)
from tests.unit.test_html import invoke

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
import make_advice_snapshots as fx  # noqa: E402

RULE = "allocator-fragmentation"


def test_generator_reproduces_the_committed_snapshots():
    for name, data in fx.all_files().items():
        assert (DATA / name).read_bytes() == data, f"{name} differs: rerun tests/data/make_advice_snapshots.py"


def imported_advice(tmp_path: Path, fixture: str) -> dict:
    """`memprof import FIXTURE` then `memprof report advice --format json` on it."""
    path = tmp_path / "snap.memprof"
    code, _, err = invoke("import", DATA / fixture, "-o", path)
    assert code == 0, err
    code, stdout, err = invoke("report", "advice", path, "--format", "json")
    assert code == 0, err
    return json.loads(stdout)


def rule_of(data: dict) -> tuple[list[dict], dict]:
    """(this rule's advice, its rules entry)."""
    return ([a for a in data["advice"] if a["rule"] == RULE],
            next(r for r in data["rules"] if r["id"] == RULE))


def test_an_imported_fragmented_snapshot_gets_the_advice_with_its_figures(tmp_path):
    [advice], entry = rule_of(imported_advice(tmp_path, "handbuilt_snapshot_fragmented.pickle"))
    reserved, allocated = 8 * 512 * MiB + 4 * 400 * MiB, 8 * 300 * MiB + 4 * 400 * MiB
    cached = reserved - allocated
    assert cached == 1696 * MiB and entry["fired"]
    numbers = advice["numbers"]
    assert (numbers["peak_of"], numbers["reserved_bytes"], numbers["allocated_bytes"], numbers["cached_free_bytes"]) == (
        "reserved", reserved, allocated, cached)
    assert numbers["fragmentation"] == pytest.approx(1696 / 5696)
    assert numbers["amplification"] == pytest.approx(5696 / 4000)  # peak requested: 8 × 500 MiB before the frees
    # 8 segments keep a 200 MiB hole and a 12 MiB tail beside their 300 MiB block; the 4 new ones are full.
    assert (numbers["segments_live"], numbers["segments_split"], numbers["segments_empty"],
            numbers["split_free_bytes"]) == (12, 8, 0, 8 * 212 * MiB)
    assert advice["saving_bytes"] == cached and advice["device"] == "cuda:0"
    assert "expandable_segments:True" in advice["change"]
    assert [c["name"] for c in advice["chains"]] == ["forward (model.py:30) ← train_step (train.py:80)"]
    text = " ".join(advice["evidence"])
    for expected in ("reserved (cuda_segment) is 5.6 GiB", "allocated (cuda_block) 3.9 GiB", "1.7 GiB cached free",
                     "fragmentation 29.8%", "8 of the 12 segments", "1.42×", "forward (model.py:30)"):
        assert expected in text, (expected, text)


def test_an_imported_tight_snapshot_gets_none(tmp_path):
    """Its 9th segment is cached free after the peak (256 MiB), none at it."""
    given, entry = rule_of(imported_advice(tmp_path, "handbuilt_snapshot_tight.pickle"))
    assert given == [] and not entry["fired"]
    assert entry["why_not"].startswith("cuda:0: 0 B cached free at the peak (reserved 4.2 GiB, allocated 4.2 GiB)")


def test_a_snapshot_already_on_expandable_segments_gets_none(tmp_path):
    given, entry = rule_of(imported_advice(tmp_path, "handbuilt_snapshot_expandable.pickle"))
    assert given == [] and "expandable segments are already on" in entry["why_not"]


# ---- synthetic recordings ---------------------------------------------------------------------

def check(tmp_path: Path, rows: list[dict], samples=None):
    path = write_recording(tmp_path / "gpu.memprof", timeline_of(rows), samples)
    return fragmentation.check(analyse(path))


def test_at_the_nvml_peak_the_equation_fires_with_its_terms(tmp_path):
    """gpu_factories' equation: at NVML's peak (4 s) reserved 9 GiB, allocated 6 GiB in one segment."""
    [advice] = check(tmp_path, EQUATION_EVENTS, EQUATION_SAMPLES).advice
    assert (advice.numbers["peak_of"], advice.numbers["peak_ts_ns"]) == ("used_nvml", 4 * S)
    assert (advice.numbers["reserved_bytes"], advice.numbers["allocated_bytes"], advice.saving_bytes) == (
        9 * GiB, 6 * GiB, 3 * GiB)
    assert advice.numbers["fragmentation"] == pytest.approx(1 / 3)
    assert advice.numbers["amplification"] == pytest.approx(9 / 5)
    assert (advice.numbers["segments_live"], advice.numbers["segments_split"]) == (1, 1)


def split_segments(count: int, segment: int = GiB, used: int = 900 * MiB) -> list[dict]:
    """`count` segments, each with one live block of `used` bytes at its start, from 1 s on."""
    rows = []
    for i in range(count):
        addr = (i + 1) << 36
        rows += [cuda(S + i, "alloc", addr, segment, layer="cuda_segment", stack_id=5),
                 cuda(S + i, "alloc", addr, used, stack_id=6)]
    return rows + [ev(3 * S, "mark", category="exit", pid=100)]


def test_many_split_segments_fire_under_the_fraction(tmp_path):
    """10 segments of 1 GiB with 900 MiB used: 12% cached free (under 25%), but 10 split segments."""
    [advice] = check(tmp_path, split_segments(10)).advice
    assert advice.numbers["fragmentation"] == pytest.approx(124 / 1024)
    assert (advice.numbers["segments_split"], advice.saving_bytes, advice.chains) == (10, 10 * 124 * MiB, (5,))


def test_fewer_split_segments_under_the_fraction_are_silent(tmp_path):
    verdict = check(tmp_path, split_segments(7))
    assert verdict.advice == () and "fewer than MIN_SPLIT_SEGMENTS 8" in verdict.why_not


def test_little_cached_free_is_silent_whatever_the_fraction(tmp_path):
    """50% fragmented, but 100 MiB: under MIN_CACHED_FREE_BYTES."""
    verdict = check(tmp_path, split_segments(1, segment=200 * MiB, used=100 * MiB))
    assert verdict.advice == () and "100.0 MiB cached free at the peak" in verdict.why_not


def test_a_recording_without_gpu_memory_is_silent(tmp_path):
    rows = [ev(S, "alloc", 0x1000, 4 * GiB, 1, layer="torch_cpu"), ev(2 * S, "mark", category="exit", pid=100)]
    verdict = check(tmp_path, rows)
    assert verdict.advice == () and verdict.why_not.startswith("no GPU memory")

"""Leaks of a distributed job (issue 23, item 3): each rank's allocations are judged at that
rank's own step marks, each finding names the ranks and hosts its allocations came from, and
`report leaks --by rank` judges each rank apart. Synthetic 4-rank recordings whose ranks step
one after another (as torchrun's do when each rank's loop is short), with known bytes;
tests/integration/test_ranks_torchrun.py records a real torchrun job."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from memprof.analysis.chain_trends import chain_trends
from memprof.analysis.checkpoints import find_checkpoints
from memprof.analysis.leaks import find_leaks
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.trend import MIN_POINTS
from memprof.api import analyse
from memprof.model.meta import RecordingMeta, SourceStats
from tests.factories import ev, mark
from tests.gpu_factories import S, timeline_of, write_recording
from tests.unit.test_html import invoke

KiB, MiB = 1024, 1 << 20
RANK_PIDS = {0: 5100, 1: 5101, 2: 5102, 3: 5103}
LAUNCHER = 5000
STEPS = 12
RANK_SPAN = 20 * S  # rank r steps in [r·RANK_SPAN, r·RANK_SPAN + STEPS·S]: the ranks one after another
WEIGHTS, TEMPORARY, KEPT = 1, 2, 3  # stack ids


def _meta(hosts=("node-a", "node-a", "node-b", "node-b")) -> RecordingMeta:
    processes = {str(pid): {"agent": "installed", "rank": rank, "world_size": 4, "host": hosts[rank]}
                 for rank, pid in RANK_PIDS.items()}
    processes[str(LAUNCHER)] = {"agent": "installed", "host": hosts[0]}  # torchrun itself: no rank
    return RecordingMeta(memprof_version="0.1.0", command=["torchrun"], start_ns=0, pid=LAUNCHER,
                         sources={"agent": SourceStats(detail={"processes": processes})})


def _job(kept_per_step: dict[int, int]) -> list[dict]:
    """Four ranks, each with 1 MiB of weights, STEPS step marks (step 0 when torch is imported,
    as the agent marks it) and a 64 KiB temporary per step freed at once; rank r also keeps
    kept_per_step[r] bytes per step, made just after its step mark, never freed. The launcher
    marks step 0 only."""
    rows = [dict(mark(S // 2, LAUNCHER, "step"), step=0)]
    for rank, pid in RANK_PIDS.items():
        at = dict(layer="torch_cpu", device="cpu", pid=pid, tid=pid)
        start = rank * RANK_SPAN + S
        rows.append(dict(mark(start - S // 2, pid, "step"), step=0))
        rows.append(ev(start - S // 4, "alloc", pid << 32, MiB, WEIGHTS, **at))
        for k in range(1, STEPS + 1):
            t = start + (k - 1) * S
            rows.append(dict(mark(t, pid, "step"), step=k))
            rows += [ev(t + 10, "alloc", (pid << 32) + 0x1000 * k, 64 * KiB, TEMPORARY, **at),
                     ev(t + 20, "free", (pid << 32) + 0x1000 * k, **at)]
            if kept_per_step.get(rank):
                rows.append(ev(t + 30, "alloc", (pid << 32) + 0x100_0000 * k, kept_per_step[rank], KEPT, **at))
    end = 4 * RANK_SPAN + S
    rows.append(ev(end, "alloc", 0x77, 16, 9, layer="torch_cpu", device="cpu", pid=LAUNCHER, tid=LAUNCHER))
    return rows


def _path(tmp_path, rows, meta=None):
    return write_recording(tmp_path / "job.memprof", timeline_of(rows), meta=meta or _meta())


def _growing(result) -> list:
    return [f for f in result.findings if f.kind == "grows_per_step"]


def test_each_rank_is_read_at_its_own_step_marks():
    events = timeline_of(_job({2: 256 * KiB}))
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=int(events["ts_ns"].max()), min_points=MIN_POINTS)
    assert checkpoints.by_step and list(checkpoints.labels) == list(range(STEPS + 1))
    assert sorted(checkpoints.by_pid) == sorted(RANK_PIDS.values())
    rank2 = checkpoints.by_pid[RANK_PIDS[2]]
    assert rank2[1] == 2 * RANK_SPAN + S and np.all(np.diff(rank2[1:]) == S)
    # The launcher (no steps of its own) is read at the earliest mark of each step: rank 0's.
    assert list(checkpoints.times_ns[1:]) == list(checkpoints.by_pid[RANK_PIDS[0]][1:])
    assert checkpoints.period_ns == S


def test_one_process_or_steps_that_do_not_line_up_keep_one_clock():
    one = timeline_of([row for row in _job({}) if row.get("pid") in (RANK_PIDS[0], LAUNCHER)])
    checkpoints = find_checkpoints(one, start_ns=0, end_ns=int(one["ts_ns"].max()), min_points=MIN_POINTS)
    assert checkpoints.by_step and checkpoints.by_pid is None
    # rank 1 counts its steps from 100: no step number both ranks marked, so one clock of steps
    rows = [dict(r, step=r["step"] + 100) if r.get("pid") == RANK_PIDS[1] and r.get("step") else r
            for r in _job({}) if r.get("pid") in (RANK_PIDS[0], RANK_PIDS[1])]
    apart = timeline_of(rows)
    assert find_checkpoints(apart, start_ns=0, end_ns=int(apart["ts_ns"].max()), min_points=MIN_POINTS).by_pid is None


def test_the_leaking_ranks_chain_grows_256_kib_a_step_on_rank_2(tmp_path):
    result = analyse(_path(tmp_path, _job({2: 256 * KiB}))).leak_result()
    (kept,) = _growing(result)
    assert (kept.stack_id, kept.reason, kept.ranks, kept.hosts) == (KEPT, "grows", (2,), ("node-b",))
    assert kept.slope_bytes_per_step == 256 * KiB and kept.slope_bytes_per_s == 256 * KiB  # a step is 1 s
    assert (kept.live_bytes, kept.live_count) == (STEPS * 256 * KiB, STEPS)
    # The weights, held at the end on every rank: one finding, every rank and both hosts.
    weights = next(f for f in result.findings if f.stack_id == WEIGHTS)
    assert (weights.kind, weights.live_bytes, weights.ranks, weights.hosts) == (
        "held_at_end", 4 * MiB, (0, 1, 2, 3), ("node-a", "node-b"))


def test_read_at_the_first_ranks_marks_the_growth_is_missed():
    """The gap this fixes: at the earliest mark of each step (rank 0's), rank 2's kept tensors
    are made after every checkpoint, and no chain grows."""
    events = timeline_of(_job({2: 256 * KiB}))
    end = int(events["ts_ns"].max())
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=end, min_points=MIN_POINTS)
    lifetimes = pair_lifetimes(events)
    merged = find_leaks(lifetimes, end_ns=end, recording_end_ns=end, checkpoints=replace(checkpoints, by_pid=None))
    own = find_leaks(lifetimes, end_ns=end, recording_end_ns=end, checkpoints=checkpoints)
    assert _growing(merged) == [] and [f.stack_id for f in _growing(own)] == [KEPT]


def test_a_chain_leaking_on_every_rank_adds_up_and_splits_by_rank(tmp_path):
    analysed = analyse(_path(tmp_path, _job({rank: 64 * KiB for rank in RANK_PIDS})))
    (kept,) = _growing(analysed.leak_result())
    assert (kept.slope_bytes_per_step, kept.live_bytes, kept.ranks) == (
        4 * 64 * KiB, 4 * STEPS * 64 * KiB, (0, 1, 2, 3))
    split = analysed.leak_result(by="rank")
    per_rank = sorted(_growing(split), key=lambda f: f.ranks)
    assert [(f.ranks, f.hosts, f.slope_bytes_per_step, f.live_bytes) for f in per_rank] == [
        ((rank,), (("node-a", "node-a", "node-b", "node-b")[rank],), 64 * KiB, STEPS * 64 * KiB) for rank in range(4)]
    assert split.findings_total == 8  # each rank's kept tensors and its weights
    assert sorted(f.ranks for f in split.findings if f.stack_id == WEIGHTS) == [(0,), (1,), (2,), (3,)]


def test_by_rank_a_chain_leaking_on_rank_2_only_is_rank_2s_finding(tmp_path):
    result = analyse(_path(tmp_path, _job({2: 256 * KiB}))).leak_result(by="rank")
    (kept,) = _growing(result)
    assert (kept.ranks, kept.slope_bytes_per_step, kept.live_bytes) == ((2,), 256 * KiB, STEPS * 256 * KiB)


def test_ranks_alike_have_no_growing_chain(tmp_path):
    analysed = analyse(_path(tmp_path, _job({})))
    assert _growing(analysed.leak_result()) == [] and _growing(analysed.leak_result(by="rank")) == []


def test_report_leaks_says_the_rank_and_host_in_text_and_json(tmp_path):
    path = _path(tmp_path, _job({2: 256 * KiB}))
    code, out, err = invoke("report", "leaks", path, "--format", "json")
    assert code == 0, err
    kept = next(f for f in json.loads(out)["findings"] if f["kind"] == "grows_per_step")
    assert (kept["ranks"], kept["hosts"], kept["slope_bytes_per_step"]) == ([2], ["node-b"], 256 * KiB)
    code, out, err = invoke("report", "leaks", path)
    assert code == 0, err
    assert "on rank 2 (host node-b)" in out and "on ranks 0, 1, 2, 3 (hosts node-a, node-b)" in out
    code, out, err = invoke("report", "leaks", path, "--by", "rank", "--format", "json")
    assert code == 0, err
    assert sorted(tuple(f["ranks"]) for f in json.loads(out)["findings"]) == [(0,), (1,), (2,), (2,), (3,)]


@pytest.mark.parametrize("detail", [{}, {"processes": {"5100": {"agent": "installed"}}}])
def test_without_ranks_findings_name_none_and_by_rank_is_refused(tmp_path, detail):
    meta = RecordingMeta(memprof_version="0.1.0", command=["python"], start_ns=0, pid=LAUNCHER,
                         sources={"agent": SourceStats(detail=detail)})
    path = _path(tmp_path, _job({2: 256 * KiB}), meta=meta)
    code, out, err = invoke("report", "leaks", path, "--format", "json")
    assert code == 0 and all(f["ranks"] == [] and f["hosts"] == [] for f in json.loads(out)["findings"])
    code, out, err = invoke("report", "leaks", path, "--by", "rank")
    assert code == 2 and "cannot be split by rank" in err and "Traceback" not in err


def test_one_allocation_kept_by_each_rank_at_another_step_is_no_growth(tmp_path):
    """Added up over the ranks' own steps it is a staircase (one more 256 KiB every three
    steps); no rank's own series grows, so no chain does: each rank holds what it made once."""
    rows = _job({})
    for rank, pid in RANK_PIDS.items():
        t = rank * RANK_SPAN + S + (3 * rank + 1) * S + 40  # just after rank r's step 3r + 2
        rows.append(ev(t, "alloc", (pid << 32) + 0x7700_0000, 256 * KiB, KEPT, layer="torch_cpu", device="cpu",
                       pid=pid, tid=pid))
    analysed = analyse(_path(tmp_path, rows))
    events, result = analysed.events, analysed.leak_result()
    end = int(events["ts_ns"].max())
    checkpoints = find_checkpoints(events, start_ns=0, end_ns=end, min_points=MIN_POINTS)
    trends = chain_trends(analysed.lifetimes.allocations, checkpoints)
    row = trends.series.row_of[("torch_cpu", KEPT)]
    assert list(trends.series.live_bytes[row] / KiB) == [0, 0, 0, 256, 256, 256, 512, 512, 512, 768, 768, 768, 1024]
    assert trends.by_chain[("torch_cpu", KEPT)].shape == "flat" and trends.growing == []
    kept = next(f for f in result.findings if f.stack_id == KEPT)
    assert (kept.kind, kept.live_bytes, kept.ranks) == ("held_at_end", 4 * 256 * KiB, (0, 1, 2, 3))

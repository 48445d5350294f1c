"""Ranks of a distributed job (issue 23, item 3): the agent reads each process's rank from its
launcher's variables; `report` names the rank whose growth or peak differs from the others',
and `report top --by rank` splits the live bytes by rank. Synthetic recordings with known
bytes; tests/integration/test_ranks_torchrun.py records torchrun."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memprof.api import analyse
from memprof.model.meta import RecordingMeta, SourceStats
from tests.factories import ev, mark
from tests.gpu_factories import S, timeline_of, write_recording
from tests.unit.test_html import invoke

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "memprof" / "agent" / "boot"))
import memprof_agent  # noqa: E402  (the agent is a standalone file, as it runs in the target)

KiB = 1024
RANK_PIDS = {0: 4100, 1: 4101, 2: 4102, 3: 4103}
LAUNCHER = 4000
STEPS = 10


def test_placement_reads_torchrun_slurm_and_mpi_variables():
    torchrun = memprof_agent.placement({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                                        "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "job-7"})
    assert {k: v for k, v in torchrun.items() if k != "host"} == {
        "rank": 3, "rank_from": "RANK", "local_rank": 1, "world_size": 8, "local_world_size": 4, "node_rank": 0,
        "job_id": "job-7"}
    slurm = memprof_agent.placement({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16",
                                     "SLURM_NODEID": "2", "SLURM_JOB_ID": "991"})
    assert (slurm["rank"], slurm["rank_from"], slurm["world_size"], slurm["node_rank"], slurm["job_id"]) == \
        (5, "SLURM_PROCID", 16, 2, "991")
    mpi = memprof_agent.placement({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"})
    assert (mpi["rank"], mpi["rank_from"], mpi["world_size"]) == (2, "OMPI_COMM_WORLD_RANK", 4)
    # torchrun's RANK wins over a Slurm rank beside it; garbage is no rank; the host is always said.
    both = memprof_agent.placement({"RANK": "1", "SLURM_PROCID": "9"})
    assert (both["rank"], both["rank_from"]) == (1, "RANK")
    assert "rank" not in memprof_agent.placement({"RANK": "-1", "PMI_RANK": "x"})
    assert memprof_agent.placement({})["host"]


def _meta(hosts=("node-a",) * 4) -> RecordingMeta:
    processes = {str(pid): {"agent": "installed", "rank": rank, "world_size": 4, "host": hosts[rank]}
                 for rank, pid in RANK_PIDS.items()}
    processes[str(LAUNCHER)] = {"agent": "installed", "host": hosts[0]}  # torchrun itself: no rank
    return RecordingMeta(memprof_version="0.1.0", command=["torchrun"], start_ns=0, pid=LAUNCHER,
                         sources={"agent": SourceStats(detail={"processes": processes})})


def _job(leak_rank: int | None, per_step: int = 256 * KiB, peak_rank: int | None = None) -> list[dict]:
    """Four ranks, each with STEPS step marks and 1 MiB of weights (4 MiB on `peak_rank`), a
    temporary per step freed at once; `leak_rank` also keeps `per_step` bytes per step."""
    rows = []
    for rank, pid in RANK_PIDS.items():
        at = dict(layer="torch_cpu", device="cpu", pid=pid, stack_id=1)
        offset = rank * 1000  # the ranks' steps interleave, as they do
        rows.append(ev(offset, "alloc", pid << 32, (4 if rank == peak_rank else 1) << 20, **at))
        for k in range(1, STEPS + 1):
            t = k * S + offset
            step = mark(t, pid, "step")
            step["step"] = k
            rows.append(step)
            rows += [ev(t + 10, "alloc", (pid << 32) + 0x1000 * k, 64 * KiB, **at),
                     ev(t + 20, "free", (pid << 32) + 0x1000 * k, **at)]
            if rank == leak_rank:
                rows.append(ev(t + 30, "alloc", (pid << 32) + 0x100_0000 + 0x10_0000 * k, per_step, **dict(at, stack_id=2)))
    return rows


def _recording(tmp_path, rows, meta=None) -> Path:
    return write_recording(tmp_path / "job.memprof", timeline_of(rows), meta=meta or _meta())


def test_the_one_leaking_rank_in_four_is_named_with_its_growth(tmp_path):
    report = analyse(_recording(tmp_path, _job(leak_rank=2))).ranks()
    assert report.layer == "torch_cpu" and report.world_size == 4
    assert [(r.rank, r.pids, r.steps) for r in report.ranks] == [(k, (pid,), STEPS) for k, pid in RANK_PIDS.items()]
    assert [r.rank for r in report.diverging] == [2]
    leaking = report.ranks[2]
    assert leaking.growth_bytes_per_step == 256 * KiB
    assert leaking.diverges == "grows 256.0 KiB per step where the other ranks' median is 0 B"
    # the weights and every kept tensor (each step's 64 KiB temporary is freed before it keeps one)
    assert leaking.peak_bytes == leaking.end_bytes == (1 << 20) + STEPS * 256 * KiB
    assert [r.growth_bytes_per_step for r in report.ranks if r.rank != 2] == [0.0, 0.0, 0.0]


def test_ranks_alike_are_not_flagged(tmp_path):
    report = analyse(_recording(tmp_path, _job(leak_rank=None))).ranks()
    assert len(report.ranks) == 4 and report.diverging == []
    # growth under the bar is no divergence however the others do
    assert analyse(_recording(tmp_path / "small", _job(leak_rank=1, per_step=4 * KiB))).ranks().diverging == []


def test_a_rank_peaking_at_twice_the_others_is_named(tmp_path):
    report = analyse(_recording(tmp_path, _job(leak_rank=None, peak_rank=3))).ranks()
    assert [(r.rank, r.diverges) for r in report.diverging] == [
        (3, "peaks at 4.1 MiB where the other ranks' median is 1.1 MiB")]


def test_report_names_the_rank_and_top_by_rank_splits_the_bytes(tmp_path):
    path = _recording(tmp_path, _job(leak_rank=2))
    code, out, err = invoke("report", path)
    assert code == 0, err
    assert "Ranks: 4 of 4; 1 differ from the others in torch_cpu:" in out
    assert "! rank 2 on node-a (pid 4102): grows 256.0 KiB per step where the other ranks' median is 0 B" in out
    assert "grows per step on rank 2 (host node-a): 2.5 MiB in 10" in out  # the finding says whose it is
    code, out, err = invoke("report", path, "--format", "json")
    summary = json.loads(out)
    assert [(r["rank"], r["diverges"] is not None) for r in summary["ranks"]] == \
        [(0, False), (1, False), (2, True), (3, False)]
    # the weights every rank holds to the end (never freed here), and rank 2's growth
    assert [(f["kind"], f["ranks"], f["hosts"]) for f in summary["findings"]] == [
        ("held_at_end", [0, 1, 2, 3], ["node-a"]), ("grows_per_step", [2], ["node-a"])]
    code, out, err = invoke("report", "top", path, "--by", "rank", "--at", "peak", "--format", "json")
    assert code == 0, err
    (torch_cpu,) = json.loads(out)["layers"]
    rows = {row["rank"]: row["live_bytes"] for row in torch_cpu["rows"]}
    assert rows["rank 2"] == max(rows.values()) and set(rows) <= {"rank 0", "rank 1", "rank 2", "rank 3"}


def test_ranks_on_several_hosts_are_told_apart_by_host(tmp_path):
    path = _recording(tmp_path, _job(leak_rank=2), meta=_meta(hosts=("node-a", "node-a", "node-b", "node-b")))
    code, out, err = invoke("report", "top", path, "--by", "rank", "--format", "json")
    assert code == 0, err
    names = {row["rank"] for layer in json.loads(out)["layers"] for row in layer["rows"]}
    assert "rank 2@node-b" in names


@pytest.mark.parametrize("detail", [{}, {"processes": {"4100": {"agent": "installed"}}}])
def test_a_recording_without_ranks_says_so_and_report_stays_quiet(tmp_path, detail):
    meta = RecordingMeta(memprof_version="0.1.0", command=["python"], start_ns=0, pid=4100,
                         sources={"agent": SourceStats(detail=detail)})
    path = _recording(tmp_path, _job(leak_rank=2), meta=meta)
    report = analyse(path).ranks()
    assert report.ranks == [] and report.notes[0].startswith("no process of this recording had a rank")
    code, out, _ = invoke("report", path)
    assert code == 0 and "Ranks" not in out


@pytest.mark.parametrize("job", [dict(leak_rank=2), dict(leak_rank=None, peak_rank=3)], ids=["leaking", "peaking"])
def test_a_folded_recording_gives_the_same_ranks(tmp_path, job):
    """Each rank's peak is tracked in the fold's first pass (its 64 KiB temporaries live at no
    step mark), its end and steps are moments the fold keeps: the ranks come out as whole."""
    path = _recording(tmp_path, _job(**job))
    whole, folded = analyse(path), analyse(path, max_memory=1)
    dropped = folded.fold.dropped_count["torch_cpu"]
    assert 4 * STEPS - 4 <= dropped < 4 * STEPS  # the temporaries, but one held at a rank's peak
    assert folded.ranks() == whole.ranks() and whole.ranks().diverging


def test_two_ranks_are_shown_side_by_side_never_called_alike(tmp_path):
    """Of two ranks neither is the odd one (with_divergence), so the summary gives each one's
    peak and growth: before 2026-12-07 it said "alike" of a DDP run whose rank 1 kept 512 KiB
    a step and rank 0 nothing."""
    two = {0: RANK_PIDS[0], 1: RANK_PIDS[1]}
    rows = [row for row in _job(leak_rank=1) if row["pid"] in two.values()]
    meta = _meta()
    for pid in (RANK_PIDS[2], RANK_PIDS[3]):
        del meta.sources["agent"].detail["processes"][str(pid)]
    code, out, err = invoke("report", _recording(tmp_path, rows, meta))
    assert code == 0, err
    assert ("Ranks: 2 of 4, in torch_cpu: rank 0 peaks at 1.1 MiB, grows 0 B per step; "
            "rank 1 peaks at 3.5 MiB, grows 256.0 KiB per step") in out
    assert "alike" not in out

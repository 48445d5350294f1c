"""A job of two "machines" (issue 23, item 4): two `memprof record --host-label` processes on
this host, at once, each recording two ranks of examples/ranks_leak.py (RANK 0-1 on hostA,
2-3 on hostB; ranks need three to name an odd one, so each machine holds two), under a
Slurm job id and without -o. `memprof report FOLDER` reports them as one job: both hosts and
all four ranks, rank 3 on hostB named as the one that differs and on the one leak, one
clock with its skew; the README's DuckDB query gives each rank's live bytes as memprof does.
The same job with no leaking rank names none."""
from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ranks_leak.py"
KEPT_PER_STEP = 256 * 1024  # examples/ranks_leak.py's KEPT_BYTES
STEPS = 12
MACHINES = {"hostA": (0, 1), "hostB": (2, 3)}
JOB_ID = "77"


def _machine(run_memprof, folder: Path, host: str, leak_rank: int):
    """One machine's recorder: its two ranks started by one shell, as torchrun would."""
    ranks = " & ".join(f"RANK={rank} WORLD_SIZE=4 {sys.executable} {EXAMPLE} --leak-rank {leak_rank} --steps {STEPS}"
                       for rank in MACHINES[host])
    env = {**os.environ, "SLURM_JOB_ID": JOB_ID}
    return run_memprof("record", "-q", "--host-label", host, "--", "sh", "-c", f"{ranks} & wait",
                       cwd=folder, timeout=240, env=env)


def _job(run_memprof, tmp_path: Path, leak_rank: int) -> tuple[Path, dict, str]:
    folder = tmp_path / "job"
    folder.mkdir()
    with ThreadPoolExecutor(2) as pool:  # the two machines record at once
        results = list(pool.map(lambda host: _machine(run_memprof, folder, host, leak_rank), MACHINES))
    for result in results:
        assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    # without -o, a Slurm job's recordings carry the job and the host in their names
    names = sorted(path.name for path in folder.glob("*.memprof"))
    assert [name.split("-sh-")[0] for name in names] == [f"memprof-slurm{JOB_ID}-{host}" for host in MACHINES], names
    report = run_memprof("report", "job/", "--format", "json", cwd=tmp_path, timeout=240)
    assert report.returncode == 0, report.stderr
    text = run_memprof("report", *sorted(folder.glob("*.memprof")), cwd=tmp_path, timeout=240)
    assert text.returncode == 0, text.stderr
    return folder, json.loads(report.stdout), text.stdout


def test_two_machines_are_one_job_naming_the_leaking_rank_on_its_host(tmp_path, run_memprof):
    folder, job, text = _job(run_memprof, tmp_path, leak_rank=3)
    assert [(h["host"], h["recordings"], h["ranks"]) for h in job["hosts"]] == [("hostA", 1, [0, 1]), ("hostB", 1, [2, 3])]
    assert [(r["rank"], r["host"]) for r in job["ranks"]] == [(0, "hostA"), (1, "hostA"), (2, "hostB"), (3, "hostB")]
    assert job["layer"] == "torch_cpu" and job["world_size"] == 4
    assert [(r["rank"], r["host"]) for r in job["ranks"] if r["diverges"]] == [(3, "hostB")]
    leaking = job["ranks"][3]
    assert abs(leaking["growth_bytes_per_step"] - KEPT_PER_STEP) <= 0.02 * KEPT_PER_STEP
    growing = [leak for leak in job["leaks"] if leak["kind"] == "grows_per_step"]
    assert [(leak["host"], leak["ranks"]) for leak in growing] == [("hostB", [3])]
    assert abs(growing[0]["slope_bytes_per_step"] - KEPT_PER_STEP) <= 0.02 * KEPT_PER_STEP
    assert "ranks_leak.py" in growing[0]["chain"]
    # one clock: both recordings on CLOCK_REALTIME, the skew stated, and they ran at once
    clock = job["clock"]
    assert clock["aligned"] and clock["why"] is None
    assert [c["host"] for c in clock["recordings"]] == ["hostA", "hostB"]
    assert all(c["anchors"] >= 2 for c in clock["recordings"])
    assert 0 <= clock["skew_ns"] == max(c["spread_ns"] for c in clock["recordings"])
    assert clock["overlap_ns"] > 0
    assert "! rank 3 on hostB" in text and "grows 256.0 KiB per step" in text and "skew within ±" in text
    _duckdb_agrees(folder)


def _duckdb_agrees(folder: Path) -> None:
    """The README's DuckDB query over the job's folder gives each rank's live bytes at its
    last step mark as memprof does (report top --by rank --at), and rank 3 holds its kept
    tensors there."""
    duckdb = pytest.importorskip("duckdb")
    from memprof.api import analyse
    from tests.unit.test_job import _readme_sql

    cwd = os.getcwd()
    os.chdir(folder.parent)
    try:
        rows = duckdb.sql(_readme_sql()).fetchall()
    finally:
        os.chdir(cwd)
    assert [(host, rank) for host, rank, _, _ in rows] == [("hostA", 0), ("hostA", 1), ("hostB", 2), ("hostB", 3)]
    recordings = {host: next(folder.glob(f"*-{host}-*.memprof")) for host in MACHINES}
    for host, rank, at_ns, live in rows:
        analysed = analyse(recordings[host])
        view = analysed.attribution(by="rank", at=at_ns - analysed.span.start_ns, layers=("torch_cpu",), top=None)
        (layer,) = view.result.layers
        assert {row.rank: row.live_bytes for row in layer.rows}[f"rank {rank}"] == live, (host, rank)
    live = {rank: live for _, rank, _, live in rows}
    assert live[3] - max(live[0], live[1], live[2]) >= (STEPS - 2) * KEPT_PER_STEP


def test_the_same_job_without_a_leaking_rank_names_none(tmp_path, run_memprof):
    _, job, text = _job(run_memprof, tmp_path, leak_rank=-1)
    assert [r["rank"] for r in job["ranks"]] == [0, 1, 2, 3]
    assert [r["rank"] for r in job["ranks"] if r["diverges"]] == []
    assert [leak for leak in job["leaks"] if leak["kind"] == "grows_per_step"] == []
    assert "Ranks: alike in torch_cpu" in text

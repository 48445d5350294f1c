"""Ranks of a real distributed job (issue 23, item 3): `torchrun --nproc_per_node 4` of
examples/ranks_leak.py, where one rank keeps 256 KiB per step and the others nothing, under
`memprof record`: the one-screen report names that rank, with its growth per step, and
`report leaks` names its kept tensors' chain as growing 256 KiB per step on that rank (each
rank judged at its own step marks); the same job without a leaking rank has none named."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ranks_leak.py"
KEPT_PER_STEP = 256 * 1024  # examples/ranks_leak.py's KEPT_BYTES
KEPT_LINE = next(n for n, line in enumerate(EXAMPLE.read_text().splitlines(), 1) if "kept.append(torch.ones(" in line)
STEPS = 12


def _torchrun() -> Path:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    return torchrun


def _job_report(run_memprof, tmp_path: Path, leak_rank: int) -> dict:
    recording = tmp_path / f"ranks-{leak_rank}.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", _torchrun(), "--standalone", "--nproc_per_node", "4",
                         EXAMPLE, "--leak-rank", leak_rank, "--steps", STEPS, cwd=tmp_path, timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    # Four workers share one stdout: a line's newline can land after another worker's line
    # (seen in CI: "kept=0rank=0 ..."), so the lines are found by pattern, not by splitting.
    assert sorted(re.findall(r"rank=\d+ steps=\d+ kept=\d+", result.stdout)) == [
        f"rank={r} steps={STEPS} kept={STEPS if r == leak_rank else 0}" for r in range(4)]
    report = run_memprof("report", recording, "--format", "json", cwd=tmp_path, timeout=180)
    assert report.returncode == 0, report.stderr
    text = run_memprof("report", recording, cwd=tmp_path, timeout=180)
    leaks = run_memprof("report", "leaks", recording, "--format", "json", cwd=tmp_path, timeout=180)
    assert leaks.returncode == 0, leaks.stderr
    return {"json": json.loads(report.stdout), "text": text.stdout, "leaks": json.loads(leaks.stdout)}


def _kept_chain(finding: dict) -> bool:
    """The finding's chain runs through examples/ranks_leak.py's kept.append(torch.ones(…))."""
    return any(frame["function"] == "main" and str(frame["file"]).endswith("ranks_leak.py")
               and frame["line"] == KEPT_LINE for frame in finding["stack"])


def test_torchrun_with_one_leaking_rank_in_four_names_it(tmp_path, run_memprof):
    report = _job_report(run_memprof, tmp_path, leak_rank=2)
    ranks = report["json"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and all(len(r["pids"]) == 1 for r in ranks)
    assert [r["rank"] for r in ranks if r["diverges"]] == [2]
    leaking = ranks[2]
    assert leaking["layer"] == "torch_cpu" and leaking["steps"] >= STEPS
    assert abs(leaking["growth_bytes_per_step"] - KEPT_PER_STEP) <= 0.02 * KEPT_PER_STEP
    assert "! rank 2 on " in report["text"] and "grows 256.0 KiB per step" in report["text"]
    # report leaks: the kept tensors' chain grows per step, on rank 2 alone, at rank 2's own steps
    kept = [f for f in report["leaks"]["findings"] if _kept_chain(f)]
    assert [(f["kind"], f["ranks"]) for f in kept] == [("grows_per_step", [2])], report["leaks"]["findings"]
    assert abs(kept[0]["slope_bytes_per_step"] - KEPT_PER_STEP) <= 0.02 * KEPT_PER_STEP
    assert kept[0]["hosts"] == [ranks[2]["host"]]


def test_torchrun_with_no_leaking_rank_names_none(tmp_path, run_memprof):
    report = _job_report(run_memprof, tmp_path, leak_rank=-1)
    ranks = report["json"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["rank"] for r in ranks if r["diverges"]] == []
    assert "Ranks: 4 of 4, alike in torch_cpu" in report["text"]
    # No chain grows from step to step, on any rank (each judged at its own step marks).
    findings = report["leaks"]["findings"]
    assert [(f["name"], f["ranks"]) for f in findings if f["kind"] == "grows_per_step"] == []


SPAWNED_RANKS = """
import os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    kept = [torch.ones(1 << 16) for _ in range(rank + 1)]
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, port), nprocs=2, join=True)
    print("spawned done", flush=True)
"""


def test_ranks_that_torch_multiprocessing_spawn_starts_are_named(tmp_path, run_memprof):
    """mp.spawn gives the rank to init_process_group, not in RANK: its processes were "no
    rank" in every report. The agent says the rank once the process group is made."""
    from memprof.analysis.ranks import process_ranks
    from memprof.recording import open_recording
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_RANKS)
    recording = tmp_path / "spawned.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", sys.executable, script, cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "spawned done" in result.stdout, result.stderr
    ranks = process_ranks(open_recording(recording).meta)
    assert sorted((info["rank"], info["world_size"], info["rank_from"]) for info in ranks.values()) == \
        [(0, 2, "init_process_group"), (1, 2, "init_process_group")], ranks

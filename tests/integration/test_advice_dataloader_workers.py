"""Advice rule `dataloader-copy-on-read` (issue 22) on examples/dataloader_cow.py recorded under
`memprof record`: two DataLoader workers reading a dataset of Python lists copy the pages they
read, so each one's own PSS (the samplers' per-process series) grows while its heap stays flat:
the advice fires, with the growth the example measures itself from /proc/PID/smaps_rollup
(the same clock, read every 10 batches). With the dataset in one numpy array (`--numpy`) the
workers' PSS stays flat and the rule is silent.

Two short recordings (module-scoped), one `report advice --format json` each."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dataloader_cow.py"
RULE = "dataloader-copy-on-read"
MiB = 1 << 20


def run(run_memprof, tmp_path_factory, *args) -> tuple[dict, str]:
    """(`report advice --format json`, the example's stdout) of dataloader_cow.py ARGS."""
    folder = tmp_path_factory.mktemp("cow")
    path = folder / "cow.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, EXAMPLE, *args, cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "steps=100" in result.stdout, result.stdout
    report = run_memprof("report", "advice", path, "--format", "json", cwd=folder, timeout=300)
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout), result.stdout


def rule_of(data: dict) -> tuple[list[dict], dict]:
    return ([a for a in data["advice"] if a["rule"] == RULE], next(r for r in data["rules"] if r["id"] == RULE))


def measured(stdout: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """pid → (t_ns, Pss bytes) the example read itself."""
    reads: dict[int, list] = {}
    for pid, t, pss in re.findall(r"^pss pid=(\d+) t_ns=(\d+) pss=(\d+)$", stdout, re.M):
        reads.setdefault(int(pid), []).append((int(t), int(pss)))
    return {pid: (np.array([t for t, _ in r]), np.array([p for _, p in r], dtype=float)) for pid, r in reads.items()}


@pytest.fixture(scope="module")
def lists(run_memprof, tmp_path_factory):
    return run(run_memprof, tmp_path_factory)


@pytest.fixture(scope="module")
def arrays(run_memprof, tmp_path_factory):
    return run(run_memprof, tmp_path_factory, "--numpy")


def getitem_line() -> int:
    lines = EXAMPLE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith("return torch.as_tensor(row"))


def test_workers_reading_python_lists_get_the_advice_with_the_pss_they_gained(lists):
    data, stdout = lists
    given, entry = rule_of(data)
    assert len(given) == 1, entry["why_not"]
    [advice] = given
    assert entry["fired"] and "dataset=builtins.list" in stdout
    reads = measured(stdout)
    numbers = advice["numbers"]
    workers = {w["pid"]: w for w in numbers["workers"]}
    # the example's two workers, and no other process
    assert set(workers) == set(reads) and len(workers) == 2, (workers.keys(), reads.keys(), entry["why_not"])
    for pid, worker in workers.items():
        assert worker["comm"] == "pt_data_worker"
        assert worker["samples"] >= 4 and worker["r2"] >= 0.8
        assert worker["pss_growth_bytes"] >= 16 * MiB
        assert abs(worker["heap_growth_bytes"]) <= 0.1 * worker["pss_growth_bytes"]
        # The growth over the rule's first and last sample, against the example's own reads at
        # those times (interpolated): the same pages, counted by the same kernel.
        t, pss = reads[pid]
        inside = np.clip([worker["first_ts_ns"], worker["last_ts_ns"]], t[0], t[-1])
        theirs = np.interp(inside, t, pss)
        assert worker["pss_growth_bytes"] == pytest.approx(theirs[1] - theirs[0], rel=0.25), (worker, t, pss)
        assert worker["pss_last_bytes"] == pytest.approx(pss[-1], rel=0.05)
    total = sum(w["pss_growth_bytes"] for w in workers.values())
    assert advice["saving_bytes"] == numbers["pss_growth_bytes"] == total
    grew = int(re.search(r"^workers_pss_grew=(\d+)$", stdout, re.M).group(1))
    assert 0.3 * grew <= total <= 1.05 * grew  # the samples begin after the workers do
    assert numbers["heap_layer"] == "torch_cpu" and numbers["steps"] > 0
    assert numbers["getitem"] == "RowsDataset.__getitem__"
    assert numbers["getitem_line"].endswith(f"dataloader_cow.py:{getitem_line()}")
    assert advice["title"].startswith("DataLoader workers copy the dataset on read")


def test_workers_reading_one_numpy_array_get_none(arrays):
    data, stdout = arrays
    given, entry = rule_of(data)
    assert "dataset=numpy.ndarray" in stdout
    assert given == [] and not entry["fired"]
    assert "PSS grew" in entry["why_not"] and "< 16.0 MiB" in entry["why_not"], entry["why_not"]

"""Issue 23 item 1, acceptance "full against folded": one 10-minute run recorded twice at
once by two `record --pid`, one without a limit and one with `--max-size 16MiB`, gives the
same findings: the same kinds and chains, bytes within 1 %.

The run is examples/long_run.py: a paced CPU training loop with kernel churn in every step
and one known leak (every 10th step keeps 131072 bytes of activations). MEMPROF_LONG_RUN_S
shortens it (default 600 s, the issue's ten minutes) for a quick local check."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memprof.recording.reader import read_meta

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_S = float(os.environ.get("MEMPROF_LONG_RUN_S", "600"))
MAX_SIZE = 16 << 20
LEAK_BYTES = 131072
# Socket pairs per step: 20 over ten minutes (about 7,000 events a second, 4·10^6 in all,
# 35 MB whole); a shorter run gets more, so that it makes as many events and is folded too.
CHURN = max(20, round(20 * 600 / RUN_S))


def memprof(*args) -> list[str]:
    return [sys.executable, "-m", "memprof", *map(str, args)]


def report(kind: str, path: Path, *args) -> dict:
    result = subprocess.run(memprof("report", kind, path, "--format", "json", *args), capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def size_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def twice_recorded(tmp_path_factory):
    """(full recording, folded recording, the workload's last line), of one run."""
    root = tmp_path_factory.mktemp("max_size")
    full, folded = root / "full.memprof", root / "folded.memprof"
    target = subprocess.Popen([sys.executable, EXAMPLES / "long_run.py", "--seconds", str(RUN_S), "--churn", str(CHURN),
                               "--wait-for-line"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=EXAMPLES)
    recorders = []
    try:
        pid = int(target.stdout.readline().strip().removeprefix("pid="))
        for path, limit in ((full, "0"), (folded, "16MiB")):
            recorders.append(subprocess.Popen(memprof("record", "-q", "-o", path, "--max-size", limit, "--pid", pid),
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True))
        deadline = time.monotonic() + 120
        while not (full.exists() and folded.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)
        target.stdin.write("start\n")
        target.stdin.flush()
        last = target.stdout.read().strip().splitlines()[-1]
        target.wait(timeout=RUN_S + 120)
        for recorder in recorders:
            out, err = recorder.communicate(timeout=300)
            assert recorder.returncode == 0, err
    finally:
        for recorder in recorders:
            if recorder.poll() is None:
                os.killpg(recorder.pid, signal.SIGKILL)
        if target.poll() is None:
            target.kill()
    return full, folded, last


def test_the_folded_recording_stays_under_its_limit_and_says_what_it_folded(twice_recorded):
    full, folded, _ = twice_recorded
    meta = read_meta(folded)
    assert meta.folds and meta.format_version == 2, meta.folds
    assert size_on_disk(folded) <= MAX_SIZE, (size_on_disk(folded), size_on_disk(full))
    assert size_on_disk(full) > MAX_SIZE, "the run was too small to need folding"
    assert not read_meta(full).folds


def _findings(path: Path) -> dict[tuple, dict]:
    """Findings by (layer, kind, chain's functions and lines). Not by functions alone: two
    chains through one function at two lines are two findings, and one would hide the other
    (a 2,560-byte tensor of long_run.py's line 29, held in one recording only, once replaced
    the known leak of line 26 under one key)."""
    leaks = report("leaks", path, "--top", "1000")
    return {(f["layer"], f["kind"], tuple((fr["function"], fr.get("line")) for fr in f["stack"])): f
            for f in leaks["findings"]}


def _unseen(path: Path) -> int:
    """Events this recorder did not see: lost (its ring buffer was full) or frees skipped by
    the kernel. Two recorders on one run do not lose the same ones. (Allocations the kernel
    skips are interrupts', which neither recorder keeps: meta.json's nested_allocations.)"""
    stats = read_meta(path).sources["ebpf"]
    return stats.lost + sum(stats.missed.values())


def test_the_same_findings_with_bytes_within_one_percent(twice_recorded):
    """The same findings, bytes within 1 %, and the known leak with its exact bytes.

    Two recorders on one run do not see the same events: each loses some when its ring
    buffer is full, and the kernel skips some frees for each (its recursion guard): meta.json's
    `lost` and `missed` came to 229 and 213 in one ten-minute run here, before the ring
    buffer's consumer was mended (2026-12-06), and to 0 and 0 in one since. A lost free leaves
    its allocation held in that recording only, a lost allocation leaves it out: a finding
    one recording has alone, or one whose count differs (5 sockets' inodes held against 4),
    is explained by those events. So the allocations one recording holds beyond the other's,
    over every finding, are at most the events the two did not see; where the counts agree,
    the bytes agree within 1 %. The known leak, 600 allocations, comes out exact in both."""
    full, folded, last = twice_recorded
    whole, part = _findings(full), _findings(folded)
    unseen = _unseen(full) + _unseen(folded)
    differing = {key: (whole.get(key, {}).get("live_count", 0), part.get(key, {}).get("live_count", 0))
                 for key in set(whole) | set(part)}
    excess = sum(abs(mine - theirs) for mine, theirs in differing.values())
    assert excess <= unseen, (unseen, {key: counts for key, counts in differing.items() if counts[0] != counts[1]})
    for key in set(whole) & set(part):
        if whole[key]["live_count"] == part[key]["live_count"]:
            assert part[key]["live_bytes"] == pytest.approx(whole[key]["live_bytes"], rel=0.01), key
    kept_bytes = int(last.split("kept_bytes=")[1].split()[0])
    for findings, other in ((whole, part), (part, whole)):
        torch_leaks = [f for key, f in findings.items() if key[0] == "torch_cpu" and key in other]
        assert [f["live_bytes"] for f in torch_leaks] == [kept_bytes], (kept_bytes, list(findings))


def test_each_layer_s_allocations_agree_and_torch_s_peak_too(twice_recorded):
    """Allocations per layer within 1 %; torch_cpu's peak and end within 1 %. The kernel
    layers' peaks are left out: kernel_slab's peak here is some 50 KB, which one free that
    one recorder lost or the kernel skipped for it, and not for the other, moves by more
    than 1 %."""
    full, folded, _ = twice_recorded
    whole = {layer["layer"]: layer for layer in report("layers", full)["layers"]}
    part = {layer["layer"]: layer for layer in report("layers", folded)["layers"]}
    assert set(part) == set(whole)
    for name, layer in whole.items():
        assert part[name]["alloc_count"] == pytest.approx(layer["alloc_count"], rel=0.01), name
    for key in ("peak_bytes", "final_bytes"):
        assert part["torch_cpu"][key] == pytest.approx(whole["torch_cpu"][key], rel=0.01), key


def test_a_limit_too_small_to_fold_is_refused_with_one_line(tmp_path):
    result = subprocess.run(memprof("record", "--max-size", "1MiB", "--", "true"), capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "below the smallest limit, 16MiB" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())

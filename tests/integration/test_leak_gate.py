"""The leak gate, `memprof check --fail-on-leak`, on real recordings (issue 20 points 2, 14).

A torch program that keeps nothing passes: what `import torch` opens and keeps until exit
(files of the libraries it loads, threads it starts) is start-up, memprof's own agent is
memprof's. The known leaky examples fail. An attached program without step marks has its
growth judged, and labelled, per time window.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL_LEAK = REPO / "examples" / "bin" / "kernel_leak"
TORCH_LEAK = REPO / "examples" / "torch_leak.py"
TRAIN = REPO / "examples" / "train.py"
KEEPS_NOTHING = "import torch; x = torch.randn(100, 100); print(x.sum())"

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not importable")


def recorded(run_memprof, recording: Path, *command) -> Path:
    result = run_memprof("record", "-q", "-o", recording, "--", *command, cwd=recording.parent, timeout=120)
    assert result.returncode == 0, result.stderr
    return recording


def gate(run_memprof, recording: Path) -> subprocess.CompletedProcess:
    return run_memprof("check", recording, "--fail-on-leak", cwd=recording.parent)


def python_functions(finding: dict) -> list[str]:
    return [frame["function"] for frame in finding["stack"] if frame["kind"] == "python"]


def described(findings: list[dict]) -> str:
    return "\n".join(f"  {f['layer']} {f['kind']}/{f['reason']} {f['live_bytes']} B "
                     f"{[frame['function'] for frame in f['stack']][:10]}" for f in findings[:12])


@needs_torch
def test_the_gate_passes_a_torch_program_that_keeps_nothing(tmp_path, run_memprof, leaks_json):
    """Before: 'FAIL leak kernel_slab 21.1 KiB in 83 findings held at the end', all of them
    what `import torch` opened and kept until exit."""
    recording = recorded(run_memprof, tmp_path / "clean.memprof", sys.executable, "-c", KEEPS_NOTHING)
    result = gate(run_memprof, recording)
    report = leaks_json(recording, "--top", "10000")
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{described(report['findings'])}"
    assert result.stdout.strip() == "ok: 1 budget met"
    assert report["findings"] == []
    reasons = {f["reason"] for f in report["not_leaks"]}
    assert "startup" in reasons, reasons
    # The one thread `import torch` starts is started 0.72-0.79 s before the process's
    # exit here (4 recordings; 1.3-1.7 s with both CPUs busy), and the report judges only
    # what is older than --min-age (500 ms): a faster run leaves its objects "in flight",
    # unjudged (once in a full local run, 2026-12-07: no "threads" reason at all). So
    # whether they are judged is timing; what is asked is that, judged, they are a
    # thread's, never a leak or start-up's.
    threads = [f for f in report["not_leaks"] if "copy_process" in [frame["function"] for frame in f["stack"]]]
    assert {f["reason"] for f in threads} <= {"threads", "memprof_own"}, described(threads)
    startup = [f for f in report["not_leaks"] if f["reason"] == "startup"]
    assert any("_find_and_load" in python_functions(f) for f in startup), described(startup)
    summary = run_memprof("report", recording, cwd=tmp_path)
    assert summary.returncode == 0 and "No leaks found" in summary.stdout, summary.stdout


@needs_torch
def test_the_gate_passes_the_training_control_and_memprofs_agent_is_its_own(tmp_path, run_memprof, leaks_json):
    """train.py (torch_leak.py without the leak): nothing fails. The agent's flusher thread
    (`_start_flusher`) was one of its findings; now it is memprof's own, as is everything
    the agent does itself."""
    recording = recorded(run_memprof, tmp_path / "train.memprof", sys.executable, TRAIN, "--steps", "20")
    result = gate(run_memprof, recording)
    report = leaks_json(recording, "--top", "10000")
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{described(report['findings'])}"
    agents = [f for f in report["findings"] + report["not_leaks"] if "_start_flusher" in python_functions(f)]
    assert agents and {f["reason"] for f in agents} == {"memprof_own"}, described(agents)
    assert not [f for f in report["findings"] if any("agent/boot/" in (frame["file"] or "") for frame in f["stack"])]


@pytest.mark.parametrize("command, layer", [
    pytest.param((KERNEL_LEAK,), "kernel_slab", id="kernel_leak"),
    pytest.param((sys.executable, TORCH_LEAK, "--steps", "20"), "torch_cpu", id="torch_leak",
                 marks=needs_torch),
])
def test_the_gate_fails_the_known_leaks(tmp_path, run_memprof, command, layer):
    recording = recorded(run_memprof, tmp_path / "leak.memprof", *command)
    result = gate(run_memprof, recording)
    assert result.returncode == 6, f"{result.stdout}{result.stderr}"
    assert f"FAIL leak {layer} " in result.stdout, result.stdout


LEAKS_A_PIPE_EVERY_50_MS = """
import os, sys, time
print("pid", os.getpid(), flush=True)
held = []
for _ in range(1200):
    held.append(os.pipe())
    time.sleep(0.05)
"""


def test_an_attached_program_without_steps_grows_per_window(tmp_path, run_memprof):
    """`record --pid` of a Python program without the agent, stopped while it runs: growth is
    judged over time windows and said so ('grows per window', not 'per step'), and no time is
    shown before the recording's start as a negative offset."""
    script = tmp_path / "leaky.py"
    script.write_text(LEAKS_A_PIPE_EVERY_50_MS)
    target = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().startswith("pid")
        time.sleep(0.5)  # some pipes made before the recording begins
        recording = tmp_path / "attached.memprof"
        result = run_memprof("record", "-q", "-o", recording, "--pid", target.pid, "--duration", "3",
                             cwd=tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr
    finally:
        target.kill()
        target.wait()
        target.stdout.close()
    text = run_memprof("report", "leaks", recording, "--top", "1000", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    report = json.loads(run_memprof("report", "leaks", recording, "--format", "json", "--top", "1000",
                                    cwd=tmp_path).stdout)
    assert report["checkpoints"]["by"] == "window", report["checkpoints"]
    pipes = [f for f in report["findings"] if "alloc_pipe_info" in [frame["function"] for frame in f["stack"]]]
    assert pipes and pipes[0]["kind"] == "grows_per_step", described(report["findings"])
    assert "grows per window" in text.stdout and "per step" not in text.stdout, text.stdout
    assert " seen -" not in text.stdout, text.stdout

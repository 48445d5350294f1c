"""`memprof record --kernel-sample-bytes N` on the known kernel workloads, real eBPF: each
kernel allocation of S bytes is recorded with probability min(1, S/N) and weighted N/S, so
the known leak comes out as an estimate near its true size, its frees pair with it, and the
control, which keeps nothing, still reports nothing.

The bounds are statistical, and wide: at 4 KiB, each of kernel_leak's 257 held 1 KiB
pipe_buffer arrays is recorded with probability 1/4, so the estimate 4k (k recorded) has a
standard deviation of 11 % of 257; ±50 % is 4.6 of them (a false failure about once in
200,000 runs).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memprof.recording.reader import open_recording
from test_kernel import KERNEL_CHURN, KERNEL_LEAK, KIB, PIPE_BUFFER_ARRAY_BYTES, describe, functions, merged

pytestmark = pytest.mark.integration

HELD_PIPES = 257
KERNEL_LAYERS = ["kernel_slab", "kernel_page"]


def kernel_allocations(recording: Path):
    """The recording's kernel allocation rows (events table)."""
    events = open_recording(recording).events
    return events[events["layer"].isin(KERNEL_LAYERS).to_numpy() & (events["action"] == "alloc").to_numpy()]


def test_a_sampled_recording_estimates_the_known_kernel_leak_from_a_fraction_of_its_allocations(
        tmp_path, run_memprof, leaks_json):
    recording = tmp_path / "leak.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--kernel-sample-bytes", "4KiB", "--", KERNEL_LEAK,
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"held={HELD_PIPES} " in result.stdout

    detail = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]
    assert detail["kernel_sample_bytes"] == 4096 and detail["sampled_kernel_left_out"] == 0
    allocations = kernel_allocations(recording)
    weight = allocations["weight"].to_numpy()
    sizes = allocations["size_bytes"].to_numpy()
    # Every row smaller than N stands for N/S allocations, a row of N or more for itself.
    small = sizes < 4096
    assert (weight[small] == 4096 / sizes[small]).all() and (weight[~small] == 1).all()
    assert len(allocations) < 0.5 * weight.sum(), "sampling kept most allocations"

    report = leaks_json(recording, "--layer", "kernel_slab", "--top", "1000")
    findings = merged(report["findings"])
    arrays = [f for f in findings if "alloc_pipe_info" in functions(f, "kernel")
              and f["live_bytes"] >= PIPE_BUFFER_ARRAY_BYTES * f["live_count"] * 0.99]
    context = describe(findings)
    assert arrays, f"no finding of the pipes' buffer arrays:\n{context}"
    top = max(arrays, key=lambda f: f["live_bytes"])
    assert abs(top["live_count"] - HELD_PIPES) <= 0.5 * HELD_PIPES, context
    assert top["live_bytes"] == pytest.approx(top["live_count"] * PIPE_BUFFER_ARRAY_BYTES, rel=0.01), context
    assert "leak_and_churn" in functions(top, "native") and top["released_at_exit"] is True, context
    sampling = [n for n in report["notes"] if "kernel_slab and kernel_page are sampled by size" in str(n)]
    assert sampling and "min(1, S/4.0 KiB)" in str(sampling[0]), report["notes"]


def test_a_sampled_recording_of_the_control_pairs_its_frees_and_reports_no_leak(tmp_path, run_memprof, leaks_json):
    """kernel_churn 20000 keeps nothing. Sampled at 64 KiB, a recorded 64-byte object stands
    for 1,024: had the frees of sampled allocations gone unrecorded (the probes' own table,
    sampled_live, is what recognises them), thousands of them would weigh megabytes, where a
    pipe kept per iteration would be more than 20 MiB. What the process's address space holds
    at its exit (tens of KiB, exact) may come out a few times larger or not at all, sampled."""
    recording = tmp_path / "churn.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--kernel-sample-bytes", "64KiB", "--", KERNEL_CHURN,
                         "20000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "iterations=20000" in result.stdout

    events = open_recording(recording).events
    slab = events[(events["layer"] == "kernel_slab").to_numpy()]
    allocated, freed = (int((slab["action"] == action).sum()) for action in ("alloc", "free"))
    assert allocated > 1000, "too few sampled allocations to test their frees"
    assert freed >= 0.9 * allocated, f"{allocated} sampled slab allocations, only {freed} frees"
    assert freed <= 1.1 * allocated, f"{allocated} sampled slab allocations, {freed} frees: unsampled frees kept"

    report = leaks_json(recording, "--top", "100000")
    findings = report["findings"]
    context = describe(findings)
    assert sum(f["live_bytes"] for f in findings) < 4 * 1024 * KIB, context
    named = [f for f in findings if any("pipe" in fn or "sock" in fn for fn in functions(f))
             and "allocate_slab" not in functions(f, "kernel")]
    assert sum(f["live_bytes"] for f in named) < 1024 * KIB, context

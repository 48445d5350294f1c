"""Advice rule `dataloader-copy-on-read` on synthetic recordings with known answers: two
DataLoader workers (forked from the root, pid 100) whose own PSS (the samplers' `pss_bytes` on
device "pid:N") grows 4 MiB and 2 MiB a second for 9 s while their heap churns flat, under
`RowsDataset.__getitem__`; and the controls that must give no advice: PSS flat (numpy), the
growth being the workers' own allocations, a jump that is no trend, no per-process samples,
forked processes that are no DataLoader worker when the libc heap was not recorded, an exec'd
tool.
tests/integration/test_advice_dataloader_workers.py records the real thing."""
from __future__ import annotations

import pytest

from memprof.analysis.advice import dataloader
from memprof.analysis.advice.dataloader import MAX_HEAP_SHARE, MIN_GROWTH, RULE
from memprof.api import analyse
from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import ev
from tests.gpu_factories import MiB, S, _arrow, samples_frame, step_marks, timeline_of

ROOT, W1, W2 = 100, 201, 202
PYTHON = "/usr/bin/python3.11"
GETITEM_STACK = 5
BASE = 100 * MiB
SECONDS = range(1, 11)  # PSS sampled at 1 s … 10 s


def processes(*rows) -> list[dict]:
    """The root and the two workers (forked: the root's exe), plus `rows` (pid, ppid, comm, exe)."""
    base = [(ROOT, None, "python", PYTHON), (W1, ROOT, "pt_data_worker", PYTHON), (W2, ROOT, "pt_data_worker", PYTHON)]
    return [{"pid": p, "ppid": pp, "comm": c, "exe": e, "start_ns": 0, "exit_ns": None} for p, pp, c, e in base + list(rows)]


def pss_rows(pid: int, per_second: float, base: float = BASE) -> list[tuple]:
    return [(t * S, "pss_bytes", f"pid:{pid}", base + per_second * (t - 1)) for t in SECONDS]


def tree_rows() -> list[tuple]:
    return [(t * S, "pss_bytes", "cpu", 3 * BASE) for t in SECONDS] + [(t * S, "rss_bytes", f"pid:{ROOT}", BASE)
                                                                         for t in SECONDS]


def churn(pid: int, layer: str = "torch_cpu", kept_per_second: int = 0, stack: int = GETITEM_STACK) -> list[dict]:
    """Per 100 ms of 0.5 s … 10.5 s, a 64 KiB tensor made and freed under `stack` (default:
    __getitem__ in torch's worker loop); plus
    `kept_per_second` bytes a second allocated and never freed (a heap that grows)."""
    rows = []
    for i in range(5, 106):
        t = i * S // 10
        addr = 0x100_0000 + pid * 0x1_0000
        rows += [ev(t, "alloc", addr, 64 << 10, stack, layer=layer, pid=pid, tid=pid),
                 ev(t + S // 20, "free", addr, layer=layer, pid=pid, tid=pid)]
    if kept_per_second:
        rows += [ev(t * S + S // 2, "alloc", 0x900_0000 + pid * 0x10_0000 + t * 0x1000, kept_per_second, 6,
                    layer=layer, pid=pid, tid=pid) for t in range(0, 11)]
    return rows


def steps() -> list[dict]:
    """Step marks every 0.5 s from 0.5 s to 11 s: 19 of them within 1 s … 10 s."""
    return step_marks(range(1, 23), every_ns=S // 2, pid=ROOT)


def record(tmp_path, rows, samples, procs=None, name="r.memprof"):
    path = tmp_path / name
    events = timeline_of(rows)
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], start_ns=0,
                                                 pid=ROOT, processes=processes() if procs is None else procs))
    writer.append("events", {name: _arrow(events[name]) for name in events.columns})
    writer.append("stacks", {"stack_id": [GETITEM_STACK] * 3 + [6], "depth": [0, 1, 2, 0], "frame_id": [1, 2, 4, 3]})
    writer.append("frames", {"frame_id": [1, 2, 3, 4], "kind": ["python"] * 4,
                             "function": ["RowsDataset.__getitem__", "_MapDatasetFetcher.fetch", "Cache.keep",
                                          "_worker_loop"],
                             "module": [None] * 4,
                             "file": ["/src/data.py", "/torch/utils/data/_utils/fetch.py", "/src/cache.py",
                                      "/torch/utils/data/_utils/worker.py"],
                             "line": [12, 52, 7, 300]})
    if len(samples):
        writer.append("samples", {name: samples[name].to_numpy() for name in samples.columns})
    writer.finalize(end_ns=12 * S)
    return analyse(path)


def trigger_rows(layer="torch_cpu"):
    return steps() + churn(W1, layer) + churn(W2, layer) + churn(ROOT, layer)


def trigger_samples():
    return samples_frame(pss_rows(W1, 4 * MiB) + pss_rows(W2, 2 * MiB) + pss_rows(ROOT, 1 * MiB) + tree_rows())


def test_workers_whose_pss_grows_on_a_flat_heap_are_copying_on_read(tmp_path):
    verdict = dataloader.check(record(tmp_path, trigger_rows(), trigger_samples()))
    (advice,) = verdict.advice
    assert advice.rule == RULE.id == "dataloader-copy-on-read"
    # 9 s of samples: 36 MiB and 18 MiB; the root (not a worker) is left out.
    assert advice.saving_bytes == 54 * MiB
    assert advice.title == "DataLoader workers copy the dataset on read: +54.0 MiB of PSS, their heap flat"
    numbers = advice.numbers
    assert [w["pid"] for w in numbers["workers"]] == [W1, W2]
    first, second = numbers["workers"]
    assert first["pss_growth_bytes"] == 36 * MiB and second["pss_growth_bytes"] == 18 * MiB
    assert first["pss_bytes_per_second"] == pytest.approx(4 * MiB) and first["r2"] == pytest.approx(1.0)
    assert first["pss_first_bytes"] == BASE and first["pss_last_bytes"] == BASE + 36 * MiB
    assert first["seconds"] == 9.0 and first["samples"] == 10
    assert (first["first_ts_ns"], first["last_ts_ns"]) == (1 * S, 10 * S)
    # The churn (alloc at t, free at t + 50 ms) is live at neither 1 s nor 10 s: flat, 0.
    assert first["heap_growth_bytes"] == 0 and numbers["heap_layer"] == "torch_cpu"
    assert numbers["steps"] == 19 and numbers["pss_growth_bytes_per_step"] == pytest.approx(54 * MiB / 19)
    assert numbers["getitem"] == "RowsDataset.__getitem__" and numbers["getitem_line"] == "/src/data.py:12"
    assert advice.chains == (GETITEM_STACK,)
    assert advice.evidence[0] == ("pid 201 (pt_data_worker): PSS 100.0 MiB → 136.0 MiB (+36.0 MiB in 9.0 s, "
                                  "4.0 MiB/s, R² 1.00, 1.9 MiB per step over 19 steps), while its torch_cpu grew 0 B.")
    assert "RowsDataset.__getitem__ (/src/data.py:12)" in advice.evidence[3]
    assert "--sources +native" in advice.evidence[4]  # only the torch heap was compared
    assert advice.change.startswith("keep RowsDataset's items in numpy or Arrow arrays")


def test_a_sample_taken_before_the_last_sibling_fork_is_not_the_first(tmp_path):
    """W2 is forked at 1.5 s, after W1's first sample: until then W1 shared its parent's pages
    with one process fewer, and that sample read 20 MiB over its curve (seen on CI: 14 MB). W1
    is judged from its 2 s sample, so its growth is the curve's, 32 MiB over 8 s, not 16 MiB."""
    procs = processes()
    procs[2]["start_ns"] = int(1.5 * S)
    samples = pss_rows(W1, 4 * MiB)
    samples[0] = (1 * S, "pss_bytes", f"pid:{W1}", BASE + 20 * MiB)
    verdict = dataloader.check(record(tmp_path, trigger_rows(), samples_frame(samples + pss_rows(W2, 2 * MiB)[1:]
                                                                             + tree_rows()), procs))
    first, second = verdict.advice[0].numbers["workers"]
    assert (first["pid"], first["first_ts_ns"], first["samples"]) == (W1, 2 * S, 9)
    assert first["pss_first_bytes"] == BASE + 4 * MiB and first["pss_growth_bytes"] == 32 * MiB
    assert (second["first_ts_ns"], second["samples"]) == (2 * S, 9)  # sampled from 2 s, after its fork


def test_the_next_epochs_workers_do_not_cut_an_earlier_one(tmp_path):
    """A worker forked after W1's last sample (the next epoch's) leaves W1's samples whole."""
    procs = processes((W2 + 1, ROOT, "pt_data_worker", PYTHON))
    procs[-1]["start_ns"] = 11 * S
    verdict = dataloader.check(record(tmp_path, trigger_rows(), trigger_samples(), procs))
    first = verdict.advice[0].numbers["workers"][0]
    assert (first["first_ts_ns"], first["samples"], first["pss_growth_bytes"]) == (1 * S, 10, 36 * MiB)


def test_with_the_libc_heap_recorded_any_forked_process_is_judged_on_it(tmp_path):
    procs = processes((W2 + 1, ROOT, "python", PYTHON))
    rows = steps() + churn(W1, "native_heap") + churn(W2 + 1, "native_heap")
    samples = samples_frame(pss_rows(W1, 4 * MiB) + pss_rows(W2 + 1, 3 * MiB) + tree_rows())
    (advice,) = dataloader.check(record(tmp_path, rows, samples, procs)).advice
    assert advice.numbers["heap_layer"] == "native_heap"
    assert [w["pid"] for w in advice.numbers["workers"]] == [W1, W2 + 1]
    assert advice.saving_bytes == 63 * MiB
    assert advice.title.startswith("forked worker processes copy the dataset on read")
    assert not any("--sources +native" in line for line in advice.evidence)


# ---- controls: no advice -----------------------------------------------------------------------

def test_flat_pss_gives_no_advice(tmp_path):
    """The numpy dataset: each worker's PSS moves by a page or two."""
    samples = samples_frame(pss_rows(W1, 40 << 10) + pss_rows(W2, 0) + tree_rows())
    verdict = dataloader.check(record(tmp_path, trigger_rows(), samples))
    assert verdict.advice == ()
    assert verdict.why_not == (f"pid {W1}: PSS grew 360.0 KiB (< 16.0 MiB); pid {W2}: PSS grew 0 B (< 16.0 MiB)")


def test_pss_that_is_the_workers_own_allocations_gives_no_advice(tmp_path):
    """The same PSS growth, with each worker keeping 4 MiB a second on its heap: it caches, it
    does not copy."""
    rows = steps() + churn(W1, kept_per_second=4 * MiB) + churn(W2, kept_per_second=4 * MiB)
    verdict = dataloader.check(record(tmp_path, rows, trigger_samples()))
    assert verdict.advice == ()
    assert verdict.why_not.startswith(f"pid {W1}: its torch_cpu grew 36.0 MiB of its 36.0 MiB PSS growth "
                                      f"(> {MAX_HEAP_SHARE.value:.0%}): its own allocations")


def test_a_jump_that_is_no_trend_gives_no_advice(tmp_path):
    """PSS up 40 MiB between the first two samples, then flat: it rose once in 9 intervals."""
    jump = [(t * S, "pss_bytes", f"pid:{pid}", BASE + (40 * MiB if t > 1 else 0)) for pid in (W1, W2) for t in SECONDS]
    verdict = dataloader.check(record(tmp_path, trigger_rows(), samples_frame(jump + tree_rows())))
    assert verdict.advice == ()
    assert f"pid {W1}: PSS rose in 1 of 9 intervals (< 70%): no steady growth" in verdict.why_not


def test_without_per_process_samples_there_is_no_advice(tmp_path):
    verdict = dataloader.check(record(tmp_path, trigger_rows(), samples_frame(tree_rows()[:10])))
    assert verdict.advice == () and verdict.why_not.startswith("no per-process PSS samples")


def test_a_worker_the_process_table_named_python_is_known_by_its_worker_loop(tmp_path):
    """The process table read the comm before torch renamed the worker: its allocations under
    torch's _worker_loop tell it."""
    procs = [p | {"comm": "python"} if p["pid"] == W2 else p for p in processes()]
    (advice,) = dataloader.check(record(tmp_path, trigger_rows(), trigger_samples(), procs)).advice
    assert [(w["pid"], w["comm"]) for w in advice.numbers["workers"]] == [(W1, "pt_data_worker"), (W2, "pt_data_worker")]
    assert advice.saving_bytes == 54 * MiB


def test_forked_processes_torch_did_not_name_need_the_libc_heap(tmp_path):
    procs = processes((W2 + 1, ROOT, "python", PYTHON))
    samples = samples_frame(pss_rows(W2 + 1, 4 * MiB) + tree_rows())
    verdict = dataloader.check(record(tmp_path, trigger_rows() + churn(W2 + 1, stack=6), samples, procs))
    assert verdict.advice == () and "--sources +native" in verdict.why_not


def test_an_execd_tool_is_no_worker(tmp_path):
    procs = processes((W2 + 1, ROOT, "cc1", "/usr/lib/gcc/cc1"))
    samples = samples_frame(pss_rows(W2 + 1, 4 * MiB) + tree_rows())
    verdict = dataloader.check(record(tmp_path, steps() + churn(W2 + 1, "native_heap"), samples, procs))
    assert verdict.advice == () and verdict.why_not == "no forked worker process has PSS samples"


def test_the_entry_names_its_thresholds():
    assert {t.name for t in RULE.thresholds} == {"MIN_WORKER_PSS_GROWTH", "MIN_RISING_SHARE", "MAX_HEAP_SHARE",
                                                 "MIN_PSS_SAMPLES"}
    assert MIN_GROWTH.value == 16 * MiB

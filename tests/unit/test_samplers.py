"""Samplers: RSS of real processes (this one and short-lived children), NVML through a
stand-in `pynvml` module (no GPU needed), and the Samplers schedule and status.

Measured on the development VM (2 vCPUs, Linux 6.18), 10 pids, per tick: RSS-only ticks
~70 µs median; ticks that also read PSS (smaps_rollup) ~1.3 ms for ten 10 MiB Python
processes and ~11 ms when one of them holds 1 GiB — hence PSS at most about once a second.
"""
from __future__ import annotations

import gc
import mmap
import os
import statistics
import subprocess
import sys
import time
import types

import pytest

from memprof.model.schema import SAMPLES_SCHEMA
from memprof import nvidia_driver
from memprof.sources import samplers
from memprof.sources.samplers import NvmlSampler, RssSampler, Samplers

MiB = 1 << 20
S = 1_000_000_000


def values(rows: dict[str, list]) -> dict[tuple[str, str], float]:
    return {(m, d): v for m, d, v in zip(rows["metric"], rows["device"], rows["value"])}


def total_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def meminfo_total() -> int:
    with open("/proc/meminfo") as f:
        (line,) = [line for line in f if line.startswith("MemTotal:")]
    return int(line.split()[1]) * 1024


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# -- RSS ------------------------------------------------------------------------------------


def test_rss_of_this_process_is_sane_and_rows_match_the_schema():
    rows = RssSampler().sample([os.getpid()], 123)
    assert set(rows) == set(SAMPLES_SCHEMA.names)
    assert rows["ts_ns"] == [123] * 3 and rows["device"] == ["cpu"] * 3
    got = values(rows)
    assert 1 * MiB < got[("rss_bytes", "cpu")] < total_ram()
    assert got[("host_memory_total_bytes", "cpu")] == meminfo_total()
    assert 0 < got[("pss_bytes", "cpu")] <= got[("rss_bytes", "cpu")] * 1.05  # read a moment apart
    assert all(isinstance(v, float) for v in rows["value"])


def test_rss_grows_with_touched_memory():
    sampler = RssSampler(pss_period_s=0, pss_cpu_share=1)
    # A collection between the two samples could free (and unmap) earlier tests' garbage.
    gc.collect()
    gc.disable()
    try:
        before = values(sampler.sample([os.getpid()], 1))
        # Fresh pages from the kernel (a bytearray may reuse heap memory an earlier test
        # already touched, and then RSS does not move).
        block = mmap.mmap(-1, 64 * MiB)
        block[::4096] = b"\x01" * (len(block) // 4096)  # touch every page
        after = values(sampler.sample([os.getpid()], 2))
    finally:
        gc.enable()
    assert after[("rss_bytes", "cpu")] - before[("rss_bytes", "cpu")] >= 60 * MiB
    # Pss may also lose some of its shared part meanwhile, when another process maps the same
    # files (a parallel test run loading the same libraries); the 64 MiB are private.
    assert after[("pss_bytes", "cpu")] >= 60 * MiB and after[("pss_bytes", "cpu")] > before[("pss_bytes", "cpu")]
    block.close()


def test_vanished_pid_is_skipped_and_no_live_pid_gives_no_rows():
    gone = dead_pid()
    sampler = RssSampler(pss_period_s=0, pss_cpu_share=1)
    assert sampler.sample([gone], 1) == {"ts_ns": [], "metric": [], "device": [], "value": []}
    rows = sampler.sample([os.getpid(), gone], 2)
    # The machine's RAM comes with the first tick that has rows, not the empty one before.
    assert rows["metric"] == ["rss_bytes", "pss_bytes", "host_memory_total_bytes"]


def test_zombie_pid_is_skipped():
    child = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # exited, not yet reaped
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert RssSampler().sample([child.pid], 1)["metric"] == []
    finally:
        child.wait()


def test_each_process_gets_its_own_rss_and_pss_when_the_tree_has_several():
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(32 << 20); import time; time.sleep(30)"],
                             stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and RssSampler().sample([child.pid], 0)["value"][0] < 32 * MiB:
            time.sleep(0.05)
        sampler = RssSampler(pss_period_s=1.0, pss_cpu_share=1)
        rows = sampler.sample([os.getpid(), child.pid], 0)
        got = values(rows)
        mine, its = f"pid:{os.getpid()}", f"pid:{child.pid}"
        assert {d for d in rows["device"] if d != "cpu"} == {mine, its}
        assert got[("pss_bytes", its)] >= 30 * MiB and got[("rss_bytes", its)] >= got[("pss_bytes", its)]
        # The tree's Pss is the processes' own, summed (one smaps_rollup read each).
        assert got[("pss_bytes", "cpu")] == got[("pss_bytes", mine)] + got[("pss_bytes", its)]
        assert sampler.sample([os.getpid(), child.pid], S // 2)["device"] == ["cpu"]  # only with Pss
    finally:
        child.kill()
        child.wait()
    # One process: its own rows would repeat the tree's.
    assert RssSampler().sample([os.getpid()], 0)["device"] == ["cpu"] * 3


def test_a_thread_of_a_process_is_not_counted_again():
    # The recorder's tree lists threads by their task ids; /proc/TID/statm reads the process.
    import threading
    started, stop = threading.Event(), threading.Event()
    tids = []

    def run():
        tids.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        started.wait(10)
        sampler = RssSampler(pss_period_s=0, pss_cpu_share=1)
        alone = values(sampler.sample([os.getpid()], 0))
        both = sampler.sample([os.getpid(), tids[0]], 1)
        assert both["device"] == ["cpu", "cpu"]  # one process: no per-process rows
        assert values(both)[("rss_bytes", "cpu")] < 1.5 * alone[("rss_bytes", "cpu")]
    finally:
        stop.set()
        thread.join()


def test_pss_is_paced_and_rss_comes_every_tick():
    sampler = RssSampler(pss_period_s=1.0, pss_cpu_share=1)  # share 1: the period alone decides
    metrics = [sampler.sample([os.getpid()], t)["metric"] for t in (0, S // 10, S // 2, S, S + S // 10)]
    assert metrics == [["rss_bytes", "pss_bytes", "host_memory_total_bytes"], ["rss_bytes"], ["rss_bytes"],
                       ["rss_bytes", "pss_bytes"], ["rss_bytes"]]


def test_pss_backs_off_when_reading_it_is_costly():
    # A read costs some µs; a share of 1e-9 makes the next one due ~days later.
    sampler = RssSampler(pss_period_s=0, pss_cpu_share=1e-9)
    metrics = [sampler.sample([os.getpid()], t)["metric"] for t in (0, S, 100 * S)]
    assert metrics == [["rss_bytes", "pss_bytes", "host_memory_total_bytes"], ["rss_bytes"], ["rss_bytes"]]


def test_rss_tick_cost_for_ten_pids():
    children = [subprocess.Popen(["sleep", "30"]) for _ in range(9)]
    try:
        pids = [os.getpid()] + [c.pid for c in children]
        sampler = RssSampler(pss_period_s=1e6)
        sampler.sample(pids, 0)  # the first tick also reads PSS
        costs = []
        for i in range(200):
            started = time.perf_counter_ns()
            rows = sampler.sample(pids, i + 1)
            costs.append(time.perf_counter_ns() - started)
        assert rows["metric"] == ["rss_bytes"]
        # ~70 µs measured; the bound leaves room for a loaded CI machine.
        assert statistics.median(costs) < 1_000_000
    finally:
        for child in children:
            child.kill()
            child.wait()


# -- NVML through a stand-in pynvml module ---------------------------------------------------


class FakeNVMLError(Exception):
    pass


def fake_pynvml(*, init_error=None, processes_error=False, calls=None) -> types.ModuleType:
    """A stand-in for the real `pynvml` (nvidia-ml-py): two GPUs, the same function names."""
    calls = [] if calls is None else calls
    module = types.ModuleType("pynvml")
    memory = {0: (3 * MiB, 80 * 1024 * MiB), 1: (5 * MiB, 40 * 1024 * MiB)}
    processes = {
        0: [types.SimpleNamespace(pid=10, usedGpuMemory=100), types.SimpleNamespace(pid=11, usedGpuMemory=None),
            types.SimpleNamespace(pid=99, usedGpuMemory=7000), types.SimpleNamespace(pid=12, usedGpuMemory=20)],
        1: [],
    }

    def init():
        calls.append("init")
        if init_error:
            raise FakeNVMLError(init_error)

    def running(handle):
        if processes_error:
            raise FakeNVMLError("Not Supported")
        return processes[handle]

    module.NVMLError = FakeNVMLError
    module.nvmlInit = init
    module.nvmlShutdown = lambda: calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=memory[h][0], total=memory[h][1], free=memory[h][1] - memory[h][0])
    module.nvmlDeviceGetComputeRunningProcesses = running
    return module


REAL_DRIVER_CHECK = nvidia_driver.present


@pytest.fixture(autouse=True)
def nvidia_driver_present(monkeypatch):
    """The stand-in pynvml is asked on this GPU-less machine as if a driver were loaded."""
    monkeypatch.setattr(nvidia_driver, "present", lambda: True)


def test_without_a_driver_nvml_is_not_asked(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls=calls))
    monkeypatch.setattr(nvidia_driver, "SIGNS", ("/nonexistent/nvidia", "/nonexistent/nvidiactl"))
    monkeypatch.setattr(nvidia_driver, "present", REAL_DRIVER_CHECK)
    ok, why = NvmlSampler().available()
    assert not ok and why == "no NVIDIA driver (none of /nonexistent/nvidia, /nonexistent/nvidiactl exists)"
    assert calls == []  # no nvmlInit


def test_nvml_rows_from_stand_in(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls=calls))
    sampler = NvmlSampler()
    assert sampler.available() == (True, "2 GPUs")
    rows = sampler.sample([10, 11, 12, 13], 7)
    assert rows == {
        "ts_ns": [7] * 6,
        "metric": ["gpu_used_bytes", "gpu_total_bytes", "gpu_process_bytes"] * 2,
        "device": ["cuda:0"] * 3 + ["cuda:1"] * 3,
        "value": [3.0 * MiB, 80.0 * 1024 * MiB, 120.0, 5.0 * MiB, 40.0 * 1024 * MiB, 0.0],
    }
    sampler.close()
    sampler.close()
    assert calls == ["init", "shutdown"]


def test_nvml_process_query_not_supported_leaves_that_row_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(processes_error=True))
    rows = NvmlSampler().sample([10], 1)
    assert rows["metric"] == ["gpu_used_bytes", "gpu_total_bytes"] * 2


def test_nvml_unavailable_when_pynvml_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    sampler = NvmlSampler()
    ok, reason = sampler.available()
    assert not ok and reason.startswith("pynvml not installed")
    assert sampler.sample([1], 1)["metric"] == []


def test_nvml_unavailable_when_init_fails(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="Driver Not Loaded", calls=calls))
    assert NvmlSampler().available() == (False, "no NVIDIA driver (NVML init failed: Driver Not Loaded)")
    assert calls == ["init"]


# -- Samplers ----------------------------------------------------------------------------------


def test_samplers_merge_and_status(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    samplers = Samplers()
    rows = samplers.sample(iter([os.getpid()]), 5)
    assert rows["metric"][:3] == ["rss_bytes", "pss_bytes", "host_memory_total_bytes"]
    assert rows["metric"][3:] == ["gpu_used_bytes", "gpu_total_bytes", "gpu_process_bytes"] * 2
    assert samplers.status() == {
        "rss": {"enabled": True, "rate_hz": 10, "pss_period_s": 1.0, "pss_cpu_share": 0.02},
        "nvml": {"enabled": True, "rate_hz": 10, "devices": 2},
    }
    samplers.close()


def test_samplers_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    samplers = Samplers(period_s=0.5)
    assert samplers.sample([os.getpid()], 5)["metric"] == ["rss_bytes", "pss_bytes", "host_memory_total_bytes"]
    assert samplers.status()["nvml"] == {"enabled": False, "reason": "pynvml not installed (pip install nvidia-ml-py)"}
    assert samplers.status()["rss"]["rate_hz"] == 2


def test_nvml_failing_mid_recording_is_stopped_not_raised(monkeypatch):
    module = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    samplers = Samplers()
    samplers.sample([os.getpid()], 1)

    def lost(handle):
        raise FakeNVMLError("GPU is lost")

    module.nvmlDeviceGetMemoryInfo = lost
    assert samplers.sample([os.getpid()], 2)["metric"] == ["rss_bytes"]
    assert samplers.status()["nvml"] == {"enabled": True, "rate_hz": 10,
                                         "stopped": "NVML failed while sampling: GPU is lost"}
    assert samplers.sample([os.getpid()], 3)["metric"] == ["rss_bytes"]


def test_due_books_ticks_a_period_apart_without_catching_up():
    samplers = Samplers(rss=RssSampler(), nvml=NvmlSampler(), period_s=0.1)
    answers = [samplers.due(t) for t in (100.0, 100.05, 100.11, 100.15, 100.21)]
    assert answers == [True, False, True, False, True]
    assert samplers.due(105.0) is True   # late: one tick, not fifty
    assert samplers.due(105.05) is False
    assert samplers.due(105.1) is True


def test_period_must_be_positive():
    with pytest.raises(ValueError):
        Samplers(period_s=0)


def test_pynvml_is_installed_and_a_machine_without_a_driver_says_so():
    """nvidia-ml-py is a dependency (the brief names it), so the reason NVML is off here is
    the missing driver, never a missing package; recording goes on without GPU samples."""
    import pynvml  # noqa: F401 — installed with memprof
    ok, why = NvmlSampler().available()
    if ok:
        pytest.skip("this machine has an NVIDIA driver")
    assert why.startswith("no NVIDIA driver") and "pynvml not installed" not in why

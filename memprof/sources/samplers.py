"""Samplers: the recorder's pollers of procfs and NVML, feeding the `samples` table (DESIGN.md §3).

Each `sample(pids, ts_ns)` returns rows as columns — {"ts_ns": [...], "metric": [...],
"device": [...], "value": [...]} (SAMPLES_SCHEMA) — with `ts_ns` the CLOCK_MONOTONIC ns the
caller read for this tick (`time.monotonic_ns()`), so samples share the events' clock. Values
are bytes (metric names end in `_bytes`), as float64.

Metrics, one row per metric (and device) per tick, summed over the target's process tree:

- `rss_bytes` (device "cpu", every tick): resident memory, from /proc/PID/statm.
- `pss_bytes` (device "cpu", about once a second: see RssSampler): Pss of
  /proc/PID/smaps_rollup. Pss divides each shared page among the processes mapping it, so the
  tree's Pss is not inflated by pages its processes share (fork, shared libraries); its Rss is.
  (It also falls when an unrelated process starts mapping the same files.)
- `rss_bytes`, `pss_bytes` (device "pid:N", with each `pss_bytes` read, only while the tree
  has two processes or more): each process's own Rss and Pss, from the same smaps_rollup
  read, for at most PER_PROCESS_MAX processes (the largest by Pss). A forked worker's Pss
  that grows while its heap does not is copy-on-write of the pages it shares with its
  parent (analysis/advice/dataloader.py).
- `host_memory_total_bytes` (device "cpu", once: the first tick with a live process): the
  machine's RAM, MemTotal of /proc/meminfo — the capacity growth forecasts fill.
- `gpu_used_bytes`, `gpu_total_bytes` (device "cuda:I"): the whole GPU's memory, every
  process's (nvmlDeviceGetMemoryInfo).
- `gpu_process_bytes` (device "cuda:I"): the tree's processes' GPU memory
  (usedGpuMemory of nvmlDeviceGetComputeRunningProcesses).

"cuda:I" uses NVML's device index, which is PCI bus order. CUDA's own numbering (what torch
calls cuda:I) is the same only with CUDA_DEVICE_ORDER=PCI_BUS_ID and no CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import errno
import os
import time
from typing import Iterable

from memprof import nvidia_driver

SAMPLE_COLUMNS = ("ts_ns", "metric", "device", "value")
DEFAULT_PERIOD_S = 0.1

# The process has exited (ENOENT) or is a zombie whose memory is gone (ESRCH).
_VANISHED = (errno.ENOENT, errno.ESRCH)
_READ_SIZE = 4096  # smaps_rollup is ~1 KiB, statm ~40 bytes
# Per-process rows of a tick that reads Pss: at most this many processes (a build runs 10^5,
# some dozens at once); the ones with the most Pss are kept. Their device is PROCESS_DEVICE.
PER_PROCESS_MAX = 64
PROCESS_DEVICE = "pid:{}"


def empty_rows() -> dict[str, list]:
    return {name: [] for name in SAMPLE_COLUMNS}


def _append(rows: dict[str, list], ts_ns: int, metric: str, device: str, value: float) -> None:
    rows["ts_ns"].append(int(ts_ns))
    rows["metric"].append(metric)
    rows["device"].append(device)
    rows["value"].append(float(value))


def _extend(rows: dict[str, list], more: dict[str, list]) -> None:
    for name in SAMPLE_COLUMNS:
        rows[name].extend(more[name])


class RssSampler:
    """Resident memory of the process tree: `rss_bytes` every tick, `pss_bytes` less often,
    and with each `pss_bytes` every process's own Rss and Pss when there are several.

    `rss_bytes` comes from /proc/PID/statm (resident pages × page size): the kernel's RSS
    counters, read in O(1) — about 5 µs a process. Since Linux 6.2 those counters are per-CPU
    and statm may read them without the CPUs' pending deltas, so a value may be off by up to
    the counter batch (32 pages, or 2 × the CPU count if more) per CPU: fine for a trend.

    `pss_bytes` needs /proc/PID/smaps_rollup, for which the kernel walks the page tables
    under the process's mmap lock (each process's, whose per-process rows then cost nothing
    more): about 10 ms per GiB resident (measured: 110 µs for a
    10 MiB Python process, 10 ms for one holding 1 GiB), too slow for every tick of a large
    job. (A tree of five 50 MiB Python processes: ~1.3 ms a read, with or without the
    per-process rows.) It is read on the first tick, then no more often than every `pss_period_s` and
    never for more than `pss_cpu_share` of the time (a read that took 50 ms of CPU delays the
    next by 50 ms / pss_cpu_share). The cost is the sampler thread's CPU time (user and
    kernel), not the wall time: in the recorder the thread also waits for the GIL and for
    the mmap locks of processes busy faulting pages, which costs no CPU yet had stretched
    the waits to seconds (a recording of examples/dataloader_cow.py got 5 reads in 17 s). `pss_period_s=0, pss_cpu_share=1` reads it every tick.

    A pid that is a thread of another (the recorder's tree lists threads too) is skipped, as
    its process is counted once by its own pid. A pid that has exited (or is a zombie) is skipped; any other error (EACCES: another
    user's process without root) propagates. Times are the caller's CLOCK_MONOTONIC ns.
    """

    def __init__(self, *, pss_period_s: float = 1.0, pss_cpu_share: float = 0.02):
        if not 0 < pss_cpu_share <= 1 or pss_period_s < 0:
            raise ValueError("need 0 < pss_cpu_share <= 1 and pss_period_s >= 0")
        self.pss_period_s = float(pss_period_s)
        self.pss_cpu_share = float(pss_cpu_share)
        self._next_pss_ns: int | None = None
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._host_total_sent = False
        self._leaders: dict[int, bool] = {}

    def _leads_its_process(self, pid: int) -> bool:
        """Whether `pid` is a process (its thread group's leader), not another thread of one:
        the recorder's tree also lists the threads its processes start (each with its own
        task id), and /proc/TID/statm and smaps_rollup of a thread read its whole process,
        which would be counted again. Asked once per pid (/proc/PID/status)."""
        known = self._leaders.get(pid)
        if known is None:
            tgid = read_tgid(pid)
            if tgid is None:
                return False  # vanished: asked again if it is passed again
            known = self._leaders[pid] = tgid == pid
        return known

    def sample(self, pids: Iterable[int], ts_ns: int) -> dict[str, list]:
        """Row `rss_bytes` (device "cpu"), summed over the live `pids`, `pss_bytes` when due
        (class docstring), and `host_memory_total_bytes` on the first tick that has rows; no
        rows when none of the pids is alive."""
        pids = set(pids)
        rss_pages, alive = 0, []
        for pid in pids:
            if not self._leads_its_process(pid):
                continue
            pages = read_statm_resident(pid)
            if pages is not None:
                rss_pages += pages
                alive.append(pid)
            else:
                self._leaders.pop(pid, None)  # gone: its number may come back as another task
        rows = empty_rows()
        if not alive:
            return rows
        _append(rows, ts_ns, "rss_bytes", "cpu", rss_pages * self._page_size)
        if self._next_pss_ns is None or ts_ns >= self._next_pss_ns:
            usages = self._read_rollups(alive, ts_ns)
            if usages:
                _append(rows, ts_ns, "pss_bytes", "cpu", sum(pss for _, _, pss in usages) * 1024)
                if len(usages) > 1:
                    _append_per_process(rows, ts_ns, usages)
        if not self._host_total_sent:
            # The machine's RAM does not change while recording: one sample is enough.
            self._host_total_sent = True
            _append(rows, ts_ns, "host_memory_total_bytes", "cpu", read_meminfo_total_kb() * 1024)
        return rows

    def _read_rollups(self, pids: list[int], ts_ns: int) -> list[tuple[int, int, int]]:
        """(pid, Rss kB, Pss kB) of each pid still alive; books the next read."""
        started = time.thread_time_ns()
        usages = [(pid, *u) for pid, u in ((pid, read_rollup_kb(pid)) for pid in pids) if u is not None]
        cost_ns = time.thread_time_ns() - started
        wait_ns = max(self.pss_period_s * 1e9, cost_ns / self.pss_cpu_share - cost_ns)
        self._next_pss_ns = ts_ns + int(wait_ns)
        return usages


def _append_per_process(rows: dict[str, list], ts_ns: int, usages: list[tuple[int, int, int]]) -> None:
    """`rss_bytes` and `pss_bytes` of each process (device "pid:N"), pid order; the
    PER_PROCESS_MAX with the most Pss when there are more."""
    kept = sorted(usages, key=lambda u: -u[2])[:PER_PROCESS_MAX]
    for pid, rss_kb, pss_kb in sorted(kept):
        device = PROCESS_DEVICE.format(pid)
        _append(rows, ts_ns, "rss_bytes", device, rss_kb * 1024)
        _append(rows, ts_ns, "pss_bytes", device, pss_kb * 1024)


def read_statm_resident(pid: int) -> int | None:
    """Resident pages of `pid` (/proc/PID/statm, 2nd field), or None when it has vanished."""
    data = _read_proc(f"/proc/{pid}/statm")
    if not data:
        return None
    size, resident = data.split(None, 2)[:2]
    # A zombie (exited, not yet reaped) reads "0 0 0 …": its address space is gone.
    return None if size == b"0" else int(resident)


def read_tgid(pid: int) -> int | None:
    """The thread group (process) id of task `pid` (Tgid: of /proc/PID/status), or None
    when it has vanished."""
    data = _read_proc(f"/proc/{pid}/status")
    if not data:
        return None
    start = data.find(b"\nTgid:")
    return int(data[start + 6:data.index(b"\n", start + 6)]) if start >= 0 else pid


def read_meminfo_total_kb() -> int:
    """The machine's RAM in kB: MemTotal of /proc/meminfo (the first line, ~1.5 KiB file)."""
    with open("/proc/meminfo", "rb") as f:
        return _field_kb(b"\n" + f.read(_READ_SIZE), b"\nMemTotal:")


def read_rollup_kb(pid: int) -> tuple[int, int] | None:
    """(Rss, Pss) of `pid` in kB (/proc/PID/smaps_rollup), or None when it has vanished."""
    data = _read_proc(f"/proc/{pid}/smaps_rollup")
    if not data:
        return None
    return _field_kb(data, b"\nRss:"), _field_kb(data, b"\nPss:")


def _read_proc(path: str) -> bytes | None:
    """The file's first 4 KiB, or None when the process has exited (ENOENT) or is a zombie
    (ESRCH)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, _READ_SIZE)
        finally:
            os.close(fd)
    except OSError as error:
        if error.errno in _VANISHED:
            return None
        raise


def _field_kb(data: bytes, label: bytes) -> int:
    """The number after `label` ("\\nRss:      1700 kB"), 0 when absent."""
    start = data.find(label)
    if start < 0:
        return 0
    start += len(label)
    end = data.find(b"kB", start)
    return int(data[start:end])


class NvmlSampler:
    """GPU memory through NVML (`pynvml`, from the nvidia-ml-py package), imported lazily.

    `available()` initializes NVML on first call and caches the answer; `close()` shuts it
    down. In a container with its own pid namespace NVML may report host pids, which then
    match none of the tree's pids: `gpu_process_bytes` reads 0 while `gpu_used_bytes` grows.
    """

    def __init__(self) -> None:
        self._nvml = None
        self._handles: list = []
        self._answer: tuple[bool, str] | None = None

    def available(self) -> tuple[bool, str]:
        """(True, "N GPU(s)") or (False, why). Never raises."""
        if self._answer is None:
            try:
                self._answer = self._start()
            except Exception as error:  # noqa: BLE001 — the contract is "never raises"
                self._answer = (False, f"NVML failed: {error}")
        return self._answer

    def _start(self) -> tuple[bool, str]:
        if not nvidia_driver.present():  # pynvml's import alone is 38 ms of the recorder's CPU
            return False, nvidia_driver.absence()
        try:
            import pynvml
        except ImportError:
            return False, "pynvml not installed (pip install nvidia-ml-py)"
        try:
            pynvml.nvmlInit()
        except Exception as error:  # noqa: BLE001 — NVMLError, or OSError from a missing libnvidia-ml
            return False, f"no NVIDIA driver (NVML init failed: {error})"
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as error:  # noqa: BLE001
            _shutdown(pynvml)
            return False, f"NVML could not list the GPUs: {error}"
        if not handles:
            _shutdown(pynvml)
            return False, "NVML sees no GPU"
        self._nvml, self._handles = pynvml, handles
        return True, f"{len(handles)} GPU{'s' if len(handles) != 1 else ''}"

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def sample(self, pids: Iterable[int], ts_ns: int) -> dict[str, list]:
        """Per GPU: `gpu_used_bytes`, `gpu_total_bytes`, and `gpu_process_bytes` (the tree's
        share; left out for a GPU whose driver cannot list processes). No rows when NVML is
        unavailable. NVML errors reading memory propagate."""
        rows = empty_rows()
        if not self.available()[0]:
            return rows
        wanted = set(pids)
        for index, handle in enumerate(self._handles):
            device = f"cuda:{index}"
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            _append(rows, ts_ns, "gpu_used_bytes", device, memory.used)
            _append(rows, ts_ns, "gpu_total_bytes", device, memory.total)
            used = self._process_bytes(handle, wanted)
            if used is not None:
                _append(rows, ts_ns, "gpu_process_bytes", device, used)
        return rows

    def _process_bytes(self, handle, wanted: set[int]) -> int | None:
        """Sum of the wanted pids' usedGpuMemory (None values, WDDM's "not available", are
        skipped); None when the driver does not support the query."""
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self._nvml.NVMLError:
            return None
        return sum(p.usedGpuMemory for p in processes if p.pid in wanted and p.usedGpuMemory is not None)

    def close(self) -> None:
        """Shut NVML down if this sampler started it. Idempotent; never raises."""
        if self._nvml is not None:
            _shutdown(self._nvml)
        self._nvml, self._handles = None, []
        self._answer = (False, "closed")


def _shutdown(pynvml) -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 — nothing useful to do about a failed shutdown
        pass


class Samplers:
    """The recorder's samplers on one period (default 0.1 s: 10 Hz).

    Poll loop: `if samplers.due(time.monotonic()): add(samplers.sample(pids, time.monotonic_ns()))`.
    NVML is asked once (lazily) whether it is available; if it fails while sampling it is
    stopped and the reason kept for `status()`, the RSS rows still come.
    """

    def __init__(self, rss: RssSampler | None = None, nvml: NvmlSampler | None = None, *,
                 period_s: float = DEFAULT_PERIOD_S):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, not {period_s}")
        self.rss = rss if rss is not None else RssSampler()
        self.nvml = nvml if nvml is not None else NvmlSampler()
        self.period_s = float(period_s)
        self._next_s: float | None = None
        self._nvml_stopped: str | None = None

    def due(self, now_monotonic_s: float) -> bool:
        """True when a tick is due at `now_monotonic_s` (time.monotonic()); a True answer
        books the tick, so the next one is due a period later. Late ticks are not caught up."""
        if self._next_s is not None and now_monotonic_s < self._next_s:
            return False
        following = (self._next_s or now_monotonic_s) + self.period_s
        self._next_s = following if following > now_monotonic_s else now_monotonic_s + self.period_s
        return True

    def sample(self, pids: Iterable[int], ts_ns: int) -> dict[str, list]:
        """Rows of every available sampler for this tick (module docstring)."""
        pids = list(pids)
        rows = self.rss.sample(pids, ts_ns)
        if self._nvml_on():
            try:
                _extend(rows, self.nvml.sample(pids, ts_ns))
            except Exception as error:  # noqa: BLE001 — a GPU gone bad must not stop the recording
                self._nvml_stopped = f"NVML failed while sampling: {error}"
                self.nvml.close()
        return rows

    def _nvml_on(self) -> bool:
        return self._nvml_stopped is None and self.nvml.available()[0]

    def status(self) -> dict:
        """Per sampler, for meta.json: {"enabled", "rate_hz"} when on, {"enabled": False,
        "reason"} when off. RSS adds its PSS pacing (`pss_period_s`, `pss_cpu_share`); NVML
        adds how many GPUs (`devices`), or why it stopped mid-recording (`stopped`)."""
        rate = _rate_hz(self.period_s)
        nvml_ok, why = (True, "") if self._nvml_stopped else self.nvml.available()
        nvml = {"enabled": True, "rate_hz": rate} if nvml_ok else {"enabled": False, "reason": why}
        if self._nvml_stopped:
            nvml["stopped"] = self._nvml_stopped
        elif nvml_ok:
            nvml["devices"] = self.nvml.device_count
        rss = {"enabled": True, "rate_hz": rate, "pss_period_s": self.rss.pss_period_s,
               "pss_cpu_share": self.rss.pss_cpu_share}
        return {"rss": rss, "nvml": nvml}

    def close(self) -> None:
        self.nvml.close()


def _rate_hz(period_s: float) -> float | int:
    rate = round(1.0 / period_s, 6)
    return int(rate) if rate == int(rate) else rate

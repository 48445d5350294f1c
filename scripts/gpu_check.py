"""The checks of scripts/gpu_check.sh (run that; it prepares the machine and calls this).

Runs examples/cuda_leak.py directly (reference numbers, and an NVML-only check), then under
`memprof record --sources kmem,torch,cuda`, and prints one line per check:

    CHECK <name>: PASS|FAIL|SKIP <numbers>

- gpu_visible: nvidia-smi lists a GPU.
- torch_cuda: the workload ran on CUDA and PyTorch holds exactly 23 MiB allocated.
- nvml_direct: NVML's used memory grew by at least the workload's reserved_bytes.
- record: `memprof record` ran the workload and finalized the recording (else "eBPF
  unavailable: …" and the checks below are SKIP).
- cuda_driver_final (a): the cuda_driver layer's live bytes on devices cuda:* while the
  workload held (nothing is allocated or freed after that: they are its final bytes before
  teardown) vs its printed reserved_bytes. The driver layer may hold memory PyTorch does not
  own (cuBLAS workspaces, other libraries' cuMemAlloc), so it passes within
  [reserved, reserved + 64 MiB] and the difference is printed. The end-of-recording value
  and `report layers` final_bytes (all devices of the layer) are printed too.
- gpu_used_samples (b): nvidia-smi's memory.used, queried while the workload holds, vs the
  recording's gpu_used_bytes sample nearest in time (same GPU index, same CLOCK_MONOTONIC);
  passes within 64 MiB. NVML's v1 and v2 used/reserved at the same moments are printed: newer
  drivers leave reserved memory out of one and not the other.
- leaks_cuda_driver (c): `memprof report leaks --format json` has a cuda_driver finding.
- leaks_cuda_block (issue 5): the agent's CUDA history gives a cuda_block finding of exactly
  23 x 1 MiB whose chain names cuda_leak.py's `torch.full(` line.
- segment_minus_block (issue 5): cuda_segment − cuda_block final bytes == the workload's
  reserved − allocated.
- snapshot_import (issue 5): the workload saves a real snapshot pickle
  (real_cuda_leak_snapshot.pickle, a fixture to keep) and `memprof import` reads it.
- profiler_report_uprobe (issue 5): how many times a uprobe on
  c10::reportMemoryUsageToProfiler fires during the workload with no profiler running.

Writes under --out: summary.txt (the CHECK lines and numbers), the recording
cuda_leak.memprof, layers.json, leaks.json, the workload's and recorder's output, and the
nvidia-smi/NVML samples (smi_samples.json). Exits 0 whatever the checks say.

Standard library only at the top: it must run where memprof cannot be imported.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "examples" / "cuda_leak.py"
MiB = 1 << 20
KEPT_BYTES = 23 * MiB  # cuda_leak.py keeps 23 tensors of 1 MiB
DRIVER_SLACK = 64 * MiB
SMI_TOLERANCE = 64 * MiB
NEAREST_MAX_NS = 500_000_000  # a sample farther than this from the nvidia-smi query does not count
HOLD_MS = 4000  # long enough for several nvidia-smi queries


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def cap(self, want: float) -> float:
        """`want` seconds, or what is left before the deadline (at least 1)."""
        return max(1.0, min(want, self.end - time.monotonic() - 3))


class Summary:
    """CHECK lines and notes, printed as they come and written to summary.txt."""

    def __init__(self, out: Path):
        self.path = out / "summary.txt"
        self.lines: list[str] = []

    def check(self, name: str, status: str, text: str) -> None:
        self.say(f"CHECK {name}: {status} {text}")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.path.write_text("\n".join(self.lines) + "\n")


# --- NVML and nvidia-smi -------------------------------------------------------------------

class _MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """GPU memory per NVML index: through pynvml when it imports (what memprof's sampler
    uses: nvmlDeviceGetMemoryInfo, v1), else libnvidia-ml through ctypes; plus the v2 struct
    (used without reserved) through ctypes when the driver has it."""

    def __init__(self):
        self.why = ""
        self.via = ""
        self._lib = self._pynvml = None
        self._handles: list = []
        try:
            self._lib = ctypes.CDLL("libnvidia-ml.so.1")
            if self._lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit_v2 failed")
            count = ctypes.c_uint()
            self._lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
            for i in range(count.value):
                handle = ctypes.c_void_p()
                self._lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
                self._handles.append(handle)
            self.via = "ctypes libnvidia-ml.so.1"
        except (OSError, AttributeError) as error:
            self._lib, self.why = None, f"libnvidia-ml: {error}"
        try:
            import pynvml
            pynvml.nvmlInit()
            self._pynvml = pynvml
            self.via = "pynvml" + (" + ctypes (v2)" if self._lib else "")
        except Exception as error:  # noqa: BLE001 — ImportError, NVMLError: report, go on
            self.why += f"; pynvml: {error}"

    @property
    def ok(self) -> bool:
        return bool(self._pynvml or self._lib)

    def memory(self) -> dict[int, dict[str, int]]:
        """{index: {"used", "total"[, "v2_used", "v2_reserved"]}} in bytes; {} when unavailable."""
        out: dict[int, dict[str, int]] = {}
        try:
            if self._pynvml:
                for i in range(self._pynvml.nvmlDeviceGetCount()):
                    m = self._pynvml.nvmlDeviceGetMemoryInfo(self._pynvml.nvmlDeviceGetHandleByIndex(i))
                    out[i] = {"used": int(m.used), "total": int(m.total)}
            for i, handle in enumerate(self._handles if self._lib else []):
                entry = out.setdefault(i, {})
                v1 = _MemoryV1()
                if "used" not in entry and self._lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(v1)) == 0:
                    entry.update(used=int(v1.used), total=int(v1.total))
                v2 = _MemoryV2(version=ctypes.sizeof(_MemoryV2) | (2 << 24))
                fn = getattr(self._lib, "nvmlDeviceGetMemoryInfo_v2", None)
                if fn is not None and fn(handle, ctypes.byref(v2)) == 0:
                    entry.update(v2_used=int(v2.used), v2_reserved=int(v2.reserved))
        except Exception as error:  # noqa: BLE001 — a reading that failed is a missing reading
            self.why = f"reading memory: {error}"
        return out


def smi_used_mib(timeout: float = 20) -> list[int] | None:
    """nvidia-smi's memory.used per GPU (index order), MiB; None when it fails."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return [int(float(line)) for line in done.stdout.split() if line.strip()]
    except ValueError:
        return None


def reading(nvml: Nvml) -> dict:
    """One nvidia-smi query and one NVML reading, stamped with CLOCK_MONOTONIC ns (the
    recording's clock) at the middle of the nvidia-smi call."""
    t0 = time.monotonic_ns()
    smi = smi_used_mib()
    t1 = time.monotonic_ns()
    return {"ts_ns": (t0 + t1) // 2, "smi_call_ms": (t1 - t0) / 1e6, "smi_used_mib": smi,
            "nvml": {str(k): v for k, v in nvml.memory().items()}}


class HoldSampler(threading.Thread):
    """Readings every ~0.2 s from start() until stop() (the workload's hold)."""

    def __init__(self, nvml: Nvml, seconds: float):
        super().__init__(daemon=True)
        self.nvml, self.seconds, self.readings = nvml, seconds, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end and not self._stop_event.is_set():
            self.readings.append(reading(self.nvml))
            self._stop_event.wait(0.2)

    def stop(self) -> None:
        self._stop_event.set()


# --- running the workload ------------------------------------------------------------------

class Run:
    """One run of the workload (directly or under the recorder)."""

    def __init__(self, rc: int | None, stdout: str, stderr: str, hold_ns: int | None, readings: list[dict],
                 before: dict, timed_out: bool):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.hold_ns, self.readings, self.before, self.timed_out = hold_ns, readings, before, timed_out
        found = re.search(r"reserved_bytes=(\d+) allocated_bytes=(\d+)", stdout)
        self.reserved = int(found.group(1)) if found else None
        self.allocated = int(found.group(2)) if found else None

    def tail(self, n: int = 4) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()[-n:]
        return " | ".join(text) or "(no output)"


def run_workload(cmd: list[str], nvml: Nvml, timeout: float, name: str, out: Path) -> Run:
    """Run `cmd`; when it prints reserved_bytes (it now holds HOLD_MS), sample nvidia-smi and
    NVML until it exits. stdout/stderr are saved as NAME.stdout/NAME.stderr under `out`."""
    before = reading(nvml)
    stderr_path = out / f"{name}.stderr"
    with open(stderr_path, "w") as stderr:
        # its own process group, so a timeout ends the recorder and the workload together
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                start_new_session=True)
        killer = threading.Timer(timeout, _kill_group, (proc,))
        killer.start()
        lines, hold_ns, sampler = [], None, None
        for line in proc.stdout:
            lines.append(line)
            if hold_ns is None and "reserved_bytes=" in line:
                hold_ns = time.monotonic_ns()
                sampler = HoldSampler(nvml, HOLD_MS / 1000 - 0.5)
                sampler.start()
        rc = proc.wait()
        timed_out = not killer.is_alive() and rc < 0
        killer.cancel()
    if sampler:
        sampler.stop()
        sampler.join()
    stdout = "".join(lines)
    (out / f"{name}.stdout").write_text(stdout)
    return Run(rc, stdout, stderr_path.read_text(errors="replace"), hold_ns, sampler.readings if sampler else [],
               before, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def workload_cmd() -> list[str]:
    return [sys.executable, str(WORKLOAD), "--hold", str(HOLD_MS)]


# --- checks on the direct run --------------------------------------------------------------

def check_gpu(summary: Summary) -> bool:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    except (OSError, subprocess.TimeoutExpired) as error:
        summary.check("gpu_visible", "FAIL", f"nvidia-smi: {error}")
        return False
    if not gpus:
        summary.check("gpu_visible", "FAIL", f"nvidia-smi -L listed no GPU (exit {done.returncode})")
        return False
    summary.check("gpu_visible", "PASS", f"{len(gpus)} GPU(s): {gpus[0]}")
    return True


def check_direct(summary: Summary, run: Run, nvml: Nvml) -> None:
    if run.rc != 0 or run.reserved is None:
        status = "SKIP" if run.rc == 2 else "FAIL"
        summary.check("torch_cuda", status, f"cuda_leak.py exit {run.rc}: {run.tail()}")
        summary.check("nvml_direct", "SKIP", "no workload numbers")
        return
    ok = run.allocated == KEPT_BYTES
    summary.check("torch_cuda", "PASS" if ok else "FAIL",
                  f"reserved_bytes={run.reserved} allocated_bytes={run.allocated} (expected allocated {KEPT_BYTES})")
    if not nvml.ok or not run.readings:
        summary.check("nvml_direct", "SKIP", f"no NVML readings while holding ({nvml.why or 'none taken'})")
        return
    before = run.before["nvml"].get("0", {}).get("used")
    during = max((r["nvml"].get("0", {}).get("used") or 0) for r in run.readings)
    if before is None or not during:
        summary.check("nvml_direct", "SKIP", f"NVML gave no reading for GPU 0 ({nvml.why})")
        return
    grew = during - before
    summary.check("nvml_direct", "PASS" if grew >= run.reserved - MiB else "FAIL",
                  f"NVML used GPU0 before={before} during_hold={during} grew={grew} "
                  f"(>= reserved_bytes {run.reserved}; the rest is the CUDA context) via {nvml.via}")


# --- checks on the recording ---------------------------------------------------------------

def memprof_cli(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memprof", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def report_json(kind: str, rec: Path, out: Path, deadline: Deadline, extra: list[str] = ()) -> tuple[dict | None, str]:
    try:
        done = memprof_cli(["report", kind, str(rec), "--format", "json", *extra], deadline.cap(90))
    except subprocess.TimeoutExpired:
        return None, f"report {kind} timed out"
    (out / f"{kind}.json").write_text(done.stdout)
    if done.returncode != 0:
        return None, f"report {kind} exit {done.returncode}: {done.stderr.strip()[-300:]}"
    try:
        return json.loads(done.stdout), ""
    except ValueError as error:
        return None, f"report {kind}: not JSON ({error})"


def driver_live_by_device(rec: Path, at_ns: int | None) -> tuple[dict, dict]:
    """({device: live bytes at `at_ns`}, {device: live bytes at the end}) of the cuda_driver
    layer, through memprof's library (its one entry point, memprof.api.analyse)."""
    from memprof.api import analyse

    allocations = analyse(rec).lifetimes.allocations
    driver = allocations[allocations["layer"].astype(str) == "cuda_driver"]
    size = driver["size_bytes"].astype("float64").fillna(0)
    device = driver["device"].astype(str)
    ended = driver["end_ts_ns"].notna()
    final = size[~ended].groupby(device[~ended]).sum()
    at = {}
    if at_ns is not None:
        end = driver["end_ts_ns"].astype("float64")
        live = (driver["alloc_ts_ns"] <= at_ns) & (~ended | (end > at_ns))
        at = {k: int(v) for k, v in size[live].groupby(device[live]).sum().items()}
    return at, {k: int(v) for k, v in final.items()}


def check_driver(summary: Summary, run: Run, rec: Path, layers: dict | None) -> None:
    """(a) the cuda_driver layer vs PyTorch's reserved_bytes."""
    layer = next((entry for entry in (layers or {}).get("layers", []) if entry.get("layer") == "cuda_driver"), None)
    layer_text = (f"report layers cuda_driver: final_bytes={layer['final_bytes']} peak_bytes={layer['peak_bytes']} "
                  f"alloc_count={layer['alloc_count']}" if layer else "report layers: no cuda_driver layer")
    try:
        at, final = driver_live_by_device(rec, run.hold_ns)
    except Exception as error:  # noqa: BLE001 — internal API changed: fall back to the report
        summary.say(f"note: per-device live bytes unavailable ({type(error).__name__}: {error}); using report layers")
        at, final = {}, {}
    on_gpu = lambda d: sum(v for k, v in d.items() if k.startswith("cuda"))  # noqa: E731
    if at or final:
        driver, basis = on_gpu(at) if at else on_gpu(final), "live on cuda:* while holding"
    elif layer:
        driver, basis = int(layer["final_bytes"]), "report layers final_bytes (all devices)"
    else:
        summary.check("cuda_driver_final", "FAIL", f"no cuda_driver allocations in the recording; {layer_text}")
        return
    diff = driver - run.reserved
    ok = 0 <= diff <= DRIVER_SLACK
    summary.check("cuda_driver_final", "PASS" if ok else "FAIL",
                  f"driver={driver} ({basis}) reserved_bytes={run.reserved} difference={diff:+d} "
                  f"({diff / MiB:+.1f} MiB; pass within 0..+{DRIVER_SLACK // MiB} MiB)")
    summary.say(f"  cuda_driver by device while holding: {at}; at end of recording: {final}; {layer_text}")


def check_samples(summary: Summary, run: Run, rec: Path, layers: dict | None, out: Path) -> None:
    """(b) nvidia-smi's memory.used vs the recording's nearest gpu_used_bytes sample."""
    (out / "smi_samples.json").write_text(json.dumps({"before": run.before, "hold": run.readings}, indent=1))
    readings = [r for r in run.readings if r["smi_used_mib"]]
    if not readings:
        summary.check("gpu_used_samples", "SKIP", "no nvidia-smi reading while the workload held")
        return
    try:
        from memprof.recording import open_recording
        samples = open_recording(rec).samples
        samples = samples[samples["metric"].astype(str) == "gpu_used_bytes"]
    except Exception as error:  # noqa: BLE001
        summary.check("gpu_used_samples", "SKIP", f"could not read the samples table: {error}")
        return
    if samples.empty:
        metrics = sorted({m.get("metric") for m in (layers or {}).get("metrics", [])})
        status, why = ("SKIP", "pynvml is not installed in this Python (pip install nvidia-ml-py)") \
            if importlib.util.find_spec("pynvml") is None else ("FAIL", "NVML was importable")
        summary.check("gpu_used_samples", status, f"no gpu_used_bytes samples in the recording; {why}; "
                      f"metrics in report: {metrics}")
        return
    pairs = []
    for r in readings:
        for index, smi_mib in enumerate(r["smi_used_mib"]):
            series = samples[samples["device"].astype(str) == f"cuda:{index}"]
            if series.empty:
                continue
            gap = (series["ts_ns"] - r["ts_ns"]).abs()
            nearest = series.loc[gap.idxmin()]
            pairs.append({"gpu": index, "smi_bytes": smi_mib * MiB, "rec_bytes": int(nearest["value"]),
                          "gap_ms": int(gap.min()) / 1e6, "nvml": r["nvml"].get(str(index), {})})
    usable = [p for p in pairs if p["gap_ms"] * 1e6 <= NEAREST_MAX_NS]
    for p in pairs:
        summary.say(f"  gpu{p['gpu']}: nvidia-smi used={p['smi_bytes'] // MiB} MiB, recording gpu_used_bytes="
                    f"{p['rec_bytes'] / MiB:.1f} MiB ({p['gap_ms']:.0f} ms apart), NVML now: "
                    + ", ".join(f"{k}={v / MiB:.1f} MiB" for k, v in p["nvml"].items() if k != "total"))
    if not usable:
        summary.check("gpu_used_samples", "FAIL", f"no sample within {NEAREST_MAX_NS // 1_000_000} ms of "
                      f"{len(readings)} nvidia-smi readings")
        return
    worst = max(usable, key=lambda p: abs(p["rec_bytes"] - p["smi_bytes"]))
    diff = worst["rec_bytes"] - worst["smi_bytes"]
    summary.check("gpu_used_samples", "PASS" if abs(diff) <= SMI_TOLERANCE else "FAIL",
                  f"{len(usable)} pairs; worst: nvidia-smi={worst['smi_bytes']} recording={worst['rec_bytes']} "
                  f"difference={diff:+d} ({diff / MiB:+.1f} MiB; pass within ±{SMI_TOLERANCE // MiB} MiB; "
                  f"nvidia-smi is MiB-rounded)")


def check_leaks(summary: Summary, leaks: dict | None, why: str) -> None:
    """(c) a cuda_driver finding in `report leaks`."""
    if leaks is None:
        summary.check("leaks_cuda_driver", "FAIL", why)
        return
    found = [f for f in leaks.get("findings", []) if f.get("layer") == "cuda_driver"]
    if not found:
        layers = sorted({f.get("layer") for f in leaks.get("findings", [])})
        summary.check("leaks_cuda_driver", "FAIL", f"no cuda_driver finding among {len(leaks.get('findings', []))} "
                      f"(layers: {layers})")
        return
    total = sum(f.get("live_bytes", 0) for f in found)
    in_script = any("cuda_leak.py" in str(frame.get("file") or "") for f in found for frame in f.get("stack", []))
    top = found[0]
    frames = " ← ".join(str(fr.get("function")) for fr in top.get("stack", [])[:6])
    summary.check("leaks_cuda_driver", "PASS", f"{len(found)} finding(s), {total} bytes in "
                  f"{sum(f.get('live_count', 0) for f in found)} allocations; stack names cuda_leak.py: {in_script}")
    summary.say(f"  top cuda_driver finding: {top.get('live_bytes')} bytes, {top.get('live_count')} allocations, "
                f"stack: {frames or '(none)'}")


def check_agent_cuda(summary: Summary, run: Run, leaks: dict | None, layers: dict | None) -> None:
    """(issue 5) the agent's cuda_block finding names the leaking line with 23 x 1 MiB, and
    cuda_segment - cuda_block at the end matches reserved - allocated."""
    blocks = [f for f in (leaks or {}).get("findings", []) if f.get("layer") == "cuda_block"]
    lines = {(Path(str(fr.get("file") or "")).name, fr.get("line")) for f in blocks for fr in f.get("stack", [])}
    leak_line = next((i for i, text in enumerate(WORKLOAD.read_text().splitlines(), start=1)
                      if "torch.full(" in text), None)
    total = sum(f.get("live_bytes", 0) for f in blocks)
    ok = total == 23 * MiB and ("cuda_leak.py", leak_line) in lines
    summary.check("leaks_cuda_block", "PASS" if ok else "FAIL",
                  f"{len(blocks)} finding(s), {total} bytes (want {23 * MiB}); names cuda_leak.py:{leak_line}: "
                  f"{('cuda_leak.py', leak_line) in lines}")
    final = {e["layer"]: e["final_bytes"] for e in (layers or {}).get("layers", [])}
    if "cuda_segment" not in final or "cuda_block" not in final or run.reserved is None:
        summary.check("segment_minus_block", "FAIL", f"layers at the end: {final}")
        return
    cache, want = final["cuda_segment"] - final["cuda_block"], run.reserved - run.allocated
    summary.check("segment_minus_block", "PASS" if cache == want else "FAIL",
                  f"cuda_segment - cuda_block = {cache}, reserved - allocated = {want}")


def check_profiler_uprobe(summary: Summary, out: Path, deadline: Deadline) -> None:
    """(issue 5) does a uprobe on c10::reportMemoryUsageToProfiler fire for CUDA allocations
    with no profiler running? Counted with bcc while the workload runs alone."""
    code = r"""
import ctypes, subprocess, sys, torch, os
from bcc import BPF
lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
b = BPF(text="BPF_ARRAY(hits, u64, 1); int on_report(void *ctx) { int k = 0; u64 *v = hits.lookup(&k); if (v) (*v)++; return 0; }")
b.attach_uprobe(name=lib, sym="_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE", fn_name="on_report")
subprocess.run(sys.argv[1:], check=False, capture_output=True, timeout=120)
print("hits", b["hits"][ctypes.c_int(0)].value)
"""
    try:
        done = subprocess.run([sys.executable, "-c", code, *workload_cmd()], capture_output=True, text=True,
                              timeout=deadline.cap(150))
        hits = re.search(r"hits (\d+)", done.stdout)
        (out / "report_memory_usage_uprobe.txt").write_text(done.stdout + done.stderr)
        summary.check("profiler_report_uprobe", "PASS" if hits else "FAIL",
                      f"uprobe hits without a profiler: {hits.group(1) if hits else done.stderr.strip()[-300:]}")
    except (OSError, subprocess.TimeoutExpired) as error:
        summary.check("profiler_report_uprobe", "FAIL", str(error))


def save_snapshot(summary: Summary, out: Path, deadline: Deadline) -> None:
    """(issue 5) a small real snapshot pickle, and `memprof import` of it."""
    path = out / "real_cuda_leak_snapshot.pickle"
    cmd = [sys.executable, str(WORKLOAD), "--hold", "0", "--snapshot", str(path)]
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=deadline.cap(90))
        imported = memprof_cli(["import", str(path), "-f", "-o", str(out / "imported.memprof")], deadline.cap(60))
        leaks = memprof_cli(["report", "leaks", str(out / "imported.memprof"), "--format", "json", "--min-age", "0"],
                            deadline.cap(60))
        size = path.stat().st_size if path.exists() else 0
        summary.check("snapshot_import", "PASS" if imported.returncode == 0 and size else "FAIL",
                      f"snapshot {size} bytes; import exit {imported.returncode}; report exit {leaks.returncode}")
    except (OSError, subprocess.TimeoutExpired) as error:
        summary.check("snapshot_import", "FAIL", str(error))


def layer_lines(summary: Summary, layers: dict | None) -> None:
    for entry in (layers or {}).get("layers", []):
        summary.say(f"  layer {entry['layer']}: peak={entry['peak_bytes']} final={entry['final_bytes']} "
                    f"allocations={entry['alloc_count']}")
    for m in (layers or {}).get("metrics", []):
        summary.say(f"  metric {m['metric']} {m['device']}: peak={m['peak']:.0f} final={m['final']:.0f}")


def record(summary: Summary, nvml: Nvml, out: Path, deadline: Deadline, why_not: str) -> None:
    """Record the workload and check the recording; `why_not` (a sentence) skips it all."""
    names = ("record", "cuda_driver_final", "gpu_used_samples", "leaks_cuda_driver", "leaks_cuda_block",
             "segment_minus_block", "snapshot_import", "profiler_report_uprobe", "kv_cache_cuda",
             "advice_fragmentation", "advice_outside_torch")
    if why_not:
        summary.say(why_not)
        for name in names:
            summary.check(name, "SKIP", why_not)
        return
    rec = out / "cuda_leak.memprof"
    cmd = [sys.executable, "-m", "memprof", "record", "-q", "-f", "-o", str(rec), "--sources", "kmem,torch,cuda",
           "--", *workload_cmd()]
    run = run_workload(cmd, nvml, deadline.cap(150), "record", out)
    meta = _meta(rec)
    if run.rc != 0 or meta.get("status") != "complete" or run.reserved is None:
        why = f"memprof record exit {run.rc}{' (timed out)' if run.timed_out else ''}, recording status " \
              f"{meta.get('status')!r}: {run.tail()}"
        summary.say(f"eBPF unavailable: {why}")
        for name in names:
            summary.check(name, "FAIL" if name == "record" else "SKIP", why)
        return
    summary.check("record", "PASS", f"reserved_bytes={run.reserved} allocated_bytes={run.allocated} under record")
    summary.say(f"  sources: {sources_text(meta)}")
    layers, why = report_json("layers", rec, out, deadline)
    if layers is None:
        summary.say(f"note: {why}")
    layer_lines(summary, layers)
    check_driver(summary, run, rec, layers)
    check_samples(summary, run, rec, layers, out)
    leaks, why = report_json("leaks", rec, out, deadline, ["--top", "50"])
    check_leaks(summary, leaks, why)
    check_agent_cuda(summary, run, leaks, layers)
    save_snapshot(summary, out, deadline)
    check_profiler_uprobe(summary, out, deadline)
    check_kv_cache(summary, out, deadline)
    check_fragmentation_advice(summary, out, deadline)
    check_outside_torch_advice(summary, out, deadline)


# --- the KV cache of LLM inference on CUDA (issue 21) ---------------------------------------
KV_TOKENS = 120
KV_BYTES_PER_TOKEN = 2 * 6 * 2 * 512 * 4  # examples/generate_kv.py's defaults, float32


def check_kv_cache(summary: Summary, out: Path, deadline: Deadline) -> None:
    """examples/generate_kv.py on cuda under memprof record: `report growth --against tokens`
    in the cuda_block layer names the KV cache (cache_utils.py) at 48 KiB per token
    (within 15 %) with a power law b in 0.9..1.1."""
    try:
        import transformers  # noqa: F401 — only whether it is there
    except ImportError:
        summary.check("kv_cache_cuda", "SKIP", "transformers is not installed (pip install 'transformers>=5.0')")
        return
    rec = out / "generate_kv.memprof"
    cmd = ["record", "-q", "-f", "-o", str(rec), "--", sys.executable, str(ROOT / "examples" / "generate_kv.py"),
           "--device", "cuda", "--tokens", str(KV_TOKENS)]
    try:
        done = memprof_cli(cmd, deadline.cap(150))
    except subprocess.TimeoutExpired:
        summary.check("kv_cache_cuda", "FAIL", "memprof record of generate_kv.py timed out")
        return
    if done.returncode != 0:
        summary.check("kv_cache_cuda", "FAIL", f"record exit {done.returncode}: {done.stderr.strip()[-300:]}")
        return
    growth, why = report_json("growth", rec, out, deadline, ["--against", "tokens", "--layer", "cuda_block"])
    if growth is None:
        summary.check("kv_cache_cuda", "FAIL", why)
        return
    # The CUDA history's frames name a function without its class ("update"), in its file.
    cache = [s for s in growth["series"] if s["chain"]
             and any((f.get("file") or "").endswith("cache_utils.py") for f in s.get("stack", []))]
    if not cache:
        summary.check("kv_cache_cuda", "FAIL", f"no cuda_block chain through transformers' cache_utils.py among "
                                               f"{len(growth['series'])} series")
        return
    slope = sum(s["linear"]["b"] for s in cache if s["linear"])
    powers = [round(s["power"]["b"], 3) for s in cache if s["power"]]
    ok = abs(slope - KV_BYTES_PER_TOKEN) <= 0.15 * KV_BYTES_PER_TOKEN and powers and all(0.9 <= b <= 1.1 for b in powers)
    summary.check("kv_cache_cuda", "PASS" if ok else "FAIL",
                  f"{len(cache)} cache chain(s), {slope:.0f} B/token (expected {KV_BYTES_PER_TOKEN}), power b {powers}")


# --- the allocator-fragmentation advice (issue 22) -------------------------------------------
FRAGMENT_SLACK = 64 * MiB


def check_fragmentation_advice(summary: Summary, out: Path, deadline: Deadline) -> None:
    """examples/cuda_fragment.py (varied blocks, every other freed, larger ones after) under
    memprof record: `report advice` gives allocator-fragmentation on cuda:0, suggesting
    expandable_segments:True, with at least 8 segments holding free blocks beside live ones
    and cached free within 64 MiB of the workload's reserved − allocated while it holds."""
    recorded = record_example(summary, "advice_fragmentation", out, "cuda_fragment.py", ["--hold", "2000"],
                              r"reserved_bytes=(\d+) allocated_bytes=(\d+)", deadline)
    if recorded is None:
        return
    rec, held = recorded
    advice, why = report_json("advice", rec, out, deadline)
    if advice is None:
        summary.check("advice_fragmentation", "FAIL", why)
        return
    given = [a for a in advice.get("advice", []) if a.get("rule") == "allocator-fragmentation"]
    entry = next((r for r in advice.get("rules", []) if r.get("id") == "allocator-fragmentation"), {})
    if not given:
        summary.check("advice_fragmentation", "FAIL", f"no advice: {entry.get('why_not')}")
        return
    numbers, want = given[0].get("numbers", {}), int(held.group(1)) - int(held.group(2))
    cached = numbers.get("cached_free_bytes") or 0
    ok = ("expandable_segments:True" in given[0].get("change", "") and (numbers.get("segments_split") or 0) >= 8
          and abs(cached - want) <= FRAGMENT_SLACK)
    summary.check("advice_fragmentation", "PASS" if ok else "FAIL",
                  f"cached_free={cached} (workload reserved-allocated={want}) fragmentation="
                  f"{numbers.get('fragmentation')} segments split={numbers.get('segments_split')} of "
                  f"{numbers.get('segments_live')} peak_of={numbers.get('peak_of')} saving={given[0].get('saving_bytes')}")


def record_example(summary: Summary, check: str, out: Path, example: str, args: list[str], printed: str,
                   deadline: Deadline, skip_if: str | None = None) -> tuple[Path, re.Match] | None:
    """`memprof record` of examples/EXAMPLE with `args` on the GPU sources; the recording and
    the match of `printed` (what the example prints while it holds its memory) in its stdout.
    None after a CHECK line for `check` saying why not: FAIL, or SKIP when the output holds
    `skip_if` (what the machine cannot do)."""
    rec = out / f"{Path(example).stem}.memprof"
    cmd = ["record", "-q", "-f", "-o", str(rec), "--sources", "kmem,torch,cuda", "--", sys.executable,
           str(ROOT / "examples" / example), *args]
    try:
        done = memprof_cli(cmd, deadline.cap(120))
    except subprocess.TimeoutExpired:
        summary.check(check, "FAIL", f"memprof record of {example} timed out")
        return None
    held = re.search(printed, done.stdout)
    if done.returncode != 0 or not held:
        said = done.stderr + done.stdout
        summary.check(check, "SKIP" if skip_if and skip_if in said else "FAIL",
                      f"record exit {done.returncode}: {said.strip()[-300:]}")
        return None
    return rec, held


# --- the memory-outside-pytorch advice, case (a) (issue 22) -----------------------------------
OUTSIDE_SLACK = 64 * MiB


def check_outside_torch_advice(summary: Summary, out: Path, deadline: Deadline) -> None:
    """examples/cuda_outside.py (a PyTorch segment, then 16 x 32 MiB kept through cuMemAlloc_v2
    by ctypes, one per memprof.mark step) under memprof record: the rule gives driver memory
    outside the caching allocator with not_pytorch within [kept, kept + 64 MiB] at the peak,
    grown by at least kept - 2 steps' bytes, a chain through cuda_outside.py. Judged through
    the library (memprof.api.analyse, outside_torch.check) so no other rule can hide it."""
    recorded = record_example(summary, "advice_outside_torch", out, "cuda_outside.py", [],
                              r"kept_bytes=(\d+) reserved_bytes=(\d+) steps=(\d+)", deadline,
                              skip_if="cuMemAlloc_v2 failed")
    if recorded is None:
        return
    rec, held = recorded
    kept, reserved, steps = (int(x) for x in held.groups())
    from memprof.analysis.advice import outside_torch
    from memprof.api import analyse
    analysed = analyse(rec)
    verdict = outside_torch.check(analysed)
    given = [a for a in verdict.advice if a.layer == "cuda_driver" and a.device != "cpu"]
    if not given:
        summary.check("advice_outside_torch", "FAIL", f"no driver advice: {verdict.why_not}")
        return
    numbers = given[0].numbers
    chains = analysed.chains([s for s in given[0].chains if s is not None])
    named = any((f.get("file") or "").endswith("cuda_outside.py") for frames in chains.values() for f in frames)
    outside, grew = numbers.get("not_pytorch_bytes") or 0, numbers.get("grew_bytes") or 0
    ok = kept <= outside <= kept + OUTSIDE_SLACK and grew >= kept - 2 * kept // steps and named
    summary.check("advice_outside_torch", "PASS" if ok else "FAIL",
                  f"not_pytorch={outside} (kept {kept}) grew={grew} driver={numbers.get('driver_bytes')} "
                  f"reserved={numbers.get('reserved_bytes')} (torch reserved {reserved}) device={given[0].device} "
                  f"chain through cuda_outside.py={named} title={given[0].title!r}")


def sources_text(meta: dict) -> str:
    """Per source in meta.json: events, lost, and what it attached to (uprobes, NVML)."""
    parts = []
    for name, info in (meta.get("sources") or {}).items():
        if not isinstance(info, dict):
            continue
        detail = info.get("detail") or {}
        text = f"{name} events={info.get('events')} lost={info.get('lost')}"
        if detail.get("families"):
            text += f" families={','.join(map(str, detail['families']))}"
        for path, probe in (detail.get("uprobes") or {}).items():
            if isinstance(probe, dict):
                text += (f" [{probe.get('family')}: {os.path.basename(path)} probes={probe.get('probes')}"
                         f" missing={probe.get('missing')}]")
        if isinstance(detail.get("nvml"), dict):
            text += f" nvml={json.dumps(detail['nvml'])}"
        parts.append(text)
    return "; ".join(parts) or "(none in meta.json)"


def _meta(rec: Path) -> dict:
    try:
        return json.loads((rec / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=300, help="finish within this many seconds")
    ap.add_argument("--no-ebpf", default="", metavar="WHY", help="skip the recording, saying why")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    deadline, summary = Deadline(args.budget_s), Summary(args.out)
    if not check_gpu(summary):
        for name in ("torch_cuda", "nvml_direct", "record", "cuda_driver_final", "gpu_used_samples",
                     "leaks_cuda_driver", "leaks_cuda_block", "segment_minus_block", "snapshot_import",
                     "profiler_report_uprobe", "kv_cache_cuda", "advice_fragmentation", "advice_outside_torch"):
            summary.check(name, "SKIP", "no GPU visible")
        return 0
    nvml = Nvml()
    summary.say(f"NVML via {nvml.via or 'nothing'}{' (' + nvml.why.strip('; ') + ')' if nvml.why else ''}")
    direct = run_workload(workload_cmd(), nvml, deadline.cap(90), "direct", args.out)
    check_direct(summary, direct, nvml)
    why_not = f"eBPF unavailable: {args.no_ebpf}" if args.no_ebpf else ""
    if not why_not and direct.reserved is None:
        why_not = "not recorded: the workload does not run on CUDA here (torch_cuda above)"
    record(summary, nvml, args.out, deadline, why_not)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # noqa: BLE001 — the person reads the output; exit 0 regardless
        import traceback
        traceback.print_exc()
        print(f"CHECK helper: FAIL {type(error).__name__}: {error}")
        sys.exit(0)

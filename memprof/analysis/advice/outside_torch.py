"""Advice rule `memory-outside-pytorch`: memory that PyTorch's allocators do not hold, large or
growing, in three places:

(a) GPU memory the CUDA driver handed out outside PyTorch's caching allocator (NCCL's
    buffers, cuBLAS workspaces, a library's own cuMemAlloc): `cuda_driver` allocations on a
    GPU that are not one of the allocator's segments (gpu.py's not_pytorch = driver −
    reserved), large at the GPU's peak or growing over the checkpoints;
(b) pinned host memory (cuMemHostAlloc / cuMemAllocHost: `cuda_driver` on device "cpu")
    whose chain grows per step (a leak finding with a trend);
(c) kernel objects a chain keeps (pipes, sockets, files, page cache: kernel-layer leak
    findings), grouped by the user frame that made them and the kind of object
    (outside_torch_kernel.py).

Pure: reads the recording's analyses through Facts. Sizes bytes, times CLOCK_MONOTONIC ns.
Driver memory on device "cuda" (the driver call does not say which GPU) counts with every
cuda:N segment; where a GPU breakdown's terms are wanted per GPU, gpu.py gives them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.advice.outside_torch_kernel import KernelLimits, chain_key, frame_text, kernel_advice
from memprof.analysis.growth import live_at, sample_series
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import category_codes, end_times, labels, live_mask
from memprof.analysis.trend import MIN_POINTS, classify
from memprof.model.schema import Layer
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.checkpoints import Checkpoints
    from memprof.analysis.leaks import LeakFinding, LeakResult

RULE_ID = "memory-outside-pytorch"
KiB, MiB = 1 << 10, 1 << 20

DRIVER_OUTSIDE_MIN_BYTES = Threshold(
    "DRIVER_OUTSIDE_MIN_BYTES", 256 * MiB, "bytes",
    "GPU memory the driver holds outside PyTorch's caching allocator at the GPU's peak: at least this is large")
DRIVER_GROWTH_MIN_BYTES = Threshold(
    "DRIVER_GROWTH_MIN_BYTES", 64 * MiB, "bytes",
    "driver memory outside PyTorch that rose by at least this from the first checkpoint to the last is growing")
PINNED_GROWTH_MIN_BYTES = Threshold(
    "PINNED_GROWTH_MIN_BYTES", 16 * MiB, "bytes",
    "pinned host memory of chains growing per step: at least this held by them is worth advice")
KERNEL_MIN_BYTES = Threshold(
    "KERNEL_MIN_BYTES", 64 * KiB, "bytes",
    "kernel memory one call site's objects hold (all their chains): at least this is worth advice")
KERNEL_MIN_OBJECTS = Threshold(
    "KERNEL_MIN_OBJECTS", 16, "count",
    "objects of the call site's main chain held: fewer are a program's usual open files")
GROWTH_CONFIDENCE = Threshold(
    "GROWTH_CONFIDENCE", 0.99, "confidence",
    "Mann–Kendall confidence that a series rises over the checkpoints (1 − p): at least this is growing")
THRESHOLDS: tuple[Threshold, ...] = (DRIVER_OUTSIDE_MIN_BYTES, DRIVER_GROWTH_MIN_BYTES, PINNED_GROWTH_MIN_BYTES,
                                     KERNEL_MIN_BYTES, KERNEL_MIN_OBJECTS, GROWTH_CONFIDENCE)

_DRIVER = Layer.CUDA_DRIVER.value
_SEGMENT = Layer.CUDA_SEGMENT.value
# A driver allocation whose chain runs through these is PyTorch's caching allocator's own.
_TORCH_MODULES = ("libc10_cuda",)
_TORCH_FUNCTIONS = ("CUDACachingAllocator", "c10::cuda::")
# Libraries that allocate GPU memory of their own, by the module (or function prefix) of a frame.
_LIBRARIES = (("libnccl", "nccl", "NCCL"), ("libcublasLt", "cublasLt", "cuBLASLt"), ("libcublas", "cublas", "cuBLAS"),
              ("libcudnn", "cudnn", "cuDNN"), ("libcufft", "cufft", "cuFFT"), ("libcusparse", "cusparse", "cuSPARSE"))
_LIBRARY_CHANGE = {
    "NCCL": "NCCL allocates buffers per communicator and channel: create fewer process groups and reuse them, "
            "destroy the ones you are done with (torch.distributed.destroy_process_group), and lower "
            "NCCL_BUFFSIZE or NCCL_MAX_NCHANNELS (NCCL_NVLS_ENABLE=0 drops the NVLink SHARP buffers)",
    "cuBLAS": "cuBLAS keeps a workspace per handle and stream: set CUBLAS_WORKSPACE_CONFIG=:4096:8 (or smaller) "
              "and use fewer streams",
    "cuBLASLt": "cuBLASLt keeps a workspace per handle: lower it with CUBLASLT_WORKSPACE_SIZE (KiB)",
}
_GENERIC_CHANGE = ("allocate it through PyTorch (a tensor on the device, or torch.cuda.MemPool / "
                   "CUDAPluggableAllocator for a library's allocations) so the caching allocator can reuse it, or "
                   "free it (cuMemFree) when its work is done: torch.cuda.memory_allocated and PyTorch's "
                   "out-of-memory accounting do not see it")


def check(facts: Facts) -> Verdict:
    """The three cases' advice (module docstring); silent, with what each looked for, when
    none crosses its thresholds."""
    leaks = facts.leaks(top=None).result
    driver, why_driver = driver_advice(facts, leaks.checkpoints)
    pinned, why_pinned = pinned_advice(facts, leaks)
    kernel, why_kernel = kernel_advice(facts, leaks, _kernel_limits(), RULE_ID)
    given = driver + pinned + kernel
    if given:
        return fired(*given)
    return silent(f"{why_driver}; {why_pinned}; {why_kernel}")


def _kernel_limits() -> KernelLimits:
    return KernelLimits(min_bytes=int(KERNEL_MIN_BYTES.value), min_objects=int(KERNEL_MIN_OBJECTS.value),
                        confidence=GROWTH_CONFIDENCE.value)


# ---- (a) driver memory outside the caching allocator ---------------------------------------------

@dataclass(frozen=True)
class _Curve:
    times: np.ndarray
    live: np.ndarray

    def at(self, ts) -> np.ndarray:
        return live_at(self.times, self.live, np.atleast_1d(np.asarray(ts, dtype=np.int64)))


def _curve(rows: pd.DataFrame) -> _Curve:
    if rows.empty:
        return _Curve(np.array([0], dtype=np.int64), np.array([0.0]))
    size = rows["size_bytes"].to_numpy(dtype=float, na_value=0) * rows["weight"].to_numpy(dtype=float)
    times, live = live_curve(rows["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(rows), size)
    return _Curve(times, live)


def driver_advice(facts: Facts, checkpoints: Checkpoints | None) -> tuple[list[Advice], str]:
    """(a): one advice per GPU (device label of the driver rows) whose driver memory outside
    PyTorch's segments is large at its peak or grows; else why not."""
    allocations = facts.lifetimes.allocations
    layer, device = labels(allocations["layer"]), labels(allocations["device"])
    on_gpu = (layer == _DRIVER) & _on_a_gpu(allocations["device"])
    if not on_gpu.any():
        return [], "no cuda_driver memory on a GPU"
    driver = allocations[on_gpu].assign(device_label=device[on_gpu])
    segments = allocations[layer == _SEGMENT].assign(device_label=device[layer == _SEGMENT])
    outside_rows = ~_pytorch_owned(facts, driver, segments)
    advice = []
    for name in sorted(set(driver["device_label"])):
        mine = (driver["device_label"] == name).to_numpy()
        found = _device_outside(facts, name, driver[mine], driver[mine & outside_rows],
                                _segments_of(segments, name), checkpoints)
        advice += [found] if found else []
    if advice:
        return advice, ""
    return [], (f"GPU driver memory outside PyTorch's caching allocator stayed under "
                f"{format_bytes(DRIVER_OUTSIDE_MIN_BYTES.value)} and did not grow")


def _on_a_gpu(column: pd.Series) -> np.ndarray:
    """Per row: its device is a GPU ("cuda", "cuda:N"), judged once per category."""
    codes, names = category_codes(column)
    gpu = np.array([str(name).startswith("cuda") for name in names] + [False], dtype=bool)
    return gpu[codes]


def _segments_of(segments: pd.DataFrame, device: str) -> pd.DataFrame:
    """The caching allocator's segments that count against driver rows of `device`: its own,
    or every GPU's for "cuda" (rows that do not say which GPU)."""
    if device == "cuda":
        return segments[segments["device_label"].astype(str).str.startswith("cuda")]
    return segments[segments["device_label"] == device]


def _pytorch_owned(facts: Facts, driver: pd.DataFrame, segments: pd.DataFrame) -> np.ndarray:
    """Per driver row: one of the caching allocator's segments (its address is a segment's,
    as cudaMalloc returns cuMemAlloc's pointer) or made through it (its chain runs through
    libc10_cuda or the CUDACachingAllocator: expandable segments' cuMemCreate)."""
    owned = np.isin(driver["addr"].to_numpy(), segments["addr"].to_numpy()) if len(segments) else \
        np.zeros(len(driver), dtype=bool)
    ids = driver["stack_id"].dropna().unique()
    torch_ids = [sid for sid, frames in facts.chains(ids).items() if any(_is_torch_frame(f) for f in frames)]
    return owned | driver["stack_id"].isin(torch_ids).to_numpy(dtype=bool, na_value=False)


def _is_torch_frame(frame: dict) -> bool:
    module, function = frame.get("module") or "", frame.get("function") or ""
    return module.startswith(_TORCH_MODULES) or any(part in function for part in _TORCH_FUNCTIONS)


@dataclass(frozen=True)
class _Growth:
    first: float
    last: float
    slope: float  # bytes per step (or window): per checkpoint over Checkpoints.units_per_point
    confidence: float
    checkpoints: Checkpoints

    @property
    def grew(self) -> float:
        return self.last - self.first


def _growth(curve: _Curve, checkpoints: Checkpoints | None) -> _Growth | None:
    """How outside memory moved over the checkpoints; None with too few, or if it does not grow."""
    if checkpoints is None or len(checkpoints.times_ns) < MIN_POINTS:
        return None
    series = curve.at(checkpoints.times_ns).astype(float)
    trend = classify(series[None, :], confidence=GROWTH_CONFIDENCE.value, min_growth=DRIVER_GROWTH_MIN_BYTES.value)[0]
    if trend.shape != "grows" or series[-1] - series[0] < DRIVER_GROWTH_MIN_BYTES.value:
        return None
    return _Growth(float(series[0]), float(series[-1]), trend.slope / checkpoints.units_per_point, trend.confidence,
                   checkpoints)


def _device_outside(facts: Facts, device: str, driver: pd.DataFrame, outside: pd.DataFrame,
                    segments: pd.DataFrame, checkpoints: Checkpoints | None) -> Advice | None:
    total, out_curve, reserved = _curve(driver), _curve(outside), _curve(segments)
    peak_ns = _peak_ns(total, facts.span.end_ns)
    at_peak = int(out_curve.at(peak_ns)[0])
    growth = _growth(out_curve, checkpoints)
    if at_peak < DRIVER_OUTSIDE_MIN_BYTES.value and growth is None:
        return None
    driver_at, reserved_at = int(total.at(peak_ns)[0]), int(reserved.at(peak_ns)[0])
    chains = _top_outside_chains(outside, peak_ns if growth is None else int(growth.checkpoints.times_ns[-1]))
    frames = facts.chains([sid for sid, _ in chains])
    libraries = [_library(frames.get(sid, [])) for sid, _ in chains]
    main = next((lib for lib in libraries if lib), None)
    when = _when(facts, peak_ns)
    evidence = [f"At the GPU's peak ({when}) the driver held {format_bytes(driver_at)} on {device}: "
                f"{format_bytes(reserved_at)} are PyTorch's caching-allocator segments (reserved), "
                f"{format_bytes(at_peak)} are outside it (not_pytorch)."]
    evidence += _nvml_line(facts, device, peak_ns, driver_at)
    if growth is not None:
        evidence.append(_growth_line(growth))
    evidence += [f"{format_bytes(nbytes)} from {frame_text(frames.get(sid, []))}"
                 f"{' (' + lib + ')' if lib else ''}" for (sid, nbytes), lib in zip(chains, libraries)]
    saving_bytes = int(round(growth.grew)) if growth is not None else at_peak
    title = (f"{main or 'Driver'} memory outside PyTorch's caching allocator on {device}: "
             f"{format_bytes(at_peak)} at the peak" + (f", grew {format_bytes(growth.grew)}" if growth else ""))
    numbers = {"device": device, "driver_bytes": driver_at, "reserved_bytes": reserved_at, "not_pytorch_bytes": at_peak,
               "peak_ns": peak_ns, "library": main}
    if growth is not None:
        numbers |= {"grew_bytes": int(round(growth.grew)), "slope_bytes_per_unit": growth.slope,
                    "confidence": growth.confidence, "checkpoint_unit": growth.checkpoints.unit}
    return Advice(rule=RULE_ID, title=title, evidence=tuple(evidence),
                  change=_LIBRARY_CHANGE.get(main or "", _GENERIC_CHANGE),
                  saving=("what it grew over the recording, which stops growing once it is freed" if growth is not None
                          else "the driver memory outside PyTorch at the GPU's peak"),
                  saving_bytes=saving_bytes, chains=tuple(sid for sid, _ in chains), layer=_DRIVER, device=device,
                  numbers=numbers)


def _peak_ns(total: _Curve, end_ns: int) -> int:
    """The last moment of the driver's first peak: the segment PyTorch makes of a driver
    allocation is recorded just after it (the agent's history), so the peak's first moment
    can precede its segment."""
    first = int(np.argmax(total.live))
    if first + 1 < len(total.times):
        return int(total.times[first + 1]) - 1
    return max(int(total.times[first]), int(end_ns))


def _top_outside_chains(outside: pd.DataFrame, at_ns: int, top: int = 3) -> list[tuple[int | None, int]]:
    """(stack id, bytes) of the biggest chains of `outside` live at `at_ns`."""
    alive = live_mask(outside["alloc_ts_ns"].to_numpy(dtype=np.int64), end_times(outside), at_ns)
    rows = outside[alive]
    size = rows["size_bytes"].to_numpy(dtype=float, na_value=0) * rows["weight"].to_numpy(dtype=float)
    by_chain = pd.Series(size).groupby(rows["stack_id"].to_numpy(dtype=object), dropna=False).sum()
    by_chain = by_chain.sort_values(ascending=False, kind="stable")[:top]
    return [(None if pd.isna(sid) else int(sid), int(round(nbytes))) for sid, nbytes in by_chain.items()]


def _library(frames: list[dict]) -> str | None:
    """The GPU library a driver chain runs through (NCCL, cuBLAS, …), None if none is known."""
    for frame in frames:
        module, function = frame.get("module") or "", frame.get("function") or ""
        for prefix, function_prefix, name in _LIBRARIES:
            if module.startswith(prefix) or function.startswith(function_prefix):
                return name
    return None


def _when(facts: Facts, ts_ns: int) -> str:
    seconds = (ts_ns - facts.span.start_ns) / 1e9
    return f"{seconds:.2f} s into the recording"


def _nvml_line(facts: Facts, device: str, ts_ns: int, driver_at: int) -> list[str]:
    """NVML's figure for the target on that GPU at the peak and what the probes did not see
    (context_and_unseen), when sampled."""
    name = device if device != "cuda" else "cuda:0"
    ts, values = sample_series(facts.rec.samples, "gpu_process_bytes", name)
    before = ts <= ts_ns
    if not before.any() or values[before][-1] <= 0:
        return []
    used = int(values[before][-1])
    return [f"NVML counted {format_bytes(used)} for the process on {name} then: "
            f"{format_bytes(used - driver_at)} more than the driver calls seen (the CUDA context, context_and_unseen)."]


def _growth_line(growth: _Growth) -> str:
    unit = growth.checkpoints.unit
    return (f"It grew from {format_bytes(growth.first)} to {format_bytes(growth.last)} over "
            f"{len(growth.checkpoints.times_ns)} {unit}s: {format_bytes(growth.slope)} per {unit} "
            f"(Theil–Sen), Mann–Kendall confidence {growth.confidence:.3f}.")


# ---- (b) pinned host memory that grows ------------------------------------------------------------

def pinned_advice(facts: Facts, leaks: LeakResult) -> tuple[list[Advice], str]:
    """(b): one advice for the pinned-host chains (cuda_driver on "cpu") that grow per step."""
    allocations = facts.lifetimes.allocations
    pinned = (labels(allocations["layer"]) == _DRIVER) & (labels(allocations["device"]) == "cpu")
    if not pinned.any():
        return [], "no pinned host memory recorded (cuMemHostAlloc, cuMemAllocHost)"
    pinned_ids = allocations.loc[pinned, "stack_id"].dropna().unique()
    pinned_keys = {chain_key(frames) for frames in facts.chains(pinned_ids).values()}
    candidates = [f for f in leaks.findings if f.layer == _DRIVER and f.stack_id is not None]
    keys = {sid: chain_key(frames) for sid, frames in facts.chains([f.stack_id for f in candidates]).items()}
    growing = [f for f in candidates if keys.get(f.stack_id) in pinned_keys and _grows(f)]
    held = sum(f.live_bytes for f in growing)
    if not growing or held < PINNED_GROWTH_MIN_BYTES.value:
        return [], f"no pinned host memory growing per step by {format_bytes(PINNED_GROWTH_MIN_BYTES.value)} or more"
    return [_pinned(facts, growing, leaks)], ""


def _grows(finding: LeakFinding) -> bool:
    return (finding.kind == "grows_per_step" and finding.confirmed
            and (finding.confidence or 0.0) >= GROWTH_CONFIDENCE.value)


def _pinned(facts: Facts, growing: list[LeakFinding], leaks: LeakResult) -> Advice:
    held = sum(f.live_bytes for f in growing)
    per_step = sum(f.slope_bytes_per_step or 0.0 for f in growing)
    unit = leaks.checkpoints.unit if leaks.checkpoints is not None else "step"
    frames = facts.chains([f.stack_id for f in growing])
    evidence = [f"Pinned host memory (cuMemHostAlloc / cuMemAllocHost) grows {format_bytes(per_step)} per {unit} "
                f"in {len(growing)} chain(s) and held {format_bytes(held)} at the end "
                f"({sum(f.live_count for f in growing):,} buffers)."]
    evidence += [f"{format_bytes(f.live_bytes)} in {f.live_count:,} buffers, {format_bytes(f.slope_bytes_per_step or 0)} "
                 f"per {unit} (confidence {f.confidence:.3f}), from {frame_text(frames.get(f.stack_id, []))}"
                 for f in growing]
    return Advice(rule=RULE_ID, title=f"Pinned host memory grows {format_bytes(per_step)} per {unit}",
                  evidence=tuple(evidence),
                  change=("free pinned buffers once their copy is done, or reuse a fixed set: pinned pages cannot be "
                          "swapped or reclaimed, and PyTorch's pinned-memory cache (pin_memory, non_blocking copies) "
                          "keeps each size it ever saw; torch.cuda.empty_cache does not return host memory, "
                          "free the tensors that hold it"),
                  saving="the pinned bytes the growing chains held at the end", saving_bytes=int(held),
                  chains=tuple(f.stack_id for f in growing), layer=_DRIVER, device="cpu",
                  numbers={"held_bytes": int(held), "bytes_per_step": per_step, "chains": len(growing),
                           "buffers": int(sum(f.live_count for f in growing))})


RULE = Rule(
    id=RULE_ID,
    title="Memory grows outside PyTorch",
    trigger=("GPU driver memory outside PyTorch's caching allocator (not one of its segments, not made through "
             "it) at least DRIVER_OUTSIDE_MIN_BYTES at the GPU's peak or growing by DRIVER_GROWTH_MIN_BYTES over "
             "the checkpoints; pinned host chains growing per step (PINNED_GROWTH_MIN_BYTES); kernel objects "
             "(pipes, sockets, files, page cache) of one call site growing per step, or, without steps, held by "
             "the process until its exit (KERNEL_MIN_BYTES, KERNEL_MIN_OBJECTS)"),
    evidence=("driver, reserved and not-PyTorch bytes at the GPU's peak with NVML's figure, the growth per "
              "checkpoint, and the chains (NCCL, cuBLAS, …); the pinned chains' growth per step; per kernel call "
              "site the kind and count of objects, their bytes, growth per step or second, and their chains"),
    advice=("shrink or free the library's buffers (NCCL communicators, cuBLAS workspaces) or allocate through "
            "PyTorch; free or reuse pinned buffers; close the pipes, sockets and files the user frame opens"),
    saving=("the bytes that grew (what closing or freeing keeps from growing), else the not-PyTorch bytes at the "
            "GPU's peak"),
    thresholds=THRESHOLDS,
    check=check,
    needs="a GPU with libcuda probed for (a) and (b); the kmem source for (c)",
)

"""GPU breakdown: what makes up each GPU's used memory, over time and at its peak.

Pure functions over lifetimes, the timeline, the `samples` table and the recording's
metadata; no I/O. Times are CLOCK_MONOTONIC ns, sizes bytes. Per device d ("cuda:N") at t:

    used_nvml = context_and_unseen + driver
    driver    = not_pytorch        + reserved
    reserved  = cached_free        + allocated

- used_nvml: NVML's `gpu_process_bytes` (the target's own), its last sample at or before t;
  `gpu_used_bytes` (the whole GPU, every process) is shown beside it as `gpu_used`, and
  stands in for it where the process figure is missing or 0 throughout (a note says so);
- driver: live `cuda_driver` bytes on d (cuMemAlloc & co. seen by uprobes, which do not record the
  GPU index: with one GPU known they are its, else device "cuda" of their own; pinned host
  memory is device "cpu" and does not count);
- reserved: live `cuda_segment` bytes (the caching allocator's segments);
- allocated: live `cuda_block` bytes (its tensor blocks); requested: their requested_bytes
  (size_bytes where a block lacks it: a note says so);
- context_and_unseen = used_nvml − driver (CUDA context, memory the probes did not see);
  not_pytorch = driver − reserved (NCCL, cuBLAS workspaces, other libraries);
  cached_free = reserved − allocated; fragmentation = cached_free / reserved;
- amplification = peak reserved / peak requested (each at its own peak).

Layer curves are exact (every event); NVML is sampled, so a difference with it can come out
negative: every difference is reported as it is, with a note, never clamped. A term without
its inputs is None, and `missing` says why.

Times: the step marks (at most `points` of them, evenly picked, first and last kept), else
`points` evenly spaced times over the GPU data's span. The peak is the time of the peak of
the outermost available of used_nvml, driver, reserved, allocated.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from memprof.analysis.checkpoints import step_marks
from memprof.analysis.growth import last_sample_at, live_at, sample_series
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of
from memprof.model.meta import RecordingMeta
from memprof.model.schema import Layer

BYTE_TERMS = ("used_nvml", "gpu_used", "driver", "reserved", "allocated", "requested",
              "context_and_unseen", "not_pytorch", "cached_free")
TERMS = BYTE_TERMS + ("fragmentation",)
PEAK_ORDER = ("used_nvml", "driver", "reserved", "allocated")  # outermost first
UNINDEXED_GPU = "cuda"  # the device of libcuda uprobe rows: the GPU's index is not recorded
_LAYER_OF = {"driver": Layer.CUDA_DRIVER.value, "reserved": Layer.CUDA_SEGMENT.value,
             "allocated": Layer.CUDA_BLOCK.value}
# Derived term -> (minuend, subtrahend).
_DIFFERENCES = {"context_and_unseen": ("used_nvml", "driver"), "not_pytorch": ("driver", "reserved"),
                "cached_free": ("reserved", "allocated")}
_NEGATIVE_WHY = {
    "context_and_unseen": "NVML is sampled (its last sample before t can predate driver allocations made since)",
    "not_pytorch": "segments whose driver allocation was not seen (made before recording began, or by an "
                   "API the probes miss)",
    "cached_free": "blocks whose segment was not seen (allocated before the allocator's history began)",
}


@dataclass(frozen=True)
class GpuTerms:
    """The equation on one device at `ts_ns` (in step `step`, None without steps). Bytes,
    except `fragmentation` (0..1). None: not computable (DeviceBreakdown.missing says why),
    or for NVML terms, no sample yet at ts_ns."""

    ts_ns: int
    step: int | None = None
    used_nvml: int | None = None
    gpu_used: int | None = None
    driver: int | None = None
    reserved: int | None = None
    allocated: int | None = None
    requested: int | None = None
    context_and_unseen: int | None = None
    not_pytorch: int | None = None
    cached_free: int | None = None
    fragmentation: float | None = None


@dataclass
class DeviceBreakdown:
    """One GPU: the terms over time and at the peak (the peak of `peak_of`), the
    amplification with the two peaks it divides, `missing` (term -> why it is None) and
    `notes` (fallbacks, negative differences). `used_nvml_metric` names the NVML series
    used_nvml comes from (None without NVML)."""

    device: str
    over_time: list[GpuTerms]
    peak: GpuTerms | None
    peak_of: str | None
    peak_reserved_bytes: int | None
    peak_requested_bytes: int | None
    amplification: float | None
    used_nvml_metric: str | None
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class GpuBreakdown:
    """Every GPU seen (in events or NVML samples), by index; `at` is "steps" or "times" (how
    the over-time points were chosen). Without any GPU, `devices` is empty and `notes` say
    what was looked for."""

    devices: list[DeviceBreakdown]
    at: str
    notes: list[str] = field(default_factory=list)


def gpu_breakdown(lifetimes: Lifetimes, events: pd.DataFrame, samples: pd.DataFrame | None, *,
                  meta: RecordingMeta | None = None, points: int = 20,
                  times_ns: np.ndarray | None = None) -> GpuBreakdown:
    """The breakdown of every GPU (module docstring); `meta` refines why a term is missing.
    `times_ns`: the over-time points, chosen before the allocations were read (a folded
    recording's: folded_times), instead of `points` of them over the GPU data."""
    curves = _curves(lifetimes.allocations)
    curves, notes = _place_unindexed_driver(curves, _devices(curves, samples))
    devices = _devices(curves, samples)
    steps = step_marks(events)
    if not devices:
        return GpuBreakdown([], "steps" if len(steps) else "times", _no_gpu_notes(meta))
    if times_ns is None:
        times, at = _times(curves, samples, steps, points)
    else:
        times, at = np.asarray(times_ns, dtype=np.int64), "steps" if len(steps) else "times"
    step_of = _step_at(steps, times)
    reasons = _Reasons(curves, meta)
    breakdowns = [_device(device, curves, samples, times, step_of, steps, reasons) for device in devices]
    return GpuBreakdown(breakdowns, at, notes)


def _place_unindexed_driver(curves: dict, indexed: list[str]) -> tuple[dict, list[str]]:
    """The libcuda uprobes record driver allocations on device "cuda", without the GPU's
    index (the probe does not read the calling context's device). With one GPU known (from
    segments, blocks or NVML) they are that GPU's; with none, they stay a device "cuda" of
    their own; with several, too, and a note says they are not split between the GPUs."""
    curve = curves.get(("driver", UNINDEXED_GPU))
    if curve is None:
        return curves, []
    others = [device for device in indexed if device != UNINDEXED_GPU]
    if len(others) == 1 and ("driver", others[0]) not in curves:
        placed = {key: value for key, value in curves.items() if key != ("driver", UNINDEXED_GPU)}
        placed[("driver", others[0])] = curve
        return placed, []
    if len(others) > 1:
        return curves, [f"cuda_driver allocations are recorded without a GPU index; with {len(others)} GPUs they "
                        f"are shown apart, as device {UNINDEXED_GPU!r}"]
    return curves, []


# ---- inputs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Curve:
    """A layer's live bytes on one device: after every event at `times`; `requested` for
    cuda_block (None elsewhere); `unrequested` counts blocks lacking requested_bytes."""

    times: np.ndarray
    live: np.ndarray
    requested: np.ndarray | None = None
    blocks: int = 0
    unrequested: int = 0


def _curves(allocations: pd.DataFrame) -> dict[tuple[str, str], _Curve]:
    """(term, device) -> _Curve for the cuda layers' allocations on cuda devices."""
    layer_codes, layer_names = category_codes(allocations["layer"])
    device_codes, device_names = category_codes(allocations["device"])
    curves = {}
    for term, layer in _LAYER_OF.items():
        for code, layer_name in enumerate(layer_names):
            if label_of(layer_name) != layer:
                continue
            for dcode, device in enumerate(device_names):
                mask = (layer_codes == code) & (device_codes == dcode)
                if _is_gpu(label_of(device)) and mask.any():
                    curves[(term, label_of(device))] = _curve(allocations[mask], term == "allocated")
    return curves


def _is_gpu(device: str) -> bool:
    """"cuda:N", or "cuda": a driver allocation whose GPU index was not recorded."""
    return device.startswith("cuda:") or device == UNINDEXED_GPU


def _curve(rows: pd.DataFrame, with_requested: bool) -> _Curve:
    weight = rows["weight"].to_numpy(dtype=float) if "weight" in rows else 1.0
    size = rows["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    alloc = rows["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end = end_times(rows)
    times, live = live_curve(alloc, end, np.rint(size * weight).astype(np.int64))
    if not with_requested:
        return _Curve(times, live)
    lacking = rows["requested_bytes"].isna().to_numpy()
    asked = np.where(lacking, size, rows["requested_bytes"].to_numpy(dtype=np.int64, na_value=0))
    req_times, requested = live_curve(alloc, end, np.rint(asked * weight).astype(np.int64))
    return _Curve(times, live, live_at(req_times, requested, times), len(rows), int(lacking.sum()))


def _devices(curves: dict, samples: pd.DataFrame | None) -> list[str]:
    """cuda devices with events or NVML samples, by index."""
    found = {device for _, device in curves}
    if samples is not None and not samples.empty:
        nvml = samples["metric"].isin(["gpu_process_bytes", "gpu_used_bytes"]) & samples["value"].notna()
        found |= {str(d) for d in samples.loc[nvml, "device"].dropna().unique() if str(d).startswith("cuda:")}
    return sorted(found, key=lambda d: (int(d[5:]) if d[5:].isdigit() else 1 << 30, d))


def _times(curves: dict, samples: pd.DataFrame | None, steps: pd.DataFrame, points: int) -> tuple[np.ndarray, str]:
    """The over-time points (module docstring) and "steps" or "times"."""
    points = max(points, 2)
    if len(steps):
        pick = np.unique(np.linspace(0, len(steps) - 1, min(points, len(steps))).round().astype(int))
        return steps["ts_ns"].to_numpy()[pick], "steps"
    spans = [c.times for c in curves.values()]
    if samples is not None and not samples.empty:
        spans.append(samples.loc[samples["device"].astype(str).str.startswith("cuda:"), "ts_ns"].to_numpy())
    every = np.concatenate([s for s in spans if len(s)]).astype(np.int64)
    return np.unique(np.linspace(every.min(), every.max(), points).round().astype(np.int64)), "times"


def folded_times(events: pd.DataFrame, start_ns: int, end_ns: int, points: int) -> np.ndarray:
    """The over-time points of a recording folded as it is read (memprof.bounded), which must
    keep what is live at each before its allocations are read: `points` of its step marks
    (among `events`, its rows other than allocations) as for a whole one, else `points` times
    evenly over the recording from `start_ns` to `end_ns` (a whole one's span its GPU data)."""
    steps = step_marks(events)
    if len(steps):
        return _times({}, None, steps, points)[0]
    return np.unique(np.linspace(start_ns, end_ns, max(points, 2)).round().astype(np.int64))


def _step_at(steps: pd.DataFrame, times: np.ndarray) -> list[int | None]:
    """The step each time falls in (the last step mark at or before it), None before any."""
    index = np.searchsorted(steps["ts_ns"].to_numpy(), times, side="right") - 1
    numbers = steps["step"].to_numpy()
    return [int(numbers[i]) if i >= 0 else None for i in index]


# ---- why a term is missing --------------------------------------------------------------------

class _Reasons:
    """Why a term of a device is None, from what the recording has and its metadata."""

    def __init__(self, curves: dict, meta: RecordingMeta | None):
        self.layers_present = {term for term, _ in curves}
        self.meta = meta

    def of_layer(self, term: str, device: str) -> str:
        layer = _LAYER_OF[term]
        if term in self.layers_present:
            return f"no {layer} events on {device}"
        if term == "driver":
            return f"no {layer} events: {self._driver_why()}"
        return (f"no {layer} events: PyTorch's caching-allocator history was not recorded (the target did not use "
                "CUDA through torch, or record --no-agent)")

    def _driver_why(self) -> str:
        left_out = (self._ebpf_detail().get("left_out") or {}).get("cuda")
        if left_out:
            return f"libcuda was not probed: {left_out}"
        families = self._ebpf_detail().get("families")
        if families is not None and "cuda" not in families:
            return "libcuda was not probed (--sources excluded cuda)"
        return "libcuda was not probed (recorded without a GPU, or --sources excluded it)"

    def nvml(self) -> str:
        stats = self.meta.sources.get("samplers") if self.meta else None
        why = ((stats.detail or {}).get("nvml") or {}).get("reason") if stats else None
        return f"no NVML samples: {why}" if why else "no NVML samples: no NVIDIA GPU or pynvml"

    def _ebpf_detail(self) -> dict:
        stats = self.meta.sources.get("ebpf") if self.meta else None
        return (stats.detail or {}) if stats else {}


def _no_gpu_notes(meta: RecordingMeta | None) -> list[str]:
    reasons = _Reasons({}, meta)
    return ["no GPU memory in this recording", reasons.nvml(), reasons.of_layer("driver", ""),
            reasons.of_layer("reserved", "")]


# ---- one device -------------------------------------------------------------------------------

def _device(device: str, curves: dict, samples, times: np.ndarray, step_of: list, steps: pd.DataFrame,
            reasons: _Reasons) -> DeviceBreakdown:
    nvml_metric, notes = _nvml_metric(samples, device)
    missing = _missing(device, curves, nvml_metric, reasons)
    if "gpu_used" not in missing and not len(sample_series(samples, "gpu_used_bytes", device)[1]):
        missing["gpu_used"] = "no gpu_used_bytes samples"
    values = _terms_at(device, curves, samples, nvml_metric, times)
    over_time = _as_terms(values, times, step_of)
    peak_of, peak_ns = _peak(device, curves, samples, nvml_metric)
    peak = None if peak_of is None else _as_terms(
        _terms_at(device, curves, samples, nvml_metric, np.array([peak_ns])), [peak_ns], _step_at(steps, [peak_ns]))[0]
    reserved = _peak_of_curve(curves.get(("reserved", device)))
    requested = _peak_requested(curves.get(("allocated", device)))
    amplification, why = _amplification(reserved, requested)
    if why:
        missing["amplification"] = why
    notes += _requested_notes(curves.get(("allocated", device))) + _negative_notes(over_time + ([peak] if peak else []))
    return DeviceBreakdown(device=device, over_time=over_time, peak=peak, peak_of=peak_of, peak_reserved_bytes=reserved,
                           peak_requested_bytes=requested, amplification=amplification,
                           used_nvml_metric=nvml_metric, missing=missing, notes=notes)


def _nvml_metric(samples, device: str) -> tuple[str | None, list[str]]:
    """Which NVML series is used_nvml, and a note when it is not the target's own."""
    _, process = sample_series(samples, "gpu_process_bytes", device)
    _, used = sample_series(samples, "gpu_used_bytes", device)
    if len(process) and (process.max() > 0 or not len(used) or used.max() == 0):
        return "gpu_process_bytes", []
    if not len(used):
        return None, []
    if len(process):
        return "gpu_used_bytes", ["gpu_process_bytes is 0 throughout while the GPU's memory is in use (NVML may report "
                                  "host pids in a container): used_nvml is gpu_used_bytes, every process's"]
    return "gpu_used_bytes", ["no gpu_process_bytes (the driver cannot list processes): used_nvml is "
                              "gpu_used_bytes, every process's"]


def _missing(device: str, curves: dict, nvml_metric: str | None, reasons: _Reasons) -> dict[str, str]:
    """term -> why it is None on this device, for every term lacking an input."""
    missing = {}
    if nvml_metric is None:
        missing["used_nvml"] = missing["gpu_used"] = reasons.nvml()
    for term in _LAYER_OF:
        if (term, device) not in curves:
            missing[term] = reasons.of_layer(term, device)
    if "allocated" in missing:
        missing["requested"] = missing["allocated"]
    for term, inputs in list(_DIFFERENCES.items()) + [("fragmentation", ("reserved", "allocated"))]:
        lacking = [name for name in inputs if name in missing]
        if lacking:
            missing[term] = f"needs {' and '.join(lacking)}"
    return missing


def _terms_at(device: str, curves: dict, samples, nvml_metric: str | None, times: np.ndarray) -> dict[str, np.ndarray]:
    """Every term at `times` as float arrays, NaN where not computable."""
    nan = np.full(len(times), np.nan)
    values = {"used_nvml": last_sample_at(samples, nvml_metric, device, times) if nvml_metric else nan,
              "gpu_used": last_sample_at(samples, "gpu_used_bytes", device, times)}
    for term in _LAYER_OF:
        curve = curves.get((term, device))
        values[term] = nan if curve is None else live_at(curve.times, curve.live, times).astype(float)
    blocks = curves.get(("allocated", device))
    values["requested"] = nan if blocks is None else live_at(blocks.times, blocks.requested, times).astype(float)
    for term, (left, right) in _DIFFERENCES.items():
        values[term] = values[left] - values[right]
    with np.errstate(divide="ignore", invalid="ignore"):
        values["fragmentation"] = np.where(values["reserved"] > 0, values["cached_free"] / values["reserved"], np.nan)
    return values


def _as_terms(values: dict[str, np.ndarray], times, step_of: list) -> list[GpuTerms]:
    """One GpuTerms per time; NaN becomes None, bytes become int."""
    rows = []
    for i, ts in enumerate(times):
        terms = {name: _number(values[name][i], name != "fragmentation") for name in TERMS}
        rows.append(GpuTerms(ts_ns=int(ts), step=step_of[i], **terms))
    return rows


def _number(value: float, as_int: bool):
    if np.isnan(value):
        return None
    return int(round(value)) if as_int else float(value)


# ---- peaks ----------------------------------------------------------------------------------

def _peak(device: str, curves: dict, samples, nvml_metric: str | None) -> tuple[str | None, int | None]:
    """(term, ts_ns) of the first peak of the outermost available term of PEAK_ORDER."""
    if nvml_metric is not None:
        ts, values = sample_series(samples, nvml_metric, device)
        return "used_nvml", int(ts[int(np.argmax(values))])
    for term in PEAK_ORDER[1:]:
        curve = curves.get((term, device))
        if curve is not None:
            return term, int(curve.times[int(np.argmax(curve.live))])
    return None, None


def _peak_of_curve(curve: _Curve | None) -> int | None:
    return None if curve is None else int(curve.live.max())


def _peak_requested(blocks: _Curve | None) -> int | None:
    return None if blocks is None else int(blocks.requested.max())


def _amplification(reserved: int | None, requested: int | None) -> tuple[float | None, str]:
    """(peak reserved / peak requested, "") or (None, why)."""
    lacking = [name for name, value in (("reserved", reserved), ("requested", requested)) if value is None]
    if lacking:
        return None, f"needs peak {' and '.join(lacking)}"
    if requested <= 0:
        return None, "peak requested is 0 bytes"
    return reserved / requested, ""


# ---- notes ----------------------------------------------------------------------------------

def _requested_notes(blocks: _Curve | None) -> list[str]:
    if blocks is None or blocks.unrequested == 0:
        return []
    if blocks.unrequested == blocks.blocks:
        return ["no requested_bytes recorded for cuda_block: requested is size_bytes (allocated), so amplification "
                "shows the caching allocator's segment overhead only, not its rounding"]
    return [f"{blocks.unrequested:,} of {blocks.blocks:,} blocks have no requested_bytes: their size_bytes counts "
            "as requested"]


def _negative_notes(rows: list[GpuTerms]) -> list[str]:
    """A note per difference that came out negative somewhere: shown as measured."""
    notes = []
    for term, why in _NEGATIVE_WHY.items():
        negative = sum(1 for row in rows if (getattr(row, term) or 0) < 0)
        if negative:
            left, right = _DIFFERENCES[term]
            notes.append(f"{term} is negative at {negative} of {len(rows)} times ({left} < {right}): {why}; "
                         "shown as measured, not clamped")
    return notes


def terms_dict(terms: GpuTerms) -> dict:
    """A GpuTerms as a plain dict (field order)."""
    return {f.name: getattr(terms, f.name) for f in fields(terms)}

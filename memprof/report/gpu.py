"""Renderers of the GPU breakdown (memprof.analysis.gpu): JSON and the terminal. Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from memprof.analysis.gpu import BYTE_TERMS, TERMS, terms_dict
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.gpu import DeviceBreakdown, GpuTerms
    from memprof.analysis.views import GpuView

# (term, label, how it is derived): the equation top-down, each difference under its minuend.
_EQUATION = (
    ("used_nvml", "NVML used", ""),
    ("context_and_unseen", "  context and unseen", "NVML used − driver"),
    ("driver", "driver (cuda_driver)", ""),
    ("not_pytorch", "  not PyTorch (NCCL, …)", "driver − reserved"),
    ("reserved", "reserved (cuda_segment)", ""),
    ("cached_free", "  cached free", "reserved − allocated"),
    ("allocated", "allocated (cuda_block)", ""),
    ("requested", "  requested", "what the tensors asked for"),
    ("gpu_used", "GPU used, every process", "NVML gpu_used_bytes"),
)
# Over-time columns: (term, header).
_COLUMNS = (("used_nvml", "NVML"), ("driver", "driver"), ("reserved", "reserved"), ("allocated", "allocated"),
            ("context_and_unseen", "context"), ("not_pytorch", "not torch"), ("cached_free", "cached"),
            ("fragmentation", "frag"))
_NONE = "–"


def to_json(view: GpuView) -> dict:
    """JSON-ready dict: recording, lost_events, notes (recording's, then the breakdown's),
    `at` ("steps" or "times") and per device the terms over time and at the peak. Times are
    CLOCK_MONOTONIC ns, sizes bytes; null where a term is not computable (`missing` says why)."""
    result, about = view.result, view.about
    recording_path, lost_events, notes = about.path, about.lost_events, about.notes
    return {
        "recording": str(recording_path),
        "lost_events": int(lost_events),
        "notes": [str(n) for n in notes] + list(result.notes),
        "at": result.at,
        "terms": list(TERMS),
        "devices": [_device_json(d) for d in result.devices],
    }


def _device_json(device: DeviceBreakdown) -> dict:
    return {
        "device": device.device,
        "used_nvml_metric": device.used_nvml_metric,
        "peak_of": device.peak_of,
        "peak": None if device.peak is None else terms_dict(device.peak),
        "peak_reserved_bytes": device.peak_reserved_bytes,
        "peak_requested_bytes": device.peak_requested_bytes,
        "amplification": device.amplification,
        "over_time": [terms_dict(t) for t in device.over_time],
        "missing": dict(device.missing),
        "notes": list(device.notes),
    }


def render(view: GpuView, console: Console) -> None:
    """Per device: the equation at the peak, the amplification, the terms over time, then
    what could not be computed and why, and the device's notes. Times relative to
    `start_ns` (recording start)."""
    result, about = view.result, view.about
    start_ns, lost_events, notes = about.start_ns, about.lost_events, about.notes
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    if lost_events:
        out(f"[yellow]! {lost_events:,} events were lost while recording (ring buffer): the layer terms miss "
            "them.[/]")
    for note in list(notes) + list(result.notes):
        out(f"[dim]note: {escape(str(note))}[/]")
    for device in result.devices:
        _render_device(device, result.at, console, out, start_ns)


def _render_device(device: DeviceBreakdown, at: str, console: Console, out, start_ns: int) -> None:
    if device.peak is not None:
        console.print(_equation_table(device, start_ns))
    else:
        out(f"[bold]{escape(device.device)}[/]: nothing to break down")
    out(f"  amplification: {_amplification(device)}")
    out("")
    console.print(_over_time_table(device, at, start_ns))
    for term, why in device.missing.items():
        out(f"  [dim]{escape(term)}: not computed: {escape(why)}[/]")
    for note in device.notes:
        out(f"  [dim]note: {escape(note)}[/]")
    out("")


def _equation_table(device: DeviceBreakdown, start_ns: int) -> Table:
    peak = device.peak
    when = format_relative_ns(peak.ts_ns, start_ns) + ("" if peak.step is None else f", step {peak.step:,}")
    title = f"[bold]{escape(device.device)}[/] at the peak of {escape(device.peak_of)} ({when})"
    table = Table(title=title, title_justify="left", highlight=False)
    table.add_column("term")
    table.add_column("bytes", justify="right")
    table.add_column("is")
    for term, label, how in _EQUATION:
        shown = label + (f" ({device.used_nvml_metric})" if term == "used_nvml" and device.used_nvml_metric else "")
        if term == "cached_free" and peak.fragmentation is not None:
            how += f"; fragmentation {peak.fragmentation:.1%}"
        table.add_row(escape(shown), _bytes(getattr(peak, term)), escape(how))
    return table


def _amplification(device: DeviceBreakdown) -> str:
    if device.amplification is None:
        return f"{_NONE} ({escape(device.missing.get('amplification', 'not computed'))})"
    return (f"{device.amplification:.2f}× (peak reserved {format_bytes(device.peak_reserved_bytes)} / peak requested "
            f"{format_bytes(device.peak_requested_bytes)})")


def _over_time_table(device: DeviceBreakdown, at: str, start_ns: int) -> Table:
    title = f"{escape(device.device)} at each step" if at == "steps" else f"{escape(device.device)} over time"
    # Ten columns of sizes: no box lines and single spaces between them, so a 100-column
    # terminal shows a row on one line.
    table = Table(title=title, title_justify="left", highlight=False, box=box.SIMPLE_HEAD, padding=(0, 1),
                  pad_edge=False, collapse_padding=True)
    table.add_column("at", justify="right")
    if at == "steps":
        table.add_column("step", justify="right")
    for _, header in _COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    for row in device.over_time:
        step = [] if at != "steps" else [_NONE if row.step is None else f"{row.step:,}"]
        table.add_row(format_relative_ns(row.ts_ns, start_ns), *step, *(_cell(row, term) for term, _ in _COLUMNS))
    return table


def _cell(row: GpuTerms, term: str) -> str:
    value = getattr(row, term)
    if term in BYTE_TERMS:
        return _bytes(value)
    return _NONE if value is None else f"{value:.1%}"


def _bytes(value: int | None) -> str:
    return _NONE if value is None else format_bytes(value)

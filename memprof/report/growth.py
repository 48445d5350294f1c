"""Renderers of growth fits and forecasts (memprof.analysis.growth): JSON and the terminal.
Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from rich import box
from rich.table import Table
from rich.text import Text

# One-line chain naming shared with the layers report (skips allocator frames).
from memprof.model.schema import FRAME_KEYS
from memprof.report.layers import one_line
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_duration_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.growth import Fit, Forecast, GrowthResult, GrowthSeries

_NONE = "–"
_SHORT = {"not_growing": "not growing", "no_capacity": "capacity unknown", "no_fit": "too few points"}
_HOUR_NS, _DAY_NS = 3600 * 10**9, 86400 * 10**9


def growth_to_json(result: GrowthResult, chains: dict[int, list[dict]], recording_path, *, lost_events: int = 0,
                   notes: Iterable[str] = ()) -> dict:
    """JSON-ready dict: recording, lost_events, notes, x_unit ("step" or "s"), step_ns,
    origin_ns and every series with its points, both fits (linear: a + b·x; power: a·x^b;
    bytes), the better one and the forecast. Chains carry their stack, innermost frame first."""
    return {
        "recording": str(recording_path),
        "lost_events": int(lost_events),
        "notes": [str(n) for n in notes] + list(result.notes),
        "x_unit": result.x_unit,
        "step_ns": result.step_ns,
        "origin_ns": int(result.origin_ns),
        "series": [_series_json(s, chains) for s in result.series],
    }


def _series_json(series: GrowthSeries, chains: dict[int, list[dict]]) -> dict:
    out = {"layer": series.layer, "device": series.device, "chain": series.chain, "stack_id": series.stack_id,
           "x": [float(x) for x in series.x], "bytes": [int(v) for v in series.bytes],
           "linear": _fit_json(series.linear), "power": _fit_json(series.power), "better": series.better,
           "forecast": _forecast_json(series.forecast)}
    if series.chain:
        out["stack"] = [{key: frame.get(key) for key in FRAME_KEYS} for frame in _frames(series, chains)]
    return out


def _fit_json(fit: Fit | None) -> dict | None:
    if fit is None:
        return None
    return {"model": fit.model, "a": fit.a, "b": fit.b, "r2": fit.r2, "points": fit.points}


def _forecast_json(forecast: Forecast) -> dict:
    return {"status": forecast.status, "reason": forecast.reason, "capacity_bytes": forecast.capacity_bytes,
            "level_bytes": forecast.level_bytes, "model": forecast.model, "full_at_x": forecast.full_at_x,
            "full_in_ns": forecast.full_in_ns}


def render_growth_table(result: GrowthResult, chains: dict[int, list[dict]], console: Console, *,
                        lost_events: int = 0, notes: Iterable[str] = ()) -> None:
    """One table: each (layer, device) and under it its top chains, with bytes at the last
    point, both fits and the forecast; then the forecasts in words and why some are missing."""
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    if lost_events:
        out(f"[yellow]! {lost_events:,} events were lost while recording (ring buffer): the curves miss them.[/]")
    for note in list(notes) + list(result.notes):
        out(f"[dim]note: {escape(str(note))}[/]")
    if not result.series:
        out("No allocations to fit.")
        return
    console.print(_table(result, chains))
    for line in _forecast_lines(result):
        out(line)


def _title(result: GrowthResult) -> str:
    if result.x_unit == "step":
        per = "" if result.step_ns is None else f" (median step {format_duration_ns(result.step_ns)})"
        return f"[bold]growth per step[/]{per}"
    return "[bold]growth per second[/] (no step marks: x is seconds since the recording start)"


def _table(result: GrowthResult, chains: dict[int, list[dict]]) -> Table:
    """The numbers keep their full width (fixed: rich would crush them); the series names
    take the rest of the line, chains cut with an ellipsis."""
    rows = [[format_bytes(s.bytes[-1]), _slope(s.linear), _r2(s.linear, s.better), _exponent(s.power),
             _r2(s.power, s.better), escape(_short(s.forecast, result.x_unit))] for s in result.series]
    table = Table(title=_title(result), title_justify="left", highlight=False, box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False, collapse_padding=True, expand=True)
    table.add_column("series", no_wrap=True, overflow="ellipsis", ratio=1)
    headers = ("last", f"linear /{result.x_unit}", "R²", "power b", "R²", "forecast")
    for i, name in enumerate(headers):
        width = max([len(name)] + [Text.from_markup(row[i]).cell_len for row in rows])
        table.add_column(name, justify="left" if name == "forecast" else "right", no_wrap=True, width=width)
    for series, row in zip(result.series, rows):
        table.add_row(_name(series, chains), *row)
    return table


def _name(series: GrowthSeries, chains: dict[int, list[dict]]) -> str:
    if series.chain:
        return "  ↳ " + one_line(_frames(series, chains))
    return f"[bold]{escape(series.layer)}[/] {escape(series.device)}"


def _slope(fit: Fit | None) -> str:
    return _NONE if fit is None else format_bytes(fit.b)


def _exponent(fit: Fit | None) -> str:
    return _NONE if fit is None else f"{fit.b:.2f}"


def _r2(fit: Fit | None, better: str | None) -> str:
    """R² to 3 places; the better fit's in bold."""
    if fit is None or fit.r2 is None:
        return _NONE
    text = f"{fit.r2:.3f}"
    return f"[bold]{text}[/]" if fit.model == better else text


def _short(forecast: Forecast, unit: str) -> str:
    if forecast.status == "full":
        where = f"step {int(forecast.full_at_x):,}" if unit == "step" else f"{forecast.full_at_x:,.0f} s"
        return f"full at {where}" + ("" if forecast.full_in_ns is None else f" (in {_duration(forecast.full_in_ns)})")
    return _SHORT[forecast.status]


def _forecast_lines(result: GrowthResult) -> list[str]:
    """Each (layer, device) total's forecast in words, and each unknown capacity's reason once."""
    lines, unknown = [], {}
    for series in result.series:
        forecast = series.forecast
        if forecast.status == "no_capacity":
            unknown.setdefault(series.device, forecast.reason)
        elif not series.chain and forecast.status == "full":
            when = "" if forecast.full_in_ns is None else f" (in {_duration(forecast.full_in_ns)})"
            lines.append(f"  {escape(series.layer)} {escape(series.device)}: {escape(forecast.reason)}{when}, "
                         f"by the {forecast.model} fit, from {format_bytes(forecast.level_bytes)} of "
                         f"{format_bytes(forecast.capacity_bytes)}")
    lines += [f"  [dim]{escape(device)}: {escape(why)}[/]" for device, why in unknown.items()]
    return lines


def _duration(ns: int) -> str:
    """Durations up to days: format_duration_ns stops at minutes."""
    if ns >= 2 * _DAY_NS:
        return f"{ns / _DAY_NS:.1f} days"
    if ns >= 2 * _HOUR_NS:
        return f"{ns / _HOUR_NS:.1f} h"
    return format_duration_ns(ns)


def _frames(series: GrowthSeries, chains: dict[int, list[dict]]) -> list[dict]:
    return [] if series.stack_id is None else chains.get(series.stack_id, [])

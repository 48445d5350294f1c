"""Renderers of growth fits and forecasts (memprof.analysis.growth): JSON and the terminal.
Render only."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich import box
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from memprof.analysis.growth_forecast import (
    FORECAST_HORIZON_NS, FORECAST_HORIZON_YEARS, FORECAST_MIN_POINTS, FORECAST_MIN_R2, forecast_bar, format_count,
    r2_under_bar, span_words, unit_label,
)
from memprof.analysis.growth_regime import (
    REGIME_MIN_POINTS, REGIME_MIN_SIDE, REGIME_MIN_SLOPE_RATIO, REGIME_MIN_SSE_CUT, regime_bar,
)
from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import module_first, one_line  # one chain in one line, allocator frames skipped
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_duration_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.growth import Fit, GrowthResult, GrowthSeries
    from memprof.analysis.growth_forecast import Forecast
    from memprof.analysis.growth_regime import Regime
    from memprof.analysis.views import GrowthView

_NONE = "–"
# On a narrow console the series column keeps at least this many cells (chains are cut with
# "…") and the forecast column wraps, down to _FORECAST_MIN: a short line costs lines, not columns.
_SERIES_MIN, _FORECAST_MIN = 20, 12


def to_json(view: GrowthView) -> dict:
    """JSON-ready dict: recording, lost_events, notes, x_unit ("step", "s" or the quantity's
    name), against (that quantity, or null), by_step and step_marks (whether x was read at
    step marks, and how many the recording has), step_ns, origin_ns, the forecast bar
    (min_points, min_r2, horizon_ns), the regime bar (min_sse_cut, min_slope_ratio, min_points,
    min_side) and every series with its points, both fits (linear: a + b·x; power: a·x^b;
    bytes), the better one, the forecast (full_at_x in x's unit) and the regime change (null:
    none).
    Chains carry their stack, innermost frame first."""
    result, chains, about = view.result, view.chains, view.about
    recording_path, lost_events, notes = about.path, about.lost_events, about.notes
    return {
        "recording": str(recording_path),
        "lost_events": int(lost_events),
        "notes": [str(n) for n in notes] + list(result.notes),
        "x_unit": result.x_unit,
        "against": result.against,
        "by_step": result.by_step,
        "step_marks": result.step_marks,
        "step_ns": result.step_ns,
        "origin_ns": int(result.origin_ns),
        "forecast_bar": {"min_points": FORECAST_MIN_POINTS, "min_r2": FORECAST_MIN_R2,
                         "horizon_ns": FORECAST_HORIZON_NS},
        "regime_bar": {"min_sse_cut": REGIME_MIN_SSE_CUT, "min_slope_ratio": REGIME_MIN_SLOPE_RATIO,
                       "min_points": REGIME_MIN_POINTS, "min_side": REGIME_MIN_SIDE},
        "series": [_series_json(s, chains) for s in result.series],
    }


def _series_json(series: GrowthSeries, chains: dict[int, list[dict]]) -> dict:
    out = {"layer": series.layer, "device": series.device, "chain": series.chain, "stack_id": series.stack_id,
           "x": [float(x) for x in series.x], "bytes": [int(v) for v in series.bytes],
           "linear": _fit_json(series.linear), "power": _fit_json(series.power), "better": series.better,
           "forecast": _forecast_json(series.forecast), "regime": _regime_json(series.regime)}
    if series.chain:
        out["module"] = series.module
        out["stack"] = [{key: frame.get(key) for key in FRAME_KEYS} for frame in _frames(series, chains)]
    return out


def _fit_json(fit: Fit | None) -> dict | None:
    if fit is None:
        return None
    return {"model": fit.model, "a": fit.a, "b": fit.b, "r2": fit.r2, "points": fit.points}


def _regime_json(regime: Regime | None) -> dict | None:
    """The regime change; sse_cut is null when the bent line fits exactly (JSON has no inf)."""
    if regime is None:
        return None
    cut = regime.sse_cut if math.isfinite(regime.sse_cut) else None
    return {"at_x": regime.at_x, "slope_before": regime.slope_before, "slope_after": regime.slope_after,
            "level_at_break": regime.level_at_break, "sse_cut": cut, "r2": regime.r2,
            "points_before": regime.points_before, "points_after": regime.points_after}


def _forecast_json(forecast: Forecast) -> dict:
    return {"status": forecast.status, "reason": forecast.reason, "capacity_bytes": forecast.capacity_bytes,
            "level_bytes": forecast.level_bytes, "model": forecast.model, "points": forecast.points,
            "r2": forecast.r2, "full_at_x": forecast.full_at_x, "full_in_ns": forecast.full_in_ns}


def render(view: GrowthView, console: Console) -> None:
    """One table: each (layer, device) and under it its top chains, with bytes at the last
    point, both fits and the forecast (or why there is none); then the bar a forecast must
    pass, each total's forecast in words, why some capacities are unknown, and each series'
    regime change (or that there is none). Readable from 80 columns: the numbers keep their
    width, the series column at least _SERIES_MIN."""
    result, chains, lost_events, notes = view.result, view.chains, view.about.lost_events, view.about.notes
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    if lost_events:
        out(f"[yellow]! {lost_events:,} events were lost while recording (ring buffer): the curves miss them.[/]")
    for note in list(notes) + list(result.notes):
        out(f"[dim]note: {escape(str(note))}[/]")
    if not result.series:
        out("No allocations to fit.")
        return
    console.print(_narrowed(_table(result, chains), console))
    out("")
    for line in _forecast_lines(result) + _regime_lines(result, chains):
        out(Padding(Text.from_markup(line), (0, 0, 0, 2)))  # wrapped lines keep the indent


def _title(result: GrowthResult) -> str:
    """What x is, and where it was read."""
    if result.against is not None:
        where = "each step mark" if result.by_step else "evenly spaced times"
        return f"[bold]growth per {escape(unit_label(result.x_unit))}[/] (x is {escape(result.against)} at {where})"
    if result.x_unit == "step":
        per = "" if result.step_ns is None else f" (median step {format_duration_ns(result.step_ns)})"
        return f"[bold]growth per step[/]{per}"
    marks = "no step marks" if result.step_marks == 0 else "too few step marks"
    return f"[bold]growth per second[/] ({marks}: x is seconds since the recording start)"


def _forecast_header(result: GrowthResult) -> str:
    """The forecast column's head: the x at which the device fills, or how long until then."""
    if result.against is not None:
        return f"full at {escape(result.against)}"
    return "full at step" if result.x_unit == "step" else "full in"


def _table(result: GrowthResult, chains: dict[int, list[dict]]) -> Table:
    """The numbers keep their full width (fixed: rich would crush them); the series column is
    as wide as its longest name (see _narrowed); the forecast wraps when the line is short."""
    rows = [[format_bytes(s.bytes[-1]), _slope(s.linear), _r2(s.linear, s.better), _exponent(s.power),
             _r2(s.power, s.better), escape(_short(s.forecast, result))] for s in result.series]
    names = [_name(s, chains) for s in result.series]
    table = Table(title=_title(result), title_justify="left", highlight=False, box=box.SIMPLE_HEAD,
                  padding=(0, 1), pad_edge=False, collapse_padding=True, show_edge=False)
    table.add_column("series", no_wrap=True, overflow="ellipsis", width=_widest("series", names))
    headers = ("last", f"per {escape(unit_label(result.x_unit))}", "R²", "power b", "R²")
    for i, name in enumerate(headers):
        table.add_column(name, justify="right", no_wrap=True, width=_widest(name, [row[i] for row in rows]))
    table.add_column(_forecast_header(result), min_width=_FORECAST_MIN)
    for name, row in zip(names, rows):
        table.add_row(name, *row)
    return table


def _widest(header: str, cells: list[str]) -> int:
    """Cells (rich markup) of the widest of a column's header and cells."""
    return max([len(header)] + [Text.from_markup(cell).cell_len for cell in cells])


def _narrowed(table: Table, console: Console) -> Table:
    """Narrow the series column (chains end in "…") by what the table is wider than the
    console, down to _SERIES_MIN; past that the forecast column wraps."""
    series = table.columns[0]
    natural = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    excess = natural - console.width
    if excess > 0:
        series.width = max(min(_SERIES_MIN, series.width), series.width - excess)
    return table


def _name(series: GrowthSeries, chains: dict[int, list[dict]]) -> str:
    if series.chain:
        return "  ↳ " + escape(module_first(series.module)) + one_line(_frames(series, chains))
    return f"[bold]{escape(series.layer)}[/] {escape(series.device)}"


def _slope(fit: Fit | None) -> str:
    return _NONE if fit is None else format_bytes(fit.b)


def _exponent(fit: Fit | None) -> str:
    """b to 2 places; past ±1000 (a fit no one would read) in powers of ten, so it stays short."""
    if fit is None:
        return _NONE
    return f"{fit.b:.2f}" if abs(fit.b) < 1000 else f"{fit.b:.0e}"


def _r2(fit: Fit | None, better: str | None) -> str:
    """R² to 2 places, "<0" below 0 (worse than the mean: how much worse says nothing); the
    better fit's in bold."""
    if fit is None or fit.r2 is None:
        return _NONE
    text = "<0" if fit.r2 < 0 else f"{fit.r2:.2f}"
    return f"[bold]{text}[/]" if fit.model == better else text


def _short(forecast: Forecast, result: GrowthResult) -> str:
    """The forecast cell, under "full at step", "full at NAME" or "full in" (time): the step
    and how long until then ("1,234 (3.2 h)"), the quantity's value ("≈ 1.2 M") or the time;
    or "– " and why there is none. Short enough for 80 columns (the thresholds are in the
    bar's sentence under the table)."""
    status = forecast.status
    if status == "full":
        when = "" if forecast.full_in_ns is None else span_words(forecast.full_in_ns)
        if result.against is not None:  # the time, when known, is in the words under the table: 80 columns
            return f"≈ {format_count(forecast.full_at_x)}"
        return (f"{int(forecast.full_at_x):,}" + (f" ({when})" if when else "")) if result.x_unit == "step" else when
    why = {"too_few_points": f"only {forecast.points} points", "poor_fit": f"R² {_r2_words(forecast.r2)}",
           "not_growing": "not growing", "no_capacity": "no capacity",
           "beyond_horizon": f"over {FORECAST_HORIZON_YEARS} years"}
    return f"{_NONE} {why[status]}"


def _r2_words(r2: float | None) -> str:
    """An R² under the forecast's bar (growth_forecast.r2_under_bar)."""
    return "undefined" if r2 is None else r2_under_bar(r2)


def _forecast_lines(result: GrowthResult) -> list[str]:
    """The bar; each (layer, device) total's forecast in words (or why there is none); each
    unknown capacity's reason once. Rich markup, one line each."""
    lines, unknown = [f"[dim]{escape(forecast_bar())}[/]"], {}
    for series in result.series:
        forecast = series.forecast
        if forecast.status == "no_capacity":
            unknown.setdefault(series.device, forecast.reason)
        elif not series.chain:
            lines.append(f"{escape(series.layer)} {escape(series.device)}: {escape(_words(forecast))}")
    lines += [f"[dim]{escape(device)}: {escape(why)}[/]" for device, why in unknown.items()]
    return lines


def _regime_lines(result: GrowthResult, chains: dict[int, list[dict]]) -> list[str]:
    """Each series whose growth changes regime, in one line ("native_heap cpu: growth changes
    regime at tokens = 400: 12.0 KiB/token before, 48.0 KiB/token after"), or one line saying
    none does, with the bar. Rich markup."""
    lines = [f"{_regime_name(s, chains)}: {_regime_words(s.regime, result)}" for s in result.series if s.regime]
    return lines or [f"No regime change[dim]: {escape(regime_bar())}[/]"]


def _regime_name(series: GrowthSeries, chains: dict[int, list[dict]]) -> str:
    if series.chain:
        return "↳ " + escape(module_first(series.module)) + one_line(_frames(series, chains))
    return f"{escape(series.layer)} {escape(series.device)}"


def _regime_words(regime: Regime, result: GrowthResult) -> str:
    """"growth changes regime at step 412: 12.0 KiB/step before, 48.0 KiB/step after"."""
    unit = escape(unit_label(result.x_unit))
    if result.against is not None:
        where = f"{escape(result.against)} = {format_count(regime.at_x)}"
    elif result.x_unit == "step":
        where = f"step {regime.at_x:,.0f}"
    else:
        where = f"{regime.at_x:.1f} s"
    return (f"growth changes regime at {where}: {format_bytes(regime.slope_before)}/{unit} before, "
            f"{format_bytes(regime.slope_after)}/{unit} after")


def _words(forecast: Forecast) -> str:
    """A total's forecast in one sentence: its reason, and for a date the fit and the level it
    starts from."""
    if forecast.status == "beyond_horizon":
        return forecast.reason
    if forecast.status != "full":
        return f"no forecast: {forecast.reason}"
    fit = "line since the regime change" if forecast.model == "since_break" else f"{forecast.model} fit"
    return (f"{forecast.reason}, by the {fit} (R² {_r2_words(forecast.r2)}, {forecast.points} points), "
            f"from {format_bytes(forecast.level_bytes)} of {format_bytes(forecast.capacity_bytes)}")


def _frames(series: GrowthSeries, chains: dict[int, list[dict]]) -> list[dict]:
    return [] if series.stack_id is None else chains.get(series.stack_id, [])

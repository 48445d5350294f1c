"""Forecasts of growth fits (memprof.analysis.growth): when a series' growth fills its
device, and the bar a fit must pass before memprof says so. Pure Python (no numpy, no pandas),
so that the command's `--help` states the same thresholds the analysis applies.

The bar: a forecast is given only from a fit with at least FORECAST_MIN_POINTS points, an R²
of at least FORECAST_MIN_R2 and a positive linear slope, and only when the device fills within
FORECAST_HORIZON_YEARS; otherwise the forecast says which of these failed. Times are ns, sizes
bytes, x a step number, seconds since the recording's origin, or the value of a quantity
(`report growth --against tokens`: x in tokens, and the forecast is the tokens at which the
device fills).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprof.units import format_bytes

if TYPE_CHECKING:
    import numpy as np

    from memprof.analysis.growth import Fit

# Five noisy steps once gave "RAM full at step 971": fewer points than this are chance.
FORECAST_MIN_POINTS = 8
# The fit must explain this share of the variance of live bytes; below it a date is noise.
FORECAST_MIN_R2 = 0.8
# Further out than this, a date is no forecast (a near-flat power law gave "in 9.1e58 days").
FORECAST_HORIZON_YEARS = 10

STEP, SECOND = "step", "s"  # the unit of x: step marks, else seconds (or a quantity's name)
# What one unit of a quantity is called after "per": "per token" reads, "per tokens" does not.
# Any other quantity is named as it is ("per seq_len").
_UNIT_NAMES = {"tokens": "token", STEP: "step", SECOND: "s"}
_MINUTE_S, _HOUR_S, _DAY_S = 60, 3600, 86400
_YEAR_S = 365.25 * _DAY_S
FORECAST_HORIZON_NS = int(FORECAST_HORIZON_YEARS * _YEAR_S * 1e9)


def forecast_bar() -> str:
    """The bar in one sentence, for the report and for `--help`."""
    return (f"A forecast needs a fit of at least {FORECAST_MIN_POINTS} points with R² ≥ {FORECAST_MIN_R2:.2f} "
            f"and a positive linear slope, and a device that fills within {FORECAST_HORIZON_YEARS} years.")


def unit_label(x_unit: str) -> str:
    """One unit of x, as it follows "per": "token" for tokens, "step", "s", else the name."""
    return _UNIT_NAMES.get(x_unit, x_unit)


def format_count(x: float) -> str:
    """A quantity's value, short: '412', '12.5', '48.3 k', '1.2 M', '3.0 G'; past 10^15 in
    powers of ten ('2e+18'): a count nobody would read digit by digit."""
    size = abs(x)
    if size >= 1e15:
        return f"{x:.0e}"
    for at_least, scale, suffix in ((1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if size >= at_least:
            return f"{x / scale:.1f} {suffix}"
    return f"{x:,.0f}" if size >= 100 or x == int(x) else f"{x:.3g}"


def span_words(ns: float) -> str:
    """A span of `ns` nanoseconds (≥ 0, at most about the horizon) in the largest unit that
    keeps it short: '45 s', '12 min', '3.2 h', '18 days', '2.5 years'."""
    s = ns / 1e9
    if s < 100:
        return f"{s:.0f} s"
    if s < 2 * _HOUR_S:
        return f"{s / _MINUTE_S:.0f} min"
    if s < 2 * _DAY_S:
        return f"{s / _HOUR_S:.1f} h"
    if s < _YEAR_S:
        return f"{s / _DAY_S:.0f} days"
    return f"{s / _YEAR_S:.1f} years"


@dataclass(frozen=True)
class Forecast:
    """When the series' growth fills its device, or why memprof will not say.

    `status`: "full" (at `full_at_x`, a step number, seconds since the start or the
    quantity's value, `full_in_ns` after the last point: 0 when already there, None when a
    quantity's pace is unknown); "beyond_horizon" (not within
    FORECAST_HORIZON_YEARS); or no forecast: "too_few_points", "poor_fit" (R² below the bar),
    "not_growing" (linear slope ≤ 0, or the better model falls), "no_capacity". `reason` says
    it in words. `level_bytes` is where the device stood at the last point. `model`, `points`
    and `r2` are those of the fit judged (the better one); without a fit, `points` is how many
    there were and the others None."""

    status: str
    reason: str
    capacity_bytes: int | None = None
    level_bytes: int | None = None
    model: str | None = None
    points: int | None = None
    r2: float | None = None
    full_at_x: float | None = None
    full_in_ns: int | None = None


@dataclass(frozen=True)
class SeriesContext:
    """What every series of one (layer, device) shares: the points' x (steps or seconds since
    the origin, ascending; or a quantity's values, in checkpoint order), their unit ("step",
    "s" or the quantity's name), the median step (ns), the device's capacity (bytes; None with
    the reason why) and, for a GPU, NVML's last used bytes. With a quantity: `against` is its
    name and `ns_per_x` how long one unit of it took over the recording (None when it did not
    rise with time: then no time is put on a forecast, nor a horizon)."""

    x: np.ndarray
    x_unit: str
    step_ns: int | None
    capacity: int | None
    no_capacity_reason: str
    device_used: int | None
    against: str | None = None
    ns_per_x: float | None = None


# ---- forecast -------------------------------------------------------------------------------

def forecast(linear: Fit | None, best: Fit | None, ctx: SeriesContext, level: int, device: str) -> Forecast:
    """When `level` (bytes at the last point) plus the growth of `best` (the better fit) after
    the last point reaches the device's capacity; or, when `best` fails the bar (module
    docstring) or the capacity is unknown, why there is no forecast."""
    known = _judged(best, len(ctx.x)) | dict(capacity_bytes=ctx.capacity, level_bytes=level)
    refused = _below_bar(linear, best, ctx, known)
    if refused is not None:
        return refused
    if ctx.capacity is None:
        return Forecast("no_capacity", ctx.no_capacity_reason, **known)
    x_last = float(ctx.x[-1])
    x_full = _x_reaching(best, x_last, ctx.capacity - level)
    if not math.isfinite(x_full) or (_span_ns(x_full - x_last, ctx) or 0) > FORECAST_HORIZON_NS:
        reason = f"at this rate {_device_name(device)} is not full within {FORECAST_HORIZON_YEARS} years"
        return Forecast("beyond_horizon", reason, **known)
    return _full(ctx, x_last, x_full, device, known)


def _judged(best: Fit | None, points: int) -> dict:
    """The Forecast fields naming the fit judged: its model, points and R²; without a fit,
    the `points` there were."""
    return dict(points=points) if best is None else dict(model=best.model, points=best.points, r2=best.r2)


def r2_under_bar(r2: float) -> str:
    """An R² under FORECAST_MIN_R2 to two places, rounded down where rounding would reach the
    bar: 0.7998 reads 0.79, never "R² 0.80 < 0.80"."""
    shown = f"{r2:.2f}"
    return shown if float(shown) < FORECAST_MIN_R2 else f"{math.floor(r2 * 100) / 100:.2f}"


_FIT_WORDS = {"linear": "the line", "power": "the power law", "since_break": "the line since the regime change"}


def _below_bar(linear: Fit | None, best: Fit | None, ctx: SeriesContext, known: dict) -> Forecast | None:
    """The forecast that says why `best` is not good enough to forecast from: too few points,
    an R² under FORECAST_MIN_R2, or no growth (the line's slope ≤ 0, or `best` falling);
    None when it passes. `known`: the fields every forecast carries."""
    if known["points"] < FORECAST_MIN_POINTS:
        reason = f"too few points to forecast: {known['points']} < {FORECAST_MIN_POINTS}"
        return Forecast("too_few_points", reason, **known)
    if best is None or best.r2 is None or best.r2 < FORECAST_MIN_R2:  # None: one x (a quantity that never changed)
        if best is None or best.r2 is None:
            return Forecast("poor_fit", f"fit too poor to forecast: R² undefined < {FORECAST_MIN_R2:.2f}", **known)
        # The fit is named: the line since a regime change is in no column of the table.
        fit = _FIT_WORDS.get(best.model, best.model)
        return Forecast("poor_fit", f"fit too poor to forecast: R² {r2_under_bar(best.r2)} ({fit}) < "
                                    f"{FORECAST_MIN_R2:.2f}", **known)
    if linear is None or linear.b <= 0 or not best.growing:
        slope = "" if linear is None else f": {format_bytes(linear.b)} per {_unit_words(ctx)}"
        return Forecast("not_growing", f"not growing{slope}", **known)
    return None


def _unit_words(ctx: SeriesContext) -> str:
    if ctx.against is not None:
        return unit_label(ctx.against)
    return "step" if ctx.x_unit == STEP else "second"


def _span_ns(dx: float, ctx: SeriesContext) -> float | None:
    """`dx` steps, seconds or units of the quantity as ns; a step takes the median step time,
    at least 1 ns (so that marks sharing a time still bound the step number); a quantity's
    unit `ns_per_x` (None when unknown)."""
    if ctx.against is not None:
        return None if ctx.ns_per_x is None else dx * ctx.ns_per_x
    return dx * max(ctx.step_ns or 0, 1) if ctx.x_unit == STEP else dx * 1e9


def _device_name(device: str) -> str:
    return "the machine's RAM" if device == "cpu" else device


def _x_reaching(fit: Fit, x_last: float, headroom: float) -> float:
    """The x at which the fit has grown by `headroom` bytes since `x_last` (x_last when the
    headroom is already used up); inf when it never does (overflow)."""
    if headroom <= 0:
        return x_last
    if fit.model != "power":  # a line: the linear fit, or the line since a regime change
        return x_last + headroom / fit.b
    try:
        return ((fit.a * x_last ** fit.b + headroom) / fit.a) ** (1.0 / fit.b)
    except OverflowError:
        return math.inf


def _full(ctx: SeriesContext, x_last: float, x_full: float, device: str, known: dict) -> Forecast:
    """A "full" forecast: at a whole step (the first step at or past x_full), a time, or a
    value of the quantity, and how long after the last point (when known), in words."""
    if x_full <= x_last:
        return Forecast("full", f"{_device_name(device)} is already full", full_at_x=x_last, full_in_ns=0, **known)
    if ctx.against is not None:
        at, in_ns, where = _at_quantity(ctx, x_last, x_full)
    elif ctx.x_unit == STEP:
        at = float(math.ceil(x_full))
        in_ns = None if ctx.step_ns is None else int(round((at - x_last) * ctx.step_ns))
        where = f"at step {int(at):,}" + ("" if in_ns is None else f", in {span_words(in_ns)}")
    else:
        at = x_full
        in_ns = int(round((x_full - x_last) * 1e9))
        where = f"in {span_words(in_ns)}"
    reason = f"at this rate {_device_name(device)} is full {where}"
    return Forecast("full", reason, full_at_x=at, full_in_ns=in_ns, **known)


def _at_quantity(ctx: SeriesContext, x_last: float, x_full: float) -> tuple[float, int | None, str]:
    """(x, ns after the last point or None, words) of a fill at the quantity's value `x_full`:
    "at tokens ≈ 1.2 M", with ", in 3.2 h" when the quantity's pace is known."""
    span = _span_ns(x_full - x_last, ctx)
    in_ns = None if span is None else int(round(span))
    where = f"at {ctx.against} ≈ {format_count(x_full)}" + ("" if in_ns is None else f", in {span_words(in_ns)}")
    return x_full, in_ns, where

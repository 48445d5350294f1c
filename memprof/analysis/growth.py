"""Growth: how each layer's live bytes (and its biggest chains') rise with training steps —
or with time when the recording has no step marks — fitted by a line and by a power law, and
when that growth would fill the device.

Pure functions over lifetimes, the timeline and the `samples` table; no I/O. Times are
CLOCK_MONOTONIC ns, sizes bytes. A series is one (layer, device): bytes are never added
across layers (DESIGN.md §3), nor across devices (each has its own capacity).

The checkpoints are the step marks (the live bytes once every event at the mark's time is
counted, i.e. what the steps before it left behind) when there are at least MIN_POINTS of
them, else `points` evenly spaced times (the result's notes say so when there were 1 or 2
step marks: "only 1 step mark: judged at 50 times 0.40s apart"). x is the step number, else
seconds since the recording start; or, `against` a quantity (`report growth --against
tokens`), that quantity's value at each checkpoint: its last `quantity:NAME` sample (device "")
at or before it, checkpoints before its first sample left out. V(x) is the series' live bytes
there, each allocation weighted by `weight` (sampled sources).

Models, fitted by least squares:
- linear: V = a + b·x (b in bytes per step, or per second);
- power:  V = a·x^b, fitted in log-log space over the points with x > 0 and V > 0.
Each carries R² computed in the original space (the power model's over the points with
x > 0), so the two compare; the better fit is the higher R² (a tie goes to the line).
Each series also gets its regime change, if any (memprof.analysis.growth_regime): the x where
one line bent once fits far better than one line, and better than the power law.

Forecast, only from a fit that passes the bar of memprof.analysis.growth_forecast (enough points,
R², a positive linear slope; else the forecast says which failed): from the better model
extrapolated from the last point, the device is full when its level there (the most of the
series' last bytes and, for a GPU, NVML's last `gpu_used_bytes`) plus the model's further
growth reaches the capacity (`gpu_total_bytes` for cuda:N; `host_memory_total_bytes`, the
machine's RAM, for cpu), within FORECAST_HORIZON_YEARS. Memory the rest of the machine uses
is unknown for cpu, so its forecast is the latest it could be.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.checkpoints import step_marks
from memprof.analysis.growth_forecast import SECOND, STEP, Forecast, SeriesContext, forecast
from memprof.analysis.growth_regime import Regime, regime_change
from memprof.analysis.layers import live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of, live_mask
from memprof.analysis.modules import with_chain_modules
from memprof.errors import UsageError
from memprof.model.schema import LAYERS, QUANTITY_DEVICE, QUANTITY_PREFIX
from memprof.units import format_duration_ns

MIN_POINTS = 3  # two points always fit a line exactly: R² would say nothing


class UnknownQuantityError(UsageError):
    """`--against NAME` names a quantity the recording does not have (exit 2); the hint lists
    those it has."""


@dataclass(frozen=True)
class Fit:
    """One fitted model. linear: V = a + b·x; power: V = a·x^b; since_break: the line the
    growth follows since its regime change, V = a + b·x (what a forecast extrapolates when
    there is one). V in bytes, x in steps, seconds or the quantity's unit. `r2` is R² in the
    original space (None when V is constant and the model misses it); `points` how many
    points the fit used."""

    model: str
    a: float
    b: float
    r2: float | None
    points: int

    def at(self, x):
        """The model's bytes at x (array or scalar)."""
        x = np.asarray(x, dtype=float)
        return self.a + self.b * x if self.model != "power" else self.a * np.power(x, self.b)

    @property
    def growing(self) -> bool:
        """Rising with x: a positive slope (linear), a > 0 and b > 0 (power)."""
        return self.b > 0 if self.model != "power" else (self.a > 0 and self.b > 0)


@dataclass(frozen=True)
class GrowthSeries:
    """One (layer, device)'s live bytes (`chain` False) or one chain's within it (`stack_id`
    None: allocations recorded without a stack): the points (`x`, `bytes`), both fits (None
    when too few points), which fits better, the forecast, and where the growth changes
    regime (None: it does not, or too few points to tell)."""

    layer: str
    device: str
    chain: bool
    stack_id: int | None
    x: np.ndarray
    bytes: np.ndarray
    linear: Fit | None
    power: Fit | None
    better: str | None
    forecast: Forecast
    regime: Regime | None = None
    module: str | None = None  # a chain's: the nn.Module path most of it was allocated in

    @property
    def best(self) -> Fit | None:
        return self.linear if self.better == "linear" else self.power if self.better == "power" else None


@dataclass
class GrowthResult:
    """Series in layer order (schema order, then device), each (layer, device) total
    followed by its top chains by bytes at the last point. `x_unit` is "step", "s" or the
    quantity's name; `against` that quantity (None: x is the step number or seconds);
    `by_step` whether the checkpoints are step marks (False: evenly spaced times), `step_marks`
    how many step marks the recording has; `step_ns` the median step duration (None with
    fewer than two steps); `origin_ns` is x = 0 in time mode."""

    x_unit: str
    step_ns: int | None
    origin_ns: int
    series: list[GrowthSeries]
    notes: list[str] = field(default_factory=list)
    against: str | None = None
    by_step: bool = True
    step_marks: int = 0


@dataclass(frozen=True)
class _Axis:
    """Where the series are read (`times`, ns ascending) and their `x` there, in `unit`;
    `ns_per_x` (a quantity's pace) and the notes that say how x was found."""

    times: np.ndarray
    x: np.ndarray
    unit: str
    origin_ns: int
    notes: tuple[str, ...] = ()
    ns_per_x: float | None = None


def growth(lifetimes: Lifetimes, events: pd.DataFrame, samples: pd.DataFrame | None, *, origin_ns: int = 0,
           points: int = 50, top: int = 3, layers: Iterable[str] | None = None,
           canonical_stack: Mapping[int, int] | None = None, against: str | None = None,
           times_ns: np.ndarray | None = None) -> GrowthResult:
    """Fit every (layer, device) of `lifetimes` (only `layers` when given) and its `top`
    chains (module docstring). `events` gives the step marks; `samples` the capacities,
    NVML's used bytes and the quantities; `origin_ns` (the recording start) is x = 0 when
    x is time. `against`: x is this quantity's value ("step" or None: the step number, else
    seconds); raises UnknownQuantityError when the recording has no such quantity.
    `times_ns` (ascending): where to read the series when x is time, instead of `points`
    evenly spaced times (a folded recording: the times its fold kept what was live at)."""
    quantity = None if against in (None, STEP) else against
    if quantity is not None:
        check_quantity(samples, quantity)
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    steps = step_marks(events)
    axis = _points(allocations, steps, origin_ns, points, times_ns)
    axis = axis if quantity is None else _against(axis, samples, quantity)
    step_ns = median_step_ns(steps)
    result = GrowthResult(x_unit=axis.unit, step_ns=step_ns, origin_ns=axis.origin_ns, series=[],
                          notes=list(axis.notes), against=quantity, by_step=len(steps) >= MIN_POINTS,
                          step_marks=len(steps))
    if len(axis.times) == 0:
        result.notes.append("no allocations to fit" if quantity is None else f"no checkpoint has a {quantity} value")
        return result
    wanted = set(layers) if layers else None
    for (layer, device), cols in _groups(allocations, wanted):
        context = SeriesContext(axis.x, axis.unit, step_ns, *device_capacity(samples, device),
                                _device_used(samples, device), against=quantity, ns_per_x=axis.ns_per_x)
        result.series += _layer_series(layer, device, cols, axis.times, context, top)
    result.series = with_chain_modules(result.series, allocations, folded=lifetimes.folded_modules_of(wanted),
                                       canonical_stack=canonical_stack)
    return result



# ---- quantities -----------------------------------------------------------------------------

def quantity_names(samples: pd.DataFrame | None) -> list[str]:
    """The quantities the recording carries (its `quantity:NAME` sample series), sorted."""
    if samples is None or samples.empty:
        return []
    metrics = (str(m) for m in samples["metric"].unique())
    return sorted(m[len(QUANTITY_PREFIX):] for m in metrics if m.startswith(QUANTITY_PREFIX))


def check_quantity(samples: pd.DataFrame | None, name: str) -> None:
    """Raise UnknownQuantityError, whose hint lists what `--against` takes here, unless the
    recording carries the quantity `name`."""
    names = quantity_names(samples)
    if name in names:
        return
    if names:
        hint = f"--against takes one of: {', '.join([STEP] + names)}"
    else:
        hint = (f"this recording has no quantities, so --against takes only {STEP}; they come from "
                "memprof.mark(label, tokens=…) and from the agent (batch, seq_len of each outermost forward)")
    raise UnknownQuantityError(f"no quantity {name!r} in this recording", hint)


def _against(axis: _Axis, samples: pd.DataFrame | None, quantity: str) -> _Axis:
    """`axis` with x the quantity's value at each checkpoint (its last sample at or before
    it), checkpoints before its first sample left out (and counted in a note)."""
    values = last_sample_at(samples, QUANTITY_PREFIX + quantity, QUANTITY_DEVICE, axis.times)
    known = ~np.isnan(values)
    times, x = axis.times[known], values[known]
    notes = list(axis.notes)
    if not known.all() and known.any():
        notes.append(f"{int((~known).sum())} of {len(known)} checkpoints come before the first {quantity} value: "
                     "left out")
    return _Axis(times, x, quantity, axis.origin_ns, tuple(notes), _ns_per_x(times, x))


def _ns_per_x(times: np.ndarray, x: np.ndarray) -> float | None:
    """ns per unit of the quantity from the first checkpoint to the last, None unless it rose."""
    if len(x) < 2 or not x[-1] > x[0] or not times[-1] > times[0]:
        return None
    return float(times[-1] - times[0]) / float(x[-1] - x[0])


# ---- points ---------------------------------------------------------------------------------

def median_step_ns(steps: pd.DataFrame) -> int | None:
    """Median time per step between step marks (ns); None with fewer than two marks. Gaps in
    the numbering count as that many steps."""
    if len(steps) < 2:
        return None
    per_step = np.diff(steps["ts_ns"].to_numpy()) / np.diff(steps["step"].to_numpy())
    return int(round(float(np.median(per_step))))


def _points(allocations: pd.DataFrame, steps: pd.DataFrame, origin_ns: int, points: int,
            times_ns=None) -> _Axis:
    """The step marks when there are at least MIN_POINTS, x the step number; else `times_ns`
    where given (a fold's window ends, with a note saying so), or `points` evenly spaced
    times over the allocations' span, x in seconds since `origin_ns` (the first allocation
    when `origin_ns` is unset or later than it), with a note when there were step marks,
    too few of them (one or two marks gave one or two points: no fit at all)."""
    if len(steps) >= MIN_POINTS:
        return _Axis(steps["ts_ns"].to_numpy(), steps["step"].to_numpy(dtype=float), STEP, origin_ns)
    if times_ns is not None:
        times = np.asarray(times_ns, dtype=np.int64)
        gap = format_duration_ns(int((times[-1] - times[0]) // max(len(times) - 1, 1))) if len(times) else "0s"
        note = (f"folded: judged at the {len(times)} window ends its fold kept what was live at, {gap} apart, "
                f"not at {points} evenly spaced times")
        return _Axis(times, (times - origin_ns) / 1e9, SECOND, origin_ns, (note,))
    if allocations.empty:
        return _Axis(np.array([], dtype=np.int64), np.array([]), SECOND, origin_ns)
    first = int(allocations["alloc_ts_ns"].min())
    ends = allocations["end_ts_ns"].max()
    last = max(int(allocations["alloc_ts_ns"].max()), first if pd.isna(ends) else int(ends))
    origin_ns = origin_ns if 0 < origin_ns <= first else first
    times = np.unique(np.linspace(first, last, max(points, 2)).round().astype(np.int64))
    return _Axis(times, (times - origin_ns) / 1e9, SECOND, origin_ns, _too_few_steps(len(steps), times))


def _too_few_steps(marks: int, times: np.ndarray) -> tuple[str, ...]:
    """The note that growth was judged over time because the recording has only 1 or 2 step
    marks: "only 1 step mark: judged at 50 times 400.0ms apart"."""
    if marks == 0:
        return ()
    gap = "" if len(times) < 2 else f" {format_duration_ns(int((times[-1] - times[0]) // (len(times) - 1)))} apart"
    plural = "s" if marks > 1 else ""
    return (f"only {marks} step mark{plural}: judged at {len(times)} evenly spaced times{gap} instead",)


def live_at(curve_times: np.ndarray, curve_live: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Live bytes at each time of `at` from a live_curve: the value after every event at or
    before it; 0 before the first event."""
    index = np.searchsorted(curve_times, at, side="right") - 1
    return np.where(index >= 0, curve_live[np.maximum(index, 0)], 0)


def last_sample_at(samples: pd.DataFrame | None, metric: str, device: str, at: np.ndarray) -> np.ndarray:
    """Each time's value of the series (metric, device): its last sample at or before it,
    NaN before the first (or with no such series)."""
    ts, values = sample_series(samples, metric, device)
    index = np.searchsorted(ts, at, side="right") - 1
    return np.where(index >= 0, values[np.maximum(index, 0)] if len(values) else np.nan, np.nan)


def sample_series(samples: pd.DataFrame | None, metric: str, device: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts_ns ascending, values) of one sampled series; samples without a value are left out."""
    if samples is None or samples.empty:
        return np.array([], dtype=np.int64), np.array([], dtype=float)
    mine = ((samples["metric"] == metric) & (samples["device"] == device) & samples["value"].notna()).to_numpy()
    ts = samples["ts_ns"].to_numpy(dtype=np.int64)[mine]
    order = np.argsort(ts, kind="stable")
    return ts[order], samples["value"].to_numpy(dtype=float)[mine][order]


# ---- capacity -------------------------------------------------------------------------------

def device_capacity(samples: pd.DataFrame | None, device: str) -> tuple[int | None, str]:
    """(bytes, "") of the device's memory from its latest sample, or (None, why)."""
    metric = "host_memory_total_bytes" if device == "cpu" else "gpu_total_bytes" if device.startswith("cuda:") else None
    if metric is None:
        return None, f"capacity of {device} unknown: no memory size is sampled for it"
    _, values = sample_series(samples, metric, device)
    if len(values):
        return int(values[-1]), ""
    if device == "cpu":
        return None, "capacity unknown: no host_memory_total_bytes sample (recorded before memprof sampled MemTotal)"
    return None, f"capacity of {device} unknown: no gpu_total_bytes sample (no NVML when recorded)"


def _device_used(samples: pd.DataFrame | None, device: str) -> int | None:
    """The GPU's last NVML `gpu_used_bytes` (every process's), None for cpu or without NVML."""
    _, values = sample_series(samples, "gpu_used_bytes", device) if device.startswith("cuda:") else (None, [])
    return int(values[-1]) if len(values) else None


# ---- series ---------------------------------------------------------------------------------

def _groups(allocations: pd.DataFrame, wanted: set[str] | None):
    """((layer, device), columns frame) for each present pair, layers in schema order."""
    layer_codes, layer_names = category_codes(allocations["layer"])
    device_codes, device_names = category_codes(allocations["device"])
    pairs = np.unique(np.stack([layer_codes, device_codes], 1), axis=0) if len(allocations) else []
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    named = [(label_of(layer_names[lc]), label_of(device_names[dc]), lc, dc) for lc, dc in pairs if lc >= 0 and dc >= 0]
    named.sort(key=lambda n: (rank.get(n[0], len(rank)), n[0], _device_key(n[1])))
    columns = _series_columns(allocations)
    for layer, device, lc, dc in named:
        if wanted is None or layer in wanted:
            yield (layer, device), columns[(layer_codes == lc) & (device_codes == dc)]


def _device_key(device: str) -> tuple:
    kind, _, index = device.partition(":")
    return (kind, int(index)) if index.isdigit() else (kind, -1)


def _series_columns(allocations: pd.DataFrame) -> pd.DataFrame:
    """alloc, end (int64 max: never ended), weighted bytes and stack (-1: none) per allocation."""
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    weight = allocations["weight"].to_numpy(dtype=float) if "weight" in allocations else 1.0
    return pd.DataFrame({
        "alloc": allocations["alloc_ts_ns"].to_numpy(dtype=np.int64),
        "end": end_times(allocations),
        "size": np.rint(size * weight).astype(np.int64),
        "stack": allocations["stack_id"].to_numpy(dtype=np.int64, na_value=-1),
    })


def _layer_series(layer: str, device: str, cols: pd.DataFrame, times: np.ndarray, ctx: SeriesContext,
                  top: int) -> list[GrowthSeries]:
    """The (layer, device) total, then its `top` chains: those that grew most from the first
    point to the last, then those holding most at the last point."""
    total = _curve_at(cols, times)
    level = max(int(total[-1]), ctx.device_used or 0)
    series = [_series(layer, device, False, None, total, ctx, level)]
    for stack in _top_chains(cols, int(times[0]), int(times[-1]), top):
        mine = cols[cols["stack"].to_numpy() == stack]
        stack_id = None if stack < 0 else int(stack)
        series.append(_series(layer, device, True, stack_id, _curve_at(mine, times), ctx, level))
    return series


def _curve_at(cols: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    curve_times, live = live_curve(cols["alloc"].to_numpy(), cols["end"].to_numpy(), cols["size"].to_numpy())
    return live_at(curve_times, live, times).astype(float)


def _top_chains(cols: pd.DataFrame, first_ns: int, last_ns: int, top: int) -> list[int]:
    """Stacks (-1: none recorded) by their rise in live bytes from `first_ns` to `last_ns`
    (the chains that grow: a KV cache rising 48 KiB a token ranks above 24 MiB of weights
    that never change), then by bytes live at `last_ns`, ties by stack id. Only stacks with
    bytes live at `last_ns` or a rise are ranked."""
    held = _live_by_stack(cols, last_ns)
    rise = held.sub(_live_by_stack(cols, first_ns), fill_value=0)
    ranked = pd.DataFrame({"rise": rise, "held": held.reindex(rise.index, fill_value=0)})
    ranked = ranked[(ranked["held"] > 0) | (ranked["rise"] > 0)].rename_axis("stack").reset_index()
    ranked["rise"] = ranked["rise"].clip(lower=0)
    ranked = ranked.sort_values(["rise", "held", "stack"], ascending=[False, False, True], kind="stable")
    return ranked["stack"].head(max(top, 0)).tolist()


def _live_by_stack(cols: pd.DataFrame, ts_ns: int) -> pd.Series:
    """Bytes live at `ts_ns` per stack."""
    live = live_mask(cols["alloc"], cols["end"], ts_ns) & (cols["size"] > 0)
    return cols[live].groupby("stack")["size"].sum()


def _series(layer: str, device: str, chain: bool, stack_id: int | None, values: np.ndarray, ctx: SeriesContext,
            level: int) -> GrowthSeries:
    linear, power = fit_linear(ctx.x, values), fit_power(ctx.x, values)
    better = better_fit(linear, power)
    best = linear if better == "linear" else power
    regime = regime_change(ctx.x, values, rival_r2=None if power is None else power.r2)
    # After a regime change "at this rate" is the rate since the break, not the average of both.
    judged = (linear, best) if regime is None else (since_break(regime, ctx.x, values),) * 2
    return GrowthSeries(layer=layer, device=device, chain=chain, stack_id=stack_id, x=ctx.x, bytes=values,
                        linear=linear, power=power, better=better,
                        forecast=forecast(*judged, ctx, level, device), regime=regime)


def since_break(regime: Regime, x: np.ndarray, v: np.ndarray) -> Fit:
    """The line of the growth since its regime change, as a Fit ("since_break"): the
    least-squares line through the points (x, V) at or after the break, with its own R². Not
    the bent line's second segment: that one is held to meet the first at the break, and a
    series that jumped at set-up and then held flat got a slope of 2 KiB a step from it, with
    the R² the jump earned, and a forecast of the machine's RAM filling (2026-12-07). With
    fewer than MIN_POINTS points there, that segment after all."""
    x, v = np.asarray(x, dtype=float), np.asarray(v, dtype=float)
    after = x >= regime.at_x
    line = fit_linear(x[after], v[after])
    if line is None:
        a = regime.level_at_break - regime.slope_after * regime.at_x
        return Fit("since_break", a, regime.slope_after, regime.r2, regime.points_after)
    return Fit("since_break", line.a, line.b, line.r2, line.points)


# ---- fits -----------------------------------------------------------------------------------

def fit_linear(x: np.ndarray, v: np.ndarray) -> Fit | None:
    """Least-squares line V = a + b·x; None with fewer than MIN_POINTS points or one x."""
    x, v = np.asarray(x, dtype=float), np.asarray(v, dtype=float)
    if len(x) < MIN_POINTS or np.ptp(x) == 0:
        return None
    a, b = _line(x, v)
    return Fit("linear", a, b, r_squared(v, a + b * x), len(x))


def fit_power(x: np.ndarray, v: np.ndarray) -> Fit | None:
    """V = a·x^b by a least-squares line through (log x, log V) over points with x > 0 and
    V > 0; R² in the original space over the points with x > 0. None with fewer than
    MIN_POINTS usable points or one x."""
    x, v = np.asarray(x, dtype=float), np.asarray(v, dtype=float)
    usable = (x > 0) & (v > 0)
    if usable.sum() < MIN_POINTS or np.ptp(x[usable]) == 0:
        return None
    log_a, b = _line(np.log(x[usable]), np.log(v[usable]))
    a = math.exp(log_a)
    positive = x > 0
    return Fit("power", a, b, r_squared(v[positive], a * np.power(x[positive], b)), int(usable.sum()))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line; centred sums keep large byte counts exact."""
    xm, ym = x.mean(), y.mean()
    slope = float(((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum())
    return float(ym - slope * xm), slope


def r_squared(v: np.ndarray, predicted: np.ndarray) -> float | None:
    """1 − SS_res/SS_tot. A constant V gives 1.0 when predicted exactly, else None (undefined)."""
    ss_res = float(((v - predicted) ** 2).sum())
    ss_tot = float(((v - v.mean()) ** 2).sum())
    if ss_tot == 0:
        return 1.0 if ss_res <= 1e-18 * max(float((v ** 2).sum()), 1.0) else None
    return 1.0 - ss_res / ss_tot


def better_fit(linear: Fit | None, power: Fit | None) -> str | None:
    """"linear" or "power", by the higher R² (no R² loses; a tie goes to the line), None when
    neither fitted."""
    score = lambda fit: -math.inf if fit is None or fit.r2 is None else fit.r2  # noqa: E731
    if linear is None and power is None:
        return None
    return "power" if power is not None and score(power) > score(linear) else ("linear" if linear else "power")

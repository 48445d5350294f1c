"""Regime changes of a growth series (memprof.analysis.growth): the x at which bytes stop
growing at one rate and go on at another ("12 KiB per token up to tokens = 400, 48 KiB per
token after"), or none.

The model: one continuous line bent once, V = a + b₁·x + (b₂ − b₁)·max(0, x − c), fitted by
least squares at every candidate break c, each distinct x with at least REGIME_MIN_SIDE points
on either side (the point at c counts on both: the two lines meet there), over at least
REGIME_MIN_POINTS points. The best c (the least
residual sum of squares) is a regime change only when it explains the points
REGIME_MIN_SSE_CUT times better than one line and its two slopes differ by more than
REGIME_MIN_SLOPE_RATIO (or have opposite signs), and fits better (a higher R²) than the
smooth rival it is given, the power law: V ∝ L² is one curve, which a bent line also cuts
well, not two regimes. Otherwise there is none.

Pure numpy; no I/O. V in bytes, x in whatever unit the series has (steps, seconds, tokens…),
slopes in bytes per unit of x.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A bend must cut the one line's residual sum of squares at least this many times: a second
# segment cuts the residuals of pure noise around a line too, by less the more points there
# are (measured, 500 draws of Gaussian noise each: 12 points, 99 % under 3.2×, at most 5.1×;
# 50 points, at most 1.3×).
REGIME_MIN_SSE_CUT = 4.0
# Fewer points than this and noise alone bends: of 8 noisy points, 1 % of draws were cut more
# than 7.6× (at most 29×).
REGIME_MIN_POINTS = 12
# The slopes before and after must differ by more than this ratio: a line bent by a few
# percent is the same growth, not a new regime.
REGIME_MIN_SLOPE_RATIO = 1.5
# Points each side of the break, the break's own point included: three make each segment a
# fit rather than two points joined.
REGIME_MIN_SIDE = 3


@dataclass(frozen=True)
class Regime:
    """A regime change: growth at `slope_before` bytes per unit of x up to `at_x`, then at
    `slope_after`; `level_at_break` the bent line's bytes at `at_x`. `sse_cut` is the one
    line's residual sum of squares over the bent line's (inf when the bent line fits
    exactly); `r2` the bent line's R²; `points_before` / `points_after` how many points lie at
    or before / at or after `at_x`."""

    at_x: float
    slope_before: float
    slope_after: float
    level_at_break: float
    sse_cut: float
    r2: float
    points_before: int
    points_after: int


def regime_bar() -> str:
    """The bar a bend must pass, in one clause, for the report ("No regime change: …")."""
    return (f"a bend must cut the line's residuals ≥ {REGIME_MIN_SSE_CUT:g}×, change the slope "
            f"> {REGIME_MIN_SLOPE_RATIO:g}× and beat the power law (≥ {REGIME_MIN_POINTS} points, "
            f"{REGIME_MIN_SIDE} each side)")


def regime_change(x, v, rival_r2: float | None = None) -> Regime | None:
    """The regime change of the points (x, V) (module docstring), or None: too few points, V
    constant or already on one line, the best bend short of the bar, or no better than a
    smooth model whose R² is `rival_r2` (None: no rival)."""
    x, v = _sorted_points(x, v)
    if x is None:
        return None
    at = _best_break(x, v)
    regime = None if at is None else _judged(x, v, at)
    if regime is None or (rival_r2 is not None and regime.r2 <= rival_r2):
        return None
    return regime


def _sorted_points(x, v):
    """(x, V) as floats sorted by x; (None, None) when no break can be judged: fewer than
    REGIME_MIN_POINTS points, or one x, or V constant."""
    x, v = np.asarray(x, dtype=float), np.asarray(v, dtype=float)
    keep = np.isfinite(x) & np.isfinite(v)
    x, v = x[keep], v[keep]
    if len(x) < REGIME_MIN_POINTS or np.ptp(x) == 0 or np.ptp(v) == 0:
        return None, None
    order = np.argsort(x, kind="stable")
    return x[order], v[order]


def _best_break(x: np.ndarray, v: np.ndarray) -> float | None:
    """The candidate c with the least residual sum of squares of the bent line, None without
    a candidate. All candidates at once: the normal equations of the columns (1, x, (x − c)⁺)
    come from suffix sums over the points past c. Centred and scaled first, so the sums of
    squares of byte counts keep their precision; the winner is refitted exactly (_judged)."""
    xs, vs = (x - x.mean()) / np.ptp(x), (v - v.mean()) / np.ptp(v)
    candidates = _candidates(x)
    if len(candidates) == 0:
        return None
    c = xs[candidates]
    past = np.searchsorted(x, x[candidates], side="right")  # first index with x > c
    tail = lambda values: np.concatenate([np.cumsum(values[::-1])[::-1], [0.0]])[past]  # noqa: E731
    n_r, sx_r, sxx_r, sv_r, sxv_r = (tail(a) for a in (np.ones_like(xs), xs, xs * xs, vs, xs * vs))
    n, sx, sxx, sv, sxv = len(xs), xs.sum(), (xs * xs).sum(), vs.sum(), (xs * vs).sum()
    sh, sxh = sx_r - c * n_r, sxx_r - c * sx_r
    shh, svh = sxx_r - 2 * c * sx_r + c * c * n_r, sxv_r - c * sv_r
    m = np.empty((len(c), 3, 3))
    m[:, 0] = np.stack([np.full_like(c, n), np.full_like(c, sx), sh], 1)
    m[:, 1] = np.stack([np.full_like(c, sx), np.full_like(c, sxx), sxh], 1)
    m[:, 2] = np.stack([sh, sxh, shh], 1)
    rhs = np.stack([np.full_like(c, sv), np.full_like(c, sxv), svh], 1)
    beta = np.linalg.solve(m, rhs[..., None])[..., 0]
    sse = (vs * vs).sum() - (beta * rhs).sum(1)
    return float(x[candidates[int(np.argmin(sse))]])


def _candidates(x: np.ndarray) -> np.ndarray:
    """Indices (into sorted x) of the first point of each distinct x with at least
    REGIME_MIN_SIDE points at or before it and at or after it, and another distinct x on
    either side: a bend at the least or the greatest x leaves its hinge column flat or a copy
    of x (a singular fit; a server's requests repeat their token counts 0…39 twenty times,
    the greatest with twenty points at it)."""
    first = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])
    at_or_before = np.searchsorted(x, x[first], side="right")
    at_or_after = len(x) - first
    inner = (np.arange(len(first)) >= 1) & (np.arange(len(first)) <= len(first) - 2)
    return first[inner & (at_or_before >= REGIME_MIN_SIDE) & (at_or_after >= REGIME_MIN_SIDE)]


def _judged(x: np.ndarray, v: np.ndarray, at: float) -> Regime | None:
    """The bend at `at` refitted in the original units, kept when it passes the bar."""
    line_sse = _sse(np.stack([np.ones_like(x), x], 1), v)
    hinge = np.maximum(0.0, x - at)
    design = np.stack([np.ones_like(x), x - at, hinge], 1)  # x − at: the columns stay well scaled
    beta, bent_sse = _fit(design, v)
    # One line that already fits to rounding leaves nothing for a bend to explain.
    if line_sse <= 1e-18 * float((v * v).sum()):
        return None
    cut = line_sse / bent_sse if bent_sse > 1e-18 * float((v * v).sum()) else float("inf")
    before, after = float(beta[1]), float(beta[1] + beta[2])
    if cut < REGIME_MIN_SSE_CUT or not slopes_differ(before, after):
        return None
    r2 = 1.0 - bent_sse / float(((v - v.mean()) ** 2).sum())
    return Regime(at_x=at, slope_before=before, slope_after=after, level_at_break=float(beta[0]), sse_cut=cut, r2=r2,
                  points_before=int((x <= at).sum()), points_after=int((x >= at).sum()))


def slopes_differ(before: float, after: float) -> bool:
    """True when the slopes have opposite signs, or one is more than REGIME_MIN_SLOPE_RATIO
    times the other in size."""
    if before * after <= 0:
        return before != after
    small, large = sorted((abs(before), abs(after)))
    return large > REGIME_MIN_SLOPE_RATIO * small


def _fit(design: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, float]:
    beta = np.linalg.lstsq(design, v, rcond=None)[0]
    return beta, float(((v - design @ beta) ** 2).sum())


def _sse(design: np.ndarray, v: np.ndarray) -> float:
    return _fit(design, v)[1]

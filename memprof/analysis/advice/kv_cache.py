"""Advice rule `kv-cache`: the KV cache dominates the peak and grows linearly in tokens.

Read from `growth --against tokens` (memprof.analysis.growth): per (layer, device), the chains
through a KV cache (a frame's function or file names a cache: `DynamicLayer.update` in
transformers' cache_utils.py, `past_key_values`, a `kv_cache`) whose live bytes rise with the
tokens. Their bytes summed at each checkpoint are fitted by one line against the tokens: the
slope is the cache's bytes per token, R² how well a line explains them. At the layer's peak
(attribution at the peak) the same chains hold the cache's share of it. The forecast L is the
token count at which the device is full at that slope: from the level the growth forecast
starts from (the layer's last bytes, or NVML's used bytes on a GPU) at the last checkpoint's
tokens, L = tokens + (capacity − level) / slope.

The saving: an 8-bit quantized cache holds half the bytes of a 16-bit cache and a quarter of a
float32 one; the recording does not say the cache's dtype, so `saving_bytes` is the least of
the two (half the cache's bytes at the peak) and the words say what float32 would give.
Pure: reads the recording through Facts; sizes in bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from memprof.analysis.advice.chain_text import mentions, python_line
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.growth import UnknownQuantityError, fit_linear
from memprof.analysis.growth_forecast import format_count
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.growth import GrowthSeries

MIN_SHARE = Threshold("MIN_SHARE_OF_PEAK", 0.10, "fraction",
                      "the cache holds at least this share of its layer's peak: below it a smaller cache saves little")
MIN_R2 = Threshold("MIN_R2", 0.90, "R²", "a line in tokens explains at least this much of the cache's bytes: it grows linearly")
MIN_PER_TOKEN = Threshold("MIN_BYTES_PER_TOKEN", 1024, "bytes",
                          "the cache grows at least this much per token: less needs a million tokens to reach 1 GiB")
THRESHOLDS: tuple[Threshold, ...] = (MIN_SHARE, MIN_R2, MIN_PER_TOKEN)

QUANTITY = "tokens"
TOP_CHAINS = 8  # chains fitted per (layer, device): keys and values, per layer where their stacks differ
# A cache's Python frames: a class named …Cache (DynamicCache.update, Cache.update), a function
# naming a kv cache or past keys; or code in a file named for it (transformers' cache_utils.py,
# whose DynamicLayer.update grows the cache). Not any "cache": generate's _get_initial_cache_position.
CACHE = re.compile(r"Cache\.|(?i:kv_?cache|past_key)")
CACHE_FILE = re.compile(r"(?i:cache_utils|kv_?cache)")
HOW_TO = "the agent writes it for each forward of a generate loop, or memprof.mark(tokens=…)"


@dataclass(frozen=True)
class CacheGrowth:
    """One (layer, device)'s cache chains fitted together against the tokens: `slope` bytes
    per token, `r2`, the chains' `bytes` at the last checkpoint (`tokens`), the total series
    (its forecast's capacity and level)."""

    layer: str
    device: str
    chains: tuple[GrowthSeries, ...]
    slope: float
    r2: float | None
    tokens: float
    bytes: int
    total: GrowthSeries


def check(facts: Facts) -> Verdict:
    """Advice for each (layer, device) whose cache chains pass every threshold."""
    try:
        view = facts.growth(against=QUANTITY, top=TOP_CHAINS)
    except UnknownQuantityError:
        return silent(f"no {QUANTITY} quantity to fit a cache against ({HOW_TO})")
    grown = [g for g in _cache_growth(view.result.series, view.chains) if g.slope > 0]
    if not grown:
        return silent(f"no chain through a KV cache grows with the {QUANTITY}")
    advice, why = [], []
    for growth in grown:
        given = _advice(facts, growth, view.chains)
        advice += [given] if isinstance(given, Advice) else []
        why += [given] if isinstance(given, str) else []
    return fired(*advice) if advice else silent("; ".join(why))


def _cache_growth(series: list[GrowthSeries], chains: dict) -> list[CacheGrowth]:
    """Each (layer, device) with chains through a cache that rise with the tokens (a
    positive slope of their own), fitted together."""
    found = []
    totals = [s for s in series if not s.chain]
    for total in totals:
        mine = tuple(s for s in series if s.chain and s.layer == total.layer and s.device == total.device
                     and s.stack_id is not None and s.linear is not None and s.linear.b > 0
                     and mentions(chains.get(s.stack_id, []), CACHE, CACHE_FILE))
        if not mine or len(total.x) == 0:
            continue
        summed = np.sum([s.bytes for s in mine], axis=0)
        fit = fit_linear(total.x, summed)
        if fit is None:
            continue
        found.append(CacheGrowth(total.layer, total.device, mine, fit.b, fit.r2, float(total.x[-1]),
                                 int(summed[-1]), total))
    return found


def _advice(facts: Facts, growth: CacheGrowth, chains: dict) -> Advice | str:
    """The advice for one cache, or why it falls short (one phrase)."""
    where = f"{growth.layer} on {growth.device}"
    if growth.r2 is None or growth.r2 < MIN_R2.value:
        return (f"the KV cache in {where} does not follow the {QUANTITY} on a line "
                f"(R² {_r2(growth.r2)} < {MIN_R2.name} {MIN_R2.value})")
    if growth.slope < MIN_PER_TOKEN.value:
        return (f"the KV cache in {where} grows {format_bytes(growth.slope)} per token "
                f"(< {MIN_PER_TOKEN.name} {format_bytes(MIN_PER_TOKEN.value)})")
    peak, held = _at_peak(facts, growth)
    share = held / peak if peak else 0.0
    if share < MIN_SHARE.value:
        return (f"the KV cache in {where} holds {format_bytes(held)} of its {format_bytes(peak)} peak "
                f"({share:.0%} < {MIN_SHARE.name} {MIN_SHARE.value:.0%})")
    return _given(growth, chains, peak, held)


def _at_peak(facts: Facts, growth: CacheGrowth) -> tuple[int, int]:
    """(the layer's peak bytes, the cache chains' bytes then)."""
    result = facts.attribution(by="chain", at="peak", layers=(growth.layer,), top=None).result
    layer = next((live for live in result.layers if live.layer == growth.layer), None)
    if layer is None:
        return 0, 0
    ids = {s.stack_id for s in growth.chains}
    return int(layer.live_bytes), int(sum(row.live_bytes for row in layer.rows if row.stack_id in ids))


def _forecast(growth: CacheGrowth) -> tuple[float | None, str]:
    """(L, the sentence): the tokens at which the device is full at the cache's slope, from
    where the growth forecast says the device stood at the last checkpoint."""
    cast = growth.total.forecast
    if cast.capacity_bytes is None or cast.level_bytes is None:
        return None, f"no forecast of when {growth.device} fills: {cast.reason}"
    room = max(cast.capacity_bytes - cast.level_bytes, 0)
    full_at = growth.tokens + room / growth.slope
    return full_at, (f"at {format_bytes(growth.slope)} a token, {growth.device}'s {format_bytes(cast.capacity_bytes)} "
                     f"is full at L ≈ {format_count(full_at)} tokens: {format_bytes(room)} free above the "
                     f"{format_bytes(cast.level_bytes)} held at {format_count(growth.tokens)} tokens")


def _given(growth: CacheGrowth, chains: dict, peak: int, held: int) -> Advice:
    full_at, forecast = _forecast(growth)
    names = [python_line(chains.get(s.stack_id, [])) or f"chain {s.stack_id}" for s in growth.chains]
    modules = tuple(sorted({s.module for s in growth.chains if s.module}))
    saving = held // 2
    evidence = (
        f"{len(growth.chains)} chain(s) through the KV cache grow {format_bytes(growth.slope)} per token "
        f"(a line in {QUANTITY}, R² {_r2(growth.r2)}): {'; '.join(names)}"
        + (f", in {', '.join(modules)}" if modules else ""),
        f"at the {growth.layer} peak of {format_bytes(peak)} the cache holds {format_bytes(held)} ({held / peak:.0%})",
        forecast,
    )
    return Advice(
        rule=RULE_ID, title=f"The KV cache grows {format_bytes(growth.slope)} per token: {held / peak:.0%} of the {growth.layer} peak",
        evidence=evidence,
        change=("use a quantized cache (transformers: cache_implementation=\"quantized\" with 8 or 4 bits), a static "
                "or paged cache sized to the longest request (cache_implementation=\"static\"), or cap the length"
                + (f" well below L ≈ {format_count(full_at)} tokens" if full_at is not None else "")),
        saving=(f"an 8-bit cache holds half of a 16-bit cache and a quarter of a float32 one: at least "
                f"{format_bytes(saving)} less at the peak (half the cache's {format_bytes(held)}), "
                f"{format_bytes(held * 3 // 4)} if it is float32"),
        saving_bytes=saving,
        chains=tuple(s.stack_id for s in growth.chains), modules=modules, layer=growth.layer, device=growth.device,
        numbers={"bytes_per_token": growth.slope, "r2": growth.r2, "tokens": growth.tokens,
                 "cache_bytes_at_last_point": growth.bytes, "layer_peak_bytes": peak, "cache_bytes_at_peak": held,
                 "share_of_peak": held / peak, "full_at_tokens": full_at,
                 "capacity_bytes": growth.total.forecast.capacity_bytes,
                 "saving_bytes_if_float32": held * 3 // 4},
    )


def _r2(r2: float | None) -> str:
    return "undefined" if r2 is None else f"{r2:.3f}"


RULE_ID = "kv-cache"
RULE = Rule(
    id=RULE_ID,
    title="The KV cache dominates the peak and grows with the tokens",
    trigger=("chains through a KV cache whose live bytes, fitted against the tokens (growth --against tokens), "
             "rise on a line and hold a large share of their layer's peak"),
    evidence=("bytes per token and R² of the line, the chains (file:line, module), the cache's bytes and share at the "
              "layer's peak, and the token count L at which the device is full at that rate"),
    advice="a quantized (8- or 4-bit) cache, a static or paged cache, or a shorter maximum length",
    saving=("an 8-bit cache holds half of a 16-bit cache, a quarter of a float32 one: at least half the cache's "
            "bytes at the peak (the dtype is not recorded)"),
    thresholds=THRESHOLDS,
    check=check,
    needs="a tokens quantity (recorded for each forward of an inference loop, or memprof.mark(tokens=…))",
)

"""Advice rule `attention-scores`: attention materialises the L × L scores.

Judged on regions (memprof.analysis.regions): a sweep marks each configuration with its
sequence length, `memprof.mark("config", seq_len=L, …)`, and each region has each (layer,
device)'s peak and the chains holding the most then. Regions whose other numbers (batch,
heads, …) are the same form one series; over it, each chain's bytes at the region peaks are
fitted by a power law in L (bytes = a·L^b, memprof.analysis.growth.fit_power). The scores are
the chains through attention code (a frame's function or file names attention, softmax,
matmul, …) whose exponent is about 2. At the largest L they hold a share of the peak that
a fused kernel (scaled_dot_product_attention, flash attention) does not allocate: the
saving is their bytes at that peak. Each such chain's bytes over L² × 4 is how many float32
L × L matrices it holds (batch × heads when the marks carry them).

Pure: reads the recording through Facts; sizes in bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprof.analysis.advice.chain_text import mentions, python_line
from memprof.analysis.advice.model import Advice, Rule, Threshold, Verdict, fired, silent
from memprof.analysis.growth import fit_power
from memprof.analysis.growth_forecast import format_count
from memprof.units import format_bytes

if TYPE_CHECKING:
    from memprof.analysis.advice.facts import Facts
    from memprof.analysis.regions import Region

MIN_CONFIGS = Threshold("MIN_SEQ_LENS", 3, "count", "distinct sequence lengths needed to tell L² from L")
EXPONENT_LOW = Threshold("MIN_EXPONENT", 1.75, "exponent", "a chain's bytes rise at least as L^this: quadratic in L")
EXPONENT_HIGH = Threshold("MAX_EXPONENT", 2.25, "exponent", "and at most as L^this")
MIN_R2 = Threshold("MIN_R2", 0.90, "R²", "the power law explains at least this much of the chain's bytes")
MIN_SHARE = Threshold("MIN_SHARE_OF_PEAK", 0.10, "fraction",
                      "the scores hold at least this share of the peak at the largest L: below it a fused kernel saves little")
MIN_BYTES = Threshold("MIN_BYTES", 1024 * 1024, "bytes", "the scores hold at least this much at the largest L's peak")
THRESHOLDS: tuple[Threshold, ...] = (MIN_CONFIGS, EXPONENT_LOW, EXPONENT_HIGH, MIN_R2, MIN_SHARE, MIN_BYTES)

LENGTHS = ("seq_len", "L", "seq", "length", "context")  # the quantity that is L, first present wins
# Attention code's Python frames: a function named for attention, softmax or the products it
# is made of (naive_attention, eager_attention_forward, GPT2Attention._attn), or its file.
ATTENTION = re.compile(r"(?i:attn|attention|softmax|matmul|bmm|einsum|scaled_dot)")
TOP_CHAINS = 5  # chains per region peak: the scores and their softmax beside inputs and outputs
FLOAT32 = 4
HOW_TO = 'call memprof.mark("config", seq_len=L) before each configuration of a sweep'


@dataclass(frozen=True)
class Scores:
    """The L² chains of one (layer, device) over one series of regions: `chains` (stack id
    -> bytes at `region`'s peak, the largest L), the fitted exponent and R² of their sum, the
    lengths fitted, the region's peak."""

    layer: str
    device: str
    region: Region
    length: str
    chains: dict[int, int]
    exponent: float
    r2: float | None
    lengths: tuple[float, ...]
    peak_bytes: int

    @property
    def bytes(self) -> int:
        return sum(self.chains.values())

    @property
    def seq_len(self) -> float:
        return self.region.quantities[self.length]


def check(facts: Facts) -> Verdict:
    """Advice for each (layer, device) whose attention scores pass every threshold."""
    view = facts.regions(top=TOP_CHAINS)
    regions = view.result.regions
    if not regions:
        return silent(f"no regions to judge attention by ({HOW_TO})")
    length = next((name for name in LENGTHS if any(name in r.quantities for r in regions)), None)
    if length is None:
        return silent(f"no region carries a sequence length ({', '.join(LENGTHS[:1])}): {HOW_TO}")
    found, why = [], []
    for series in _series(regions, length):
        for k in range(len(series[-1].peaks)):
            judged = _judge(series, length, k, view.chains)
            found += [judged] if isinstance(judged, Scores) else []
            why += [judged] if isinstance(judged, str) else []
    advice = [_advice(s, view.chains) for s in _biggest_per_place(found)]
    return fired(*advice) if advice else silent(_why(why, regions, length))


def _series(regions: list[Region], length: str) -> list[list[Region]]:
    """The regions with `length`, grouped by their other numbers, each group by L ascending;
    only groups with MIN_CONFIGS distinct lengths."""
    groups: dict[tuple, list[Region]] = {}
    for region in regions:
        if length in region.quantities:
            others = tuple(sorted((k, v) for k, v in region.quantities.items() if k != length))
            groups.setdefault(others, []).append(region)
    ordered = [sorted(group, key=lambda r: r.quantities[length]) for group in groups.values()]
    return [g for g in ordered if len({r.quantities[length] for r in g}) >= MIN_CONFIGS.value]


def _chain_points(series: list[Region], length: str, k: int) -> dict[int, dict[float, int]]:
    """Stack id -> {L: the chain's bytes at the peak of (layer, device) k}, the most where
    several regions ran one L."""
    points: dict[int, dict[float, int]] = {}
    for region in series:
        for chain in region.peaks[k].top_chains:
            if chain.stack_id is not None:
                at = points.setdefault(chain.stack_id, {})
                at[region.quantities[length]] = max(at.get(region.quantities[length], 0), chain.live_bytes)
    return points


def _quadratic(points: dict[float, int]) -> bool:
    fit = fit_power(list(points), list(points.values()))
    return (fit is not None and fit.points >= MIN_CONFIGS.value and fit.r2 is not None and fit.r2 >= MIN_R2.value
            and EXPONENT_LOW.value <= fit.b <= EXPONENT_HIGH.value)


def _judge(series: list[Region], length: str, k: int, chains: dict) -> Scores | str | None:
    """The scores of (layer, device) k over `series`, or why not (None: nothing grows as L²)."""
    points = _chain_points(series, length, k)
    quadratic = {sid: p for sid, p in points.items() if _quadratic(p)}
    if not quadratic:
        return None
    last = series[-1]
    peak = last.peaks[k]
    where = f"{peak.layer} on {peak.device}"
    attention = {sid: p for sid, p in quadratic.items() if mentions(chains.get(sid, []), ATTENTION)}
    if not attention:
        return f"{len(quadratic)} chain(s) in {where} grow as {length}² but none runs through attention code"
    held = {sid: p[last.quantities[length]] for sid, p in attention.items() if last.quantities[length] in p}
    total = sum(held.values())
    if total < MIN_BYTES.value or total < MIN_SHARE.value * peak.peak_bytes:
        return (f"the attention scores in {where} hold {format_bytes(total)} of the {format_bytes(peak.peak_bytes)} peak "
                f"at {length} = {format_count(last.quantities[length])} (below {MIN_SHARE.name} {MIN_SHARE.value:.0%} or "
                f"{MIN_BYTES.name} {format_bytes(MIN_BYTES.value)})")
    lengths = sorted({L for p in attention.values() for L in p})
    summed = [sum(p.get(L, 0) for p in attention.values()) for L in lengths]
    fit = fit_power(lengths, summed)
    return Scores(peak.layer, peak.device, last, length, held, fit.b, fit.r2, tuple(lengths), peak.peak_bytes)


def _biggest_per_place(found: list[Scores]) -> list[Scores]:
    """One Scores per (layer, device): the series whose scores hold the most."""
    best: dict[tuple[str, str], Scores] = {}
    for scores in found:
        key = (scores.layer, scores.device)
        if key not in best or scores.bytes > best[key].bytes:
            best[key] = scores
    return list(best.values())


def _why(why: list[str], regions: list[Region], length: str) -> str:
    if why:
        return "; ".join(dict.fromkeys(why))
    lengths = {r.quantities[length] for r in regions if length in r.quantities}
    if len(lengths) < MIN_CONFIGS.value:
        return f"{len(lengths)} distinct {length} value(s) over the regions: telling L² from L needs {MIN_CONFIGS.name} {MIN_CONFIGS.value:.0f}"
    return f"no chain grows as {length}² over the regions"


def _shape(scores: Scores, chain_bytes: int) -> str:
    """A chain's bytes as float32 L × L matrices: "1 × 8 × 1024² × 4 bytes" with batch and
    heads from the marks when they account for it, else "8 × 1024² × 4 bytes"."""
    L = scores.seq_len
    matrices = chain_bytes / (L * L * FLOAT32)
    q = scores.region.quantities
    if "batch" in q and "heads" in q and abs(q["batch"] * q["heads"] - matrices) <= 0.01 * matrices:
        return f"{format_count(q['batch'])} × {format_count(q['heads'])} × {format_count(L)}² × 4 bytes (batch × heads × L² × 4)"
    return f"{matrices:.3g} × {format_count(L)}² × 4 bytes ({matrices:.3g} float32 L × L matrices)"


def _advice(scores: Scores, chains: dict) -> Advice:
    L, n = format_count(scores.seq_len), len(scores.chains)
    share = scores.bytes / scores.peak_bytes
    lines = [f"{python_line(chains.get(sid, [])) or f'chain {sid}'} holds {format_bytes(b)} = {_shape(scores, b)}"
             for sid, b in scores.chains.items()]
    evidence = (
        f"{n} chain(s) through attention code grow as {scores.length}^{scores.exponent:.2f} (power law, R² "
        f"{'undefined' if scores.r2 is None else f'{scores.r2:.3f}'}) over {scores.length} = "
        f"{', '.join(format_count(x) for x in scores.lengths)}",
        *lines,
        f"at {scores.length} = {L} (region {scores.region.index}) they hold {format_bytes(scores.bytes)} of the "
        f"{scores.layer} peak of {format_bytes(scores.peak_bytes)} ({share:.0%})",
    )
    return Advice(
        rule=RULE_ID, title=f"Attention materialises {scores.length} × {scores.length} scores: "
                            f"{format_bytes(scores.bytes)} at {scores.length} = {L}, {share:.0%} of the {scores.layer} peak",
        evidence=evidence,
        change=("compute attention with torch.nn.functional.scaled_dot_product_attention (a flash or memory-efficient "
                "kernel), or flash attention (transformers: attn_implementation=\"sdpa\" or \"flash_attention_2\")"),
        saving=(f"the attention scores at {scores.length} = {L} are {n} tensor(s) of {L}² × "
                f"{scores.bytes / n / (scores.seq_len ** 2 * FLOAT32):.3g} × 4 bytes ({format_bytes(scores.bytes)}) at the "
                f"peak; scaled_dot_product_attention with a flash kernel does not materialise them: about "
                f"{format_bytes(scores.bytes)} less at the peak"),
        saving_bytes=int(scores.bytes),
        chains=tuple(scores.chains), layer=scores.layer, device=scores.device,
        numbers={"seq_len": scores.seq_len, "scores_bytes": int(scores.bytes), "peak_bytes": scores.peak_bytes,
                 "share_of_peak": share, "exponent": scores.exponent, "r2": scores.r2,
                 "seq_lens": list(scores.lengths), "region": scores.region.index,
                 "chain_bytes": {str(sid): b for sid, b in scores.chains.items()},
                 "float32_matrices": scores.bytes / (scores.seq_len ** 2 * FLOAT32)},
    )


RULE_ID = "attention-scores"
RULE = Rule(
    id=RULE_ID,
    title="Attention materialises L × L scores",
    trigger=("over regions marked with their sequence length, chains through attention code (softmax, matmul, …) "
             "whose bytes at the region peaks rise as L² and hold a large share of the peak at the largest L"),
    evidence=("the fitted exponent and R², each chain's bytes (file:line) as batch × heads × L² × 4, and their share "
              "of the peak at the largest L"),
    advice="torch.nn.functional.scaled_dot_product_attention or flash attention",
    saving="the scores' bytes at the largest L's peak: a fused kernel does not materialise them",
    thresholds=THRESHOLDS,
    check=check,
    needs='regions: memprof.mark("config", seq_len=L) before each configuration of at least 3 lengths',
)

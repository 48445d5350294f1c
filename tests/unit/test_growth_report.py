"""`memprof report growth` as a reader sees it: golden tables at 80 and 160 columns (tests/golden/),
the layout at every width in between, the forecast bar stated in the report, in JSON and in
--help, and no absurd magnitudes."""
from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.growth import growth
from memprof.analysis.growth_forecast import FORECAST_HORIZON_NS, FORECAST_MIN_POINTS, FORECAST_MIN_R2, span_words
from memprof.analysis.leaks import chain_frames
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.analysis.views import About, GrowthView
from memprof.report.growth import render, to_json
from tests.factories import ev, stacks_frames
from tests.gpu_factories import GiB, MiB, S, leak_per_step, samples_frame, timeline_of
from tests.growth_factories import quantity_steps, ram, slow_power_law, steps_holding

GOLDEN = Path(__file__).parent.parent / "golden"
UPDATE = os.environ.get("MEMPROF_UPDATE_GOLDEN") == "1"  # rewrite the golden files instead of comparing
KiB = 1 << 10
STEPS = 12

# Stack 7 has a long chain: the one the series column must cut, not drop.
STACKS, FRAMES = stacks_frames({
    7: [("native", "malloc", "libc.so.6", None, None), ("python", "cache_batch", None, "train.py", 42),
        ("python", "train_step[epoch]", None, "train.py", 60), ("python", "run_epoch", None, "train.py", 90),
        ("python", "main", None, "train.py", 120)],
    9: [("python", "Tensor.to", None, "t.py", 1), ("python", "train_step", None, "t.py", 9)],
    11: [("python", "collate", None, "data.py", 5), ("python", "DataLoader.__next__", None, "data.py", 8)],
    12: [("python", "warmup_buffers", None, "setup.py", 3)],
    13: [("python", "Tensor.__init__", None, "t.py", 2)],
    15: [("native", "cuMemAlloc_v2", "libcuda.so.1", None, None),
         ("native", "ncclCommInitRank", "libnccl.so", None, None)],
})
NOISE = [0, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]  # chain 11's live bytes at each mark, in 256 KiB


def noisy_chain(stack_id: int = 11) -> list[dict]:
    """Before mark k+1, chain `stack_id` holds NOISE[k]·256 KiB (one block, replaced each step)."""
    rows = []
    for k, quarters in enumerate(NOISE):
        t, addr = k * S + S // 3, 0x50_0000 + k * 0x1000
        rows += [ev(t, "free", addr - 0x1000)] if k else []
        rows += [ev(t, "alloc", addr, quarters * 256 * KiB + 1, stack_id)]
    return rows


def shrinking_chain(stack_id: int = 12) -> list[dict]:
    """STEPS blocks of 1 MiB before mark 1, one freed per step: 13 − k MiB at mark k."""
    rows = [ev(S // 2, "alloc", 0x70_0000 + i * 0x1000, MiB, stack_id) for i in range(STEPS)]
    return rows + [ev(k * S + S // 2, "free", 0x70_0000 + k * 0x1000) for k in range(1, STEPS)]


def golden_result():
    """Every kind of forecast at once: cuda:0 full, the RAM full, a chain too noisy, a
    shrinking chain, torch_cpu growing 64 B a step (not within 10 years), cuda:1 unsized."""
    rows = (leak_per_step(STEPS, 2 * MiB) + noisy_chain() + shrinking_chain()
            + leak_per_step(STEPS, layer="cuda_block", device="cuda:0", stack_id=9, churn_stack=10)
            + leak_per_step(STEPS, 64, layer="torch_cpu", stack_id=13, churn_stack=14)
            + leak_per_step(STEPS, layer="cuda_driver", device="cuda:1", stack_id=15, churn_stack=16))
    gpu = samples_frame([(S, "gpu_total_bytes", "cuda:0", 100.0 * MiB), (S, "gpu_used_bytes", "cuda:0", 30.0 * MiB)])
    samples = pd.concat([gpu, ram(64 * GiB)])
    events = timeline_of(rows)
    result = growth(pair_lifetimes(events), events, samples, top=3)
    return result, chain_frames(STACKS, FRAMES, [s.stack_id for s in result.series if s.chain], "merged")


def rendered(result, chains, width: int) -> str:
    """The report at a fixed width, as plain text with trailing spaces cut (deterministic:
    no colour, no terminal, UTF-8 boxes whatever the environment)."""
    console = Console(width=width, record=True, color_system=None, file=io.StringIO(), force_terminal=False,
                      legacy_windows=False, emoji=False)
    render(GrowthView(result, About("r"), chains), console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


# ---- golden tables --------------------------------------------------------------------------

@pytest.mark.parametrize("width", [80, 160])
def test_golden_table(width):
    result, chains = golden_result()
    text, golden = rendered(result, chains, width), GOLDEN / f"growth_{width}.txt"
    if UPDATE:
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


# ---- every width ----------------------------------------------------------------------------

def absurd_result():
    """No step marks, a power law with b = 0.05 over 50 s (1 MiB·t^0.05): the old forecast
    put 64 GiB of RAM full in about 10^88 days."""
    events = slow_power_law()
    return growth(pair_lifetimes(events), events, ram(64 * GiB), points=50, top=1), {}


def against_result():
    """--against tokens: chain 7 (the long one) holds 12 KiB per token up to tokens = 400 and
    48 KiB per token after, tokens = 8, 16, … 808 at step marks 1 s apart; 1 GiB of RAM."""
    tokens = range(8, 809, 8)
    rows, quantities = quantity_steps(tokens, lambda t: 12 * KiB * min(t, 400) + 48 * KiB * max(t - 400, 0))
    events = timeline_of(rows)
    result = growth(pair_lifetimes(events), events, pd.concat([quantities, ram(GiB)]), top=1, against="tokens")
    return result, chain_frames(STACKS, FRAMES, [7], "merged")


def table_lines(text: str) -> list[str]:
    """The table's header, rule and rows: the lines after the title up to the first blank line
    after them."""
    lines = [line.strip(" ") for line in text.splitlines()[1:]]
    start = next(i for i, line in enumerate(lines) if line)
    return lines[start:lines.index("", start)]


def row_cells(text: str) -> list[list[str]]:
    """Each table row's cells (split at runs of two or more spaces; no cell holds one)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table_lines(text)[2:]]


@pytest.mark.parametrize("width", [80, 90, 100, 120, 140, 160, 200])
@pytest.mark.parametrize("make", [golden_result, absurd_result, against_result])
def test_every_column_is_readable_at_any_width_from_80(width, make):
    """The old table collapsed to "l…" headers and lost the series column at 100 and 160."""
    result, chains = make()
    text = rendered(result, chains, width)
    header = table_lines(text)[0]
    assert header.startswith("series ") and "…" not in header, header
    assert max(len(line) for line in text.splitlines()) <= width
    names = [cells[0] for cells in row_cells(text)]
    assert names == [f"{s.layer} {s.device}" if not s.chain else names[i] for i, s in enumerate(result.series)]
    assert all(len(name) >= 16 and name.startswith("↳ ") for name, s in zip(names, result.series) if s.chain)


@pytest.mark.parametrize("width", [80, 160])
def test_no_number_in_the_report_is_absurd(width):
    """'full at 7,862,999,048,…,608 s (in 9.1e58 days)': no run of more than 12 digits, no
    exponent, no more than 10 years; the absurd forecast says why there is none instead."""
    result, chains = absurd_result()
    text = rendered(result, chains, width)
    assert not re.search(r"\d[\d,]{12,}|\de[+-]?\d|e\+", text), text
    assert "– over 10 years" in text and "not full within 10 years" in text


# ---- the bar, stated ------------------------------------------------------------------------

def test_the_report_json_and_help_state_the_bar():
    bar = (f"at least {FORECAST_MIN_POINTS} points with R² ≥ {FORECAST_MIN_R2:.2f} and a positive linear slope, "
           "and a device that fills within 10 years")
    result, chains = golden_result()
    assert bar in " ".join(rendered(result, chains, 1000).split())
    data = json.loads(json.dumps(to_json(GrowthView(result, About("r.memprof"), chains))))
    assert data["forecast_bar"] == {"min_points": 8, "min_r2": 0.8, "horizon_ns": FORECAST_HORIZON_NS}
    assert FORECAST_HORIZON_NS == 315_576_000 * S  # 10 Julian years
    help_text = CliRunner().invoke(cli, ["report", "growth", "--help"], terminal_width=1000).output
    assert bar in " ".join(help_text.split())


def test_each_total_says_its_forecast_or_why_there_is_none():
    result, chains = golden_result()
    text = " ".join(rendered(result, chains, 1000).split())
    assert ("cuda_block cuda:0: at this rate cuda:0 is full at step 82, in 70 s, by the linear fit (R² 1.00, "
            "12 points), from 30.0 MiB of 100.0 MiB") in text
    assert "torch_cpu cpu: at this rate the machine's RAM is not full within 10 years" in text
    assert "cuda:1: capacity of cuda:1 unknown: no gpu_total_bytes sample" in text
    cells = {row[0]: row[-1] for row in row_cells(rendered(result, chains, 160))}
    assert cells["↳ collate ← DataLoader.__next__"] == "– R² 0.25"
    assert cells["↳ warmup_buffers"] == "– not growing"


def test_too_few_points_say_how_many():
    events = timeline_of(steps_holding([MiB + d * 128 * KiB for d in (4, -6, 9, -4, 8)]))
    result = growth(pair_lifetimes(events), events, ram(GiB), top=1)
    text = rendered(result, {}, 100)
    assert [row[-1] for row in row_cells(text)] == ["– only 5 points"] * 2
    assert "native_heap cpu: no forecast: too few points to forecast: 5 < 8" in text


@pytest.mark.parametrize("ns, words", [(0, "0 s"), (70 * S, "70 s"), (720 * S, "12 min"), (3.2 * 3600 * S, "3.2 h"),
                                       (18 * 86400 * S, "18 days"), (2.5 * 365.25 * 86400 * S, "2.5 years")])
def test_spans_are_in_human_units(ns, words):
    assert span_words(ns) == words


def test_json_has_points_fits_forecasts_and_stacks():
    result, chains = golden_result()
    data = json.loads(json.dumps(to_json(GrowthView(result, About("r.memprof", lost_events=2), chains))))
    assert (data["x_unit"], data["step_ns"], data["lost_events"]) == ("step", S, 2)
    block, block_chain = data["series"][:2]
    assert block["bytes"] == [(k - 1) * MiB for k in range(1, STEPS + 1)] and block["x"] == list(range(1, STEPS + 1))
    assert block["linear"]["model"] == "linear" and block["better"] == "linear"
    assert block["forecast"] == {"status": "full", "reason": "at this rate cuda:0 is full at step 82, in 70 s",
                                 "capacity_bytes": 100 * MiB, "level_bytes": 30 * MiB, "model": "linear",
                                 "points": STEPS, "r2": pytest.approx(1.0), "full_at_x": 82.0, "full_in_ns": 70 * S}
    assert "stack" not in block and block_chain["stack"][0]["function"] == "Tensor.to"
    poor = next(s for s in data["series"] if s["stack_id"] == 11)["forecast"]
    assert (poor["status"], poor["full_at_x"], poor["r2"]) == ("poor_fit", None, pytest.approx(0.25, abs=0.005))


# ---- against a quantity, and regime changes -------------------------------------------------

@pytest.mark.parametrize("width", [80, 160])
def test_against_tokens_heads_columns_per_token_and_says_the_regime_change(width):
    result, chains = against_result()
    text = rendered(result, chains, width)
    assert text.splitlines()[0] == "growth per token (x is tokens at each step mark)"
    header = re.split(r"\s{2,}", table_lines(text)[0].strip())
    assert header == ["series", "last", "per token", "R²", "power b", "R²", "full at tokens"]
    # At this rate is the rate since the break: 48 KiB per token from the 23.8 MiB (24,384 KiB)
    # held at tokens = 808, 1 GiB full at 808 + (1,048,576 − 24,384) / 48 = 22,145.3 tokens; 8 tokens
    # a second (one step mark each), so in 21,337.3 / 8 s = 44 min.
    total = result.series[0]
    assert total.bytes[-1] == 24_384 * KiB
    assert (total.forecast.model, total.forecast.full_at_x) == ("since_break", pytest.approx(22_145.33, abs=0.01))
    assert [row[-1] for row in row_cells(text)] == ["≈ 22.1 k"] * 2
    flat = " ".join(text.split())
    assert ("native_heap cpu: at this rate the machine's RAM is full at tokens ≈ 22.1 k, in 44 min, by the line "
            "since the regime change (R² 1.00, 52 points)") in flat
    assert ("native_heap cpu: growth changes regime at tokens = 400: 12.0 KiB/token before, "
            "48.0 KiB/token after") in flat
    assert ("↳ cache_batch ← train_step[epoch] ← run_epoch ← …: growth changes regime at tokens = 400: "
            "12.0 KiB/token before, 48.0 KiB/token after") in flat
    assert "No regime change" not in flat


def test_against_tokens_forecast_cell_and_words():
    rows, quantities = quantity_steps(range(8, 209), lambda t: 49152 * t)
    events = timeline_of(rows)
    result = growth(pair_lifetimes(events), events, pd.concat([quantities, ram(GiB)]), top=0, against="tokens")
    text = rendered(result, {}, 100)
    assert [row[-1] for row in row_cells(text)] == ["≈ 21.8 k"]  # the time is in the words
    assert ("native_heap cpu: at this rate the machine's RAM is full at tokens ≈ 21.8 k, in 6.0 h, by the linear "
            "fit (R² 1.00, 201 points)") in " ".join(text.split())


def test_json_carries_against_and_the_regime():
    result, chains = against_result()
    data = json.loads(json.dumps(to_json(GrowthView(result, About("r.memprof"), chains))))
    assert (data["against"], data["x_unit"], data["by_step"], data["step_marks"]) == ("tokens", "tokens", True, 101)
    regime = data["series"][1]["regime"]
    assert regime["at_x"] == 400 and regime["sse_cut"] is None  # exact bend: inf, which JSON cannot hold
    assert (regime["slope_before"], regime["slope_after"]) == (pytest.approx(12 * KiB), pytest.approx(48 * KiB))
    assert data["series"][1]["x"][:3] == [8, 16, 24]

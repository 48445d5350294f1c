"""growth (fits and forecasts) and `memprof report growth`: known slopes, exponents and fill
steps on synthetic timelines, the bar a fit must pass before a forecast, the fallback to time
with fewer than 3 step marks, growth against a quantity (--against tokens) and regime changes.
The rendered report (goldens, widths) is tests/unit/test_growth_report.py."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from memprof.analysis.checkpoints import step_marks as marks_of
from memprof.analysis.growth import UnknownQuantityError, fit_linear, fit_power, growth, median_step_ns
from memprof.analysis.growth_regime import regime_change
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.units import format_bytes
from tests.factories import ev, leak
from tests.gpu_factories import (
    GiB, MiB, S, leak_per_step, power_law_steps, samples_frame, step_marks, timeline_of, write_recording,
)
from tests.growth_factories import quantity_steps, ram, slow_power_law, steps_holding


def fitted(rows, samples=None, **kwargs):
    events = timeline_of(rows)
    return growth(pair_lifetimes(events), events, samples, **kwargs)


def totals(result):
    return {(s.layer, s.device): s for s in result.series if not s.chain}


# ---- fits -----------------------------------------------------------------------------------

def test_a_leak_of_1_mib_per_step_fits_a_slope_of_1_mib_per_step():
    result = fitted(leak_per_step(20))
    assert (result.x_unit, result.step_ns) == ("step", S)
    total, chain = result.series  # the churning chain holds nothing at the end: not among the top
    assert not total.chain and (chain.chain, chain.stack_id) == (True, 7)
    assert total.x.tolist() == list(range(1, 21))
    assert total.bytes.tolist() == [(k - 1) * MiB for k in range(1, 21)]  # exact: the leak before each mark
    for series in (total, chain):
        assert series.linear.b == pytest.approx(MiB, rel=1e-12)
        assert series.linear.a == pytest.approx(-MiB, rel=1e-9)
        assert series.linear.r2 == pytest.approx(1.0, abs=1e-12)
        assert series.better == "linear" and series.power.r2 < 1


def test_a_power_law_is_recovered():
    (total, _) = fitted(power_law_steps(30)).series
    assert total.bytes.tolist() == [round(1000 * k ** 1.5) for k in range(1, 31)]
    assert total.power.b == pytest.approx(1.5, abs=1e-4)  # bytes are whole: a·k^b is rounded
    assert total.power.a == pytest.approx(1000, rel=1e-4)
    assert total.power.r2 == pytest.approx(1.0, abs=1e-9) and total.linear.r2 < 0.99
    assert total.better == "power"


def test_fit_functions_on_exact_data():
    x = np.arange(1, 11, dtype=float)
    power = fit_power(x, 1000 * x ** 1.5)
    assert (power.a, power.b, power.r2, power.points) == (pytest.approx(1000), pytest.approx(1.5), pytest.approx(1), 10)
    line = fit_linear(x, 5 + 3 * x)
    assert (line.a, line.b, line.r2) == (pytest.approx(5), pytest.approx(3), pytest.approx(1))
    # The power law fits only points with x > 0 and V > 0; R² is then over x > 0.
    assert fit_power(np.array([0, 1, 2, 3.0]), np.array([0, 0, 8, 27.0])) is None  # two usable points
    assert fit_linear(x[:2], x[:2]) is None  # two points always fit: too few
    flat = fit_linear(x, np.full(10, 7.0))
    assert (flat.b, flat.r2) == (0.0, 1.0)


def test_sampled_allocations_count_by_their_weight():
    rows = [dict(r, weight=4.0) if r.get("action") == "alloc" else r for r in leak_per_step(10)]
    total = fitted(rows).series[0]
    assert total.linear.b == pytest.approx(4 * MiB)


def test_without_steps_x_is_seconds_since_the_start():
    events = leak(11, every_ns=S, size=MiB, start_ns=2 * S)  # 1 MiB a second from 2 s to 12 s
    result = growth(pair_lifetimes(events), events, None, origin_ns=S, points=11)
    (total, _) = result.series
    assert (result.x_unit, result.step_ns, result.origin_ns) == ("s", None, S)
    assert total.x.tolist() == [float(t) for t in range(1, 12)]  # the 11 allocation times, seconds after 1 s
    assert total.bytes.tolist() == [k * MiB for k in range(1, 12)]
    assert total.linear.b == pytest.approx(MiB) and total.linear.r2 == pytest.approx(1.0)


def test_series_are_per_layer_and_device_and_layers_can_be_chosen():
    rows = (leak_per_step(5) + leak_per_step(5, layer="cuda_driver", device="cuda:0", stack_id=3, churn_stack=4)
            + [ev(S // 2, "alloc", 0x77, GiB, 5, layer="cuda_driver", device="cpu")])
    result = fitted(rows, top=0)
    assert list(totals(result)) == [("cuda_driver", "cpu"), ("cuda_driver", "cuda:0"), ("native_heap", "cpu")]
    assert totals(result)[("cuda_driver", "cpu")].bytes.tolist() == [GiB] * 5
    only = fitted(rows, layers=["native_heap"], top=1)
    assert [(s.layer, s.chain, s.stack_id) for s in only.series] == [("native_heap", False, None),
                                                                      ("native_heap", True, 7)]


def test_too_few_points_give_no_fit():
    events = leak(11, every_ns=S, size=MiB, start_ns=S)  # no step marks; read at 2 times only
    (total, _) = growth(pair_lifetimes(events), events, ram(GiB), points=2).series
    assert (total.linear, total.power, total.better, total.regime) == (None, None, None, None)
    assert (total.forecast.status, total.forecast.reason) == ("too_few_points", "too few points to forecast: 2 < 8")
    assert (total.forecast.points, total.forecast.model, total.forecast.r2) == (2, None, None)


def test_steps_marked_by_several_processes_count_once_and_gaps_count_as_steps():
    rows = step_marks([1, 2, 4]) + step_marks([1, 2], start_ns=S // 2, pid=200)
    steps = marks_of(timeline_of(rows))
    assert steps.values.tolist() == [[1, S], [2, 2 * S], [4, 4 * S]]
    assert median_step_ns(steps) == S
    uneven = [dict(row, ts_ns=t) for row, t in zip(step_marks([1, 2, 3]), (0, S, 4 * S))]  # 1 s, then 3 s
    assert median_step_ns(marks_of(timeline_of(uneven))) == 2 * S


# ---- forecasts ------------------------------------------------------------------------------

GPU_100_MIB = samples_frame([(S, "gpu_total_bytes", "cuda:0", 100.0 * MiB)])


def test_forecast_step_for_a_known_gpu_capacity():
    rows = leak_per_step(10, layer="cuda_block", device="cuda:0")
    # 9 MiB live at step 10, 1 MiB a step: 91 MiB more fill 100 MiB at step 101, 91 steps of 1 s on.
    forecast = fitted(rows, GPU_100_MIB).series[0].forecast
    assert (forecast.status, forecast.model, forecast.full_at_x, forecast.full_in_ns) == ("full", "linear", 101, 91 * S)
    assert (forecast.capacity_bytes, forecast.level_bytes) == (100 * MiB, 9 * MiB)
    assert forecast.reason == "at this rate cuda:0 is full at step 101, in 91 s"
    assert (forecast.points, forecast.r2) == (10, pytest.approx(1.0))
    # Other processes hold 30 MiB of the GPU (NVML): 70 MiB of room, full at step 80.
    used = samples_frame([(S, "gpu_used_bytes", "cuda:0", 30.0 * MiB), (2 * S, "gpu_used_bytes", "cuda:0", 30.0 * MiB)])
    forecast = fitted(rows, pd.concat([GPU_100_MIB, used])).series[0].forecast
    assert (forecast.full_at_x, forecast.level_bytes, forecast.full_in_ns) == (80, 30 * MiB, 70 * S)


def test_forecast_for_the_machines_ram_and_a_power_law():
    forecast = fitted(leak_per_step(10), ram(64 * MiB)).series[0].forecast
    assert (forecast.full_at_x, forecast.reason) == (65, "at this rate the machine's RAM is full at step 65, in 55 s")
    # 1000·x^1.5 reaches 10^6 bytes at x = 100.
    forecast = fitted(power_law_steps(10), ram(1e6)).series[0].forecast
    assert forecast.model == "power" and forecast.full_at_x == 100


def test_no_forecast_when_not_growing():
    shrinking = [ev(S // 2, "alloc", 0x1000 + i, MiB, 7) for i in range(10)] + step_marks(range(1, 11))
    shrinking += [ev(k * S + S // 2, "free", 0x1000 + k) for k in range(10)]
    (total,) = fitted(shrinking, ram(1e9)).series  # no chain holds bytes at the end
    assert total.linear.b == pytest.approx(-MiB)
    assert (total.forecast.status, total.forecast.full_at_x) == ("not_growing", None)
    assert total.forecast.reason == "not growing: -1.0 MiB per step"


def test_no_forecast_when_the_capacity_is_unknown():
    cpu = fitted(leak_per_step(10)).series[0].forecast
    assert (cpu.status, cpu.full_at_x) == ("no_capacity", None)
    assert cpu.reason == "capacity unknown: no host_memory_total_bytes sample (recorded before memprof sampled MemTotal)"
    gpu = fitted(leak_per_step(10, layer="cuda_block", device="cuda:1")).series[0].forecast
    assert gpu.reason == "capacity of cuda:1 unknown: no gpu_total_bytes sample (no NVML when recorded)"


# ---- the bar a forecast must pass -----------------------------------------------------------

RAM_1_GIB = ram(GiB)


def test_five_noisy_points_give_no_forecast():
    """The issue's "RAM full at step 971": 5 points, growing 128 KiB a step on the line, R²
    near 0. The old code forecast from it; too few points now, said in words."""
    live = [MiB + d * 128 * 1024 for d in (4, -6, 9, -4, 8)]
    (total, _) = fitted(steps_holding(live), RAM_1_GIB).series
    assert total.linear.b == pytest.approx(128 * 1024) and total.linear.r2 < 0.1  # the line: 128 KiB a step
    forecast = total.forecast
    assert (forecast.status, forecast.full_at_x, forecast.full_in_ns) == ("too_few_points", None, None)
    assert (forecast.reason, forecast.points, forecast.model) == ("too few points to forecast: 5 < 8", 5, "linear")


def test_a_poor_fit_gives_no_forecast_and_says_its_r2():
    live = [MiB + d * 128 * 1024 for d in (0, 10, -1, 10, 5, 11, 0, 18, 7, 13, 6, 19)]  # 127 KiB a step, R² 0.29
    (total, _) = fitted(steps_holding(live), RAM_1_GIB).series
    r2 = total.best.r2
    assert total.linear.b == pytest.approx(127.1 * 1024, rel=1e-3) and r2 == pytest.approx(0.29, abs=0.005)
    assert (total.forecast.status, total.forecast.r2, total.forecast.full_at_x) == ("poor_fit", r2, None)
    assert total.best.model == "linear"
    assert total.forecast.reason == f"fit too poor to forecast: R² {r2:.2f} (the line) < 0.80"


def test_an_r2_just_under_the_bar_reads_under_it():
    """An R² of 0.7998 read "R² 0.80 < 0.80" (a torch.compile run's kernel_slab, 2026-12-07):
    rounded down it reads 0.79, with the fit it belongs to."""
    from memprof.analysis.growth import Fit
    from memprof.analysis.growth_forecast import SeriesContext, forecast
    ctx = SeriesContext(x=np.arange(12.0), x_unit="step", step_ns=None, capacity=RAM_1_GIB, no_capacity_reason="",
                        device_used=None)
    bent = Fit("since_break", 0.0, 1024.0, 0.7998, 12)
    made = forecast(Fit("linear", 0.0, 1024.0, 0.07, 12), bent, ctx, MiB, "cpu")
    assert made.reason == "fit too poor to forecast: R² 0.79 (the line since the regime change) < 0.80"


def test_no_forecast_while_the_line_falls_even_when_the_power_law_rises():
    """Step 0 holds 100 MiB (freed after it), then 1 MiB·k^0.5: the power law, over k > 0,
    fits best and rises, the line falls. The old report said "full" beside a negative slope."""
    live = [100 * MiB] + [round(MiB * k ** 0.5) for k in range(1, 11)]
    (total, _) = fitted(steps_holding(live, first_step=0), ram(16 * MiB)).series
    assert total.better == "power" and total.power.b == pytest.approx(0.5, abs=1e-3) and total.power.r2 > 0.99
    assert total.linear.b < 0
    assert (total.forecast.status, total.forecast.full_at_x) == ("not_growing", None)
    assert total.forecast.reason == f"not growing: {format_bytes(total.linear.b)} per step"


def test_a_fill_past_the_horizon_is_no_date():
    """64 B a step, one step a second, 64 GiB of RAM: full in 34 years: no date, 'not within 10
    years'. The old code gave the step and "(in 12427.6 days)"."""
    forecast = fitted(leak_per_step(10, 64), ram(64 * GiB)).series[0].forecast
    assert (forecast.status, forecast.full_at_x, forecast.full_in_ns) == ("beyond_horizon", None, None)
    assert forecast.reason == "at this rate the machine's RAM is not full within 10 years"
    # 1 MiB a step fills the same RAM within the horizon, at whole steps, said in hours.
    forecast = fitted(leak_per_step(10), ram(16 * GiB)).series[0].forecast
    assert (forecast.status, forecast.full_at_x, forecast.full_in_ns) == ("full", 16_385, 16_375 * S)
    assert forecast.reason == "at this rate the machine's RAM is full at step 16,385, in 4.5 h"


def test_without_steps_a_power_law_too_slow_to_fill_in_10_years_is_no_date():
    events = slow_power_law()
    result = growth(pair_lifetimes(events), events, ram(64 * GiB))
    total = result.series[0]
    assert result.x_unit == "s" and total.better == "power" and total.power.b == pytest.approx(0.05, abs=0.01)
    assert (total.forecast.status, total.forecast.full_in_ns) == ("beyond_horizon", None)


def test_a_device_already_full_is_full_now():
    forecast = fitted(leak_per_step(10), ram(4 * MiB)).series[0].forecast
    assert (forecast.status, forecast.full_at_x, forecast.full_in_ns) == ("full", 10, 0)
    assert forecast.reason == "the machine's RAM is already full"


# ---- the command ----------------------------------------------------------------------------

def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_cli_fits_a_recording(tmp_path):
    path = write_recording(tmp_path / "leak.memprof", timeline_of(leak_per_step(10)), ram(64 * MiB))
    code, out, err = invoke("report", "growth", path, "--format", "json", "--top", "1")
    assert code == 0, err
    total = json.loads(out)["series"][0]
    assert total["linear"]["b"] == pytest.approx(MiB) and total["forecast"]["full_at_x"] == 65
    code, out, _ = invoke("report", "growth", path, "--layer", "native_heap")
    assert code == 0 and "the machine's RAM is full at step 65" in out


def test_cli_exit_codes(tmp_path):
    assert invoke("report", "growth", tmp_path / "missing.memprof")[0] == 5
    path = write_recording(tmp_path / "r.memprof", timeline_of(leak_per_step(3)))
    assert invoke("report", "growth", path, "--layer", "gpu")[0] == 2
    assert invoke("report", "growth", path, "--points", "2")[0] == 2
    assert invoke("report", "growth", path, "--top", "-1")[0] == 2
    assert invoke("report", "growth", path)[0] == 0


# ---- fewer than 3 step marks: judged over time ----------------------------------------------

def one_step_mark() -> list[dict]:
    """One step mark (at 1 s), and 1 MiB kept every 0.2 s from 0.2 s to 9.8 s (49 blocks)."""
    return step_marks([1]) + [ev(k * S // 5, "alloc", 0x1000 + k * 0x1000, MiB, 7) for k in range(1, 50)]


def test_one_step_mark_falls_back_to_evenly_spaced_times_and_says_so():
    """Issue 21: a generate run held one step mark and every series said 'only 1 points'."""
    result = fitted(one_step_mark())
    (total, chain) = result.series
    assert (result.x_unit, result.by_step, result.step_marks, result.against) == ("s", False, 1, None)
    assert result.notes == ["only 1 step mark: judged at 50 evenly spaced times 195.9ms apart instead"]
    assert len(total.x) == 50 and total.x[0] == 0.0 and total.x[-1] == pytest.approx(9.6)  # 0.2 s .. 9.8 s
    assert total.linear.b == pytest.approx(5 * MiB, rel=0.02) and total.linear.r2 > 0.99  # 1 MiB per 0.2 s
    assert total.forecast.status == "no_capacity"  # judged, no longer "too few points: 1 < 8"


def test_two_step_marks_fall_back_too_and_three_do_not():
    two = fitted(step_marks([1, 2]) + one_step_mark()[1:])
    assert two.notes[0].startswith("only 2 step marks: judged at 50 evenly spaced times")
    three = fitted(leak_per_step(3))
    assert (three.x_unit, three.by_step, three.notes) == ("step", True, [])
    assert three.series[0].x.tolist() == [1.0, 2.0, 3.0]


def test_cli_notes_the_fallback(tmp_path):
    path = write_recording(tmp_path / "one.memprof", timeline_of(one_step_mark()))
    code, out, err = invoke("report", "growth", path)
    assert code == 0, err
    assert "note: only 1 step mark: judged at 50 evenly spaced times 195.9ms apart instead" in out
    assert "too few step marks: x is seconds since the recording start" in out and "only 1 points" not in out


# ---- against a quantity ---------------------------------------------------------------------

KiB = 1 << 10
TOKENS = list(range(8, 209))  # one decode step per token: tokens = 8..208 at steps 1..201
KV_PER_TOKEN = 49152  # 48 KiB: 2 × 6 layers × 2 batch × 512 hidden × 4 bytes (GPT-2 of issue 21, float32)


def against_tokens(live_of, samples=None, values=TOKENS, **kwargs):
    rows, quantities = quantity_steps(values, live_of)
    both = quantities if samples is None else pd.concat([quantities, samples])
    return fitted(rows, both, against="tokens", **kwargs)


def test_a_chain_growing_48_kib_per_token_fits_per_token():
    result = against_tokens(lambda t: KV_PER_TOKEN * t, ram(GiB))
    (total, chain) = result.series
    assert (result.x_unit, result.against, result.by_step) == ("tokens", "tokens", True)
    assert chain.x.tolist() == [float(t) for t in TOKENS] and chain.bytes[-1] == KV_PER_TOKEN * 208
    assert chain.linear.b == pytest.approx(KV_PER_TOKEN, rel=0.01) and chain.linear.r2 > 0.99
    assert 0.99 <= chain.power.b <= 1.01 and chain.power.r2 > 0.99
    assert chain.regime is None
    # 1 GiB fills at 1 GiB / 48 KiB = 21,845.3 tokens; one token a second from 8 to 208.
    forecast = total.forecast
    assert (forecast.status, forecast.full_at_x) == ("full", pytest.approx(GiB / KV_PER_TOKEN))
    assert forecast.full_in_ns == pytest.approx((GiB / KV_PER_TOKEN - 208) * S, rel=1e-6)
    assert forecast.reason == "at this rate the machine's RAM is full at tokens ≈ 21.8 k, in 6.0 h"


def test_quadratic_growth_has_power_b_2_and_no_regime_change():
    """V ∝ L² (attention scores of a whole sequence): one curve, which a bent line also cuts
    well; the power law fits it better, so no regime change is claimed."""
    (_, chain) = against_tokens(lambda t: 64 * t * t).series
    assert chain.power.b == pytest.approx(2.0, abs=0.01) and chain.power.r2 > 0.999
    assert chain.better == "power" and chain.regime is None


def test_a_flat_control_has_no_regime_change_and_no_forecast():
    (total, chain) = against_tokens(lambda t: MiB, ram(GiB)).series
    assert chain.linear.b == pytest.approx(0, abs=1e-6) and chain.bytes.tolist() == [MiB] * len(TOKENS)
    assert (total.regime, chain.regime) == (None, None)
    assert total.forecast.status == "not_growing" and total.forecast.full_at_x is None
    assert total.forecast.reason == "not growing: 0 B per token"


def test_checkpoints_before_the_first_value_are_left_out():
    rows, quantities = quantity_steps(TOKENS, lambda t: KV_PER_TOKEN * t)
    result = fitted(rows, quantities[quantities["ts_ns"] >= 11 * S], against="tokens")  # marks 1..10 carry none
    assert result.series[0].x[0] == 18.0 and len(result.series[0].x) == len(TOKENS) - 10
    assert result.notes == ["10 of 201 checkpoints come before the first tokens value: left out"]


def test_a_quantity_between_checkpoints_is_its_last_value_at_or_before():
    """Three marks carry tokens (at 1, 4 and 7 s); step marks at every second read the last."""
    rows = leak_per_step(9)
    quantities = samples_frame([(S, "quantity:tokens", "", 10.0), (4 * S, "quantity:tokens", "", 40.0),
                                (7 * S, "quantity:tokens", "", 70.0)])
    total = fitted(rows, quantities, against="tokens").series[0]
    assert total.x.tolist() == [10, 10, 10, 40, 40, 40, 70, 70, 70]


def test_against_step_is_the_default():
    by_step = fitted(leak_per_step(10), against="step")
    assert (by_step.x_unit, by_step.against) == ("step", None)
    assert by_step.series[0].linear.b == pytest.approx(MiB)


def test_an_unknown_quantity_is_a_usage_error_listing_those_the_recording_has():
    rows, quantities = quantity_steps(TOKENS, lambda t: t)
    with pytest.raises(UnknownQuantityError) as caught:
        fitted(rows, pd.concat([quantities, ram(GiB), samples_frame([(S, "quantity:batch", "", 2.0)])]),
               against="seq_len")
    assert (caught.value.message, caught.value.exit_code) == ("no quantity 'seq_len' in this recording", 2)
    assert caught.value.hint == "--against takes one of: step, batch, tokens"
    with pytest.raises(UnknownQuantityError) as caught:
        fitted(rows, ram(GiB), against="tokens")
    assert caught.value.hint.startswith("this recording has no quantities, so --against takes only step")


def test_cli_against_tokens_json(tmp_path):
    rows, quantities = quantity_steps(TOKENS, lambda t: KV_PER_TOKEN * t)
    path = write_recording(tmp_path / "kv.memprof", timeline_of(rows), pd.concat([quantities, ram(GiB)]))
    code, out, err = invoke("report", "growth", path, "--against", "tokens", "--format", "json", "--top", "1")
    assert code == 0, err
    data = json.loads(out)
    assert (data["against"], data["x_unit"], data["by_step"], data["step_marks"]) == ("tokens", "tokens", True, 201)
    assert data["regime_bar"] == {"min_sse_cut": 4.0, "min_slope_ratio": 1.5, "min_points": 12, "min_side": 3}
    total, chain = data["series"]
    assert chain["linear"]["b"] == pytest.approx(KV_PER_TOKEN) and chain["power"]["b"] == pytest.approx(1, abs=0.01)
    assert (chain["regime"], total["forecast"]["full_at_x"]) == (None, pytest.approx(GiB / KV_PER_TOKEN))


def test_cli_unknown_quantity_is_one_line_and_exit_2(tmp_path):
    rows, quantities = quantity_steps(TOKENS, lambda t: t)
    path = write_recording(tmp_path / "q.memprof", timeline_of(rows), quantities)
    code, out, err = invoke("report", "growth", path, "--against", "seq_len")
    assert (code, out) == (2, "")
    assert err.splitlines() == ["memprof: error: no quantity 'seq_len' in this recording",
                                "hint: --against takes one of: step, tokens"]


# ---- regime changes -------------------------------------------------------------------------

def twelve_then_48_kib(t: float) -> float:
    """12 KiB per token up to tokens = 400, 48 KiB per token after."""
    return 12 * KiB * min(t, 400) + 48 * KiB * max(t - 400, 0)


def test_a_regime_change_at_400_tokens_is_found():
    tokens = list(range(8, 809, 6))  # 398 and 404 around the break: it lies between two points
    jitter = np.random.default_rng(0).integers(-2 * KiB, 2 * KiB, len(tokens))  # a few KiB of noise
    live = {t: twelve_then_48_kib(t) + 64 * KiB + j for t, j in zip(tokens, jitter)}
    (total, chain) = against_tokens(live.get, values=tokens).series
    for series in (total, chain):
        regime = series.regime
        assert regime is not None and abs(regime.at_x - 400) <= 10
        assert regime.slope_before == pytest.approx(12 * KiB, rel=0.03)
        assert regime.slope_after == pytest.approx(48 * KiB, rel=0.01)
        assert regime.sse_cut >= 4 and regime.points_before + regime.points_after == len(tokens) + 1


def test_a_jump_at_set_up_then_flat_forecasts_nothing():
    """A clean training run: its state made over the first 5 steps, then 60 flat steps.
    The bent line's second segment is held to meet the first and sloped 1.9 KiB a step; the
    line since the break, fitted to its own points, barely rises and explains nothing: no
    forecast (before 2026-12-07, "RAM is full at step 537,414, in 6 days"; a real run's
    read "in 20 days")."""
    live = [MiB, 6 * MiB, 9 * MiB, 9.5 * MiB, 10 * MiB] + [10 * MiB] * 60
    (total, _) = fitted(steps_holding(live), RAM_1_GIB).series
    assert total.regime is not None and total.regime.at_x == 3 and total.regime.slope_after > 1024
    assert (total.forecast.status, total.forecast.full_at_x, total.forecast.model) == ("poor_fit", None, "since_break")
    assert total.forecast.r2 < 0.1


def test_regime_change_bar():
    x = np.arange(1.0, 41.0)
    bent = np.where(x <= 20, 100 * x, 2000 + 400 * (x - 20))
    assert regime_change(x, bent).at_x == 20.0
    assert regime_change(x, bent, rival_r2=1.0) is None  # a smooth model fits as well: no claim
    assert regime_change(x, 5 + 3 * x) is None  # already one line
    slight = np.where(x <= 20, 100 * x, 2000 + 140 * (x - 20))  # slopes 1.4× apart: the same growth
    assert regime_change(x, slight) is None
    assert regime_change(x[:11], bent[:11]) is None  # 11 points: too few to tell
    rising_then_flat = np.minimum(100 * x, 2000)
    assert regime_change(x, rising_then_flat).slope_after == pytest.approx(0, abs=1e-9)


def test_repeated_x_like_a_servers_token_counts_never_make_a_singular_fit():
    """A server's 20 requests each count tokens 0…39 (the agent's `tokens`, from each
    prompt): every x repeats 20 times, the least and the greatest too. A bend there had a
    flat or a copy-of-x hinge, and `report advice` died of numpy's LinAlgError (2026-12-07).
    The bend of a cache that fills to 30 tokens and then holds is still found."""
    x = np.tile(np.arange(40.0), 20)
    assert regime_change(x, 8192 * x) is None  # one line
    filled = np.minimum(8192 * x, 8192 * 30)
    assert regime_change(x, filled).at_x == 30.0
    assert regime_change(np.repeat([0.0, 16.0], 20), np.repeat([0.0, 1e6], 20)) is None  # two x: no bend


def test_the_chain_that_grows_outranks_bigger_ones_that_do_not():
    """generate_kv.py's case: 24 MiB of weights made before the first token, never changing,
    and a KV cache rising 48 KiB a token to under 10 MiB. With room for one chain, growth
    shows the cache (ranked by bytes held at the end, it showed the weights)."""
    rows, quantities = quantity_steps(TOKENS, lambda t: KV_PER_TOKEN * t)
    rows.append(ev(S // 4, "alloc", 0x90_0000, 24 * MiB, 99))  # the weights, before the first step
    (_, chain) = fitted(rows, quantities, against="tokens", top=1).series
    assert chain.stack_id == 7 and chain.linear.b == pytest.approx(KV_PER_TOKEN, rel=0.01)
    (_, first, second) = fitted(rows, quantities, against="tokens", top=2).series
    assert (first.stack_id, second.stack_id) == (7, 99)  # then by bytes held

"""Advice rule `attention-scores` on synthetic sweeps (tests/inference_advice_factories.py):
for seq_len 128 … 1024, batch 1, 8 heads, a written-out attention holds its scores and their
softmax (each batch × heads × L² × 4 bytes: 32 MiB at L = 1024) beside q, k, v and the output
(linear in L): the advice, with the exponent, the bytes and the saving exact. The fused
kernel's sweep (no L × L tensor), an L² chain outside attention code, too few lengths, scores
that are a small share of the peak and a recording without regions get none."""
from __future__ import annotations

import pytest

from memprof.api import analyse
from memprof.analysis.advice import advise, attention
from tests.inference_advice_factories import PAIRWISE, SCORES, SOFTMAX, MiB, scores_bytes, sweep, generation


def judged(path):
    return attention.check(analyse(path))


def test_a_written_out_attention_gets_its_scores_exponent_and_saving(tmp_path):
    verdict = judged(sweep(tmp_path / "s.memprof"))
    assert verdict.why_not is None
    (advice,) = verdict.advice
    each = scores_bytes(1024)  # 1 × 8 × 1024² × 4 = 32 MiB
    qkv_out = 4 * 8 * 1024 * 64 * 4
    n = advice.numbers
    assert each == 32 * MiB
    assert n["scores_bytes"] == 2 * each == advice.saving_bytes
    assert n["peak_bytes"] == 2 * each + qkv_out
    assert n["chain_bytes"] == {str(SCORES): each, str(SOFTMAX): each}
    assert n["exponent"] == pytest.approx(2.0) and n["r2"] == pytest.approx(1.0)
    assert n["seq_len"] == 1024 and n["seq_lens"] == [128, 256, 512, 1024] and n["region"] == 4
    assert n["float32_matrices"] == 16  # 2 tensors × batch × heads
    assert set(advice.chains) == {SCORES, SOFTMAX} and (advice.layer, advice.device) == ("torch_cpu", "cpu")
    assert advice.title == "Attention materialises seq_len × seq_len scores: 64.0 MiB at seq_len = 1,024, 89% of the torch_cpu peak"
    text = "\n".join(advice.evidence)
    assert "grow as seq_len^2.00 (power law, R² 1.000) over seq_len = 128, 256, 512, 1,024" in text
    assert "naive_attention (attention_sweep.py:54) holds 32.0 MiB = 1 × 8 × 1,024² × 4 bytes (batch × heads × L² × 4)" in text
    assert "naive_attention (attention_sweep.py:55) holds 32.0 MiB" in text
    assert "they hold 64.0 MiB of the torch_cpu peak of 72.0 MiB (89%)" in text
    assert "scaled_dot_product_attention" in advice.change
    assert advice.saving.endswith("does not materialise them: about 64.0 MiB less at the peak")


def test_batch_and_heads_scale_the_formula(tmp_path):
    (advice,) = judged(sweep(tmp_path / "s.memprof", batch=2, heads=4, seq_lens=(64, 128, 256, 512))).advice
    assert advice.numbers["scores_bytes"] == 2 * scores_bytes(512, batch=2, heads=4)
    assert "2 × 4 × 512² × 4 bytes (batch × heads × L² × 4)" in "\n".join(advice.evidence)


def test_the_advice_ranks_with_its_saving_in_the_table(tmp_path):
    result = advise(analyse(sweep(tmp_path / "s.memprof")))
    mine = [a for a in result.advice if a.rule == "attention-scores"]
    assert len(mine) == 1 and mine[0].saving_bytes == 64 * MiB


def test_a_fused_kernel_that_holds_no_scores_gets_none(tmp_path):
    verdict = judged(sweep(tmp_path / "s.memprof", scores=False))
    assert verdict.advice == ()
    assert verdict.why_not == "no chain grows as seq_len² over the regions"


def test_an_l_squared_chain_outside_attention_code_gets_none(tmp_path):
    verdict = judged(sweep(tmp_path / "s.memprof", quadratic_stack=PAIRWISE))
    assert verdict.advice == ()
    assert verdict.why_not == "1 chain(s) in torch_cpu on cpu grow as seq_len² but none runs through attention code"


def test_two_lengths_cannot_tell_l_squared_from_l(tmp_path):
    verdict = judged(sweep(tmp_path / "s.memprof", seq_lens=(512, 1024)))
    assert verdict.advice == ()
    assert verdict.why_not == "2 distinct seq_len value(s) over the regions: telling L² from L needs MIN_SEQ_LENS 3"


def test_scores_that_are_a_small_share_of_the_peak_get_none(tmp_path):
    verdict = judged(sweep(tmp_path / "s.memprof", weights=1024 * MiB))  # 64 MiB of 1096 MiB
    assert verdict.advice == ()
    assert "hold 64.0 MiB of the 1.1 GiB peak at seq_len = 1,024 (below MIN_SHARE_OF_PEAK 10% or MIN_BYTES 1.0 MiB)" in verdict.why_not


def test_a_recording_without_regions_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", [100, 200, 300, 400]))
    assert verdict.advice == ()
    assert verdict.why_not.startswith("no regions to judge attention by")


def test_the_rule_names_its_thresholds():
    names = {t.name for t in attention.RULE.thresholds}
    assert names == {"MIN_SEQ_LENS", "MIN_EXPONENT", "MAX_EXPONENT", "MIN_R2", "MIN_SHARE_OF_PEAK", "MIN_BYTES"}
    assert all((attention.RULE.trigger, attention.RULE.evidence, attention.RULE.advice, attention.RULE.saving))

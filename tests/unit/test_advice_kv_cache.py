"""Advice rule `kv-cache` on synthetic generations (tests/inference_advice_factories.py):
a KV cache of two chains (keys, values: transformers' DynamicLayer.update) growing 48 KiB a
token beside 24 MiB of weights, with 64 GiB of RAM, gets the advice with its exact numbers;
a cache that does not grow, per-token growth that is no cache, a cache that is a small share
of the peak and a training loop (no tokens) get none."""
from __future__ import annotations

import pytest

from memprof.api import analyse
from memprof.analysis.advice import advise, kv_cache
from tests.inference_advice_factories import KEYS, LOGITS, RAM, VALUES, KiB, MiB, generation

TOKENS = [100 * k for k in range(1, 11)]  # 100 … 1000 tokens at the ten step marks
PER_TOKEN = 48 * KiB
WEIGHTS = 24 * MiB


def judged(path):
    return kv_cache.check(analyse(path))


def test_a_cache_growing_on_a_line_gets_its_slope_share_and_forecast(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, per_token=PER_TOKEN, weights=WEIGHTS))
    assert verdict.why_not is None
    (advice,) = verdict.advice
    cache = PER_TOKEN * 1000
    level = WEIGHTS + cache
    n = advice.numbers
    assert n["bytes_per_token"] == pytest.approx(PER_TOKEN)
    assert n["r2"] == pytest.approx(1.0)
    assert n["tokens"] == 1000
    assert (n["layer_peak_bytes"], n["cache_bytes_at_peak"]) == (level, cache)
    assert n["share_of_peak"] == pytest.approx(cache / level)
    assert n["full_at_tokens"] == pytest.approx(1000 + (RAM - level) / PER_TOKEN)  # 1,397,589.3
    assert advice.saving_bytes == cache // 2 and n["saving_bytes_if_float32"] == cache * 3 // 4
    assert set(advice.chains) == {KEYS, VALUES}
    assert (advice.layer, advice.device) == ("torch_cpu", "cpu")
    assert advice.title == "The KV cache grows 48.0 KiB per token: 66% of the torch_cpu peak"
    text = "\n".join(advice.evidence)
    assert "grow 48.0 KiB per token (a line in tokens, R² 1.000)" in text
    assert "DynamicLayer.update (cache_utils.py:136)" in text and "DynamicLayer.update (cache_utils.py:137)" in text
    assert "at the torch_cpu peak of 70.9 MiB the cache holds 46.9 MiB (66%)" in text
    assert "cpu's 64.0 GiB is full at L ≈ 1.4 M tokens" in text
    assert "L ≈ 1.4 M tokens" in advice.change and "quantized" in advice.change
    assert "at least 23.4 MiB less at the peak" in advice.saving


def test_the_advice_ranks_with_its_saving_in_the_table(tmp_path):
    result = advise(analyse(generation(tmp_path / "g.memprof", TOKENS)))
    mine = [a for a in result.advice if a.rule == "kv-cache"]
    assert len(mine) == 1 and mine[0].saving_bytes == PER_TOKEN * 1000 // 2


def test_a_cache_per_request_that_does_not_grow_with_the_tokens_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, keep=False))
    assert verdict.advice == ()
    assert verdict.why_not == "no chain through a KV cache grows with the tokens"


def test_per_token_growth_that_is_no_cache_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, cache_stacks=(LOGITS,)))
    assert verdict.advice == ()
    assert verdict.why_not == "no chain through a KV cache grows with the tokens"


def test_a_cache_that_is_a_small_share_of_the_peak_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, weights=1024 * MiB))  # 46.9 MiB of 1070.9 MiB
    assert verdict.advice == ()
    assert "holds 46.9 MiB of its 1.0 GiB peak (4% < MIN_SHARE_OF_PEAK 10%)" in verdict.why_not


def test_a_cache_growing_too_little_per_token_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, per_token=512, weights=4096))
    assert verdict.advice == ()
    assert "grows 512 B per token (< MIN_BYTES_PER_TOKEN 1.0 KiB)" in verdict.why_not


def test_a_cache_that_jumps_instead_of_following_the_tokens_gets_none(tmp_path):
    held = [100] * 5 + [1000] * 5  # sized once for 100 tokens, then for 1000: not a line in tokens
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, cached=held))
    assert verdict.advice == ()
    assert verdict.why_not.startswith("the KV cache in torch_cpu on cpu does not follow the tokens on a line (R² 0.")
    assert verdict.why_not.endswith("< MIN_R2 0.9)")


def test_a_training_loop_without_tokens_gets_none(tmp_path):
    verdict = judged(generation(tmp_path / "g.memprof", TOKENS, with_tokens=False))
    assert verdict.advice == ()
    assert verdict.why_not.startswith("no tokens quantity to fit a cache against")


def test_the_rule_names_its_thresholds():
    names = {t.name: t.value for t in kv_cache.RULE.thresholds}
    assert names == {"MIN_SHARE_OF_PEAK": 0.10, "MIN_R2": 0.90, "MIN_BYTES_PER_TOKEN": 1024}
    assert all((kv_cache.RULE.trigger, kv_cache.RULE.evidence, kv_cache.RULE.advice, kv_cache.RULE.saving))

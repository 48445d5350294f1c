"""Advice rules `kv-cache` and `attention-scores` (issue 22) on real inference recorded under
`memprof record`, both ways:

- examples/generate_kv.py (a transformers GPT-2, random weights, 6 layers, hidden 512, batch 2)
  generating 200 tokens: its KV cache grows 2 × 6 × 2 × 512 × 4 = 48 KiB a token, through
  transformers' DynamicLayer.update (keys and values): kv-cache fires with that slope, and the
  token count L at which the RAM fills; no regions, so attention-scores is silent.
- a smaller GPT-2 (2 layers, hidden 256) serving 12 fixed-size requests (use_cache=True: each forward makes a cache of
  its own 32 tokens, dropped with the next one's output): the agent's tokens grow, no cache
  does: kv-cache is silent.
- examples/train.py (a training loop): kv-cache and attention-scores are silent.
- examples/attention_sweep.py at L = 128 … 1024 (batch 1, 8 heads): the written-out attention
  holds its scores and their softmax, each batch × heads × L² × 4 bytes (32 MiB at L = 1024),
  so attention-scores fires with exponent 2 and 64 MiB saved; with --sdpa (a blockwise kernel
  on the CPU for float32) nothing grows as L² and it is silent.

Five short recordings (module-scoped fixtures), one `report advice --format json` each."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOKENS = 200
KV_BYTES_PER_TOKEN = 2 * 6 * 2 * 512 * 4  # generate_kv.py's defaults: 48 KiB
SEQ_LENS = (128, 256, 512, 1024)
BATCH, HEADS = 1, 8
SCORES = BATCH * HEADS * 1024 * 1024 * 4  # one L × L float32 tensor at L = 1024: 32 MiB

FIXED_REQUESTS = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=64)
model = GPT2LMHeadModel(config).eval()
ids = torch.randint(0, config.vocab_size, (2, 32))
with torch.no_grad():
    for _ in range(12):
        out = model(ids, use_cache=True)
print("forwards=12", flush=True)
'''


def advice_of(run_memprof, tmp_path_factory, name: str, *command) -> dict:
    """`report advice --format json` of COMMAND recorded under memprof."""
    folder = tmp_path_factory.mktemp(name)
    path = folder / f"{name}.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, *command, cwd=folder, timeout=600)
    assert result.returncode == 0, result.stderr
    report = run_memprof("report", "advice", path, "--format", "json", cwd=folder, timeout=300)
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout)


def rule_of(data: dict, rule: str) -> tuple[list[dict], dict]:
    """(the rule's advice, its entry: fired, why_not, thresholds)."""
    return [a for a in data["advice"] if a["rule"] == rule], next(r for r in data["rules"] if r["id"] == rule)


def frames(advice: dict) -> list[list[dict]]:
    return [chain["stack"] for chain in advice["chains"]]


@pytest.fixture(scope="module")
def generate(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory, "generate", EXAMPLES / "generate_kv.py", "--tokens", TOKENS)


@pytest.fixture(scope="module")
def fixed_requests(run_memprof, tmp_path_factory) -> dict:
    script = tmp_path_factory.mktemp("script") / "fixed_requests.py"
    script.write_text(FIXED_REQUESTS)
    return advice_of(run_memprof, tmp_path_factory, "fixed", script)


@pytest.fixture(scope="module")
def train(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory, "train", EXAMPLES / "train.py", "--steps", 5, "--start-wait", 0,
                     "--hold", 0)


@pytest.fixture(scope="module")
def naive(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory, "naive", EXAMPLES / "attention_sweep.py")


@pytest.fixture(scope="module")
def sdpa(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory, "sdpa", EXAMPLES / "attention_sweep.py", "--sdpa")


def test_generation_gets_the_kv_cache_advice_with_its_slope_and_forecast(generate):
    [advice], entry = rule_of(generate, "kv-cache")
    assert entry["fired"] and (advice["layer"], advice["device"]) == ("torch_cpu", "cpu")
    n = advice["numbers"]
    assert abs(n["bytes_per_token"] - KV_BYTES_PER_TOKEN) <= 0.05 * KV_BYTES_PER_TOKEN, n
    assert n["r2"] >= 0.99, n
    assert TOKENS <= n["tokens"] <= TOKENS + 8, n  # the prompt's 8 tokens and the last forward's
    # At the peak the cache holds about its 200 tokens' worth (plus one layer's copy being made longer).
    assert 0.95 * TOKENS * KV_BYTES_PER_TOKEN <= n["cache_bytes_at_peak"] <= 1.3 * (TOKENS + 8) * KV_BYTES_PER_TOKEN, n
    assert n["share_of_peak"] == pytest.approx(n["cache_bytes_at_peak"] / n["layer_peak_bytes"])
    assert 0.10 <= n["share_of_peak"] < 0.5, n  # 24 MiB of weights and more beside it
    # L: the tokens at which the RAM is full at the cache's slope, from the layer's last level.
    free = n["capacity_bytes"] - n["layer_peak_bytes"]
    assert n["full_at_tokens"] == pytest.approx(n["tokens"] + free / n["bytes_per_token"], rel=0.01), n
    assert advice["saving_bytes"] == n["cache_bytes_at_peak"] // 2
    stacks = frames(advice)
    assert len(stacks) == 2, stacks  # keys and values
    for stack in stacks:
        assert any(f["function"] == "DynamicLayer.update" and (f["file"] or "").endswith("cache_utils.py")
                   for f in stack), stack
    assert any("DynamicLayer.update (cache_utils.py:" in line for line in advice["evidence"]), advice["evidence"]
    assert any("is full at L ≈" in line for line in advice["evidence"]), advice["evidence"]


def test_generation_without_regions_gets_no_attention_advice(generate):
    advice, entry = rule_of(generate, "attention-scores")
    assert advice == [] and not entry["fired"]
    assert entry["why_not"].startswith("no regions to judge attention by")


def test_fixed_size_requests_with_a_cache_each_get_no_kv_cache_advice(fixed_requests):
    advice, entry = rule_of(fixed_requests, "kv-cache")
    assert advice == [] and not entry["fired"], advice
    assert "tokens quantity" not in entry["why_not"], entry["why_not"]  # it judged the tokens, and no cache grew with them


def test_a_training_loop_gets_neither(train):
    for rule in ("kv-cache", "attention-scores"):
        advice, entry = rule_of(train, rule)
        assert advice == [] and not entry["fired"], (rule, advice)


def test_written_out_attention_gets_the_scores_advice_with_l_squared_bytes(naive):
    [advice], entry = rule_of(naive, "attention-scores")
    assert entry["fired"] and (advice["layer"], advice["device"]) == ("torch_cpu", "cpu")
    n = advice["numbers"]
    assert n["seq_lens"] == list(SEQ_LENS) and n["seq_len"] == 1024
    assert abs(n["exponent"] - 2) <= 0.05 and n["r2"] >= 0.99, n
    assert sorted(n["chain_bytes"].values()) == [SCORES, SCORES], n  # the scores and their softmax
    assert n["scores_bytes"] == advice["saving_bytes"] == 2 * SCORES
    assert n["float32_matrices"] == 2 * BATCH * HEADS
    assert n["share_of_peak"] >= 0.8, n  # q, k, v and the output are 8 MiB at L = 1024
    lines = EXAMPLES.joinpath("attention_sweep.py").read_text().splitlines()
    scores_line = next(i for i, line in enumerate(lines, 1) if "scores = (q @ k.transpose" in line)
    softmax_line = next(i for i, line in enumerate(lines, 1) if "weights = torch.softmax(scores" in line)
    text = "\n".join(advice["evidence"])
    for line in (scores_line, softmax_line):
        assert f"naive_attention (attention_sweep.py:{line}) holds 32.0 MiB = 1 × 8 × 1,024² × 4 bytes" in text, text
    assert "about 64.0 MiB less at the peak" in advice["saving"]


def test_written_out_attention_gets_no_kv_cache_advice(naive):
    advice, entry = rule_of(naive, "kv-cache")
    assert advice == [] and not entry["fired"]


def test_scaled_dot_product_attention_gets_no_scores_advice(sdpa):
    advice, entry = rule_of(sdpa, "attention-scores")
    assert advice == [] and not entry["fired"], advice
    assert entry["why_not"] == "no chain grows as seq_len² over the regions"

"""LLM inference under `memprof record` (issue 21): examples/generate_kv.py, a transformers
GPT-2 (random weights: 6 layers, hidden 512, batch 2) generating tokens with no optimizer.
Its memory grows by the KV cache, 2 × layers × batch × hidden × 4 bytes = 48 KiB per token.

One recording (module-scoped: a run takes tens of seconds), several reports of it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate_kv.py"
TOKENS = 160
KV_BYTES_PER_TOKEN = 2 * 6 * 2 * 512 * 4


def names(stack: list[dict]) -> list[str]:
    return [f"{f.get('file') or ''}:{f['function']}" for f in stack]


def is_cache_chain(stack: list[dict]) -> bool:
    return any("DynamicLayer.update" in f["function"] or (f.get("file") or "").endswith("cache_utils.py")
               for f in stack)


@pytest.fixture(scope="module")
def recording(tmp_path_factory, run_memprof) -> Path:
    folder = tmp_path_factory.mktemp("generate")
    path = folder / "generate.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, EXAMPLE, "--tokens", TOKENS,
                                cwd=folder, timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"generated={TOKENS} " in result.stdout
    return path


def report_json(run, path: Path, *args) -> dict:
    result = run("report", *args, path, "--format", "json", cwd=path.parent, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_steps_are_the_forwards_one_per_token(recording):
    meta = json.loads((recording / "meta.json").read_text())
    assert set(meta["sources"]["agent"]["detail"]["step_sources"].values()) == {"forward"}


def test_growth_against_tokens_names_the_kv_cache_at_its_size(recording, run_memprof):
    report = report_json(run_memprof, recording, "growth", "--against", "tokens")
    assert report["against"] == "tokens"
    cache = [s for s in report["series"]  # the cache's tensors (its page faults' chains run through it too)
             if s["chain"] and s["layer"] == "torch_cpu" and is_cache_chain(s.get("stack", []))]
    context = "\n".join(f"{s['layer']} {s['linear'] and s['linear']['b']} {names(s.get('stack', []))[:6]}"
                        for s in report["series"])
    assert cache, f"no chain through the KV cache among the series:\n{context}"
    slope = sum(s["linear"]["b"] for s in cache)
    assert abs(slope - KV_BYTES_PER_TOKEN) <= 0.15 * KV_BYTES_PER_TOKEN, (slope, context)
    for s in cache:
        assert 0.9 <= s["power"]["b"] <= 1.1, (s["power"], context)


def test_no_parameter_is_a_leak(recording, run_memprof):
    report = report_json(run_memprof, recording, "leaks", "--top", "1000", "--min-age", "0")
    init = [f for f in report["findings"] if any(fr["function"].endswith(("Conv1D.__init__", "Embedding.__init__"))
                                                 for fr in f["stack"])]
    assert init == [], [names(f["stack"])[:6] for f in init]
    # The cache grows per token and generate frees it when it returns: a request's working
    # memory (one buffer per layer made larger each token), not a leak.
    assert not [f for f in report["findings"] if f["layer"] == "torch_cpu" and is_cache_chain(f["stack"])]
    cache = [f for f in report["not_leaks"] if f["layer"] == "torch_cpu" and is_cache_chain(f["stack"])]
    grown = [f for f in cache if f["reason"] == "grows_within"]
    assert len(grown) == 2, [(f["reason"], names(f["stack"])[:4]) for f in cache]  # keys and values


SERVE = EXAMPLE.with_name("serve_kv.py")


@pytest.mark.parametrize("keep", [False, True], ids=["control", "keeps-every-cache"])
def test_an_inference_loop_is_a_leak_only_when_it_keeps_something_per_request(tmp_path, run_memprof, keep):
    """Four requests of 24 tokens. Each request's KV cache grows 24 KiB a token per chain
    (keys, values) and is freed when the next request returns: growth within each request,
    not a leak. With --keep every cache is kept (and freed only as main returns): a leak
    that grows per step."""
    path = tmp_path / "serve.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, SERVE, "--requests", 4, "--tokens", 24,
                         *(["--keep"] if keep else []), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    report = report_json(run_memprof, path, "leaks", "--top", "1000")
    cache = [f for f in report["findings"] + report["not_leaks"] if is_cache_chain(f["stack"])]
    context = "\n".join(f"{f['kind']} {f['reason']} {f['live_bytes']} {names(f['stack'])[:4]}"
                        for f in report["findings"] + report["not_leaks"][:10])
    if keep:
        growing = [f for f in report["findings"] if is_cache_chain(f["stack"])]
        assert len(growing) == 2 and {f["kind"] for f in growing} == {"grows_per_step"}, context
        assert all(f["released_before_end"] for f in growing), context
    else:  # nothing that grows, and nothing of PyTorch's held (the kernel's held objects are not this test's)
        assert not [f for f in report["findings"] if f["kind"] == "grows_per_step" or f["layer"] == "torch_cpu"], context
        within = [f for f in cache if f["reason"] == "sawtooth" and f["within_slope_bytes_per_step"]]
        assert len(within) == 2, context
        for f in within:
            assert abs(f["within_slope_bytes_per_step"] - KV_BYTES_PER_TOKEN / 2) <= 0.15 * KV_BYTES_PER_TOKEN / 2, context


TRAIN = EXAMPLE.with_name("train.py")


def test_an_adam_training_loop_names_and_totals_its_model_state_and_none_is_a_leak(tmp_path, run_memprof):
    """examples/train.py with Adam: 2 Linear layers (4 parameters), each with a gradient and
    Adam's exp_avg, exp_avg_sq and step: model state, totalled by role, never a finding."""
    path = tmp_path / "adam.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, TRAIN, "--optimizer", "adam",
                         "--steps", 30, "--start-wait", 0, "--hold", 0, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    report = report_json(run_memprof, path, "leaks", "--top", "1000")
    totals = {(t["role"], t["layer"]): (t["count"], t["live_bytes"]) for t in report["model_state"]}
    weights = (512 * 512 + 512 + 10 * 512 + 10) * 4  # fc1 and fc2, float32
    assert totals[("parameter", "torch_cpu")] == (4, weights), totals
    assert totals[("gradient", "torch_cpu")] == (4, weights), totals
    count, size = totals[("optimizer_state", "torch_cpu")]
    assert count == 12 and size >= 2 * weights, totals  # exp_avg, exp_avg_sq (+ 4 step scalars)
    state = [f for f in report["findings"] if f["reason"] == "model_state" or "__init__" in " ".join(names(f["stack"]))]
    assert state == [], [names(f["stack"])[:5] for f in state]

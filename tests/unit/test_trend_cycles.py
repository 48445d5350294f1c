"""Growth within cycles against growth across them (issue 21, item 6): a KV cache that each
request fills and frees is a sawtooth that "grows within each request"; a loop that keeps
something from every request grows, even where each request also frees most of what it
made. The series are those of examples/serve_kv.py's cache chain, in KiB per checkpoint
(one checkpoint a token; 24 KiB a token)."""
from __future__ import annotations

import numpy as np
import pytest

from memprof.analysis.trend import classify

KIB = 1024
FIRST_REQUEST = [0, 0, 0] + [216 + 24 * i for i in range(23)]


def serve(requests: int = 4, kept_per_request: int = 0) -> np.ndarray:
    """`out` holds the last request's cache (744 KiB) until the next request returns; a
    loop that keeps caches adds `kept_per_request` KiB more at every request's end."""
    series, kept = list(FIRST_REQUEST), 0
    for _ in range(requests - 1):
        kept += kept_per_request
        series += [kept + 744] + [kept + 960 + 24 * i for i in range(22)]
    return np.array(series, dtype=float) * KIB


def test_a_cache_each_request_fills_and_frees_grows_within_the_request_only():
    (trend,) = classify(serve()[None, :])
    # Four requests, two releases: the first request's cache is freed only when the second
    # returns (`out` holds it until then).
    assert (trend.shape, trend.resets) == ("sawtooth", 2)
    assert trend.within_slope == pytest.approx(24 * KIB)


def test_keeping_something_from_every_request_grows():
    (trend,) = classify(serve(kept_per_request=300)[None, :])
    assert trend.shape == "grows"


def test_a_loop_that_keeps_every_cache_grows_without_releases():
    kept = np.concatenate([np.array(FIRST_REQUEST[3:]) + 744 * r for r in range(4)]) * KIB
    (trend,) = classify(kept[None, :].astype(float))
    assert (trend.shape, trend.resets, trend.within_slope) == ("grows", 0, None)


def test_troughs_that_only_jitter_stay_a_sawtooth():
    rng = np.random.default_rng(7)
    series = serve()
    series[np.flatnonzero(series == 744 * KIB)] += rng.integers(1, 4 * KIB, size=(series == 744 * KIB).sum())
    (trend,) = classify(series[None, :])
    assert trend.shape == "sawtooth"


def test_a_buffer_refilled_every_few_steps_is_still_a_sawtooth():
    (trend,) = classify(np.tile([0, 64, 128, 192], 6)[None, :].astype(float) * KIB)
    assert (trend.shape, trend.resets) == ("sawtooth", 5)
    assert trend.within_slope == pytest.approx(64 * KIB)

"""bench/common.py's interval for a ratio of medians: the bench's verdict on the overhead bar
reads its upper end, so it must hold the ratio it brackets and move with the data."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parents[2] / "bench" / "common.py"


@pytest.fixture(scope="module")
def interval():
    spec = importlib.util.spec_from_file_location("bench_common", COMMON)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ratio_of_medians_interval


def test_a_constant_ratio_has_no_spread(interval):
    base = [0.40, 0.43, 0.39, 0.47, 0.41, 0.45]
    low, high = interval([b * 1.05 for b in base], base)
    assert low == pytest.approx(1.05) and high == pytest.approx(1.05)


def test_the_interval_holds_the_ratio_of_medians_and_widens_with_noise(interval):
    base = [0.40, 0.42, 0.41, 0.43, 0.40, 0.44, 0.42, 0.41, 0.39, 0.45]
    wobble = [1.00, 1.20, 0.95, 1.10, 1.05, 0.90, 1.15, 1.00, 1.25, 1.02]
    values = [b * w for b, w in zip(base, wobble)]
    low, high = interval(values, base)
    point = sorted(values)[4:6]
    ratio = (sum(point) / 2) / (sum(sorted(base)[4:6]) / 2)
    assert low < ratio < high
    assert high - low > 0.05
    assert interval(values, base) == (low, high)  # seeded: a printed interval can be redone


def test_too_few_or_unpaired_rounds_are_refused(interval):
    with pytest.raises(ValueError):
        interval([1.0, 1.1, 1.2], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError):
        interval([1.0] * 5, [1.0] * 4)

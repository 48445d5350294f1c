"""bench/common.py's interval for a ratio of medians (the bench's verdict on the overhead bar
reads its upper end, so it must hold the ratio it brackets and move with the data), and its
runner that pauses the profiler's process for the workload's loop."""
from __future__ import annotations

import sys
import textwrap

import pytest

from tests.bench_modules import load_bench


@pytest.fixture(scope="module")
def common():
    return load_bench("common")


@pytest.fixture(scope="module")
def interval(common):
    return common.ratio_of_medians_interval


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


# The workload, run by a shell standing in for the profiler: between its pid= and loop_s=
# lines it reports whether its parent (the "profiler") is stopped, then after loop_s= again.
_WORKLOAD = textwrap.dedent("""
    import os, time
    def parent_stopped():
        with open(f"/proc/{os.getppid()}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[0] == "T")
    print("pid=", os.getpid(), flush=True)
    time.sleep(0.3)
    print(f"stopped_in_loop={parent_stopped()}", flush=True)
    print("loop_s=0.25", flush=True)
    time.sleep(0.3)
    print(f"stopped_after={parent_stopped()}", flush=True)
""")


def test_the_profiler_is_stopped_for_the_loop_alone(common, tmp_path):
    script = tmp_path / "workload.py"
    script.write_text(_WORKLOAD)
    loop, wall, fields = common.run_paused_between(["sh", "-c", f"{sys.executable} {script}; exit 0"], "pid=", "loop_s=")
    assert loop == 0.25 and wall >= 0.6
    assert (fields["stopped_in_loop"], fields["stopped_after"]) == (1, 0)


def test_pooling_weighs_each_runs_ratio_by_its_rounds_not_by_its_seconds(common):
    # A slow hour (base 0.50 s, 1.20x) with 10 rounds and a quick one (base 0.25 s, 1.05x)
    # with 30: pooled in ratios, 1.05^(3/4) * 1.20^(1/4), whatever the seconds.
    slow_base, quick_base = [0.50] * 10, [0.25] * 30
    runs = [([b * 1.20 for b in slow_base], slow_base), ([b * 1.05 for b in quick_base], quick_base)]
    expected = 1.05 ** 0.75 * 1.20 ** 0.25
    assert common.pooled_ratio(runs) == pytest.approx(expected)
    low, high = common.pooled_ratio_interval(runs, resamples=200)
    assert low == pytest.approx(expected) and high == pytest.approx(expected)


def test_the_pooled_interval_holds_the_pooled_ratio_and_is_narrower_than_one_run(common):
    base = [0.40, 0.42, 0.41, 0.43, 0.40, 0.44, 0.42, 0.41, 0.39, 0.45]
    wobble = [1.00, 1.20, 0.95, 1.10, 1.05, 0.90, 1.15, 1.00, 1.25, 1.02]
    one = ([b * w for b, w in zip(base, wobble)], base)
    shifted = ([b * w for b, w in zip(base, wobble[3:] + wobble[:3])], base)
    point = common.pooled_ratio([one, shifted])
    low, high = common.pooled_ratio_interval([one, shifted], resamples=1000)
    single_low, single_high = common.ratio_of_medians_interval(*one, resamples=1000)
    assert low < point < high
    assert high - low < single_high - single_low


def test_pooling_refuses_unpaired_or_no_runs(common):
    with pytest.raises(ValueError):
        common.pooled_ratio([])
    with pytest.raises(ValueError):
        common.pooled_ratio([([1.0, 1.1], [1.0])])

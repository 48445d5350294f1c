"""The fast paths taken for 10^7-event recordings (bench/analysis_speed.py) give the answers of
the plain ways: sorting, steps, tensor roles, radix pairing, canonical stacks."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.analysis import chains
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.timeline import in_time_order, time_order, with_steps, with_tensor_roles
from tests.factories import ev, events_frame, mark, random_lifetimes, stacks_frames


def test_time_order_none_when_sorted_and_stable_otherwise():
    assert time_order(np.array([1, 2, 2, 5]), np.array([0, 1, 2, 3])) is None
    # equal ts, seq falling: must reorder those two
    assert time_order(np.array([1, 2, 2]), np.array([0, 2, 1])).tolist() == [0, 2, 1]
    # nearly sorted, rows in ingest order: the stable sort by ts keeps seq order in ties
    assert time_order(np.array([5, 3, 3, 9]), np.array([0, 1, 2, 3])).tolist() == [1, 2, 0, 3]


def test_in_time_order_matches_sort_values_and_does_not_copy_sorted_frames():
    frame = random_lifetimes(20_000, seed=3)
    rng = np.random.default_rng(1)
    shuffled = frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)
    expected = shuffled.sort_values(["ts_ns", "seq"], kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(in_time_order(shuffled), expected)
    same = in_time_order(frame)
    assert np.shares_memory(same["ts_ns"].to_numpy(), frame["ts_ns"].to_numpy())
    assert isinstance(in_time_order(frame.set_index(frame.index + 7)).index, pd.RangeIndex)


def test_a_nearly_ordered_frame_is_patched_to_exactly_what_a_full_sort_gives():
    """The ring buffer's interleaving: a few neighbours swapped. Every dtype of the schema
    (categoricals, nullable ints with NA, uint64, floats with NaN) comes out as sort_values
    makes it, and the input frame is left as it was."""
    frame = random_lifetimes(20_000, seed=5)
    frame["weight"] = np.where(np.arange(len(frame)) % 7 == 0, 2.5, np.nan)
    frame["step"] = pd.array(np.where(np.arange(len(frame)) % 5 == 0, None, np.arange(len(frame)) // 100),
                             dtype="Int32")
    swapped = np.arange(len(frame))
    for at in range(10, len(frame) - 1, 997):
        swapped[at], swapped[at + 1] = swapped[at + 1], swapped[at]
    nearly = frame.iloc[swapped].reset_index(drop=True)
    before = nearly.copy(deep=True)
    expected = nearly.sort_values(["ts_ns", "seq"], kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(in_time_order(nearly), expected)
    pd.testing.assert_frame_equal(nearly, before)


def test_with_steps_fills_int32_steps_per_process_and_keeps_given_ones():
    frame = events_frame([
        (50, "alloc", 0xA0, 8), dict(ts_ns=100, action="mark", category="step", step=1, pid=100),
        (150, "alloc", 0xB0, 8), dict(ts_ns=160, action="alloc", addr=0xC0, step=9),
        dict(ts_ns=170, action="alloc", addr=0xD0, pid=200),
        dict(ts_ns=200, action="mark", category="step", step=2, pid=100), (250, "free", 0xA0),
    ])
    steps = with_steps(frame)["step"]
    assert str(steps.dtype) == "Int32"
    assert steps.tolist() == [pd.NA, 1, 1, 9, pd.NA, 2, 2]
    assert frame["step"].isna().sum() == 4  # the input is not changed


def test_without_step_or_tensor_marks_the_frame_is_returned_as_is():
    frame = events_frame([(100, "alloc", 0xA0, 8), mark(200, 100)])
    assert with_steps(frame) is frame and with_tensor_roles(frame) is frame


def test_tensor_role_goes_to_the_nearest_allocation_on_a_categorical_column():
    frame = events_frame([
        ev(1_000, "alloc", 0xA0, 64, layer="torch_cpu"),
        ev(1_500, "mark", 0xA0, layer="torch_cpu", category="tensor:activation"),
        ev(9_000_000, "alloc", 0xA0, 64, layer="torch_cpu"),  # 9 ms away: beyond the tolerance
    ])
    assert isinstance(frame["category"].dtype, pd.CategoricalDtype)
    got = with_tensor_roles(frame)["category"]
    assert got.tolist()[0] == "activation" and pd.isna(got.tolist()[2])
    assert got.tolist()[1] == "tensor:activation"


def test_pairing_over_more_keys_than_one_radix_pass_holds():
    """100,000 addresses (> 2^16 keys), each allocated twice: the first closed as a missed
    free by the second, the second freed; plus alloc_id rows on the same addresses."""
    n = 100_000
    addr = (0x7F00_0000_0000 + np.arange(n) * 16).astype(np.uint64)
    rows = [(t, "alloc", int(a), 8) for t, a in zip(range(0, 3 * n, 3), addr)]
    rows += [(3 * n + t, "alloc", int(a), 8) for t, a in zip(range(0, 3 * n, 3), addr)]
    rows += [(6 * n + t, "free", int(a)) for t, a in zip(range(0, 3 * n, 3), addr)]
    rows += [ev(10 * n, "alloc", int(addr[0]), 8, alloc_id=1), ev(10 * n + 1, "free", 0, alloc_id=1)]
    lt = pair_lifetimes(events_frame(rows))
    kinds = lt.allocations["end_kind"].astype(str).to_numpy()
    assert (kinds[:n] == "missed").all() and (kinds[n:] == "freed").all()
    assert lt.allocations["end_ts_ns"].iloc[:n].tolist() == list(range(3 * n, 6 * n, 3))
    assert lt.allocations["end_ts_ns"].iloc[-1] == 10 * n + 1
    assert lt.missed_frees == {"native_heap": n} and lt.unmatched_frees == {}


def test_weight_defaults_to_one_and_carries_sampled_weights():
    frame = events_frame([ev(100, "alloc", 0xA0, 8, weight=4.0), ev(200, "alloc", 0xB0, 8)])
    assert pair_lifetimes(frame).allocations["weight"].tolist() == [4.0, 1.0]
    assert pair_lifetimes(frame.drop(columns="weight")).allocations["weight"].tolist() == [1.0, 1.0]


def _random_stacks(seed: int):
    rng = np.random.default_rng(seed)
    chains_ = {}
    for sid in range(1, 400):
        depth = int(rng.integers(1, 12))
        chains_[sid] = [("native", f"f{int(rng.integers(0, 6))}", None, None, None) for _ in range(depth)]
    for sid in range(400, 460):  # twins of earlier chains, some twice
        chains_[sid] = list(chains_[int(rng.integers(1, 50))])
    stacks, frames = stacks_frames(chains_)
    # one frame id per distinct frame, as the recorder interns them
    frame_key = frames["function"]
    stacks["frame_id"] = pd.factorize(frame_key)[0][stacks["frame_id"]]
    return stacks.sample(frac=1, random_state=seed).reset_index(drop=True)


def test_canonical_stacks_equals_the_tuple_way():
    for seed in range(3):
        stacks = _random_stacks(seed)
        got = chains.canonical_stacks(stacks)
        assert got == chains._canonical_by_tuples(stacks) and len(got) >= 60


def test_canonical_stacks_falls_back_on_a_fingerprint_collision(monkeypatch):
    stacks = pd.DataFrame({"stack_id": [1, 1, 2, 2, 3, 3], "depth": [0, 1] * 3, "frame_id": [5, 6, 7, 8, 5, 6]})
    assert chains.canonical_stacks(stacks) == {3: 1}
    monkeypatch.setattr(chains, "_mix", lambda x: np.zeros_like(x))  # every stack of a length collides
    assert chains.canonical_stacks(stacks) == {3: 1}


def test_factorizing_on_two_threads_gives_one_code_per_value(monkeypatch):
    """Halves factorized apart, then merged: equal values share a code across the halves,
    codes are dense, and uniques[codes] gives the values back."""
    from memprof.analysis import lifetimes
    monkeypatch.setattr(lifetimes, "_SPLIT_AT", 10)
    values = np.random.default_rng(4).integers(0, 50, 10_001).astype(np.uint64) * 4096
    codes, uniques = lifetimes._factorized(values)
    assert (uniques[codes] == values).all()
    assert sorted(set(codes.tolist())) == list(range(len(uniques))) and len(uniques) == len(set(values.tolist()))

"""Arrow arrays built from buffers (memprof/recording/arrow_build.py) are pa.array's, value for
value and null for null, for every column type memprof's tables have; bad values raise
ValueError as pa.array raises; and none of it imports pandas."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from memprof.recording import arrow_build as B

INTEGER_TYPES = (pa.int8(), pa.int32(), pa.int64(), pa.uint64())


@pytest.mark.parametrize("type_", INTEGER_TYPES, ids=str)
def test_integers_with_nulls_are_pa_arrays(type_):
    values = [0, 1, None, 7, None, 100]
    assert B.numeric(values, type_).equals(pa.array(values, type_))
    assert B.numeric(np.array([3, 4, 5]), type_, mask=np.array([False, True, False])).to_pylist() == [3, None, 5]
    assert B.numeric(range(4), type_).to_pylist() == [0, 1, 2, 3]


def test_integers_that_need_all_64_bits_stay_exact():
    """numpy makes [0, 2**64 - 1] float64 by itself (found by the agent lines' fuzz test)."""
    values = [0, None, 2**64 - 1, 2**63]
    assert B.numeric(values, pa.uint64()).to_pylist() == values
    with pytest.raises(ValueError):
        B.numeric([-1, 2**64 - 1], pa.uint64())
    with pytest.raises(ValueError):
        B.numeric([2**63], pa.int64())
    with pytest.raises(ValueError):  # numpy would wrap a numpy scalar to 2**64 - 1 by itself
        B.numeric([np.int64(-1)], pa.uint64())
    assert B.numeric([np.uint64(2**64 - 1), None], pa.uint64()).to_pylist() == [2**64 - 1, None]


def test_nan_is_null_in_float_and_integer_columns_as_from_pandas_reads_it():
    values = np.array([1.0, np.nan, 3.0])
    assert B.numeric(values, pa.float64()).equals(pa.array(values, pa.float64(), from_pandas=True))
    assert B.numeric(values, pa.int64()).to_pylist() == [1, None, 3]


@pytest.mark.parametrize("values, type_", [
    ([128], pa.int8()), ([-1], pa.uint64()), (np.array([2.0**64]), pa.uint64()), (np.array([2.0**63]), pa.int64()),
    (np.array([2**64 - 1], np.uint64), pa.int64()), ([2**31], pa.int32()), ([1.5], pa.int64()), (["7"], pa.int64()),
    (np.array(["a"]), pa.float64()), ([object()], pa.int64()),
], ids=["int8-overflow", "uint64-negative", "float-past-uint64", "float-past-int64", "uint64-past-int64", "int32-overflow", "not-integral", "text-as-int", "text-as-float", "object"])
def test_a_value_that_does_not_fit_raises_value_error(values, type_):
    with pytest.raises(ValueError):
        B.numeric(values, type_)
    if values != [1.5]:  # pa.array truncates a Python float to an integer; a numpy one it refuses
        with pytest.raises((pa.ArrowException, TypeError, ValueError, OverflowError)):
            pa.array(values, type_)  # pa.array refuses them too


def test_a_null_slot_is_not_checked_for_range():
    assert B.numeric(np.array([1, 300]), pa.int8(), mask=np.array([False, True])).to_pylist() == [1, None]


def test_strings_with_nulls_and_any_text_are_pa_arrays():
    values = ["kernel", None, "", "déjà vu", "中文", None]
    assert B.strings(values).equals(pa.array(values, pa.string()))
    with pytest.raises(ValueError):
        B.strings(["ok", 3])
    with pytest.raises(ValueError):
        B.strings(["\udcff"])  # a lone surrogate is not UTF-8


def test_dictionaries_and_repeated_values():
    type_ = pa.dictionary(pa.int8(), pa.string())
    assert B.dictionary(["a", "b", None, "a"], type_).to_pylist() == ["a", "b", None, "a"]
    assert B.dictionary(["a"], type_).type == type_
    assert B.repeated(5, pa.int32(), 3).to_pylist() == [5, 5, 5]
    assert B.repeated("rss", pa.string(), 2).to_pylist() == ["rss", "rss"]
    assert B.repeated("exit", type_, 2).to_pylist() == ["exit", "exit"]


def test_dictionaries_are_encoded_in_first_seen_order_with_their_limit():
    type_ = pa.dictionary(pa.int8(), pa.string())
    array = B.dictionary([None, "b", "a", "b", None, "c"], type_)
    assert array.type == type_ and array.null_count == 2
    assert array.dictionary.to_pylist() == ["b", "a", "c"] and array.indices.to_pylist() == [None, 0, 1, 0, None, 2]
    assert B.dictionary([], type_).to_pylist() == []
    assert B.dictionary([f"label {i}" for i in range(128)], type_).dictionary.to_pylist()[-1] == "label 127"
    with pytest.raises(ValueError, match="129 distinct values, a category column holds at most 128"):
        B.dictionary([f"label {i}" for i in range(129)], type_)
    with pytest.raises(ValueError):
        B.dictionary(["a", 3], type_)
    wide = pa.dictionary(pa.int32(), pa.string())
    assert B.dictionary([f"step {i}" for i in range(1000)], wide).to_pylist()[999] == "step 999"


def _events_table(rng: np.random.Generator, rows: int) -> pa.Table:
    """A random table of the events schema's kinds of columns: int64 keys with ties, a uint64,
    nullable integers and floats, dictionary columns with nulls."""
    layer = pa.dictionary(pa.int8(), pa.string())
    nulls = rng.random(rows) < 0.3
    return pa.table({
        "ts_ns": B.numeric(rng.integers(0, rows // 3 + 1, rows), pa.int64()),
        "seq": B.numeric(rng.permutation(rows), pa.int64()),
        "layer": B.dictionary([None if n else f"layer {k}" for n, k in zip(nulls, rng.integers(0, 5, rows))], layer),
        "addr": B.numeric(rng.integers(0, 2**63, rows, dtype=np.uint64) * 2, pa.uint64()),
        "stack_id": B.numeric(rng.integers(-2**62, 2**62, rows), pa.int64(), rng.random(rows) < 0.5),
        "step": B.numeric(rng.integers(0, 9, rows), pa.int32(), nulls),
        "weight": B.numeric(np.where(rng.random(rows) < 0.5, np.nan, rng.random(rows)), pa.float64()),
    })


@pytest.mark.parametrize("seq", ["shuffled", "rising"])
@pytest.mark.parametrize("seed", range(10))
def test_sorted_by_sorts_as_pyarrow_does(seed, seq):
    """Against Table.sort_by, on tables of several chunks, some of them slices (an offset in
    every buffer, the validity bitmaps' included); ties on ts_ns are broken by seq, shuffled
    or (as the writer appends batches) rising row by row."""
    rng = np.random.default_rng(seed)
    chunks = [_events_table(rng, int(n)) for n in rng.integers(1, 300, 3)]
    sliced = chunks[0].slice(int(rng.integers(0, max(chunks[0].num_rows, 1))))
    table = pa.concat_tables([sliced, *chunks[1:]])
    if seq == "rising":
        table = table.set_column(1, "seq", B.numeric(np.arange(table.num_rows) * 3, pa.int64()))
    expected = table.sort_by([("ts_ns", "ascending"), ("seq", "ascending")])
    assert B.sorted_by(table, ["ts_ns", "seq"]).equals(expected)


def test_take_rows_takes_as_pyarrow_does_repeats_included():
    rng = np.random.default_rng(7)
    table = pa.concat_tables([_events_table(rng, 50), _events_table(rng, 70).slice(13)])
    order = rng.integers(0, table.num_rows, 200)
    assert B.take_rows(table, order).equals(table.take(pa.array(order)))
    # One sliced chunk: its arrays keep their offset into the buffers (combining several
    # chunks makes new buffers, of offset 0).
    sliced = _events_table(rng, 90).slice(17, 60)
    order = rng.permutation(60)
    assert sliced.column("stack_id").chunks[0].offset == 17
    assert B.take_rows(sliced, order).equals(sliced.take(pa.array(order)))


def test_sorted_by_leaves_what_it_cannot_take_to_pyarrow():
    """A string column, or a null in a key: Table.sort_by's answer (nulls last)."""
    table = pa.table({"ts_ns": pa.array([3, 1, 2], pa.int64()), "name": pa.array(["c", "a", "b"])})
    assert B.sorted_by(table, ["ts_ns"]).column("name").to_pylist() == ["a", "b", "c"]
    keyed = pa.table({"ts_ns": pa.array([3, None, 2], pa.int64())})
    assert B.sorted_by(keyed, ["ts_ns"]).column("ts_ns").to_pylist() == [2, 3, None]


def test_to_numpy_reads_values_nulls_and_slices():
    array = pa.array([1, None, 3, 4, None, 6], pa.int64())
    assert B.to_numpy(array, null_as=-1).tolist() == [1, -1, 3, 4, -1, 6]
    assert B.to_numpy(array.slice(2, 3), null_as=0).tolist() == [3, 4, 0]
    codes = pa.DictionaryArray.from_arrays(pa.array([0, None, 1], pa.int8()), pa.array(["x", "y"]))
    assert B.to_numpy(codes, null_as=-1).tolist() == [0, -1, 1]


def test_no_pandas_is_imported():
    code = """
import sys, numpy as np, pyarrow as pa
from memprof.recording import arrow_build as B
B.numeric([1, None], pa.int64()); B.numeric(np.array([1.0, np.nan]), pa.float64()); B.strings(["a", None])
B.dictionary(["a"], pa.dictionary(pa.int8(), pa.string())); B.repeated(1, pa.int64(), 2)
B.to_numpy(B.numeric([1, None], pa.int64()), 0)
table = pa.table({"ts_ns": B.numeric([2, 1], pa.int64()), "seq": B.numeric([0, 1], pa.int64())})
assert B.sorted_by(table, ["ts_ns", "seq"])["seq"].to_pylist() == [1, 0]
print("pandas" in sys.modules, "pyarrow.compute" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"

"""Arrow arrays from numpy arrays and Python lists, and numpy arrays from Arrow ones, without
pyarrow importing pandas, and a table's rows sorted and dictionary columns encoded without
pyarrow.compute (issue 24: the recorder's size and CPU).

pyarrow imports pandas, when it is installed, the first time it converts a Python or numpy
object (`pa.array`, `pa.scalar`, `Array.to_numpy`): ~45 MB and ~0.25 s of CPU in the
recorder, beside the command it records. Built from buffers, an array never asks. These
cover the column types of memprof's tables (model/schema.py): integers, floats and strings;
any other input (a pandas object, say) is left to `pa.array` by the writer.

Contracts: nulls are None in a list, `mask` True for an array, and NaN in a float column (as
`pa.array(..., from_pandas=True)` reads it). A value that does not fit the type raises
ValueError, as pa.array raises.
"""
from __future__ import annotations

from typing import Sequence

from memprof.lazy_import import numpy as np, pyarrow as pa


def convertible(value) -> bool:
    """Whether these functions take `value` as values: a numpy array, list, tuple or range."""
    return isinstance(value, (list, tuple, range)) or isinstance(value, np.ndarray)


def numeric(values, type_: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """An Arrow array of integer or float `type_` from a numpy array or a sequence (None for
    null). Raises ValueError where a value is not a number or does not fit `type_`."""
    target = np.dtype(type_.to_pandas_dtype())
    if isinstance(values, np.ndarray) and values.dtype != object:
        array = values
    else:
        array, nulls = _from_sequence(values, target)
        if nulls is not None:
            mask = nulls if mask is None else mask | nulls
    if array.dtype.kind == "f":  # NaN is null, as from_pandas reads it, whatever the column's type
        nan = np.isnan(array)
        if nan.any():
            mask = nan if mask is None else mask | nan
            array = np.where(nan, 0, array)
    if pa.types.is_floating(type_):
        if array.dtype.kind not in "iufb":
            raise ValueError(f"not a number column: {array.dtype}")
        out = array.astype(target, copy=False)
    else:
        out = _integers(array, target, mask)
    return _with_validity(type_, np.ascontiguousarray(out), mask)


def _from_sequence(values, target: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """A Python sequence (or an object array) as numbers, and its null mask (None: no nulls).
    Integers go straight to `target`, exactly (a list mixing 0 and 2**64 - 1 would otherwise
    become float64 in numpy's hands)."""
    if isinstance(values, range):
        return np.arange(values.start, values.stop, values.step, dtype=np.int64), None
    items = list(values)
    nulls = np.fromiter((v is None for v in items), bool, len(items))
    if nulls.any():
        items = [0 if v is None else v for v in items]
    # As Python ints: numpy casts a numpy scalar that does not fit (np.int64(-1) into uint64)
    # without a word, where it refuses a Python int.
    if target.kind in "iu" and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        try:
            return np.array([int(v) for v in items], dtype=target), nulls
        except OverflowError as e:
            raise ValueError(f"a value out of range for {target}: {e}") from e
    array = np.asarray(items)
    if array.dtype.kind not in "iufb":
        raise ValueError(f"not a number: {array.dtype} values")
    return array, nulls


def _integers(array: np.ndarray, target: np.dtype, mask: np.ndarray | None) -> np.ndarray:
    """`array` as integers of `target`; ValueError for a value that is not an integer or
    does not fit (null slots, `mask` True, are not checked)."""
    if array.dtype.kind == "b":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iuf":
        raise ValueError(f"not an integer column: {array.dtype}")
    if np.can_cast(array.dtype, target, "safe"):
        return array.astype(target, copy=False)  # every value fits: the decoder's columns, no scan
    valid = array if mask is None or not mask.any() else array[~mask]
    if valid.size:
        if array.dtype.kind == "f" and not np.all(np.isfinite(valid) & (valid == np.floor(valid))):
            raise ValueError("a value is not an integer")
        low, high = valid.min(), valid.max()
        if array.dtype.kind == "f":  # float bounds exactly: float(2**63 - 1) rounds up to 2**63
            top = 2.0 ** (8 * target.itemsize - (target.kind == "i"))
            out = low < (-top if target.kind == "i" else 0.0) or high >= top
        else:
            info = np.iinfo(target)
            out = low < info.min or high > info.max
        if out:
            raise ValueError(f"a value out of range for {target}: {low} to {high}")
    return array.astype(target, copy=False)


def strings(values: Sequence) -> pa.Array:
    """A string array from a sequence of str (None for null). ValueError for any other value."""
    encoded, offsets, nulls = [], np.zeros(len(values) + 1, np.int64), np.zeros(len(values), bool)
    total = 0
    for i, value in enumerate(values):
        if value is None:
            nulls[i] = True
        elif isinstance(value, str):
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"not UTF-8 text: {value!r}") from e
            encoded.append(data)
            total += len(data)
        else:
            raise ValueError(f"not a string: {type(value).__name__} {value!r}")
        offsets[i + 1] = total
    if total >= 2**31:  # a string column's 32-bit offsets (pa.array, cast to string, refused it too)
        raise ValueError(f"{total:,} bytes of text in one batch: a string column holds less than 2 GiB")
    buffers = [_validity(nulls), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(values), buffers, null_count=int(nulls.sum()))


def dictionary(values: Sequence, type_: pa.DictionaryType) -> pa.Array:
    """A dictionary array of `type_` from a sequence of str (None for null), its dictionary
    in the order values first appear. Encoded here, by a dict: Array.dictionary_encode and
    Array.cast import pyarrow.compute (~11 MB and ~20 ms of CPU in the recorder, beside the
    command), and cost more than this (5x at 10^3 and 10^5 values, 300x at 10: bench/
    RESULTS.md, "The recorder's size on a fresh setup"). ValueError where a value is not a
    str (TypeError where it is not even hashable, a list), or there are more distinct values
    than the index type holds."""
    codes: dict = {None: -1}
    index = np.fromiter([codes.setdefault(value, len(codes) - 1) for value in values], np.int64, len(values))
    distinct = list(codes)[1:]
    limit = np.iinfo(type_.index_type.to_pandas_dtype()).max + 1
    if len(distinct) > limit:
        raise ValueError(f"{len(distinct)} distinct values, a category column holds at most {limit}")
    nulls = index < 0
    indices = numeric(np.where(nulls, 0, index), type_.index_type, nulls if nulls.any() else None)
    return pa.DictionaryArray.from_arrays(indices, strings(distinct))


def repeated(value, type_: pa.DataType, length: int) -> pa.Array:
    """`value` (a number or a str) `length` times, as `type_`."""
    if pa.types.is_string(type_):
        return strings([value] * length)
    if pa.types.is_dictionary(type_):
        return dictionary([value] * length, type_)
    return numeric(np.full(length, value), type_)


def to_numpy(array: pa.Array, null_as) -> np.ndarray:
    """The values of a primitive (integer or float) Arrow array as numpy, nulls as `null_as`;
    the indices for a dictionary array."""
    if pa.types.is_dictionary(array.type):
        array = array.indices
    dtype = np.dtype(array.type.to_pandas_dtype())
    validity, data = array.buffers()[:2]
    out = np.frombuffer(data, dtype, count=len(array), offset=array.offset * dtype.itemsize).copy()
    if array.null_count:
        bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
        out[bits[array.offset:array.offset + len(array)] == 0] = null_as
    return out


def sorted_by(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """`table`'s rows sorted by the integer columns `keys` (ascending, the first key first,
    ties kept in order), as `Table.sort_by` sorts them, without importing pyarrow.compute
    (~11 MB and ~20 ms of CPU in the recorder, beside the command; issue 24). The keys must
    hold no nulls; other column types than take_rows handles are left to `sort_by`."""
    if (not table.num_rows or not all(_takeable(field.type) for field in table.schema)
            or any(table.column(key).null_count for key in keys)):
        return table.sort_by([(key, "ascending") for key in keys])
    columns = [to_numpy(_one_array(table.column(key)), 0) for key in keys]
    return take_rows(table, _order(columns))


def _order(columns: list[np.ndarray]) -> np.ndarray:
    """The stable order of rows by `columns`, the first first. Where the second key never
    falls row by row (the writer's seq, in the order batches were appended), a stable sort
    of the first alone is that order, at half a lexsort's cost or less."""
    if len(columns) == 1 or bool(np.all(columns[1][1:] >= columns[1][:-1])):
        return np.argsort(columns[0], kind="stable")
    return np.lexsort(columns[::-1])


def take_rows(table: pa.Table, order: np.ndarray) -> pa.Table:
    """`table`'s rows at the indices `order` (a permutation or any in-range indices), as
    `Table.take` gives them, from buffers: fixed-width columns (integers, floats) and
    dictionary columns of them. Nulls stay nulls."""
    return pa.Table.from_arrays([_take(_one_array(column), order) for column in table.columns], schema=table.schema)


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (a slice keeps its offset), else the
    chunks combined into new buffers."""
    return column.chunks[0] if column.num_chunks == 1 else column.combine_chunks()


# Each fixed width's values moved as unsigned integers of that width: bits, not numbers.
_UNSIGNED = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}


def _takeable(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        return _takeable(type_.index_type)
    return (pa.types.is_integer(type_) or pa.types.is_floating(type_)) and type_.bit_width // 8 in _UNSIGNED


def _take(array: pa.Array, order: np.ndarray) -> pa.Array:
    if pa.types.is_dictionary(array.type):
        return pa.DictionaryArray.from_arrays(_take(array.indices, order), array.dictionary)
    width = array.type.bit_width // 8
    validity, data = array.buffers()[:2]
    rows = np.frombuffer(data, _UNSIGNED[width], count=len(array), offset=array.offset * width)
    nulls = None
    if array.null_count:
        bits = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")
        nulls = bits[array.offset:array.offset + len(array)][order] == 0
    buffers = [_validity(nulls), pa.py_buffer(np.ascontiguousarray(rows[order]))]
    return pa.Array.from_buffers(array.type, len(order), buffers, null_count=0 if nulls is None else int(nulls.sum()))


def _with_validity(type_: pa.DataType, values: np.ndarray, mask: np.ndarray | None) -> pa.Array:
    nulls = int(mask.sum()) if mask is not None else 0
    return pa.Array.from_buffers(type_, values.size, [_validity(mask), pa.py_buffer(values)], null_count=nulls)


def _validity(nulls: np.ndarray | None) -> pa.Buffer | None:
    """Arrow's validity bitmap (1 = valid, least significant bit first) for null mask `nulls`."""
    if nulls is None or not nulls.any():
        return None
    return pa.py_buffer(np.packbits(np.logical_not(nulls), bitorder="little"))

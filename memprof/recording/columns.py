"""Arrow parts → one pandas column each, filled in place: the final arrays are allocated once,
for every part's rows, and each part's Arrow data is dropped as soon as it is copied in. A
10^7-event recording then peaks at its pandas size plus one part, not at its Arrow size plus
its pandas size (bench/analysis_speed.py measures it).

Types, after the table's schema (memprof.model.schema):
- dictionary<int8 or int32, string> → pandas Categorical (categories in first-seen order,
  `known` first where given; a null is code -1). Codes are int16 while the categories fit,
  int32 past 32,767 of them (a run that marks every step with its own label);
- integers named nullable → pandas nullable Int64/Int32 (values and a mask);
- other integers and floats → numpy arrays (a float's nulls are NaN);
- strings → numpy object arrays (None for nulls).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_MASKED_TYPES = (pa.int64(), pa.int32())


class _Plain:
    """A numpy column (numbers with no nulls expected, floats with NaN, strings as objects)."""

    def __init__(self, type_: pa.DataType, rows: int):
        self.is_float = pa.types.is_floating(type_)
        self.values = np.empty(rows, dtype=object if pa.types.is_string(type_) else type_.to_pandas_dtype())

    def fill(self, at: int, column: pa.ChunkedArray) -> None:
        if self.is_float and column.null_count:
            column = pc.fill_null(column, np.nan)
        self.values[at:at + len(column)] = column.to_numpy()

    def finish(self):
        return self.values


class _Masked:
    """A nullable integer column: values (0 where null) and a mask."""

    def __init__(self, type_: pa.DataType, rows: int):
        self.values = np.zeros(rows, dtype=type_.to_pandas_dtype())
        self.mask = np.zeros(rows, dtype=bool)

    def fill(self, at: int, column: pa.ChunkedArray) -> None:
        end = at + len(column)
        if column.null_count:
            self.mask[at:end] = column.is_null().to_numpy()
            column = pc.fill_null(column, 0)
        self.values[at:end] = column.to_numpy()

    def finish(self):
        return pd.arrays.IntegerArray(self.values, self.mask)  # no copy of either


_INT16_CODES = np.iinfo(np.int16).max + 1  # categories int16 codes can name


class _Codes:
    """A dictionary column: int codes into categories gathered over all parts. The codes are
    int16 (half the memory of int32 at 10^7 rows) until a part brings the categories past
    32,768; then they are widened to int32 once, in place of the array."""

    def __init__(self, rows: int, known: Iterable[str] = ()):
        self.categories: list[str] = list(known)
        self.code_of = {value: code for code, value in enumerate(self.categories)}
        self.codes = np.full(rows, -1, dtype=np.int16)

    def fill(self, at: int, column: pa.ChunkedArray) -> None:
        for chunk in column.chunks:
            if not isinstance(chunk, pa.DictionaryArray):
                chunk = chunk.dictionary_encode()
            to_global = np.array([self._code(v) for v in chunk.dictionary.to_pylist()] + [-1], dtype=np.int64)
            self._fit(len(self.categories))
            indices = chunk.indices.fill_null(-1).to_numpy().astype(np.int64)  # -1 picks the trailing -1
            self.codes[at:at + len(chunk)] = to_global[indices]
            at += len(chunk)

    def _fit(self, categories: int) -> None:
        """Widen the codes to int32 when `categories` no longer fit int16 codes."""
        if categories > _INT16_CODES and self.codes.dtype == np.int16:
            self.codes = self.codes.astype(np.int32)

    def _code(self, value: str) -> int:
        if value not in self.code_of:
            self.code_of[value] = len(self.categories)
            self.categories.append(value)
        return self.code_of[value]

    def finish(self):
        return pd.Categorical.from_codes(self.codes, categories=self.categories, validate=False)


def column_filler(field: pa.Field, rows: int, *, nullable: bool, known: Iterable[str] = ()):
    """The filler for one schema field over `rows` rows: `fill(at, column)` copies a part's
    column in at row `at`; `finish()` returns the pandas-ready array."""
    if pa.types.is_dictionary(field.type):
        return _Codes(rows, known)
    if nullable and field.type in _MASKED_TYPES:
        return _Masked(field.type, rows)
    return _Plain(field.type, rows)

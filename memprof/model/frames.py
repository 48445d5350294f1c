"""pandas frames of the schema's tables (events, allocations): what more than one layer
does to them alike."""
from __future__ import annotations

import pandas as pd
from pandas.api.types import union_categoricals


def concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """`frames` (same columns) one after the other, categorical columns kept categorical
    (their categories united) instead of falling back to objects."""
    frames = [f for f in frames if len(f)] or frames[:1]
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    columns = {}
    for name in frames[0].columns:
        parts = [f[name] for f in frames]
        if all(isinstance(p.dtype, pd.CategoricalDtype) for p in parts):
            columns[name] = union_categoricals([_text_categories(p.array) for p in parts])
        else:
            columns[name] = pd.concat(parts, ignore_index=True).array
    return pd.DataFrame(columns, copy=False)


def _text_categories(values: pd.Categorical) -> pd.Categorical:
    """`values` with object categories: union_categoricals refuses to unite an empty frame's
    float categories (pandas gives an empty categorical float64 ones) with another's text."""
    if values.categories.dtype == object:
        return values
    return pd.Categorical.from_codes(values.codes, categories=values.categories.astype(object), validate=False)

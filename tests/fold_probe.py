"""A pytest plugin (`-p tests.fold_probe`) that folds every recording a test analyses:
memprof.api.analyse runs with max_memory=1 (no recording fits) and advice=True (the fold
keeps what the advice rules, the page and the summary read). Under it, every test of the
advice rules and of the page judges its recordings folded; test_fold.py runs them so. The
counts of folded analyses, and of those read whole though they had events, go to the file named by MEMPROF_FOLD_PROBE_OUT."""
from __future__ import annotations

import atexit
import json
import os
from collections import Counter

import memprof.api as api

_analyse = api.analyse
_counts: Counter = Counter()


def _folding(path=None, **options):
    options.update(max_memory=1, advice=True)
    analysed = _analyse(path, **options)
    if analysed.fold is not None:
        _counts["folded"] += 1
    elif len(analysed.events):  # a recording without events has nothing to fold
        _counts["whole"] += 1
    return analysed


def _write_counts() -> None:
    out = os.environ.get("MEMPROF_FOLD_PROBE_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(dict(_counts), f)


api.analyse = _folding
atexit.register(_write_counts)

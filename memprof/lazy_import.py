"""numpy and pyarrow imported at their first use, for `record`'s start-up (issue 24).

`record` imports the recorder before the command starts, and importing numpy and pyarrow
took ~80 ms of that (bench/RESULTS.md), on a 2-vCPU machine whose start-up is CPU-bound:
bcc's program loads and the maps' creation share the CPUs with it. Nothing before the
command's start needs either; the recorder's first poll, once the command runs, imports
them. A module on that path binds `np` and `pa` from here instead of importing them:

    from memprof.lazy_import import numpy as np

The first look-up of an attribute imports the module (an ordinary import: safe when two
threads do it first, and raising what the import raises) and keeps the attribute on the
stand-in, so later look-ups cost what a module attribute's does. Names used at import time
(a default argument, a module constant) would import it at once: such modules build those
at their first use (tests/unit/test_startup_imports.py and, for a whole start,
tests/integration/test_recorder_imports.py hold that `record`'s start imports neither).

Not importlib.util.LazyLoader: its module object sits in sys.modules, where any other
`import numpy` (pyarrow's own) loads it at once, and in Python 3.11 it is not safe when two
threads touch it first (CPython gh-114763, fixed in 2024), as the recorder's flush, symbol
and kallsyms threads may.
"""
from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands in for the module `name` until an attribute is looked up."""

    def __init__(self, name: str) -> None:
        self._module_name = name

    def __getattr__(self, attr: str) -> Any:
        # Called only for what the instance does not hold yet: once per attribute.
        if attr.startswith("__"):  # copy, pickle and the like probe dunders: never the module's
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._module_name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazily imported module {self._module_name!r}>"


numpy = LazyModule("numpy")
pyarrow = LazyModule("pyarrow")

"""numpy and pyarrow imported at their first use, so that `record` decides when (issue 24).

The recorder's modules bind `np` and `pa` from here instead of importing them:

    from memprof.lazy_import import numpy as np

so that importing the recorder imports neither, and the one place that imports them is
cli/record.py. It imports them before the command starts, on purpose: after the start
(tried: bench/RESULTS.md, 2026-12-05) the command reached its first instruction 80-170 ms
sooner, but the loads then held the GIL while the command began, the recorder's first RSS
sample came after a Python command's first 64 MiB, and the whole command was no shorter.

The first look-up of an attribute imports the module (an ordinary import: safe when two
threads do it first, and raising what the import raises) and keeps the attribute on the
stand-in, so later look-ups cost what a module attribute's does. Names used at import time
(a default argument, a module constant) would import it at once: such modules build those
at their first use (tests/unit/test_startup_imports.py holds that importing the recorder
imports neither).

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


# pyarrow's filesystems for remote storage: pyarrow.fs imports each it can, and leaves out
# one whose import fails, as in a pyarrow built without it.
_CLOUD_FILESYSTEMS = ("pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs", "pyarrow._hdfs")


def without_cloud_filesystems() -> None:
    """Keep pyarrow's S3, GCS, Azure and HDFS filesystems out of this process, for a process
    that reads and writes local files alone (`record`). pyarrow.parquet imports pyarrow.fs,
    which imports them all: S3's library alone is ~9 MB of the recorder's RSS (with OpenSSL),
    loaded at its first flush, beside the command. A None in sys.modules makes their import
    fail, and pyarrow.fs goes on without them; asking for one later raises ImportError.
    Does nothing once pyarrow.fs is imported (it has them already, or has left them out)."""
    import sys
    if "pyarrow.fs" in sys.modules:
        return
    for name in _CLOUD_FILESYSTEMS:
        sys.modules.setdefault(name, None)

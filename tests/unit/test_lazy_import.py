"""memprof/lazy_import.py: a module stand-in that imports its module at the first attribute
looked up, and only then."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from memprof.lazy_import import LazyModule


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_module_is_imported_at_the_first_attribute_and_not_before():
    out = _run("""
        import sys
        from memprof.lazy_import import numpy as np, pyarrow as pa
        before = "numpy" in sys.modules or "pyarrow" in sys.modules
        zeros = np.zeros(3)
        print(before, "numpy" in sys.modules, "pyarrow" in sys.modules, zeros.sum(), repr(pa))
    """)
    assert out == "False True False 0.0 <lazily imported module 'pyarrow'>"


def test_attributes_are_the_modules_own_and_kept():
    import json
    lazy = LazyModule("json")
    assert lazy.dumps is json.dumps and lazy.dumps({"a": 1}) == '{"a": 1}'
    assert "dumps" in vars(lazy)  # found on the stand-in from now: no second import look-up


def test_a_missing_attribute_or_module_raises_as_the_module_would():
    with pytest.raises(AttributeError):
        LazyModule("json").no_such_thing  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        LazyModule("memprof_no_such_module").anything  # noqa: B018


def test_dunders_never_import_the_module():
    """copy, pickle and friends probe dunders such as __deepcopy__ or __reduce_ex__ on objects
    they meet: those are the stand-in's, never a reason to import numpy."""
    lazy = LazyModule("memprof_no_such_module")
    assert not hasattr(lazy, "__deepcopy__") and not hasattr(lazy, "__array__")

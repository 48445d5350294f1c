"""The bench scripts as modules, for the tests of their logic (bench/ is no package: its
scripts run as `python bench/NAME.py`, as root, and import their siblings by path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """bench/`name`.py, executed as a module of its own (named bench_`name`)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

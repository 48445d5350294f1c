"""The benchmarks and scripts import memprof's names inside functions (they run as root, on
demand, never in CI): a name memprof moves or renames would only fail when someone next
runs the tool. Every `from memprof… import name` in bench/ and scripts/ must resolve."""
from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("scripts/*.py")])


def memprof_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from memprof… import name` in `path`, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "memprof"
            for alias in node.names]


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_memprof_name_a_tool_imports_exists(path):
    missing = [f"{module}.{name}" for module, name in memprof_imports(path)
               if not hasattr(importlib.import_module(module), name)
               and importlib.util.find_spec(f"{module}.{name}") is None]
    assert missing == [], f"{path.relative_to(ROOT)} imports names memprof does not have: {missing}"


def test_the_tools_are_found():
    assert any(p.name == "train_overhead.py" for p in TOOLS) and any(p.name == "free_visibility.py" for p in TOOLS)

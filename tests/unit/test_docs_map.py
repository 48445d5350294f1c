"""docs/ARCHITECTURE.md and docs/SECURITY.md stay true to the tree: every file they name
exists, and every module of memprof/sources/ has its place on the map."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ("docs/ARCHITECTURE.md", "docs/SECURITY.md")


def _named_paths(text: str) -> list[str]:
    return re.findall(r"`((?:memprof|cli|bpf|bench|scripts|tests|examples|docs)/[\w./-]+\.(?:py|md|sh|c|h))`", text)


@pytest.mark.parametrize("doc", DOCS)
def test_every_file_a_doc_names_exists(doc):
    named = _named_paths((REPO / doc).read_text())
    assert named
    assert [path for path in named if not (REPO / path).exists()] == []


def test_every_source_module_is_on_the_map():
    text = (REPO / "docs/ARCHITECTURE.md").read_text()
    sources = REPO / "memprof/sources"
    modules = sorted(str(p.relative_to(sources)) for p in sources.rglob("*.py") if p.name != "__init__.py")
    assert [name for name in modules if f"`{name}`" not in text] == []


def test_sources_is_split_by_subsystem():
    """Issue 20: memprof/sources/ holds subpackages, one per subsystem, not a flat room."""
    sources = REPO / "memprof/sources"
    packages = sorted(p.parent.name for p in sources.glob("*/__init__.py"))
    assert packages == ["agent_reader", "cpython", "ebpf", "symbols", "torch_import"]
    assert sorted(p.name for p in sources.glob("*.py")) == ["__init__.py", "samplers.py"]

"""The README a clone gets (issue 20, points 3 and 15): it points only at files the clone
has, and its first lines say how to run memprof after `make demo`."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_no_pointer_outside_the_repository():
    assert "../" not in README, [line for line in README.splitlines() if "../" in line]


def test_every_file_the_readme_names_exists():
    """Markdown links and `backticked` paths to files of the repository (docs/SECURITY.md,
    bpf/README.md, scripts/setup.sh, …)."""
    linked = re.findall(r"\]\(([^)#:]+)\)", README)
    named = re.findall(r"`((?:docs|bpf|bench|scripts|examples|memprof|cli|tests)/[\w./-]+\.(?:md|py|sh|c))`", README)
    assert linked and named
    missing = [path for path in linked + named if not (REPO / path).exists()]
    assert not missing


def test_the_first_lines_say_how_to_run_memprof_after_make_demo():
    """Before "## Using it": `make demo` puts memprof in .venv (.venv/bin/memprof), and
    `make install` puts it on root's PATH (and sudo's), as the usage examples need."""
    top = README.split("\n## Using it\n", 1)[0]
    assert ".venv/bin/memprof" in top
    assert "make install" in top and "/usr/local/bin/memprof" in top and "secure_path" in top
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^install:", makefile, re.M) and "scripts/install.sh" in makefile

"""memprof's own environment tuning (memprof/own_env.py) stays memprof's: a command it runs
gets the environment memprof was given. Checked on a real `record -- sh -c env` as well."""
from __future__ import annotations

import subprocess
import sys

from memprof import own_env


def test_apply_sets_only_what_is_unset_and_commands_get_neither(monkeypatch):
    monkeypatch.setattr(own_env, "_set_here", set())
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")  # the user's own: theirs to keep
    own_env.apply()
    import os
    assert os.environ["NUMPY_MADVISE_HUGEPAGE"] == "0" and os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    child = own_env.for_commands(os.environ)
    assert "NUMPY_MADVISE_HUGEPAGE" not in child and child["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    assert child["PATH"] == os.environ["PATH"]


def _in_a_fresh_memprof(code: str) -> str:
    """What `code` prints, run after memprof's CLI is imported in a fresh interpreter whose
    environment has none of memprof's settings."""
    script = "import os, sys; sys.argv = ['memprof', '--version']\nimport memprof.cli.main\n" + code
    env = {k: v for k, v in __import__("os").environ.items() if k not in own_env.SETTINGS}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_fresh_memprof_process_keeps_its_tuning_out_of_a_child():
    assert _in_a_fresh_memprof("from memprof import own_env\n"
                               "assert os.environ['ARROW_DEFAULT_MEMORY_POOL'] == 'system'\n"
                               "print(sorted(set(own_env.SETTINGS) & set(own_env.for_commands(os.environ))))") == "[]"


def test_memprof_imports_numpy_without_openblas_threads():
    """OpenBLAS's worker threads spin after numpy's import, on the CPU the recorded command
    would use next: memprof's own process has none (own_env.SETTINGS), its commands keep the
    user's setting (the test above)."""
    assert _in_a_fresh_memprof("import numpy\nprint(len(os.listdir('/proc/self/task')))") == "1"


def test_undo_takes_back_only_what_apply_set(monkeypatch):
    import os
    monkeypatch.setattr(own_env, "_set_here", set())
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")  # the user's own: theirs to keep
    own_env.apply()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    own_env.undo()
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["NUMPY_MADVISE_HUGEPAGE"] == "1"
    assert own_env.for_commands(os.environ)["NUMPY_MADVISE_HUGEPAGE"] == "1"

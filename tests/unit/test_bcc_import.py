"""bcc's Python with libbcc's libbpf part only, until something compiles
(memprof/sources/ebpf/bcc_import.py). Each case runs in a fresh interpreter: what matters is
which libraries the process has mapped after importing bcc the way memprof does."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("bcc")

MAPPED = textwrap.dedent("""
    import json, re
    def mapped():
        with open("/proc/self/maps") as maps:
            return sorted({m.group(1) for m in re.finditer(r"/(lib(?:LLVM|bcc|bcc_bpf)[-.0-9]*\\.so)", maps.read())})
""")


def _run(body: str) -> dict:
    """Run `body` (which sets `out`, a dict) after MAPPED in a fresh interpreter; `out` as JSON."""
    code = MAPPED + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_bcc_through_memprof_maps_no_compiler():
    out = _run("""
        import memprof.sources.ebpf
        from bcc import BPF, libbcc
        out = {"mapped": mapped(), "lib": type(libbcc.lib).__name__}
    """)
    assert out == {"mapped": ["libbcc_bpf.so"], "lib": "LazyLibbcc"}


def test_a_function_only_the_whole_libbcc_has_loads_it_at_its_first_call():
    out = _run("""
        import memprof.sources.ebpf
        from bcc import libbcc
        before = mapped()
        engine = libbcc.lib.bpf_module_rw_engine_enabled()  # bcc declared restype c_bool
        out = {"before": before, "after": mapped(), "engine": engine, "loaded": libbcc.lib.whole_loaded}
    """)
    assert out["before"] == ["libbcc_bpf.so"]
    assert "libbcc.so" in out["after"] and any(name.startswith("libLLVM") for name in out["after"])
    assert isinstance(out["engine"], bool) and out["loaded"] is True


def test_the_table_queries_of_a_null_module_are_answered_as_libbcc_answers_them():
    """bcc's TableBase asks them of a CachedBPF's module (None): -1, -1 and 0 (bcc_common.cc),
    without the compiler; the whole library then gives the same answers."""
    out = _run("""
        import memprof.sources.ebpf
        from bcc import libbcc
        lazy = [libbcc.lib.bpf_table_type_id(None, 3), libbcc.lib.bpf_table_flags_id(None, 3),
                libbcc.lib.bpf_table_max_entries_id(None, 3)]
        mapped_then = mapped()
        whole = libbcc.lib.whole()
        for name, restype in (("bpf_table_type_id", "c_int"), ("bpf_table_flags_id", "c_int"),
                              ("bpf_table_max_entries_id", "c_ulonglong")):
            import ctypes
            getattr(whole, name).restype = getattr(ctypes, restype)
            getattr(whole, name).argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        out = {"lazy": lazy, "mapped": mapped_then, "whole": [whole.bpf_table_type_id(None, 3),
               whole.bpf_table_flags_id(None, 3), whole.bpf_table_max_entries_id(None, 3)]}
    """)
    assert out["lazy"] == [-1, -1, 0] == out["whole"]
    assert out["mapped"] == ["libbcc_bpf.so"]


def test_the_libbcc_path_is_the_same_before_and_after_the_whole_library_loads():
    """compiled_cache's key names libbcc.so.0's file: a warm start (libbcc_bpf only) and a cold
    one (the whole library mapped) must name the same file, or no entry would ever be found."""
    out = _run("""
        import memprof.sources.ebpf
        from memprof.sources.ebpf import bcc_import
        from bcc import libbcc
        before = bcc_import.libbcc_path()
        libbcc.lib.whole()
        out = {"before": before, "after": bcc_import.libbcc_path()}
    """)
    assert out["before"] == out["after"] and "/libbcc.so" in out["after"]


def test_without_libbcc_bpf_bcc_loads_the_whole_library_as_it_always_did():
    out = _run("""
        from memprof.sources.ebpf import bcc_import
        bcc_import.BPF_PART = "libmemprof-test-absent.so.0"
        from bcc import libbcc
        out = {"mapped": mapped(), "lib": type(libbcc.lib).__name__}
    """)
    assert out["lib"] == "CDLL" and "libbcc.so" in out["mapped"]


def test_bcc_imported_before_memprof_is_left_as_it_is():
    out = _run("""
        import bcc
        import memprof.sources.ebpf
        from bcc import libbcc
        out = {"lib": type(libbcc.lib).__name__}
    """)
    assert out["lib"] == "CDLL"

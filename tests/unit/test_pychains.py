"""The user-space half of Python frames: merging Python frames into native chains, decoding
what BPF copied (str code units, cut line tables), and reports' `--native-frames`."""
from __future__ import annotations

import glob
import os
import random
import subprocess
import sys

import pandas as pd
import pytest

from memprof.analysis.leaks import chain_frames
from memprof.sources.cpython import lines as pylines
from memprof.sources.cpython.interp import runtime_file
from memprof.sources.cpython.frames import PyFrame, decode_lines, decode_str, merge_chain, python_runtimes
from memprof.sources.symbols.symbolize import Mapping

EVAL = "_PyEval_EvalFrameDefault"


def py(name: str, entry: bool = False) -> PyFrame:
    return PyFrame(name, "app.py", 1, entry)


def test_each_eval_frame_is_preceded_by_the_python_frames_it_ran():
    # Innermost first: malloc called from C called by the eval loop running f (called by g,
    # same eval call, g its entry frame), which was called from a C extension calling back
    # into a second eval call running h (entry).
    native = ["malloc", "ext_call", EVAL, "ext_callback", EVAL, "main"]
    python = [py("f"), py("g", entry=True), py("h", entry=True)]
    merged = merge_chain(native, python, lambda f: f == EVAL)
    assert merged == ["malloc", "ext_call", py("f"), py("g", True), EVAL, "ext_callback", py("h", True), EVAL, "main"]


def test_python_frames_left_over_go_after_a_native_stack_that_ended_early():
    # libtorch has no frame pointers: the native stack stops before reaching the eval loop.
    merged = merge_chain(["alloc_cpu", "empty_cpu"], [py("step", True), py("main", True)], lambda f: f == EVAL)
    assert merged == ["alloc_cpu", "empty_cpu", py("step", True), py("main", True)]


def test_without_python_frames_the_native_chain_is_unchanged():
    assert merge_chain(["a", EVAL, "b"], [], lambda f: f == EVAL) == ["a", EVAL, "b"]


def _merge_one_by_one(native, python, is_eval, entry):
    """merge_chain's rule, one frame at a time: the reference for its run-at-a-time copy."""
    out, i = [], 0
    for frame in native:
        if is_eval(frame) and i < len(python):
            while i < len(python):
                out.append(python[i])
                i += 1
                if entry(python[i - 1]):
                    break
        out.append(frame)
    return out + python[i:]


@pytest.mark.parametrize("seed", range(3))
def test_merging_a_run_at_a_time_is_merging_one_by_one(seed):
    rnd = random.Random(seed)
    for _ in range(2000):
        native = [rnd.choice(["c", "d", EVAL]) for _ in range(rnd.randint(0, 12))]
        python = [py(f"p{k}", entry=rnd.random() < 0.3) for k in range(rnd.randint(0, 12))]
        is_eval = EVAL.__eq__
        assert merge_chain(native, python, is_eval) == _merge_one_by_one(native, python, is_eval, lambda f: f.entry)


@pytest.mark.parametrize("text", ["train.py", "modèle.py", "模型.py", "emoji😀.py"])
def test_str_code_units_of_each_kind_decode(text):
    kind = max(1 if ord(c) < 256 else 2 if ord(c) < 65536 else 4 for c in text)
    raw = text.encode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])
    state = (kind << 2) | (1 << 5) | ((1 << 6) if text.isascii() else 0)
    assert decode_str(raw, len(text), state, 0) == text


def test_a_cut_str_says_so_at_the_end_it_lost():
    path = "/very/long/" + "x" * 300 + "/train.py"
    raw = path.encode()[-256:]
    state = (1 << 2) | (1 << 5) | (1 << 6)
    tail = decode_str(raw, len(path), state, len(path) - 256)
    assert tail.startswith("…") and tail.endswith("/train.py") and len(tail) == 257
    head = decode_str(path.encode()[:128], len(path), state, 0)
    assert head.endswith("…") and head.startswith("/very/long/")


def test_a_legacy_or_unknown_str_decodes_to_nothing():
    assert decode_str(b"abc", 3, 0, 0) == ""  # not compact


def _interpreter(version: tuple[int, int]) -> str:
    if sys.version_info[:2] == version:
        return sys.executable
    found = sorted(glob.glob(f"/root/.pyenv/versions/3.{version[1]}.*/bin/python3.{version[1]}"))
    if not found:
        pytest.skip(f"no CPython 3.{version[1]} on this machine (pyenv)")
    return found[-1]


@pytest.mark.parametrize("version", [(3, 10), (3, 11), (3, 12), (3, 13)])
def test_a_cut_line_table_still_gives_the_first_lines(version):
    exe = _interpreter(version)
    source = "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(2000))
    out = subprocess.run([exe, "-c", f"src = {source!r}\nns = {{}}\nexec(src, ns)\nc = ns['f'].__code__\n"
                          "print(c.co_linetable.hex()); print(c.co_firstlineno)"],
                         capture_output=True, text=True, check=True).stdout.split()
    table, first = bytes.fromhex(out[0]), int(out[1])
    assert len(table) > 300
    full = pylines.lines_table(version, table, first)
    cut = decode_lines(version, table[:300], first, cut=True)
    assert cut and cut[-1][1] <= full[-1][1]
    for start, end, line in cut[:-1]:
        assert pylines.line_at(full, start) == line


def _stacks_frames(chain):
    frames = pd.DataFrame([(i, *f) for i, f in enumerate(chain)],
                          columns=["frame_id", "kind", "function", "module", "file", "line"])
    stacks = pd.DataFrame({"stack_id": [7] * len(chain), "depth": range(len(chain)), "frame_id": range(len(chain))})
    return stacks, frames


def test_reports_drop_eval_loop_frames_only_where_the_python_frames_are_there():
    chain = [("native", "malloc", "libc.so.6", None, None), ("python", "step", None, "train.py", 3),
             ("native", EVAL, "python3.11", None, None), ("native", "main", "python3.11", None, None)]
    stacks, frames = _stacks_frames(chain)
    merged = [f["function"] for f in chain_frames(stacks, frames, [7])[7]]
    assert merged == ["malloc", "step", "main"]
    everything = [f["function"] for f in chain_frames(stacks, frames, [7], native_frames="all")[7]]
    assert everything == ["malloc", "step", EVAL, "main"]
    native_only = [c for c in chain if c[0] != "python"]
    stacks, frames = _stacks_frames(native_only)
    assert [f["function"] for f in chain_frames(stacks, frames, [7])[7]] == ["malloc", EVAL, "main"]
    with pytest.raises(ValueError):
        chain_frames(stacks, frames, [7], native_frames="some")


def test_python_runtimes_of_a_command_a_script_and_a_process(tmp_path):
    """What the recorder reads symbols of ahead: the runtime of the Python a command runs
    (itself or a script's #! interpreter) and of a process's mapped interpreter; nothing for
    a command that is not Python."""
    ours = runtime_file(os.path.realpath(sys.executable))
    script = tmp_path / "job.py"
    script.write_text(f"#!{sys.executable}\nprint()\n")
    assert python_runtimes(sys.executable) == [ours]
    assert python_runtimes(str(script)) == [ours]
    assert python_runtimes("/bin/sh") == []
    mapped = [Mapping(0x1000, 0x2000, 0, "/opt/py/lib/libpython3.12.so.1.0", False),
              Mapping(0x3000, 0x4000, 0, "/opt/py/bin/python3.12", False)]
    assert python_runtimes(None, [mapped, []]) == ["/opt/py/lib/libpython3.12.so.1.0"]

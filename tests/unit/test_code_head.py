"""py_conf.code_read: the one read of a code object's head that bpf/python.bpf.c's learning
makes must cover every field it compares, at the alignment its masks assume, and stay below
the scratch it reads into."""
import re
from pathlib import Path

import pytest

from memprof.sources.cpython.frames import CODE_HEAD_FIELDS, code_head_bytes
from memprof.sources.cpython.offsets_table import OFFSETS

BPF_SOURCE = Path(__file__).resolve().parents[2] / "bpf" / "python.bpf.c"


def _c_define(name: str) -> int:
    return int(re.search(rf"#define {name}\s+(\d+)", BPF_SOURCE.read_text()).group(1))


@pytest.mark.parametrize("version", sorted(OFFSETS))
def test_the_head_read_covers_every_compared_field_and_fits_the_scratch(version):
    offsets = OFFSETS[version]
    read = code_head_bytes(offsets)
    assert read < _c_define("PY_CODE_HEAD_MAX")  # the C masks the size with PY_CODE_HEAD_MAX - 1
    assert read >= 16  # ob_type, at 8
    for name in CODE_HEAD_FIELDS:
        if offsets[name] < 0:
            continue
        width = 4 if name == "code_firstlineno" else 8
        assert offsets[name] + width <= read, name
        assert offsets[name] % width == 0, name  # the C reads them at (offset & ~(width - 1))


def test_absent_fields_do_not_count():
    offsets = {name: -1 for name in CODE_HEAD_FIELDS}
    assert code_head_bytes(offsets) == 16
    offsets["code_linetable"] = 136
    assert code_head_bytes(offsets) == 144


def test_a_walk_and_its_learning_fit_the_kernels_tail_call_limit():
    """An allocation program enters the walk by tail call, the walk's runs (the thread-state
    search's, then the frames') and the learning's runs follow each other by tail call, and
    the walk's last run enters the learning: the kernel stops a chain at 33 tail calls
    (MAX_TAIL_CALL_CNT), and an event would then go with a cut stack or unnamed frames."""
    from memprof.sources.cpython.options import PythonOptions
    max_frames = PythonOptions().max_frames
    walk_runs, learn_runs = _c_define("PY_WALK_RUNS"), _c_define("PY_LEARN_RUNS")
    search_runs = _c_define("PY_MAX_THREADS") // _c_define("PY_THREADS_PER_RUN")
    walk_per_run, learn_per_run = -(-max_frames // walk_runs), -(-max_frames // learn_runs)  # the C's *_PER_RUN
    tail_calls = 1 + (search_runs + walk_runs - 1) + 1 + (learn_runs - 1)
    assert tail_calls <= 33, tail_calls
    # the verifier checks one run's copies: the point of the chains
    assert walk_per_run <= 16 and learn_per_run <= 8 and _c_define("PY_THREADS_PER_RUN") <= 64

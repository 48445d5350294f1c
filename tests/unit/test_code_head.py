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


def test_a_learning_chain_of_runs_fits_the_kernels_tail_call_limit():
    """Learning a stack of the default 64 frames takes ceil(64 / PY_LEARN_PER_RUN) runs, each
    after the first a tail call, and the allocation program's call into the first is one
    more: the kernel stops a chain at 33 (MAX_TAIL_CALL_CNT), and the later frames would stay
    unnamed."""
    from memprof.sources.cpython.frames import PythonOptions
    runs_cap = _c_define("PY_LEARN_RUNS")
    max_frames = PythonOptions().max_frames
    per_run = -(-max_frames // runs_cap)  # the C's PY_LEARN_PER_RUN
    assert 1 + -(-max_frames // per_run) <= 33
    assert per_run <= 8  # the verifier checks per_run copies of the learning: the point of the chain

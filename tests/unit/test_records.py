"""The numpy view of struct mp_event must match bpf/memprof.h byte for byte."""
import re
from pathlib import Path

from memprof.sources.ebpf import records as R

HEADER = (Path(__file__).resolve().parents[2] / "bpf" / "memprof.h").read_text()
_SIZES = {"__u64": 8, "__s64": 8, "__u32": 4, "__s32": 4, "__u16": 2, "__u8": 1, "__s8": 1}


def _c_fields():
    body = re.search(r"struct mp_event \{(.*?)\};", HEADER, re.S).group(1)
    fields = []
    for ctype, name, count in re.findall(r"(__[us]\d+)\s+(\w+)(?:\[(\d+)\])?;", body):
        fields.append((name, _SIZES[ctype] * int(count or 1)))
    return fields


def test_field_names_offsets_and_sizes_match_the_c_struct():
    offset = 0
    for name, size in _c_fields():
        assert name in R.EVENT_DTYPE.names, name
        assert R.EVENT_DTYPE.fields[name][1] == offset, name
        assert R.EVENT_DTYPE.fields[name][0].itemsize == size, name
        offset += size
    assert R.EVENT_DTYPE.itemsize == offset == 72


def test_kind_codes_match_the_c_defines():
    defines = dict(re.findall(r"#define (MP_\w+)\s+(\d+)", HEADER))
    assert int(defines["MP_SLAB_ALLOC"]) == R.SLAB_ALLOC
    assert int(defines["MP_SLAB_FREE"]) == R.SLAB_FREE
    assert int(defines["MP_PAGE_ALLOC"]) == R.PAGE_ALLOC
    assert int(defines["MP_PAGE_FREE"]) == R.PAGE_FREE
    assert int(defines["MP_PROC_FORK"]) == R.PROC_FORK
    assert int(defines["MP_PROC_EXEC"]) == R.PROC_EXEC
    assert int(defines["MP_PROC_EXIT"]) == R.PROC_EXIT
    assert int(defines["MP_EXIT_MARK"]) == R.EXIT_MARK
    counters = {name: value for name, value in vars(R).items() if name.startswith("CNT_")}
    for name, value in counters.items():
        assert int(defines[f"MP_{name}"]) == value, name
    assert int(defines["MP_N_COUNTERS"]) == max(counters.values()) + 1
    for i, tp in enumerate(R.FREE_TRACEPOINTS):
        assert int(defines[f"MP_TP_{tp.upper().removeprefix('MM_')}"]) == i


def test_an_exec_record_names_the_new_program_from_its_comm_bytes():
    """sched_process_exec writes the task's comm, 16 bytes NUL-padded, over call_site and
    size (bpf/memprof.bpf.c): contiguous in the record, read back in order."""
    import numpy as np
    record = np.zeros(1, dtype=R.EVENT_DTYPE)[0]
    assert R.EVENT_DTYPE.fields["size"][1] == R.EVENT_DTYPE.fields["call_site"][1] + 8
    raw = np.frombuffer(b"cc1plus".ljust(16, b"\0"), dtype="<u8")
    record["call_site"], record["size"] = raw[0], raw[1]
    assert R.exec_comm(record) == "cc1plus"
    raw = np.frombuffer(b"pt_data_worker\xff\0", dtype="<u8")  # 15 bytes: the longest comm
    record["call_site"], record["size"] = raw[0], raw[1]
    assert R.exec_comm(record) == "pt_data_worker\\xff"

"""How the Python frames are read (`record`'s options for them) and the BPF side's -D
constants: apart from frames.py, which imports numpy and the symbolizer, so that `record`
can build its options and begin bcc's compile before those imports (sources/ebpf/early.py)."""
from __future__ import annotations

from dataclasses import dataclass

INIT_SLOTS = 4           # PY_INIT_SLOTS: runtime files registered at interpreter start


@dataclass
class PythonOptions:
    """`enabled`: read Python frames in BPF. Depth is bounded by `max_frames` (power of two);
    the maps hold `stack_entries` distinct stacks and `code_entries` code objects."""

    enabled: bool = True
    max_frames: int = 64
    stack_entries: int = 32768   # x 776 bytes, preallocated
    code_entries: int = 8192     # x 2.5 KiB, preallocated


def python_cflags(options: PythonOptions) -> list[str]:
    """-D constants of bpf/python.bpf.c (the thread pointer's place in task_struct from BTF)."""
    from memprof.sources.ebpf.btf_answers import kernel_btf
    btf = kernel_btf()
    fsbase = btf.member_offset("task_struct", "thread") + btf.member_offset("thread_struct", "fsbase")
    if options.max_frames & (options.max_frames - 1):
        raise ValueError("max_frames must be a power of two")
    return [f"-DPY_MAX_FRAMES={options.max_frames}", f"-DPY_STACK_ENTRIES={options.stack_entries}",
            f"-DPY_CODE_ENTRIES={options.code_entries}", f"-DTASK_FSBASE_OFF={fsbase}",
            f"-DPY_INIT_SLOTS={INIT_SLOTS}"]


def tail_called_programs() -> tuple[tuple[str, str, int], ...]:
    """(prog array, program, bcc program type) of the Python walk's and code learning's
    programs, which the allocation programs enter by tail call (bpf/python.bpf.c's
    emit_alloc), one of each per calling program type. PythonFrames.install loads them;
    sources/ebpf/early.py loads them ahead."""
    from bcc import BPF
    return (("py_walk_tp", "mp_py_walk_tp", BPF.RAW_TRACEPOINT), ("py_walk_up", "mp_py_walk_up", BPF.KPROBE),
            ("py_learn_tp", "mp_py_learn_tp", BPF.RAW_TRACEPOINT), ("py_learn_up", "mp_py_learn_up", BPF.KPROBE))

"""Kernel-side statistics of loaded BPF programs (bpf(BPF_OBJ_GET_INFO_BY_FD)).

`recursion_misses` counts the times the kernel skipped a program because it was already
running on that CPU — e.g. a kfree in an RCU softirq that interrupted our kmalloc handler
(bcc issue #2997). Those are events we never saw; reports must show them."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

_SYS_BPF = 321  # x86-64
_BPF_OBJ_GET_INFO_BY_FD = 15

# Offsets in struct bpf_prog_info (include/uapi/linux/bpf.h); the struct only ever grows,
# and the kernel fills as much as info_len asks for.
_INFO_LEN = 232
_RUN_TIME_NS = 192
_RUN_CNT = 200
_RECURSION_MISSES = 208

_libc = ctypes.CDLL(None, use_errno=True)


class _GetInfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


@dataclass(frozen=True)
class ProgStats:
    """run_time_ns and run_cnt are 0 unless kernel.bpf_stats_enabled is 1."""

    run_time_ns: int
    run_cnt: int
    recursion_misses: int


def prog_stats(prog_fd: int) -> ProgStats:
    """Statistics of the program behind `prog_fd`. Raises OSError."""
    buf = ctypes.create_string_buffer(_INFO_LEN)
    attr = _GetInfoAttr(prog_fd, _INFO_LEN, ctypes.addressof(buf))
    if _libc.syscall(_SYS_BPF, _BPF_OBJ_GET_INFO_BY_FD, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    raw = buf.raw
    return ProgStats(
        run_time_ns=int.from_bytes(raw[_RUN_TIME_NS:_RUN_TIME_NS + 8], "little"),
        run_cnt=int.from_bytes(raw[_RUN_CNT:_RUN_CNT + 8], "little"),
        recursion_misses=int.from_bytes(raw[_RECURSION_MISSES:_RECURSION_MISSES + 8], "little"),
    )

"""Kernel-side statistics of loaded BPF programs (bpf(BPF_OBJ_GET_INFO_BY_FD)), and what the
kernel says of a map and a BTF object (compiled_cache.py keeps them).

`recursion_misses` counts the times the kernel skipped a program because it was already
running on that CPU — e.g. a kfree in an RCU softirq that interrupted our kmalloc handler
(bcc issue #2997). Those are events we never saw; reports must show them."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

_SYS_BPF = 321  # x86-64
_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_BTF_GET_FD_BY_ID = 19

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
    _object_info(prog_fd, buf)
    raw = buf.raw
    return ProgStats(
        run_time_ns=int.from_bytes(raw[_RUN_TIME_NS:_RUN_TIME_NS + 8], "little"),
        run_cnt=int.from_bytes(raw[_RUN_CNT:_RUN_CNT + 8], "little"),
        recursion_misses=int.from_bytes(raw[_RECURSION_MISSES:_RECURSION_MISSES + 8], "little"),
    )


def _object_info(fd: int, info) -> None:
    """Fill `info` (a ctypes buffer or structure) with what the kernel says of the BPF object
    behind `fd` (bpf(BPF_OBJ_GET_INFO_BY_FD)), as much as its size asks for. Raises OSError."""
    bpf_call(_BPF_OBJ_GET_INFO_BY_FD, _GetInfoAttr(fd, ctypes.sizeof(info), ctypes.addressof(info)))


def bpf_call(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(cmd, &attr, sizeof attr): its result (a new fd for the commands that make one).
    Raises OSError with the kernel's errno."""
    result = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


class MapInfo(ctypes.Structure):  # struct bpf_map_info (the fields up to map_extra)
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32),
                ("btf_vmlinux_value_type_id", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("btf_id", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("_pad", ctypes.c_uint32), ("map_extra", ctypes.c_uint64)]


class _BtfInfo(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_size", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("name", ctypes.c_uint64), ("name_len", ctypes.c_uint32), ("kernel_btf", ctypes.c_uint32)]


def map_info(fd: int) -> MapInfo:
    """The kernel's description of the map behind `fd`. Raises OSError."""
    info = MapInfo()
    _object_info(fd, info)
    return info


def btf_raw(btf_id: int) -> bytes:
    """The BTF object `btf_id` as the kernel holds it (what BPF_BTF_LOAD takes back).
    Raises OSError."""
    fd = bpf_call(_BPF_BTF_GET_FD_BY_ID, ctypes.c_uint32(btf_id))
    try:
        info = _BtfInfo()
        _object_info(fd, info)  # its size first
        raw = ctypes.create_string_buffer(info.btf_size)
        info = _BtfInfo(btf=ctypes.addressof(raw), btf_size=info.btf_size)
        _object_info(fd, info)
        return raw.raw[:info.btf_size]
    finally:
        os.close(fd)

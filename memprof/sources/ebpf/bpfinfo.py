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
    info = _counts(prog_fd)
    return ProgStats(run_time_ns=info.run_time_ns, run_cnt=info.run_cnt, recursion_misses=info.recursion_misses)


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


# -- every loaded program's code, as kallsyms names it ------------------------------------

_BPF_PROG_GET_NEXT_ID = 11
_BPF_PROG_GET_FD_BY_ID = 13
# Program types whose attachment makes code kallsyms names and no program's info does: the
# trampolines of fentry/fexit/fmod_ret (TRACING), freplace (EXT), LSM and struct_ops.
TRAMPOLINE_PROGRAM_TYPES = frozenset({26, 27, 28, 29})


class ProgInfo(ctypes.Structure):  # struct bpf_prog_info, up to recursion_misses (include/uapi/linux/bpf.h)
    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
                ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32),
                ("nr_map_ids", ctypes.c_uint32), ("map_ids", ctypes.c_uint64), ("name", ctypes.c_char * 16),
                ("ifindex", ctypes.c_uint32), ("gpl_compatible", ctypes.c_uint32), ("netns_dev", ctypes.c_uint64),
                ("netns_ino", ctypes.c_uint64), ("nr_jited_ksyms", ctypes.c_uint32),
                ("nr_jited_func_lens", ctypes.c_uint32), ("jited_ksyms", ctypes.c_uint64),
                ("jited_func_lens", ctypes.c_uint64), ("btf_id", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32), ("func_info", ctypes.c_uint64),
                ("nr_func_info", ctypes.c_uint32), ("nr_line_info", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
                ("jited_line_info", ctypes.c_uint64), ("nr_jited_line_info", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32), ("jited_line_info_rec_size", ctypes.c_uint32),
                ("nr_prog_tags", ctypes.c_uint32), ("prog_tags", ctypes.c_uint64), ("run_time_ns", ctypes.c_uint64),
                ("run_cnt", ctypes.c_uint64), ("recursion_misses", ctypes.c_uint64)]


class _IdAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


def loaded_program_ids() -> list[int]:
    """The ids of every BPF program loaded in the kernel now (bpf(BPF_PROG_GET_NEXT_ID))."""
    ids, attr = [], _IdAttr(0, 0, 0)
    while True:
        try:
            bpf_call(_BPF_PROG_GET_NEXT_ID, attr)
        except FileNotFoundError:  # ENOENT: no program after this id
            return ids
        ids.append(attr.next_id)
        attr.id = attr.next_id


def program_symbols() -> list[tuple[int, str]] | None:
    """(start address, kallsyms name) of every loaded BPF program's functions, as kallsyms
    names them: "bpf_prog_" + the function's tag in hex + "_" + its name in the program's
    BTF where it has one (bcc's compile), else the program's name as the kernel keeps it
    (15 characters at most). None where a loaded program's type makes trampolines, which
    only kallsyms names, or where the kernel hides the addresses or a name cannot be read.
    A program unloaded meanwhile is left out. Raises OSError (no privilege for bpf())."""
    symbols, btfs = [], {}
    for prog_id in loaded_program_ids():
        fd = _open_program(prog_id)
        if fd is None:
            continue
        try:
            found = _symbols_of(fd, btfs)
        finally:
            os.close(fd)
        if found is None:
            return None
        symbols.extend(found)
    return symbols


def program_info(prog_id: int) -> ProgInfo | None:
    """What the kernel says of program `prog_id` (its counts, not its arrays); None where it
    was unloaded meanwhile. Raises OSError."""
    fd = _open_program(prog_id)
    if fd is None:
        return None
    try:
        return _counts(fd)
    finally:
        os.close(fd)


def _counts(prog_fd: int) -> ProgInfo:
    """What the kernel says of the program behind `prog_fd`, without its arrays (their counts
    only). Raises OSError."""
    info = ProgInfo()
    _object_info(prog_fd, info)
    return info


def _open_program(prog_id: int) -> int | None:
    try:
        return bpf_call(_BPF_PROG_GET_FD_BY_ID, _IdAttr(prog_id, 0, 0))
    except FileNotFoundError:  # unloaded since its id was listed
        return None


def _symbols_of(prog_fd: int, btfs: dict) -> list[tuple[int, str]] | None:
    """The kallsyms symbols of one program's functions; `btfs` holds the BTF objects read
    so far, by id (bcc's programs share one)."""
    info = _counts(prog_fd)
    if info.type in TRAMPOLINE_PROGRAM_TYPES:
        return None
    count = info.nr_jited_ksyms
    if count == 0:
        return []  # not JIT-compiled: no code of its own in kallsyms
    if (count > 1 and info.nr_prog_tags != count) or (info.nr_func_info and info.nr_func_info < count):
        return None
    named_by_btf = info.nr_func_info > 0 and info.btf_id != 0
    starts, tags = (ctypes.c_uint64 * count)(), (ctypes.c_uint8 * (8 * count))()
    funcs = (ctypes.c_uint32 * (2 * info.nr_func_info))()  # struct bpf_func_info: insn_off, type_id
    program_name, btf_id = info.name.decode("utf-8", "replace"), info.btf_id
    info = ProgInfo(nr_jited_ksyms=count, jited_ksyms=ctypes.addressof(starts),
                    nr_prog_tags=count if count > 1 else 0, prog_tags=ctypes.addressof(tags),
                    nr_func_info=len(funcs) // 2 if named_by_btf else 0, func_info_rec_size=8,
                    func_info=ctypes.addressof(funcs))
    _object_info(prog_fd, info)
    if not any(starts):
        return None  # addresses hidden (kptr_restrict): only kallsyms, read as root, has them
    function_tags = [bytes(tags[8 * i:8 * i + 8]).hex() for i in range(count)] if count > 1 else [bytes(info.tag).hex()]
    names = _btf_names(btf_id, [funcs[2 * i + 1] for i in range(count)], btfs) if named_by_btf else [program_name] * count
    if names is None:
        return None
    return [(int(start), f"bpf_prog_{tag}_{name}" if name else f"bpf_prog_{tag}")
            for start, tag, name in zip(starts, function_tags, names)]


def _btf_names(btf_id: int, type_ids: list[int], btfs: dict) -> list[str] | None:
    """The names of `type_ids` (functions) in the BTF object `btf_id`; None where unreadable."""
    from memprof.sources.ebpf.btf import Btf, BtfError
    try:
        if btf_id not in btfs:
            btfs[btf_id] = Btf(btf_raw(btf_id), origin=f"BTF object {btf_id}")
        return [btfs[btf_id].type_name(type_id) for type_id in type_ids]
    except (OSError, BtfError):
        return None

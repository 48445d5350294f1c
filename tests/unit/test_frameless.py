"""Frameless syscall wrappers (issue 20, point 17): which functions keep their return
address at the stack pointer, read from a real libc's .eh_frame, and the caller such a
wrapper hid put back into a user stack. No kernel needed: the stacks are this process's own
addresses."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from memprof.sources.symbols.frameless import FramelessFrames
from memprof.sources.symbols.stacks import StackInterner, UserStack
from memprof.sources.symbols.symbolize import KernelSymbols, UserSymbolizer, parse_maps

LIBC = ctypes.CDLL("libc.so.6")  # its own symbols, not the PLT entries of the running executable


def address_of(name: str) -> int:
    return ctypes.cast(getattr(LIBC, name), ctypes.c_void_p).value


def file_address(name: str, inside: int = 4) -> tuple[str, int]:
    maps = parse_maps(open("/proc/self/maps").read())
    where = UserSymbolizer().file_address(maps, address_of(name) + inside)
    assert where is not None
    return where


def test_glibc_syscall_wrappers_are_frameless_and_allocators_are_not():
    frameless = FramelessFrames()
    assert [frameless.return_address_at_sp(*file_address(n)) for n in ("pipe", "socket", "read", "eventfd")] == [True] * 4
    assert frameless.return_address_at_sp(*file_address("malloc", 20)) is False


def test_a_file_without_call_frame_information_is_never_frameless(tmp_path):
    not_elf = tmp_path / "not_elf.so"
    not_elf.write_bytes(b"\x7fELF garbage" * 10)
    frameless = FramelessFrames()
    assert frameless.return_address_at_sp(str(not_elf), 0x1000) is False
    assert frameless.return_address_at_sp(str(tmp_path / "gone.so"), 0x1000) is False


def test_an_address_outside_every_function_is_not_frameless():
    path, _ = file_address("pipe")
    assert FramelessFrames().return_address_at_sp(path, 0) is False


def _native_chain(stack: UserStack) -> list[str]:
    maps = parse_maps(open("/proc/self/maps").read())
    interner = StackInterner(read_stack=lambda i: [], maps_of=lambda pid: maps,
                             load_kernel_symbols=lambda: KernelSymbols(np.zeros(0, dtype=np.uint64), [], []),
                             read_user_stack=lambda key: stack)
    interner.intern(np.array([-1]), np.array([7], dtype=np.uint64), np.array([os.getpid()]), np.array([0], dtype=np.uint64))
    stacks, frames = interner.drain_tables()
    names = dict(zip(frames["frame_id"], frames["function"]))
    return [names[f] for f in stacks["frame_id"].tolist()]


def test_the_word_at_the_stack_pointer_is_the_caller_of_a_frameless_function_only():
    # In a wrapper: its caller (here getpid, standing in for site_a) goes second.
    in_pipe, caller, outer = address_of("pipe") + 8, address_of("getpid") + 4, address_of("malloc") + 8
    chain = _native_chain(UserStack([in_pipe, outer], word_at_sp=caller))
    assert len(chain) == 3 and chain[1].endswith("getpid") and chain[2].endswith("malloc"), chain
    # In a function with a frame, the word is whatever its frame holds: left out.
    in_malloc = address_of("malloc") + 20
    assert len(_native_chain(UserStack([in_malloc, outer], word_at_sp=caller))) == 2
    # No word (a user-space allocator's stack), or the walk already found it: unchanged.
    assert len(_native_chain(UserStack([in_pipe, outer]))) == 2
    assert len(_native_chain(UserStack([in_pipe, caller], word_at_sp=caller))) == 2

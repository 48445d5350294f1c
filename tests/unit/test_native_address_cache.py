"""The stack interner resolves each native address of a process once per snapshot of its
mappings (memprof/sources/symbols/stacks.py `_known_native`), not once per stack: stacks
that share callers resolve only their new addresses, the chains are the ones resolving
every stack whole gives, and a new snapshot (the process mapped or unmapped something)
resolves again. This process's own libc addresses, resolved for real; the resolver is
counted, not replaced."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from memprof.sources.cpython.frames import PyFrame
from memprof.sources.symbols.stacks import StackInterner, UserStack
from memprof.sources.symbols.symbolize import KernelSymbols, UserSymbolizer, parse_maps

LIBC = ctypes.CDLL("libc.so.6")


def address_of(name: str, inside: int = 8) -> int:
    return ctypes.cast(getattr(LIBC, name), ctypes.c_void_p).value + inside


class CountingSymbolizer(UserSymbolizer):
    """A real UserSymbolizer that remembers the addresses it was asked to resolve."""

    def __init__(self):
        super().__init__()
        self.asked: list[list[int]] = []

    def resolve(self, maps, addrs):
        self.asked.append(sorted(int(a) for a in np.asarray(addrs).reshape(-1)))
        return super().resolve(maps, addrs)


class Interned:
    """A StackInterner over this process's mappings (`maps_box[0]`, replaceable) and the
    given user and Python stacks, with the names of the frames it made so far."""

    def __init__(self, stacks: dict[int, UserStack], maps_box: list, python: dict[int, list[PyFrame]] | None = None):
        self.symbols = CountingSymbolizer()
        self.interner = StackInterner(read_stack=lambda i: [], maps_of=lambda pid: maps_box[0],
                                      load_kernel_symbols=lambda: KernelSymbols(np.zeros(0, dtype=np.uint64), [], []),
                                      read_user_stack=stacks.__getitem__, user_symbols=self.symbols,
                                      python_frames=(python or {}).__getitem__)
        self.names: dict[int, tuple] = {}

    def chains(self, keys: list[int], py_stacks: list[int] | None = None) -> list[list[tuple]]:
        """Each key's chain as (function, module) pairs, innermost first."""
        n = len(keys)
        ids = self.interner.intern(np.full(n, -1), np.array(keys, dtype=np.uint64), np.full(n, os.getpid()),
                                   np.zeros(n, dtype=np.uint64), np.array(py_stacks or [0] * n, dtype=np.uint64))
        stacks, frames = self.interner.drain_tables()
        self.names.update(zip(frames["frame_id"], zip(frames["function"], frames["module"])))
        by_stack: dict[int, list] = {}
        for stack_id, frame_id in zip(stacks["stack_id"].tolist(), stacks["frame_id"].tolist()):
            by_stack.setdefault(stack_id, []).append(self.names[frame_id])
        return [by_stack[i] for i in ids.tolist()]


def test_shared_callers_are_resolved_once_and_chains_are_whole():
    maps = [parse_maps(open("/proc/self/maps").read())]
    outer, middle = address_of("malloc"), address_of("free")
    stacks = {1: UserStack([address_of("getpid"), middle, outer]), 2: UserStack([address_of("getppid"), middle, outer]),
              3: UserStack([address_of("getuid"), middle, outer])}
    interned = Interned(stacks, maps)
    first = interned.chains([1])
    later = interned.chains([2, 3])
    assert [len(c) for c in first + later] == [3, 3, 3]
    assert all(c[1:] == first[0][1:] for c in later) and first[0][2][0] == "malloc"
    assert [len(asked) for asked in interned.symbols.asked] == [3, 1, 1]  # the leaves only, after the first stack
    # The same chains as a fresh interner resolving each stack alone.
    for key, chain in zip([1, 2, 3], first + later):
        assert Interned(stacks, maps).chains([key]) == [chain]


def test_a_new_snapshot_of_the_mappings_resolves_again():
    maps = [parse_maps(open("/proc/self/maps").read())]
    stacks = {1: UserStack([address_of("getpid"), address_of("malloc")]),
              2: UserStack([address_of("getppid"), address_of("malloc")])}
    interned = Interned(stacks, maps)
    interned.chains([1])
    maps[0] = list(maps[0])  # a new snapshot (the process mapped something): same content, new object
    interned.chains([2])
    assert [len(asked) for asked in interned.symbols.asked] == [2, 2]


def test_python_frames_keep_their_ids_and_entries_across_stacks():
    maps = [parse_maps(open("/proc/self/maps").read())]
    stacks = {1: UserStack([address_of("getpid")]), 2: UserStack([address_of("getppid")])}
    outer = PyFrame("main", "app.py", 10, True)
    python = {11: [PyFrame("leaf_a", "app.py", 3, False), outer], 12: [PyFrame("leaf_b", "app.py", 5, False), outer]}
    interned = Interned(stacks, maps, python)
    a, b = interned.chains([1, 2], py_stacks=[11, 12])
    # No eval-loop frame in these native stacks: the Python frames go after the native ones.
    assert [f for f, _ in a[1:]] == ["leaf_a", "main"] and [f for f, _ in b[1:]] == ["leaf_b", "main"]
    assert [name for name in interned.names.values() if name[0] == "main"] == [("main", None)]  # one frame, shared


def test_each_processes_mappings_are_indexed_once_while_ranks_alternate():
    """Two processes' snapshots resolved in turn (a job's ranks in one flush) keep one index
    each; past the bound the oldest goes; a snapshot's index resolves as a fresh one would."""
    from memprof.sources.symbols import symbolize
    symbols = UserSymbolizer()
    rank0, rank1 = parse_maps(open("/proc/self/maps").read()), parse_maps(open("/proc/self/maps").read())
    addrs = np.array([address_of("malloc")], dtype=np.uint64)
    for maps in (rank0, rank1, rank0, rank1):
        [frame] = symbols.resolve(maps, addrs)
        assert frame.function == "malloc"
    assert [index.source for index in symbols._indexes.values()] == [rank0, rank1]  # one each, not four
    assert all(index.source is maps for index, maps in zip(symbols._indexes.values(), (rank0, rank1)))
    snapshots = [list(rank0) for _ in range(symbolize._KEPT_INDEXES + 1)]
    for maps in snapshots:
        symbols.resolve(maps, addrs)
    assert len(symbols._indexes) == symbolize._KEPT_INDEXES
    assert all(index.source is not snapshots[0] for index in symbols._indexes.values())  # the oldest went


def test_the_addresses_of_only_the_latest_processes_are_kept(monkeypatch):
    """A long job's processes come and go: what is known of them is bounded, the oldest
    process's dropped first, and a process seen again resolves again."""
    from memprof.sources.symbols import stacks as stacks_module
    monkeypatch.setattr(stacks_module, "_KEPT_PROCESSES", 2)
    maps = parse_maps(open("/proc/self/maps").read())
    interner = Interned({}, [maps]).interner
    for pid in (101, 102, 103):
        interner._known_native(pid, maps)[address_of("malloc")] = pid
    assert list(interner._native) == [102, 103]
    assert interner._known_native(101, maps) == {}  # seen again: nothing kept of it
    assert list(interner._native) == [103, 101]

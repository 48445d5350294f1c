"""Interning of BPF stack ids into the recording's `stacks` and `frames` tables.

An event's chain is identified by (kernel stack id, user stack id, process, call site, Python
stack): user addresses mean something only within one process's mappings, and the call site
stands in for the kernel stack when that one could not be captured. Chains are symbolized in
batches at each flush — kernel frames from kallsyms, user frames from the process's latest
maps, Python frames from the code objects BPF copied (memprof/sources/cpython/frames.py) — and
stored innermost first: kernel frames, then native frames with the Python frames each
eval-loop call was running placed just before it, then any Python frames left over."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from memprof.lazy_import import numpy as np
from memprof.model import FrameKind
from memprof.model.schema import EVAL_LOOP_FUNCTIONS
from memprof.sources.cpython.frames import PyFrame, entry_ends, interleave
from memprof.sources.symbols.frameless import FramelessFrames
from memprof.sources.symbols.symbolize import KernelSymbols, Mapping, UserSymbolizer

# Frames of the tracing machinery itself sit on top of every kernel stack a BPF program
# captures; they say nothing about who allocated.
_TRACING_PREFIXES = ("bpf_", "__bpf_", "trace_", "__traceiter_", "perf_", "___bpf", "__probestub_")


@dataclass
class _Pending:
    stack_id: int
    kstack_id: int
    ustack: int      # key of the user stack in `ustacks`, 0 when none
    pid: int
    call_site: int
    py_stack: int = 0


@dataclass(frozen=True)
class UserStack:
    """A user stack as BPF took it: return addresses innermost first (the first is the
    interrupted instruction's), and for kernel events the word at the user stack pointer
    (0 for none)."""

    frames: list[int]
    word_at_sp: int = 0


def _no_python(py_stack: int) -> list[PyFrame]:
    return []


def _no_user_stacks(key: int) -> UserStack:
    return UserStack([])


@dataclass
class StackInterner:
    """Gives each distinct chain a stable int64 `stack_id` and emits table rows once.

    `read_stack(bpf_stack_id) -> list[int]` reads a kernel stack's raw addresses (innermost
    first) from the kernel's stack map, `read_user_stack(key) -> UserStack` a user stack's from `ustacks`;
    `maps_of(pid)` returns the latest known mappings of a process;
    `python_frames(py_stack) -> list[PyFrame]` the Python frames of an interned Python stack."""

    read_stack: Callable[[int], list[int]]
    maps_of: Callable[[int], Sequence[Mapping]]
    load_kernel_symbols: Callable[[], KernelSymbols]
    python_frames: Callable[[int], list[PyFrame]] = _no_python
    read_user_stack: Callable[[int], UserStack] = _no_user_stacks
    user_symbols: UserSymbolizer = field(default_factory=UserSymbolizer)
    frameless: FramelessFrames = field(default_factory=FramelessFrames)
    _ids: dict = field(default_factory=dict)
    _pending: list = field(default_factory=list)
    _frame_ids: dict = field(default_factory=dict)
    _python_ids: dict = field(default_factory=dict)  # PyFrame -> frame id
    _eval_ids: set = field(default_factory=set)      # frame ids of the eval loop's native frames
    _batch: dict = field(default_factory=dict)  # symbolized parts of chains, within one drain_tables()
    _new_frames: list = field(default_factory=list)
    _kernel_symbols: KernelSymbols | None = None
    _native: dict = field(default_factory=dict)  # pid -> (maps snapshot, what _known_native says)

    @property
    def kernel_symbols(self) -> KernelSymbols:
        if self._kernel_symbols is None:
            self._kernel_symbols = self.load_kernel_symbols()
        return self._kernel_symbols

    def intern(self, kstack: np.ndarray, ustack: np.ndarray, pid: np.ndarray, call_site: np.ndarray,
               py_stack: np.ndarray | None = None) -> np.ndarray:
        """Stack ids (int64) for arrays of raw ids; one Python step per *distinct* chain."""
        if kstack.size == 0:
            return np.empty(0, dtype=np.int64)
        if py_stack is None:
            py_stack = np.zeros(kstack.size, dtype=np.uint64)
        # One 64-bit mix of the parts finds the distinct rows in one np.unique (two chains
        # would merge only on a 64-bit collision, odds about n²/2⁶⁴).
        with np.errstate(over="ignore"):
            mix = (call_site.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                   ^ (kstack.astype(np.int64).astype(np.uint64) + np.uint64(2)) * np.uint64(0xC2B2AE3D27D4EB4F)
                   ^ (ustack.astype(np.uint64) + np.uint64(2)) * np.uint64(0x165667B19E3779F9)
                   ^ pid.astype(np.uint64) * np.uint64(0x27D4EB2F165667C5)
                   ^ (py_stack.astype(np.uint64) * np.uint64(0x94D049BB133111EB) + np.uint64(0x2545F4914F6CDD1D)))
        _, first, inverse = np.unique(mix, return_index=True, return_inverse=True)
        ids = np.fromiter(
            (self._id_for((int(kstack[i]), int(ustack[i]), int(pid[i]), int(call_site[i]), int(py_stack[i])))
             for i in first),
            dtype=np.int64, count=first.size)
        return ids[inverse]

    def _id_for(self, key: tuple) -> int:
        stack_id = self._ids.get(key)
        if stack_id is None:
            stack_id = len(self._ids)
            self._ids[key] = stack_id
            self._pending.append(_Pending(stack_id, *key))
        return stack_id

    def drain_tables(self) -> tuple[dict, dict]:
        """Symbolize chains interned since the last call: (stacks columns, frames columns).
        The stacks columns are int64 numpy arrays: a recording of `import torch` emits over a
        million rows."""
        # Parts shared by many chains (one native stack under many Python stacks) are
        # symbolized once per batch: maps can change between batches, not within one.
        self._batch = {}
        chains = [self._chain(p) for p in self._pending]
        stack_ids = np.fromiter((p.stack_id for p in self._pending), dtype=np.int64, count=len(self._pending))
        self._pending = []
        frames = _columns(self._new_frames, ("frame_id", "kind", "function", "module", "file", "line"))
        self._new_frames = []
        return _stack_rows(stack_ids, chains), frames

    def _chain(self, p: _Pending) -> list[int]:
        """Frame ids innermost first: kernel frames, then the task's native and Python frames."""
        kernel = self._batched(("k", p.kstack_id, p.call_site), lambda: self._kernel_frames(p))
        user = self._batched(("u", p.pid, p.ustack, p.py_stack), lambda: self._user_and_python_frames(p))
        return kernel + user

    def _user_and_python_frames(self, p: _Pending) -> list[int]:
        native = self._batched(("n", p.pid, p.ustack), lambda: self._user_frames(p))
        frames = self._python_frames(p)
        if not frames:
            return native
        # Frame ids kept per PyFrame and looked up with map(): C-level passes over a stack's
        # ~60 frames, here and in entry_ends, where Python loops over (frame id, entry) pairs
        # took 0.26 s of a GPT-2 generation's drain_tables under cProfile (0.13 s now; issue 24).
        ids = list(map(self._python_ids.get, frames))
        if None in ids:
            ids = [frame_id if frame_id is not None else self._python_id(f) for frame_id, f in zip(ids, frames)]
        return interleave(native, ids, entry_ends(frames), self._eval_ids.__contains__)

    def _batched(self, key: tuple, compute: Callable[[], list]) -> list:
        found = self._batch.get(key)
        if found is None:
            found = self._batch[key] = compute()
        return found

    def _python_frames(self, p: _Pending) -> list[PyFrame]:
        if not p.py_stack:
            return []
        try:
            return self.python_frames(p.py_stack)
        except (KeyError, OSError):
            return []

    def _python_id(self, f: PyFrame) -> int:
        """The frame id of a Python frame, kept by the PyFrame itself (a tuple: one hash of
        four fields, where the frames' key would be a new tuple per frame)."""
        frame_id = self._python_ids.get(f)
        if frame_id is None:
            frame_id = self._python_ids[f] = self._frame_id(_PYTHON, f.function, None, f.file, f.line)
        return frame_id

    def _kernel_frames(self, p: _Pending) -> list[int]:
        addrs = self._safe_read(p.kstack_id)
        names = []
        if addrs:
            frames = self.kernel_symbols.resolve(_callers(addrs))
            names = [(f.function, f.module) for f in frames]
            while names and names[0][0].startswith(_TRACING_PREFIXES):
                names.pop(0)
        elif p.call_site:
            # No stack (sampling miss or map full): the allocation's direct caller still says where.
            names = [(f.function, f.module) for f in self.kernel_symbols.resolve(np.array([p.call_site - 1], dtype=np.uint64))]
        return [self._frame_id(FrameKind.KERNEL.value, fn, mod) for fn, mod in names]

    def _user_frames(self, p: _Pending) -> list[int]:
        stack = self._safe_read_user(p.ustack)
        if not stack.frames:
            return []
        maps = self.maps_of(p.pid)
        known = self._known_native(p.pid, maps)
        callers = [a - 1 for a in self._with_frameless_caller(maps, stack, known)]  # _callers' step back
        callers = callers[:self._believed(maps, callers, known)]
        missing = list({a for a in callers if a not in known})
        if missing:
            frames = self.user_symbols.resolve(maps, np.array(missing, dtype=np.uint64))
            known.update(zip(missing, (self._frame_id(_NATIVE, f.function, f.module) for f in frames)))
        return [known[a] for a in callers]

    def _believed(self, maps: Sequence[Mapping], callers: list[int], known: dict) -> int:
        """How many of `callers` a frame-pointer walk can have read (symbolize's
        walk_valid_up_to: none past one in memory that is not code); an address resolved
        before is code, and is not looked up again."""
        if all(a in known for a in callers):
            return len(callers)
        return self.user_symbols.walk_valid_up_to(maps, callers)

    def _known_native(self, pid: int, maps: Sequence[Mapping]) -> dict:
        """What is known of `pid`'s addresses under its mappings `maps` (a snapshot): the
        frame id of each address resolved (an int key), and whether a frameless caller hides
        under each interrupted instruction (("frameless", address) keys). Most of a flush's
        native stacks share most of their callers: each address is resolved once per
        snapshot, not once per stack (~0.4 s of the recorder's CPU on the training bench)."""
        held = self._native.get(pid)
        if held is None or held[0] is not maps:
            # A long job's processes come and go (data loader workers each epoch): keep the
            # latest _KEPT_PROCESSES; a process dropped and seen again only resolves again.
            self._native.pop(pid, None)
            while len(self._native) >= _KEPT_PROCESSES:
                del self._native[next(iter(self._native))]
            held = self._native[pid] = (maps, {})
        return held[1]

    def _with_frameless_caller(self, maps: Sequence[Mapping], stack: UserStack, known: dict) -> list[int]:
        """The stack's addresses, with the caller a frameless function hid put back.

        Frame-pointer unwinding from a system call skips the caller of a function that
        pushed no frame (glibc's `pipe()`, `socket()`…: see frameless.py); the word at the
        stack pointer is then that caller's return address, and goes second."""
        addrs = stack.frames
        if not stack.word_at_sp or (len(addrs) > 1 and addrs[1] == stack.word_at_sp):
            return addrs
        decided = known.get(("frameless", addrs[0]))
        if decided is None:
            where = self.user_symbols.file_address(maps, addrs[0] - 1)  # the interrupted instruction
            decided = known[("frameless", addrs[0])] = where is not None and self.frameless.return_address_at_sp(*where)
        return [addrs[0], stack.word_at_sp, *addrs[1:]] if decided else addrs

    def _safe_read(self, bpf_stack_id: int) -> list[int]:
        """A kernel stack's addresses (none for a negative id, or one gone from the map)."""
        return _read_quietly(self.read_stack, bpf_stack_id) if bpf_stack_id >= 0 else []

    def _safe_read_user(self, key: int) -> UserStack:
        """A user stack (none for key 0, or one evicted from `ustacks`), zeros left out."""
        if not key:
            return UserStack([])
        try:
            stack = self.read_user_stack(key)
        except (KeyError, OSError):
            return UserStack([])
        return UserStack([a for a in stack.frames if a], stack.word_at_sp)

    def _frame_id(self, kind: str, function: str, module: str | None, file: str | None = None,
                  line: int | None = None) -> int:
        key = (kind, function, module, file, line)
        frame_id = self._frame_ids.get(key)
        if frame_id is None:
            frame_id = len(self._frame_ids)
            self._frame_ids[key] = frame_id
            if kind == _NATIVE and function in EVAL_LOOP_FUNCTIONS:
                self._eval_ids.add(frame_id)
            self._new_frames.append((frame_id, kind, function, module, file, line))
        return frame_id


_PYTHON = FrameKind.PYTHON.value
_NATIVE = FrameKind.NATIVE.value
_KEPT_PROCESSES = 64  # processes whose resolved native addresses are kept (_known_native)


def _stack_rows(stack_ids: np.ndarray, chains: list[list[int]]) -> dict[str, np.ndarray]:
    """The `stacks` table's columns for chains (frame ids, innermost first) and their ids:
    one row per frame, depth 0 innermost."""
    lengths = np.fromiter(map(len, chains), dtype=np.int64, count=len(chains))
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    return {"stack_id": np.repeat(stack_ids, lengths),
            "depth": np.arange(total, dtype=np.int64) - np.repeat(starts, lengths),
            "frame_id": np.fromiter(itertools.chain.from_iterable(chains), dtype=np.int64, count=total)}


def _read_quietly(read: Callable[[int], list[int]], key: int) -> list[int]:
    """Non-zero addresses read under `key`; none where the map no longer has it."""
    try:
        return [a for a in read(key) if a]
    except (KeyError, OSError):
        return []


def _callers(addrs: list[int]) -> np.ndarray:
    """Addresses to resolve. Every captured address is a return address (a tracepoint's
    caller, a user task's instruction after `syscall`), so step back one byte into the
    call: a call that ends a function is then charged to that function, not the next."""
    return np.array(addrs, dtype=np.uint64) - np.uint64(1)


def _columns(rows: list[tuple], names: tuple[str, ...]) -> dict[str, list]:
    return {name: [r[i] for r in rows] for i, name in enumerate(names)}

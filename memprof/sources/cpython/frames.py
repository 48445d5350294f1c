"""Python frames for the eBPF source: the user-space half of bpf/python.bpf.c.

It tells the BPF walker where each tracked process's interpreter keeps its threads (a
`py_conf` per process, written only for an interpreter whose layout pyinterp confirmed), and
turns the walker's interned stacks — (code object, instruction index) pairs — into frames:
qualified name, file and line. Lines come from the code object's line table, which BPF copied
at first sight, so they resolve even after the process has exited. BPF copies a table's
first PY_LINES_BYTES; a longer one (a function of some hundreds of lines, such as
transformers' `generate`) is read whole from the process while it lives, so that its later
lines are known too."""
from __future__ import annotations

import ctypes
import itertools
import operator
import os
import shutil
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from memprof.sources.cpython import lines as pylines
from memprof.sources.cpython.options import INIT_SLOTS, PythonOptions, tail_called_programs
from memprof.sources.ebpf.bpfload import load_program
from memprof.sources.ebpf.records import CNT_PY_RELEARNED
from memprof.sources.cpython.interp import (PythonLayoutError, inspect_python, load_bias, mapped_as, python_file_in_maps,
                                           runtime_file)
from memprof.sources.symbols.files import HeldFiles, file_identity, open_binary
from memprof.sources.symbols.procs import read_process_memory
from memprof.sources.symbols.symbolize import Mapping

ENTRY_BIT = 0x80000000   # PY_ENTRY_BIT: the first frame run by one C-level eval call
LASTI_NONE = 0x7FFFFFFF  # PY_LASTI_NONE
OWNED_BY_CSTACK = 3
# The longest line table read whole from a live process (a 2,000-line function's is ~10 KB):
# the length is the process's own word, and a larger one is not believed.
MAX_LINE_TABLE_BYTES = 1 << 20


class PyFrame(NamedTuple):
    """One Python frame, innermost first in a stack. `line` is None when unknown. `entry`: the
    first frame a C-level call of the eval loop ran (the frames up to it replace that call).
    A tuple, so that hashing one (the interner looks every frame up) is a C-level call."""

    function: str
    file: str
    line: int | None
    entry: bool


@dataclass
class _Code:
    name: str
    file: str
    lines: list  # pylines ranges: (start, end, line)


@dataclass
class PythonFrames:
    """Per-process interpreter registration and stack resolution, over the BPF maps `bpf`."""

    bpf: object
    options: PythonOptions = field(default_factory=PythonOptions)
    notes: dict = field(default_factory=dict)       # interpreter path -> what meta.json says
    _registered: dict = field(default_factory=dict)  # tgid -> interpreter path (or None)
    _runtime_of: dict = field(default_factory=dict)  # tgid -> interpreter path, kept after exit
    _with_frames: set = field(default_factory=set)   # tgids whose Python frames were read
    _init_slots: dict = field(default_factory=dict)  # runtime path -> py_templates slot (or None)
    _names: dict = field(default_factory=dict)       # runtime file's identity -> its name in the notes
    _held: HeldFiles = field(default_factory=HeldFiles)  # what bcc is given to open (see files.HeldFiles)
    _slot_binary: dict = field(default_factory=dict)  # py_templates slot -> PythonBinary
    _codes: dict = field(default_factory=dict)       # (tgid, code address) -> _Code | None
    _stacks: dict = field(default_factory=dict)      # py_stack hash -> [PyFrame]
    _frames: dict = field(default_factory=dict)      # (tgid, code address, lasti word) -> PyFrame
    _relearned: int = 0
    stats: dict = field(default_factory=lambda: {"frames": 0, "distinct_frames_without_line": 0, "distinct_frames_unnamed": 0,
                                                   "stacks_evicted": 0, "line_tables_read_whole": 0,
                                                   "line_tables_cut": 0})

    def install(self) -> None:
        """Put the walk's and the code learning's programs where the allocation programs
        tail-call them. Before any process is tracked: until then no allocation program gets
        as far as the tail call (a failed one is counted, `tail_calls_failed`)."""
        for array, fn, kind in tail_called_programs():
            prog = load_program(self.bpf, fn, kind)
            self.bpf[array][ctypes.c_int(0)] = ctypes.c_int(prog.fd)

    # ---- processes ----
    def register(self, pid: int, maps: Sequence[Mapping]) -> None:
        """Tell BPF where `pid`'s interpreter is, once its runtime is mapped and confirmed.
        Called again as the process maps more files: a shared build's executable is mapped
        at exec, its libpython a moment later. In a mount namespace of its own, the runtime
        is the process's file, read through its /proc/PID/root (Mapping.file)."""
        if not self.options.enabled or pid in self._registered:
            return
        path = python_file_in_maps(maps)
        if path is None:
            return
        runtime = runtime_file(path)
        if runtime != path:
            runtime = mapped_as(runtime, maps)
            if runtime is None:
                return  # a shared build whose libpython is not mapped yet
        try:
            binary = inspect_python(runtime)
        except PythonLayoutError as e:
            self._registered[pid] = None
            self.notes[self._one_name(runtime)] = {"frames": False, "why": e.message}
            return
        bias = load_bias(runtime, maps)
        if bias is None:
            return
        self.bpf["py_procs"][ctypes.c_uint32(pid)] = self._conf(binary, bias)
        self._registered[pid] = self._runtime_of[pid] = self._one_name(binary.path)
        self.notes.setdefault(self._runtime_of[pid], {"frames": True, "version": binary.version_text()})
        self.register_at_start(binary)

    def _one_name(self, path: str) -> str:
        """What the notes call the runtime file at `path`: the first path it was named by here
        (for a confirmed one, PythonBinary.path: the first it was inspected by). Each process
        of a container names it under its own /proc/PID/root; one file is one note."""
        identity = file_identity(path)
        return path if identity is None else self._names.setdefault(identity, path)

    def register_at_start(self, binary) -> None:
        """Let BPF register each later process of this runtime itself, at its
        Py_InitializeFromConfig (see bpf/python.bpf.c, "registration at interpreter start"):
        register() comes a poll after libpython is mapped, which a short program's first
        Python code can beat. Once per file, while a slot is free; the others are registered
        by register() alone."""
        if binary.path in self._init_slots:
            return
        free = [i for i in range(INIT_SLOTS) if i not in self._init_slots.values()]
        held = self._held.bcc_path(binary.path)
        if not binary.init_vaddr or not free or held is None:
            self._init_slots[binary.path] = None  # (held None: not a regular file now, see files.HeldFiles)
            return
        slot = free[0]
        template = self.bpf["py_templates"].Leaf()
        conf = self._conf(binary, 0)  # link-time addresses: BPF adds the bias
        for name, _ in conf._fields_:
            setattr(template.conf, name, getattr(conf, name))
        template.init_vaddr = binary.init_vaddr
        self.bpf["py_templates"][ctypes.c_int(slot)] = template
        try:
            self.bpf.attach_uprobe(name=held, sym="Py_InitializeFromConfig", fn_name=f"mp_py_init_{slot}")
        except Exception:  # bcc raises bare Exception; register() still registers its processes
            self._init_slots[binary.path] = None
            return
        self._init_slots[binary.path] = slot
        self._slot_binary[slot] = binary

    def close_files(self) -> None:
        """Let go of the interpreters held for bcc (files.HeldFiles), once the probes are
        detached."""
        self._held.close()

    def _started_in_bpf(self) -> None:
        """Processes BPF registered at their interpreter's start: known to user space, even
        those that exited before their maps were read."""
        for tgid, slot in self.bpf["py_started"].items():
            binary = self._slot_binary.get(slot.value)
            if binary is not None:
                name = self._one_name(binary.path)
                self._runtime_of.setdefault(tgid.value, name)
                self.notes.setdefault(name, {"frames": True, "version": binary.version_text()})

    def interpreter_notes(self) -> dict:
        """meta.json's `interpreters`: per runtime file, whether its processes got Python
        frames. A supported one from none of whose processes a frame was read says so: frames
        false, and why (the reports list it as they list an unsupported one)."""
        self._started_in_bpf()
        notes = {}
        for runtime, note in self.notes.items():
            if note.get("frames") and not any(self._runtime_of.get(t) == runtime for t in self._with_frames):
                note = {**note, "frames": False, "supported": True,
                        "why": f"CPython {note.get('version')} is supported, but no Python frames were read from its "
                               "processes (events_without_thread_state counts events whose thread had no Python "
                               "thread state; see `memprof doctor`)"}
            notes[runtime] = note
        return notes

    def prewarm(self, runtimes: Sequence[str]) -> None:
        """Inspect the interpreters a command will run before it starts (parsing an ELF takes
        0.1-0.3 s; done at exec time, it would cost the target its first Python frames).
        `runtimes`: python_runtimes() of the command's file."""
        if not self.options.enabled:
            return
        for runtime in runtimes:
            runtime_file(runtime)  # register() asks it of the mapped libpython too
            try:
                self.register_at_start(inspect_python(runtime))
            except PythonLayoutError:
                pass  # said again, with the reason, when the process maps it

    def defer(self, pid: int) -> None:
        """Give `pid` no Python frames until it execs (memprof's own child before its exec)."""
        self._registered[pid] = None

    def forget(self, pid: int) -> None:
        """The process exec'd or exited: its old interpreter is gone (a new one may register)."""
        for cache in (self._codes, self._frames):
            for key in [k for k in cache if k[0] == pid]:
                del cache[key]
        if self._registered.pop(pid, None):  # a path: it had a py_conf in BPF
            try:
                del self.bpf["py_procs"][ctypes.c_uint32(pid)]
            except KeyError:
                pass

    def _conf(self, binary, bias: int):
        table = self.bpf["py_procs"]
        conf = table.Leaf()
        o = binary.offsets
        conf.interp_head = binary.runtime_vaddr + bias + o["runtime_interp_head"]
        conf.code_type = binary.code_type_vaddr + bias
        for name in ("interp_tstate_head", "tstate_next", "tstate_thread_id", "tstate_frame",
                     "cframe_current_frame", "frame_previous", "frame_code", "frame_instr",
                     "frame_owner", "frame_is_entry", "code_filename", "code_name", "code_qualname",
                     "code_firstlineno", "code_linetable", "code_adaptive", "unicode_length",
                     "unicode_state", "unicode_ascii_data", "unicode_compact_data", "bytes_size",
                     "bytes_data"):
            setattr(conf, name, o[name])
        conf.minor = binary.version[1]
        frame_fields = [o[k] for k in ("frame_previous", "frame_code", "frame_instr", "frame_owner", "frame_is_entry")]
        conf.frame_read = max(frame_fields) + 8
        conf.code_read = code_head_bytes(o)
        return conf

    # ---- stacks ----
    def refresh(self) -> None:
        """Before resolving a batch: when BPF re-learned a code object's address (a freed code
        object's address now holds another), what was decoded before may be stale — drop it."""
        relearned = int(sum(self.bpf["counters"][ctypes.c_int(CNT_PY_RELEARNED)]))
        if relearned != self._relearned:
            self._relearned = relearned
            self._codes.clear()
            self._stacks.clear()
            self._frames.clear()

    def frames(self, py_stack: int) -> list[PyFrame]:
        """The frames of an interned stack, innermost first ([] when it is not in the map)."""
        if not py_stack:
            return []
        if py_stack not in self._stacks:
            self._stacks[py_stack] = self._read_stack(py_stack)
        return self._stacks[py_stack]

    def _read_stack(self, py_stack: int) -> list[PyFrame]:
        try:
            leaf = self.bpf["py_stacks"][ctypes.c_uint64(py_stack)]
        except KeyError:  # evicted before this flush read it: more new stacks than the map holds
            self.stats["stacks_evicted"] += 1
            return []
        tgid, depth = int(leaf.tgid), min(int(leaf.depth), self.options.max_frames)
        if depth:
            self._with_frames.add(tgid)
        self.stats["frames"] += depth
        # Looked up with map() over the keys, not a method call per frame: a training run's
        # flushes read ~600,000 frames, nearly all decoded before (~0.2 s of the recorder's
        # CPU beside the command, issue 24). Only the new ones go through _frame_at.
        keys = list(zip(itertools.repeat(tgid, depth), leaf.code[:depth], leaf.lasti[:depth]))
        frames = list(map(self._frames.get, keys))
        if None in frames:
            frames = [frame if frame is not None else self._frame_at(*key) for frame, key in zip(frames, keys)]
        return frames

    def _frame_at(self, tgid: int, code: int, word: int) -> PyFrame:
        """One frame, decoded once per (process, code object, instruction): outer frames
        repeat across most stacks."""
        key = (tgid, code, word)
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = self._frame(self._code(tgid, code), word)
        return frame

    def _frame(self, code: _Code | None, word: int) -> PyFrame:
        entry = bool(word & ENTRY_BIT)
        lasti = word & ~ENTRY_BIT
        if code is None:
            self.stats["distinct_frames_unnamed"] += 1
            return PyFrame("<unknown code>", "", None, entry)
        line = None
        if lasti != LASTI_NONE:
            line = pylines.line_at(code.lines, lasti)
        if line is None:
            self.stats["distinct_frames_without_line"] += 1
        return PyFrame(code.name, code.file, line, entry)

    def _code(self, tgid: int, address: int) -> _Code | None:
        """The code object BPF learned at `address` in process `tgid` (None: not learned)."""
        key = (tgid, address)
        if key not in self._codes:
            table = self.bpf["py_codes"]
            k = table.Key()
            k.code, k.tgid = address, tgid
            try:
                leaf = table[k]
            except KeyError:
                self._codes[key] = None
            else:
                self._codes[key] = self._decode_code(leaf, tgid)
        return self._codes[key]

    def _decode_code(self, leaf, tgid: int) -> _Code:
        version = (3, int(leaf.minor))
        copied = bytes(bytearray(leaf.lines))[:min(int(leaf.lines_len), len(leaf.lines))]
        raw = self._whole_line_table(tgid, leaf, copied)
        lines = decode_lines(version, raw, int(leaf.firstlineno), cut=int(leaf.lines_len) > len(raw))
        name = decode_str(bytes(bytearray(leaf.name)), int(leaf.name_len), int(leaf.name_state), 0)
        file = decode_str(bytes(bytearray(leaf.file)), int(leaf.file_len), int(leaf.file_state), int(leaf.file_skip))
        return _Code(name or "<unknown>", file, lines)

    def _whole_line_table(self, tgid: int, leaf, copied: bytes) -> bytes:
        """The code object's whole line table where BPF copied only its start (`copied`):
        read from process `tgid` while it lives, and believed only when it begins with what
        BPF copied (the code object may be gone and its memory another's since). Else
        `copied`, which decode_lines reads up to its last whole entry. Counted in stats
        either way."""
        length = int(leaf.lines_len)
        if length <= len(copied):
            return copied
        whole = None
        data_offset = self._bytes_data_offset(tgid)
        if data_offset is not None and int(leaf.lines_ptr) and length <= MAX_LINE_TABLE_BYTES:
            whole = read_process_memory(tgid, int(leaf.lines_ptr) + data_offset, length)
        if whole is None or not whole.startswith(copied):
            self.stats["line_tables_cut"] += 1
            return copied
        self.stats["line_tables_read_whole"] += 1
        return whole

    def _bytes_data_offset(self, tgid: int) -> int | None:
        """Where a bytes object's data begins in `tgid`'s interpreter (its py_conf, which BPF
        forgets when the process exits: None then, as for a process never registered)."""
        try:
            return int(self.bpf["py_procs"][ctypes.c_uint32(tgid)].bytes_data)
        except KeyError:
            return None


CODE_HEAD_FIELDS = ("code_filename", "code_name", "code_qualname", "code_firstlineno", "code_linetable")
CODE_TYPE_END = 16  # ob_type, at 8: what tells a code object from what else lies at its address


def code_head_bytes(offsets: dict) -> int:
    """py_conf.code_read: bytes from a code object's start that cover its type and every field
    the code learning reads (bpf/python.bpf.c reads them in one go). Absent fields are -1."""
    return max([CODE_TYPE_END] + [offsets[k] + 8 for k in CODE_HEAD_FIELDS if offsets[k] >= 0])


def python_runtimes(executable: str | None, process_maps: Sequence[Sequence[Mapping]] = ()) -> list[str]:
    """The files holding the CPython runtime (a static build's executable, a shared build's
    libpython) of the Python that `executable` runs — itself, or a script's #! interpreter —
    and of each process whose mappings are in `process_maps`. By name only: whether each is a
    CPython whose layout is known is for inspect_python to say."""
    found = []
    python = command_python(executable) if executable else None
    if python:
        found.append(runtime_file(os.path.realpath(python)))
    for maps in process_maps:
        path = python_file_in_maps(maps)
        if path is not None:
            found.append(runtime_file(path))
    return list(dict.fromkeys(found))


def command_python(command_path: str) -> str | None:
    """The Python that `command_path` runs: itself when its name starts with "python", else
    the interpreter on its #! line when that one's does (torchrun, accelerate, any console
    script pip wrote); None when neither is a Python."""
    for path in (command_path, _shebang_interpreter(command_path)):
        if path and os.path.basename(path).startswith("python"):
            return path
    return None


def _shebang_interpreter(path: str) -> str | None:
    """The interpreter named on a script's #! line (`#!/usr/bin/env python3` → found on PATH)."""
    try:
        with open_binary(path) as f:
            first = f.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[1])
    return words[0] if words else None


def decode_lines(version: tuple[int, int], raw: bytes, firstlineno: int, cut: bool) -> list:
    """Line ranges of a line table; a `cut` one (BPF copies at most PY_LINES_BYTES) is decoded
    up to its last whole entry, so the function's first instructions still get lines."""
    for end in _whole_entry_ends(version, raw, cut):
        try:
            return pylines.lines_table(version, raw[:end], firstlineno)
        except ValueError:  # an entry cut short, or a table torn by a concurrent write
            continue
    return []


def _whole_entry_ends(version: tuple[int, int], raw: bytes, cut: bool) -> list[int]:
    if not cut:
        return [len(raw)]
    if version == (3, 10):
        return [len(raw) - len(raw) % 2]
    # 3.11+: every entry starts with a byte whose top bit is set.
    starts = [i for i in range(len(raw) - 1, max(-1, len(raw) - 64), -1) if raw[i] & 0x80]
    return starts[:4]


def decode_str(raw: bytes, length: int, state: int, skip_bytes: int) -> str:
    """Characters of a CPython str copied by BPF: `raw` holds its code units (1, 2 or 4 bytes
    each, by the `kind` bits of `state`) from byte `skip_bytes` on. A cut start shows as "…"."""
    kind = (state >> 2) & 7
    compact = (state >> 5) & 1
    if not compact or kind not in (1, 2, 4) or length <= 0:
        return ""
    n = min(length * kind - skip_bytes, len(raw))
    n -= n % kind
    codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
    text = raw[:n].decode(codec, errors="replace")
    if skip_bytes:
        text = "…" + text
    elif length * kind > n:
        text += "…"
    return text


def merge_chain(native: list, python: list, is_eval, entry=lambda frame: frame.entry) -> list:
    """Interleave Python frames into a native chain (both innermost first), as py-spy's
    --native does: each native eval-loop frame (`is_eval(frame)`) is preceded by the Python
    frames it was running — up to and including the next entry frame — and Python frames left
    over (the native stack ended early: no frame pointers) go after the native ones.
    `entry(python_frame)` says whether a Python frame was the first of its eval call.
    The eval frames themselves stay in the result; reports hide them by default."""
    return interleave(native, python, entry_ends(python, entry), is_eval)


def entry_ends(python: list, entry=operator.attrgetter("entry")) -> list[int]:
    """Each entry frame's index + 1, ascending (interleave's `entry_ends`), picked by a C-level
    pass (itertools.compress) over a stack's frames."""
    return list(itertools.compress(range(1, len(python) + 1), map(entry, python)))


def interleave(native: list, python: list, entry_ends: list[int], is_eval) -> list:
    """merge_chain, with the entry frames given as `entry_ends` (ascending: each entry
    frame's index + 1): the Python frames are copied a run at a time, not looked at one by
    one (a training run's recorder merges ~7,500 chains of ~60 frames; issue 24)."""
    out: list = []
    i = e = 0
    for frame in native:
        if i < len(python) and is_eval(frame):
            while e < len(entry_ends) and entry_ends[e] <= i:
                e += 1
            end = entry_ends[e] if e < len(entry_ends) else len(python)
            out += python[i:end]
            i = end
        out.append(frame)
    out += python[i:]
    return out

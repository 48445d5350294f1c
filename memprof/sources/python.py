"""Python frames for the eBPF source: the user-space half of bpf/python.bpf.c.

It tells the BPF walker where each tracked process's interpreter keeps its threads (a
`py_conf` per process, written only for an interpreter whose layout pyinterp confirmed), and
turns the walker's interned stacks — (code object, instruction index) pairs — into frames:
qualified name, file and line. Lines come from the code object's line table, which BPF copied
at first sight, so they resolve even after the process has exited."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Sequence

from memprof.model.schema import EVAL_LOOP_FUNCTIONS as EVAL_FUNCTIONS  # noqa: F401 (re-export)
from memprof.sources import pylines
from memprof.sources.pyinterp import PythonLayoutError, inspect_python, load_bias, python_file_in_maps
from memprof.sources.symbolize import Mapping

ENTRY_BIT = 0x80000000   # PY_ENTRY_BIT: the first frame run by one C-level eval call
LASTI_NONE = 0x7FFFFFFF  # PY_LASTI_NONE
OWNED_BY_CSTACK = 3


@dataclass
class PythonOptions:
    """`enabled`: read Python frames in BPF. Depth is bounded by `max_frames` (power of two);
    the maps hold `stack_entries` distinct stacks and `code_entries` code objects."""

    enabled: bool = True
    max_frames: int = 64
    stack_entries: int = 16384
    code_entries: int = 8192


def python_cflags(options: PythonOptions) -> list[str]:
    """-D constants of bpf/python.bpf.c (the thread pointer's place in task_struct from BTF)."""
    from memprof.sources.btf import load_cached
    btf = load_cached()
    fsbase = btf.member_offset("task_struct", "thread") + btf.member_offset("thread_struct", "fsbase")
    if options.max_frames & (options.max_frames - 1):
        raise ValueError("max_frames must be a power of two")
    return [f"-DPY_MAX_FRAMES={options.max_frames}", f"-DPY_STACK_ENTRIES={options.stack_entries}",
            f"-DPY_CODE_ENTRIES={options.code_entries}", f"-DTASK_FSBASE_OFF={fsbase}"]


@dataclass(frozen=True)
class PyFrame:
    """One Python frame, innermost first in a stack. `line` is None when unknown. `entry`: the
    first frame a C-level call of the eval loop ran (the frames up to it replace that call)."""

    function: str
    file: str
    line: int | None
    entry: bool


@dataclass
class _Code:
    name: str
    file: str
    firstlineno: int
    lines: list
    cut: bool  # the line table was longer than BPF copies


@dataclass
class PythonFrames:
    """Per-process interpreter registration and stack resolution, over the BPF maps `bpf`."""

    bpf: object
    options: PythonOptions = field(default_factory=PythonOptions)
    notes: dict = field(default_factory=dict)       # interpreter path -> what meta.json says
    _registered: dict = field(default_factory=dict)  # tgid -> interpreter path (or None)
    _codes: dict = field(default_factory=dict)       # (tgid, code address) -> _Code | None
    stats: dict = field(default_factory=lambda: {"frames": 0, "frames_without_line": 0, "unnamed_code": 0})

    def install(self) -> None:
        """Put the code-learning programs where the allocation programs tail-call them."""
        from bcc import BPF
        for array, fn, kind in (("py_learn_tp", "mp_py_learn_tp", BPF.RAW_TRACEPOINT),
                                ("py_learn_up", "mp_py_learn_up", BPF.KPROBE)):
            prog = self.bpf.load_func(fn, kind)
            self.bpf[array][ctypes.c_int(0)] = ctypes.c_int(prog.fd)

    # ---- processes ----
    def register(self, pid: int, maps: Sequence[Mapping]) -> None:
        """Tell BPF where `pid`'s interpreter is, once its runtime is mapped and confirmed."""
        if not self.options.enabled or pid in self._registered:
            return
        path = python_file_in_maps(maps)
        if path is None:
            return
        try:
            binary = inspect_python(path)
        except PythonLayoutError as e:
            self._registered[pid] = None
            self.notes[path] = {"frames": False, "why": e.message}
            return
        bias = load_bias(path, maps)
        if bias is None:
            return
        self.bpf["py_procs"][ctypes.c_uint32(pid)] = self._conf(binary, bias)
        self._registered[pid] = path
        self.notes[path] = {"frames": True, "version": binary.version_text()}

    def forget(self, pid: int) -> None:
        """The process exec'd or exited: its old interpreter is gone (a new one may register)."""
        if self._registered.pop(pid, None) is not None:
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
        return conf

    # ---- stacks ----
    def frames(self, py_stack: int) -> list[PyFrame]:
        """The frames of an interned stack, innermost first ([] when it is not in the map)."""
        if not py_stack:
            return []
        try:
            leaf = self.bpf["py_stacks"][ctypes.c_uint64(py_stack)]
        except KeyError:
            return []
        tgid, depth = int(leaf.tgid), min(int(leaf.depth), self.options.max_frames)
        out = []
        for i in range(depth):
            code = self._code(tgid, int(leaf.code[i]))
            word = int(leaf.lasti[i])
            out.append(self._frame(tgid, code, word))
        return out

    def _frame(self, tgid: int, code: _Code | None, word: int) -> PyFrame:
        entry = bool(word & ENTRY_BIT)
        lasti = word & ~ENTRY_BIT
        self.stats["frames"] += 1
        if code is None:
            self.stats["unnamed_code"] += 1
            return PyFrame("<unknown code>", "", None, entry)
        line = None
        if lasti != LASTI_NONE:
            line = pylines.line_at(code.lines, lasti)
        if line is None:
            self.stats["frames_without_line"] += 1
        return PyFrame(code.name, code.file, line, entry)

    def _code(self, tgid: int, address: int) -> _Code | None:
        """The code object BPF last learned at `address`. Read again each time (a freed code
        object's address can hold another, which BPF then re-learns); decoded once per object."""
        table = self.bpf["py_codes"]
        k = table.Key()
        k.code, k.tgid = address, tgid
        try:
            leaf = table[k]
        except KeyError:
            return None
        key = (tgid, address, int(leaf.name_ptr), int(leaf.file_ptr), int(leaf.lines_ptr), int(leaf.firstlineno))
        if key not in self._codes:
            self._codes[key] = self._decode_code(tgid, leaf)
        return self._codes[key]

    def _decode_code(self, tgid: int, leaf) -> _Code:
        version = (3, int(leaf.minor))
        raw = bytes(bytearray(leaf.lines))[:min(int(leaf.lines_len), len(leaf.lines))]
        lines = decode_lines(version, raw, int(leaf.firstlineno), cut=int(leaf.lines_len) > len(raw))
        name = decode_str(bytes(bytearray(leaf.name)), int(leaf.name_len), int(leaf.name_state), 0)
        file = decode_str(bytes(bytearray(leaf.file)), int(leaf.file_len), int(leaf.file_state), int(leaf.file_skip))
        return _Code(name or "<unknown>", file, int(leaf.firstlineno), lines, int(leaf.lines_len) > len(leaf.lines))


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


def merge_chain(native: list, python: list[PyFrame], is_eval) -> list:
    """Interleave Python frames into a native chain (both innermost first), as py-spy's
    --native does: each native eval-loop frame (`is_eval(frame)`) is preceded by the Python
    frames it was running — up to and including the next entry frame — and Python frames left
    over (the native stack ended early: no frame pointers) go after the native ones.
    The eval frames themselves stay in the result; reports hide them by default."""
    out, i = [], 0
    for frame in native:
        if is_eval(frame) and i < len(python):
            while i < len(python):
                out.append(python[i])
                i += 1
                if python[i - 1].entry:
                    break
        out.append(frame)
    out.extend(python[i:])
    return out

"""How a frame and a chain are named, in one place, for every view: the terminal reports, the
HTML page (through the JSON the page reads) and the exports.

A frame is a dict with keys kind ("kernel", "native", "python"), function, module, file,
line (None where unknown), as `memprof.analysis.leaks.chain_frames` gives it; a chain is a
list of frames, innermost first. Every function here returns plain text, not escaped: a
renderer for rich markup passes it through `memprof.report.safe_text.escape`, one for a
table or a file through `visible`.
"""
from __future__ import annotations

import re
from pathlib import Path

CHAIN_FRAMES = 3  # callers a one-line chain shows
PYTHON_FRAMES = 2  # Python frames a chain's name shows, when it has any
NO_STACK = "(no stack recorded)"
NO_STACK_FRAME = "[no stack]"  # the frame that stands for a missing stack in folded stacks and exports
KIND_TAGS = {"kernel": "k", "native": "n", "python": "py"}
_KERNEL_IMAGE = {"vmlinux", "kernel", "[kernel]", "[kernel.kallsyms]"}  # no need to name the kernel itself
# Frames inside an allocator, skipped when a chain is shown in one line so that it names the
# code that asked for memory: libc's malloc family, C++ operator new, the kernel's slab and
# page allocators, c10's CPU allocator, the CUDA driver/runtime allocators, CPython's own.
_ALLOCATOR = re.compile(r"""^(?:
    (?:__libc_|_int_|__)?(?:malloc|calloc|realloc|reallocarray|memalign|posix_memalign|aligned_alloc|valloc|pvalloc)\w*
  | operator\ new.* | _Zn[wa]\w*
  | _*kmalloc\w* | _*kmem_cache_alloc\w* | _*slab_alloc\w* | _*kvmalloc\w* | _*vmalloc\w*
  | _*alloc_pages\w* | _*folio_alloc\w* | __get_free_pages | get_page_from_freelist | rmqueue\w*
  | c10::alloc_cpu | c10::(?:\w+::)*\w*Allocator\w*::.+
  | cuMem\w+ | cudaMalloc\w*
  | _?PyMem_\w+ | _?PyObject_(?:Malloc|Calloc|Realloc)\w* | pymalloc_\w+
)$""", re.VERBOSE)
_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")  # kernel symbols come as "kmalloc_trace+0x2f"


def frame_label(frame: dict) -> str:
    """'[py] step (train.py:42)', '[n] at::empty (libtorch_cpu.so)', '[k] alloc_pipe_info+0x3f';
    a Python frame without a line shows its file alone, a kernel frame no kernel image."""
    kind, function = frame.get("kind"), frame.get("function") or "??"
    module, file, line = frame.get("module"), frame.get("file"), frame.get("line")
    where = f"{file}:{line}" if file and line is not None else file
    if kind == "python":
        detail = where or module
    elif kind == "kernel" and (module in _KERNEL_IMAGE or module is None):
        detail = where
    else:
        detail = " ".join(part for part in (module, where) if part)
    text = f"{function} ({detail})" if detail else function
    return f"[{KIND_TAGS.get(kind, '?')}] {text}"


def callers(frames: list[dict]) -> str:
    """The innermost CHAIN_FRAMES callers outside the allocators, 'fn ← fn ← fn' (kernel
    offsets dropped); a chain made only of allocator frames shows its innermost ones."""
    if not frames:
        return NO_STACK
    names = [_function(frame) for frame in frames]
    outside = [name for name, frame in zip(names, frames) if not _in_allocator(name, frame)] or names
    return " ← ".join(outside[:CHAIN_FRAMES]) + (" ← …" if len(outside) > CHAIN_FRAMES else "")


def chain_name(frames: list[dict]) -> str:
    """The chain in one line as its author reads it: its innermost PYTHON_FRAMES Python frames
    with their files and lines when it has any, else `callers`. What every view calls a
    finding: 'train_step (train.py:34) ← main (train.py:56)', 'alloc_pipe_info ← create_pipe_files'."""
    python = [frame for frame in frames if frame.get("kind") == "python"]
    if not python:
        return callers(frames)
    shown = [f"{frame.get('function') or '??'} ({Path(frame.get('file') or '?').name}:{frame.get('line')})"
             for frame in python[:PYTHON_FRAMES]]
    return " ← ".join(shown) + (" ← …" if len(python) > PYTHON_FRAMES else "")


def _function(frame: dict) -> str:
    return _OFFSET.sub("", frame.get("function") or "??")


def _in_allocator(name: str, frame: dict) -> bool:
    """Native or kernel frame of an allocator (C++ arguments ignored); Python frames never are."""
    return frame.get("kind") != "python" and bool(_ALLOCATOR.match(name.split("(", 1)[0].strip()))


def one_line(frames: list[dict]) -> str:
    """`callers` escaped for rich markup: the chain column of the terminal tables."""
    from memprof.report.safe_text import escape
    return escape(callers(frames))


NO_MODULE = "(no module)"  # an allocation made while no nn.Module forward ran on its thread
OUTERMOST_MODULE = "(outermost module)"  # the module path "": the model called itself


def module_label(path: str | None) -> str:
    """An nn.Module instance path as every view names it (not escaped): the path, or
    OUTERMOST_MODULE for "", NO_MODULE for None."""
    if path is None:
        return NO_MODULE
    return path or OUTERMOST_MODULE


def in_module(path: str | None) -> str:
    """" in PATH" (module_label's words) after a chain's name, "" when it ran in no module."""
    return "" if path is None else f" in {module_label(path)}"


def module_first(path: str | None) -> str:
    """"in PATH · " before a chain's frames (where a long chain is cut at its end, the module
    stays in view), "" when it ran in no module."""
    return "" if path is None else f"in {module_label(path)} · "

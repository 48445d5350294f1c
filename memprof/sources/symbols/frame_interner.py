"""Interning of symbolized frame lists (PyTorch's `{filename, line, name}` dicts) into the
recording's `stacks` and `frames` tables: each distinct chain gets one `stack_id`, each distinct
frame one `frame_id`, and table rows are emitted once, at the next `drain_tables()` — the same
contract as the eBPF sources' `StackInterner` (memprof/sources/symbols/stacks.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memprof.model import FrameKind

_FRAME_COLUMNS = ("frame_id", "kind", "function", "module", "file", "line")
# File names of Python code: sources, and code without a file (<string>, <frozen …>, FX's
# <eval_with_key>.N). Anything else in a torch traceback is a C++ frame (stacks="all").
_PYTHON_SUFFIXES = (".py", ".pyw", ".pyx")
_KINDS = {FrameKind.PYTHON.value, FrameKind.NATIVE.value}


@dataclass
class FrameInterner:
    """Stack and frame ids for chains of frame dicts, innermost frame first.

    Ids count up from `first_stack_id` and `first_frame_id`: a recorder that also interns
    eBPF stacks into the same recording gives this interner a range of its own. Frame kind is
    the frame's "kind" where it says (python, native), else "python" for Python files and
    code without a file and "native" for C++ frames."""

    first_stack_id: int = 0
    first_frame_id: int = 0
    _stack_ids: dict[tuple[int, ...], int] = field(default_factory=dict)
    _frame_ids: dict[tuple, int] = field(default_factory=dict)
    _new_stacks: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    _new_frames: list[tuple] = field(default_factory=list)

    def intern(self, frames: Any) -> int | None:
        """The stack id of `frames` (a list of dicts with filename, line, name); None when
        there are no frames. Malformed frames are kept as far as they can be read."""
        if not isinstance(frames, (list, tuple)) or not frames:
            return None
        chain = tuple(self._frame_id(f) for f in frames)
        stack_id = self._stack_ids.get(chain)
        if stack_id is None:
            stack_id = self.first_stack_id + len(self._stack_ids)
            self._stack_ids[chain] = stack_id
            self._new_stacks.append((stack_id, chain))
        return stack_id

    def drain_tables(self) -> tuple[dict[str, list], dict[str, list]]:
        """(stacks columns, frames columns) of the chains and frames interned since the last call."""
        stacks: dict[str, list] = {"stack_id": [], "depth": [], "frame_id": []}
        for stack_id, chain in self._new_stacks:
            stacks["stack_id"].extend([stack_id] * len(chain))
            stacks["depth"].extend(range(len(chain)))
            stacks["frame_id"].extend(chain)
        frames = {name: [row[i] for row in self._new_frames] for i, name in enumerate(_FRAME_COLUMNS)}
        self._new_stacks, self._new_frames = [], []
        return stacks, frames

    def _frame_id(self, frame: Any) -> int:
        key = _frame_key(frame)
        frame_id = self._frame_ids.get(key)
        if frame_id is None:
            frame_id = self.first_frame_id + len(self._frame_ids)
            self._frame_ids[key] = frame_id
            self._new_frames.append((frame_id, *key))
        return frame_id


def _frame_key(frame: Any) -> tuple:
    """(kind, function, module, file, line) of one frame dict."""
    if not isinstance(frame, dict):
        return (FrameKind.NATIVE.value, str(frame), None, None, None)
    file = _text(frame.get("filename"))
    line = frame.get("line")
    line = int(line) if isinstance(line, int) and not isinstance(line, bool) and 0 < line < 2**31 else None
    kind = frame.get("kind") if frame.get("kind") in _KINDS else _kind(file)
    return (kind, _text(frame.get("name")), None, file, line)


def _kind(file: str | None) -> str:
    if file and (file.endswith(_PYTHON_SUFFIXES) or file.startswith("<")):
        return FrameKind.PYTHON.value
    return FrameKind.NATIVE.value


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)

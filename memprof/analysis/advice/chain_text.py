"""How advice rules read and name a chain: its innermost Python frame as "function
(file:line)", the frame of the user's own code, and whether any of its frames' names match a
pattern. Frames are the dicts of
`Facts.chains` (innermost first: kind, function, file, line, module). Pure; no I/O."""
from __future__ import annotations

import re

# Python files that are not the user's code: installed packages and the standard library.
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3")


def is_library_file(file: str | None) -> bool:
    """A Python file that is not the user's code (an installed package, the standard
    library, a frozen or generated module), or no file at all."""
    return not file or file.startswith("<") or any(part in file for part in _LIBRARY_PARTS)


def user_frame(frames: list[dict]) -> dict | None:
    """The innermost Python frame of the user's own code: the line that made the
    allocation, as its author reads it. None when every Python frame is a library's."""
    for frame in frames:
        if frame.get("kind") == "python" and not is_library_file(frame.get("file")):
            return frame
    return None


def where(frame: dict) -> str:
    """"file:line" of a frame (the whole path)."""
    return f"{frame.get('file')}:{frame.get('line')}"


def frame_label(frame: dict) -> str:
    """A Python frame as "function (file:line)", the file's name without its folder (as
    reports print chains)."""
    name = (frame.get("file") or "?").rsplit("/", 1)[-1]
    line = frame.get("line")
    return f"{frame.get('function')} ({name}:{line})" if line is not None else f"{frame.get('function')} ({name})"



def innermost_python(frames: list[dict]) -> dict | None:
    """The innermost Python frame that names its file (library or not), None without one."""
    return next((frame for frame in frames if frame.get("kind") == "python" and frame.get("file")), None)


def python_line(frames: list[dict]) -> str | None:
    """The innermost Python frame as "function (file:line)" (the file's name, without its
    folder, as reports print chains), else the innermost frame's function; None for a chain
    with no frames."""
    for frame in frames:
        if frame.get("kind") == "python":
            return frame_label(frame)
    return str(frames[0].get("function")) if frames else None


def mentions(frames: list[dict], function: re.Pattern, file: re.Pattern | None = None) -> bool:
    """Whether a Python frame's function matches `function`, or the name of its file (without
    the folder) matches `file` (searched, not matched whole). Native and kernel frames are
    not read: the kernel's `kmem_cache_alloc` is no KV cache, nor its `softmax` attention."""
    for frame in frames:
        if frame.get("kind") != "python":
            continue
        name = (frame.get("file") or "").rsplit("/", 1)[-1]
        if function.search(str(frame.get("function") or "")) or (file is not None and file.search(name)):
            return True
    return False

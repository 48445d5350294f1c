"""How advice rules name a chain in words: its innermost Python frame as "function
(file:line)", and whether any of its frames' names match a pattern. Frames are the dicts of
`Facts.chains` (innermost first: kind, function, file, line, module). Pure; no I/O."""
from __future__ import annotations

import re


def python_line(frames: list[dict]) -> str | None:
    """The innermost Python frame as "function (file:line)" (the file's name, without its
    folder, as reports print chains), else the innermost frame's function; None for a chain
    with no frames."""
    for frame in frames:
        if frame.get("kind") == "python":
            where = (frame.get("file") or "?").rsplit("/", 1)[-1]
            line = frame.get("line")
            return f"{frame.get('function')} ({where}:{line})" if line is not None else f"{frame.get('function')} ({where})"
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

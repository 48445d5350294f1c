"""Text from a recording made safe to print: the one place control characters are escaped.

Names in a recording (functions, files, mark labels, the command, modules, categories,
devices) come from the profiled program, so they are untrusted. Printed raw, an ESC or a
C1 control in a file name is a terminal command: OSC 0 sets the window title, OSC 52
writes the clipboard, CSI moves the cursor over what was printed before. Every renderer
that writes for a terminal, a table or a CSV file passes such text through `visible` (or
`escape`, for rich markup); the consoles of `memprof.cli.console` pass every segment
through `visible_segments` as a backstop. JSON needs nothing (json.dumps escapes controls),
nor the HTML page (its data is JSON, its text goes in through textContent).

What is escaped, as visible text that says which character it was:
  C0 (U+0000–U+001F, tab and newline included), DEL (U+007F) and C1 (U+0080–U+009F)
      -> '\\x1b', '\\x07', '\\x9b', …
  the bidirectional overrides and isolates and the line and paragraph separators
  (U+200E, U+200F, U+2028–U+202E, U+2066–U+2069), which reorder or break what a reader
  sees -> '\\u202e', …
Everything else, backslashes included, is kept as it is: the result is for people, not
meant to be parsed back.
"""
from __future__ import annotations

from typing import Iterable

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_INVISIBLE_ORDER = [0x200E, 0x200F, *range(0x2028, 0x202F), *range(0x2066, 0x206A)]
_TABLE = {code: f"\\x{code:02x}" for code in _CONTROLS} | {code: f"\\u{code:04x}" for code in _INVISIBLE_ORDER}
_TABLE_KEEP_NEWLINE = {code: text for code, text in _TABLE.items() if code != 0x0A}


def visible(text: object) -> str:
    """`str(text)` with every control character (module docstring) written as a visible
    escape: 'a\\x1b]0;t\\x07' -> 'a\\\\x1b]0;t\\\\x07'. The result holds no control character
    and no line break, so it stays on its line of a table, a CSV row or a folded stack."""
    return str(text).translate(_TABLE)


def escape(text: object) -> str:
    """`visible(text)` escaped for rich markup ('[' cannot open a style): for a name put
    into a string that rich renders as markup."""
    from rich.markup import escape as markup_escape
    return markup_escape(visible(text))


def has_control(text: str) -> bool:
    """Whether `text` holds a character that `visible` would escape."""
    return any(ord(ch) in _TABLE for ch in text)


def visible_segments(segments: Iterable):
    """rich Segments with their text through `visible`, newlines kept (rich ends each line
    with one): the backstop of every console. Control segments (cursor moves of a live
    progress bar, made by rich, not by a recording) pass unchanged."""
    from rich.segment import Segment
    for segment in segments:
        if segment.control or segment.text.isprintable() or not has_control(segment.text):
            yield segment
        else:
            yield Segment(segment.text.translate(_TABLE_KEEP_NEWLINE), segment.style, segment.control)

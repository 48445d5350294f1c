"""The kernel's text symbols from /proc/kallsyms, as a compact table.

kallsyms lists ~64,000 text symbols here (121,000 lines). The table keeps their names as one
UTF-8 blob with byte offsets, not one Python str each: a str per name made the recorder ~6 MB
larger for a table most recordings resolve a few hundred frames against, and the line-by-line
parse of the file took 0.13-0.26 s of CPU, which a first run pays while bcc compiles on both
CPUs. The file is parsed by numpy (`_parse`), whole, in the shape the kernel prints it
(`%px %c %s[\\t[%s]]`: 16 hex digits on a 64-bit kernel); a line of another shape is parsed by
the line parser `kallsyms_text_symbols`, which says what a text symbol is for both.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from memprof.heap import trim_heap
from memprof.lazy_import import numpy as np
from memprof.sources.symbols.elfsyms import first_of_each_start

# kallsyms types of text symbols: t/T local/global, w/W weak.
_KERNEL_TEXT_TYPES = frozenset("tTwW")
# Since Linux 6.2 (CONFIG_FUNCTION_PADDING_ALIGNMENT) every function has a `__pfx_` twin covering
# the padding before it; resolving to it would hide the function the padding belongs to.
_KERNEL_PADDING_PREFIX = "__pfx_"
CORE_KERNEL = "vmlinux"  # the module of the core kernel's symbols, which kallsyms leaves blank
UNKNOWN = "[unknown]"


@dataclass(frozen=True, slots=True)
class KFrame:
    """A kernel frame: `offset` is bytes from the start of `function` (the raw address if unknown)."""

    function: str
    module: str
    offset: int


def as_addresses(addrs) -> np.ndarray:
    """`addrs` (array-like) as a flat uint64 array."""
    return np.asarray(addrs, dtype=np.uint64).reshape(-1)


def kallsyms_text_symbols(lines: Iterable[str]) -> Iterator[tuple[int, str, str]]:
    """(start, name, module) of each text symbol among kallsyms `lines` (trailing newlines
    allowed), in their order: a line that is not a text symbol with a hex address, a zero
    address or a __pfx_ padding twin is skipped; the core kernel's module is "vmlinux"."""
    module_names: dict[str, str] = {}  # one str per module, not one per symbol
    for line in lines:
        # split(" ", 2), not split(): kallsyms is single-space separated and this halves parsing.
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[1] not in _KERNEL_TEXT_TYPES:
            continue
        name, _, module = parts[2].rstrip("\n").partition("\t")
        try:
            start = int(parts[0], 16)
        except ValueError:
            continue
        if start == 0 or name.startswith(_KERNEL_PADDING_PREFIX):
            continue
        module = module.strip("[]") or CORE_KERNEL
        yield start, name, module_names.setdefault(module, module)


class KernelSymbols:
    """Kernel text symbols from kallsyms, sorted by start address.

    Aliases at one address (e.g. `_text` / `_stext`) resolve to the one kallsyms lists first.
    kallsyms has no sizes, so an address past a module's last function still resolves to that
    function with a large offset. Names are bytes of one blob (`_blob[_at[i]:_end[i]]`),
    decoded for the frames asked; modules are ids into `module_names`.
    """

    def __init__(self, starts: np.ndarray, blob: np.ndarray, at: np.ndarray, end: np.ndarray,
                 module_ids: np.ndarray, module_names: Sequence[str]):
        """Symbol i starts at starts[i], is named blob[at[i]:end[i]] (UTF-8) and lies in
        module_names[module_ids[i]]; in any order, aliases in the order listed."""
        order = np.argsort(starts, kind="stable")
        keep = order[first_of_each_start(starts[order])]  # the first listed of each address
        self.starts: np.ndarray = np.asarray(starts[keep], dtype=np.uint64)
        at, end = np.asarray(at[keep], dtype=np.int64), np.asarray(end[keep], dtype=np.int64)
        if len(blob) > 2 * (int((end - at).sum()) + len(at)):  # kallsyms' whole text: keep the names alone
            blob, at, end = _gathered(blob, at, end)
        self._blob: np.ndarray = blob
        self._at: np.ndarray = at
        self._end: np.ndarray = end
        self._module_ids: np.ndarray = np.asarray(module_ids[keep], dtype=np.uint32)
        self.module_names: list[str] = list(module_names)

    @classmethod
    def load(cls, path: str = "/proc/kallsyms") -> "KernelSymbols":
        """Read kallsyms. Without root (kptr_restrict) every address reads as 0 and the table
        comes out empty, so everything resolves to "[unknown]"; `len()` tells. The parse's
        passing arrays (the 5 MB text among them) are given back to the system once it is
        done: glibc would keep them, and a first run ended 14-29 MiB larger than with the line
        parser's small objects (record also shares one arena: memprof/heap.py)."""
        with open(path, "rb") as f:
            table = cls.from_bytes(f.read())
        trim_heap()
        return table

    @classmethod
    def from_text(cls, text: str) -> "KernelSymbols":
        """Parse kallsyms text: `ADDR TYPE NAME [\\t[MODULE]]` per line."""
        return cls.from_bytes(text.encode("utf-8", "surrogateescape"))

    @classmethod
    def from_bytes(cls, data: bytes) -> "KernelSymbols":
        """Parse kallsyms' bytes (module docstring)."""
        return cls(*_parse(data))

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> "KernelSymbols":
        """Parse kallsyms lines (trailing newlines allowed) with the line parser."""
        symbols = list(kallsyms_text_symbols(lines))
        return cls._of_symbols([s for s, _, _ in symbols], [n for _, n, _ in symbols], [m for _, _, m in symbols])

    @classmethod
    def _of_symbols(cls, starts: Sequence[int], names: Sequence[str], modules: Sequence[str]) -> "KernelSymbols":
        blob, at, end = _packed(names)
        ids, module_names = _ids_of([], modules)
        return cls(np.array(starts, dtype=np.uint64), blob, at, end, ids, module_names)

    def __len__(self) -> int:
        return len(self.starts)

    def name(self, i: int) -> str:
        """The name of symbol i (in address order)."""
        return self._blob[self._at[i]:self._end[i]].tobytes().decode("utf-8", "surrogateescape")

    def module(self, i: int) -> str:
        """The module of symbol i: "vmlinux" for the core kernel."""
        return self.module_names[self._module_ids[i]]

    def all_names(self) -> list[str]:
        """Every name, in address order (a str each: for tests and small tables)."""
        return [self.name(i) for i in range(len(self))]

    def all_modules(self) -> list[str]:
        return [self.module_names[i] for i in self._module_ids.tolist()]

    def lasting(self) -> "KernelSymbols":
        """These symbols less the transient ones (BPF programs, trampolines)."""
        transient = [i for i, m in enumerate(self.module_names) if m == TRANSIENT_MODULE or m.startswith(_TRANSIENT_PREFIX)]
        keep = ~np.isin(self._module_ids, np.array(transient, dtype=np.uint32))
        return KernelSymbols(self.starts[keep], self._blob, self._at[keep], self._end[keep],
                             self._module_ids[keep], self.module_names)

    def with_symbols(self, symbols: Sequence[tuple[int, str]], module: str) -> "KernelSymbols":
        """These symbols and `symbols` ((start, name) pairs) of `module`."""
        blob, at, end = _appended(self._blob, [name for _, name in symbols])
        ids, module_names = _ids_of(self.module_names, [module] * len(symbols))
        starts = np.array([start for start, _ in symbols], dtype=np.uint64)
        return KernelSymbols(np.concatenate([self.starts, starts]), blob, np.concatenate([self._at, at]),
                             np.concatenate([self._end, end]), np.concatenate([self._module_ids, ids]), module_names)

    def kept(self) -> dict[str, np.ndarray]:
        """The arrays symbol_cache.py keeps: names and module names as newline-separated UTF-8."""
        return {"starts": self.starts, "names": _gathered(self._blob, self._at, self._end)[0],
                "module_ids": self._module_ids, "modules": _joined(self.module_names)}

    @classmethod
    def from_kept(cls, kept: dict[str, np.ndarray]) -> "KernelSymbols | None":
        """The symbols `kept()` gave, or None where the arrays do not fit together."""
        module_names = _split(kept["modules"])
        blob, ids, count = kept["names"], kept["module_ids"], len(kept["starts"])
        if module_names is None or len(ids) != count or (count and int(ids.max()) >= len(module_names)):
            return None
        newlines = np.flatnonzero(blob == ord("\n"))
        if len(newlines) != max(count - 1, 0) or (count == 0 and len(blob)):
            return None
        at = np.concatenate([[0], newlines + 1]).astype(np.int64) if count else np.zeros(0, dtype=np.int64)
        end = np.concatenate([newlines, [len(blob)]]).astype(np.int64) if count else np.zeros(0, dtype=np.int64)
        return cls(kept["starts"], blob, at, end, ids, module_names)

    def resolve(self, addrs) -> list[KFrame]:
        """One KFrame per address (array-like of uint64), in order."""
        addrs = as_addresses(addrs)
        idx = np.searchsorted(self.starts, addrs, side="right") - 1
        known = (idx >= 0) & (addrs != 0)
        idx = np.where(known, idx, 0)
        offsets = addrs - self.starts[idx] if len(self.starts) else addrs
        return [
            KFrame(self.name(i), self.module(i), int(off)) if ok else KFrame(UNKNOWN, UNKNOWN, int(a))
            for i, ok, off, a in zip(idx.tolist(), known.tolist(), offsets.tolist(), addrs.tolist())
        ]


# kallsyms "modules" whose symbols live only as long as what made them: BPF programs and
# trampolines ([bpf]), ftrace's and kprobes' trampolines ([__builtin__ftrace], ...). The rest,
# the kernel's and its modules' text, stays as it is until a module loads or unloads.
TRANSIENT_MODULE = "bpf"
_TRANSIENT_PREFIX = "__builtin__"


def _newline_joined_at(lengths: np.ndarray) -> np.ndarray:
    """Where each of pieces of `lengths` bytes starts once they are joined by newlines."""
    at = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths):
        at[1:] = np.cumsum(lengths[:-1] + 1)
    return at


def _packed(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blob, at, end): `names` joined by newlines as UTF-8, and each one's byte range."""
    encoded = [name.encode("utf-8", "surrogateescape") for name in names]
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    at = _newline_joined_at(lengths)
    return np.frombuffer(b"\n".join(encoded), dtype=np.uint8), at, at + lengths


def _appended(blob: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(`blob` with `names` after it, each after a newline; their byte ranges in it)."""
    added, at, end = _packed(names)
    shift = len(blob) + 1
    return np.concatenate([blob, np.frombuffer(b"\n", dtype=np.uint8), added]), at + shift, end + shift


def _ids_of(module_names: Sequence[str], modules: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(the id of each of `modules` among `module_names`, those names with any new one after them)."""
    index = {name: i for i, name in enumerate(module_names)}
    ids = np.array([index.setdefault(module, len(index)) for module in modules], dtype=np.uint32)
    return ids, list(index)


_GATHER_CHUNK = 8192  # names a pass: its index array is ~8192 names' bytes × 8


def _gathered(blob: np.ndarray, at: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the byte ranges [at[i], end[i]) of `blob` in order, joined by newlines; each one's
    range there)."""
    lengths = end - at
    new_at = _newline_joined_at(lengths)
    new_end = new_at + lengths
    total = int(new_end[-1]) if len(at) else 0
    out = np.full(total, ord("\n"), dtype=np.uint8)
    for first in range(0, len(at), _GATHER_CHUNK):
        part = slice(first, first + _GATHER_CHUNK)
        n = lengths[part]
        if not n.sum():
            continue
        offsets = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        out[np.repeat(new_at[part], n) + offsets] = blob[np.repeat(at[part], n) + offsets]
    return out, new_at, new_end


def _joined(texts: list[str]) -> np.ndarray:
    return np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8)


def _split(blob: np.ndarray) -> list[str] | None:
    try:
        text = blob.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.split("\n") if text else []


# --- kallsyms' bytes, parsed whole ---

_ADDRESS_DIGITS = 16  # %px on a 64-bit kernel
_NAME_COLUMN = _ADDRESS_DIGITS + 3  # "ADDR T NAME"
_MODULE_NAME_MAX = 64  # the kernel's MODULE_NAME_LEN is 56 (with its NUL); longer goes to the line parser


@functools.cache
def _hex_digits() -> np.ndarray:
    """Each byte's value as a hex digit; 255 where it is none (built at first use: numpy is
    imported when record decides, memprof/lazy_import.py)."""
    digits = np.full(256, 255, dtype=np.uint8)
    for value, char in enumerate(b"0123456789abcdef"):
        digits[char] = digits[bytes([char]).upper()[0]] = value
    return digits


def _parse(data: bytes):
    """KernelSymbols' arguments from kallsyms' bytes: the lines in the kernel's own shape by
    numpy, the others by kallsyms_text_symbols, each symbol at its line's place (an alias's
    order decides which name an address takes)."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == ord("\n"))
    begins = np.zeros(len(ends), dtype=np.int64)
    begins[1:] = ends[:-1] + 1
    shaped, starts, at, end, module_at, module_end = _shaped_lines(buf, begins, ends)
    odd = np.flatnonzero(~shaped)
    odd_symbols = [(int(line), symbol) for line in odd.tolist()
                   for symbol in kallsyms_text_symbols([data[begins[line]:ends[line]].decode("utf-8", "surrogateescape")])]
    text = _text_symbols(buf, starts, at, end)
    lines = np.flatnonzero(shaped)[text]
    starts, at, end, module_at, module_end = starts[text], at[text], end[text], module_at[text], module_end[text]
    module_ids, module_names = _module_ids(buf, module_at, module_end)
    if odd_symbols:
        return _merged(buf, lines, starts, at, end, module_ids, module_names, odd_symbols)
    return starts, buf, at, end, module_ids, module_names


def _shaped_lines(buf, begins, ends):
    """Which lines are `ADDR T NAME[\\t[MODULE]]` with a 16-digit hex ADDR; for each of
    those (in line order): the address, the name's and the module's byte ranges (an empty
    module range for the core kernel). Column by column: an index array of every line's 16
    digits at once would be ~15 MB."""
    shaped = ends - begins >= _NAME_COLUMN
    rows = np.flatnonzero(shaped)
    b, e = begins[rows], ends[rows]
    ok = (buf[b + _ADDRESS_DIGITS] == ord(" ")) & (buf[b + _ADDRESS_DIGITS + 2] == ord(" "))
    starts = np.zeros(len(rows), dtype=np.uint64)
    for column in range(_ADDRESS_DIGITS):
        digit = _hex_digits()[buf[b + column]]
        ok &= digit < 16
        starts = (starts << np.uint64(4)) | digit.astype(np.uint64)
    at = b + _NAME_COLUMN
    end, module_at, module_end, modular = _name_ends(buf, at, e)
    ok &= _module_as_printed(buf, end, e, module_at, module_end, modular)
    shaped[rows[~ok]] = False
    return shaped, starts[ok], at[ok], end[ok], module_at[ok], module_end[ok]


def _name_ends(buf, at, e):
    """Per line (its name beginning at `at`, the line ending at `e`): where the name ends
    (a tab, or the line's end), the module's byte range after "\\t[" (empty where there is no
    tab), and whether it has a tab."""
    tabs = np.flatnonzero(buf == ord("\t"))
    if not len(tabs):
        return e, e, e, np.zeros(len(at), dtype=bool)
    next_tab = tabs[np.minimum(np.searchsorted(tabs, at), len(tabs) - 1)]
    modular = (next_tab >= at) & (next_tab < e)
    end = np.where(modular, next_tab, e)
    return end, np.where(modular, end + 2, e), np.where(modular, e - 1, e), modular


def _module_as_printed(buf, end, e, module_at, module_end, modular):
    """Per line, whether its module is as the kernel prints it: none, or exactly "[NAME]"
    with no bracket in NAME and NAME at most _MODULE_NAME_MAX bytes (the line parser, which
    strips brackets at both ends, takes the others)."""
    last = len(buf) - 1
    bracketed = ((buf[np.minimum(end + 1, last)] == ord("[")) & (buf[np.maximum(e - 1, 0)] == ord("]"))
                 & (module_end >= module_at) & (module_end - module_at <= _MODULE_NAME_MAX))
    fine = ~modular | bracketed
    if not modular.any():
        return fine
    brackets = np.flatnonzero((buf == ord("[")) | (buf == ord("]")))
    if len(brackets):
        first = brackets[np.minimum(np.searchsorted(brackets, module_at), len(brackets) - 1)]
        fine &= ~(modular & (first >= module_at) & (first < module_end))
    return fine


def _text_symbols(buf, starts, at, end):
    """Which shaped lines are text symbols: type t/T/w/W, a nonzero address, no __pfx_ twin."""
    text = np.isin(buf[at - 2], np.frombuffer(b"tTwW", dtype=np.uint8)) & (starts != 0)
    prefix = _KERNEL_PADDING_PREFIX.encode()
    padding = end - at >= len(prefix)
    last = len(buf) - 1
    for column, char in enumerate(prefix):
        padding &= buf[np.minimum(at + column, last)] == char
    return text & ~padding


def _module_ids(buf, module_at, module_end):
    """(an id per symbol, the module names; the core kernel's, an empty range, "vmlinux").
    A module's symbols come in one run of lines: each line is compared with the one before,
    byte by byte across the lines, and only each run's first is decoded."""
    widths = module_end - module_at
    same = np.zeros(len(widths), dtype=bool)
    same[1:] = widths[1:] == widths[:-1]
    for column in range(int(widths.max()) if len(widths) else 0):
        lines = np.flatnonzero(same[1:] & (column < widths[1:])) + 1
        if not len(lines):
            break
        same[lines] &= buf[module_at[lines] + column] == buf[module_at[lines - 1] + column]
    index: dict[str, int] = {}
    run_ids = [index.setdefault(buf[module_at[line]:module_end[line]].tobytes().decode("utf-8", "surrogateescape")
                                or CORE_KERNEL, len(index))
               for line in np.flatnonzero(~same).tolist()]
    runs = np.cumsum(~same) - 1
    return np.array(run_ids, dtype=np.uint32)[runs] if len(runs) else np.zeros(0, dtype=np.uint32), list(index)


def _merged(buf, lines, starts, at, end, module_ids, module_names, odd_symbols):
    """The shaped lines' symbols and the line parser's, in line order, on one blob."""
    odd_lines = np.array([line for line, _ in odd_symbols], dtype=np.int64)
    blob, odd_at, odd_end = _appended(buf, [name for _, (_, name, _) in odd_symbols])
    odd_ids, names = _ids_of(module_names, [module for _, (_, _, module) in odd_symbols])
    order = np.argsort(np.concatenate([lines, odd_lines]), kind="stable")
    return (np.concatenate([starts, np.array([s for _, (s, _, _) in odd_symbols], dtype=np.uint64)])[order], blob,
            np.concatenate([at, odd_at])[order], np.concatenate([end, odd_end])[order],
            np.concatenate([module_ids, odd_ids])[order], names)

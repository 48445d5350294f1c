"""Loading pickles that may hold only plain data, such as PyTorch's CUDA memory snapshots.

A snapshot (`torch.cuda.memory._dump_snapshot`) is a pickled tree of dicts, lists, tuples,
str, bytes, int, float, bool and None. Unpickling calls whatever a pickle names (`os.system`,
`builtins.eval`, any class), so a snapshot from elsewhere is untrusted input. This unpickler
resolves no name at all: a pickle that names a global (GLOBAL, STACK_GLOBAL, INST, the EXT
codes) or a persistent id is refused with `UnsafeInputError` when that name is read, before
any call that uses it (REDUCE, NEWOBJ, BUILD) can run. The opcodes that build plain
containers and scalars never call out, so every real snapshot loads.

gzip-compressed files (`snapshot.pickle.gz`) are decompressed first.

No input may cost far more memory than its size (a hostile file is refused before it does):
- decompression stops, with BadInputError, past `MAX_GZIP_RATIO` times the compressed size
  (at least `MIN_GZIP_LIMIT` bytes): a 1 MB gzip of zeros would otherwise be 1 GB in memory;
  a gzip file inside a gzip file is refused (decompressing twice would square the ratio);
- the C unpickler sizes its memo by the largest index a PUT or LONG_BINPUT names (9 bytes can
  ask for 2**26 slots, 1.2 GB), so every such index is checked first: a pickler numbers its
  memo entries from 0, one per entry, so an index is never as large as the pickle itself;
- it reserves a BYTEARRAY8's length before reading it, so an opcode whose length runs past
  the end of the file is refused as truncated first.
Only regular files are read: a FIFO would block, /dev/zero never end.
"""
from __future__ import annotations

import io
import os
import pickle
import reprlib
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

from memprof.errors import BadInputError, UnsafeInputError

_GZIP_MAGIC = b"\x1f\x8b"
MAX_GZIP_RATIO = 64        # decompressed bytes per compressed byte, at most
MIN_GZIP_LIMIT = 64 << 20  # bytes a small gzip file may always decompress to
_GZIP_CHUNK = 16 << 20     # bytes decompressed per step (the limit is checked between steps)
_PROTO = pickle.PROTO
_UNSAFE_HINT = ("nothing in it was run; torch.cuda.memory._dump_snapshot did not write this file, so do not "
                "open it with pickle (or torch.load(weights_only=False)) either")
_NOT_SNAPSHOT_HINT = "pass a file written by torch.cuda.memory._dump_snapshot(FILE)"
# What a damaged or foreign pickle raises while it is read (the C unpickler's own errors,
# and those of the constructors its opcodes call: int(), str.decode, list.append, …).
_DAMAGE = (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
           OverflowError, UnicodeDecodeError, RecursionError, MemoryError)


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds containers and scalars; refuses every global and persistent id."""

    def __init__(self, file, source: str):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str):
        raise UnsafeInputError(
            f"{self._source}: refused to unpickle a global ({module}.{name}): "
            "a CUDA snapshot holds only plain data", _UNSAFE_HINT)

    def persistent_load(self, pid):
        raise UnsafeInputError(
            f"{self._source}: refused to unpickle a persistent id: a CUDA snapshot holds only plain data",
            _UNSAFE_HINT)


def loads_plain(data: bytes, source: str = "<bytes>") -> Any:
    """Unpickle `data` allowing only plain data. `source` names it in errors.

    Raises UnsafeInputError for a pickle that names a global or persistent id, BadInputError
    for empty, truncated, non-pickle or amplifying data (module docstring; each a one-line
    message with a hint)."""
    data = _gunzipped(data, source)
    if not data:
        raise BadInputError(f"{source} is empty", _NOT_SNAPSHOT_HINT)
    _check_opcodes(data, source)
    try:
        return _PlainDataUnpickler(io.BytesIO(data), source).load()
    except UnsafeInputError:
        raise
    except _DAMAGE as e:
        raise BadInputError(f"{source}: {_why(e, data)}", _NOT_SNAPSHOT_HINT) from None


def load_plain(path: Path | str) -> Any:
    """Read and unpickle the file at `path` allowing only plain data (see `loads_plain`).
    Raises BadInputError when the file cannot be read."""
    return loads_plain(read_input(path), str(path))


def read_input(path: Path | str) -> bytes:
    """The bytes of the file at `path`, decompressed when gzip. Raises BadInputError."""
    path = Path(path)
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        raise BadInputError(f"{path} does not exist", "check the path") from None
    except IsADirectoryError:
        raise BadInputError(f"{path} is a directory, not a snapshot file", "pass the file inside it") from None
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}", "check the path and its permissions") from None
    data = _gunzipped(data, str(path))
    if data.startswith(_GZIP_MAGIC):  # decompressing again would multiply the limit
        raise BadInputError(f"{path}: a gzip file inside a gzip file", "decompress it yourself and import the result")
    return data


def _read_regular(path: Path) -> bytes:
    """The bytes of `path`, which must be a regular file: a FIFO, a device (/dev/zero) or a
    socket would block or never end. Raises OSError, BadInputError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise IsADirectoryError(21, "Is a directory")
            raise BadInputError(f"{path} is not a regular file", "pass a snapshot or trace file")
        return f.read()


def gzip_limit(compressed_bytes: int) -> int:
    """The most bytes a gzip file of `compressed_bytes` may decompress to."""
    return max(MIN_GZIP_LIMIT, MAX_GZIP_RATIO * compressed_bytes)


def _gunzipped(data: bytes, source: str) -> bytes:
    """`data` decompressed if it is gzip (every member), else `data`. Raises BadInputError
    for a damaged gzip file, or one that decompresses to more than `gzip_limit` bytes."""
    if not data.startswith(_GZIP_MAGIC):
        return data
    limit, out, rest = gzip_limit(len(data)), bytearray(), data
    try:
        while rest.startswith(_GZIP_MAGIC):
            rest = _gunzip_member(rest, out, limit, source)
    except (EOFError, zlib.error) as e:
        raise BadInputError(f"{source}: truncated or damaged gzip file ({e})", _NOT_SNAPSHOT_HINT) from None
    if rest.strip(b"\0"):  # gzip(1) ignores trailing zeros only
        raise BadInputError(f"{source}: damaged gzip file (data after its end)", _NOT_SNAPSHOT_HINT)
    return bytes(out)


def _gunzip_member(data: bytes, out: bytearray, limit: int, source: str) -> bytes:
    """Decompress the gzip member at the start of `data` onto `out`, never past `limit`
    bytes in all; the bytes after the member."""
    stream = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    pending = data
    while pending:
        out += stream.decompress(pending, _GZIP_CHUNK)
        if len(out) > limit:
            raise BadInputError(
                f"{source}: decompresses to more than {limit:,} bytes, the limit for a {len(data):,}-byte gzip "
                "file: a gzip bomb, or an unusually repetitive file",
                "if it is a real snapshot, gunzip it yourself and import the uncompressed file")
        if stream.eof:
            return stream.unused_data
        pending = stream.unconsumed_tail
    raise EOFError("compressed file ended before the end-of-stream marker was reached")


# Opcode → how its argument is laid out (pickletools.opcodes), as tables indexed by the opcode
# byte (the walk below is the hot loop of a large import): none; a fixed number of bytes; a
# little-endian length, then that many bytes; text up to a newline (two lines for GLOBAL, INST).
_NO_ARG, _FIXED, _SIZED, _LINE, _TWO_LINES, _STOP = range(6)
_KIND, _WIDTH, _LENGTH = [_NO_ARG] * 256, [0] * 256, [None] * 256
for _width, _ops in {1: b"Khq\x80\x82", 2: b"M\x83", 4: b"Jjr\x84", 8: b"G\x95"}.items():
    for _op in _ops:
        _KIND[_op], _WIDTH[_op] = _FIXED, _width
for _op, _fmt in (("T", "<i"), ("U", "<B"), ("X", "<I"), ("\x8c", "<B"), ("\x8d", "<Q"), ("B", "<I"), ("C", "<B"),
                  ("\x8e", "<Q"), ("\x96", "<Q"), ("\x8a", "<B"), ("\x8b", "<i")):
    _KIND[ord(_op)], _WIDTH[ord(_op)] = _SIZED, struct.calcsize(_fmt)
    _LENGTH[ord(_op)] = struct.Struct(_fmt).unpack_from
for _op in b"ILFSVpgP":
    _KIND[_op] = _LINE
for _op in b"ci":
    _KIND[_op] = _TWO_LINES
_KIND[ord(".")] = _STOP
del _width, _ops, _op, _fmt
_LONG_BINPUT, _PUT = ord("r"), ord("p")
_U32 = struct.Struct("<I").unpack_from


def _check_opcodes(data: bytes, source: str) -> None:
    """Raise BadInputError if a PUT or LONG_BINPUT names a memo index of len(data) or more
    (module docstring), or an opcode's length runs past the end of the file (the unpickler
    reserves that length first: BYTEARRAY8 can ask for 2^63 bytes). Walks the opcodes
    without building anything; stops at STOP or at bytes it cannot read (the unpickler then
    says what is wrong with them)."""
    index, cut = _scan(data)
    if cut is not None:
        raise BadInputError(f"{source}: truncated pickle (the opcode at byte {cut:,} holds more bytes than the file)",
                            _NOT_SNAPSHOT_HINT)
    if index >= len(data):
        raise BadInputError(
            f"{source}: damaged or hostile pickle (memo index {index:,} in a {len(data):,}-byte file: "
            f"loading it would reserve {index * 16:,} bytes)", _NOT_SNAPSHOT_HINT)


def _scan(data: bytes) -> tuple[int, int | None]:
    """(the largest memo index a PUT or LONG_BINPUT of `data` names, -1 for none; the offset
    of an opcode whose length runs past the end of `data`, None if there is none).
    About 20 ns a byte of a snapshot."""
    i, n, top = 0, len(data), -1
    kinds, widths, lengths = _KIND, _WIDTH, _LENGTH
    while i < n:
        op = data[i]
        kind = kinds[op]
        i += 1
        if kind == _NO_ARG:
            continue
        if kind == _FIXED:
            if op == _LONG_BINPUT and i + 4 <= n:
                top = max(top, _U32(data, i)[0])
            i += widths[op]
        elif kind == _SIZED:
            width = widths[op]
            size = lengths[op](data, i)[0] if i + width <= n else -1
            if size < 0 or i + width + size > n:
                return top, i - 1  # the unpickler would reserve `size` bytes before finding them missing
            i += width + size
        elif kind == _STOP:
            break
        else:
            end = data.find(b"\n", i)
            if kind == _TWO_LINES and end >= 0:
                end = data.find(b"\n", end + 1)
            if end < 0:
                break
            if op == _PUT:
                top = max(top, _put_index(data[i:end], n))
            i = end + 1
    return top, None


def _put_index(text: bytes, size: int) -> int:
    """The memo index of a PUT's text argument (as int() reads it; -1 if it cannot be read)."""
    if len(text) > 24:
        return size  # longer than any index of a real pickle
    try:
        return int(text)
    except ValueError:
        return -1


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel, _REPR.maxlong = 60, 60, 3, 40


def short_repr(value: Any) -> str:
    """A bounded repr of untrusted data for messages: at most a few dozen characters, never
    an error (values nested a million deep, shared a billion times, or 10^5000 included)."""
    try:
        return _REPR.repr(value)
    except Exception:  # a repr that raises (an int past Python's digit limit, …)
        return f"<{type(value).__name__}>"


def _why(error: BaseException, data: bytes) -> str:
    """One line saying what is wrong with the bytes, from the unpickler's error."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, pickle.UnpicklingError) and "load key" in text:
        return f"not a pickle ({text})"
    if not data.startswith(_PROTO):
        # Every pickle of protocol 2 or later (what torch writes) starts with PROTO.
        return f"not a pickle, or a damaged one ({text})"
    if isinstance(error, EOFError) or "truncated" in text:
        return f"truncated pickle ({text})"
    if isinstance(error, (RecursionError, MemoryError)):
        return f"pickle too deep or too large to load ({type(error).__name__})"
    return f"damaged pickle ({type(error).__name__}: {text})"

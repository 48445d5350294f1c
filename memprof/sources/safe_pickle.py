"""Loading pickles that may hold only plain data, such as PyTorch's CUDA memory snapshots.

A snapshot (`torch.cuda.memory._dump_snapshot`) is a pickled tree of dicts, lists, tuples,
str, bytes, int, float, bool and None. Unpickling calls whatever a pickle names (`os.system`,
`builtins.eval`, any class), so a snapshot from elsewhere is untrusted input. This unpickler
resolves no name at all: a pickle that names a global (GLOBAL, STACK_GLOBAL, INST, the EXT
codes) or a persistent id is refused with `UnsafeInputError` when that name is read, before
any call that uses it (REDUCE, NEWOBJ, BUILD) can run. The opcodes that build plain
containers and scalars never call out, so every real snapshot loads.

gzip-compressed files (`snapshot.pickle.gz`) are decompressed first.
"""
from __future__ import annotations

import gzip
import io
import pickle
import zlib
from pathlib import Path
from typing import Any

from memprof.errors import BadInputError, UnsafeInputError

_GZIP_MAGIC = b"\x1f\x8b"
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
    for empty, truncated or non-pickle data (each a one-line message with a hint)."""
    data = _gunzipped(data, source)
    if not data:
        raise BadInputError(f"{source} is empty", _NOT_SNAPSHOT_HINT)
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
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{path} does not exist", "check the path") from None
    except IsADirectoryError:
        raise BadInputError(f"{path} is a directory, not a snapshot file", "pass the file inside it") from None
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}", "check the path and its permissions") from None
    return _gunzipped(data, str(path))


def _gunzipped(data: bytes, source: str) -> bytes:
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise BadInputError(f"{source}: truncated or damaged gzip file ({e})", _NOT_SNAPSHOT_HINT) from None


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

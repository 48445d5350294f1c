"""A minimal reader of the kernel's raw BTF (/sys/kernel/btf/vmlinux).

`memprof record` uses it at start-up to configure BPF programs with constants (struct
offsets, raw tracepoint prototypes) instead of kernel headers, which often do not match
the running kernel. Format: the kernel's Documentation/bpf/btf.rst — a header, a type
section (type ids count from 1; id 0 is `void`) and a string section.

Finding a type by name needs an index of where each type record starts. For the running
kernel's BTF, libbpf (libbpf.so.1, which bcc's library links) parses the file and answers
(`btf__find_by_name_kind`, `btf__type_by_id`): ~10 ms. Elsewhere (another blob, or no
libbpf) one pass over the type section in Python and numpy records each type's start, kind
and name offset: ~60 ms for vmlinux, after ~80 ms of importing numpy. That pass sat before
bcc's compile on a cold `record` (the -D constants come from here when no answers are kept,
btf_answers.py). Members, parameters and names are decoded on demand, in Python, from the
same bytes either way.
"""
from __future__ import annotations

import ctypes
import functools
import struct
from pathlib import Path

from memprof.errors import SourceUnavailableError

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"

_MAGIC = 0xEB9F
_HEADER = "HBBIIIII"  # magic, version, flags, hdr_len, type_off/len, str_off/len
_HEADER_LEN = struct.calcsize("<" + _HEADER)

# BTF_KIND_* values (include/uapi/linux/btf.h).
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
VOLATILE, CONST, RESTRICT, FUNC, FUNC_PROTO, VAR, DATASEC = 9, 10, 11, 12, 13, 14, 15
FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = 16, 17, 18, 19

# Words (u32) that follow the 3-word `struct btf_type`: (fixed, per vlen entry), by kind.
_EXTRA_WORDS = {
    INT: (1, 0), PTR: (0, 0), ARRAY: (3, 0), STRUCT: (0, 3), UNION: (0, 3),
    ENUM: (0, 2), FWD: (0, 0), TYPEDEF: (0, 0), VOLATILE: (0, 0), CONST: (0, 0),
    RESTRICT: (0, 0), FUNC: (0, 0), FUNC_PROTO: (0, 2), VAR: (1, 0), DATASEC: (0, 3),
    FLOAT: (0, 0), DECL_TAG: (1, 0), TYPE_TAG: (0, 0), ENUM64: (0, 3),
}
_KIND_NAMES = {
    "int": (INT,), "ptr": (PTR,), "array": (ARRAY,), "struct": (STRUCT,),
    "union": (UNION,), "enum": (ENUM, ENUM64), "fwd": (FWD,), "typedef": (TYPEDEF,),
    "volatile": (VOLATILE,), "const": (CONST,), "restrict": (RESTRICT,), "func": (FUNC,),
    "func_proto": (FUNC_PROTO,), "var": (VAR,), "datasec": (DATASEC,), "float": (FLOAT,),
    "decl_tag": (DECL_TAG,), "type_tag": (TYPE_TAG,), "enum64": (ENUM64,),
}
# Kinds that only qualify the type they point to (skipped when looking through a type).
_QUALIFIERS = (VOLATILE, CONST, RESTRICT, TYPE_TAG)
# GCC's DWARF (hence pahole's BTF) names some integer types in an order C code never
# uses; spell them the usual way so callers can compare with C prototypes.
_INT_SPELLING = {
    "long unsigned int": "unsigned long", "long int": "long",
    "long long unsigned int": "unsigned long long", "long long int": "long long",
    "short unsigned int": "unsigned short", "short int": "short",
}
_MAX_DEPTH = 64
_NO_BTF_HINT = (
    "this kernel has no BTF (CONFIG_DEBUG_INFO_BTF), which memprof's probes need: they read kernel "
    "structures at the offsets it gives; run a kernel built with CONFIG_DEBUG_INFO_BTF=y"
)


class BtfError(SourceUnavailableError):
    """BTF is missing or unparsable, or a type/member asked for is not in it."""


class Btf:
    """Parsed BTF of one blob; look-ups decode types lazily.

    Sizes and offsets returned are in bytes. Look-ups raise `BtfError` (never another
    exception) when a name is missing or the blob turns out to be malformed.
    """

    def __init__(self, data: bytes, origin: str = "<bytes>", index: "_LibbpfIndex | None" = None):
        """Parse the header of `data` (raw BTF) and index its type section: with `index`
        where one is given (it must describe exactly these bytes), else by a scan."""
        self._origin = origin
        self._order, hdr = _parse_header(data, origin)
        _hdr_len, type_off, type_len, str_off, str_len = hdr
        self._data, self._type_off = data, type_off
        self._strings = data[str_off:str_off + str_len]
        self._index = index or _ScannedIndex(data, self._order, type_off, type_len, self._strings, origin)

    @classmethod
    def load(cls, path: str | Path = VMLINUX_BTF) -> Btf:
        """Read and index the raw BTF file at `path` (default: the running kernel's),
        through libbpf where it is there."""
        parsed = _LibbpfIndex.parse(str(path))
        if parsed is not None:
            data, index = parsed
            return cls(data, origin=str(path), index=index)
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise BtfError(f"cannot read BTF at {path}: {exc.strerror or exc}",
                           hint=_NO_BTF_HINT) from exc
        return cls(data, origin=str(path))

    # ----- public look-ups -------------------------------------------------------------

    def type_name(self, tid: int) -> str:
        """The name of type `tid` ("" for an anonymous one); BtfError where there is no such type."""
        return self._name(self._record(tid, 1)[0])

    def has_type(self, name: str, kind: str = "struct") -> bool:
        """Whether a type `name` of `kind` ("struct", "union", "typedef", "enum", "func",
        … — BTF kind names in lower case) exists. Unknown `kind` raises ValueError."""
        if kind not in _KIND_NAMES:
            raise ValueError(f"unknown BTF kind {kind!r}; one of {sorted(_KIND_NAMES)}")
        return bool(self._find(name, _KIND_NAMES[kind]))

    def struct_size(self, name: str) -> int:
        """Size in bytes of `struct name` (or `union name` if no struct has that name)."""
        return self._info(self._lookup(name, (STRUCT, UNION)))[2]

    def member_offset(self, struct: str, member: str) -> int:  # noqa: A002 (API name)
        """Byte offset of `member` in `struct <struct>` (or union), looking inside
        anonymous nested structs/unions. Raises BtfError if missing or a bitfield."""
        tid = self._lookup(struct, (STRUCT, UNION))
        bit_off = self._member_bit_offset(tid, member)
        if bit_off is None:
            raise BtfError(f"struct {struct} has no member {member!r} in {self._origin}",
                           hint="this kernel version lays the struct out differently")
        return bit_off // 8

    def func_proto_params(self, typedef_name: str) -> list[str]:
        """C spelling of each parameter of the function-pointer typedef `typedef_name`,
        e.g. ["void *", "unsigned long", "const void *", "size_t", …]. A variadic
        prototype ends with "..."."""
        tid = self._lookup(typedef_name, (TYPEDEF,))
        proto = self._strip(self._info(tid)[2], _QUALIFIERS)
        if self._info(proto)[0] == PTR:
            proto = self._strip(self._info(proto)[2], _QUALIFIERS)
        if self._info(proto)[0] != FUNC_PROTO:
            raise BtfError(f"typedef {typedef_name} is not a function pointer in {self._origin}")
        return [self._spell(ptype) if ptype else "..." for _, ptype in self._params(proto)]

    def raw_tracepoint_params(self, tp: str) -> list[str]:
        """Parameter types of tracepoint `tp` as a raw tracepoint program sees them:
        index i is the C type of ctx->args[i] (the leading `void *__data` is dropped)."""
        params = self.func_proto_params(f"btf_trace_{tp}")
        if not params or params[0] != "void *":
            raise BtfError(f"btf_trace_{tp} does not start with the void *__data argument")
        return params[1:]

    # ----- index and records -----------------------------------------------------------

    def _find(self, name: str, kinds: tuple[int, ...]) -> list[int]:
        """Type ids named `name` whose kind is in `kinds`, in `kinds` order then id order."""
        return self._index.find(name, kinds)

    def _lookup(self, name: str, kinds: tuple[int, ...]) -> int:
        """The first type id `_find` gives, preferring one with members; else BtfError."""
        ids = self._find(name, kinds)
        if not ids:
            spelled = "/".join(k for k, v in _KIND_NAMES.items() if v[0] in kinds)
            raise BtfError(f"no {spelled} named {name!r} in {self._origin}",
                           hint="this kernel version does not define it")
        complete = [t for t in ids if self._info(t)[1] > 0]
        return (complete or ids)[0]

    def _name(self, name_off: int) -> str:
        """The string at `name_off` in the string section."""
        end = self._strings.find(b"\0", name_off)
        if name_off >= len(self._strings) or end < 0:
            raise BtfError(f"string offset {name_off} out of range in {self._origin}")
        return self._strings[name_off:end].decode("utf-8", "replace")

    def _words(self, start: int, count: int) -> tuple[int, ...]:
        """`count` words of the type section from word `start`; BtfError past its end."""
        try:
            return struct.unpack_from(f"{self._order}{count}I", self._data, self._type_off + 4 * start)
        except struct.error:
            raise BtfError(f"a type record runs past the end of {self._origin}", hint=_NO_BTF_HINT) from None

    def _record(self, tid: int, count: int, skip: int = 0) -> tuple[int, ...]:
        """`count` words of type `tid`'s record, from its word `skip` (0: name_off, 1: info,
        2: size_or_type, 3…: what its kind adds)."""
        if not 0 < tid < self._index.count:
            raise BtfError(f"type id {tid} out of range in {self._origin}")
        return self._words(self._index.start(tid) + skip, count)

    def _info(self, tid: int) -> tuple[int, int, int]:
        """(kind, vlen, size_or_type) of type `tid`."""
        info, size_or_type = self._record(tid, 2, skip=1)
        return (info >> 24) & 0x1F, info & 0xFFFF, size_or_type

    def _kind_flag(self, tid: int) -> bool:
        """The kind_flag bit of type `tid` (bitfield members; union FWDs)."""
        return bool(self._record(tid, 1, skip=1)[0] >> 31)

    def _entries(self, tid: int, width: int) -> list[tuple[int, ...]]:
        """The `vlen` entries of `width` words that follow type `tid`'s record."""
        kind, vlen, _ = self._info(tid)
        flat = self._record(tid, vlen * width, skip=3 + _EXTRA_WORDS[kind][0])
        return [flat[i * width:(i + 1) * width] for i in range(vlen)]

    def _params(self, proto: int) -> list[tuple[int, int]]:
        """(name_off, type) of each FUNC_PROTO parameter; type 0 marks `...`."""
        return [(p[0], p[1]) for p in self._entries(proto, 2)]

    def _strip(self, tid: int, kinds: tuple[int, ...]) -> int:
        """Follow `tid` through types whose kind is in `kinds`; the first other type."""
        for _ in range(_MAX_DEPTH):  # guards against a cyclic (malformed) chain
            if tid == 0 or self._info(tid)[0] not in kinds:
                return tid
            tid = self._info(tid)[2]
        raise BtfError(f"type chain too long at id {tid} in {self._origin}")

    def _check_depth(self, tid: int, depth: int) -> None:
        """Refuse nesting deeper than any real kernel type (a malformed, cyclic blob)."""
        if depth > _MAX_DEPTH:
            raise BtfError(f"type id {tid} nests too deeply (cyclic?) in {self._origin}")

    # ----- members ---------------------------------------------------------------------

    def _member_bit_offset(self, tid: int, member: str, depth: int = 0) -> int | None:
        """Bit offset of `member` in struct/union `tid`, searching anonymous members."""
        self._check_depth(tid, depth)
        kflag = self._kind_flag(tid)
        for name_off, mtype, raw in self._entries(tid, 3):
            bit_off, bits = (raw & 0xFFFFFF, raw >> 24) if kflag else (raw, 0)
            if name_off == 0:
                inner = self._strip(mtype, _QUALIFIERS + (TYPEDEF,))
                if inner and self._info(inner)[0] in (STRUCT, UNION):
                    found = self._member_bit_offset(inner, member, depth + 1)
                    if found is not None:
                        return bit_off + found
            elif self._name(name_off) == member:
                self._refuse_bitfield(member, mtype, bit_off, bits)
                return bit_off
        return None

    def _refuse_bitfield(self, member: str, mtype: int, bit_off: int, bits: int) -> None:
        """Raise BtfError if the member is a bitfield (kind_flag or INT-encoded)."""
        inner = self._strip(mtype, _QUALIFIERS + (TYPEDEF,))
        int_bitfield = False
        if inner and self._info(inner)[0] == INT:
            enc = self._record(inner, 1, skip=3)[0]
            int_bitfield = (enc & 0xFF) != 8 * self._info(inner)[2] or (enc >> 16) & 0xFF
        if bits or int_bitfield or bit_off % 8:
            raise BtfError(f"member {member!r} is a bitfield; it has no byte offset",
                           hint="read the containing word and mask it instead")

    # ----- C spelling ------------------------------------------------------------------

    def _spell(self, tid: int, depth: int = 0) -> str:
        """C spelling of type `tid`: typedef names kept, `struct X`, `const T`, `T *`;
        integer names as in BTF except GCC's word orders (`long unsigned int` is spelled
        `unsigned long`)."""
        if tid == 0:
            return "void"
        self._check_depth(tid, depth)
        kind, _, ref = self._info(tid)
        name = self._name(self._record(tid, 1)[0])
        if kind == INT:
            return _INT_SPELLING.get(name, name)
        if kind in (FLOAT, TYPEDEF):
            return name
        if kind in (STRUCT, UNION, ENUM, ENUM64, FWD):
            return f"{self._tag(tid, kind)} {name or '<anon>'}"
        if kind == PTR:
            return self._spell_pointer(ref, depth + 1)
        if kind in (CONST, VOLATILE, RESTRICT):
            return _qualify(self._spell(ref, depth + 1), {CONST: "const", VOLATILE: "volatile",
                                               RESTRICT: "restrict"}[kind])
        if kind == TYPE_TAG:
            return self._spell(ref, depth + 1)
        if kind == ARRAY:
            elem, _, nelems = self._record(tid, 3, skip=3)
            return f"{self._spell(elem, depth + 1)} [{nelems}]"
        raise BtfError(f"cannot spell type id {tid} (kind {kind}) in {self._origin}")

    def _spell_pointer(self, target: int, depth: int) -> str:
        """C spelling of a pointer to `target` (`T *`, `T **`, `R (*)(A, B)`)."""
        inner = self._strip(target, (TYPE_TAG,))
        if inner and self._info(inner)[0] == FUNC_PROTO:
            args = [self._spell(t, depth + 1) if t else "..." for _, t in self._params(inner)]
            ret = self._spell(self._info(inner)[2], depth + 1)
            return f"{ret} (*)({', '.join(args) or 'void'})"
        spelled = self._spell(target, depth + 1)
        return spelled + ("*" if spelled.endswith("*") else " *")

    def _tag(self, tid: int, kind: int) -> str:
        """The C tag keyword of a struct/union/enum/forward declaration."""
        if kind == FWD:
            return "union" if self._kind_flag(tid) else "struct"
        return {STRUCT: "struct", UNION: "union", ENUM: "enum", ENUM64: "enum"}[kind]


class _ScannedIndex:
    """Btf's index made by one pass over the type section: each record's start, and numpy
    columns of names and kinds by type id (every type of a name is found)."""

    def __init__(self, data: bytes, order: str, type_off: int, type_len: int, strings: bytes, origin: str):
        import numpy as np
        words = np.frombuffer(data, np.dtype(order + "u4"), type_len // 4, type_off)
        self._starts = _scan_types(words.tolist(), origin)  # Python ints: fast scalar indexing
        heads = np.asarray(self._starts[1:], dtype=np.int64)
        self._name_offs = words[heads]  # by type id - 1
        self._kinds = (words[heads + 1] >> 24) & 0x1F
        self._strings = strings
        self.count = len(self._starts)  # type ids in use, void's 0 included

    def start(self, tid: int) -> int:
        """The word of the type section where record `tid` (0 < tid < count) starts."""
        return self._starts[tid]

    def find(self, name: str, kinds: tuple[int, ...]) -> list[int]:
        """Type ids named `name` whose kind is in `kinds`, in `kinds` order then id order."""
        import numpy as np
        offs = _string_offsets(self._strings, name)
        if not offs:
            return []
        hits = np.flatnonzero(np.isin(self._name_offs, offs)) + 1
        by_kind = {k: [int(t) for t in hits if self._kinds[t - 1] == k] for k in kinds}
        return [t for k in kinds for t in by_kind[k]]


class _LibbpfIndex:
    """Btf's index from libbpf's parse of a BTF file: libbpf's `struct btf`, freed with
    this object. Record starts are asked one type at a time, as Btf reaches them."""

    def __init__(self, lib, btf: int, types_at: int):
        self._lib, self._btf, self._types_at = lib, btf, types_at
        self.count = lib.btf__type_cnt(btf)  # type ids in use, void's 0 included
        self._starts: dict[int, int] = {}

    @classmethod
    def parse(cls, path: str) -> "tuple[bytes, _LibbpfIndex] | None":
        """(the file's raw BTF as libbpf holds it, its index); None where libbpf is not
        there, does not parse the file, or holds it in another byte order (then the scan
        reads the file, and says what is wrong with it)."""
        lib = _libbpf()
        btf = lib.btf__parse(path.encode(), None) if lib is not None else None
        if not btf:
            return None
        size = ctypes.c_uint32()
        raw = lib.btf__raw_data(btf, ctypes.byref(size))
        data = ctypes.string_at(raw, size.value) if raw else b""
        try:
            _, hdr = _parse_header(data, path)
        except BtfError:
            hdr = None
        types_at = raw + hdr[1] if hdr else None
        # Byte-swapped BTF is held in two copies, the types' apart from the raw bytes: there,
        # and wherever the first type is not where the header puts it, the scan reads the file.
        if types_at is None or (lib.btf__type_cnt(btf) > 1 and lib.btf__type_by_id(btf, 1) != types_at):
            lib.btf__free(btf)
            return None
        return data, cls(lib, btf, types_at)

    def start(self, tid: int) -> int:
        """The word of the type section where record `tid` (0 < tid < count) starts."""
        if tid not in self._starts:
            self._starts[tid] = (self._lib.btf__type_by_id(self._btf, tid) - self._types_at) // 4
        return self._starts[tid]

    def find(self, name: str, kinds: tuple[int, ...]) -> list[int]:
        """The first type id named `name` of each kind in `kinds`, in `kinds` order. libbpf
        finds one per kind: the lowest id, which is the one Btf._lookup takes unless it has
        no members and a later one of the same name and kind has (the kernel's BTF is
        deduplicated; types declared but not defined are FWDs)."""
        found = (self._lib.btf__find_by_name_kind(self._btf, name.encode(), kind) for kind in kinds)
        return [tid for tid in found if tid > 0]

    def __del__(self):
        self._lib.btf__free(self._btf)


@functools.lru_cache(maxsize=1)
def _libbpf():
    """libbpf.so.1 with the signatures _LibbpfIndex calls, or None where it cannot be loaded."""
    try:
        lib = ctypes.CDLL("libbpf.so.1")
    except OSError:
        return None
    u32, ptr = ctypes.c_uint32, ctypes.c_void_p
    for name, restype, argtypes in (("btf__parse", ptr, [ctypes.c_char_p, ptr]),
                                    ("btf__raw_data", ptr, [ptr, ctypes.POINTER(u32)]),
                                    ("btf__type_cnt", u32, [ptr]),
                                    ("btf__type_by_id", ptr, [ptr, u32]),
                                    ("btf__find_by_name_kind", ctypes.c_int32, [ptr, ctypes.c_char_p, u32]),
                                    ("btf__free", None, [ptr])):
        try:
            fn = getattr(lib, name)
        except AttributeError:  # a libbpf older than 0.6
            return None
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _string_offsets(strings: bytes, name: str) -> list[int]:
    """Every offset in the string section `strings` where exactly `name` (NUL-terminated) sits."""
    needle, found = name.encode() + b"\0", []
    pos = strings.find(needle)
    while pos >= 0:
        if pos == 0 or strings[pos - 1] == 0:
            found.append(pos)
        pos = strings.find(needle, pos + 1)
    return found


def _qualify(spelled: str, qualifier: str) -> str:
    """Apply a C qualifier: `const T` for values, `T * const` for pointers."""
    return f"{spelled} {qualifier}" if spelled.endswith("*") else f"{qualifier} {spelled}"


def _parse_header(data: bytes, origin: str) -> tuple[str, tuple[int, ...]]:
    """Byte order ("<" or ">") and (hdr_len, type_off, type_len, str_off, str_len) with
    offsets made absolute; BtfError if the header is missing or points out of `data`."""
    if len(data) < _HEADER_LEN:
        raise BtfError(f"{origin} is too short to be BTF ({len(data)} bytes)", hint=_NO_BTF_HINT)
    order = next((o for o in "<>" if struct.unpack_from(o + "H", data)[0] == _MAGIC), None)
    if order is None:
        raise BtfError(f"{origin} is not BTF (bad magic)", hint=_NO_BTF_HINT)
    _, version, _, hdr_len, type_off, type_len, str_off, str_len = \
        struct.unpack_from(order + _HEADER, data)
    if version != 1 or hdr_len < _HEADER_LEN:
        raise BtfError(f"{origin}: unsupported BTF version {version} / header {hdr_len}")
    type_off, str_off = type_off + hdr_len, str_off + hdr_len
    if type_len % 4 or max(type_off + type_len, str_off + str_len) > len(data):
        raise BtfError(f"{origin}: BTF sections run past the end of the data (truncated?)",
                       hint=_NO_BTF_HINT)
    return order, (hdr_len, type_off, type_len, str_off, str_len)


def _scan_types(words: list[int], origin: str) -> list[int]:
    """Word index where each type record starts, indexed by type id (entry 0 is void).

    This is the one pass over all types; kept tight because it dominates load time."""
    starts, i, end, extra = [0], 0, len(words), _EXTRA_WORDS
    append = starts.append
    try:
        while i < end:
            info = words[i + 1]
            fixed, per = extra[(info >> 24) & 0x1F]
            append(i)
            i += 3 + fixed + per * (info & 0xFFFF)
    except (IndexError, KeyError):
        raise BtfError(f"{origin}: malformed BTF type record at byte {4 * i}",
                       hint=_NO_BTF_HINT) from None
    if i != end:
        raise BtfError(f"{origin}: BTF type section is truncated", hint=_NO_BTF_HINT)
    return starts


@functools.lru_cache(maxsize=1)
def load_cached() -> Btf:
    """The running kernel's BTF, parsed once per process (`Btf.load()` with defaults)."""
    return Btf.load()

"""bcc's BPF object rebuilt from a compiled_cache entry: its maps created and programs loaded
by the bpf() system call, not from a compiled module (issue 24: a warm start compiles
nothing). The same class takes a compile child's entry with the maps it made
(compile_child.py: a first run compiles in a child). Imported only when an entry is used:
it subclasses bcc's BPF."""
from __future__ import annotations

import atexit
import base64
import ctypes
import errno
import json
import os
import struct
import threading
from dataclasses import dataclass

from bcc import BPF
from bcc import table as T

from memprof.quiet_threads import start_quiet
from memprof.sources.ebpf.bpfinfo import bpf_call

_MAP_CREATE, _PROG_LOAD, _BTF_LOAD = 0, 5, 18  # bpf() commands (include/uapi/linux/bpf.h)
_OBJ_NAME_LEN = 16
_VERIFIER_LOG_BYTES = 16 * 1024 * 1024
# bcc's table class for each map type memprof's program has (bcc.table.Table picks it from
# the compiled module, which a cached object has not).
_TABLE_CLASSES = {T.BPF_MAP_TYPE_HASH: T.HashTable, T.BPF_MAP_TYPE_ARRAY: T.Array,
                  T.BPF_MAP_TYPE_PROG_ARRAY: T.ProgArray, T.BPF_MAP_TYPE_PERCPU_ARRAY: T.PerCpuArray,
                  T.BPF_MAP_TYPE_STACK_TRACE: T.StackTrace, T.BPF_MAP_TYPE_LRU_HASH: T.LruHash,
                  T.BPF_MAP_TYPE_RINGBUF: T.RingBuf}


class _MapCreateAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * _OBJ_NAME_LEN),
                ("map_ifindex", ctypes.c_uint32), ("btf_fd", ctypes.c_uint32), ("btf_key_type_id", ctypes.c_uint32),
                ("btf_value_type_id", ctypes.c_uint32), ("btf_vmlinux_value_type_id", ctypes.c_uint32),
                ("map_extra", ctypes.c_uint64)]


class _ProgLoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * _OBJ_NAME_LEN), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]


class _BtfLoadAttr(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_log_buf", ctypes.c_uint64), ("btf_size", ctypes.c_uint32),
                ("btf_log_size", ctypes.c_uint32), ("btf_log_level", ctypes.c_uint32)]


def load_btf(raw: bytes) -> int:
    """The fd of BTF object `raw` (what bpfinfo.btf_raw read) loaded into the kernel."""
    data = ctypes.create_string_buffer(raw, len(raw))
    return bpf_call(_BTF_LOAD, _BtfLoadAttr(btf=ctypes.addressof(data), btf_size=len(raw)))


def create_map(m: dict, btf_fd: int | None) -> int:
    """The fd of a new map as entry map `m` describes it; typed by `btf_fd` where it was
    (task storage maps must be: the kernel refuses them without BTF)."""
    typed = btf_fd is not None and (m["btf_key_type_id"] or m["btf_value_type_id"])
    attr = _MapCreateAttr(map_type=m["type"], key_size=m["key_size"], value_size=m["value_size"],
                          max_entries=m["max_entries"], map_flags=m["flags"],
                          map_name=m["name"].encode()[:_OBJ_NAME_LEN - 1],
                          btf_fd=btf_fd if typed else 0,
                          btf_key_type_id=m["btf_key_type_id"] if typed else 0,
                          btf_value_type_id=m["btf_value_type_id"] if typed else 0)
    return bpf_call(_MAP_CREATE, attr)


def load_program(prog_type: int, name: bytes, insns: bytes, license: bytes, kern_version: int,
                 verifier_log: bool = True) -> int:
    """The fd of the loaded program. Raises bcc's own Exception text when the kernel refuses
    it (bpfload.is_load_failure reads it), after writing the verifier's log to fd 2 as bcc
    does (unless not `verifier_log`); retries a check a signal interrupted, as libbpf does."""
    code = ctypes.create_string_buffer(insns, len(insns))
    licence = ctypes.create_string_buffer(license)
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=len(insns) // 8, insns=ctypes.addressof(code),
                         license=ctypes.addressof(licence), kern_version=kern_version,
                         prog_name=name[:_OBJ_NAME_LEN - 1])
    for _ in range(6):  # the first try and 5 retries
        try:
            return bpf_call(_PROG_LOAD, attr)
        except OSError as e:
            failure = e
            if e.errno != errno.EAGAIN:
                break
    if not verifier_log:
        raise Exception(f"Failed to load BPF program {name!r}: {os.strerror(failure.errno)}")
    log = ctypes.create_string_buffer(_VERIFIER_LOG_BYTES)
    attr.log_level, attr.log_size, attr.log_buf = 1, _VERIFIER_LOG_BYTES, ctypes.addressof(log)
    try:
        os.close(bpf_call(_PROG_LOAD, attr))  # loaded on this try after all: the failure stands
    except OSError:
        os.write(2, log.value + b"\n")
    raise Exception(f"Failed to load BPF program {name!r}: {os.strerror(failure.errno)}")


@dataclass
class _Function:
    insns: bytes
    map_refs: list[tuple[int, int]]


class CachedBPF(BPF):
    """bcc's BPF object whose maps and programs come from an entry, not a compiled module.
    bcc's methods that read its compiled module (load_func, get_table, the autoload at
    creation) are replaced; the rest (attach_*, detach_*, cleanup) use only descriptors.
    With `map_fds` (a compile child's maps, in the entry's order, now this object's to close)
    no map is created, and FROM_CACHE is False: this run compiled."""

    FROM_CACHE = True  # meta.json's detail says so (EbpfSource.update_stats)

    def __init__(self, entry: dict, map_fds: list[int] | None = None):  # replaces BPF.__init__, which would compile
        self.kprobe_fds, self.uprobe_fds, self.tracepoint_fds, self.raw_tracepoint_fds = {}, {}, {}, {}
        self.kfunc_entry_fds, self.kfunc_exit_fds, self.lsm_fds = {}, {}, {}
        self.perf_buffers, self.open_perf_events = {}, {}
        self._ringbuf_manager = None
        self.tracefile = None
        self.debug = 0
        self.funcs, self.tables = {}, {}
        self.module = None
        self._map_fds: list[int] = list(map_fds or [])  # given ones are closed by cleanup(), whatever happens
        self._btf_fd: int | None = None
        self._behind: threading.Thread | None = None
        self._loading_lock = threading.Lock()
        self._name_locks: dict[bytes, threading.Lock] = {}
        atexit.register(self.cleanup)
        self._verifier_log = False  # a refusal now is compiled_cache.load's None: the compile then shows it
        try:
            self._license = entry["license"].encode()
            self._kern_version = int(entry["kern_version"])
            self._maps = entry["maps"]
            self._map_index = {m["name"].encode(): i for i, m in enumerate(self._maps)}
            self._functions = {f["name"].encode(): _Function(base64.b64decode(f["insns"]),
                                                             [tuple(r) for r in f["map_refs"]])
                               for f in entry["functions"]}
            if map_fds is not None:
                self.FROM_CACHE = False
                if len(self._map_fds) != len(self._maps):
                    raise ValueError(f"{len(self._map_fds)} map descriptors for {len(self._maps)} maps")
            else:
                if entry.get("btf"):
                    self._btf_fd = load_btf(base64.b64decode(entry["btf"]))
                for m in self._maps:
                    self._map_fds.append(create_map(m, self._btf_fd))
            self._trace_autoload()
        except BaseException:
            self.cleanup()  # what was made so far: no map, program or attachment outlives a failed entry
            atexit.unregister(self.cleanup)
            raise
        self._verifier_log = True

    def _trace_autoload(self) -> None:
        """What BPF.__init__ does for the prefixes compiled_cache.exported lets through."""
        for name in self._functions:
            if name.startswith(b"tracepoint__"):
                self.attach_tracepoint(tp=name[len(b"tracepoint__"):].replace(b"__", b":"), fn_name=name)
            elif name.startswith(b"raw_tracepoint__"):
                self.attach_raw_tracepoint(tp=name[len(b"raw_tracepoint__"):], fn_name=name)

    def load_func(self, func_name, prog_type, device=None, attach_type=-1):
        """bcc's load_func, from the entry's instructions. A program the thread of
        `load_behind` is loading is waited for, not loaded twice (one lock per program)."""
        if device is not None or attach_type != -1:
            raise Exception(f"the BPF cache does not load {func_name!r} for a device or an attach type")
        return self._load(func_name, prog_type, self._verifier_log)

    def load_behind(self, programs: list[tuple[str, int]]) -> None:
        """Load `programs` ((name, bcc program type)) on a thread, quietly: one the kernel
        refuses is loaded again by the foreground call that needs it, which shows why."""
        def load_all() -> None:
            for name, kind in programs:
                try:
                    self._load(name, kind, verifier_log=False)
                except Exception:  # bcc's bare Exception text, as load_func raises it
                    pass
        self._behind = start_quiet(threading.Thread(target=load_all, name="memprof-load-behind", daemon=True))

    @property
    def loads_behind(self) -> bool:
        """Whether `load_behind` was given programs (LibraryProbes then leaves their check to it)."""
        return self._behind is not None

    def wait_behind(self) -> None:
        """Block until the thread of `load_behind`, if any, has loaded what it was given."""
        behind = self._behind
        if behind is not None and behind is not threading.current_thread():
            behind.join()

    def _load(self, func_name, prog_type, verifier_log: bool):
        func_name = func_name.encode() if isinstance(func_name, str) else func_name
        with self._loading_lock:  # the early loads run on several threads
            lock = self._name_locks.setdefault(func_name, threading.Lock())
        with lock:
            if func_name in self.funcs:
                return self.funcs[func_name]
            function = self._functions.get(func_name)
            if function is None:
                raise Exception("Unknown program %s" % func_name)
            fd = load_program(prog_type, func_name, self._with_map_fds(function), self._license, self._kern_version,
                              verifier_log=verifier_log)
            fn = BPF.Function(self, func_name, fd)
            self.funcs[func_name] = fn
            return fn

    def _with_map_fds(self, function: _Function) -> bytes:
        """The function's instructions with each map reference set to this object's map fd."""
        insns = bytearray(function.insns)
        for at, map_index in function.map_refs:
            struct.pack_into("<i", insns, at * 8 + 4, self._map_fds[map_index])
        return bytes(insns)

    def get_table(self, name, keytype=None, leaftype=None, reducer=None):
        name = name.encode() if isinstance(name, str) else name
        if name not in self._map_index:
            raise KeyError(name)
        map_id = self._map_index[name]
        m = self._maps[map_id]
        keytype = keytype or BPF._decode_table_type(json.loads(m["key_desc"]))
        leaftype = leaftype or BPF._decode_table_type(json.loads(m["leaf_desc"]))
        if m["type"] not in _TABLE_CLASSES:
            raise Exception("Unknown table type %d" % m["type"])  # bcc's own words
        cls = _TABLE_CLASSES[m["type"]]
        args = (self, map_id, self._map_fds[map_id], keytype, leaftype)
        if cls is T.PerCpuArray:
            table = cls(*args, reducer=reducer)
        elif cls is T.RingBuf:
            table = cls(*args, name)
        else:
            table = cls(*args)
        # bcc's tables read these from the compiled module, which a cached object has not
        table.ttype, table.flags, table.max_entries = m["type"], m["flags"], m["max_entries"]
        return table

    def close(self) -> None:
        self.wait_behind()  # its loads use the maps closed here
        super().close()
        for fd in self._map_fds:
            os.close(fd)
        self._map_fds = []
        if self._btf_fd is not None:
            os.close(self._btf_fd)
            self._btf_fd = None



"""bcc's Python without bcc's compiler until a compile needs it (issue 24: size and start-up).

bcc's Python loads libbcc.so.0 as it is imported: bcc's loader with clang and LLVM linked
in, ~60 MB of the recorder's resident memory and ~60-80 ms before anything runs. A warm start
(compiled_cache.py) compiles nothing: what it calls of libbcc (attach, detach, map
operations) is libbcc's libbpf part, which bcc builds from the same sources into
libbcc_bpf.so.0 as well, shipped beside it (Debian's libbpfcc has both).

`install()` makes bcc's own import bind its `lib` to a `LazyLibbcc`: a function that
libbcc_bpf.so.0 has comes from there; any other (the module API a compile uses:
bpf_module_create_c_from_string, bpf_table_fd, bcc_func_load, ...) is a `_Deferred` that
loads the whole libbcc.so.0 at its first call, with the argtypes and restype bcc declared.
So a cold start compiles as before, loading the compiler when it begins to compile.

bcc's libbcc.py does `lib = ct.CDLL("libbcc.so.0", use_errno=True)` at import. The import of
that one module runs with `ctypes.CDLL` diverted for that one name; nothing of bcc is
changed. Where libbcc_bpf.so.0 is missing, bcc loads libbcc.so.0 as it always did.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
import threading

from memprof.proc_text import proc_text

WHOLE = "libbcc.so.0"      # the name bcc's libbcc.py loads
BPF_PART = "libbcc_bpf.so.0"
_MODULE = "bcc.libbcc"

# bcc's TableBase.__init__ asks these of `bpf.module`, which a CachedBPF has not (None): the
# whole libbcc answers them for a null module with these (bcc_common.cc), and
# CachedBPF.get_table then sets the entry's own values. Answered here without loading it.
_NULL_MODULE_ANSWERS = {"bpf_table_type_id": -1, "bpf_table_flags_id": -1, "bpf_table_max_entries_id": 0}


class _Deferred:
    """A function of the whole libbcc, found at its first call. Holds what bcc's import sets
    on it (restype, argtypes, errcheck) until then; ctypes' defaults otherwise."""

    def __init__(self, lib: "LazyLibbcc", name: str):
        self._lib, self._name, self._function = lib, name, None
        self.restype = ctypes.c_int
        self.argtypes = None

    def __call__(self, *args):
        if self._name in _NULL_MODULE_ANSWERS and args and not args[0] and self._function is None:
            return _NULL_MODULE_ANSWERS[self._name]
        function = self._function
        if function is None:
            function = getattr(self._lib.whole(), self._name)
            function.restype, function.argtypes = self.restype, self.argtypes
            if hasattr(self, "errcheck"):
                function.errcheck = self.errcheck
            self._function = function
        return function(*args)


class LazyLibbcc:
    """What bcc's `lib` is once `install()` ran: libbcc_bpf.so.0's functions, and the whole
    libbcc.so.0's loaded at the first call of one the former lacks. Raises OSError where
    libbcc_bpf.so.0 cannot be loaded (the diverted import then loads libbcc.so.0 itself)."""

    def __init__(self):
        self._part = ctypes.CDLL(BPF_PART, use_errno=True)
        self._whole: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            function = getattr(self._part, name)
        except AttributeError:
            function = _Deferred(self, name)
        setattr(self, name, function)  # found once, as ctypes.CDLL does
        return function

    def whole(self) -> ctypes.CDLL:
        """libbcc.so.0, loaded at the first call (the compiler comes with it)."""
        with self._lock:
            if self._whole is None:
                self._whole = ctypes.CDLL(WHOLE, use_errno=True)
            return self._whole

    @property
    def whole_loaded(self) -> bool:
        return self._whole is not None


class _DivertingLoader(importlib.abc.Loader):
    """bcc.libbcc's own loader, run with ctypes.CDLL("libbcc.so.0") giving a LazyLibbcc."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        with _cdll_diverted():
            self._inner.exec_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _DivertingLoader(spec.loader)
        return spec


@contextlib.contextmanager
def _cdll_diverted():
    """ctypes.CDLL, for the one name, gives a LazyLibbcc while bcc.libbcc is executed (under
    the import lock, a few milliseconds); every other name, and a missing libbcc_bpf.so.0,
    goes to ctypes.CDLL itself."""
    real = ctypes.CDLL

    def diverting(name, *args, **kwargs):
        if name == WHOLE:
            try:
                return LazyLibbcc()
            except OSError:
                pass
        return real(name, *args, **kwargs)

    ctypes.CDLL = diverting
    try:
        yield
    finally:
        ctypes.CDLL = real


def install() -> None:
    """Make the next import of bcc bind a LazyLibbcc. Does nothing once bcc.libbcc is imported
    (its `lib` is what it is), or when already installed."""
    if _MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def libbcc_path() -> str:
    """The path of libbcc.so.0 as this process has it or would load it: the mapped file when
    the whole library is loaded, else the one beside the mapped libbcc_bpf.so.0 (the loader
    finds both in the same folders); the bare soname when neither is mapped."""
    import bcc.libbcc  # noqa: F401  (its import maps one of them)
    mapped = _mapped_paths()
    for path in mapped:
        if "/libbcc.so" in path:
            return path
    for path in mapped:
        if "/libbcc_bpf.so" in path:
            return os.path.realpath(os.path.join(os.path.dirname(path), WHOLE))
    return WHOLE


def _mapped_paths() -> list[str]:
    return [line.split(" ")[-1] for line in proc_text("/proc/self/maps").splitlines() if "/libbcc" in line]

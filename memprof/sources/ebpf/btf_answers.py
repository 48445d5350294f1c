"""What memprof asks of the running kernel's BTF, kept across runs (issue 24: start-up).

The program's -D constants and the kmem attach plan need a few answers from the kernel's BTF
(three struct member offsets for kmem, two for the thread pointer, the kmem tracepoints'
parameters); parsing /sys/kernel/btf/vmlinux to find them takes ~20 ms of `record`'s main
thread (libbpf's parse; ~140 ms with numpy's import where the scan reads it, btf.py) before
the compile (or the cached program's loads) can begin. The answers are kept
in an entry of compiled_cache's folder, with the same rules (root's alone, read with
O_NOFOLLOW, written whole), named by the kernel's build (uname -r and -v) and the BTF file's
size: a question not answered before parses the BTF and is added to the entry.

`kernel_btf()` is what callers use: a `RememberedBtf`, whose answers are kept in that entry
as root with the cache on, and in this process alone otherwise. It answers `member_offset`
and `raw_tracepoint_params` as the parsed BTF (btf.Btf) does, and raises BtfError where the
BTF has no answer (never kept).

A parse holds ~14 MB (libbpf's copy of the 5 MB file, its index, the bytes Python reads of
it) for as long as it is held. A first run's questions are all asked at start-up
(early.begin), which then drops it with `forget_parse()`: a recorder kept it for its whole
run, 14 MB of a first run's peak size (issue 24: ≤ 250 MB on /bin/true).
"""
from __future__ import annotations

import functools
import json
import os
import threading

from memprof.heap import trim_heap
from memprof.sources.ebpf import compiled_cache
from memprof.sources.ebpf.btf import VMLINUX_BTF, Btf


def kernel_btf() -> "RememberedBtf":
    """The running kernel's BTF answers: this process's, and those kept from earlier runs
    where the cache is on (module docstring)."""
    return _remembered()


def forget_parse() -> None:
    """Drop this process's parse of the BTF, if it made one, and give its memory back to the
    system (glibc keeps the freed heap otherwise). A question asked later parses again."""
    if _remembered().forget_parse():
        trim_heap()


@functools.lru_cache(maxsize=1)
def _remembered() -> "RememberedBtf":
    key = _key() if compiled_cache.enabled() else None
    entry = compiled_cache.read_entry(key) if key else None
    answers = entry.get("answers") if entry else None
    return RememberedBtf(key, answers if isinstance(answers, dict) else {})


def _key() -> str | None:
    """The entry's name: this kernel's build and its BTF file's size; None without the file
    (nothing is kept: the parse says why)."""
    try:
        st = os.stat(VMLINUX_BTF)
    except OSError:
        return None
    uname = os.uname()
    return compiled_cache.entry_key("btf answers", uname.release, uname.version, str(st.st_size))


def _parse_btf() -> Btf:
    """The running kernel's BTF, parsed (~20 ms)."""
    return Btf.load()


class RememberedBtf:
    """Answers of the kernel's BTF, kept in the cache entry `key` (None: in this process
    alone); the BTF is parsed only for a question not answered (with the right type), and
    the answer is added. Safe to ask from several threads."""

    def __init__(self, key: str | None, answers: dict):
        self._key = key
        self._answers = answers
        self._parsed: Btf | None = None
        self._lock = threading.Lock()

    def member_offset(self, struct: str, member: str) -> int:  # noqa: A002 (Btf's name)
        """Btf.member_offset: the byte offset of `member` in `struct <struct>`."""
        return self._ask(int, "member_offset", struct, member)

    def raw_tracepoint_params(self, tp: str) -> list[str]:
        """Btf.raw_tracepoint_params: the C type of each of `tp`'s raw tracepoint args."""
        return self._ask(list, "raw_tracepoint_params", tp)

    def forget_parse(self) -> bool:
        """Drop the parse this object holds; whether it held one."""
        with self._lock:
            held, self._parsed = self._parsed is not None, None
        return held

    def _ask(self, kind: type, method: str, *args: str):
        question = json.dumps([method, *args])
        with self._lock:
            answer = self._answers.get(question)
            if type(answer) is not kind or (kind is list and not all(isinstance(a, str) for a in answer)):
                if self._parsed is None:
                    self._parsed = _parse_btf()
                answer = getattr(self._parsed, method)(*args)  # BtfError where it has none: not kept
                self._answers[question] = answer
                if self._key is not None:
                    compiled_cache.write_entry(self._key, {"format": compiled_cache.FORMAT, "key": self._key,
                                                           "answers": self._answers})
        return answer

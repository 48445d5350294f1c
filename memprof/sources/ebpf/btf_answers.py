"""What memprof asks of the running kernel's BTF, kept across runs (issue 24: start-up).

The program's -D constants and the kmem attach plan need a few answers from the kernel's BTF
(three struct member offsets for kmem, two for the thread pointer, the kmem tracepoints'
parameters); parsing /sys/kernel/btf/vmlinux to find them takes ~20 ms of `record`'s main
thread (libbpf's parse; ~140 ms with numpy's import where the scan reads it, btf.py) before
the compile (or the cached program's loads) can begin. The answers are kept
in an entry of compiled_cache's folder, with the same rules (root's alone, read with
O_NOFOLLOW, written whole), named by the kernel's build (uname -r and -v) and the BTF file's
size: a question not answered before parses the BTF and is added to the entry.

`kernel_btf()` is what callers use: a `RememberedBtf` as root with the cache on, else the
parsed BTF itself (btf.load_cached). Both answer `member_offset` and
`raw_tracepoint_params` alike, and raise BtfError where the BTF has no answer (never kept).
"""
from __future__ import annotations

import functools
import json
import os

from memprof.sources.ebpf import compiled_cache
from memprof.sources.ebpf.btf import VMLINUX_BTF, load_cached


def kernel_btf():
    """The running kernel's BTF, or its answers kept from earlier runs (module docstring)."""
    if not compiled_cache.enabled():
        return load_cached()
    return _remembered()


@functools.lru_cache(maxsize=1)
def _remembered() -> "RememberedBtf":
    key = _key()
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


class RememberedBtf:
    """Answers of the kernel's BTF kept in the cache; the BTF is parsed only for a question
    the entry does not answer (with the right type), and the answer is added to it."""

    def __init__(self, key: str | None, answers: dict):
        self._key = key
        self._answers = answers

    def member_offset(self, struct: str, member: str) -> int:  # noqa: A002 (Btf's name)
        """Btf.member_offset: the byte offset of `member` in `struct <struct>`."""
        return self._ask(int, "member_offset", struct, member)

    def raw_tracepoint_params(self, tp: str) -> list[str]:
        """Btf.raw_tracepoint_params: the C type of each of `tp`'s raw tracepoint args."""
        return self._ask(list, "raw_tracepoint_params", tp)

    def _ask(self, kind: type, method: str, *args: str):
        question = json.dumps([method, *args])
        answer = self._answers.get(question)
        if type(answer) is not kind or (kind is list and not all(isinstance(a, str) for a in answer)):
            answer = getattr(load_cached(), method)(*args)  # BtfError where it has none: not kept
            self._answers[question] = answer
            if self._key is not None:
                compiled_cache.write_entry(self._key, {"format": compiled_cache.FORMAT, "key": self._key,
                                                       "answers": self._answers})
        return answer

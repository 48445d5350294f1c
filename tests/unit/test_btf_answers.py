"""The kernel BTF's answers kept across runs (memprof/sources/ebpf/btf_answers.py): the
same answers as a parse of /sys/kernel/btf/vmlinux, from the cache entry alone once kept;
an answer of the wrong type is asked again; an unanswerable question is never kept."""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from memprof.sources.ebpf import btf_answers as A
from memprof.sources.ebpf import compiled_cache as C
from memprof.sources.ebpf.btf import VMLINUX_BTF, BtfError, load_cached

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(VMLINUX_BTF),
                                reason="the cache serves root; needs the kernel's BTF")

QUESTIONS = (("member_offset", "kmem_cache", "size"), ("member_offset", "task_struct", "thread"),
             ("raw_tracepoint_params", "kmalloc"))


@pytest.fixture
def cache_dir(monkeypatch):
    """A cache folder of this test's own, in a folder only root may write (as the real one)."""
    top = Path("/var/cache/memprof-tests") / uuid.uuid4().hex
    monkeypatch.setattr(C, "CACHE_DIR", str(top / "bpf"))
    monkeypatch.delenv(C.OFF_ENV, raising=False)
    A._remembered.cache_clear()
    yield top / "bpf"
    A._remembered.cache_clear()
    shutil.rmtree(top, ignore_errors=True)


def _ask_all(btf) -> list:
    return [getattr(btf, method)(*args) for method, *args in QUESTIONS]


def _parse_forbidden(monkeypatch) -> None:
    def refuse():
        raise AssertionError("the BTF was parsed")
    monkeypatch.setattr(A, "load_cached", refuse)


def test_kept_answers_are_the_parsed_btfs_and_need_no_parse_next_time(cache_dir, monkeypatch):
    parsed = _ask_all(load_cached())
    assert _ask_all(A.kernel_btf()) == parsed
    entry_files = list(cache_dir.glob("*.json"))
    assert len(entry_files) == 1 and entry_files[0].stat().st_mode & 0o777 == 0o600
    A._remembered.cache_clear()  # as a new process
    _parse_forbidden(monkeypatch)
    assert _ask_all(A.kernel_btf()) == parsed


def test_an_answer_of_the_wrong_type_is_asked_again_and_mended(cache_dir, monkeypatch):
    truth = load_cached().member_offset("kmem_cache", "size")
    A.kernel_btf().member_offset("kmem_cache", "size")
    [entry_file] = cache_dir.glob("*.json")
    entry = json.loads(entry_file.read_text())
    entry["answers"][json.dumps(["member_offset", "kmem_cache", "size"])] = "24"
    entry_file.write_text(json.dumps(entry))
    A._remembered.cache_clear()
    assert A.kernel_btf().member_offset("kmem_cache", "size") == truth
    A._remembered.cache_clear()
    _parse_forbidden(monkeypatch)
    assert A.kernel_btf().member_offset("kmem_cache", "size") == truth


def test_a_question_the_btf_cannot_answer_raises_and_is_not_kept(cache_dir):
    with pytest.raises(BtfError):
        A.kernel_btf().member_offset("kmem_cache", "no_such_member_here")
    assert list(cache_dir.glob("*.json")) == []


def test_with_the_cache_off_the_btf_is_parsed(cache_dir, monkeypatch):
    monkeypatch.setenv(C.OFF_ENV, "0")
    assert A.kernel_btf() is load_cached()
    assert list(cache_dir.glob("*.json")) == []

"""The kernel BTF's answers kept across runs (memprof/sources/ebpf/btf_answers.py): the
same answers as a parse of /sys/kernel/btf/vmlinux, from the cache entry alone once kept;
an answer of the wrong type is asked again; an unanswerable question is never kept; the
parse is held until forgotten, and its memory then given back."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
    monkeypatch.setattr(A, "_parse_btf", refuse)


def _parses_counted(monkeypatch) -> list:
    """A list that grows by one at each parse of the BTF."""
    parses, parse = [], A._parse_btf

    def counted():
        parses.append(1)
        return parse()
    monkeypatch.setattr(A, "_parse_btf", counted)
    return parses


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


def test_with_the_cache_off_the_answers_are_the_processs_alone(cache_dir, monkeypatch):
    monkeypatch.setenv(C.OFF_ENV, "0")
    parses = _parses_counted(monkeypatch)
    assert _ask_all(A.kernel_btf()) == _ask_all(load_cached())
    assert _ask_all(A.kernel_btf()) == _ask_all(load_cached())  # asked again: answered, not parsed
    assert len(parses) == 1
    assert not cache_dir.exists() or list(cache_dir.glob("*.json")) == []


def test_one_parse_answers_every_question_until_it_is_forgotten(cache_dir, monkeypatch):
    parses = _parses_counted(monkeypatch)
    btf = A.kernel_btf()
    _ask_all(btf)
    assert len(parses) == 1
    A.forget_parse()
    assert btf.forget_parse() is False  # nothing held any more
    assert btf.member_offset("kmem_cache", "size") == load_cached().member_offset("kmem_cache", "size")
    assert len(parses) == 1  # answered from what was asked
    btf.member_offset("kmem_cache", "object_size")  # a new question parses again
    assert len(parses) == 2


_MEASURED = """
from memprof.sources.ebpf import btf_answers as A
def rss_anon_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
before = rss_anon_kib()
A.kernel_btf().member_offset("kmem_cache", "size")
held = rss_anon_kib()
A.forget_parse()
print(before, held, rss_anon_kib())
"""


def test_a_forgotten_parse_gives_its_memory_back():
    """A parse holds ~14 MB (libbpf's copy of the 5 MB file, its index, the bytes read);
    forgotten, the process is within 2 MB of its size before it (glibc keeps ~8 MB of the
    freed heap without the trim). In a fresh process, with the cache off (so it parses):
    what earlier tests freed would change the heap's layout here."""
    env = dict(os.environ, **{C.OFF_ENV: "0"})
    out = subprocess.run([sys.executable, "-c", _MEASURED], env=env, capture_output=True, text=True, check=True)
    before, held, after = map(int, out.stdout.split())
    assert held - before >= 8 * 1024, (before, held)
    assert after - before <= 2 * 1024, (before, held, after)


def test_start_up_asks_what_a_recording_asks_and_then_forgets_the_parse(cache_dir, monkeypatch):
    """early.begin's questions (program_source's) and the kmem attach plan's, which the
    compile thread and the attach ask later, are all answered by one parse, which start-up
    then drops: a first run's recorder held it (~14 MB) for its whole run."""
    from memprof.sources.ebpf import early
    from memprof.sources.ebpf.kmem import KmemOptions, plan_attach
    from memprof.sources.ebpf.loading import program_source
    from memprof.sources.ebpf.options import EbpfOptions
    parses = _parses_counted(monkeypatch)
    options = EbpfOptions(kmem=KmemOptions())
    program_source(options, options.enabled)
    early._ask_the_rest_and_forget_the_btf(options)
    assert len(parses) == 1
    assert A._remembered().forget_parse() is False  # not held
    _parse_forbidden(monkeypatch)
    assert plan_attach()  # answered from what start-up asked
    program_source(options, options.enabled)

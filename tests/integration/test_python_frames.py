"""Python frames read from BPF: real eBPF, real interpreters, known functions at known lines.

examples/py_frames.py makes each allocation three Python calls deep (X_inner ← X_middle ←
X_outer) from lines marked `# line: NAME`, and keeps it until exit, so `report leaks` lists
it with its chain. Every chain must name the three functions, innermost first, with the
example's file and the marked lines, after the kernel and native frames.

Interpreters: the venv's (Debian's CPython 3.11, with torch), and pyenv's 3.10, 3.12 and 3.13
where this machine has them (the machine image carries pyenv; each is skipped with the
reason when missing). CPython 3.9, which memprof does not support, must give native frames
only and say why in meta.json.

Those record with `+native`, whose traps slow the interpreter's start; every supported version
is also recorded with the default sources, on examples/py_early.py, whose pipe comes right
after the interpreter starts (a shared libpython's process used to be registered too late).
"""
from __future__ import annotations

import glob
import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "py_frames.py"
NATIVE_BYTES, TENSOR_BYTES, THREAD_A_BYTES, THREAD_B_BYTES = 777_777, 3_333_333, 111_111, 222_222
DEEP_BYTES, DEEP_FRAMES = 444_444, 40
THREAD_ROUNDS = 300


def marked_lines() -> dict[str, int]:
    """`# line: NAME` markers of the example: NAME -> line number."""
    lines = {}
    for number, text in enumerate(EXAMPLE.read_text().splitlines(), start=1):
        if m := re.search(r"# line: (\w+)", text):
            lines[m.group(1)] = number
    return lines


LINES = marked_lines()


def pyenv_python(minor: int) -> str:
    found = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
    if not found:
        pytest.skip(f"CPython 3.{minor} is not installed here (looked for pyenv's /root/.pyenv/versions/3.{minor}.*)")
    return found[-1]


def record_example(run_memprof, tmp_path: Path, python: str, *args: str) -> Path:
    recording = tmp_path / "frames.memprof"
    # Every allocation these tests look for is 111,111 bytes or more, so sampling the libc heap
    # at 64 KiB keeps each of them (probability min(1, size/N) = 1, weight 1) and drops most of
    # the millions of small ones `import torch` makes: unsampled, those overran the ring buffer
    # (1.3-2.5 M events lost a run here), and whether the allocations made right after the
    # import survived was chance.
    result = run_memprof("record", "-q", "-o", recording, "--sources", "+native", "--native-sample-bytes", "64KiB",
                         "--", python, EXAMPLE, *args, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, f"record exited {result.returncode}\n{result.stderr}"
    return recording


def findings(leaks_json, recording: Path) -> list[dict]:
    return leaks_json(recording, "--top", "100000", "--min-age", "0")["findings"]


def python_frames(finding: dict) -> list[tuple[str, str, int]]:
    return [(f["function"], f["file"], f["line"]) for f in finding["stack"] if f["kind"] == "python"]


def expected(prefix: str) -> list[tuple[str, str, int]]:
    return [(f"{prefix}_{part}", str(EXAMPLE), LINES[f"{prefix}_{part}"]) for part in ("inner", "middle", "outer")]


def chains_of(found: list[dict], prefix: str) -> list[dict]:
    """Findings whose chain holds the function PREFIX_inner."""
    return [f for f in found if any(fn == f"{prefix}_inner" for fn, _, _ in python_frames(f))]


def assert_reads_top_down(finding: dict, prefix: str) -> None:
    """Three Python frames innermost first, at the marked lines, after every kernel and native frame."""
    frames = python_frames(finding)
    assert frames[:3] == expected(prefix), json.dumps(finding["stack"], indent=1)
    kinds = [f["kind"] for f in finding["stack"]]
    first_python = kinds.index("python")
    assert all(k == "python" for k in kinds[first_python:first_python + 3])
    assert "kernel" not in kinds[first_python:]  # every kernel frame before the Python ones


def describe(found: list[dict]) -> str:
    return "\n".join(f"{f['layer']} {f['live_count']}x {f['live_bytes']} {python_frames(f)[:4]}" for f in found[:20])


# ---- the venv's interpreter (Debian CPython 3.11), with torch and threads ----

@pytest.fixture(scope="module")
def venv_recording(tmp_path_factory, run_memprof) -> Path:
    pytest.importorskip("torch")
    return record_example(run_memprof, tmp_path_factory.mktemp("venv"), sys.executable,
                          "--torch", "--threads", str(THREAD_ROUNDS), "--deep")


def test_libc_block_names_its_three_python_callers(venv_recording, leaks_json):
    found = findings(leaks_json, venv_recording)
    native = [f for f in chains_of(found, "native") if f["layer"] == "native_heap" and f["live_bytes"] == NATIVE_BYTES]
    assert len(native) == 1, describe(found)
    assert_reads_top_down(native[0], "native")


def test_pipe_kernel_chain_reads_kernel_native_python(venv_recording, leaks_json):
    found = findings(leaks_json, venv_recording)
    pipe = [f for f in chains_of(found, "pipe") if f["layer"] == "kernel_slab"]
    assert pipe, describe(found)
    for finding in pipe:
        assert_reads_top_down(finding, "pipe")
    functions = {f["function"] for finding in pipe for f in finding["stack"] if f["kind"] == "kernel"}
    assert any(fn.startswith("do_pipe2") for fn in functions), functions


def test_torch_tensor_names_its_three_python_callers(venv_recording, leaks_json):
    found = findings(leaks_json, venv_recording)
    tensors = [f for f in chains_of(found, "tensor") if f["layer"] == "torch_cpu"]
    assert [(f["live_bytes"], f["live_count"]) for f in tensors] == [(TENSOR_BYTES, 1)], describe(found)
    assert_reads_top_down(tensors[0], "tensor")


def test_two_threads_allocating_at_once_get_their_own_stacks(venv_recording):
    """Threads A and B call malloc (ctypes drops the GIL around it) while a third spins in
    Python: each block must carry its own thread's frames, never the other's or the GIL holder's.
    Checked per allocation event (a finding may also hold the `held` list's own growth)."""
    for prefix, size in (("thread_a", THREAD_A_BYTES), ("thread_b", THREAD_B_BYTES)):
        chains = block_chains(venv_recording, size)
        assert len(chains) == THREAD_ROUNDS, len(chains)
        for frames in chains:
            assert frames[:3] == expected(prefix), frames


def assert_deep_chain(recording: Path) -> None:
    """The block allocated DEEP_FRAMES calls of deep() down carries every one of them, innermost
    first, then deep_outer: frames ~0.5 KiB each, spanning several pages and (3.11+) more than
    one data-stack chunk, which BPF reads a page at a time."""
    chains = block_chains(recording, DEEP_BYTES)
    assert len(chains) == 1, chains
    frame = lambda name, marker: (name, str(EXAMPLE), LINES[marker])  # noqa: E731
    want = [frame("deep_inner", "deep_inner"), frame("deep", "deep_bottom"),
            *[frame("deep", "deep")] * (DEEP_FRAMES - 1), frame("deep_outer", "deep_outer")]
    assert chains[0][:len(want)] == want, chains[0]


def test_forty_large_frames_deep_are_all_named_in_order(venv_recording):
    assert_deep_chain(venv_recording)


def block_chains(recording: Path, size: int) -> list[list[tuple]]:
    """Python frames (function, file, line), innermost first, of each native_heap allocation
    of exactly `size` bytes."""
    from memprof.recording import open_recording
    rec = open_recording(recording)
    events = rec.events
    blocks = events[(events["layer"] == "native_heap") & (events["action"] == "alloc") & (events["size_bytes"] == size)]
    return [[(f["function"], f["file"], f["line"]) for f in rec.stack_frames(int(sid)) if f["kind"] == "python"]
            for sid in blocks["stack_id"]]


def test_meta_names_the_interpreter_and_counts_frames(venv_recording):
    python = json.loads((venv_recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]
    notes = python["interpreters"]
    assert any(n["frames"] and n["version"].startswith(f"3.{sys.version_info.minor}.") for n in notes.values()), notes
    assert python["frames"] > 0 and python["not_code_objects"] == 0 and python["map_full"] == 0, python
    assert python["tail_calls_failed"] == 0, python  # every walk's and learning's chain of runs reached its end


RECURSING = """\
import os

def recursing(n):
    if n == 0:
        return recursing_leaf()
    return recursing(n - 1)

def recursing_leaf():
    r, w = os.pipe()  # a new Python stack for each depth, its kernel allocations the event
    os.close(r)
    os.close(w)

for depth in range({first}, {last}):
    recursing(depth)
"""
RECURSING_DEPTHS = range(38, 58)  # chains of depth + 3 frames, under PY_MAX_FRAMES (64)


def test_a_code_object_recurring_in_a_new_stack_is_read_once(tmp_path, run_memprof):
    """The learning of a new stack reads each distinct code object's head once, not once per
    frame (bpf/python.bpf.c, py_learn_codes): twenty new stacks of 41-60 frames, nearly all
    one function's, save at least 35 reads each. Their chains still name every frame."""
    script = tmp_path / "recursing.py"
    script.write_text(RECURSING.format(first=RECURSING_DEPTHS.start, last=RECURSING_DEPTHS.stop))
    recording = tmp_path / "recursing.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", sys.executable, script, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, f"record exited {result.returncode}\n{result.stderr}"
    python = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]
    # "frames": the frames of every new stack, which a read per frame would read
    assert python["frames"] >= sum(d + 3 for d in RECURSING_DEPTHS), python
    assert python["frames"] - python["code_heads_read"] >= 35 * len(RECURSING_DEPTHS), python
    from memprof.recording import open_recording
    rec = open_recording(recording)
    depths = set()
    line = {text.strip(): n for n, text in enumerate(script.read_text().splitlines(), start=1)}
    leaf, bottom, call, module = (("recursing_leaf", line["r, w = os.pipe()  # a new Python stack for each depth, "
                                                       "its kernel allocations the event"]),
                                  ("recursing", line["return recursing_leaf()"]),
                                  ("recursing", line["return recursing(n - 1)"]), ("<module>", line["recursing(depth)"]))
    for sid in rec.events[rec.events["layer"] == "kernel_slab"]["stack_id"].dropna().unique():
        frames = [(f["function"], f["line"]) for f in rec.stack_frames(int(sid)) if f["kind"] == "python"]
        if frames and frames[0][0] == "recursing_leaf":
            calls = len(frames) - 3  # recursing_leaf, recursing(0), ..., recursing(depth), <module>
            assert frames == [leaf, bottom] + [call] * calls + [module], frames
            depths.add(calls)
    assert depths == set(RECURSING_DEPTHS), sorted(depths)


ALTERNATING = """\
import os, threading

def pipe_from_a():
    r, w = os.pipe()  # line: a
    os.close(r)
    os.close(w)

def pipe_from_b():
    r, w = os.pipe()  # line: b
    os.close(r)
    os.close(w)

def each_thread():
    for _ in range({rounds}):
        pipe_from_a()
        pipe_from_b()

threads = [threading.Thread(target=each_thread) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""
ALTERNATING_ROUNDS = 60


def test_a_system_calls_allocations_share_its_python_stack_and_no_other_calls(tmp_path, run_memprof):
    """A pipe2 makes several slab allocations in one system call: its first walks the Python
    stack, the others take that walk's (bpf/python.bpf.c, emit_alloc's `call`). Two threads
    alternate two callers of os.pipe(), so a stack carried into the next call, or into the
    other thread's, would charge one caller's allocations to the other: each caller must have
    the same number, one pipe's worth per call, with its own line. (Each pipe is closed at
    once: a growing descriptor table would add its allocations to whichever call grew it.)"""
    script = tmp_path / "alternating.py"
    script.write_text(ALTERNATING.format(rounds=ALTERNATING_ROUNDS))
    recording = tmp_path / "alternating.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", sys.executable, script, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, f"record exited {result.returncode}\n{result.stderr}"
    line = {m.group(1): n for n, text in enumerate(script.read_text().splitlines(), start=1)
            if (m := re.search(r"# line: (\w+)", text))}
    from memprof.recording import open_recording
    rec = open_recording(recording)
    slab = rec.events[(rec.events["layer"] == "kernel_slab") & (rec.events["action"] == "alloc")]
    by_caller: dict[str, int] = {}
    for sid, count in slab["stack_id"].dropna().value_counts().items():
        frames = [(f["function"], f["line"]) for f in rec.stack_frames(int(sid)) if f["kind"] == "python"]
        if frames and frames[0][0] in ("pipe_from_a", "pipe_from_b"):
            caller = frames[0][0][-1]
            assert frames[0] == (frames[0][0], line[caller]), frames
            assert frames[1][0] == "each_thread", frames
            by_caller[caller] = by_caller.get(caller, 0) + int(count)
    pipes = 2 * ALTERNATING_ROUNDS  # a caller's, over both threads
    assert set(by_caller) == {"a", "b"}, by_caller
    per_pipe = round(by_caller["a"] / pipes)
    assert per_pipe >= 2, by_caller
    for caller, count in by_caller.items():
        # A pipe2 makes the same allocations each time, but for the odd one the kernel makes
        # now and then (1 in 2,160 in one run); a stack carried into another call would move
        # at least one allocation a pipe, 120 here, from one caller to the other.
        assert abs(count - per_pipe * pipes) <= 3, (caller, by_caller, per_pipe)
    python = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]
    # most allocations of a pipe2 after its first (not those after the thread was switched out)
    assert python["stacks_of_their_call"] >= (per_pipe - 1) * pipes, python

LONG_FUNCTION = """\
import os, time

def long_function(n):
{body}
    r, w = os.pipe()  # line: late
    return r, w

kept = long_function(1)
time.sleep(1.0)  # alive through a flush: its frames are named while it lives
"""


@pytest.mark.parametrize("minor", [11, 12, 13])
def test_a_line_past_bpfs_copy_of_the_line_table_is_named(minor, tmp_path, run_memprof, leaks_json):
    """A function of 900 statements has a line table of ~8 KB (3.11+'s location table), of
    which BPF copies the first 2,048 bytes (PY_LINES_BYTES): its allocation on the last lines
    read line None until the recorder read the rest from the live process (frames.py,
    _whole_line_table). The pipe it keeps is named at its own line, and meta.json counts the
    table read whole. (3.10's table for it is ~1.8 KB: BPF copies it whole.)"""
    python = sys.executable if minor == sys.version_info.minor else pyenv_python(minor)
    script = tmp_path / "long_function.py"
    script.write_text(LONG_FUNCTION.format(body="\n".join(f"    v{i} = n + {i}" for i in range(900))))
    late = next(n for n, text in enumerate(script.read_text().splitlines(), start=1) if "# line: late" in text)
    recording = tmp_path / "long.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", python, script, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, f"record exited {result.returncode}\n{result.stderr}"
    pipes = [f for f in leaks_json(recording)["findings"]
             if f["layer"] == "kernel_slab" and any(p["function"] == "long_function" for p in f["stack"])]
    assert pipes, "no kernel finding through long_function"
    for finding in pipes:
        frame = next(p for p in finding["stack"] if p["function"] == "long_function")
        assert frame["line"] == late, (late, [(p["function"], p["line"]) for p in finding["stack"]])
    python = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]
    assert python["line_tables_read_whole"] >= 1, python


# ---- other CPython minor versions ----

def test_another_minor_version_is_here_to_prove_the_offset_tables():
    """The per-version offsets are proven on real interpreters other than the venv's: at least
    one must be on the machine (the image's pyenv carries 3.10, 3.12 and 3.13), else this fails
    rather than letting every other-version test skip quietly."""
    others = [m for m in (10, 12, 13) if glob.glob(f"/root/.pyenv/versions/3.{m}.*/bin/python3.{m}")]
    assert others, "no CPython 3.10, 3.12 or 3.13 under /root/.pyenv/versions: install one (pyenv install 3.12)"


@pytest.mark.parametrize("minor", [10, 12, 13])
def test_other_minor_versions_give_the_same_chains(minor, tmp_path, run_memprof, leaks_json):
    python = pyenv_python(minor)
    recording = record_example(run_memprof, tmp_path, python, "--threads", "50", "--deep")
    found = findings(leaks_json, recording)
    native = [f for f in chains_of(found, "native") if f["layer"] == "native_heap" and f["live_bytes"] == NATIVE_BYTES]
    assert len(native) == 1, describe(found)
    assert_reads_top_down(native[0], "native")
    pipe = [f for f in chains_of(found, "pipe") if f["layer"] == "kernel_slab"]
    assert pipe, describe(found)
    for finding in pipe:
        assert_reads_top_down(finding, "pipe")
    for prefix, size in (("thread_a", THREAD_A_BYTES), ("thread_b", THREAD_B_BYTES)):
        chains = block_chains(recording, size)
        assert len(chains) == 50 and all(frames[:3] == expected(prefix) for frames in chains), chains[:3]
    assert_deep_chain(recording)
    notes = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]["interpreters"]
    assert any(n["frames"] and n["version"].startswith(f"3.{minor}.") for n in notes.values()), notes


# ---- the default sources: no native probes to slow the start ----

EARLY = REPO / "examples" / "py_early.py"
EARLY_LINES = {m.group(1): n for n, text in enumerate(EARLY.read_text().splitlines(), start=1)
               if (m := re.search(r"# line: (\w+)", text))}


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_default_sources_give_frames_from_the_first_statements(minor, tmp_path, run_memprof, leaks_json):
    """The pipe a script makes as it starts names its three Python callers with the default
    sources (kmem, torch; cuda where an NVIDIA driver is loaded), on every supported version —
    main thread included."""
    python = sys.executable if minor == sys.version_info.minor else pyenv_python(minor)
    recording = tmp_path / "early.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", python, EARLY, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, f"record exited {result.returncode}\n{result.stderr}"
    found = findings(leaks_json, recording)
    pipe = [f for f in chains_of(found, "early") if f["layer"] == "kernel_slab"]
    assert pipe, describe(found)
    want = [(f"early_{p}", str(EARLY), EARLY_LINES[f"early_{p}"]) for p in ("inner", "middle", "outer")]
    for finding in pipe:
        assert python_frames(finding)[:3] == want, json.dumps(finding["stack"], indent=1)
    notes = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]["interpreters"]
    assert any(n["frames"] and n["version"].startswith(f"3.{minor}.") for n in notes.values()), notes


def test_an_unsupported_interpreter_gets_native_frames_and_a_note(tmp_path, run_memprof, leaks_json):
    python = pyenv_python(9)
    recording = record_example(run_memprof, tmp_path, python)
    found = findings(leaks_json, recording)
    assert not any(f["python_frames"] for f in found), describe([f for f in found if f["python_frames"]])
    from memprof.recording import open_recording
    rec = open_recording(recording)
    block = rec.events[(rec.events["layer"] == "native_heap") & (rec.events["size_bytes"] == NATIVE_BYTES)]
    assert len(block) == 1  # recorded, with a native chain and no Python frames
    chain = rec.stacks[rec.stacks["stack_id"] == int(block["stack_id"].iloc[0])].merge(rec.frames, on="frame_id")
    assert len(chain) and set(chain["kind"]) == {"native"}, chain
    notes = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]["interpreters"]
    refused = [n for path, n in notes.items() if "3.9" in path]
    assert refused and refused[0]["frames"] is False and "3.9 is not supported" in refused[0]["why"], notes
    table = run_memprof("report", "leaks", recording, cwd=tmp_path)
    assert "no Python frames for" in table.stdout and "3.9 is not supported" in table.stdout, table.stdout

"""The agent's files → event rows, without root or a GPU.

The CUDA caching allocator cannot run here: `STANDIN_SNAPSHOT` is a stand-in for what
`torch.cuda.memory._snapshot()` returns on a GPU (hand-built from torch's documented format),
passed to the real agent's drain. Everything else is the real code: the agent writes its JSON
lines, AgentSource reads them back and converts them."""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

from memprof.model.meta import ClockAnchor
from memprof.sources.agent_reader.source import AgentSource

MIB = 1 << 20
FRAMES = [{"filename": "/src/train.py", "line": 42, "name": "cache_batch"},
          {"filename": "/src/train.py", "line": 80, "name": "main"}]


def standin_snapshot(entries):
    """A stand-in for torch.cuda.memory._snapshot() on one GPU (not a real snapshot)."""
    return {"segments": [], "device_traces": [entries], "allocator_settings": {"expandable_segments": False}}


def entry(action, addr, size, t_us, frames=FRAMES):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t_us, "frames": frames}


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """The real agent module, writing into tmp_path/rec.memprof/agent."""
    folder = tmp_path / "rec.memprof" / "agent"
    folder.mkdir(parents=True)
    monkeypatch.setenv("MEMPROF_AGENT_DIR", str(folder))
    monkeypatch.syspath_prepend(str(importlib.resources.files("memprof.agent").joinpath("boot")))
    sys.modules.pop("memprof_agent", None)
    module = importlib.import_module("memprof_agent")
    yield module
    sys.modules.pop("memprof_agent", None)


def test_cuda_history_drained_twice_lands_once_on_the_timeline(agent, tmp_path):
    t0 = 1_700_000_000_000_000  # epoch µs
    first = [entry("segment_alloc", 0x7000_0000, 2 * MIB, t0),
             entry("alloc", 0x7000_0000, MIB, t0 + 10), entry("alloc", 0x7010_0000, MIB, t0 + 10)]
    agent.drain_cuda(standin_snapshot(first))
    # The ring buffer still holds the first entries at the next drain: only new ones count,
    # including one in the same microsecond as the last one already written.
    second = first + [entry("alloc", 0x7020_0000, 4096, t0 + 10), entry("free_requested", 0x7000_0000, MIB, t0 + 20),
                      entry("free_completed", 0x7000_0000, MIB, t0 + 30)]
    agent.drain_cuda(standin_snapshot(second))
    agent.flush()

    source = AgentSource(tmp_path / "rec.memprof")
    anchors = [ClockAnchor(monotonic_ns=5_000_000_000, realtime_ns=t0 * 1000 - 1_000_000)]
    events, stacks, frames = source.poll(anchors[-1])
    rows = list(zip(events["layer"], events["action"], events["addr"], events["size_bytes"], events["ts_ns"]))
    base = 5_000_000_000 + 1_000_000  # t0 on the monotonic clock
    assert rows == [
        ("cuda_segment", "alloc", 0x7000_0000, 2 * MIB, base),
        ("cuda_block", "alloc", 0x7000_0000, MIB, base + 10_000),
        ("cuda_block", "alloc", 0x7010_0000, MIB, base + 10_000),
        ("cuda_block", "alloc", 0x7020_0000, 4096, base + 10_000),
        ("cuda_block", "free_requested", 0x7000_0000, MIB, base + 20_000),
        ("cuda_block", "free", 0x7000_0000, MIB, base + 30_000),
    ]
    assert set(events["device"]) == {"cuda:0"}
    names = dict(zip(frames["frame_id"], frames["function"]))
    chain = [names[f] for s, f in zip(stacks["stack_id"], stacks["frame_id"]) if s == events["stack_id"][1]]
    assert chain == ["cache_batch", "main"]
    assert min(stacks["stack_id"]) >= 1 << 48  # apart from the eBPF source's ids
    assert source.poll(anchors[-1]) is None  # nothing new
    assert source.stats().detail["allocator_settings"] == {"expandable_segments": False}


def test_marks_and_a_half_written_line(agent, tmp_path):
    agent.mark("warm-up done")
    agent.flush()
    folder = tmp_path / "rec.memprof" / "agent"
    with open(next(folder.glob("*.jsonl")), "a") as f:
        f.write('{"kind": "mark", "ts_ns": 1')  # the agent is mid-write
    source = AgentSource(tmp_path / "rec.memprof")
    events, _, _ = source.poll(ClockAnchor(0, 0))
    # The first mark begins a step, and keeps its label.
    assert list(events["category"]) == ["step", "warm-up done"] and list(events["step"]) == [1, 1]
    with open(next(folder.glob("*.jsonl")), "a") as f:
        f.write(', "pid": 7, "tid": 7, "label": "late", "step": 1}\n')
    events, _, _ = source.poll(ClockAnchor(0, 0))
    assert list(events["category"]) == ["late"] and list(events["pid"]) == [7]


def test_failures_inside_the_agent_are_reported_not_raised(agent, tmp_path):
    agent.drain_cuda({"device_traces": "not a list of traces"})  # would raise without the guard
    source = AgentSource(tmp_path / "rec.memprof")
    detail = source.stats().detail
    assert detail["failures"] == 1 and detail["failures_first"][0]["where"] == "cuda drain"


def test_a_failure_repeated_at_every_step_is_logged_a_few_times(agent, tmp_path):
    for _ in range(50):
        agent.drain_cuda({"device_traces": "not a list of traces"})
    detail = AgentSource(tmp_path / "rec.memprof").stats().detail
    assert detail["failures"] == agent.MAX_FAILURES_PER_PLACE


def test_a_forked_child_writes_its_own_marks_not_its_parents(agent, tmp_path):
    agent.mark("before the fork")  # pending in the parent when it forks
    child = os.fork()
    if child == 0:  # the child: one mark of its own, written at its exit
        try:
            agent.mark("in the child")
            agent.flush()
        finally:
            os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    agent.flush()
    folder = tmp_path / "rec.memprof" / "agent"
    lines = {int(p.stem): [json.loads(line) for line in p.read_text().splitlines()] for p in folder.glob("*.jsonl")}
    assert set(lines) == {os.getpid(), child}
    assert [(r["pid"], r.get("label")) for r in lines[os.getpid()]] == [(os.getpid(), "before the fork")]
    assert [(r["pid"], r.get("label")) for r in lines[child]] == [(child, "in the child")]


def test_a_record_appended_during_a_flush_waits_for_the_next_one(agent, tmp_path, monkeypatch):
    real_dumps = agent.json.dumps

    def dumps_while_the_program_marks(record, **kwargs):
        if record.get("label") == "first":
            agent.mark("second")  # what the training thread does while the flusher encodes
        return real_dumps(record, **kwargs)

    monkeypatch.setattr(agent.json, "dumps", dumps_while_the_program_marks)
    agent.mark("first")
    agent.flush()
    agent.flush()
    path = next((tmp_path / "rec.memprof" / "agent").glob("*.jsonl"))
    assert [json.loads(line)["label"] for line in path.read_text().splitlines()] == ["first", "second"]


# ---- agent lines are untrusted input -------------------------------------------------------

GOOD = b'{"kind":"mark","ts_ns":%d,"pid":7,"tid":7,"step":1,"label":"good %d"}\n'
NOT_JSON = [b"not json", b"[" * 100_000, b"\xff\xfe{}", b'{"kind":"mark","ts_ns":NaN}',
            b'{"kind":"mark","ts_ns":Infinity}', b'{"kind":"mark","ts_ns":' + b"9" * 5000 + b"}",
            b'{"kind":"mark","ts_ns":5,"pid":7,"tid":7,"step":1,"label":"a\\ud800b"}']  # no Unicode text: a lone surrogate
MALFORMED = [b"[1, 2]", b'"a string"', b"17", b"null", b'{"kind": 5}', b'{"kind":"mark"}',
             b'{"kind":"mark","ts_ns":"12"}', b'{"kind":"mark","ts_ns":1e400}', b'{"kind":"mark","ts_ns":1.5}',
             b'{"kind":"mark","ts_ns":true}', b'{"kind":"mark","ts_ns":' + b"9" * 30 + b"}",
             b'{"kind":"mark","ts_ns":5,"pid":-1}', b'{"kind":"mark","ts_ns":5,"step":"3"}',
             b'{"kind":"mark","ts_ns":5,"label":{"a":1}}', b'{"kind":"tensor","epoch_ns":1,"device":"cuda:999"}',
             b'{"kind":"tensor","epoch_ns":1,"device":["cpu"]}', b'{"kind":"tensor"}',
             b'{"kind":"cuda_trace","entry":[]}', b'{"kind":"cuda_trace","device":"0","entry":{}}',
             b'{"kind":"cuda_trace","entry":{"action":"alloc","addr":-5,"size":1}}',
             b'{"kind":"cuda_trace","entry":{"action":"alloc","addr":1,"size":1,"time_us":1e300}}',
             b'{"kind":"cuda_trace","entry":{"action":"alloc","addr":1,"size":1,"frames":"f"}}',
             b'{"kind":"info","pid":"x"}', b'{"kind":"allocator_settings","settings":' + b"[" * 20 + b"]" * 20 + b"}",
             b'{"kind":"allocator_settings","settings":{"a":' + b'{"a":' * 10 + b"1" + b"}" * 12,
             b'{"kind":"profile","path":"../../etc/shadow"}', b'{"kind":"unknown"}']


def agent_file(tmp_path, name="7.jsonl") -> "Path":
    folder = tmp_path / "rec.memprof" / "agent"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def test_malformed_agent_lines_are_skipped_and_counted_and_the_rest_recorded(tmp_path):
    from memprof.model.meta import RecordingMeta
    from memprof.recording import RecordingWriter, open_recording
    lines = [GOOD % (10, 1), *NOT_JSON, *MALFORMED,
             b'{"kind":"cuda_trace","device":0,"pid":7,"entry":{"action":"alloc","addr":4096,"size":512,'
             b'"time_us":1000,"frames":[{"filename":"t.py","line":3,"name":"f","kind":[1]},{"line":null}]}}',
             GOOD % (20, 2)]
    agent_file(tmp_path).write_bytes(b"\n".join(lines) + b"\n")
    source = AgentSource(tmp_path / "rec.memprof")
    events, stacks, frames = source.poll(ClockAnchor(monotonic_ns=0, realtime_ns=0))
    assert list(events["category"])[:2] == ["good 1", "good 2"]
    assert list(events["action"]) == ["mark", "mark", "alloc"] and events["addr"][2] == 4096
    detail = source.stats().detail
    assert (detail["unreadable_lines"], detail["malformed_lines"]) == (len(NOT_JSON), len(MALFORMED))
    # What poll gave goes into a recording as the session writes it.
    writer = RecordingWriter(tmp_path / "out.memprof", RecordingMeta(memprof_version="0", command=None, start_ns=0))
    writer.append("events", {**events, "seq": range(len(events["ts_ns"]))})
    writer.append("stacks", stacks)
    writer.append("frames", frames)
    writer.finalize(end_ns=10**9)
    assert len(open_recording(tmp_path / "out.memprof").events) == 3


def test_a_line_longer_than_one_read_is_skipped_whole(tmp_path, monkeypatch):
    import memprof.sources.agent_reader.source as agent_module
    monkeypatch.setattr(agent_module, "MAX_READ_BYTES", 100)
    path = agent_file(tmp_path)
    path.write_bytes(b'{"kind":"mark","label":"' + b"x" * 300 + b'"}\n' + GOOD % (5, 1))
    source = AgentSource(tmp_path / "rec.memprof")
    labels = []
    for _ in range(10):
        tables = source.poll(ClockAnchor(0, 0))
        labels += list(tables[0]["category"]) if tables else []
    assert labels == ["good 1"] and source.stats().detail["unreadable_lines"] == 1


def test_fifos_symlinks_and_other_users_files_in_the_agent_folder_are_skipped(tmp_path):
    import threading
    secret = tmp_path / "secret.jsonl"
    secret.write_bytes(GOOD % (1, 99))
    os.mkfifo(agent_file(tmp_path, "8.jsonl"))  # an open() without O_NONBLOCK waits for a writer
    agent_file(tmp_path, "9.jsonl").symlink_to(secret)
    agent_file(tmp_path, "10.jsonl").write_bytes(GOOD % (3, 3))
    agent_file(tmp_path).write_bytes(GOOD % (2, 1))
    source = AgentSource(tmp_path / "rec.memprof", agent_uid=os.geteuid())
    if os.geteuid() == 0:
        os.chown(agent_file(tmp_path, "10.jsonl"), 12345, 12345)  # another user's file
    else:
        source.agent_uid = os.geteuid()
    found = []
    reader = threading.Thread(target=lambda: found.append(source.poll(ClockAnchor(0, 0))), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "poll() blocked on the FIFO"
    labels = list(found[0][0]["category"])
    skipped = 3 if os.geteuid() == 0 else 2
    assert labels == (["good 1"] if os.geteuid() == 0 else ["good 3", "good 1"])
    assert source.stats().detail["skipped_files"] == skipped
    source.poll(ClockAnchor(0, 0))
    assert source.stats().detail["skipped_files"] == skipped  # each file counted once


def test_an_agent_folder_swapped_for_a_symlink_is_not_read(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "7.jsonl").write_bytes(GOOD % (1, 1))
    (tmp_path / "rec.memprof").mkdir()
    (tmp_path / "rec.memprof" / "agent").symlink_to(elsewhere)
    assert AgentSource(tmp_path / "rec.memprof").poll(ClockAnchor(0, 0)) is None


def test_the_agent_environment_holds_absolute_paths_for_a_relative_recording(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = AgentSource(Path("rel.memprof")).child_env({"PYTHONPATH": "/opt/lib"})
    boot, rest = env["PYTHONPATH"].split(os.pathsep)
    assert boot == str(tmp_path.resolve() / "rel.memprof" / "agent" / "boot") and rest == "/opt/lib"
    assert env["MEMPROF_AGENT_DIR"] == str(tmp_path.resolve() / "rel.memprof" / "agent")


def test_a_hard_link_to_an_agent_file_is_not_read_twice(tmp_path):
    """The agent never links its files; the command writes this folder, and links to one
    file multiplied what root read and parsed (an audit: 12 links, 1.6 GB)."""
    original = agent_file(tmp_path)
    original.write_bytes(GOOD % (1, 1) + b"\n")
    for n in range(3):
        os.link(original, agent_file(tmp_path, f"{100 + n}.jsonl"))
    agent_file(tmp_path, "8.jsonl").write_bytes(GOOD % (2, 2) + b"\n")
    source = AgentSource(tmp_path / "rec.memprof")
    events = source.poll(ClockAnchor(0, 0))[0]
    assert list(events["category"]) == ["good 2"]  # the linked file's lines under none of its names
    assert source.stats().detail["skipped_files"] == 4


def test_one_poll_reads_at_most_its_budget_across_files_and_the_rest_comes_later(tmp_path, monkeypatch):
    import memprof.sources.agent_reader.source as agent_module
    monkeypatch.setattr(agent_module, "MAX_POLL_BYTES", 1000)
    line = GOOD % (1, 1) + b"\n"
    per_file = 1000 // len(line) + 1  # each file alone is over the poll's budget
    for name in ("7.jsonl", "8.jsonl", "9.jsonl"):
        agent_file(tmp_path, name).write_bytes(line * per_file)
    source = AgentSource(tmp_path / "rec.memprof")
    read_per_poll = []
    for _ in range(10):
        tables = source.poll(ClockAnchor(0, 0))
        read_per_poll.append(len(tables[0]["category"]) if tables else 0)
    assert max(read_per_poll) * len(line) <= 1000, read_per_poll
    assert sum(read_per_poll) == 3 * per_file, read_per_poll  # every line, once


def _labels_per_poll(source, polls: int) -> list[list[str]]:
    out = []
    for _ in range(polls):
        tables = source.poll(ClockAnchor(0, 0))
        out.append(sorted(tables[0]["category"]) if tables else [])
    return out


def test_past_the_files_a_poll_reads_every_file_has_its_turn(tmp_path, monkeypatch):
    """A poll opens at most MAX_FILES files; the next begins where it stopped, so a job
    whose processes left more files than that (dataloader workers over hours) loses none."""
    import memprof.sources.agent_reader.source as agent_module
    monkeypatch.setattr(agent_module, "MAX_FILES", 3)
    for n in range(8):
        agent_file(tmp_path, f"{100 + n}.jsonl").write_bytes(GOOD % (n, n))
    source = AgentSource(tmp_path / "rec.memprof")
    polls = _labels_per_poll(source, 4)
    assert polls == [["good 0", "good 1", "good 2"], ["good 3", "good 4", "good 5"], ["good 6", "good 7"], []]
    agent_file(tmp_path, "100.jsonl").write_bytes(GOOD % (0, 0) + GOOD % (8, 8))  # more, in a file read before
    later = _labels_per_poll(source, 3)  # within a full turn (8 files, 3 a poll), once
    assert sum(later, []) == ["good 8"], later


def test_after_the_exit_the_lines_a_poll_left_are_read_and_the_rest_counted(tmp_path, monkeypatch):
    """drain() reads what the polls' bounds left, up to MAX_FINAL_POLLS more polls, and
    counts in bytes what is left even then; a report says so."""
    import memprof.sources.agent_reader.source as agent_module
    from memprof.analysis.loss import _unread_agent_notes
    line = GOOD % (1, 1)
    monkeypatch.setattr(agent_module, "MAX_POLL_BYTES", 10 * len(line))
    agent_file(tmp_path, "7.jsonl").write_bytes(line * 25)
    agent_file(tmp_path, "8.jsonl").write_bytes(line * 20)
    source = AgentSource(tmp_path / "rec.memprof")
    first = len(source.poll(ClockAnchor(0, 0))[0]["category"])
    drained = [len(tables[0]["category"]) for tables in source.drain(ClockAnchor(0, 0))]
    assert first == 10 and drained == [10, 10, 10, 5], drained  # 45 lines, each once
    assert "unread_bytes_at_end" not in source.stats().detail
    assert list(source.drain(ClockAnchor(0, 0))) == []  # nothing left: one poll, which reads nothing

    monkeypatch.setattr(agent_module, "MAX_FINAL_POLLS", 1)
    agent_file(tmp_path, "9.jsonl").write_bytes(line * 25)
    source.poll(ClockAnchor(0, 0))
    assert [len(tables[0]["category"]) for tables in source.drain(ClockAnchor(0, 0))] == [10]
    detail = source.stats().detail
    assert detail["unread_bytes_at_end"] == 5 * len(line)
    assert _unread_agent_notes("agent", detail) == [
        f"agent: {5 * len(line)} B of the agents' lines were still unread when the recording ended (written faster "
        "than memprof reads them); the steps, marks and CUDA events in them are not recorded"]


def test_after_the_exit_the_lines_written_since_the_last_poll_are_read(tmp_path):
    """The last poll before the exit found the file short of its bound, and the process wrote
    on until it exited: the drain reads that too. It read nothing then: a 48 MiB flood of
    lines lost 19 MB (377,379 of 600,000 lines recorded) when no flush's poll came between
    the last poll that hit a bound and the drain."""
    line = GOOD % (1, 1)
    agent_file(tmp_path, "7.jsonl").write_bytes(line * 3)
    source = AgentSource(tmp_path / "rec.memprof")
    assert len(source.poll(ClockAnchor(0, 0))[0]["category"]) == 3  # within every bound: nothing left
    with open(agent_file(tmp_path, "7.jsonl"), "ab") as f:
        f.write(line * 4)  # then, before the exit
    assert [len(tables[0]["category"]) for tables in source.drain(ClockAnchor(0, 0))] == [4]
    assert "unread_bytes_at_end" not in source.stats().detail


def test_text_escaped_as_surrogate_pairs_is_read_as_the_characters_they_make(tmp_path):
    """JSON writes a character past U+FFFF as two escaped surrogates: that is text (a lone
    one is not, and its line is unreadable: NOT_JSON)."""
    agent_file(tmp_path).write_bytes(b'{"kind":"mark","ts_ns":5,"pid":7,"tid":7,"step":1,'
                                     b'"label":"\\ud83d\\ude00 \\u00e9 \\uD83D\\uDE00"}\n')
    source = AgentSource(tmp_path / "rec.memprof")
    assert list(source.poll(ClockAnchor(0, 0))[0]["category"]) == ["\U0001F600 \u00e9 \U0001F600"]
    assert source.stats().detail["unreadable_lines"] == 0


def test_an_agents_text_that_is_not_utf8_reaches_the_recording_escaped(agent, tmp_path):
    """A file name's undecodable bytes are lone surrogates in Python (os.fsdecode); JSON
    escapes them, and the recorder drops such a line whole (it holds no text). The agent
    writes them as "\\xff" instead, and a character past U+FFFF stays itself."""
    agent._write({"kind": "mark", "ts_ns": 5, "pid": 7, "tid": 7, "step": 1, "label": "a\udcff\udcfe b \ud800 \U0001F600"})
    agent._write({"kind": "mark", "ts_ns": 6, "pid": 7, "tid": 7, "step": 2, "label": "plain"})
    agent.flush()
    source = AgentSource(tmp_path / "rec.memprof")
    events = source.poll(ClockAnchor(0, 0))[0]
    assert list(events["category"]) == ["a\\xff\\xfe b \\ud800 \U0001F600", "plain"]
    assert source.stats().detail["unreadable_lines"] == 0


def test_the_profiler_window_goes_without_python_stacks_where_a_files_name_is_not_utf8(agent, monkeypatch):
    """torch.profiler's Python tracer cannot encode such a name: its start failed half done
    and left a tracer that crashed the program (SIGSEGV). The agent sees it first."""
    import types
    assert agent._python_files_are_text()
    module = types.ModuleType("from_a_latin1_folder")
    module.__file__ = "/data/caf\udce9/model.py"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert not agent._python_files_are_text()

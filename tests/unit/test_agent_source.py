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

import pytest

from memprof.model.meta import ClockAnchor
from memprof.sources.agent import AgentSource

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
    assert list(events["category"]) == ["step"] and list(events["step"]) == [1]  # first mark: a step
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

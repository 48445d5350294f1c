"""Hostile agent lines (tests/fuzz/corpus_agent.py) read by the root recorder's AgentSource:
each is skipped and counted, or read as the valid record it is; never raised, and the good
lines around it still arrive, in rows the recording writer stores."""
from __future__ import annotations

import json

import pytest

from memprof.model.meta import ClockAnchor, RecordingMeta
from memprof.recording import RecordingWriter
from memprof.sources.agent_reader.source import AgentSource
from tests.fuzz.corpus_agent import agent_lines

LINES = agent_lines()
BEFORE = {"kind": "step", "ts_ns": 100, "pid": 7, "tid": 7, "step": 41}
AFTER = {"kind": "step", "ts_ns": 200, "pid": 7, "tid": 7, "step": 42}
ANCHOR = ClockAnchor(monotonic_ns=0, realtime_ns=1_700_000_000 * 10**9)
COUNTERS = ("unreadable_lines", "malformed_lines")


def test_the_corpus_is_large():
    assert len(LINES) >= 200


def _cuda_entries_left_out(source: AgentSource) -> int:
    """CUDA history entries the trace converter left out: unreadable ones, and those of an
    action it does not know (counted by action in the source's stats)."""
    state = source._cuda_state
    return state.unreadable + sum(sum(c.skipped.values()) for c in state.converters.values())


@pytest.mark.parametrize("name", sorted(LINES))
def test_a_hostile_line_is_skipped_and_counted_never_raised(tmp_path, name):
    rec = tmp_path / "rec.memprof"
    (rec / "agent").mkdir(parents=True, mode=0o700)
    lines = [json.dumps(BEFORE).encode(), LINES[name], json.dumps(AFTER).encode()]
    (rec / "agent" / "7.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    source = AgentSource(rec)
    polls = [source.poll(ANCHOR) for _ in range(3)]  # an overlong line may take a poll of its own
    stats = source.stats()
    events = [p[0] for p in polls if p is not None]
    steps = [s for batch in events for s, c in zip(batch["step"], batch["category"]) if c == "step"]
    assert 41 in steps and 42 in steps, f"{name}: the good lines around it were lost"
    counted = sum(stats.detail.get(c, 0) for c in COUNTERS) + _cuda_entries_left_out(source)
    extra_rows = sum(len(batch["ts_ns"]) for batch in events) - 2
    samples = source.take_samples()  # a `values` record gives samples, not event rows
    kept = extra_rows > 0 or bool(stats.detail.get("processes")) or bool(samples["ts_ns"])  # an info record gives no row
    assert counted + kept == 1, f"{name}: counted {counted}, {extra_rows} rows of its own"
    writer = RecordingWriter(tmp_path / "out.memprof", RecordingMeta())
    for batch, stacks, frames in (p for p in polls if p is not None):
        writer.append("events", {**batch, "seq": list(range(len(batch["ts_ns"])))})
        if stacks["stack_id"]:
            writer.append("stacks", stacks)
        if frames["frame_id"]:
            writer.append("frames", frames)
    if samples["ts_ns"]:
        writer.append("samples", samples)
    writer.finalize()

"""The agent's quantities and model-state notes, read back by the recorder (issue 21):
checked as the untrusted lines they are, and turned into `samples` rows and `mark` rows."""
from __future__ import annotations

import pytest

from memprof.model.meta import ClockAnchor
from memprof.sources.agent_reader import lines
from memprof.sources.agent_reader.source import AgentSource
from tests.agent_factories import agent_source_with


def write(tmp_path, *records) -> AgentSource:
    return agent_source_with(tmp_path, 77, *records)


def test_values_and_model_state_become_samples_and_state_rows(tmp_path):
    source = write(
        tmp_path,
        {"kind": "values", "ts_ns": 100, "pid": 77, "tid": 78, "values": {"tokens": 8, "batch": 2}},
        {"kind": "step", "ts_ns": 101, "pid": 77, "tid": 78, "step": 1, "source": "forward"},
        {"kind": "model_state", "ts_ns": 102, "pid": 77, "tid": 78,
         "tensors": [["parameter", "h.0.attn.c_attn.weight", 0x7F00_0000, 3 * 512 * 512 * 4, "cpu"],
                     ["optimizer_state", "h.0.attn.c_attn.weight.exp_avg", 0x7E00_0000, 1024, "cuda:1"]]})
    events, _, _ = source.poll(ClockAnchor(0, 0))
    samples = source.take_samples()
    assert sorted(zip(samples["metric"], samples["value"], samples["ts_ns"])) == [
        ("quantity:batch", 2.0, 100), ("quantity:tokens", 8.0, 100)]
    assert source.take_samples()["ts_ns"] == []  # taken once
    state = [(c, layer, addr, size, device) for c, layer, addr, size, device
             in zip(events["category"], events["layer"], events["addr"], events["size_bytes"], events["device"])
             if c.startswith("state:")]
    assert state == [("state:parameter:h.0.attn.c_attn.weight", "torch_cpu", 0x7F00_0000, 3 * 512 * 512 * 4, "cpu"),
                     ("state:optimizer_state:h.0.attn.c_attn.weight.exp_avg", "cuda_block", 0x7E00_0000, 1024, "cuda:1")]
    assert source.stats().detail["step_sources"] == {"77": "forward"}


@pytest.mark.parametrize("values", [
    {"tokens": float("inf")}, {"tokens": True}, {"tokens": "8"}, {"bad name": 1}, {"x" * 65: 1},
    {f"v{i}": i for i in range(lines.MAX_VALUES + 1)}, [1, 2], {"tokens": 2 ** 63}])
def test_values_that_are_not_a_few_finite_numbers_are_refused(values):
    with pytest.raises(lines.BadLine):
        lines.values_fields({"kind": "values", "ts_ns": 1, "pid": 1, "values": values})


@pytest.mark.parametrize("tensor", [
    ["weights", "w", 1, 1, "cpu"], ["parameter", 5, 1, 1, "cpu"], ["parameter", "w", 0, 1, "cpu"],
    ["parameter", "w", -1, 1, "cpu"], ["parameter", "w", 1, 1.5, "cpu"], ["parameter", "w", 1, 1, "tpu"],
    ["parameter", "w", 1, 1], {"role": "parameter"}])
def test_model_state_tensors_are_checked(tensor):
    with pytest.raises(lines.BadLine):
        lines.model_state_fields({"kind": "model_state", "ts_ns": 1, "pid": 1, "tid": 1, "tensors": [tensor]})


def test_a_bad_model_state_line_is_counted_and_skipped(tmp_path):
    source = write(tmp_path, {"kind": "model_state", "ts_ns": 1, "pid": 77, "tid": 77, "tensors": [["x"]]},
                   {"kind": "values", "ts_ns": 2, "pid": 77, "values": {"tokens": 3}})
    assert source.poll(ClockAnchor(0, 0)) is None  # no event rows: the one good line is a quantity
    assert source.take_samples()["value"] == [3.0]
    assert source.stats().detail["malformed_lines"] == 1


def test_reports_say_what_a_step_is():
    from memprof.analysis.loss import recording_notes
    from memprof.model import RecordingMeta, SourceStats
    one = RecordingMeta(sources={"agent": SourceStats(detail={"step_sources": {"77": "forward", "78": "forward"}})})
    assert [n for n in recording_notes(one) if n.startswith("a step is")] == [
        "a step is an outermost nn.Module forward (nothing else counted steps: in generate, one token)"]
    two = RecordingMeta(sources={"agent": SourceStats(detail={"step_sources": {"77": "forward", "9": "optimizer.step"}})})
    assert sorted(n for n in recording_notes(two) if n.startswith("a step is")) == [
        "a step is an optimizer step (pids 9)",
        "a step is an outermost nn.Module forward (nothing else counted steps: in generate, one token) (pids 77)"]

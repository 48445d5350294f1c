"""Which module (issue 21, item 5), in the agent: each outermost forward's module calls,
as one `modules` record of spans [path index, enter_ns, exit_ns] with the instance paths
named once per process. The real agent inside real torch (the fixture of
test_agent_forwards: installed, hooks off afterwards)."""
from __future__ import annotations

import json
import threading

import pytest

from tests.unit.test_agent_forwards import agent, records  # noqa: F401 (agent: the fixture)

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture
def tracking(monkeypatch):
    """Module tracking asked for (`record --torch-modules`); before `agent`, which reads it."""
    monkeypatch.setenv("MEMPROF_AGENT_OPTIONS", json.dumps({"torch_modules": True}))


class Block(nn.Module):
    """attn then mlp, siblings, each with a Linear inside."""

    def __init__(self):
        super().__init__()
        self.attn = nn.Sequential(nn.Linear(4, 4))
        self.mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.mlp(self.attn(x))


def spans_by_path(record, names):
    """[(path, enter, exit)] of a record, `names` the index -> path table read so far."""
    names.update({int(i): p for i, p in record["paths"].items()})
    return [(names[i], enter, exit_) for i, enter, exit_ in record["spans"]]


def test_nested_modules_give_their_paths_in_call_order_and_nest_in_time(tracking, agent, tmp_path):
    net = nn.Sequential(Block(), Block())
    with torch.no_grad():
        net(torch.zeros(2, 4))
    (record,) = records(agent, tmp_path, "modules")
    spans = spans_by_path(record, {})
    assert [p for p, _, _ in spans] == [
        "", "0", "0.attn", "0.attn.0", "0.mlp", "0.mlp.0", "0.mlp.1",
        "1", "1.attn", "1.attn.0", "1.mlp", "1.mlp.0", "1.mlp.1"]
    at = {p: (enter, exit_) for p, enter, exit_ in spans}
    assert all(enter <= exit_ for enter, exit_ in at.values())
    for child, parent in [("0", ""), ("0.attn", "0"), ("0.mlp.1", "0.mlp"), ("1.mlp.0", "1.mlp")]:
        assert at[parent][0] <= at[child][0] and at[child][1] <= at[parent][1], child
    # Siblings one after the other: attn has ended before mlp begins.
    assert at["0.attn"][1] <= at["0.mlp"][0]
    assert record["tid"] == threading.get_native_id()


def test_paths_are_named_once_per_process_and_a_second_forward_reuses_them(tracking, agent, tmp_path):
    net = nn.Sequential(Block())
    with torch.no_grad():
        net(torch.zeros(1, 4))
        net(torch.zeros(1, 4))
    first, second = records(agent, tmp_path, "modules")
    assert sorted(first["paths"].values()) == ["", "0", "0.attn", "0.attn.0", "0.mlp", "0.mlp.0", "0.mlp.1"]
    assert second["paths"] == {}
    names = {}
    assert [p for p, _, _ in spans_by_path(first, names)] == [p for p, _, _ in spans_by_path(second, names)]


def test_each_thread_writes_its_own_forwards(tracking, agent, tmp_path):
    net = nn.Sequential(Block())
    tids = []

    def run():
        tids.append(threading.get_native_id())
        with torch.no_grad():
            net(torch.zeros(1, 4))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    run()
    got = records(agent, tmp_path, "modules")
    assert sorted(r["tid"] for r in got) == sorted(tids)
    assert all(len(r["spans"]) == 7 for r in got)  # no span of one thread in the other's record


def test_a_module_called_without_being_a_submodule_is_named_under_its_caller(tracking, agent, tmp_path):
    helper = nn.ReLU()

    class CallsAHelper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return helper(self.inner(x))

    with torch.no_grad():
        CallsAHelper()(torch.zeros(1, 4))
    (record,) = records(agent, tmp_path, "modules")
    assert [p for p, _, _ in spans_by_path(record, {})] == ["", "inner", "<ReLU>"]


def test_a_forward_that_raises_still_ends_its_spans(tracking, agent, tmp_path):
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            self.inner(x)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Fails()(torch.zeros(1, 4))
    (record,) = records(agent, tmp_path, "modules")
    assert all(enter <= exit_ for _, enter, exit_ in record["spans"])
    with torch.no_grad():  # the thread's nesting is back at the outermost level
        nn.Linear(4, 4)(torch.zeros(1, 4))
    assert [len(r["spans"]) for r in records(agent, tmp_path, "modules")] == [2, 1]


def test_without_the_option_only_outermost_forwards_are_seen_and_no_modules_written(agent, tmp_path):
    net = nn.Sequential(Block())
    with torch.no_grad():
        net(torch.zeros(1, 4))
        net(torch.zeros(1, 4))  # the same model twice: forwards count the steps
    assert records(agent, tmp_path, "modules") == []
    assert [r["source"] for r in records(agent, tmp_path, "step")] == ["start", "forward", "forward"]


def test_calls_past_the_bound_are_counted_not_kept_and_the_nesting_survives(tracking, agent, tmp_path, monkeypatch):
    monkeypatch.setattr(agent, "MAX_SPANS", 3)
    net = nn.Sequential(Block())
    with torch.no_grad():
        net(torch.zeros(1, 4))
        net(torch.zeros(1, 4))
    first, second = records(agent, tmp_path, "modules")
    names = {}
    assert [p for p, _, _ in spans_by_path(first, names)] == ["", "0", "0.attn"] and first["dropped"] == 4
    assert all(enter <= exit_ for _, enter, exit_ in first["spans"])
    assert [p for p, _, _ in spans_by_path(second, names)] == ["", "0", "0.attn"]  # the next forward starts afresh

"""The agent inside a real torch program (issue 21): outermost forwards count the steps when
nothing else does, their inputs' sizes and memprof.mark's numbers become quantities, and the
model's own tensors are named by role. The real agent module writes its JSON lines; these
tests read them back (no recorder needed)."""
from __future__ import annotations

import importlib
import json
import sys

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """The real agent, installed (its hooks on torch), writing into tmp_path/agent; the hooks
    come off afterwards, so that no other test's forwards reach this agent."""
    folder = tmp_path / "agent"
    folder.mkdir()
    monkeypatch.setenv("MEMPROF_AGENT_DIR", str(folder))
    monkeypatch.syspath_prepend(str(importlib.resources.files("memprof.agent").joinpath("boot")))
    sys.modules.pop("memprof_agent", None)
    module = importlib.import_module("memprof_agent")
    module.install()
    yield module
    module.remove_hooks()
    sys.modules.pop("memprof_agent", None)


def records(agent, tmp_path, kind=None):
    agent.flush()
    lines = [json.loads(line) for path in (tmp_path / "agent").glob("*.jsonl") if "errors" not in path.name
             for line in path.read_text().splitlines()]
    return [r for r in lines if kind is None or r["kind"] == kind]


def model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 8), nn.LayerNorm(8)))


def test_each_outermost_forward_is_a_step_when_nothing_else_counts_them(agent, tmp_path):
    net = model()
    with torch.no_grad():
        for seq_len in (5, 1, 1):  # a prompt, then two decode steps: nested modules are no steps
            net(torch.zeros(3, seq_len, 16))
    steps = [r for r in records(agent, tmp_path, "step") if r["source"] == "forward"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    values = [r["values"] for r in records(agent, tmp_path, "values")]
    assert values == [{"batch": 3, "seq_len": 5, "tokens": 0}, {"batch": 3, "seq_len": 1, "tokens": 5},
                      {"batch": 3, "seq_len": 1, "tokens": 6}]
    # A step's checkpoint reads the last values at or before its mark: values come first.
    assert all(v["ts_ns"] <= s["ts_ns"] for v, s in zip(records(agent, tmp_path, "values"), steps))


def test_keyword_inputs_are_measured_as_generate_passes_them(agent, tmp_path):
    class ByKeyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, input_ids=None):
            return self.proj(input_ids)

    with torch.no_grad():
        ByKeyword()(input_ids=torch.zeros(2, 7, 4))
    assert [r["values"] for r in records(agent, tmp_path, "values")] == [{"batch": 2, "seq_len": 7, "tokens": 0}]


def test_an_optimizer_takes_the_step_count_over_from_the_forwards(agent, tmp_path):
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        net(torch.zeros(4, 16)).sum().backward()
        optimizer.step()
    steps = [(r["step"], r["source"]) for r in records(agent, tmp_path, "step") if r["source"] != "start"]
    # The optimizer stepped before the model's second forward: forwards never counted, and
    # the steps are numbered as they were before forwards could count them.
    assert steps == [(1, "optimizer.step"), (2, "optimizer.step"), (3, "optimizer.step")]


def test_with_gradient_accumulation_the_steps_are_the_optimizers(agent, tmp_path):
    """Four micro-batches (forward, backward) per optimizer step: the model runs a second
    time before the first optimizer step, but after a backward, so forwards are no steps.
    Before 2026-12-07 the first four micro-batches were steps 1-4 and optimizer step N was
    numbered N + 4 ("65 steps" for 60)."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        for _ in range(4):
            net(torch.zeros(4, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    steps = [(r["step"], r["source"]) for r in records(agent, tmp_path, "step") if r["source"] != "start"]
    assert steps == [(1, "optimizer.step"), (2, "optimizer.step"), (3, "optimizer.step")]


def test_marks_carry_finite_numbers_only(agent, tmp_path):
    agent.mark("request", tokens=512, batch=8, ratio=0.5, bad=float("nan"), flag=True, text="x")
    (values,) = records(agent, tmp_path, "values")
    assert values["values"] == {"tokens": 512, "batch": 8, "ratio": 0.5}
    (step,) = [r for r in records(agent, tmp_path, "step") if r["source"] == "mark"]
    assert values["ts_ns"] == step["ts_ns"]  # one clock read: report regions pairs them by it


def state_by_role(agent, tmp_path) -> dict[str, dict[str, int]]:
    """role -> {name: bytes}, over every model_state record (later ones win)."""
    roles: dict[str, dict[str, int]] = {}
    for record in records(agent, tmp_path, "model_state"):
        for role, name, ptr, size, device in record["tensors"]:
            assert ptr > 0 and device == "cpu"
            roles.setdefault(role, {})[name] = size
    return roles


def test_model_state_is_named_by_role_with_adam(agent, tmp_path):
    net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    for _ in range(2):
        net(torch.zeros(4, 16)).sum().backward()
        optimizer.step()
    agent._at_exit()
    roles = state_by_role(agent, tmp_path)
    names = {name for name, _ in net.named_parameters()}
    assert set(roles["parameter"]) == names == set(roles["gradient"])
    assert roles["parameter"]["0.weight"] == 32 * 16 * 4 and roles["gradient"]["0.weight"] == 32 * 16 * 4
    assert set(roles["optimizer_state"]) == {f"{n}.{k}" for n in names for k in ("exp_avg", "exp_avg_sq", "step")}
    assert roles["optimizer_state"]["2.0.weight.exp_avg_sq"] == 8 * 32 * 4
    assert "buffer" not in roles  # no buffers in this model


def test_model_state_is_written_again_only_when_it_changes(agent, tmp_path):
    net = nn.BatchNorm1d(6)  # two parameters, three buffers
    with torch.no_grad():
        for _ in range(4):
            net(torch.zeros(2, 6))
    written = [len(r["tensors"]) for r in records(agent, tmp_path, "model_state")]
    assert written == [5]  # the first step writes them all; in-place updates change nothing


def test_a_models_weights_and_first_gradients_are_named_before_any_step(agent, tmp_path):
    """A recording that stops before the first optimizer step (`--duration`, Ctrl-C, a first
    step of minutes) has seen the forward and perhaps the backward: the parameters are named
    at the first forward and the gradients once the first backward made them all, not only
    at steps or at exit, so a report does not take them for a leak."""
    net = model()
    net(torch.zeros(4, 16))
    sizes = {name: p.numel() * 4 for name, p in net.named_parameters()}
    assert state_by_role(agent, tmp_path) == {"parameter": sizes}
    net(torch.zeros(4, 16)).sum().backward()  # no optimizer.step(), no exit
    assert state_by_role(agent, tmp_path) == {"parameter": sizes, "gradient": sizes}
    assert not agent._gradient_hooks  # their work is done: later backwards run without them


def test_the_gradient_hooks_go_at_the_first_optimizer_step_when_a_parameter_never_gets_one(agent, tmp_path):
    """A frozen-in-practice parameter (no gradient ever reaches it) keeps the first
    backward's walk from coming; the first optimizer step takes the hooks off instead, so no
    step after it pays for them."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    net[0](torch.zeros(4, 16)).sum().backward()  # only the first Linear gets gradients
    net(torch.zeros(4, 16))  # the whole model's first forward: its hooks go on now
    net[0](torch.zeros(4, 16)).sum().backward()
    assert agent._gradient_hooks
    optimizer.step()
    assert not agent._gradient_hooks


def test_modules_called_on_their_own_keep_every_tensor(agent, tmp_path):
    """examples/train.py calls model.fc1 and model.fc2, never model: two outermost modules
    whose parameters share names ("weight", "bias"). Each tensor is written; once the second
    module shows the names are ambiguous, each is written again named by its module's class
    (the timeline keeps a tensor's latest name)."""
    fc1, fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
    optimizer = torch.optim.Adam([*fc1.parameters(), *fc2.parameters()])
    for _ in range(2):
        fc2(fc1(torch.zeros(4, 16))).sum().backward()
        optimizer.step()
    agent._at_exit()
    tensors = [t for r in records(agent, tmp_path, "model_state") for t in r["tensors"]]
    latest = {ptr: (name, size) for role, name, ptr, size, _ in tensors if role == "parameter"}
    parameters = set(latest.values())
    assert parameters == {("Linear.weight", 32 * 16 * 4), ("Linear.bias", 32 * 4), ("Linear.weight", 4 * 32 * 4),
                          ("Linear.bias", 4 * 4)}
    assert len({ptr for role, _, ptr, _, _ in tensors if role == "optimizer_state"}) == 12  # exp_avg, exp_avg_sq, step × 4


def test_training_takes_the_forward_hooks_off_and_walks_model_state_at_doubling_steps(agent, tmp_path,
                                                                                      monkeypatch):
    """Once an optimizer counts the steps, the forward hooks go quiet (their work cost every
    step; the first step has named the modules), and model state is looked at on steps 1,
    2, 4, 8, … (each walk costs ~100 µs; a step can be a millisecond)."""
    from torch.nn.modules import module as nn_module
    walked, walk = [], agent._model_state
    monkeypatch.setattr(agent, "_model_state", lambda: walked.append(agent._state["step"]) or walk())
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for batch in (4, 4, 4, 8, 8, 4, 4, 4, 4, 4):
        net(torch.zeros(batch, 16)).sum().backward()
        optimizer.step()
    values = [r["values"] for r in records(agent, tmp_path, "values")]
    assert values == [{"batch": 4}]  # the first forward's, before the optimizer; (4, 16) floats: no sequence
    # The hooks stay (taking them off would change every later chain's frames), doing nothing.
    assert nn_module._global_forward_pre_hooks and agent._state["forwards_quiet"] is True
    # The model's first forward, its first backward, then the optimizer's steps 1 to 10.
    assert walked == [0, 0, 1, 2, 4, 8]


def test_a_compiled_model_does_not_warn_of_the_agents_global_hooks(agent, tmp_path):
    """torch.compile's module warns at every call while a global module hook is registered;
    the agent's are, and a program that registered none was told to change its hooks. The
    agent keeps that warning quiet; torch still gives it (the second block)."""
    import warnings
    compiled = torch.compile(model(), backend="eager")
    x = torch.zeros(4, 16)
    with warnings.catch_warnings(record=True) as seen:
        compiled(x)
        compiled(x)
    assert [str(w.message) for w in seen if "global hooks" in str(w.message)] == []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(x)
    assert [w for w in seen if "global hooks" in str(w.message)]
    assert [r["step"] for r in records(agent, tmp_path, "step") if r["source"] == "forward"] == [1, 2, 3]


def test_only_a_sequence_has_a_seq_len(agent, tmp_path):
    """Token ids (batch, seq_len) and (batch, seq_len, hidden) inputs have a seq_len; an
    MLP's (batch, features) floats do not: a torch.compile script's (64, 256) batch read
    seq_len 256 before 2026-12-07."""
    embed, mlp, encoder = nn.Embedding(10, 16), nn.Linear(16, 4), nn.Linear(16, 16)
    with torch.no_grad():
        embed(torch.zeros(2, 9, dtype=torch.long))
        mlp(torch.zeros(64, 16))
        encoder(torch.zeros(3, 5, 16))
    assert [{k: v for k, v in r["values"].items() if k != "tokens"} for r in records(agent, tmp_path, "values")] == [
        {"batch": 2, "seq_len": 9}, {"batch": 64}, {"batch": 3, "seq_len": 5}]


def test_tokens_count_from_each_prompt_as_a_servers_requests_do(agent, tmp_path):
    """Three requests of a server, each a prompt (seq_len 4, 6, 5) and two decode steps: the
    cache each forward begins with holds the request's own tokens, 0 at its prompt. Before
    2026-12-07 `tokens` ran on over the requests (20 by the third), and the kv-cache advice
    told a server of 39-token requests that its cache filled the machine at 3.1 M tokens."""
    net = model()
    with torch.no_grad():
        for prompt in (4, 6, 5):
            for seq_len in (prompt, 1, 1):
                net(torch.zeros(1, seq_len, 16))
    tokens = [r["values"]["tokens"] for r in records(agent, tmp_path, "values")]
    assert tokens == [0, 4, 5, 0, 6, 7, 0, 5, 6]


def test_the_agent_writes_nothing_once_the_recording_has_ended(agent, tmp_path):
    """The recorder leaves agent/closed when its recording ends (AgentSource.mark_closed):
    an attached server, or a command that outlives `record --duration`, wrote on into the
    finished recording for as long as it ran (~180 bytes a request, before 2026-12-07)."""
    import os
    agent.mark("before the end")
    assert [r["label"] for r in records(agent, tmp_path, "step") if r["source"] == "mark"] == ["before the end"]
    (files,) = list((tmp_path / "agent").glob("*.jsonl"))
    size = files.stat().st_size
    (tmp_path / "agent" / "closed").touch()
    agent.mark("after the end")
    agent.flush()
    assert files.stat().st_size == size
    assert agent._dir() == "" and os.environ["MEMPROF_AGENT_DIR"] == ""
    agent.mark("later still")
    agent.flush()
    assert files.stat().st_size == size and agent._pending == []

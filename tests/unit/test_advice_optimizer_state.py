"""Advice rule `optimizer-state` (issue 22) on synthetic recordings with the agent's
model-state notes: Adam's state (2× the parameters) gets the advice with exact bytes per role
and kind, multiple, share of the layer's peak, chain and saving; SGD with momentum (1×), a
small model, an optimizer without state and a recording without model state get none.
tests/integration/test_advice_optimizer.py records examples/train.py both ways."""
from __future__ import annotations

from pathlib import Path

import pytest

from memprof.analysis.advice import optimizer_state
from memprof.api import analyse
from memprof.model.schema import STATE_PREFIX
from tests.factories import ev, mark
from tests.gpu_factories import MiB, PID, S, timeline_of, write_recording

KiB = 1 << 10
SIZES = (MiB, 512 * KiB, 256 * KiB, 256 * KiB)   # 2 MiB of parameters
PARAMS = sum(SIZES)
WEIGHTS, GRADS, ADAM, ACTIVATION = 1, 2, 3, 4    # stack ids
ACTIVATION_BYTES = 2 * MiB
STEPS = 3


def note(ts: int, addr: int, size: int, role: str, name: str, layer: str, device: str) -> dict:
    """The agent's model-state note for one tensor, as the reader writes it."""
    return ev(ts, "mark", addr, size, layer=layer, device=device, category=f"{STATE_PREFIX}{role}:{name}", pid=PID)


def training(state: dict[str, int | None], sizes=SIZES, *, layer: str = "torch_cpu", device: str = "cpu",
             with_grads: bool = True) -> list[dict]:
    """Parameters made at 0.1 s; STEPS steps (1 s apart), each: gradients (made at step 1, kept),
    the optimizer's state made at step 1 and kept — per parameter, per `state` kind, a tensor of
    that many bytes (None: the parameter's size) — and a 2 MiB activation made and freed while
    everything else is live. The agent names every tensor at each step mark."""
    at = dict(layer=layer, device=device, pid=PID)
    param = [0x7F00_0000_0000 + i * 0x100_0000 for i in range(len(sizes))]
    grad = [0x7E00_0000_0000 + i * 0x100_0000 for i in range(len(sizes))]
    kinds = list(state)
    slot = {(i, kind): 0x7D00_0000_0000 + (i * len(kinds) + j) * 0x100_0000
            for i in range(len(sizes)) for j, kind in enumerate(kinds)}
    size_of = {(i, kind): sizes[i] if state[kind] is None else state[kind] for i, kind in slot}
    rows = [ev(S // 10 + i, "alloc", param[i], sizes[i], WEIGHTS, **at) for i in range(len(sizes))]
    for k in range(1, STEPS + 1):
        t = k * S
        if k == 1:
            rows += [ev(t + 100 + i, "alloc", grad[i], sizes[i], GRADS, **at) for i in range(len(sizes)) if with_grads]
            rows += [ev(t + 200 + n, "alloc", addr, size_of[key], ADAM, **at) for n, (key, addr) in enumerate(slot.items())]
        rows += [ev(t + 300, "alloc", 0x6000_0000_0000, ACTIVATION_BYTES, ACTIVATION, **at),
                 ev(t + 400, "free", 0x6000_0000_0000, **at)]
        mark_at = t + S // 2
        rows.append(dict(ts_ns=mark_at, action="mark", category="step", step=k, pid=PID, tid=PID))
        rows += [note(mark_at, param[i], sizes[i], "parameter", f"fc{i}.weight", layer, device)
                 for i in range(len(sizes))]
        rows += [note(mark_at, grad[i], sizes[i], "gradient", f"fc{i}.weight", layer, device)
                 for i in range(len(sizes)) if with_grads]
        rows += [note(mark_at, addr, size_of[(i, kind)], "optimizer_state", f"fc{i}.weight.{kind}", layer, device)
                 for (i, kind), addr in slot.items()]
    return rows + [mark((STEPS + 1) * S, PID)]


ADAM_STATE = {"exp_avg": None, "exp_avg_sq": None, "step": 4}


def check(tmp_path: Path, rows: list[dict]):
    path = write_recording(tmp_path / "train.memprof", timeline_of(rows))
    return optimizer_state.check(analyse(path))


@pytest.mark.parametrize("layer,device", [("torch_cpu", "cpu"), ("cuda_block", "cuda:0")])
def test_adam_state_gets_the_advice_with_exact_bytes(tmp_path, layer, device):
    [advice] = check(tmp_path, training(ADAM_STATE, layer=layer, device=device)).advice
    state = 2 * PARAMS + 4 * len(SIZES)          # exp_avg + exp_avg_sq + four 4-byte steps
    model = PARAMS + PARAMS + state               # parameters, gradients, optimizer state
    peak = model + ACTIVATION_BYTES
    assert (advice.layer, advice.device) == (layer, device)
    numbers = advice.numbers
    assert numbers["bytes_by_role"] == {"parameter": PARAMS, "buffer": 0, "gradient": PARAMS, "optimizer_state": state}
    assert numbers["bytes_by_kind"] == {"exp_avg": PARAMS, "exp_avg_sq": PARAMS, "step": 16}
    assert (numbers["optimizer_state_tensors"], numbers["model_state_bytes"], numbers["layer_peak_bytes"]) == (
        12, model, peak)
    assert numbers["share_of_model_state"] == pytest.approx(state / model)
    assert numbers["multiple_of_parameters"] == pytest.approx(state / PARAMS)
    assert numbers["share_of_layer_peak"] == pytest.approx(state / peak)
    assert advice.saving_bytes == numbers["eight_bit_saving_bytes"] == 3 * state // 4
    assert numbers["zero1_saving_bytes"] == 7 * state // 8
    assert advice.chains == (ADAM,)
    text = " ".join(advice.evidence)
    for expected in ("holds 4.0 MiB", "12 tensors: exp_avg 2.0 MiB, exp_avg_sq 2.0 MiB, step 16 B",
                     "50% of the model state's 8.0 MiB", "parameters 2.0 MiB, buffers 0 B, gradients 2.0 MiB",
                     "2.00× the parameters' 2.0 MiB", f"40% of {layer}'s peak of 10.0 MiB"):
        assert expected in text, (expected, text)
    assert "8-bit" in advice.change and "ZeRO" in advice.change and "fused" in advice.change
    assert "3/4" in advice.saving and "3.0 MiB" in advice.saving


def test_adam_without_gradients_held_is_two_thirds_of_the_model_state(tmp_path):
    [advice] = check(tmp_path, training(ADAM_STATE, with_grads=False)).advice
    assert advice.numbers["share_of_model_state"] == pytest.approx((2 * PARAMS + 16) / (3 * PARAMS + 16))


def test_sgd_momentum_is_under_the_share(tmp_path):
    """One momentum buffer per parameter: 1/3 of the model state with gradients."""
    verdict = check(tmp_path, training({"momentum_buffer": None}))
    assert verdict.advice == ()
    assert verdict.why_not.startswith("optimizer state is 33% of the model state (2.0 MiB in torch_cpu), under "
                                      "OPTIMIZER_STATE_SHARE 40%")


def test_a_small_model_is_under_the_minimum(tmp_path):
    """Adam on 64 KiB of parameters: 128 KiB of state, under MIN_OPTIMIZER_STATE_BYTES (1 MiB)."""
    verdict = check(tmp_path, training(ADAM_STATE, sizes=(32 * KiB, 32 * KiB)))
    assert verdict.advice == () and "MIN_OPTIMIZER_STATE_BYTES 1.0 MiB" in verdict.why_not


def test_an_optimizer_without_state_is_silent(tmp_path):
    verdict = check(tmp_path, training({}))
    assert verdict.advice == () and verdict.why_not.startswith("no optimizer state among the model state")


def test_a_recording_without_model_state_is_silent(tmp_path):
    rows = [ev(S, "alloc", 0x1000, 8 * MiB, 1, layer="torch_cpu", device="cpu"), mark(2 * S, PID)]
    verdict = check(tmp_path, rows)
    assert verdict.advice == () and verdict.why_not.startswith("no model state recorded")

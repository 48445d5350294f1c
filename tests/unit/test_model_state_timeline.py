"""Model state on the timeline (issue 21, item 4): the agent's "state:ROLE:NAME" notes name
the allocation live at their address and layer, and nothing else."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from memprof.analysis.series import instants
from memprof.model.schema import STATE_PREFIX, ModelStateRole
from memprof.timeline import timeline, with_model_state
from tests.factories import ev, events_frame

A, B, C, D = 0x7F00_0000_1000, 0x7F00_0000_2000, 0x7F00_0000_3000, 0x7F00_0000_4000
CUDA = "cuda_block"
STEP_NS = 1_000_000_000  # the agent looks at the step mark, a second after the allocations


def state(ts_ns: int, addr: int, name: str, role: ModelStateRole = ModelStateRole.PARAMETER,
          layer: str = "torch_cpu", size: int = 4096) -> dict:
    """One model-state note as the agent reader writes it."""
    return ev(ts_ns, "mark", addr, size, layer=layer, category=f"{STATE_PREFIX}{role.value}:{name}")


def names(events: pd.DataFrame) -> list:
    """The category column as a list, None where missing."""
    return [None if pd.isna(value) else value for value in events["category"].astype(object)]


def parameters_and_a_reused_address() -> pd.DataFrame:
    """An unrelated buffer at A (freed), then three parameters at A, B, C, each named at steps
    1 and 2; a freed buffer at D that a stale note names; a later alloc at C, after the notes."""
    return events_frame([
        ev(10, "alloc", A, 4096, 7), ev(20, "free", A),                      # unrelated, at A before the weight
        ev(30, "alloc", A, 4096, 1), ev(40, "alloc", B, 8192, 1), ev(50, "alloc", C, 64, 2),
        ev(60, "alloc", D, 512, 9), ev(70, "free", D),                       # freed before the notes
        state(STEP_NS, A, "h.0.mlp.c_fc.weight"), state(STEP_NS, B, "h.0.mlp.c_proj.weight", size=8192),
        state(STEP_NS, C, "ln_f.bias", size=64), state(STEP_NS, D, "h.1.attn.c_attn.weight"),
        state(2 * STEP_NS, A, "h.0.mlp.c_fc.weight"), state(2 * STEP_NS, B, "h.0.mlp.c_proj.weight", size=8192),
        ev(3 * STEP_NS, "alloc", C, 64, 3),                                  # after every note: not named
    ], layer="torch_cpu")


def test_exactly_the_three_live_parameters_get_their_role_and_name():
    events = parameters_and_a_reused_address()
    category = with_model_state(events)["category"].astype(object)
    allocs = (events["action"] == "alloc").to_numpy()
    named = {int(ts): cat for ts, cat in zip(events["ts_ns"][allocs], category[allocs]) if isinstance(cat, str)}
    assert named == {30: "state:parameter:h.0.mlp.c_fc.weight", 40: "state:parameter:h.0.mlp.c_proj.weight",
                     50: "state:parameter:ln_f.bias"}
    # The notes themselves are unchanged, and the input frame is not modified.
    assert category[(events["action"] == "mark").to_numpy()].str.startswith(STATE_PREFIX).all()
    assert events["category"].astype(object)[allocs].isna().all()


def test_a_note_with_nothing_live_at_its_address_changes_nothing():
    events = events_frame([ev(10, "alloc", D, 512, 9), ev(20, "free", D), state(STEP_NS, D, "gone.weight")],
                          layer="torch_cpu")
    assert with_model_state(events) is events


def test_a_note_names_only_its_own_layer():
    """A CUDA block note at an address a CPU allocation also holds names the CUDA block only."""
    events = events_frame([
        ev(10, "alloc", A, 4096, 1, layer="torch_cpu"),
        ev(20, "alloc", A, 4096, 2, layer="cuda_block", device="cuda:0"),
        state(STEP_NS, A, "wte.weight", layer="cuda_block"),
    ])
    assert names(with_model_state(events))[:2] == [None, "state:parameter:wte.weight"]


def test_a_note_names_only_its_own_processs_tensor():
    """A DataLoader worker forked from the trainer allocates and frees at the address of the
    trainer's optimizer state between its allocation and the agent's note: the trainer's
    tensor is still live in the trainer and keeps its name (before 2026-12-07 the worker's
    free hid it: 83 of 84 optimizer tensors were named)."""
    worker = dict(pid=4001, tid=4001)
    events = events_frame([
        ev(10, "alloc", A, 4096, 1), ev(20, "alloc", A, 4096, 5, **worker), ev(30, "free", A, **worker),
        state(STEP_NS, A, "h.0.ln_2.bias.step", role=ModelStateRole.OPTIMIZER_STATE),
    ], layer="torch_cpu")
    assert names(with_model_state(events))[:3] == ["state:optimizer_state:h.0.ln_2.bias.step", None, None]


def test_free_requested_ends_the_allocation_too_and_the_latest_name_is_kept():
    """The agent names a tensor again when it learns more (a second outermost module makes
    names carry their module's class): the latest name wins."""
    events = events_frame([
        ev(10, "alloc", A, 4096, 1), ev(20, "free_requested", A), ev(30, "alloc", B, 4096, 1),
        state(STEP_NS, A, "stale.weight", layer=CUDA), state(STEP_NS, B, "fc.weight", ModelStateRole.GRADIENT, CUDA),
        state(2 * STEP_NS, B, "renamed.weight", layer=CUDA),
    ], layer=CUDA, device="cuda:0")
    assert names(with_model_state(events))[:3] == [None, None, "state:parameter:renamed.weight"]


def test_timeline_applies_it_and_the_notes_are_not_marks_to_show():
    events = parameters_and_a_reused_address()
    merged = timeline(SimpleNamespace(events=events.iloc[::-1].reset_index(drop=True)))  # out of order
    assert (merged["category"].astype(str).str.startswith("state:parameter:") & (merged["action"] == "alloc")).sum() == 3
    assert instants(merged).empty

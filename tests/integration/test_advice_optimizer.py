"""Advice rule `optimizer-state` (issue 22) on examples/train.py recorded under `memprof record`:
with Adam (two fp32 state tensors per parameter: exp_avg and exp_avg_sq) it fires with the
model's exact bytes; with the default optimizer (SGD without momentum: no state) it is silent.

Two short recordings (module-scoped), one `report advice --format json` each."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
IN, HIDDEN, CLASSES, FLOAT = 512, 512, 10, 4
PARAMS = ((IN * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)) * FLOAT   # fc1 and fc2: 1,071,144 bytes
STEP_TENSORS = 4 * FLOAT   # Adam's `step`: one float32 scalar per parameter tensor
RULE = "optimizer-state"


def advice_of(run_memprof, tmp_path_factory, *args) -> dict:
    """`report advice --format json` of train.py ARGS recorded for 5 steps."""
    folder = tmp_path_factory.mktemp("train")
    path = folder / "train.memprof"
    result = run_memprof("record", "-q", "-o", path, "--", sys.executable, EXAMPLE, "--steps", 5, "--start-wait", 0,
                         "--hold", 0, *args, cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "steps=5" in result.stdout
    report = run_memprof("report", "advice", path, "--format", "json", cwd=folder, timeout=300)
    assert report.returncode == 0, report.stderr
    return json.loads(report.stdout)


def rule_of(data: dict) -> tuple[list[dict], dict]:
    return ([a for a in data["advice"] if a["rule"] == RULE], next(r for r in data["rules"] if r["id"] == RULE))


@pytest.fixture(scope="module")
def adam(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory, "--optimizer", "adam")


@pytest.fixture(scope="module")
def sgd(run_memprof, tmp_path_factory) -> dict:
    return advice_of(run_memprof, tmp_path_factory)


def step_line() -> int:
    """train.py's `optimizer.step()` line (Adam makes its state in its first step)."""
    lines = EXAMPLE.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip() == "optimizer.step()")


def test_adam_gets_the_advice_with_the_models_bytes(adam):
    [advice], entry = rule_of(adam)
    assert entry["fired"] and (advice["layer"], advice["device"]) == ("torch_cpu", "cpu")
    state = 2 * PARAMS + STEP_TENSORS
    numbers = advice["numbers"]
    assert numbers["bytes_by_role"]["parameter"] == PARAMS
    assert numbers["bytes_by_role"]["optimizer_state"] == state
    assert numbers["bytes_by_kind"] == {"exp_avg": PARAMS, "exp_avg_sq": PARAMS, "step": STEP_TENSORS}
    assert numbers["optimizer_state_tensors"] == 12
    assert numbers["multiple_of_parameters"] == pytest.approx(2.0, abs=1e-4)
    assert numbers["share_of_model_state"] >= 0.5   # 1/2 with the gradients held, more without
    assert 0 < numbers["share_of_layer_peak"] < 1
    assert advice["saving_bytes"] == 3 * state // 4
    chain = advice["chains"][0]["stack"]
    assert any(f["function"] == "Adam._init_group" for f in chain), advice["chains"][0]["name"]
    assert any((f.get("file") or "").endswith("train.py") and f["line"] == step_line() for f in chain)
    assert f"called from train_step (train.py:{step_line()})" in " ".join(advice["evidence"])


def test_the_default_optimizer_gets_none(sgd):
    given, entry = rule_of(sgd)
    assert given == [] and not entry["fired"]
    assert entry["why_not"].startswith("no optimizer state among the model state")

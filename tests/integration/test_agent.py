"""memprof's agent inside Python targets (real torch on the CPU, real `memprof record`).

tests/data/agent/steps.py trains a tiny model for N optimizer steps, calls memprof.mark()
after step 2, and with --child runs itself again (3 steps) in a subprocess. The agent must
reach every Python process of the tree through PYTHONPATH alone, put one step mark per
optimizer step (plus step 0 when it starts) and the user's mark on the timeline, give events
their step, and never break the target — a failure inside it is logged in meta.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
STEPS = REPO / "tests" / "data" / "agent" / "steps.py"


def record(run_memprof, tmp_path: Path, *command, args=()) -> tuple[Path, str]:
    recording = tmp_path / "agent.memprof"
    result = run_memprof("record", "-q", "-o", recording, *args, "--", *command, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return recording, result.stdout


def marks(recording: Path):
    from memprof.recording import open_recording
    from memprof.timeline import timeline
    events = timeline(open_recording(recording))
    return events, events[events["action"] == "mark"]


def agent_meta(recording: Path) -> dict:
    return json.loads((recording / "meta.json").read_text())["sources"]["agent"]


def test_script_gets_a_step_mark_per_optimizer_step_and_the_users_mark(tmp_path, run_memprof):
    recording, out = record(run_memprof, tmp_path, sys.executable, STEPS, "--steps", "5")
    assert "done steps=5" in out
    events, m = marks(recording)
    steps = m[m["category"] == "step"]
    assert sorted(steps["step"].astype(int)) == [0, 1, 2, 3, 4, 5]
    assert len(m[m["category"] == "after step 2"]) == 1
    assert int(m[m["category"] == "after step 2"]["step"].iloc[0]) == 2
    # Events between marks k and k+1 of the process are in step k.
    torch_cpu = events[(events["layer"] == "torch_cpu") & (events["action"] == "alloc")]
    first_step = int(steps[steps["step"] == 1]["ts_ns"].iloc[0])
    after = torch_cpu[torch_cpu["ts_ns"] > first_step]
    assert len(after) and after["step"].notna().all() and (after["step"] >= 1).all()
    assert agent_meta(recording)["detail"]["failures"] == 0


def test_python_dash_m_and_a_subprocess_chain_get_the_agent(tmp_path, run_memprof):
    pkg = tmp_path / "trainpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(f"import runpy, sys\nsys.argv = [{str(STEPS)!r}, '--steps', '4', '--child']\n"
                                     f"runpy.run_path({str(STEPS)!r}, run_name='__main__')\n")
    recording, out = record(run_memprof, tmp_path, sys.executable, "-m", "trainpkg")
    assert "done steps=4" in out and "done steps=3" in out
    _, m = marks(recording)
    per_pid = m[m["category"] == "step"].groupby("pid")["step"].max().astype(int).to_dict()
    assert sorted(per_pid.values()) == [3, 4], per_pid  # the -m process and its child
    assert len(agent_meta(recording)["detail"]["processes"]) == 2


def test_a_non_python_command_gets_nothing_injected(tmp_path, run_memprof):
    recording, _ = record(run_memprof, tmp_path, "/bin/true")
    assert list((recording / "agent").glob("*.jsonl")) == []
    assert agent_meta(recording)["events"] == 0


def test_no_agent_leaves_the_environment_alone(tmp_path, run_memprof):
    recording, out = record(run_memprof, tmp_path, sys.executable, "-c",
                            "import os; print('PP=' + os.environ.get('PYTHONPATH', ''))", args=("--no-agent",))
    assert "PP=\n" in out or out.strip().endswith("PP=")
    assert not (recording / "agent").exists()


def test_a_failure_inside_the_agent_is_logged_and_the_target_goes_on(tmp_path, run_memprof):
    recording, out = record(run_memprof, tmp_path, sys.executable, STEPS, "--steps", "5", "--break-profiler",
                            args=("--torch-profile-steps", "2-3"))
    assert "done steps=5" in out  # the target finished its work
    detail = agent_meta(recording)["detail"]
    assert detail["failures"] >= 1
    assert any("profiler broken on purpose" in f["error"] for f in detail["failures_first"]), detail
    _, m = marks(recording)
    assert sorted(m[m["category"] == "step"]["step"].astype(int)) == [0, 1, 2, 3, 4, 5]  # steps still counted


def test_a_profiler_window_covers_only_its_steps(tmp_path, run_memprof):
    recording, out = record(run_memprof, tmp_path, sys.executable, STEPS, "--steps", "6",
                            args=("--torch-profile-steps", "2-3"))
    assert "done steps=6" in out
    detail = agent_meta(recording)["detail"]
    assert detail["failures"] == 0, detail
    profiles = detail.get("profiles") or []
    assert len(profiles) == 1 and (recording / "agent" / profiles[0]).is_file()
    _, m = marks(recording)
    window = m[m["category"].isin(["profiler window start", "profiler window end"])]
    assert list(window["category"]) == ["profiler window start", "profiler window end"]
    assert list(window["step"].astype(int)) == [2, 4]  # started as step 2 began, stopped as step 4 began
    trace = json.loads((recording / "agent" / profiles[0]).read_text())
    assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])

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
import tempfile
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
    from memprof.api import analyse
    events = analyse(recording).events  # the merged timeline
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

    # The window's tensor allocations: inside steps 2-3 only, with their roles and operators.
    events, m = marks(recording)
    tensors = m[m["category"].astype(str).str.startswith("tensor:")]
    assert len(tensors) and set(tensors["step"].astype(int)) <= {2, 3}, tensors["step"].value_counts()
    roles = set(tensors["category"].astype(str))
    assert {"tensor:parameter", "tensor:activation", "tensor:gradient"} & roles, roles
    # Clock alignment: the same CPU tensor seen by the torch_cpu uprobe and by the profiler
    # lands within 1 ms, and the uprobe's row takes the profiler's role.
    allocs = events[(events["layer"] == "torch_cpu") & (events["action"] == "alloc")]
    pairs = tensors[tensors["layer"] == "torch_cpu"].merge(allocs, on=["layer", "addr"], suffixes=("_p", "_u"))
    pairs = pairs.assign(gap=(pairs["ts_ns_p"] - pairs["ts_ns_u"]).abs())
    closest = pairs.sort_values("gap").drop_duplicates(["ts_ns_p", "addr"])
    assert len(closest) >= 0.9 * len(tensors[tensors["layer"] == "torch_cpu"]), (len(closest), len(tensors))
    assert closest["gap"].max() <= 1_000_000, closest["gap"].describe()
    # (Model state the agent named — parameters, gradients — keeps its state:ROLE:NAME: the
    # timeline names it after the profiler's roles.)
    taken = {c for c in closest["category_u"].astype(str) if not c.startswith("state:")}
    assert taken <= {r[len("tensor:"):] for r in roles}


def test_a_profiler_window_over_a_script_whose_path_is_not_utf8_leaves_it_running(tmp_path, run_memprof):
    """torch.profiler's Python tracer cannot take a file name that is not UTF-8: its start
    failed half done, and the program died of SIGSEGV (rc 139). The window is profiled
    without Python stacks, and the agent logs why."""
    import os
    import shutil
    folder = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(folder)
    script = folder + b"/steps.py"
    shutil.copy(STEPS, script)
    recording, out = record(run_memprof, tmp_path, sys.executable, os.fsdecode(script), "--steps", "4",
                            args=("--torch-profile-steps", "1-2"))
    assert "done steps=4" in out
    detail = agent_meta(recording)["detail"]
    assert [f["where"] for f in detail["failures_first"]][:1] == ["profiler window"], detail["failures_first"]
    assert "with_stack=False" in detail["failures_first"][0]["error"]
    assert len(detail.get("profiles") or []) == 1


ATTACHABLE = """
import sys
import torch
import memprof, memprof.agent
memprof.agent.install()
print("ready", flush=True)
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sys.stdin.readline()                    # sent once the recorder has attached
for i in range(7):
    opt.zero_grad(); model(torch.randn(16, 8)).sum().backward(); opt.step()
memprof.mark("attached run done")
"""


def agent_began(recording: Path, pid: int) -> bool:
    """The target's agent writes into the recording (its first line, the step in progress at
    the attach, is flushed within 0.5 s of it)."""
    return (recording / "agent" / f"{pid}.jsonl").exists()


def record_python_attached(record_attached, tmp_path: Path, argv: list, ready_line: str, ready=None) -> tuple[Path, int]:
    """`record --pid` a Python target that prints `ready_line`, then waits for its start line
    (see record_attached): (recording, pid)."""
    recording = tmp_path / "attached.memprof"
    target = record_attached(argv, recording, ready)
    assert target.first_line == ready_line
    assert target.result.returncode == 0, target.result.stderr
    return recording, target.pid


def test_attach_reaches_an_agent_the_program_installed(tmp_path, record_attached):
    script = tmp_path / "attachable.py"
    script.write_text(ATTACHABLE)
    recording, pid = record_python_attached(record_attached, tmp_path, [sys.executable, script], "ready", agent_began)
    _, m = marks(recording)
    steps = m[m["category"] == "step"]
    assert sorted(steps["step"].astype(int)) == list(range(0, 8)), steps  # 0 at attach, then 7 steps
    assert len(m[m["category"] == "attached run done"]) == 1
    assert agent_meta(recording)["detail"]["attached"] == [pid]
    # Its private attach folder (tempfile.mkdtemp) went with it: nothing is left in /tmp.
    assert not list(Path(tempfile.gettempdir()).glob(f"memprof-agent-{pid}-*"))


def test_attach_to_python_without_an_agent_says_what_it_cannot_see(tmp_path, record_attached):
    argv = [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.readline()"]
    recording, pid = record_python_attached(record_attached, tmp_path, argv, "up")
    notes = json.loads((recording / "meta.json").read_text())["notes"]
    assert any(f"no memprof agent in Python process(es) {pid}" in n for n in notes), notes


PROFILER_STEPS = """
import torch
from torch.profiler import ProfilerActivity, profile, schedule
model = torch.nn.Linear(8, 4)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=1, repeat=1)) as prof:
    for i in range(5):
        with torch.no_grad():
            model(torch.randn(16, 8))
        prof.step()
print("profiled")
"""


def test_torch_profiler_step_counts_steps_when_there_is_no_optimizer(tmp_path, run_memprof):
    script = tmp_path / "profiled.py"
    script.write_text(PROFILER_STEPS)
    recording, out = record(run_memprof, tmp_path, sys.executable, script)
    assert "profiled" in out
    _, m = marks(recording)
    assert sorted(m[m["category"] == "step"]["step"].astype(int)) == [0, 1, 2, 3, 4, 5]


def test_torchrun_and_its_workers_get_the_agent(tmp_path, run_memprof):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    recording, out = record(run_memprof, tmp_path, torchrun, "--standalone", "--nproc_per_node", "2",
                            STEPS, "--steps", "3")
    assert out.count("done steps=3") == 2, out
    _, m = marks(recording)
    per_pid = m[m["category"] == "step"].groupby("pid")["step"].max().astype(int)
    assert sorted(per_pid[per_pid > 0].tolist()) == [3, 3], per_pid  # both workers; the launcher steps no optimizer


FLOOD = """
import os, sys, time
n, path = int(sys.argv[1]), os.path.join(os.environ["MEMPROF_AGENT_DIR"], f"{os.getpid()}.jsonl")
line = '{"kind":"mark","ts_ns":%d,"pid":%d,"tid":%d,"step":1,"label":"flood"}\\n'
with open(path, "a") as f:
    for start in range(0, n, 10000):
        f.write("".join(line % (time.monotonic_ns(), os.getpid(), os.getpid()) for _ in range(start, min(n, start + 10000))))
"""


def test_lines_an_agent_writes_just_before_the_exit_are_all_recorded(tmp_path, run_memprof):
    """A poll reads at most 16 MiB of a file: a process that wrote 48 MiB of lines just
    before exiting had a third of them dropped by the last polls, without a word. The polls
    after the exit read them all (sources/agent_reader/source.py, drain)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    lines = 600_000  # ~82 bytes each: 48 MiB
    recording, _ = record(run_memprof, tmp_path, sys.executable, "-c", FLOOD, str(lines))
    size = sum(p.stat().st_size for p in (recording / "agent").glob("*.jsonl"))
    assert size > 3 * (16 << 20), size
    categories = ds.dataset(recording / "events").to_table(columns=["category"]).column("category")
    assert pc.sum(pc.equal(categories, "flood")).as_py() == lines
    assert "unread_bytes_at_end" not in agent_meta(recording)["detail"]


def test_a_python_that_ignores_pythonpath_is_said_to_have_run_without_the_agent(tmp_path, run_memprof):
    """The agent starts through PYTHONPATH: `python -I` leaves it out, and the recording
    lacked steps and model state without a word. A note says so; with the agent, none."""
    recording, out = record(run_memprof, tmp_path, sys.executable, "-I", STEPS, "--steps", "2")
    assert "done steps=2" in out
    meta = json.loads((recording / "meta.json").read_text())
    said = [n for n in meta["notes"] if n.startswith("memprof's agent did not start")]
    assert len(said) == 1 and "PYTHONPATH" in said[0], meta["notes"]
    (tmp_path / "control").mkdir()
    control, _ = record(run_memprof, tmp_path / "control", sys.executable, STEPS, "--steps", "2")
    assert not [n for n in json.loads((control / "meta.json").read_text())["notes"] if "agent did not start" in n]

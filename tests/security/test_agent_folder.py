"""The agent folder of `sudo memprof record -- CMD` (issue 19, item 4), and the agent's files
as untrusted input to the root recorder (robustness), played with real users.

The folder's boot/ goes first on the command's PYTHONPATH: code there runs in every Python
process of the command. It was put there as a relative path when -o was relative, so a
process that changed folder imported whatever sat at that relative path; and nothing
checked who else could write on the way to it."""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.ebpf

PLANTED = "print('PWNED: planted code ran', flush=True)\n"


def meta(recording: Path) -> dict:
    return json.loads((recording / "meta.json").read_text())


def agent_detail(recording: Path) -> dict:
    return meta(recording)["sources"]["agent"]["detail"]


def test_a_relative_output_does_not_follow_the_command_into_another_folder(make_user, memprof_as_root, tmp_path):
    """-o rec.memprof (relative); the command's Python child changes into a folder where
    another user planted rec.memprof/agent/boot/sitecustomize.py: the planted code does not
    run (PYTHONPATH holds an absolute path), and memprof's own agent still does."""
    user, attacker = make_user(), make_user()
    trap = attacker.home / "trap"
    assert attacker.run(["mkdir", "-p", trap / "rec.memprof" / "agent" / "boot"]).returncode == 0
    attacker.write(trap / "rec.memprof" / "agent" / "boot" / "sitecustomize.py", PLANTED)
    assert attacker.run(["chmod", "-R", "a+rX", attacker.home]).returncode == 0
    child = ("import memprof, sys; memprof.mark('child'); print('child ran', flush=True)")
    parent = (f"import os, subprocess, sys; os.chdir({str(trap)!r}); "
              f"sys.exit(subprocess.run([sys.executable, '-c', {child!r}]).returncode)")
    result = memprof_as_root(user, "record", "-q", "-o", "rec.memprof", "--", sys.executable, "-c", parent,
                             cwd=user.home)
    assert result.returncode == 0, result.stderr
    assert "child ran" in result.stdout and "PWNED" not in result.stdout, result.stdout
    recording = user.home / "rec.memprof"
    assert "child" in {e["label"] for e in _marks(recording)}
    user.report_leaks(recording)


def _marks(recording: Path) -> list[dict]:
    found = []
    for path in (recording / "agent").glob("*.jsonl"):
        found += [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") in ("step", "mark")]
    return found


def test_an_agent_folder_others_can_write_to_gets_no_agent(make_user, memprof_as_root, request):
    """-o into a scratch folder everyone may write (no sticky bit): no agent is started
    (another user could swap its code), a note in meta.json and a warning on stderr say
    why, and the command and its eBPF layers are recorded."""
    user = make_user()
    shared = Path(tempfile.mkdtemp(prefix="memprof-sec-shared-"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    os.chmod(shared, 0o777)
    recording = shared / "rec.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", sys.executable, "-c",
                             "import os; print('PP=' + os.environ.get('PYTHONPATH', ''))", cwd=user.home)
    assert result.returncode == 0, result.stderr
    assert "agent was not started" in result.stderr and "warning" in result.stderr
    assert "memprof" not in result.stdout.split("PP=")[1]  # no boot folder on the command's path
    notes = meta(recording)["notes"]
    assert any(f"{shared} is writable by every user" in n for n in notes), notes
    assert not (recording / "agent").exists()
    user.report_leaks(recording)


# ---- robustness: the agent's files are untrusted input -------------------------------------

def test_a_fifo_in_the_agent_folder_does_not_block_the_recorder(make_user, memprof_as_root):
    user = make_user()
    code = ("import os, time; os.mkfifo(os.path.join(os.environ['MEMPROF_AGENT_DIR'], '77.jsonl')); "
            "os.symlink('/etc/shadow', os.path.join(os.environ['MEMPROF_AGENT_DIR'], '78.jsonl')); time.sleep(1.5)")
    recording = user.home / "fifo.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", sys.executable, "-c", code,
                             cwd=user.home, timeout=60)
    assert result.returncode == 0, result.stderr
    assert agent_detail(recording)["skipped_files"] == 2
    user.report_leaks(recording)


def test_malformed_agent_lines_are_skipped_and_counted(make_user, memprof_as_root):
    user = make_user()
    lines = ['{"kind":"mark"}', "[1, 2]", "not json", '{"kind":"mark","ts_ns":"5"}', '{"kind":"mark","ts_ns":NaN}',
             '{"kind":"mark","ts_ns":%d,"pid":1,"tid":1,"label":"after the junk"}']
    code = ("import os, time; f = open(os.path.join(os.environ['MEMPROF_AGENT_DIR'], '99.jsonl'), 'w'); "
            f"f.write('\\n'.join({lines!r}) % time.monotonic_ns() + '\\n'); f.close(); time.sleep(0.6)")
    recording = user.home / "junk.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", sys.executable, "-c", code, cwd=user.home)
    assert result.returncode == 0, result.stderr
    detail = agent_detail(recording)
    assert (detail["malformed_lines"], detail["unreadable_lines"]) == (3, 2), detail
    from memprof.recording import open_recording
    events = open_recording(recording).events
    assert list(events[events["action"] == "mark"]["category"].astype(str)).count("after the junk") == 1
    user.report_leaks(recording)


@pytest.mark.parametrize("labels", [200, 100_000])
def test_many_distinct_mark_labels_record_and_report(make_user, memprof_as_root, labels):
    """A training loop's `memprof.mark(f"batch {i}")` (the optimizer counts the steps):
    200 labels in one flush (an int8 index held 128), and 10^5 in a run (int16 codes held
    32,767): all recorded, and `report` reads them."""
    user = make_user()
    code = ("import torch, memprof\n"
            "model = torch.nn.Linear(2, 1)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model(torch.ones(1, 2)).sum().backward(); opt.step()  # the optimizer counts steps\n"
            f"for i in range({labels}):\n"
            "    memprof.mark(f'batch {i}')\n"
            "print('marked', flush=True)\n")
    recording = user.home / "labels.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", sys.executable, "-c", code,
                             cwd=user.home, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "marked" in result.stdout
    from memprof.recording import open_recording
    events = open_recording(recording).events
    marks = events[events["action"] == "mark"]
    # (The agent's model-state notes are marks too: state:ROLE:NAME; memprof's own are step,
    # exit and exec: the gated child's exec into the command.)
    from memprof.model.schema import MARK_LABELS
    user_labels = {c for c in marks["category"].astype(str) if not c.startswith("state:")} - MARK_LABELS
    assert user_labels == {f"batch {i}" for i in range(labels)}, len(user_labels)
    assert agent_detail(recording)["malformed_lines"] == 0
    user.report_leaks(recording)

"""`sudo memprof record --pid` and the agent's attach files (issue 19, item 3).

The agent once used predictable names in /tmp: `memprof-agent-<pid>.ready` (any user could
create it, and root then sent SIGUSR2 to a process with no handler, which died of it),
`memprof-agent-<pid>.request.json` (root opened it by name and chowned it: a planted symlink
made root write anywhere) and the ready file the agent opened by name (a planted symlink
truncated a file of the user's). Each attack is played here by real users; the recording
must still open."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.security.conftest import REPO

pytestmark = pytest.mark.ebpf

NO_HANDLER = "import sys; print('up', flush=True); sys.stdin.readline()"

# Installs the agent when told to (a line on stdin), optionally plants a symlink at the
# request's name in its own attach folder first, then waits for the recorder's request.
WITH_AGENT = """
import os, sys, time
sys.stdin.readline()
import memprof.agent
memprof.agent.install()
import memprof_agent
if len(sys.argv) > 1 and memprof_agent._state.get("attach_folder"):  # (an agent before issue 19 had none)
    os.symlink(sys.argv[1], os.path.join(memprof_agent._state["attach_folder"], "request.json"))
print("installed", flush=True)
deadline = time.monotonic() + 30
while not os.environ.get("MEMPROF_AGENT_DIR") and time.monotonic() < deadline:
    time.sleep(0.05)
memprof.mark("attached")
memprof_agent.flush()
print("agent dir", bool(os.environ.get("MEMPROF_AGENT_DIR")), flush=True)
sys.stdin.readline()
"""


def user_python(user, code: str, *args) -> subprocess.Popen:
    """`python -c code args` as `user`, memprof importable, stdin and stdout piped."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(user.home)}
    return user.popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      text=True, env=env)


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[19])


def meta(recording: Path) -> dict:
    return json.loads((recording / "meta.json").read_text())


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def test_ready_files_made_by_another_user_get_a_process_without_handler_no_signal(make_user, memprof_as_root):
    """Old-style and new-style ready files for the victim, by another user and by the
    victim's own user (a forged folder): the victim has no SIGUSR2 handler, so it is not
    signalled, whatever the files say; it is alive after `record --pid`."""
    user, attacker = make_user(), make_user()
    victim = user_python(user, NO_HANDLER)
    try:
        assert victim.stdout.readline().strip() == "up"
        ready = json.dumps({"pid": victim.pid, "start_time": start_time(victim.pid)})
        attacker.write(Path(f"/tmp/memprof-agent-{victim.pid}.ready"), "3.11")
        for who, name in ((attacker, "evil"), (user, "forged")):
            folder = Path(f"/tmp/memprof-agent-{victim.pid}-{name}")
            assert who.run(["mkdir", "-m", "700", folder]).returncode == 0
            who.write(folder / "ready", ready)
        recording = user.home / "victim.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", victim.pid, "--duration", "2",
                                 cwd=user.home)
        assert result.returncode == 0, result.stderr
        assert victim.poll() is None, "the victim was signalled and died"
        assert any(f"no memprof agent in Python process(es) {victim.pid}" in n for n in meta(recording)["notes"])
        assert not (recording / "agent").exists()
        assert not list(Path("/tmp").glob(f"memprof-agent-{victim.pid}-*/request.json"))
        user.report_leaks(recording)
    finally:
        stop(victim)
        subprocess.run(["sh", "-c", f"rm -rf /tmp/memprof-agent-{victim.pid}*"])


def test_symlinks_planted_where_the_request_goes_lead_nowhere(make_user, canaries, memprof_as_root):
    """The user's own program plants a symlink at the request's name inside its attach
    folder (to a root-only script), and at the old request name in /tmp (to a name that
    must never exist): nothing outside the recording is created or changed, and the agent
    is still reached."""
    user = make_user()
    target = user_python(user, WITH_AGENT, str(canaries.script))
    try:
        user.run(["ln", "-s", canaries.absent, f"/tmp/memprof-agent-{target.pid}.request.json"])
        target.stdin.write("install\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "installed"
        recording = user.home / "attached.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", target.pid, "--duration", "3",
                                 cwd=user.home)
        assert result.returncode == 0, result.stderr
        assert target.stdout.readline().strip() == "agent dir True"
        canaries.assert_untouched()
        agent = meta(recording)["sources"]["agent"]["detail"]
        assert agent["attached"] == [target.pid], agent
        assert (recording / "agent" / f"{target.pid}.jsonl").stat().st_uid == user.uid
        user.report_leaks(recording)
    finally:
        stop(target)
        subprocess.run(["rm", "-f", f"/tmp/memprof-agent-{target.pid}.request.json"])


def test_a_symlink_at_the_old_ready_name_cannot_truncate_the_users_file(make_user, memprof_as_root):
    """Another user plants /tmp/memprof-agent-<pid>.ready -> a file of the victim's before
    the victim installs the agent: the file keeps its bytes; attaching still works."""
    user, attacker = make_user(), make_user()
    precious = user.write(user.home / "precious.txt", "three weeks of notes\n")
    target = user_python(user, WITH_AGENT)
    try:
        planted = Path(f"/tmp/memprof-agent-{target.pid}.ready")
        assert attacker.run(["ln", "-s", precious, planted]).returncode == 0
        target.stdin.write("install\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "installed"
        assert precious.read_text() == "three weeks of notes\n"
        recording = user.home / "attached.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", target.pid, "--duration", "3",
                                 cwd=user.home)
        assert result.returncode == 0, result.stderr
        assert precious.read_text() == "three weeks of notes\n" and planted.is_symlink()
        assert meta(recording)["sources"]["agent"]["detail"]["attached"] == [target.pid]
        user.report_leaks(recording)
    finally:
        stop(target)
        subprocess.run(["rm", "-f", f"/tmp/memprof-agent-{target.pid}.ready"])


def test_root_recording_another_users_process_gives_its_agent_a_folder_of_its_own(make_user, memprof_as_root,
                                                                                 request):
    """Root itself (not through sudo) records a user's process: the agent gets the
    recording's agent/ folder made 0700 and given to the user by fchown on its fd, writes
    there, and root reads it; nothing else in the recording is the user's."""
    user = make_user()
    target = user_python(user, WITH_AGENT)
    try:
        target.stdin.write("install\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "installed"
        env = {k: v for k, v in user.sudo_env().items() if not k.startswith("SUDO_")}
        place = Path(tempfile.mkdtemp(prefix="memprof-sec-root-"))  # root's, 0755: the user may pass
        request.addfinalizer(lambda: shutil.rmtree(place, ignore_errors=True))
        os.chmod(place, 0o755)
        recording = place / "root.memprof"
        result = memprof_as_root(user, "record", "-q", "-o", recording, "--pid", target.pid, "--duration", "3",
                                 cwd=place, env=env)
        assert result.returncode == 0, result.stderr
        assert target.stdout.readline().strip() == "agent dir True"
        folder = os.lstat(recording / "agent")
        assert (folder.st_uid, folder.st_mode & 0o777) == (user.uid, 0o700)
        assert os.lstat(recording / "meta.json").st_uid == 0
        from memprof.recording import open_recording
        events = open_recording(recording).events
        marks = events[(events["action"] == "mark") & (events["pid"] == target.pid)]
        # its memprof.mark("attached"): its first step, and the mark's label
        assert list(marks["category"].astype(str)) == ["step", "attached"]
    finally:
        stop(target)

"""The recording folder and `-o` under a root recorder (issue 19, items 1 and 2).

The profiled command runs as the user and may write in its own recording while memprof
records it; the user chooses `-o`. Neither may make root create, change, delete or chown
anything the user could not have touched themselves."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.ebpf


def _owners(path: Path) -> set[int]:
    return {p.lstat().st_uid for p in [path, *path.rglob("*")]}


def _planting_command(recording: Path, targets: list[Path], names: int = 40) -> list[str]:
    """A command that, while it is recorded, plants symlinks to `targets` at every temporary
    name memprof's writer would use in its own recording (meta.json and the first `names`
    parts of each table), then lives long enough for several flushes."""
    script = ["i=0", f"while [ $i -lt {names} ]; do p=$(printf '%06d' $i)"]
    for k, table in enumerate(("events", "stacks", "frames", "samples")):
        target = targets[k % len(targets)]
        script.append(f"ln -sf {target} {recording}/{table}/.part-$p.parquet.tmp 2>/dev/null")
    script += ["i=$((i+1)); done", f"ln -sf {targets[0]} {recording}/.meta.json.tmp", "sleep 1.2",
               f"ln -sf {targets[-1]} {recording}/.meta.json.tmp"]
    return ["/bin/sh", "-c", "; ".join(script)]


def test_links_planted_at_temporary_names_reach_nothing(make_user, canaries, memprof_as_root):
    """Item 1: the command plants links at the temporary names of meta.json and of Parquet
    parts, pointing at a root-only script and at a name that must not come to exist."""
    user = make_user()
    recording = user.home / "run.memprof"
    command = _planting_command(recording, [canaries.script, canaries.absent])
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", *command, cwd=user.home)
    assert result.returncode == 0, result.stderr
    canaries.assert_untouched()
    assert _owners(recording) == {user.uid}
    assert isinstance(user.report_leaks(recording)["findings"], list)


def test_a_table_folder_swapped_for_a_link_gives_root_nothing(make_user, canaries, memprof_as_root):
    """Item 1: the command swaps a folder of its recording for a link to a root-only tree
    just before the end. There is no ownership pass to follow it; a part written there would
    be written as the user, who may not."""
    user = make_user()
    recording = user.home / "run.memprof"
    swap = (f"sleep 0.6; mv {recording}/events {recording}/events.moved; ln -s {canaries.tree} {recording}/events; "
            f"mv {recording}/samples {recording}/samples.moved; ln -s {canaries.tree} {recording}/samples")
    result = memprof_as_root(user, "record", "-q", "-o", recording, "--", "/bin/sh", "-c", swap, cwd=user.home)
    canaries.assert_untouched()
    assert "Traceback" not in result.stderr
    assert _owners(recording) == {user.uid}
    if result.returncode != 0:  # the user broke their own recording: one clear line says so
        assert "cannot write the recording" in result.stderr


def test_o_creates_nothing_the_user_could_not(make_user, canaries, memprof_as_root):
    """Item 2: `-o` in a folder the user may not write (a systemd drop-in folder, here a
    root-only one) is refused as the user would be, and creates nothing there."""
    user = make_user()
    target = canaries.root / "x.d" / "run.memprof"
    result = memprof_as_root(user, "record", "-q", "-o", target, "--", "/bin/true", cwd=user.home)
    assert result.returncode == 2, result.stderr
    assert "cannot create" in result.stderr and "Permission denied" in result.stderr
    assert "Traceback" not in result.stderr
    canaries.assert_untouched()


@pytest.mark.parametrize("what", ["root_file", "link_to_root_file", "root_recording", "link_to_users_recording"])
def test_force_replaces_only_the_users_own_recording(make_user, canaries, memprof_as_root, what):
    """Item 2: --force never deletes a file, a symlink, or a recording that is not the user's."""
    user = make_user()
    root_recording = canaries.root / "root.memprof"
    root_recording.mkdir()
    (root_recording / "meta.json").write_text(json.dumps({"memprof_version": "0.1.0"}))
    mine = user.home / "mine.memprof"
    subprocess.run(user.argv(["mkdir", str(mine)]), check=True)
    user.write(mine / "meta.json", json.dumps({"memprof_version": "0.1.0"}))
    canaries.state = canaries.snapshot()
    if what == "root_file":
        target = canaries.script
    elif what == "root_recording":
        target = root_recording
    else:
        target = user.home / "link.memprof"
        subprocess.run(user.argv(["ln", "-s", str(canaries.script if what == "link_to_root_file" else mine),
                                  str(target)]), check=True)
    result = memprof_as_root(user, "record", "-q", "--force", "-o", target, "--", "/bin/true", cwd=user.home)
    assert result.returncode == 2, result.stderr
    assert "refusing to replace it" in result.stderr or "Permission denied" in result.stderr
    canaries.assert_untouched()
    assert (mine / "meta.json").exists()


def test_force_replaces_the_users_own_recording(make_user, memprof_as_root):
    user = make_user()
    recording = user.home / "run.memprof"
    for _ in range(2):
        result = memprof_as_root(user, "record", "-q", "--force", "-o", recording, "--", "/bin/true", cwd=user.home)
        assert result.returncode == 0, result.stderr
    assert _owners(recording) == {user.uid}
    user.report_leaks(recording)

"""A target in a mount namespace of its own (a container, `unshare -m`): its libraries and
interpreter are the files *it* maps, which at the same paths in memprof's namespace are
other files or none (memprof/sources/symbols/files.py, `locate`; symbolize.reachable).

Played with `unshare -m`:
- a bind mount of a copy of torch's libc10.so over the venv's: the process maps the copy,
  whose inode root's namespace does not have at that path. A uprobe placed by the path in
  root's namespace went on root's libc10 and saw none of the process's tensors (0 of 8,
  before files.locate);
- an interpreter whose libpython is only in the process's namespace (a tmpfs there, found
  through LD_LIBRARY_PATH), as a container's is: looked for in root's namespace, it was not
  found, and the process got no Python frames;
- a process chrooted inside its own namespace, whose maps name its files from the
  namespace's root rather than its chroot."""
from __future__ import annotations

import glob
import json
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

SCRIPT = """
import os, torch
held = []

def hold_tensors():
    for _ in range(8):
        held.append(torch.empty(3 << 20, dtype=torch.uint8))

hold_tensors()
os._exit(0)  # no interpreter teardown: the tensors are held to the end
"""
TENSOR_BYTES = 3 << 20


class TensorsInNamespace(NamedTuple):
    libc10: Path  # the venv's, which the namespace covers with `copy`
    copy: Path
    script: Path  # SCRIPT


@pytest.fixture
def tensors_in_namespace(tmp_path) -> TensorsInNamespace:
    torch = pytest.importorskip("torch")
    if shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip("unshare and chroot (util-linux, coreutils) play the container")
    libc10 = Path(torch.__file__).parent / "lib" / "libc10.so"
    copy = tmp_path / "libc10.so"
    shutil.copy(libc10, copy)
    script = tmp_path / "hold.py"
    script.write_text(SCRIPT)
    return TensorsInNamespace(libc10, copy, script)


def held_tensors(leaks_json, recording: Path) -> list[dict]:
    """The findings whose chain holds hold_tensors, each checked to be all 8 tensors."""
    found = leaks_json(recording, "--top", "100000", "--min-age", "0")["findings"]
    tensors = [f for f in found if f["layer"] == "torch_cpu" and "hold_tensors" in python_functions(f)]
    assert [(f["live_count"], f["live_bytes"]) for f in tensors] == [(8, 8 * TENSOR_BYTES)], \
        [(f["layer"], f["live_count"], f["live_bytes"]) for f in found[:10]]
    return tensors


def test_a_namespaced_process_is_probed_in_its_own_libc10_with_its_python_frames(
        tensors_in_namespace, tmp_path, run_memprof, leaks_json):
    libc10, copy, script = tensors_in_namespace
    recording = tmp_path / "ns.memprof"
    inside = 'mount --bind "$1" "$2" && exec "$3" "$4"'
    result = run_memprof("record", "-q", "-o", recording, "--", "unshare", "-m", "sh", "-c", inside,
                         "sh", copy, libc10, sys.executable, script, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr

    tensors = held_tensors(leaks_json, recording)
    assert python_functions(tensors[0])[:2] == ["hold_tensors", "<module>"]
    uprobes = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["uprobes"]
    [(path, lib)] = [(p, lib) for p, lib in uprobes.items() if lib["family"] == "torch"]
    assert path.startswith("/proc/") and path.endswith(f"/root{libc10}") and lib["probes"] >= 1, uprobes


def test_a_process_chrooted_in_its_own_namespace_is_probed_in_its_chroot(
        tensors_in_namespace, tmp_path, run_memprof, leaks_json):
    """Chrooted inside its own mount namespace (a build sandbox does so; a container's
    pivot_root does not), a process's maps name its files from the namespace's root, not
    from its /proc/PID/root: taken as they were, the tensors were lost again (0 of 8)."""
    libc10, copy, script = tensors_in_namespace
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    wanted = {"usr", "lib", "lib64", "bin", "etc", "dev", "proc", "sys", "tmp", "root",
              Path(sys.executable).parts[1], Path(__file__).resolve().parts[1]}  # this checkout, its Python
    folders = []
    for name in sorted(wanted):
        if Path("/", name).is_symlink():  # merged /usr: /lib -> usr/lib
            (rootfs / name).symlink_to(Path("/", name).readlink())
        elif Path("/", name).is_dir():
            (rootfs / name).mkdir()
            folders.append(name)
    binds = " && ".join(f'mount --rbind /{f} "$1/{f}"' for f in folders)
    inside = binds + ' && mount --bind "$2" "$1$3" && exec chroot "$1" "$4" "$5"'
    recording = tmp_path / "chroot.memprof"
    result = run_memprof("record", "-q", "-o", recording, "--", "unshare", "-m", "sh", "-c", inside,
                         "sh", rootfs, copy, libc10, sys.executable, script, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    held_tensors(leaks_json, recording)


def python_functions(finding: dict) -> list[str]:
    return [frame["function"] for frame in finding["stack"] if frame["kind"] == "python"]


# Registered by the poll of its mappings (nothing registers at the start an interpreter first
# seen in the middle of a recording), so the pipes come after a pause.
PIPES = """
import os, subprocess, sys, time
held = []

def pipes_inner():
    for _ in range(20):
        held.append(os.pipe())

def pipes_outer():
    pipes_inner()

time.sleep(0.5)
pipes_outer()
subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)  # another process of it
"""


def test_an_interpreter_only_in_the_process_namespace_gives_python_frames(tmp_path, run_memprof, leaks_json):
    found = sorted(glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12"))
    if not found or shutil.which("unshare") is None:
        pytest.skip("needs pyenv's CPython 3.12 (a shared libpython) and unshare (util-linux)")
    python = Path(found[-1])
    libpython = python.parent.parent / "lib" / "libpython3.12.so.1.0"
    only_inside = tmp_path / "ctr-lib"  # empty in root's namespace
    only_inside.mkdir()
    script = tmp_path / "pipes.py"
    script.write_text(PIPES)
    recording = tmp_path / "ns-py.memprof"
    inside = 'mount -t tmpfs none "$1" && cp "$2" "$1/" && LD_LIBRARY_PATH="$1" exec "$3" "$4"'
    result = run_memprof("record", "-q", "-o", recording, "--", "unshare", "-m", "sh", "-c", inside,
                         "sh", only_inside, libpython, python, script, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr

    leaks = leaks_json(recording, "--top", "100000", "--min-age", "0")["findings"]
    pipes = [f for f in leaks if f["layer"] == "kernel_slab" and "pipes_inner" in python_functions(f)]
    assert pipes and all(python_functions(f)[:3] == ["pipes_inner", "pipes_outer", "<module>"] for f in pipes), \
        [(f["layer"], f["live_count"], python_functions(f)) for f in leaks[:10]]
    notes = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["detail"]["python"]["interpreters"]
    [(path, note)] = [(p, n) for p, n in notes.items() if "3.12" in p]  # one file, two processes: one note
    assert path.endswith(f"/root{only_inside}/libpython3.12.so.1.0") and note["frames"], notes

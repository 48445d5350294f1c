"""Which allocator libraries `record` can probe before the command starts: the command's own
Python environment, a virtual environment included (no root needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memprof.sources.ebpf.uprobes import find_known_libraries


@pytest.fixture(scope="module")
def venv_with_torch_lib(tmp_path_factory) -> tuple[Path, Path]:
    """A real virtual environment (no pip) whose site-packages holds a torch/lib/libc10.so
    file (an empty stand-in: only its path is looked for)."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    lib = site / "torch" / "lib" / "libc10.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    # A .pth file's import lines run when site processes the folder: memprof, as root, must not.
    marker = root / "pth-ran"
    (site / "zz_memprof_test.pth").write_text(f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n")
    return root / "bin" / "python", lib


def test_a_virtual_environments_torch_is_found_before_the_command_starts(venv_with_torch_lib):
    python, lib = venv_with_torch_lib
    assert find_known_libraries(str(python), environ={})["torch"] == [str(lib.resolve())]
    assert not (python.parent.parent / "pth-ran").exists()  # and none of its .pth files ran


def test_the_interpreter_outside_that_environment_does_not_see_it(venv_with_torch_lib):
    _, lib = venv_with_torch_lib
    assert str(lib.resolve()) not in find_known_libraries("/usr/bin/python3", environ={})["torch"]


def test_a_command_that_is_not_python_gets_no_site_packages(venv_with_torch_lib):
    assert find_known_libraries("/bin/true", environ={})["torch"] == []


def test_symbols_read_ahead_for_a_command_and_for_a_process_attached_to():
    """What SymbolPrewarm reads while bcc compiles: torch's main libraries and the Python
    runtime — found in the command's environment for `record -- CMD`, in the process's
    mappings for `record --pid` — and libc."""
    import os

    import torch

    from memprof.sources.cpython.interp import runtime_file
    from memprof.sources.ebpf.library_probes import current_maps, known_libraries, prewarm_paths
    from memprof.sources.ebpf.source import EbpfOptions
    from memprof.sources.ebpf.uprobes import libc_paths
    torch_lib = os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib"))
    wanted = {os.path.join(torch_lib, name) for name in ("libc10.so", "libtorch_cpu.so", "libtorch_python.so")}
    wanted |= {runtime_file(os.path.realpath(sys.executable)), *libc_paths()}

    options = EbpfOptions()
    assert set(prewarm_paths(known_libraries(options, sys.executable), sys.executable, [])) == wanted

    with subprocess.Popen([sys.executable, "-c", "import torch, sys; print(flush=True); sys.stdin.read()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        process.stdout.readline()  # torch is imported: its libraries are mapped
        paths = prewarm_paths(known_libraries(options, None), None, [current_maps(process.pid)])
        process.stdin.close()
    assert set(paths) == wanted


# ---- the interpreter query: nothing from the working folder, bounded, as the command's user ----

PLANTED = "import os; open({marker!r}, 'a').write('imported')\n"


def _pythons() -> list[str]:
    """The venv's interpreter, and pyenv's 3.10 where the image has it (under -S, 3.10 has
    not imported os when the query's first line runs)."""
    import glob
    return [sys.executable, *sorted(glob.glob("/root/.pyenv/versions/3.10.*/bin/python3.10"))[-1:]]


@pytest.mark.parametrize("module", ["site", "os"])
def test_the_query_imports_no_module_planted_in_the_working_folder(module, tmp_path, monkeypatch):
    """`python -S -c` puts the working folder first on sys.path, where the command's user
    may have put a site.py or an os.py: the query runs none of it, and still answers."""
    from memprof.sources.ebpf.uprobes import _python_site_dirs
    marker = tmp_path / "imported"
    (tmp_path / f"{module}.py").write_text(PLANTED.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    for python in _pythons():
        assert _python_site_dirs(python), python
        assert not marker.exists(), f"{python} imported the planted {module}.py"


def test_the_query_gives_up_on_an_interpreter_that_floods_or_hangs(tmp_path, monkeypatch):
    """What root reads of the user's program is bounded: past 1 MiB of output, or past the
    time limit, the answer is empty (the libraries are then probed as they are mapped) and
    the program is killed."""
    from memprof.sources.ebpf import uprobes
    monkeypatch.setattr(uprobes, "_SITE_DIRS_TIMEOUT_S", 1)
    flood = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x/site-packages\\n' * 1000)"]
    hang = [sys.executable, "-c", "import time; print('/x/site-packages', flush=True); time.sleep(60)"]
    answer = [sys.executable, "-c", "print('/x/site-packages')"]
    closes = [sys.executable, "-c", "import os, time; print('/x/site-packages', flush=True); os.close(1); time.sleep(60)"]
    assert uprobes._bounded_output(flood, None) == ""
    assert uprobes._bounded_output(hang, None) == ""
    assert uprobes._bounded_output(closes, None) == ""  # its output closed, still running past the limit
    assert uprobes._bounded_output(answer, None) == "/x/site-packages\n"
    assert uprobes._bounded_output([str(tmp_path / "missing")], None) == ""


def test_the_query_runs_with_the_commands_user_groups_and_home():
    """The arguments that make subprocess run the query as capture/target.py's child runs the
    command: the user's uid, gid and groups, and their HOME, USER and LOGNAME."""
    from memprof.capture.target import RunAs
    from memprof.sources.ebpf.uprobes import _as_command_user
    kw = _as_command_user(RunAs(1234, 2345, [2345, 77], "/home/alice", "alice"))
    assert (kw["user"], kw["group"], kw["extra_groups"]) == (1234, 2345, [2345, 77])
    assert (kw["env"]["HOME"], kw["env"]["USER"], kw["env"]["LOGNAME"]) == ("/home/alice", "alice", "alice")
    assert set(_as_command_user(None)) == {"env"}  # memprof's own user: as the command, unchanged


def test_the_querys_answer_is_taken_as_folders_not_patterns(tmp_path, monkeypatch):
    """The interpreter's answer is the user's program's output: a `*` in it names a folder
    called `*`, never every folder root can list."""
    from memprof.sources.ebpf import uprobes
    lib = tmp_path / "real" / "torch" / "lib" / "libc10.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setattr(uprobes, "_python_site_dirs", lambda *a: [str(tmp_path / "*")])
    assert uprobes.find_known_libraries("/usr/bin/python3", environ={})["torch"] == []
    monkeypatch.setattr(uprobes, "_python_site_dirs", lambda *a: [str(tmp_path / "real")])
    assert uprobes.find_known_libraries("/usr/bin/python3", environ={})["torch"] == [str(lib)]


def test_a_console_script_finds_the_torch_of_the_python_on_its_shebang_line(venv_with_torch_lib, tmp_path):
    """torchrun and every console script pip writes: `#!/abs/venv/bin/python`. Its libc10 is
    probed before the command starts, as for `python script.py`."""
    python, lib = venv_with_torch_lib
    script = tmp_path / "torchrun"
    script.write_text(f"#!{python}\nimport sys\n")
    script.chmod(0o755)
    assert find_known_libraries(str(script), environ={})["torch"] == [str(lib.resolve())]


@pytest.mark.parametrize("first_line, wanted", [
    ("#!/venv/bin/python3.11 -u", "/venv/bin/python3.11"),
    ("#!/usr/bin/env python3", "which:python3"),
    ("#!/bin/sh", None),  # a shell script: not a Python
    ("import sys", None),  # no #! line
])
def test_the_python_a_command_runs(tmp_path, first_line, wanted):
    import shutil

    from memprof.sources.cpython.frames import command_python
    script = tmp_path / "cmd"
    script.write_text(first_line + "\n")
    if wanted and wanted.startswith("which:"):
        wanted = shutil.which(wanted[len("which:"):])
    assert command_python(str(script)) == wanted
    assert command_python("/usr/bin/python3") == "/usr/bin/python3"  # a Python itself

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
    from memprof.sources.ebpf.library_probes import known_libraries, prewarm_paths
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
        paths = prewarm_paths(known_libraries(options, None), None, [process.pid])
        process.stdin.close()
    assert set(paths) == wanted

"""What a whole recording loads into the recorder's process (issue 24: size and start-up),
with real eBPF: no pandas, no pyarrow.compute and no S3 library, whatever the command and
whether or not the status line (and its live bytes) is on; and the recording it writes
reads back with the known numbers. Decoding
and writing alone are checked without privileges in tests/unit/test_startup_imports.py.

And what `record` has imported when it lets the command start: with what it keeps across
runs in place (the compiled program, libc10's call site, the interpreter's answers), neither
capstone nor pandas, and numpy and pyarrow already (cli/record.py says why before, not
after); the recording is whole: the tensors a Python command holds, with its Python frames.
(pyelftools is in too: the symbol read-ahead, on its own thread, reads small libraries'
tables with it.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.test_kernel import KERNEL_LEAK, PIPE_BUFFER_ARRAY_BYTES, pipe_info_finding
from tests.integration.test_mount_namespaces import SCRIPT, held_tensors, python_functions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _record_in_process(tmp_path: Path, args: list[str]) -> dict:
    """`memprof record ARGS` run by memprof's click group in a fresh interpreter; what it
    exited with, whether pandas or pyarrow.compute was ever imported in that process, and
    whether S3's library was loaded (~11 and ~9 MB of its RSS: recording/arrow_build.py,
    lazy_import.py). (Not by main(), which ends `record` with os._exit before anyone could
    ask.)"""
    script = textwrap.dedent(f"""
        import json, sys
        from memprof.cli.main import cli
        sys.argv = ["memprof", "record", *{args!r}]
        try:
            cli(prog_name="memprof")
            code = 0
        except SystemExit as e:
            code = e.code
        print(json.dumps({{"exit": code, "pandas": "pandas" in sys.modules,
                          "compute": "pyarrow.compute" in sys.modules,
                          "s3": "libarrow_s3" in open("/proc/self/maps").read()}}), file=sys.__stdout__)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "status-line"])
def test_a_recording_of_a_python_program_never_imports_pandas(tmp_path, quiet):
    grow = "x = [bytearray(4096) for _ in range(2000)]; import json; json.dumps(list(range(1000)))"
    out = _record_in_process(tmp_path, [*(["-q"] if quiet else []), "-o", "py.memprof", "--",
                                        sys.executable, "-c", grow])
    assert out == {"exit": 0, "pandas": False, "compute": False, "s3": False}


def test_a_recording_without_pandas_finds_the_known_kernel_leak(tmp_path, leaks_json):
    out = _record_in_process(tmp_path, ["-q", "-o", "leak.memprof", "--", KERNEL_LEAK])
    assert out == {"exit": 0, "pandas": False, "compute": False, "s3": False}
    finding = pipe_info_finding(leaks_json(tmp_path / "leak.memprof", "--layer", "kernel_slab", "--top", "1000"))
    assert (finding["live_count"], finding["live_bytes"]) == (257, 257 * PIPE_BUFFER_ARRAY_BYTES)


# `python -c HOOK record …`: memprof's own entry point, which writes the names of the
# imported modules to $MODULES_AT_RELEASE the moment it lets the command start.
HOOK = """
import json, os, sys
from memprof.capture import target

release = target.GatedChild.release


def noting_release(self, *args, **kwargs):
    with open(os.environ["MODULES_AT_RELEASE"], "w") as f:
        json.dump(sorted(sys.modules), f)
    return release(self, *args, **kwargs)


target.GatedChild.release = noting_release
sys.argv[0] = "memprof"
from memprof.cli.main import main
main()
"""
HEAVY = ("pandas", "capstone")


def test_the_command_starts_without_capstone_with_numpy_and_pyarrow_already_in(tmp_path, leaks_json):
    pytest.importorskip("torch")
    script = tmp_path / "hold.py"
    script.write_text(SCRIPT)
    noted = tmp_path / "modules.json"
    for run in range(2):  # the first keeps what the second finds kept (a fresh CI machine has nothing)
        recording = tmp_path / f"r{run}.memprof"
        result = subprocess.run([sys.executable, "-c", HOOK, "record", "-q", "-o", str(recording), "--",
                                 sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                                timeout=300, env={**os.environ, "MODULES_AT_RELEASE": str(noted)})
        assert result.returncode == 0, result.stderr
    modules = json.loads(noted.read_text())
    assert "memprof.capture.session" in modules and "memprof.sources.ebpf.source" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert "numpy" in modules and "pyarrow" in modules

    tensors = held_tensors(leaks_json, recording)
    assert python_functions(tensors[0])[:2] == ["hold_tensors", "<module>"]

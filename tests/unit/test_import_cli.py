"""`memprof import`: snapshots → a recording the reports read; hostile and bad files refused
with exit 5 and one line, and nothing they name ever run."""
from __future__ import annotations

import gzip
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memprof.cli.main import cli
from memprof.importer import CLOCK_NOTE, default_output
from memprof.recording import open_recording

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
LEAK = DATA / "handbuilt_snapshot_leak.pickle"
MARKER = "memprof_hostile_marker"  # what the hostile fixtures' payloads would create in their cwd
HOSTILE = {
    "handbuilt_hostile_reduce_system.pickle": "posix.system",
    "handbuilt_hostile_reduce_eval.pickle": "builtins.eval",
    "handbuilt_hostile_inst_system.pickle": "os.system",
    "handbuilt_hostile_global_class.pickle": "collections.OrderedDict",
}
MiB = 1 << 20


def invoke(*args):
    """Run the CLI in this process; (exit code, stdout, stderr)."""
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def memprof(*args, cwd: Path) -> subprocess.CompletedProcess:
    """Run `python -m memprof` in a separate process, in `cwd`."""
    return subprocess.run([sys.executable, "-m", "memprof", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# --- a good snapshot ----------------------------------------------------------------------

def test_import_writes_a_recording_with_its_clock_and_source_stats(tmp_path):
    out = tmp_path / "leak.memprof"
    code, _, err = invoke("import", LEAK, "-o", out)
    assert code == 0, err
    assert f"imported 102 events on cuda:0 from 1 file to {out}" in err
    rec = open_recording(out)
    assert rec.complete and rec.meta.clock == "CLOCK_REALTIME" and rec.meta.command is None and rec.meta.pid is None
    assert rec.meta.start_ns == 1_700_000_000_000_000_000 and rec.meta.end_ns == 1_700_000_003_000_000_000
    source = rec.meta.sources["torch_snapshot"]
    assert source.events == 102 and source.timestamp_precision_ns == 1000
    assert source.detail["entries"] == 97 and source.detail["devices"] == ["cuda:0"]
    assert source.detail["files"][0]["path"] == str(LEAK)
    assert source.detail["files"][0]["allocator_settings"]["max_split_size"] == 512 * MiB
    assert rec.meta.notes[0] == CLOCK_NOTE and any("no alloc in its trace" in n for n in rec.meta.notes)
    assert len(rec.events) == 102 and set(rec.events["pid"]) == {0}
    assert set(rec.frames["kind"]) == {"python", "native"}


def test_report_leaks_json_finds_the_23_leaked_mib_and_names_the_line(tmp_path):
    assert invoke("import", LEAK, "-o", tmp_path / "leak.memprof")[0] == 0
    done = memprof("report", "leaks", "leak.memprof", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    findings = json.loads(done.stdout)["findings"]
    blocks = [f for f in findings if f["layer"] == "cuda_block"]
    leak = blocks[0]
    assert (leak["live_bytes"], leak["live_count"]) == (23 * MiB, 23)
    assert leak["stack"][0] == {"kind": "python", "function": "cache_batch", "module": None,
                                "file": "/work/job/train.py", "line": 42}
    assert leak["python_frames"] and leak["confirmed"] and not leak["released_at_exit"]
    # The weights held since before the trace began are found too, after the 23 MiB.
    assert [(f["live_bytes"], f["stack"][0]["function"]) for f in blocks[1:]] == [(8 * MiB, "__init__")]


def test_report_layers_reads_an_imported_recording(tmp_path):
    assert invoke("import", LEAK, "-o", tmp_path / "leak.memprof")[0] == 0
    code, out, err = invoke("report", "layers", tmp_path / "leak.memprof", "--format", "json")
    assert code == 0, err
    layers = {layer["layer"]: layer for layer in json.loads(out)["layers"]}
    # 23 leaks + 8 MiB weights + a 2 MiB block awaiting its free + one 4 MiB activation.
    assert layers["cuda_block"]["peak_bytes"] == 37 * MiB and layers["cuda_block"]["final_bytes"] == 31 * MiB
    assert layers["cuda_segment"]["final_bytes"] == 84 * MiB


def test_default_output_is_the_first_files_stem_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("import", LEAK)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["handbuilt_snapshot_leak.memprof"]
    assert default_output("a/snap.pickle.gz") == Path("snap.memprof")
    assert default_output("snap.pkl", "/tmp") == Path("/tmp/snap.memprof")
    assert default_output(".pickle") == Path(".pickle.memprof")


def test_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "leak.memprof"
    assert invoke("import", LEAK, "-o", out)[0] == 0
    code, _, err = invoke("import", LEAK, "-o", out)
    assert code == 2 and "exists" in err and "--force" in err
    assert invoke("import", LEAK, "-o", out, "--force")[0] == 0


def test_gzip_snapshots_are_read(tmp_path):
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(LEAK.read_bytes(), mtime=0))
    code, _, err = invoke("import", gz, "-o", tmp_path / "gz.memprof")
    assert code == 0, err
    assert len(open_recording(tmp_path / "gz.memprof").events) == 102


def test_several_files_append_and_overlapping_ones_are_warned_about(tmp_path):
    out = tmp_path / "both.memprof"
    code, _, err = invoke("import", LEAK, DATA / "handbuilt_snapshot_expandable.pickle", "-o", out)
    assert code == 0, err
    assert "cover the same time on cuda:0" in err
    rec = open_recording(out)
    assert len(rec.events) == 102 + 12 and sorted(rec.events["seq"]) == list(range(114))
    assert len(rec.meta.sources["torch_snapshot"].detail["files"]) == 2
    assert any(n.startswith("handbuilt_snapshot_leak.pickle: ") for n in rec.meta.notes)
    # One frame table for both: no frame stored twice.
    keys = list(zip(rec.frames["function"], rec.frames["file"], rec.frames["line"]))
    assert len(keys) == len(set(keys))


def test_help_says_what_it_reads_and_that_no_privileges_are_needed():
    code, out, _ = invoke("import", "--help")
    assert code == 0
    assert "_dump_snapshot" in out and "No privileges needed" in out and "exit status 5" in out


def test_no_file_is_a_usage_error():
    code, _, err = invoke("import")
    assert code == 2 and "FILE..." in err


# --- hostile pickles ----------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_pickles_are_refused_with_one_line_and_never_run(tmp_path, name):
    done = memprof("import", DATA / name, "-o", "out.memprof", cwd=tmp_path)
    assert done.returncode == 5
    lines = error_lines(done.stderr)
    assert len(lines) == 2 and lines[1].startswith("hint: nothing in it was run")
    assert lines[0] == (f"memprof: error: {DATA / name}: refused to unpickle a global ({HOSTILE[name]}): "
                        "a CUDA snapshot holds only plain data")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "out.memprof").exists()


@pytest.mark.parametrize("name", ["handbuilt_hostile_reduce_system.pickle", "handbuilt_hostile_reduce_eval.pickle",
                                  "handbuilt_hostile_inst_system.pickle"])
def test_the_hostile_fixtures_do_run_their_payload_under_plain_pickle(tmp_path, name):
    """The control: these fixtures have teeth, so the refusals above prove something."""
    if shutil.which("touch") is None and "eval" not in name:
        pytest.skip("no touch(1) on PATH for the payload")
    subprocess.run([sys.executable, "-c", "import pickle, sys\ntry: pickle.load(open(sys.argv[1], 'rb'))\n"
                    "except Exception: pass", str(DATA / name)], cwd=tmp_path, check=True,
                   env={"PATH": "/usr/bin:/bin"})
    assert (tmp_path / MARKER).exists()


def test_a_hostile_file_after_a_good_one_leaves_nothing_behind(tmp_path):
    code, _, err = invoke("import", LEAK, DATA / "handbuilt_hostile_reduce_system.pickle", "-o", tmp_path / "o.memprof")
    assert code == 5 and "refused to unpickle a global (posix.system)" in err
    assert not (tmp_path / "o.memprof").exists()


# --- bad paths and files ------------------------------------------------------------------

def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "missing.pickle", "missing.pickle does not exist"),
    (lambda d: d, "is a directory, not a snapshot file"),
    (lambda d: _write(d, "empty.pickle", b""), "empty.pickle is empty"),
    (lambda d: _write(d, "text.pickle", b"segments: []\n"), "text.pickle: not a pickle"),
    (lambda d: _write(d, "cut.pickle", LEAK.read_bytes()[:3000]), "cut.pickle: truncated pickle"),
    (lambda d: _write(d, "cut.pickle.gz", gzip.compress(LEAK.read_bytes())[:300]), "truncated or damaged gzip"),
    (lambda d: _write(d, "int.pickle", pickle.dumps(42)), "int.pickle: holds a int, not a CUDA memory snapshot"),
    (lambda d: _write(d, "dict.pickle", pickle.dumps({"model": 1})), "no 'segments' or 'device_traces' key"),
    (lambda d: _write(d, "entry.pickle", pickle.dumps({"device_traces": [[{"action": "alloc", "addr": None}]]})),
     "entry.pickle: device_traces[0][0]: addr is None, not an address"),
])
def test_bad_inputs_exit_5_with_one_clear_line(tmp_path, make, expected):
    path = make(tmp_path)
    code, _, err = invoke("import", path, "-o", tmp_path / "out.memprof")
    assert code == 5, err
    lines = error_lines(err)
    assert len(lines) == 2 and lines[0].startswith("memprof: error: ") and lines[1].startswith("hint: ")
    assert expected in lines[0]
    assert not (tmp_path / "out.memprof").exists()


# --- nothing half-written (issue 19) -------------------------------------------------------

def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_while_writing_leaves_no_recording_and_no_temporary_one(tmp_path, monkeypatch, error):
    from memprof.recording.writer import RecordingWriter

    def fail(self):
        raise error
    monkeypatch.setattr(RecordingWriter, "finalize", fail)
    code, _, err = invoke("import", LEAK, "-o", tmp_path / "out.memprof")
    if isinstance(error, OSError):
        assert code == 1 and f"cannot write {tmp_path / 'out.memprof'}: No space left on device" in err
    else:
        assert code == 130
    assert "internal error" not in err and _siblings(tmp_path) == []


def test_a_failed_import_with_force_keeps_the_old_recording(tmp_path):
    out = tmp_path / "out.memprof"
    assert invoke("import", LEAK, "-o", out)[0] == 0
    nan_time = {"device_traces": [[{"action": "alloc", "time_us": float("nan")}]]}
    bad = _write(tmp_path, "bad.pickle", pickle.dumps(nan_time))
    code, _, err = invoke("import", bad, "-o", out, "--force")
    assert code == 5 and "device_traces[0][0]: time_us is nan, not epoch microseconds" in err
    assert len(open_recording(out).events) == 102
    assert _siblings(tmp_path) == ["bad.pickle", "out.memprof"]


def test_force_replaces_an_old_recording_with_the_complete_new_one(tmp_path):
    out = tmp_path / "out.memprof"
    assert invoke("import", DATA / "handbuilt_snapshot_expandable.pickle", "-o", out)[0] == 0
    assert invoke("import", LEAK, "-o", out, "--force")[0] == 0
    rec = open_recording(out)
    assert rec.complete and len(rec.events) == 102
    assert _siblings(tmp_path) == ["out.memprof"]


def test_force_never_replaces_what_is_not_a_recording(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious.txt").write_text("mine")
    code, _, err = invoke("import", LEAK, "-o", keep, "--force")
    assert code == 2 and "refusing to replace it" in err
    assert (keep / "precious.txt").read_text() == "mine" and _siblings(tmp_path) == ["keep"]


# --- files that would cost memory out of all proportion (issue 19) -----------------------

@pytest.mark.parametrize("data, expected", [
    (b"\x80\x02Nr\x00\x00\x00\x04.", "memo index 67,108,864 in a 9-byte file"),
    (b"\x80\x05\x96" + (2**40).to_bytes(8, "little") + b"x.", "truncated pickle (the opcode at byte 2"),
    (gzip.compress(b"\0" * (80 << 20)), "decompresses to more than 67,108,864 bytes"),
    (gzip.compress(gzip.compress(b"x")), "a gzip file inside a gzip file"),
])
def test_amplifying_files_are_refused_before_they_cost_memory(tmp_path, data, expected):
    path = _write(tmp_path, "in.pickle", data)
    code, _, err = invoke("import", path, "-o", tmp_path / "out.memprof")
    assert code == 5 and expected in err
    assert _siblings(tmp_path) == ["in.pickle"]


def test_more_than_128_devices_are_refused(tmp_path):
    entry = {"action": "alloc", "addr": 4096, "size": 64, "time_us": 1}
    path = _write(tmp_path, "many.pickle", pickle.dumps({"device_traces": [[entry]] * 129}))
    code, _, err = invoke("import", path, "-o", tmp_path / "out.memprof")
    assert code == 5 and "the files name 129 devices, more than the 128 a recording holds" in err


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    import os
    os.mkfifo(tmp_path / "fifo.pickle")
    code, _, err = invoke("import", tmp_path / "fifo.pickle", "-o", tmp_path / "out.memprof")
    assert code == 5 and "is not a regular file" in err

"""`-o` is the same in every command (issue 20 item 10): `-o -` is stdout where the output is
one file (a binary format is refused on a terminal, a directory always), never a file named
'-'; every file written is announced once on stderr as `memprof: wrote PATH (…)`."""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from memprof.cli import output
from memprof.cli.main import cli
from tests.export_factories import write_recording

FOLDED = "cuda_block;[no stack] 2097152\n"  # the first line of the known recording's folded stacks
WROTE = re.compile(r"^memprof: wrote (\S+) \(.+\)$")


@pytest.fixture
def recording(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a file named '-' would land here
    return write_recording(tmp_path / "run.memprof")


def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout_bytes, result.stderr


def wrote_lines(err: str) -> list[str]:
    """The paths of the `memprof: wrote PATH (…)` lines."""
    return [m.group(1) for m in map(WROTE.match, err.splitlines()) if m]


@pytest.mark.parametrize("args, starts", [
    (["report", "chains", "{rec}", "--flame", "-o", "-"], FOLDED.encode()),
    (["export", "{rec}", "--format", "folded", "-o", "-"], FOLDED.encode()),
    (["export", "{rec}", "--format", "chrome-trace", "-o", "-"], b'{"traceEvents": ['),
    (["export", "{rec}", "--format", "pprof", "-o", "-"], b"\x1f\x8b"),  # gzip, to a pipe
    (["report", "html", "{rec}", "-o", "-"], b"<!DOCTYPE html>"),
    (["report", "html", "{rec}", "--format", "json", "-o", "-"], b'{\n "version"'),
])
def test_dash_is_stdout_and_no_file_named_dash_is_made(recording, args, starts):
    code, out, err = invoke(*(a.format(rec=recording) for a in args))
    assert code == 0, err
    assert out.startswith(starts) and not Path("-").exists()
    assert wrote_lines(err) == []  # nothing written but stdout: nothing to announce


@pytest.mark.parametrize("fmt", ["pprof", "perfetto"])
def test_a_binary_format_is_not_written_to_a_terminal(recording, monkeypatch, fmt):
    monkeypatch.setattr(output, "stdout_is_terminal", lambda: True)
    code, out, err = invoke("export", recording, "--format", fmt, "-o", "-")
    assert code == 2 and out == b"" and not Path("-").exists()
    assert "binary and stdout is a terminal" in err and "-o - > FILE" in err


@pytest.mark.parametrize("args", [["import", "snap.pickle", "-o", "-"], ["record", "-o", "-", "--", "true"],
                                  ["export", "{rec}", "--format", "csv", "-o", "-"]])
def test_a_directory_output_refuses_dash(recording, args):
    code, _, err = invoke(*(a.format(rec=recording) for a in args))
    assert code == 2 and "stdout" in err and not Path("-").exists()


@pytest.mark.parametrize("args, path", [
    (["report", "chains", "{rec}", "--flame", "-o", "x.folded"], "x.folded"),
    (["report", "html", "{rec}", "-o", "x.html"], "x.html"),
    (["export", "{rec}", "--format", "pprof", "-o", "x.pb.gz"], "x.pb.gz"),
    (["export", "{rec}", "--format", "csv", "-o", "tables"], "tables"),
    (["export", "{rec}", "--format", "parquet", "-o", "tables"], "tables"),
])
def test_every_file_written_is_announced_once_the_same_way(recording, args, path):
    code, _, err = invoke(*(a.format(rec=recording) for a in args))
    assert code == 0, err
    assert wrote_lines(err) == [path] and Path(path).exists()


def test_the_pprof_written_to_a_pipe_is_the_pprof_written_to_a_file(recording):
    _, piped, _ = invoke("export", recording, "--format", "pprof", "-o", "-")
    invoke("export", recording, "--format", "pprof", "-o", "x.pb.gz")
    assert gzip.decompress(piped) == gzip.decompress(Path("x.pb.gz").read_bytes())

"""Tampered recordings (tests/fuzz/corpus_recording.py) through the commands that read them:
`report summary`, `report leaks` and `export --format perfetto`. Never an internal error; a
recording the tampering damaged is refused with exit 5 and one line naming what is wrong
(meta.json's field, the part); one it left readable is read (exit 0), except that a negative
time cannot go into a Perfetto trace (that export alone exits 5); random bytes in a part give
one or the other."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from memprof.cli.main import cli
from memprof.errors import BadRecordingError
from memprof.recording import open_recording
from tests.fuzz.corpus_recording import base_recording, recording_corpus

MIN_REFUSED = 300


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{name: (expected, [(command, exit code, output)])} for every tampered recording."""
    root = tmp_path_factory.mktemp("recording-fuzz")
    commands = [["report", "summary"], ["report", "leaks"], ["export", "--format", "perfetto", "-o", str(root / "x")]]
    found = {}
    for name, path, expected in recording_corpus(root / "recs"):
        runs = []
        for command in commands:
            result = CliRunner().invoke(cli, [*command, str(path)], catch_exceptions=True)
            code = result.exit_code
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                code = f"raised {type(result.exception).__name__}: {result.exception}"
            runs.append((" ".join(command[:2]), code, result.output))
        found[name] = (expected, runs)
    return found


def test_no_tampered_recording_is_an_internal_error(outcomes):
    crashed = {(name, command): (code, output[-300:]) for name, (_, runs) in outcomes.items()
               for command, code, output in runs if code not in (0, 5) or "internal error" in output}
    assert crashed == {}


def test_a_damaged_recording_exits_5_from_every_command_with_one_line(outcomes):
    wrong = {(name, command): (code, output[-300:]) for name, (expected, runs) in outcomes.items()
             for command, code, output in runs if expected == "refused" and code != 5}
    assert wrong == {}
    for name, (expected, runs) in outcomes.items():
        if expected == "refused":
            lines = [line for line in runs[0][2].splitlines() if line.strip()]
            assert len(lines) == 2 and lines[0].startswith("memprof: error: ") and lines[1].startswith("hint: "), name
    refused = sum(expected == "refused" for expected, _ in outcomes.values())
    assert refused >= MIN_REFUSED, f"only {refused} tampered recordings refused"


def test_random_bytes_in_a_part_are_read_or_refused(outcomes):
    cases = {name: runs for name, (expected, runs) in outcomes.items() if expected == "either"}
    assert len(cases) == 120
    assert {code for runs in cases.values() for _, code, _ in runs} <= {0, 5}


def test_a_negative_time_is_read_but_refused_by_the_perfetto_export(outcomes):
    cases = {name: runs for name, (expected, runs) in outcomes.items() if expected == "no-perfetto"}
    assert len(cases) == 3
    for name, runs in cases.items():
        assert [code for _, code, _ in runs] == [0, 0, 5], name
        assert "ns cannot be written to a Perfetto trace" in runs[2][2]


def test_a_recording_the_tampering_left_readable_is_read(outcomes):
    wrong = {(name, command): (code, output[-300:]) for name, (expected, runs) in outcomes.items()
             for command, code, output in runs if expected == "readable" and code != 0}
    assert wrong == {}


@pytest.mark.parametrize("name, says", [
    ("meta-start_ns-nan.memprof", "meta.json is not readable JSON (NaN is not a number memprof writes)"),
    ("meta-start_ns-1e30_int.memprof", "meta.json field start_ns is outside int64"),
    ("meta-sources.ebpf.lost-str.memprof",
     "meta.json field sources.ebpf.lost is invalid: 'x' is not of type 'integer'"),
    ("meta-processes.0.pid-neg.memprof",
     "meta.json field processes[0].pid is invalid: -1 is not an integer from 0 to 2147483647"),
    ("meta-notes-deep_40.memprof", "meta.json field notes"),
    ("meta-exit_status-digits_5000.memprof", "meta.json is not readable JSON (Exceeds the limit (4300 digits)"),
    ("meta-command.0-deep_100k.memprof", "meta.json is not readable JSON (nested too deep)"),
    ("metafile-fifo.memprof", "is not a memprof recording (no meta.json)"),
    ("metafile-huge-sparse.memprof", "more than memprof writes"),
    ("part-events-is-file.memprof", "events is not a directory: the events table cannot be read"),
    ("part-part-is-fifo.memprof", "part-000000.parquet is not a regular file"),
])
def test_the_error_names_what_is_wrong(outcomes, name, says):
    output = outcomes[name][1][0][2]
    assert says in output, output


def test_an_events_path_that_is_a_file_is_a_damaged_recording_not_an_empty_one(tmp_path):
    rec = base_recording(tmp_path / "r.memprof")
    assert len(open_recording(rec).events) == 11
    for part in (rec / "events").iterdir():
        part.unlink()
    (rec / "events").rmdir()
    (rec / "events").write_bytes(b"")
    with pytest.raises(BadRecordingError, match="is not a directory"):
        open_recording(rec)

"""`memprof import` on hundreds of hostile files (tests/fuzz/corpus_import.py): never an
internal error, exit 5 (2 for usage) for every file it refuses, nothing left behind by one
it refuses, and at most 512 MB of peak RSS on every file.

All imports run in one worker process (tests/fuzz/import_worker.py), which resets the
kernel's RSS high-water mark before each one and reads it after (VmHWM): each file's peak,
the interpreter and every library memprof loads included."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memprof.cli.main import cli
from memprof.recording import open_recording
from memprof.sources.torch_import.snapshot import MAX_SETTINGS_VALUES
from tests.fuzz.corpus_import import expected, gzip_files, handmade_pickles, import_corpus, snapshot_structures

REPO = Path(__file__).resolve().parents[2]
RSS_LIMIT_KB = 512 * 1024
MIN_REFUSED = 300


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{name: worker result} for every case of the corpus."""
    root = tmp_path_factory.mktemp("import-fuzz")
    cases = import_corpus(root / "in")
    (root / "cases.json").write_text(json.dumps(cases))
    done = subprocess.run([sys.executable, "-m", "tests.fuzz.import_worker", str(root / "cases.json"),
                           str(root / "results.json"), str(root / "out")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {r["name"]: {**r, "out": root / "out"} for r in json.loads((root / "results.json").read_text())}
    assert len(found) == len(cases)
    return found


def test_no_file_is_an_internal_error(results):
    crashed = {name: (r["exit_code"], r["output"][-300:]) for name, r in results.items()
               if r["exit_code"] not in (0, 2, 5) or "internal error" in r["output"] or "Traceback" in r["output"]}
    assert crashed == {}


def test_each_hostile_file_is_refused_with_exit_5_or_2_and_one_clear_line(results):
    wrong = {name: (r["exit_code"], r["output"][-300:]) for name, r in results.items()
             if expected(name) == "refused" and r["exit_code"] not in (2, 5)}
    assert wrong == {}
    for name, r in results.items():
        if expected(name) == "refused":
            lines = [line for line in r["output"].splitlines() if line.strip()]
            assert lines[0].startswith("memprof: error: ") and lines[-1].startswith("hint: "), (name, lines)
    refused = sum(expected(name) == "refused" for name in results)
    assert refused >= MIN_REFUSED, f"only {refused} hostile files refused"


def test_a_refused_file_leaves_nothing_behind(results):
    """No recording, and no hidden temporary one beside it (it is written under a temporary
    name and renamed only when complete)."""
    left = {name: r["left"] for name, r in results.items() if r["exit_code"] != 0 and r["left"]}
    assert left == {}


def test_files_imported_leniently_give_complete_recordings_the_reports_read(results):
    """Odd but readable files (text where a name goes, unknown actions, big but honest
    structures) import to a complete recording, and nothing else, that `report summary` reads."""
    wrong = {name: (r["exit_code"], r["report_exit_code"], r["left"], r["output"][-300:])
             for name, r in results.items() if expected(name) == "imported"
             and (r["exit_code"], r["report_exit_code"], r["left"]) != (0, 0, ["out.memprof"])}
    assert wrong == {}


def test_random_mutations_of_real_files_are_imported_whole_or_refused(results):
    """Seeded byte and tree mutations of the fixtures: either a recording the reports read, or
    exit 5 and nothing written."""
    cases = {name: r for name, r in results.items() if expected(name) == "either"}
    assert len(cases) == 300
    wrong = {name: (r["exit_code"], r["report_exit_code"], r["left"], r["output"][-300:])
             for name, r in cases.items()
             if (r["exit_code"], r["report_exit_code"], r["left"]) not in ((0, 0, ["out.memprof"]), (5, None, []))}
    assert wrong == {}


def test_peak_rss_stays_under_512_mb_on_every_file(results):
    assert all(r["peak_reset"] for r in results.values()), "this kernel cannot reset VmHWM (/proc/self/clear_refs)"
    over = {name: r["peak_rss_kb"] // 1024 for name, r in results.items() if r["peak_rss_kb"] > RSS_LIMIT_KB}
    assert over == {}
    by_class = collections.defaultdict(int)
    for name, r in results.items():
        kind = name.split("-")[0]
        by_class[kind] = max(by_class[kind], r["peak_rss_kb"])
    print({kind: f"{kb / 1024:.0f} MB" for kind, kb in sorted(by_class.items())})


# --- the files of the issue, each in a process of its own ---------------------------------

def _child_import(path: Path, out: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in kB) of `python -m memprof import PATH -o OUT`, run by a
    fresh parent whose only child it is, so the children's ru_maxrss is this import's."""
    script = ("import resource, subprocess, sys\n"
              "done = subprocess.run([sys.executable, '-m', 'memprof', 'import', sys.argv[1], '-o', sys.argv[2]],"
              " capture_output=True, text=True)\n"
              "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
              "sys.stderr.write(done.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path), str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    code, peak = map(int, done.stdout.split())
    return code, done.stderr, peak


@pytest.mark.parametrize("name, message", [
    ("memo-long-binput-2_26.pickle", "memo index 67,108,864 in a 9-byte file"),
    ("bomb-1gb-64-members.pickle.gz", "decompresses to more than 67,108,864 bytes"),
    ("bytearray8-huge.pickle", "truncated pickle"),
])
def test_the_issues_amplifying_files_exit_5_in_a_process_of_their_own_under_512_mb(tmp_path, name, message):
    files = {**handmade_pickles(), **gzip_files(b"", b"")}
    path = tmp_path / name
    path.write_bytes(files[name])
    code, stderr, peak_kb = _child_import(path, tmp_path / "out.memprof")
    assert code == 5, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and message in lines[0] and lines[1].startswith("hint: ")
    assert peak_kb <= RSS_LIMIT_KB, f"{name}: peak RSS {peak_kb // 1024} MB"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_billion_laughs_in_the_allocator_settings_imports_cut_to_its_budget(tmp_path):
    """2^60 shared leaves in allocator_settings: kept in meta.json up to MAX_SETTINGS_VALUES, the rest "…"."""
    path = tmp_path / "settings.pickle"
    path.write_bytes(snapshot_structures()["settings-dag.pickle"])
    out = tmp_path / "s.memprof"
    assert CliRunner().invoke(cli, ["import", str(path), "-o", str(out)]).exit_code == 0
    rec = open_recording(out)
    assert rec.complete and len(rec.events) == 11
    settings = json.dumps(rec.meta.sources["torch_snapshot"].detail["files"][0]["allocator_settings"],
                          ensure_ascii=False)
    assert "…" in settings and settings.count("[]") <= MAX_SETTINGS_VALUES

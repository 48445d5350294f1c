"""Issue 20 point 13: frame labels and one-line chain names live in one module
(memprof.report.labels), and the terminal, the HTML page and the exports name a chain the
same way — the HTML leak list no longer by its innermost frame."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

import memprof.report.attribution
import memprof.report.exports.speedscope
import memprof.report.exports.tabular
import memprof.report.leaks
from memprof.cli.main import cli
from memprof.report import labels
from tests.diff_factories import write_recording
from tests.factories import ev, events_frame, mark

S = 1_000_000_000
PIPE = [("kernel", "__kmalloc_noprof+0x1f", "vmlinux", None, None),
        ("kernel", "alloc_pipe_info+0x3f", "vmlinux", None, None),
        ("kernel", "create_pipe_files+0x10", "vmlinux", None, None)]
# `python -m train`: names in angle brackets, which markup and HTML must leave as they are (not
# the import system's frozen code: its chains are start-up, no finding).
IMPORT = [("native", "malloc", "libc.so.6", None, None),
          ("python", "_run_code", "runpy", "<frozen runpy>", 88),
          ("python", "_run_module_as_main", "runpy", "<frozen runpy>", 198),
          ("python", "<module>", "train", "train.py", 3)]
PIPE_NAME = "alloc_pipe_info ← create_pipe_files"
IMPORT_NAME = "_run_code (<frozen runpy>:88) ← _run_module_as_main (<frozen runpy>:198) ← …"


def frame(kind, function, module, file, line) -> dict:
    return {"kind": kind, "function": function, "module": module, "file": file, "line": line}


def test_frame_labels_and_chain_names_have_one_home():
    assert labels.frame_label(frame(*PIPE[1])) == "[k] alloc_pipe_info+0x3f"
    assert labels.frame_label(frame(*IMPORT[3])) == "[py] <module> (train.py:3)"
    assert labels.chain_name([frame(*f) for f in PIPE]) == PIPE_NAME
    assert labels.chain_name([frame(*f) for f in IMPORT]) == IMPORT_NAME
    assert labels.chain_name([]) == "(no stack recorded)"
    for module in (memprof.report.attribution, memprof.report.exports.tabular, memprof.report.exports.speedscope):
        assert module.frame_label is labels.frame_label
    assert not hasattr(memprof.report.leaks, "_frame")


@pytest.fixture(scope="module")
def two_chains(tmp_path_factory):
    rows = [ev(S, "alloc", 0x10, 4096, 1, layer="kernel_slab"), ev(S, "alloc", 0x20, 2048, 2, layer="native_heap"),
            mark(5 * S, 100)]
    path = tmp_path_factory.mktemp("labels") / "r.memprof"
    return write_recording(path, events_frame(rows), {1: PIPE, 2: IMPORT}, end_ns=6 * S)


def invoke(*args) -> str:
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_terminal_json_and_html_data_name_a_finding_the_same_way(two_chains):
    summary = invoke("report", two_chains)
    assert PIPE_NAME in summary
    leaks_json = json.loads(invoke("report", "leaks", two_chains, "--format", "json"))
    assert [f["name"] for f in leaks_json["findings"]] == [PIPE_NAME, IMPORT_NAME]
    html_json = json.loads(invoke("report", "html", two_chains, "--format", "json"))
    assert [f["name"] for f in html_json["leaks"]["findings"]] == [PIPE_NAME, IMPORT_NAME]
    assert [f["chain"] for f in json.loads(invoke("report", two_chains, "--format", "json"))["findings"]] == \
        [PIPE_NAME, IMPORT_NAME]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_html_leak_rows_in_a_real_browser_read_as_the_terminal_names_them(two_chains, tmp_path):
    page = tmp_path / "r.html"
    invoke("report", "html", two_chains, "-o", page)
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=60).stdout
    rows = re.findall(r'<summary>.*?<code class="chain-name">(.*?)</code>', dom, re.S)
    assert [row.replace("&lt;", "<").replace("&gt;", ">") for row in rows] == [PIPE_NAME, IMPORT_NAME]
    assert "__kmalloc_noprof</code>" not in dom

"""Issue 20, point 7: typos are named as typos, not misread (cli/typos.py)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from memprof.cli.main import cli


def invoke(*args, cwd):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        result = CliRunner().invoke(cli, list(args), prog_name="memprof", catch_exceptions=False)
    return result.exit_code, result.stderr


def test_a_misspelt_report_is_not_taken_for_a_path(tmp_path):
    code, err = invoke("report", "leak", cwd=tmp_path)
    assert code == 2
    assert "did you mean `memprof report leaks`?" in err
    assert "does not exist" not in err


def test_a_path_that_looks_like_a_report_is_still_a_path(tmp_path):
    (tmp_path / "leak").mkdir()  # not a recording: opening it says so (exit 5), no "did you mean"
    code, err = invoke("report", "leak", cwd=tmp_path)
    assert code == 5 and "did you mean" not in err


def test_a_word_like_no_report_is_a_missing_path(tmp_path):
    code, err = invoke("report", "run.memprof", cwd=tmp_path)
    assert code == 5 and "run.memprof does not exist" in err and "did you mean" not in err


@pytest.mark.parametrize("args, command", [
    (["python", "-c", "pass"], "python"),
    (["-o", "out.memprof", "python3", "-c", "pass"], "python3"),
    (["--sources", "kmem", "./train.sh", "--epochs", "3"], "./train.sh"),
])
def test_a_commands_option_without_dashdash_says_to_use_it(tmp_path, args, command):
    code, err = invoke("record", *args, cwd=tmp_path)
    option = args[args.index(command) + 1]
    assert code == 2
    assert f"No such option '{option}'" in err
    assert f"put `--` before the command: `memprof record [OPTIONS] -- {command} {option} …`" in err


@pytest.mark.parametrize("args", [["--quiett", "python"], ["-x", "--", "python"]])
def test_memprofs_own_misspelt_option_gets_no_dashdash_hint(tmp_path, args):
    code, err = invoke("record", *args, cwd=tmp_path)
    assert code == 2 and f"No such option '{args[0]}'" in err and "--` before" not in err

"""Runs `memprof import` on each case of a corpus in this one process and measures each one's
peak RSS: `python -m tests.fuzz.import_worker CASES.json RESULTS.json OUT_DIR`.

CASES.json: [[name, [import arguments]], …]. Before each import the kernel's high-water mark
of this process's RSS is reset (writing 5 to /proc/self/clear_refs, Linux >= 4.0) to the RSS
now, so VmHWM read after it is that import's peak, the interpreter and every library memprof
loaded included. RESULTS.json: [{name, exit_code, output, peak_rss_kb, peak_reset, left,
report_exit_code}]: `left` names whatever the import left in OUT_DIR (it must leave nothing
when it fails); `report_exit_code` is that of `report summary` on what it imported (None when
it imported nothing)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from click.testing import CliRunner


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_case(cli, name: str, args: list[str], out_dir: Path) -> dict:
    """Import one case into OUT_DIR/out.memprof; what happened."""
    out_dir.mkdir(parents=True, exist_ok=True)
    reset = reset_peak_rss()
    result = CliRunner().invoke(cli, ["import", *args, "-o", str(out_dir / "out.memprof")], catch_exceptions=True)
    peak = peak_rss_kb()
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        code = f"raised {type(result.exception).__name__}: {result.exception}"
    left = sorted(p.name for p in out_dir.iterdir())
    report = None
    if code == 0:  # what was imported must be a recording the reports read
        done = CliRunner().invoke(cli, ["report", "summary", str(out_dir / "out.memprof")], catch_exceptions=True)
        report = done.exit_code if done.exception is None or isinstance(done.exception, SystemExit) else \
            f"raised {type(done.exception).__name__}: {done.exception}"
    shutil.rmtree(out_dir)
    return {"name": name, "exit_code": code, "output": result.output[-2000:], "peak_rss_kb": peak,
            "peak_reset": reset, "left": left, "report_exit_code": report}


def main(cases_path: str, results_path: str, out_dir: str) -> None:
    from memprof.cli.main import cli
    cases = json.loads(Path(cases_path).read_text())
    results = [run_case(cli, name, args, Path(out_dir) / f"case-{i}") for i, (name, args) in enumerate(cases)]
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:4])

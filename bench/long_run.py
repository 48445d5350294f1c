"""A long recording under `record --max-size` (issue 23 item 1, "Bench: a long run").

Records examples/long_run.py (a paced CPU training loop with kernel churn in every step, and
one known leak: every 10th step keeps 131072 bytes) for --minutes (default 30) with
`--max-size` (default 256MiB), and every --every seconds (default 30) reads the recording's
size on disk, its folds (meta.json) and the recorder's RSS (/proc/PID/status VmRSS of the
`memprof record` process). At the end: the largest size against the limit, the recorder's
RSS over time, the events recorded and lost, then `report leaks --format json` on the
recording (wall seconds, peak RSS of that process) and whether it names the leak with the
bytes the workload says it kept.

    .venv/bin/python bench/long_run.py [--minutes M] [--max-size SIZE] [--churn N] [--out DIR]

It prints a markdown table for bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def size_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def meta(path: Path) -> dict:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--max-size", default="256MiB")
    ap.add_argument("--churn", type=int, default=200, help="socket pairs per step (10 steps a second)")
    ap.add_argument("--every", type=float, default=30, help="seconds between readings")
    ap.add_argument("--out", type=Path, default=None, help="where the recording goes (default: a temporary folder)")
    args = ap.parse_args()
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="memprof-long-"))
    recording = out_dir / "long.memprof"
    shutil.rmtree(recording, ignore_errors=True)
    seconds = args.minutes * 60
    cmd = [sys.executable, "-m", "memprof", "record", "-q", "-o", str(recording), "--max-size", args.max_size, "--",
           sys.executable, str(ROOT / "examples" / "long_run.py"), "--seconds", str(seconds), "--churn", str(args.churn)]
    print(f"command: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    recorder = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    readings = []
    while recorder.poll() is None:
        time.sleep(args.every)
        m = meta(recording)
        readings.append((time.monotonic() - started, size_on_disk(recording), rss_mb(recorder.pid),
                         len(m.get("folds", [])), m.get("flushed_rows", {}).get("events", 0)))
        t, size, rss, folds, rows = readings[-1]
        print(f"  t={t:7.0f}s size={size / 2**20:8.1f} MiB recorder_rss={rss:7.1f} MB folds={folds} rows={rows:,}",
              flush=True)
    out, err = recorder.communicate()
    wall = time.monotonic() - started
    m = meta(recording)
    final_size = size_on_disk(recording)
    print(f"\nrecorder exit {recorder.returncode} after {wall:.0f} s; {err.strip().splitlines()[-1] if err.strip() else ''}")
    print(f"workload: {out.strip().splitlines()[-1] if out.strip() else '?'}")
    sources = m.get("sources", {})
    events = sum(s.get("events", 0) for s in sources.values())
    lost = sum(s.get("lost", 0) for s in sources.values())
    sizes = [r[1] for r in readings] + [final_size]
    rss = [r[2] for r in readings if r[2]]
    print("\n| minute | size on disk (MiB) | recorder RSS (MB) | folds | rows on disk |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for t, size, r, folds, rows in readings[:: max(1, len(readings) // 30)]:
        print(f"| {t / 60:.1f} | {size / 2**20:.1f} | {r:.0f} | {folds} | {rows:,} |")
    print(f"\nlimit {args.max_size}; largest size seen {max(sizes) / 2**20:.1f} MiB, final {final_size / 2**20:.1f} MiB; "
          f"recorder RSS min {min(rss, default=0):.0f} / max {max(rss, default=0):.0f} MB; events {events:,}, lost {lost:,}; "
          f"folds {len(m.get('folds', []))}, last window {m.get('folds', [{}])[-1].get('window_ns', 0) / 1e9 if m.get('folds') else 0:g} s")

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.monotonic()
    report = subprocess.run([sys.executable, "-m", "memprof", "report", "leaks", str(recording), "--format", "json"],
                            capture_output=True, text=True)
    report_s = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"report leaks: exit {report.returncode}, {report_s:.1f} s, peak RSS {peak / 1024:.0f} MB "
          f"(children's max before: {before / 1024:.0f} MB)")
    if report.returncode == 0:
        findings = json.loads(report.stdout)["findings"]
        kept = int(out.split("kept_bytes=")[1].split()[0]) if "kept_bytes=" in out else None
        for f in findings:
            print(f"  {f['layer']} {f['kind']} {f['live_bytes']:,} B in {f['live_count']} "
                  f"({' <- '.join(fr['function'] for fr in f['stack'][:3])})")
        print(f"  the leak (kept_bytes={kept}) found with those bytes: "
              f"{any(f['layer'] == 'torch_cpu' and f['live_bytes'] == kept for f in findings)}")
    else:
        print(report.stderr)


if __name__ == "__main__":
    main()

"""What a `kill -9` of the recorder loses: seconds between the kill and the newest event
on disk, over several kills at different phases of the flush cycle, under a paced kernel
churn (a rate the recorder keeps up with) and under unpaced churn (a rate it does not).

    sudo .venv/bin/python bench/kill_loss.py [--kills 5] [--loads paced,unpaced]

The README's promise ("at most the last half second") is judged against the paced rows;
the unpaced rows show what a recorder that falls behind loses as well (its ring-buffer
backlog). Each row prints the events per second the recording took, from its meta.json.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
CHURN = REPO / "examples" / "bin" / "kernel_churn"
LOADS = {
    # about 0.7 M kmem events a second here: 80 k events in ~30 ms, then 0.1 s of rest
    "paced": f"while :; do {CHURN} 2000 >/dev/null; sleep 0.1; done",
    # as fast as the kernel goes (5-7 M events a second on this host's two cores)
    "unpaced": f"{CHURN} 100000000",
}


def newest_event_ns(recording: Path) -> int:
    newest = 0
    for part in glob.glob(str(recording / "events" / "part-*.parquet")):
        ts = pq.read_table(part, columns=["ts_ns"]).column("ts_ns").to_numpy()
        if len(ts):
            newest = max(newest, int(ts.max()))
    return newest


def one_kill(load: str, after_s: float, folder: Path) -> dict:
    """Record `load`, SIGKILL memprof `after_s` after its first part; what was lost."""
    recording = folder / f"killed-{time.monotonic_ns()}.memprof"
    cmd = [sys.executable, "-m", "memprof", "record", "-q", "--no-agent", "-o", str(recording), "--",
           "/bin/sh", "-c", load]
    memprof = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        while not glob.glob(str(recording / "events" / "part-*.parquet")):
            if memprof.poll() is not None:
                raise RuntimeError(f"memprof exited {memprof.returncode} before its first part")
            time.sleep(0.02)
        time.sleep(after_s)
        killed_ns = time.monotonic_ns()
        os.kill(memprof.pid, signal.SIGKILL)
        memprof.wait()
    finally:
        os.killpg(memprof.pid, signal.SIGKILL)
        memprof.wait()
    meta = json.loads((recording / "meta.json").read_text())
    anchors = meta["clock_anchors"]
    span_s = (anchors[-1]["monotonic_ns"] - anchors[0]["monotonic_ns"]) / 1e9
    ebpf = meta["sources"]["ebpf"]
    return {"lost_s": (killed_ns - newest_event_ns(recording)) / 1e9,
            "events_per_s": ebpf["events"] / span_s if span_s > 0 else float("nan"),
            "ring_lost": ebpf.get("lost", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--loads", default="paced,unpaced")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memprof-kill-") as folder:
        for name in args.loads.split(","):
            rows = [one_kill(LOADS[name], 1.0 + 0.37 * k, Path(folder)) for k in range(args.kills)]
            losses = ", ".join(f"{r['lost_s']:.2f}" for r in rows)
            rates = sorted(r["events_per_s"] / 1e6 for r in rows)
            print(f"{name}: seconds lost per kill [{losses}], max {max(r['lost_s'] for r in rows):.2f}; "
                  f"recorded {rates[0]:.2f}-{rates[-1]:.2f} M events/s; ring-buffer drops {sum(r['ring_lost'] for r in rows)}")


if __name__ == "__main__":
    main()

"""Streaming against DuckDB for reports in bounded memory (issue 23, item 2: "either stream the
parts in time order, or use an out-of-core engine such as DuckDB over the Parquet parts;
choose by measurement"). On the synthetic recording of bench/huge_recording.py (--events
events, default 3·10^7), each arm in a fresh process, in one run:

- memprof: `report leaks --format json --max-memory SIZE` (memprof.bounded folds it: the
  parts read in time order, allocations paired as they go), the whole leak analysis
  (grows-per-step fits, held at the end, exact peaks, chains);
- DuckDB (duckdb, the PyPI wheel) over the recording's Parquet parts, with memory_limit SIZE
  and 2 threads (spilling to a temporary folder): only the first half of that analysis,
  pairing each allocation with its free (LEAD over (layer, device, addr) by (ts_ns, seq)) and
  the live bytes of each chain at each step mark (ASOF joins to the marks, a running sum).

Each arm's wall seconds and peak RSS (ru_maxrss of the child) are printed, with its answer
for the two known chains (bench/huge_recording.py: 1,024 B a step never freed, and 1 MiB
freed after the exit), which both must get right. Run:

    .venv/bin/python bench/fold_engines.py [--events N] [--max-memory SIZE] [--repeats R]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import huge_recording  # noqa: E402  (the generator and its known answer)

# The DuckDB arm, run as `python -c` in a fresh process: argv path, memory limit, spill folder.
DUCKDB_ARM = r'''
import json, sys, duckdb
path, limit, spill = sys.argv[1:4]
con = duckdb.connect()
con.execute(f"SET memory_limit='{limit}'")
con.execute("SET threads=2")
con.execute("SET enable_progress_bar=false")
con.execute(f"SET temp_directory='{spill}'")
parts = f"read_parquet('{path}/events/*.parquet')"
con.execute(f"""CREATE TEMP TABLE steps AS SELECT ts_ns, row_number() OVER (ORDER BY ts_ns) AS k
                FROM {parts} WHERE action = 'mark' AND category = 'step'""")
never = 9223372036854775807
# Live at step k: born <= t_k < ended. An allocation adds its bytes from the first step after
# its birth's last step, and takes them away from the first step after its end's.
con.execute(f"""CREATE TEMP TABLE deltas AS
WITH ev AS (SELECT ts_ns, seq, layer, device, addr, action, size_bytes, stack_id FROM {parts}
            WHERE action IN ('alloc', 'free')),
paired AS (SELECT layer, action, ts_ns, size_bytes, stack_id,
                  LEAD(action) OVER w AS next_action, LEAD(ts_ns) OVER w AS next_ts
           FROM ev WINDOW w AS (PARTITION BY layer, device, addr ORDER BY ts_ns, seq)),
allocs AS (SELECT layer, stack_id, size_bytes, ts_ns AS born,
                  CASE WHEN next_action = 'free' THEN next_ts ELSE {never} END AS ended
           FROM paired WHERE action = 'alloc'),
b AS (SELECT a.*, coalesce(s.k, 0) AS k_born FROM allocs a ASOF LEFT JOIN steps s ON a.born >= s.ts_ns),
e AS (SELECT b.*, CASE WHEN ended = {never} THEN {never} ELSE coalesce(s.k, 0) END AS k_end
      FROM b ASOF LEFT JOIN steps s ON b.ended > s.ts_ns)
SELECT layer, stack_id, k, sum(d) AS d FROM (
  SELECT layer, stack_id, k_born + 1 AS k, size_bytes AS d FROM e WHERE k_end > k_born
  UNION ALL SELECT layer, stack_id, k_end + 1, -size_bytes FROM e WHERE k_end > k_born AND k_end < {never})
GROUP BY ALL""")
steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
rows = con.execute("""SELECT layer, stack_id, k, sum(d) OVER (PARTITION BY layer, stack_id ORDER BY k) AS live
                      FROM deltas ORDER BY layer, stack_id, k""").fetchall()
last = {}
for layer, stack, k, live in rows:
    if k <= steps:
        last[f"{layer}/{stack}"] = [int(k), int(live)]
print(json.dumps({"steps": steps, "chain_steps": len(rows), "last": last}))
'''


def _child(command: list[str]) -> tuple[float, float, str]:
    """Run `command` in a fresh process: (wall s, its own peak RSS in MB: os.wait4's rusage of
    that child alone, stdout). Exit on failure."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        child = subprocess.Popen(command, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"{command[:4]} failed (exit {child.returncode}): {err.read().strip()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def memprof_arm(path: Path, max_memory: str, steps: int) -> tuple[float, float, list[str]]:
    """`report leaks` folded: wall s, peak RSS MB, what differs from the known answer."""
    command = [sys.executable, "-m", "memprof", "report", "leaks", str(path), "--format", "json", "--top", "50",
               "--max-memory", max_memory]
    wall, rss, out = _child(command)
    return wall, rss, huge_recording.known_answer(json.loads(out), steps)


def duckdb_arm(path: Path, max_memory: str, steps: int) -> tuple[float, float, list[str]]:
    """The DuckDB query: wall s, peak RSS MB, what differs from the known answer."""
    with tempfile.TemporaryDirectory(prefix="memprof-duckdb-spill-") as spill:
        wall, rss, out = _child([sys.executable, "-c", DUCKDB_ARM, str(path), _duckdb_size(max_memory), spill])
    doc = json.loads(out)
    last = doc["last"]
    wrong = [] if doc["steps"] == steps else [f"{doc['steps']} step marks where {steps} were written"]
    leak = last.get(f"kernel_slab/{huge_recording.LEAK_STACK}")
    if leak != [steps, huge_recording.LEAK_BYTES * (steps - 1)]:  # each step's comes after its mark
        wrong.append(f"the leaking chain holds {leak} at the last step of {steps}")
    teardown = last.get(f"torch_cpu/{huge_recording.TEARDOWN_STACK}")
    if teardown is None or teardown[1] != huge_recording.TEARDOWN_BYTES:
        wrong.append(f"the teardown chain holds {teardown} at its last step")
    return wall, rss, wrong


def _duckdb_size(size: str) -> str:
    """memprof's SIZE (e.g. 1GiB) as DuckDB's memory_limit takes it (bytes, plainly)."""
    from memprof.units import parse_size
    return f"{parse_size(size)}B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=30_000_000)
    parser.add_argument("--max-memory", default="1GiB", help="memprof's --max-memory and DuckDB's memory_limit")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "memprof-bench-huge")
    args = parser.parse_args()
    path = huge_recording.ensure_recording(args.workdir, args.events, huge_recording.DEFAULT_PART_ROWS)
    steps = max(args.events // huge_recording.DEFAULT_PART_ROWS, 2)  # one a part (huge_recording.main)
    print(f"recording: {path}")
    for _ in range(args.repeats):
        for name, arm in (("memprof (streamed fold)", memprof_arm), ("duckdb (pairing + live per chain per step)", duckdb_arm)):
            wall, rss, wrong = arm(path, args.max_memory, steps)
            print(f"{name:<45} {wall:7.1f} s  peak RSS {rss:6.0f} MB  known answer: "
                  + ("right" if not wrong else "WRONG: " + "; ".join(wrong)))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()

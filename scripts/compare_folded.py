"""Compare a recording's reports read whole and folded (memprof.bounded): `report leaks`
(every finding), `report layers`, `report top --at end` and `--at peak`, as their JSON,
without the notes (the folded one says it was folded). Prints per recording the time of
each analysis, how many allocations the fold kept, and each view "same" or its differences;
exits 1 if any differ.

    .venv/bin/python scripts/compare_folded.py REC.memprof [REC.memprof …]

The whole analysis must fit in memory: use it on recordings of up to ~10^7 events.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memprof.api import analyse  # noqa: E402
from memprof.report import reporters  # noqa: E402

VIEWS = {"leaks": lambda a: a.leaks(top=None), "layers": lambda a: a.layers(),
         "top_end": lambda a: a.attribution(at="end"), "top_peak": lambda a: a.attribution(at="peak")}


def differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ, as 'path: a != b' lines."""
    if type(a) is not type(b):
        return [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]
    if isinstance(a, dict):
        return [line for key in sorted(set(a) | set(b)) for line in differences(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]


def compare(path: str) -> bool:
    started = time.monotonic()
    whole = analyse(path)
    whole_s = time.monotonic() - started
    started = time.monotonic()
    folded = analyse(path, max_memory=1)  # any recording with events is folded under 1 byte
    folded_s = time.monotonic() - started
    if folded.fold is None:
        print(f"{path}: no events, nothing to fold")
        return True
    print(f"{path}: whole {whole_s:.1f} s, folded {folded_s:.1f} s, kept {folded.fold.kept:,} of "
          f"{len(whole.lifetimes.allocations):,} allocations")
    same = True
    for name, view in VIEWS.items():
        a, b = reporters.to_json(view(whole)), reporters.to_json(view(folded))
        a.pop("notes", None)
        b.pop("notes", None)
        found = differences(a, b)
        same &= not found
        print(f"  {name}: " + ("same" if not found else f"{len(found)} differences"))
        for line in found[:8]:
            print(f"    {line}")
    return same


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    results = [compare(path) for path in sys.argv[1:]]
    print(f"{sum(results)} of {len(results)} recordings: every view the same")
    raise SystemExit(0 if all(results) else 1)


if __name__ == "__main__":
    main()

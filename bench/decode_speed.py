"""The recorder's decode of drained ring-buffer records into event columns (issue 24), in ns per
event, against the decoder of another commit, in the same process and in turns.

A synthetic batch of BATCH records (kernel slab and page allocations and frees, random
addresses), each decoder run REPEATS times per turn over TURNS turns; the median per decoder.
The other commit's decode.py is loaded from git beside this tree's (its imports are this
tree's modules: fine while records.py and addrkey.py keep their names).

    .venv/bin/python bench/decode_speed.py [--against REV] [--batch N] [--turns T]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memprof.sources.ebpf import decode as this_tree  # noqa: E402
from memprof.sources.ebpf import records as R  # noqa: E402


def _decoder_of(rev: str):
    """The decode module of commit `rev`, loaded under its own name."""
    text = subprocess.run(["git", "show", f"{rev}:memprof/sources/ebpf/decode.py"], capture_output=True,
                          text=True, check=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="memprof-decode-"), "decode_at_rev.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("decode_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["decode_at_rev"] = module
    spec.loader.exec_module(module)
    return module


def _batch(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    recs = np.zeros(n, dtype=R.EVENT_DTYPE)
    recs["kind"] = rng.choice([R.SLAB_ALLOC, R.SLAB_FREE, R.PAGE_ALLOC, R.PAGE_FREE], n)
    recs["layer"] = R.LAYER_CODES.index("kernel_slab")
    recs["size"], recs["ts_ns"], recs["addr"] = 64, np.arange(n), rng.integers(1, 2**40, n)
    return recs


def _ns_per_event(module, recs: np.ndarray, repeats: int) -> float:
    decoder = module.MemoryDecoder(lambda k, u, p, c, py: k.astype(np.int64))
    decoder.decode(recs[:100])  # first-use costs (dtypes, dictionaries) are not the steady state
    began = time.perf_counter()
    for _ in range(repeats):
        decoder.decode(recs)
    return (time.perf_counter() - began) / repeats / recs.size * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="9087e7f", help="the commit whose decoder is the baseline")
    ap.add_argument("--batch", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args()
    recs = _batch(args.batch)
    decoders = {args.against: _decoder_of(args.against), "this tree": this_tree}
    timings = {name: [] for name in decoders}
    for _ in range(args.turns):
        for name, module in decoders.items():
            timings[name].append(_ns_per_event(module, recs, args.repeats))
    for name, values in timings.items():
        print(f"{name}: {statistics.median(values):.0f} ns/event (min {min(values):.0f}, max {max(values):.0f})")
    print(f"this tree / {args.against}: {statistics.median(timings['this tree']) / statistics.median(timings[args.against]):.2f}")


if __name__ == "__main__":
    main()

"""How often a recording's chains repeat a Python function: what the Python frames'
learning saves by reading each code object once per new stack (bpf/python.bpf.c,
py_learn_codes; issue 24).

For the recording's chains that hold Python frames: Python frames a chain, and distinct
functions (name and file) a chain, mean and median; the learning reads one code
object's head per distinct one where it read one per frame before.

    sudo .venv/bin/memprof record -o /tmp/train.memprof -- .venv/bin/python examples/train.py --steps 300 --start-wait 0 --hold 0
    .venv/bin/python bench/python_chains.py /tmp/train.memprof
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pyarrow.dataset as ds


def chain_counts(recording: Path) -> tuple[list[int], list[int]]:
    """(Python frames, distinct Python functions) of each chain holding Python frames."""
    stacks = ds.dataset(recording / "stacks").to_table().to_pandas()
    frames = ds.dataset(recording / "frames").to_table().to_pandas()
    python = frames[frames["kind"] == "python"].set_index("frame_id")
    joined = stacks.join(python[["function", "file"]], on="frame_id", how="inner")
    per_chain = joined.groupby("stack_id")
    return per_chain.size().tolist(), per_chain.apply(lambda g: len(set(zip(g["function"], g["file"])))).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path)
    args = ap.parse_args()
    sizes, distinct = chain_counts(args.recording)
    print(f"chains with Python frames: {len(sizes):,}")
    print(f"Python frames a chain: mean {statistics.mean(sizes):.1f}, median {statistics.median(sizes):g}")
    print(f"distinct functions a chain: mean {statistics.mean(distinct):.1f}, median {statistics.median(distinct):g}")
    print(f"frames per distinct function: {sum(sizes) / sum(distinct):.2f}")


if __name__ == "__main__":
    main()

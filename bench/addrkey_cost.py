"""Cost of keying kernel addresses (memprof/sources/ebpf/addrkey.py) per event, in the recorder.

Two measurements, each the median of REPEATS runs after a warm-up, in one process, in this
thread's CPU time (time.thread_time: on a shared machine, wall time also counts the spells
another process held the core):
- `AddressKey.apply` over a whole column of 10^7 kernel-like addresses (slab objects in the
  direct map, struct pages in vmemmap);
- the decoder (`MemoryDecoder.decode`) on batches of the size the recorder drains at
  1.5 M kernel events/s (one drain every POLL_S = 20 ms: 30,000 records), with and without
  the keying, timed alternately. Stacks are interned by a stub here, so the decode is cheaper than the real
  one and the keying's share an upper bound.
With --recorder N (root): `memprof record` of examples/kernel_churn N, alternately as it is
and with the keying bypassed (monkeypatched in the recorder's process), REPEATS times each:
the CPU time of the recorder and the workload together (wait4), per recorded event.

    .venv/bin/python bench/addrkey_cost.py [--rows N] [--batch B] [--repeats R]
    sudo .venv/bin/python bench/addrkey_cost.py --recorder 100000 --repeats 7
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.addrkey import AddressKey
from memprof.sources.ebpf.decode import MemoryDecoder

EVENTS_PER_S = 1_500_000  # the kernel-heavy case (examples/kernel_churn)
CHURN = Path(__file__).resolve().parent.parent / "examples" / "bin" / "kernel_churn"
KEYED = [sys.executable, "-m", "memprof"]
UNKEYED = [sys.executable, "-c", "import memprof.sources.ebpf.decode as D; "
           "D.MemoryDecoder.keyed_addresses = lambda self, kinds, addrs: addrs; "
           "from memprof.cli.main import main; main()"]


def kernel_addresses(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    slab = np.uint64(0xFFFF_8880_0000_0000) + rng.integers(0, 1 << 34, n - n // 4, dtype=np.uint64) * np.uint64(8)
    pages = np.uint64(0xFFFF_EA00_0000_0000) + rng.integers(0, 1 << 26, n // 4, dtype=np.uint64) * np.uint64(64)
    return np.concatenate([slab, pages])


def median_s(fn, repeats: int) -> float:
    fn()  # warm-up: first touches of fresh pages
    times = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times)


def paired_s(a, b, repeats: int) -> tuple[float, float]:
    """Medians of `a` and `b` timed alternately, 20 calls a sample (machines here are
    shared and noisy: alternating keeps a slow spell from landing on one side only)."""
    a(), b()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            t = time.thread_time()
            for _ in range(20):
                fn()
            out.append((time.thread_time() - t) / 20)
    return statistics.median(times[0]), statistics.median(times[1])


def unkeyed(source: MemoryDecoder, decode):
    """`decode` run with the keying bypassed: the decoder as it was."""
    def run():
        source.keyed_addresses = lambda kinds, addrs: addrs
        try:
            return decode()
        finally:
            del source.keyed_addresses
    return run


class _StubInterner:
    def intern(self, kstack, ustack, pid, call_site, py_stack=None):
        return kstack.astype(np.int64)


def kernel_batch(n: int) -> np.ndarray:
    """`n` records as the kmem probes emit them: slab and page allocations and frees."""
    recs = np.zeros(n, dtype=R.EVENT_DTYPE)
    recs["addr"] = kernel_addresses(n, seed=1)
    recs["kind"] = np.resize(np.array(R.KERNEL_KINDS, dtype=np.uint8), n)
    recs["layer"] = np.where(np.isin(recs["kind"], (R.PAGE_ALLOC, R.PAGE_FREE)), 1, 0)
    recs["size"] = 64
    recs["ts_ns"] = np.arange(n)
    return recs


def recorder_cpu(memprof: list[str], iterations: int, recording: Path) -> tuple[float, int]:
    """(CPU seconds of `memprof record -- kernel_churn N` and the workload, events recorded)."""
    proc = subprocess.Popen([*memprof, "record", "-q", "-o", str(recording), "--", str(CHURN), str(iterations)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"memprof record exited {proc.returncode}")
    events = json.loads((recording / "meta.json").read_text())["sources"]["ebpf"]["events"]
    shutil.rmtree(recording)
    return usage.ru_utime + usage.ru_stime, events


def compare_recorder(iterations: int, repeats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="memprof-addrkey-"))
    runs: dict[str, list[float]] = {"unkeyed": [], "keyed": []}
    for i in range(repeats):
        for name, cmd in (("unkeyed", UNKEYED), ("keyed", KEYED)):
            cpu, events = recorder_cpu(cmd, iterations, tmp / f"{name}-{i}.memprof")
            runs[name].append(cpu / events)
    shutil.rmtree(tmp, ignore_errors=True)
    for name, per_event in runs.items():
        print(f"record kernel_churn {iterations}, {name}: CPU (recorder + workload) "
              f"{statistics.median(per_event) * 1e9:.0f} ns/event "
              f"(min {min(per_event) * 1e9:.0f}, max {max(per_event) * 1e9:.0f}, {repeats} runs)")
    added = statistics.median(runs["keyed"]) - statistics.median(runs["unkeyed"])
    print(f"difference of medians: {added * 1e9:+.0f} ns/event")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=30_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--recorder", type=int, metavar="ITERATIONS", help="A/B the recorder on kernel_churn (root)")
    args = ap.parse_args()
    if args.recorder:
        compare_recorder(args.recorder, args.repeats)
        return

    key = AddressKey.generate()
    column = kernel_addresses(args.rows)
    whole = median_s(lambda: key.apply(column), args.repeats) / args.rows
    print(f"apply, {args.rows:,} addresses in one column: {whole * 1e9:.2f} ns/address")

    source = MemoryDecoder(_StubInterner().intern)
    recs = kernel_batch(args.batch)
    keyed, raw = paired_s(lambda: source.decode(recs), unkeyed(source, lambda: source.decode(recs)),
                          args.repeats)
    keyed, raw = keyed / args.batch, raw / args.batch
    added = keyed - raw
    print(f"decode, batches of {args.batch:,}: {raw * 1e9:.1f} ns/event unkeyed, {keyed * 1e9:.1f} keyed: "
          f"+{added * 1e9:.1f} ns/event (+{added / raw:.0%} of the stub decode)")
    print(f"at {EVENTS_PER_S / 1e6:.1f} M events/s: {added * EVENTS_PER_S * 1e3:.1f} ms of CPU a second "
          f"({added * EVENTS_PER_S:.2%} of one core)")


if __name__ == "__main__":
    main()

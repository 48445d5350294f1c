"""dataloader_cow: DataLoader workers copy a dataset of Python objects on read.

The dataset is ROWS rows of WIDTH floats each, held as a Python list of Python lists of
Python floats (about 6.5 KB of objects a row: 200 floats of 24 bytes and a list of 1.7 KB):
129 MB for the default 20000 rows. DataLoader(num_workers=2, shuffle=True) forks
two workers that share those pages with the main process. A worker reading a row writes the
reference counts of the row's list and floats, so the kernel copies each page it touches
(copy-on-write, "copy-on-read" here): each worker's PSS grows with the rows it has read,
while its heap (malloc, the Python allocator's arenas) does not, since nothing is
allocated to hold them. A training step (a Linear layer, SGD) runs on each batch, paced to
`--step-ms` (150 ms: 100 steps in 15 s), so the workers read the rows over several seconds.
Why that long: a recorder reads each process's PSS no more often than its CPU budget
allows (memprof: once a second, and at most 2 % of a CPU; reading three ~200 MB processes
whose pages are being copied took ~50 ms here, so a read every 2.5 s), and its advice wants
at least four reads of each worker. At 80 ms a step a recording got 3 reads of one worker.

`--numpy` keeps the same numbers in one float64 numpy array (ROWS x WIDTH): a row read is a
view of the array's buffer, no reference count in it is written, and the workers' PSS stays
flat: the control.

Measured here (2 CPUs, not recorded): each worker's PSS grew ~49 MB from the first batch to
the last with lists, ~1-5 MB with --numpy. Recorded, `memprof report advice` gave "+64.7 MiB
of PSS" for the two workers over their samples (which begin after the workers do), within 3%
of what these reads gave over the same times.

Before the first batch, every 10 batches and after the last one the main process reads
each worker's /proc/PID/smaps_rollup: the measure the recording's advice is checked against.
It prints each read as "pss pid=PID t_ns=T pss=B" (T: time.monotonic_ns(), the recording's
clock), then per worker
    "worker PID comm=NAME pss_first=B pss_last=B pss_grew=B"
then "workers_pss_grew=B" (the sum), "dataset=TYPE" and "steps=N".

usage: dataloader_cow.py [--numpy] [--rows N] [--batch N] [--step-ms MS]
"""
from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WIDTH = 200


class RowsDataset(Dataset):
    """Rows of floats: a Python list of Python lists (copied on read by every worker), or one
    numpy array (`--numpy`: not copied)."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        row = self.rows[index]
        return torch.as_tensor(row, dtype=torch.float32), float(sum(row[:4]))


def make_rows(count: int, as_numpy: bool):
    rng = random.Random(0)
    rows = [[rng.random() for _ in range(WIDTH)] for _ in range(count)]
    if as_numpy:
        import numpy as np
        return np.array(rows, dtype=np.float64)
    return rows


def pss_of(pid: int) -> int:
    """Pss of `pid` in bytes (its /proc/PID/smaps_rollup)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def read_workers(workers: list[int]) -> dict[int, int]:
    """Each worker's Pss now, printed with the time."""
    now, usage = time.monotonic_ns(), {pid: pss_of(pid) for pid in workers}
    for pid, pss in usage.items():
        print(f"pss pid={pid} t_ns={now} pss={pss}", flush=True)
    return usage


def comm_of(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--numpy", action="store_true", help="one numpy array instead of Python lists (the control)")
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=150.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    dataset = RowsDataset(make_rows(args.rows, args.numpy))
    loader = DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=2)
    model = nn.Linear(WIDTH, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    batches = iter(loader)
    workers = [w.pid for w in batches._workers]
    first = read_workers(workers)
    steps = 0
    for index, (x, y) in enumerate(batches):
        started = time.monotonic()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x).squeeze(1), y.float())
        loss.backward()
        optimizer.step()
        steps += 1
        if index == len(loader) - 1:  # the workers are still alive: read them before they exit
            last = read_workers(workers)
            comms = {pid: comm_of(pid) for pid in workers}
        elif index % 10 == 9:
            read_workers(workers)
        time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))
    for pid in workers:
        print(f"worker {pid} comm={comms[pid]} pss_first={first[pid]} pss_last={last[pid]} "
              f"pss_grew={last[pid] - first[pid]}", flush=True)
    print(f"workers_pss_grew={sum(last[p] - first[p] for p in workers)}", flush=True)
    print(f"dataset={type(dataset.rows).__module__}.{type(dataset.rows).__name__}", flush=True)
    print(f"steps={steps}", flush=True)


if __name__ == "__main__":
    main()

"""Growth series whose fits and forecasts are known (beside tests/gpu_factories.py, which they
build on): a device's size, a series held at given bytes per step, and a power law too slow
to fill anything."""
from __future__ import annotations

import pandas as pd

from tests.factories import ev
from tests.gpu_factories import MiB, S, samples_frame, step_marks, timeline_of


def ram(total_bytes: float) -> pd.DataFrame:
    """Samples saying the machine has `total_bytes` of RAM (MemTotal), from time 0."""
    return samples_frame([(0, "host_memory_total_bytes", "cpu", float(total_bytes))])


def steps_holding(live_bytes, first_step: int = 1) -> list[dict]:
    """Step marks first_step, first_step + 1, … 1 s apart (from 1 s); before the mark of the
    k-th, one block of stack 7 (replaced each step) holds live_bytes[k] bytes."""
    rows = step_marks(range(first_step, first_step + len(live_bytes)), start_ns=(1 - first_step) * S)
    for k, size in enumerate(live_bytes):
        t, addr = k * S + S // 2, 0x40_0000 + k * 0x1000
        rows += ([ev(t, "free", addr - 0x1000)] if k else []) + [ev(t, "alloc", addr, int(size), 7)]
    return rows


def slow_power_law(seconds: int = 50, b: float = 0.05) -> pd.DataFrame:
    """No step marks; at each whole second t = 1…`seconds` an allocation (stack 7) brings the
    live bytes to round(1 MiB · t^b). With b = 0.05, 64 GiB of RAM fills after about 10^96 s:
    the old report printed that number."""
    level = lambda t: round(MiB * t ** b) if t > 0 else 0  # noqa: E731
    return timeline_of([ev(t * S, "alloc", 0x1000 + t, level(t) - level(t - 1), 7) for t in range(1, seconds + 1)])


def quantity_steps(values, live_of, name: str = "tokens", stack_id: int = 7) -> tuple[list[dict], pd.DataFrame]:
    """Step marks 1…len(values), 1 s apart (from 1 s), each carrying the quantity `name` =
    values[k − 1] (a `quantity:NAME` sample at the mark's time, as the agent writes them);
    just before mark k, an allocation of stack `stack_id`, never freed, brings its live bytes
    to round(live_of(values[k − 1])) (which must not fall). (events rows, samples)."""
    rows, samples, live = step_marks(range(1, len(values) + 1)), [], 0
    for k, value in enumerate(values, start=1):
        target = int(round(live_of(value)))
        if target > live:
            rows.append(ev(k * S - S // 2, "alloc", 0x60_0000 + k * 0x1000, target - live, stack_id))
        live = target
        samples.append((k * S, f"quantity:{name}", "", float(value)))
    return rows, samples_frame(samples)

"""Synthetic inference recordings for the `kv-cache` and `attention-scores` advice rules, whose
numbers are known exactly (written with memprof.recording.writer, read back by memprof.api).

    generation(path, tokens=[100, 200, …], per_token=48 * KiB, weights=24 * MiB)
    sweep(path, seq_lens=(128, 256, 512, 1024), scores=True)

One process (pid 100), PyTorch's CPU allocator (layer torch_cpu, device cpu), 64 GiB of RAM.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import concat_events, ev, events_frame, mark, stacks_frames
from tests.gpu_factories import step_marks
from tests.html_factories import _columns

S = 1_000_000_000
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
RAM = 64 * GiB
ALLOC = ("native", "c10::DefaultCPUAllocator::allocate(unsigned long)", "libc10.so", None, None)
CACHE_PY = "/venv/lib/python3.11/site-packages/transformers/cache_utils.py"

# Stacks: innermost first, as (kind, function, module, file, line).
WEIGHTS, KEYS, VALUES, LOGITS = 1, 11, 12, 13
QKV, SCORES, SOFTMAX, OUT, PAIRWISE = 21, 22, 23, 24, 25
CHAINS = {
    WEIGHTS: [ALLOC, ("python", "Conv1D.__init__", None, "/venv/transformers/pytorch_utils.py", 110)],
    KEYS: [ALLOC, ("python", "DynamicLayer.update", None, CACHE_PY, 136),
           ("python", "Cache.update", None, CACHE_PY, 1620),
           ("python", "GPT2Attention.forward", None, "/venv/transformers/models/gpt2/modeling_gpt2.py", 198)],
    VALUES: [ALLOC, ("python", "DynamicLayer.update", None, CACHE_PY, 137),
             ("python", "Cache.update", None, CACHE_PY, 1620),
             ("python", "GPT2Attention.forward", None, "/venv/transformers/models/gpt2/modeling_gpt2.py", 198)],
    LOGITS: [ALLOC, ("python", "keep_scores", None, "/work/serve.py", 31), ("python", "main", None, "/work/serve.py", 40)],
    QKV: [ALLOC, ("python", "main", None, "/work/examples/attention_sweep.py", 74)],
    SCORES: [ALLOC, ("python", "naive_attention", None, "/work/examples/attention_sweep.py", 54),
             ("python", "main", None, "/work/examples/attention_sweep.py", 77)],
    SOFTMAX: [ALLOC, ("python", "naive_attention", None, "/work/examples/attention_sweep.py", 55),
              ("python", "main", None, "/work/examples/attention_sweep.py", 77)],
    OUT: [ALLOC, ("python", "sdpa_attention", None, "/work/examples/attention_sweep.py", 62),
          ("python", "main", None, "/work/examples/attention_sweep.py", 77)],
    PAIRWISE: [ALLOC, ("python", "pairwise_distances", None, "/work/knn.py", 12), ("python", "main", None, "/work/knn.py", 30)],
}


def torch_cpu(ts_ns: int, action: str, addr: int, size=None, stack=None) -> dict:
    return ev(ts_ns, action, addr, size, stack, layer="torch_cpu", device="cpu")


def generation(path: Path, tokens, *, per_token: int = 48 * KiB, weights: int = 24 * MiB,
               cache_stacks=(KEYS, VALUES), keep: bool = True, with_tokens: bool = True, cached=None) -> Path:
    """Weights (stack WEIGHTS) from 0.1 s; step marks 1…n, 1 s apart, step k carrying the
    quantity tokens = tokens[k − 1] (unless `with_tokens` is False: a training loop's steps);
    half a second before mark k each of `cache_stacks` holds per_token / len(cache_stacks)
    bytes per token of tokens[k − 1] (one block more per step, never freed; with `keep`
    False, the step's block replaces none and is freed before the next: a cache per request).
    `cached`: the tokens the cache holds at each step, when not `tokens` (it must not fall)."""
    share = per_token // len(cache_stacks)
    rows = [torch_cpu(S // 10, "alloc", 0x10, weights, WEIGHTS)] + step_marks(range(1, len(tokens) + 1))
    samples = [(0, "host_memory_total_bytes", "cpu", float(RAM))]
    held = 0
    for k, (value, size_of) in enumerate(zip(tokens, cached or tokens), start=1):
        t = k * S - S // 2
        for j, stack in enumerate(cache_stacks):
            addr = 0x10_0000 * (j + 1) + k * 0x100
            size = share * size_of - (held if keep else 0)
            rows.append(torch_cpu(t, "alloc", addr, size, stack))
            if not keep:
                rows.append(torch_cpu(t + S // 4, "free", addr))
        held = share * size_of if keep else 0
        if with_tokens:
            samples.append((k * S, "quantity:tokens", "", float(value)))
    rows.append(mark((len(tokens) + 1) * S, 100))
    return _write(path, rows, samples)


def scores_bytes(seq_len: int, batch: int = 1, heads: int = 8) -> int:
    return batch * heads * seq_len * seq_len * 4


def sweep(path: Path, seq_lens=(128, 256, 512, 1024), *, batch: int = 1, heads: int = 8, head_dim: int = 64,
          scores: bool = True, quadratic_stack: int = SCORES, weights: int = 0) -> Path:
    """Weights (stack WEIGHTS, none when 0) from 0.1 s; for each L of `seq_lens`, 1 s apart from 1 s:
    memprof.mark("config", seq_len=L, batch=…, heads=…), then q, k, v (stack QKV, 3 × batch
    × heads × L × head_dim × 4 bytes); with `scores`, the scores (`quadratic_stack`) and
    their softmax (SOFTMAX; only when quadratic_stack is SCORES), each batch × heads × L² × 4
    bytes, both live together; the output (OUT, as q); all freed before the next mark."""
    rows = [torch_cpu(S // 10, "alloc", 0x10, weights, WEIGHTS)] if weights else []
    samples = []
    for k, L in enumerate(seq_lens, start=1):
        t, base = k * S, 0x100_0000 * k
        linear = batch * heads * L * head_dim * 4
        rows += [mark(t, 100, "config"), torch_cpu(t + 10, "alloc", base, 3 * linear, QKV)]
        blocks = [(base + 1, 3 * linear, QKV)]
        if scores:
            blocks.append((base + 2, scores_bytes(L, batch, heads), quadratic_stack))
            if quadratic_stack == SCORES:
                blocks.append((base + 3, scores_bytes(L, batch, heads), SOFTMAX))
        blocks.append((base + 4, linear, OUT))
        rows += [torch_cpu(t + 20 + i, "alloc", addr, size, stack) for i, (addr, size, stack) in enumerate(blocks[1:])]
        rows += [torch_cpu(t + S // 2, "free", addr) for addr, _, _ in blocks[1:]] + [torch_cpu(t + S // 2, "free", base)]
        samples += [(t, "quantity:seq_len", "", float(L)), (t, "quantity:batch", "", float(batch)),
                    (t, "quantity:heads", "", float(heads))]
    rows.append(mark((len(seq_lens) + 1) * S, 100))
    return _write(path, rows, samples)


def _write(path: Path, rows: list[dict], samples: list[tuple]) -> Path:
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "t.py"], pid=100, host="testhost",
                         kernel="6.8.0", start_ns=0)
    writer = RecordingWriter(path, meta)
    events = concat_events(events_frame(sorted(rows, key=lambda r: r["ts_ns"])))
    writer.append("events", _columns(events))
    stacks, frames = stacks_frames(CHAINS)
    writer.append("frames", {name: frames[name] for name in frames.columns})
    writer.append("stacks", {name: stacks[name] for name in stacks.columns})
    if samples:
        writer.append("samples", {"ts_ns": np.array([s[0] for s in samples], dtype=np.int64),
                                  "metric": [s[1] for s in samples], "device": [s[2] for s in samples],
                                  "value": np.array([s[3] for s in samples], dtype=float)})
    writer.finalize(end_ns=int(max(r["ts_ns"] for r in rows)) + S)
    return path

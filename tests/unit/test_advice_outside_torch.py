"""Advice rule `memory-outside-pytorch` (issue 22) on synthetic recordings with known answers,
both ways: (a) GPU driver memory outside PyTorch's caching allocator, large or growing; (b)
pinned host memory growing per step; (c) kernel objects growing per step, grouped by their
user frame. No GPU here: these recordings are what the uprobes on libcuda and the agent's
CUDA history write (driver rows on device "cuda" or "cuda:N", pinned host rows on "cpu",
segments on "cuda:N"). Real kernel workloads: tests/integration/test_advice_kernel.py."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from memprof.analysis.advice import outside_torch
from memprof.analysis.advice.outside_torch_kernel import call_site_frame, object_kind
from memprof.api import analyse
from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import ev, mark, stacks_frames
from tests.gpu_factories import PID, GiB, MiB, S, cuda, leak_per_step, samples_frame, step_marks, timeline_of

RULE = outside_torch.RULE_ID
NCCL = [("native", "ncclMemAlloc", "libnccl.so.2", None, None), ("native", "ncclCommInitRank", "libnccl.so.2", None, None),
        ("python", "init_process_group", None, "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 1500),
        ("python", "main", None, "/src/train.py", 12)]
CUBLAS = [("native", "cublasCreate_v2", "libcublas.so.12", None, None), ("python", "forward", None, "/src/model.py", 40)]
CACHING = [("native", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "libc10_cuda.so",
            None, None), ("python", "forward", None, "/src/model.py", 41)]
PINNED = [("native", "cudaHostAlloc", "libcudart.so.12", None, None),
          ("python", "pin_batch", None, "/src/loader.py", 77)]
PIPE = [("kernel", "__kmalloc_noprof", "vmlinux", None, None), ("kernel", "alloc_pipe_info", "vmlinux", None, None),
        ("kernel", "create_pipe_files", "vmlinux", None, None), ("kernel", "do_pipe2", "vmlinux", None, None),
        ("native", "pipe", "libc.so.6", None, None),
        ("python", "pipe", None, "/usr/lib/python3.11/subprocess.py", 1700),
        ("python", "launch", None, "/src/workers.py", 23)]
CHAINS = {5: NCCL, 6: CUBLAS, 7: PINNED, 8: PIPE, 9: CACHING, 10: PINNED[:1]}


def write(path: Path, rows: list[dict], samples: pd.DataFrame | None = None) -> Path:
    """A finalized recording of `rows` with CHAINS' stacks and `samples`."""
    events = timeline_of(rows)
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=100,
                                                 start_ns=0))
    writer.append("events", {name: events[name] for name in events.columns})
    stacks, frames = stacks_frames(CHAINS)
    writer.append("stacks", {name: stacks[name] for name in stacks.columns})
    writer.append("frames", {name: frames[name] for name in frames.columns})
    if samples is not None:
        writer.append("samples", {name: samples[name].to_numpy() for name in samples.columns})
    writer.finalize(end_ns=int(events["ts_ns"].max()) + S)
    return path


def judge(path: Path):
    verdict = outside_torch.check(analyse(path))
    assert all(advice.rule == RULE for advice in verdict.advice)
    return verdict


# ---- (a) driver memory outside the caching allocator ---------------------------------------------

# cuda:0 held from 1 s: a 9 GiB segment's driver allocation (its address is the segment's),
# 1 GiB of NCCL buffers (in no segment); 2 GiB of pinned host memory (device cpu: not the GPU's).
# NVML counts 10.5 GiB for the process: 0.5 GiB of CUDA context.
LARGE = [
    cuda(1 * S, "alloc", 0x1000, 9 * GiB, layer="cuda_driver", stack_id=9),
    cuda(1 * S, "alloc", 0x9000, 1 * GiB, layer="cuda_driver", stack_id=5),
    cuda(1 * S, "alloc", 0x7000, 2 * GiB, layer="cuda_driver", device="cpu", stack_id=7),
    cuda(2 * S, "alloc", 0x1000, 9 * GiB, layer="cuda_segment"),
    cuda(3 * S, "alloc", 0x1000, 4 * GiB, requested_bytes=3 * GiB),
    cuda(5 * S, "free", 0x1000),
]
NVML = samples_frame([(t, "gpu_process_bytes", "cuda:0", 10.5 * GiB) for t in (S // 2, 4 * S, 6 * S)])


def test_nccl_buffers_outside_the_caching_allocator_at_the_peak(tmp_path):
    verdict = judge(write(tmp_path / "nccl.memprof", LARGE, NVML))
    (advice,) = verdict.advice
    assert advice.title == "NCCL memory outside PyTorch's caching allocator on cuda:0: 1.0 GiB at the peak"
    assert advice.numbers | {} == {"device": "cuda:0", "driver_bytes": 10 * GiB, "reserved_bytes": 9 * GiB,
                                   "not_pytorch_bytes": 1 * GiB, "peak_ns": 6 * S, "library": "NCCL"}
    assert advice.saving_bytes == 1 * GiB and advice.chains == (5,) and advice.device == "cuda:0"
    assert advice.evidence[0] == ("At the GPU's peak (6.00 s into the recording) the driver held 10.0 GiB on "
                                  "cuda:0: 9.0 GiB are PyTorch's caching-allocator segments (reserved), 1.0 GiB are "
                                  "outside it (not_pytorch).")
    assert "NVML counted 10.5 GiB" in advice.evidence[1] and "512.0 MiB more" in advice.evidence[1]
    assert advice.evidence[2] == "1.0 GiB from ncclMemAlloc (libnccl.so.2) ← main (/src/train.py:12) (NCCL)"
    assert "NCCL_BUFFSIZE" in advice.change


def test_driver_memory_outside_pytorch_that_grows_per_step(tmp_path):
    """Driver rows on "cuda" (as the uprobes write them: the call does not say which GPU)
    against segments on cuda:0: a 2 GiB segment throughout, and 16 MiB of cuBLAS workspace
    kept every step for 12 steps: 192 MiB at the end (under the large bar), grown 176 MiB
    from the first step mark to the last."""
    rows = step_marks(range(1, 13)) + [cuda(S // 2, "alloc", 0x1000, 2 * GiB, layer="cuda_driver", device="cuda",
                                            stack_id=9),
                                       cuda(S // 2, "alloc", 0x1000, 2 * GiB, layer="cuda_segment")]
    rows += [cuda(k * S + S // 4, "alloc", 0x10_0000 * k, 16 * MiB, layer="cuda_driver", device="cuda", stack_id=6)
             for k in range(1, 13)]
    (advice,) = judge(write(tmp_path / "grows.memprof", rows)).advice
    assert advice.device == "cuda" and advice.numbers["library"] == "cuBLAS"
    assert advice.numbers["grew_bytes"] == 176 * MiB and advice.saving_bytes == 176 * MiB
    assert advice.numbers["slope_bytes_per_unit"] == 16 * MiB and advice.numbers["checkpoint_unit"] == "step"
    assert advice.numbers["reserved_bytes"] == 2 * GiB and advice.numbers["not_pytorch_bytes"] == 192 * MiB
    assert "It grew from 0 B to 176.0 MiB over 12 steps: 16.0 MiB per step" in advice.evidence[1]
    assert advice.chains == (6,) and "CUBLAS_WORKSPACE_CONFIG" in advice.change


def test_memory_of_the_caching_allocator_is_not_outside_it(tmp_path):
    """Control: a segment's driver allocation (same address), an expandable segment's
    cuMemCreate (no address to match, its chain runs through libc10_cuda), and 100 MiB of NCCL
    held steady (under the large bar, not growing): no advice."""
    rows = step_marks(range(1, 13)) + [
        cuda(S // 2, "alloc", 0x1000, 9 * GiB, layer="cuda_driver", device="cuda", stack_id=9),
        cuda(S // 2, "alloc", 0x1000, 9 * GiB, layer="cuda_segment"),
        cuda(S // 2, "alloc", 0x5_0000, 4 * GiB, layer="cuda_driver", device="cuda", stack_id=9),
        cuda(S // 2, "alloc", 0x6_0000, 100 * MiB, layer="cuda_driver", device="cuda", stack_id=5)]
    verdict = judge(write(tmp_path / "torch_only.memprof", rows))
    assert verdict.advice == ()
    assert verdict.why_not.startswith("GPU driver memory outside PyTorch's caching allocator stayed under 256.0 MiB")


# ---- (b) pinned host memory ----------------------------------------------------------------------

def test_pinned_host_memory_growing_per_step(tmp_path):
    """4 MiB pinned (cuda_driver on cpu, cudaHostAlloc from pin_batch) kept every step for 12
    steps, beside 64 KiB pinned and freed within each step."""
    rows = leak_per_step(12, 4 * MiB, layer="cuda_driver", device="cpu", stack_id=7, churn_stack=10)
    (advice,) = judge(write(tmp_path / "pinned.memprof", rows)).advice
    assert advice.title == "Pinned host memory grows 4.0 MiB per step"
    assert advice.saving_bytes == 48 * MiB and advice.chains == (7,) and advice.device == "cpu"
    assert advice.numbers == {"held_bytes": 48 * MiB, "bytes_per_step": 4 * MiB, "chains": 1, "buffers": 12}
    assert "from cudaHostAlloc (libcudart.so.12) ← pin_batch (/src/loader.py:77)" in advice.evidence[1]


def test_pinned_buffers_reused_or_device_memory_growing_are_not_pinned_growth(tmp_path):
    """Controls: a pinned pool of 256 MiB made once and held, pinned buffers freed every
    step, and device memory (not pinned) growing 1 MiB a step (under the driver's bar)."""
    rows = leak_per_step(12, 1 * MiB, layer="cuda_driver", device="cuda", stack_id=6, churn_stack=10)
    rows += [cuda(S // 2, "alloc", 0x7000_0000, 256 * MiB, layer="cuda_driver", device="cpu", stack_id=7)]
    rows += [cuda(k * S + S // 2, "alloc", 0x4000_0000, 8 * MiB, layer="cuda_driver", device="cpu", stack_id=7)
             for k in range(1, 13)]
    rows += [cuda(k * S + 3 * S // 4, "free", 0x4000_0000, layer="cuda_driver", device="cpu") for k in range(1, 13)]
    verdict = judge(write(tmp_path / "pool.memprof", rows))
    assert verdict.advice == ()
    assert "no pinned host memory growing per step by 16.0 MiB or more" in verdict.why_not


# ---- (c) kernel objects --------------------------------------------------------------------------

def test_pipes_kept_per_step_are_named_by_their_user_frame(tmp_path):
    """A 4 KiB pipe object kept every step for 20 steps (80 KiB), from workers.py:23 through
    subprocess.py: one advice, 20 pipes, 4 KiB per step."""
    rows = leak_per_step(20, 4096, layer="kernel_slab", stack_id=8, churn_stack=8)
    (advice,) = judge(write(tmp_path / "pipes.memprof", rows)).advice
    assert advice.title == "20 pipes kept open from launch (workers.py:23): kernel memory grows 4.0 KiB per step"
    assert advice.numbers["objects"] == 20 and advice.numbers["held_bytes"] == 20 * 4096
    assert advice.numbers["bytes_per_step"] == 4096 and advice.saving_bytes == 20 * 4096
    assert advice.chains == (8,) and advice.layer == "kernel_slab"
    assert "20 × alloc_pipe_info of 4.0 KiB: 80.0 KiB" in advice.evidence[1]


def test_a_chain_split_by_the_exit_counts_its_growth_and_objects_once(tmp_path):
    """40 pipes kept one per step, the process exiting after the last step, and the exit
    freeing half of them (the odd steps'): one chain, two findings (what the exit released,
    what it did not), each carrying the whole chain's trend. The site grows 4 KiB per step
    and made 40 pipes: summing both findings' slopes said 8 KiB (as CI65's 6,576 B for 4,848
    B), and the larger finding's count said 20."""
    rows = leak_per_step(40, 4096, layer="kernel_slab", stack_id=8, churn_stack=8)
    rows += [mark(41 * S, PID, "exit")]
    rows += [ev(41 * S + S // 2 + k, "free", 0x10_0000 + k * 0x1000, layer="kernel_slab", device="cpu")
             for k in range(1, 41, 2)]
    (advice,) = judge(write(tmp_path / "pipes_split.memprof", rows)).advice
    assert advice.numbers["bytes_per_step"] == 4096 and advice.numbers["objects"] == 40, advice.numbers
    assert advice.numbers["chains"] == 1 and advice.numbers["held_bytes"] == 40 * 4096, advice.numbers
    assert advice.title == "40 pipes kept open from launch (workers.py:23): kernel memory grows 4.0 KiB per step"
    assert "in 1 chain(s)" in advice.evidence[0], advice.evidence
    assert advice.chains == (8,), advice.chains


def test_few_kernel_objects_are_not_advised_on(tmp_path):
    """Control: 12 pipes kept over 12 steps (48 KiB, under KERNEL_MIN_BYTES and
    KERNEL_MIN_OBJECTS)."""
    rows = leak_per_step(12, 4096, layer="kernel_slab", stack_id=8, churn_stack=8)
    verdict = judge(write(tmp_path / "few.memprof", rows))
    assert verdict.advice == () and "no kernel objects of one call site" in verdict.why_not


@pytest.mark.parametrize("chain, kind", [(PIPE, "pipe"), (NCCL, "kernel object"),
                                         ([("kernel", "sk_alloc", "vmlinux", None, None)], "socket")])
def test_object_kind(chain, kind):
    assert object_kind([dict(zip(("kind", "function", "module", "file", "line"), f)) for f in chain]) == kind


def test_the_user_frame_is_the_programs_own_not_the_standard_librarys():
    frames = [dict(zip(("kind", "function", "module", "file", "line"), f)) for f in PIPE]
    assert call_site_frame(frames)["function"] == "launch"
    native = [{"kind": "native", "function": "__pipe", "module": "libc.so.6"},
              {"kind": "native", "function": "leak_and_churn", "module": "kernel_leak"}]
    assert call_site_frame(native)["function"] == "leak_and_churn"


def test_the_rule_entry_names_its_thresholds():
    names = {t.name for t in outside_torch.RULE.thresholds}
    assert names == {"DRIVER_OUTSIDE_MIN_BYTES", "DRIVER_GROWTH_MIN_BYTES", "PINNED_GROWTH_MIN_BYTES",
                     "KERNEL_MIN_BYTES", "KERNEL_MIN_OBJECTS", "GROWTH_CONFIDENCE"}
    assert outside_torch.RULE.id == RULE and outside_torch.RULE.needs

"""gpu_breakdown, its renderers and `memprof report gpu`: the GPU equation on synthetic
timelines whose terms are known."""
from __future__ import annotations

import json

import pytest

from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.gpu import GpuTerms, gpu_breakdown
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.model.meta import RecordingMeta, SourceStats
from memprof.analysis.views import About, GpuView
from memprof.report.gpu import render, to_json
from tests.gpu_factories import (
    EQUATION_EVENTS, EQUATION_SAMPLES, GiB, MiB, S, cuda, samples_frame, step_marks, timeline_of, write_recording,
)

DRIVER_WHY = "no cuda_driver events: libcuda was not probed (recorded without a GPU, or --sources excluded it)"
NVML_WHY = "no NVML samples: no NVIDIA GPU or pynvml"
SEGMENT_WHY = ("no cuda_segment events: PyTorch's caching-allocator history was not recorded (the target did not "
               "use CUDA through torch, or record --no-agent)")


def breakdown(rows, samples=None, **kwargs):
    events = timeline_of(rows)
    return gpu_breakdown(pair_lifetimes(events), events, samples, **kwargs)


def test_equation_at_the_peak_has_the_known_terms():
    (gpu,) = breakdown(EQUATION_EVENTS, EQUATION_SAMPLES).devices
    assert (gpu.device, gpu.peak_of, gpu.used_nvml_metric) == ("cuda:0", "used_nvml", "gpu_process_bytes")
    assert gpu.peak == GpuTerms(
        ts_ns=4 * S, step=None, used_nvml=21 * GiB // 2, gpu_used=12 * GiB, driver=10 * GiB, reserved=9 * GiB,
        allocated=6 * GiB, requested=5 * GiB, context_and_unseen=GiB // 2, not_pytorch=1 * GiB,
        cached_free=3 * GiB, fragmentation=1 / 3)
    assert (gpu.peak_reserved_bytes, gpu.peak_requested_bytes, gpu.amplification) == (9 * GiB, 5 * GiB, 9 / 5)
    assert gpu.missing == {}
    # NVML's samples are 3.5 s apart here: from 1 s to 4 s its last one predates the driver's 10 GiB.
    assert len(gpu.notes) == 1 and gpu.notes[0].startswith("context_and_unseen is negative at 11 of 21 times ")


def test_pinned_host_memory_of_the_driver_is_no_gpu_device():
    result = breakdown(EQUATION_EVENTS, EQUATION_SAMPLES)
    assert [d.device for d in result.devices] == ["cuda:0"]
    assert result.devices[0].peak.driver == 10 * GiB  # the 2 GiB on "cpu" left out


def _unindexed(rows):
    """The rows with the driver's on "cuda": what the libcuda uprobes record (no GPU index)."""
    return [dict(row, device="cuda") if row.get("layer") == "cuda_driver" and row.get("device") == "cuda:0" else row
            for row in rows]


def test_driver_rows_without_a_gpu_index_are_the_one_gpus():
    result = breakdown(_unindexed(EQUATION_EVENTS), EQUATION_SAMPLES)
    assert [d.device for d in result.devices] == ["cuda:0"] and result.notes == []
    (gpu,) = result.devices
    assert (gpu.peak.driver, gpu.peak.not_pytorch, gpu.peak.context_and_unseen) == (10 * GiB, 1 * GiB, GiB // 2)


def test_driver_rows_without_a_gpu_index_stay_apart_beside_two_gpus():
    second = [cuda(S, "alloc", 0x9000, GiB, layer="cuda_segment", device="cuda:1")]
    result = breakdown(_unindexed(EQUATION_EVENTS) + second, EQUATION_SAMPLES)
    assert [d.device for d in result.devices] == ["cuda:0", "cuda:1", "cuda"]
    assert result.devices[2].peak.driver == 10 * GiB and result.devices[0].peak.driver is None
    assert result.notes == ["cuda_driver allocations are recorded without a GPU index; with 2 GPUs they are shown "
                            "apart, as device 'cuda'"]


def test_over_time_at_step_marks_with_nvml_as_its_last_sample():
    rows = EQUATION_EVENTS + step_marks([1, 2, 3, 4])  # steps at 1, 2, 3, 4 s
    (gpu,) = breakdown(rows, EQUATION_SAMPLES).devices
    assert breakdown(rows, EQUATION_SAMPLES).at == "steps"
    got = [(t.ts_ns, t.step, t.used_nvml, t.driver, t.reserved, t.allocated, t.cached_free) for t in gpu.over_time]
    assert got == [
        (1 * S, 1, GiB // 2, 10 * GiB, 0, 0, 0),                     # NVML: the 0.5 s sample
        (2 * S, 2, GiB // 2, 10 * GiB, 9 * GiB, 0, 9 * GiB),
        (3 * S, 3, GiB // 2, 10 * GiB, 9 * GiB, 6 * GiB, 3 * GiB),   # events at t count at t
        (4 * S, 4, 21 * GiB // 2, 10 * GiB, 9 * GiB, 6 * GiB, 3 * GiB),
    ]
    assert [t.fragmentation for t in gpu.over_time] == [None, 1.0, pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert gpu.peak.step == 4


def test_points_caps_the_steps_keeping_first_and_last():
    rows = EQUATION_EVENTS + step_marks(range(1, 11), every_ns=S // 2)
    (gpu,) = breakdown(rows, EQUATION_SAMPLES, points=3).devices
    assert [(t.ts_ns, t.step) for t in gpu.over_time] == [(S // 2, 1), (5 * S // 2, 5), (5 * S, 10)]


def test_without_steps_times_are_evenly_spaced_over_the_gpu_data():
    result = breakdown(EQUATION_EVENTS, EQUATION_SAMPLES, points=5)
    assert result.at == "times"
    # Span: the first NVML sample (0.5 s) to the last (6 s).
    assert [t.ts_ns for t in result.devices[0].over_time] == [S // 2, 1_875_000_000, 3_250_000_000,
                                                             4_625_000_000, 6 * S]
    assert [t.step for t in result.devices[0].over_time] == [None] * 5


def test_missing_layers_give_none_with_reasons():
    blocks_only = [cuda(1 * S, "alloc", 0x10, 4 * MiB, requested_bytes=3 * MiB), cuda(2 * S, "free", 0x10)]
    (gpu,) = breakdown(blocks_only).devices
    assert (gpu.peak_of, gpu.used_nvml_metric) == ("allocated", None)
    assert gpu.peak == GpuTerms(ts_ns=1 * S, allocated=4 * MiB, requested=3 * MiB)
    assert gpu.missing == {
        "used_nvml": NVML_WHY, "gpu_used": NVML_WHY, "driver": DRIVER_WHY, "reserved": SEGMENT_WHY,
        "context_and_unseen": "needs used_nvml and driver", "not_pytorch": "needs driver and reserved",
        "cached_free": "needs reserved", "fragmentation": "needs reserved", "amplification": "needs peak reserved",
    }


def test_reasons_come_from_the_recordings_metadata():
    meta = RecordingMeta(sources={
        "samplers": SourceStats(detail={"nvml": {"enabled": False, "reason": "pynvml not installed"}}),
        "ebpf": SourceStats(detail={"families": ["kmem", "torch"]}),
    })
    (gpu,) = breakdown([cuda(1 * S, "alloc", 0x10, MiB)], meta=meta).devices
    assert gpu.missing["used_nvml"] == "no NVML samples: pynvml not installed"
    assert gpu.missing["driver"] == "no cuda_driver events: libcuda was not probed (--sources excluded cuda)"


def test_a_family_left_out_for_want_of_a_driver_says_why():
    why = ("no NVIDIA driver (none of /proc/driver/nvidia, /dev/nvidiactl, /dev/dxg exists); "
           "--sources +cuda probes libcuda all the same")
    detail = {"families": ["kmem", "torch"], "left_out": {"cuda": why}}
    meta = RecordingMeta(sources={"ebpf": SourceStats(detail=detail)})
    (gpu,) = breakdown([cuda(1 * S, "alloc", 0x10, MiB)], meta=meta).devices
    assert gpu.missing["driver"] == f"no cuda_driver events: libcuda was not probed: {why}"


def test_a_device_missing_a_layer_another_has_says_so():
    rows = [cuda(1 * S, "alloc", 0x10, MiB, layer="cuda_driver"), cuda(1 * S, "alloc", 0x10, MiB, device="cuda:1")]
    gpu0, gpu1 = breakdown(rows).devices
    assert (gpu0.device, gpu1.device) == ("cuda:0", "cuda:1")
    assert gpu1.missing["driver"] == "no cuda_driver events on cuda:1"
    assert gpu0.missing["allocated"] == "no cuda_block events on cuda:0"
    assert gpu0.missing["reserved"] == SEGMENT_WHY  # no device has segments


def test_only_nvml_samples_still_break_down_what_they_can():
    samples = samples_frame([(S, "gpu_used_bytes", "cuda:0", 3.0 * GiB), (2 * S, "gpu_used_bytes", "cuda:0", 5.0 * GiB)])
    (gpu,) = breakdown([], samples).devices
    assert (gpu.peak_of, gpu.peak.ts_ns, gpu.peak.used_nvml, gpu.peak.gpu_used) == ("used_nvml", 2 * S, 5 * GiB, 5 * GiB)
    assert gpu.used_nvml_metric == "gpu_used_bytes"
    assert gpu.notes == ["no gpu_process_bytes (the driver cannot list processes): used_nvml is gpu_used_bytes, "
                         "every process's"]
    assert gpu.peak.driver is None and gpu.missing["driver"] == DRIVER_WHY


def test_process_bytes_zero_throughout_falls_back_to_the_whole_gpu_with_a_note():
    samples = samples_frame([(S, "gpu_process_bytes", "cuda:0", 0.0), (S, "gpu_used_bytes", "cuda:0", 2.0 * GiB)])
    (gpu,) = breakdown([cuda(S // 2, "alloc", 0x10, GiB, layer="cuda_driver")], samples).devices
    assert gpu.used_nvml_metric == "gpu_used_bytes" and gpu.peak.context_and_unseen == GiB
    assert "gpu_process_bytes is 0 throughout" in gpu.notes[0]


def test_negative_differences_are_kept_with_a_note():
    # NVML's peak sample (9 GiB) reads less than the 10 GiB the driver handed out before it.
    rows = [cuda(1 * S, "alloc", 0x10, 10 * GiB, layer="cuda_driver")]
    samples = samples_frame([(2 * S, "gpu_process_bytes", "cuda:0", 9.0 * GiB)])
    (gpu,) = breakdown(rows, samples, points=2).devices
    assert gpu.peak.context_and_unseen == -GiB
    assert gpu.notes == ["context_and_unseen is negative at 2 of 3 times (used_nvml < driver): NVML is sampled (its "
                         "last sample before t can predate driver allocations made since); shown as measured, not "
                         "clamped"]
    assert gpu.over_time[0].used_nvml is None  # 1 s: before NVML's first sample


def test_blocks_without_requested_bytes_count_their_size_and_say_so():
    rows = [cuda(1 * S, "alloc", 0x10, 8 * MiB, layer="cuda_segment"), cuda(1 * S, "alloc", 0x10, 4 * MiB),
            cuda(1 * S, "alloc", 0x20, 2 * MiB, requested_bytes=MiB)]
    (gpu,) = breakdown(rows).devices
    assert (gpu.peak_requested_bytes, gpu.amplification) == (5 * MiB, 8 / 5)
    assert gpu.notes == ["1 of 2 blocks have no requested_bytes: their size_bytes counts as requested"]


def test_no_gpu_at_all_gives_no_devices_and_says_what_was_looked_for():
    result = breakdown([dict(ts_ns=1, action="alloc", addr=0x10, size_bytes=64, layer="native_heap")])
    assert result.devices == []
    assert result.notes == ["no GPU memory in this recording", NVML_WHY, DRIVER_WHY, SEGMENT_WHY]


# ---- rendering ------------------------------------------------------------------------------

GOLDEN = """\
cuda:0 at the peak of used_nvml (+4.00s, step 2)
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ term                          ┃     bytes ┃ is                                        ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ NVML used (gpu_process_bytes) │  10.5 GiB │                                           │
│   context and unseen          │ 512.0 MiB │ NVML used − driver                        │
│ driver (cuda_driver)          │  10.0 GiB │                                           │
│   not PyTorch (NCCL, …)       │   1.0 GiB │ driver − reserved                         │
│ reserved (cuda_segment)       │   9.0 GiB │                                           │
│   cached free                 │   3.0 GiB │ reserved − allocated; fragmentation 33.3% │
│ allocated (cuda_block)        │   6.0 GiB │                                           │
│   requested                   │   5.0 GiB │ what the tensors asked for                │
│ GPU used, every process       │  12.0 GiB │ NVML gpu_used_bytes                       │
└───────────────────────────────┴───────────┴───────────────────────────────────────────┘
  amplification: 1.80× (peak reserved 9.0 GiB / peak requested 5.0 GiB)

cuda:0 at each step

     at  step       NVML    driver  reserved  allocated    context  not torch   cached   frag
 ────────────────────────────────────────────────────────────────────────────────────────────
 +1.50s     1  512.0 MiB  10.0 GiB       0 B        0 B   -9.5 GiB   10.0 GiB      0 B      –
 +3.00s     2  512.0 MiB  10.0 GiB   9.0 GiB    6.0 GiB   -9.5 GiB    1.0 GiB  3.0 GiB  33.3%
 +4.50s     3   10.5 GiB  10.0 GiB   9.0 GiB    6.0 GiB  512.0 MiB    1.0 GiB  3.0 GiB  33.3%
 +6.00s     4   10.5 GiB  10.0 GiB   9.0 GiB    2.0 GiB  512.0 MiB    1.0 GiB  7.0 GiB  77.8%

  note: context_and_unseen is negative at 2 of 5 times (used_nvml < driver): NVML is sampled (its
last sample before t can predate driver allocations made since); shown as measured, not clamped

"""


def rendered(result, **kwargs) -> str:
    console = Console(width=100, record=True, color_system=None)
    render(GpuView(result, About("r", **kwargs)), console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def test_golden_table_at_100_columns():
    result = breakdown(EQUATION_EVENTS + step_marks([1, 2, 3, 4], every_ns=3 * S // 2), EQUATION_SAMPLES)
    assert rendered(result) == GOLDEN


def test_table_shows_missing_terms_and_escapes_reasons():
    meta = RecordingMeta(sources={"samplers": SourceStats(detail={"nvml": {"reason": "[bold]odd[/] driver"}})})
    text = rendered(breakdown([cuda(1 * S, "alloc", 0x10, MiB)], meta=meta), lost_events=3)
    assert "! 3 events were lost" in text
    assert "used_nvml: not computed: no NVML samples: [bold]odd[/] driver" in text
    assert "amplification: – (needs peak reserved)" in text


def test_json_has_every_term_with_nulls_and_reasons():
    result = breakdown([cuda(1 * S, "alloc", 0x10, MiB)], points=2)
    data = json.loads(json.dumps(to_json(GpuView(result, About("r.memprof", notes=("n1",))))))
    assert data["notes"] == ["n1"] and data["at"] == "times"
    (gpu,) = data["devices"]
    assert gpu["peak"] == {"ts_ns": S, "step": None, "used_nvml": None, "gpu_used": None, "driver": None,
                           "reserved": None, "allocated": MiB, "requested": MiB, "context_and_unseen": None,
                           "not_pytorch": None, "cached_free": None, "fragmentation": None}
    assert gpu["missing"]["driver"] == DRIVER_WHY and gpu["amplification"] is None


# ---- the command ----------------------------------------------------------------------------

def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_cli_json_and_table_from_a_recording(tmp_path):
    path = write_recording(tmp_path / "gpu.memprof", timeline_of(EQUATION_EVENTS), EQUATION_SAMPLES)
    code, out, err = invoke("report", "gpu", path, "--format", "json")
    assert code == 0, err
    (gpu,) = json.loads(out)["devices"]
    assert (gpu["peak"]["context_and_unseen"], gpu["peak"]["not_pytorch"], gpu["peak"]["cached_free"]) == \
        (GiB // 2, GiB, 3 * GiB)
    assert gpu["amplification"] == 1.8
    code, out, _ = invoke("report", "gpu", path, "--points", "4")
    assert code == 0 and "cuda:0 at the peak of used_nvml" in out and "1.80×" in out


def test_cli_exit_codes(tmp_path):
    assert invoke("report", "gpu", tmp_path / "nothing-here")[0] == 5
    path = write_recording(tmp_path / "gpu.memprof", timeline_of(EQUATION_EVENTS))
    assert invoke("report", "gpu", path, "--points", "1")[0] == 2
    assert invoke("report", "gpu", path, "--format", "yaml")[0] == 2
    code, out, _ = invoke("report", "gpu", path)
    assert code == 0 and "used_nvml: not computed: no NVML samples" in out

"""A job of several recordings, one per machine, reported as one (issue 23, item 4): per
host and per rank, the rank that differs across the whole job (ranks.py needs three to name
an odd one, and each machine here holds two), one leak list with host and rank on each
finding, and one clock through the clock anchors with its skew stated. Synthetic recordings
with known bytes and clocks; tests/integration/test_job_machines.py records real processes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from memprof.analysis.job import job_clock, recording_clock, to_realtime
from memprof.api import analyse, analyse_job
from memprof.errors import BadRecordingError
from memprof.model.meta import ClockAnchor, RecordingMeta, SourceStats
from tests.factories import ev, mark
from tests.gpu_factories import S, timeline_of, write_recording
from tests.unit.test_html import invoke

KiB = 1024
STEPS = 10
EPOCH = 1_800_000_000 * S  # a wall-clock time (2027) for the anchors
# Two machines, two ranks each; hostB's clock anchors spread by 40 µs (NTP slewing).
HOSTS = {"hostA": {0: 5100, 1: 5101}, "hostB": {2: 5100, 3: 5101}}  # the same pids on both: two machines
OFFSET_A, OFFSET_B = EPOCH + 7 * S, EPOCH - 40 * S  # realtime − monotonic on each machine
ANCHORS = {"hostA": [(0, OFFSET_A), (20 * S, 20 * S + OFFSET_A)],
           "hostB": [(50 * S, 50 * S + OFFSET_B), (60 * S, 60 * S + OFFSET_B + 40_000)]}


def _meta(host: str, anchors=None) -> RecordingMeta:
    ranks = HOSTS[host]
    anchors = ANCHORS[host] if anchors is None else anchors
    processes = {str(pid): {"agent": "installed", "rank": rank, "world_size": 4, "host": "the-real-machine"}
                 for rank, pid in ranks.items()}
    return RecordingMeta(memprof_version="0.1.0", command=["python"], start_ns=anchors[0][0] if anchors else 0,
                         pid=4000, host=host, clock_anchors=[ClockAnchor(m, r) for m, r in anchors],
                         sources={"agent": SourceStats(detail={"processes": processes})})


def _rows(host: str, leak_rank: int | None, start: int) -> list[dict]:
    """Each rank of `host`: 1 MiB of weights, STEPS step marks with a 64 KiB temporary freed
    at once; `leak_rank` also keeps 256 KiB a step on its own chain (stack 2)."""
    rows = []
    for rank, pid in HOSTS[host].items():
        at = dict(layer="torch_cpu", device="cpu", pid=pid, stack_id=1)
        offset = start + rank * 1000
        rows.append(ev(offset, "alloc", pid << 32, 1 << 20, **at))
        for k in range(1, STEPS + 1):
            t = offset + k * S // 2
            step = mark(t, pid, "step")
            step["step"] = k
            rows += [step, ev(t + 10, "alloc", (pid << 32) + 0x1000 * k, 64 * KiB, **at),
                     ev(t + 20, "free", (pid << 32) + 0x1000 * k, **at)]
            if rank == leak_rank:
                rows.append(ev(t + 30, "alloc", (pid << 32) + 0x100_0000 + 0x10_0000 * k, 256 * KiB,
                               **dict(at, stack_id=2)))
    return rows


def _job(tmp_path, leak_rank: int | None = 3):
    folder = tmp_path / "job"
    for host in HOSTS:
        start = ANCHORS[host][0][0]
        write_recording(folder / f"memprof-991-{host}.memprof", timeline_of(_rows(host, leak_rank, start)),
                        meta=_meta(host))
    return folder


def test_two_machines_are_one_job_with_the_leaking_rank_named_on_its_host(tmp_path):
    job = analyse_job([_job(tmp_path)]).result
    assert [(h.host, h.recordings, h.ranks) for h in job.hosts] == [("hostA", 1, (0, 1)), ("hostB", 1, (2, 3))]
    # the host is the recording's (record --host-label), not the machine the agent ran on
    assert [(r.rank, r.host, r.pids) for r in job.ranks] == [
        (0, "hostA", (5100,)), (1, "hostA", (5101,)), (2, "hostB", (5100,)), (3, "hostB", (5101,))]
    assert job.layer == "torch_cpu" and job.world_size == 4
    assert [(r.rank, r.host) for r in job.diverging] == [(3, "hostB")]
    leaking = job.ranks[3]
    assert leaking.growth_bytes_per_step == 256 * KiB
    assert leaking.peak_bytes == (1 << 20) + STEPS * 256 * KiB
    assert leaking.diverges == "grows 256.0 KiB per step where the other ranks' median is 0 B"
    # one leak list: the kept tensors, on hostB, made by rank 3 alone (same pids on hostA: not mixed up)
    kept = [leak for leak in job.leaks if leak.stack_id == 2]
    assert [(leak.host, leak.ranks, leak.pids, leak.live_bytes, leak.live_count) for leak in kept] == [
        ("hostB", (3,), (5101,), STEPS * 256 * KiB, STEPS)]
    assert job.hosts[1].leak_bytes >= STEPS * 256 * KiB and job.hosts[0].leaks == len(
        [leak for leak in job.leaks if leak.host == "hostA"])


def test_two_ranks_per_recording_are_judged_across_the_job_not_within_it(tmp_path):
    # Alone, each recording has two ranks: neither is the odd one.
    folder = _job(tmp_path)
    assert analyse(folder / "memprof-991-hostB.memprof").ranks().diverging == []
    assert analyse_job(sorted(folder.iterdir())).result.diverging[0].rank == 3


def test_a_job_without_a_leaking_rank_names_none(tmp_path):
    job = analyse_job([_job(tmp_path, leak_rank=None)]).result
    assert len(job.ranks) == 4 and job.diverging == []
    assert [leak for leak in job.leaks if leak.stack_id == 2] == []


def test_the_clock_maps_each_host_onto_realtime_and_states_the_skew(tmp_path):
    job = analyse_job([_job(tmp_path)]).result
    clock = job.clock
    assert clock.aligned and clock.why is None
    a, b = clock.recordings
    assert (a.host, a.offset_ns, a.spread_ns) == ("hostA", OFFSET_A, 0)
    # hostB's two offsets: OFFSET_B and 40 µs more; the median of two is their mean
    assert (b.host, b.spread_ns, b.offset_ns) == ("hostB", 40_000, OFFSET_B + 20_000)
    assert clock.skew_ns == 40_000
    # hostA starts at monotonic 0 → EPOCH+7s; hostB at monotonic 50 s → EPOCH+10s: one clock
    assert (a.start_realtime_ns, b.start_realtime_ns) == (EPOCH + 7 * S, EPOCH + 10 * S)
    assert clock.start_realtime_ns == EPOCH + 7 * S
    assert clock.overlap_ns == min(a.end_realtime_ns, b.end_realtime_ns) - (EPOCH + 10 * S) > 0


def test_times_between_anchors_are_interpolated_and_held_beyond():
    meta = _meta("hostB")
    at = to_realtime(meta, np.array([40 * S, 55 * S, 70 * S]))
    assert list(at - np.array([40 * S, 55 * S, 70 * S])) == [OFFSET_B, OFFSET_B + 20_000, OFFSET_B + 40_000]


def test_a_recording_without_anchors_leaves_the_job_on_separate_clocks():
    clocks = [recording_clock(_meta("hostA"), "a.memprof"), recording_clock(_meta("hostB", anchors=[]), "b.memprof")]
    clock = job_clock(clocks)
    assert not clock.aligned and clock.skew_ns is None
    assert clock.why == "no clock anchors to map onto CLOCK_REALTIME in hostB (b.memprof)"


def test_a_stepped_wall_clock_is_said(tmp_path):
    stepped = [(0, EPOCH), (10 * S, EPOCH + 10 * S + 2 * S)]  # the wall clock jumped 2 s
    clock = job_clock([recording_clock(_meta("hostA", anchors=stepped), "a.memprof")])
    assert clock.aligned and clock.skew_ns == 2 * S
    assert clock.why == "the wall clock moved by up to 2000 ms against the monotonic clock while recording on hostA"


def test_report_of_a_folder_or_several_recordings_is_the_job(tmp_path):
    folder = _job(tmp_path)
    code, out, err = invoke("report", folder, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert [(r["rank"], r["host"], r["diverges"] is not None) for r in data["ranks"]] == [
        (0, "hostA", False), (1, "hostA", False), (2, "hostB", False), (3, "hostB", True)]
    assert {"host": "hostB", "ranks": [3], "live_bytes": STEPS * 256 * KiB} == {
        k: v for k, v in data["leaks"][0].items() if k in ("host", "ranks", "live_bytes")}
    assert data["clock"]["aligned"] and data["clock"]["skew_ns"] == 40_000
    code, text, err = invoke("report", *sorted(folder.iterdir()))
    assert code == 0, err
    assert "memprof job · 2 recordings · 2 hosts · 4 ranks of 4" in text
    assert "! rank 3 on hostB (pid 5101): grows 256.0 KiB per step" in text
    assert "skew within ±40.0 µs" in text
    assert "hostB rank 3 · torch_cpu" in text


def test_one_recording_is_still_the_summary_and_a_folder_of_none_is_one_line(tmp_path):
    folder = _job(tmp_path)
    code, out, _ = invoke("report", folder / "memprof-991-hostA.memprof", "--format", "json")
    assert code == 0 and "findings" in json.loads(out)
    (tmp_path / "empty").mkdir()
    code, out, err = invoke("report", tmp_path / "empty")
    assert code == 5 and "no memprof recording (*.memprof) in" in err and "Traceback" not in err
    with pytest.raises(BadRecordingError):
        analyse_job([tmp_path / "empty"])


@pytest.mark.parametrize("command, environ, tag", [
    (["python", "train.py"], {"SLURM_JOB_ID": "991"}, "slurm991-node7"),
    (["torchrun", "--nnodes", "2", "--node-rank", "1", "--rdzv-id", "run42", "train.py", "--nnodes", "9"], {},
     "run42-node7"),
    (["/venv/bin/torchrun", "--nnodes=2:4", "--rdzv_id=abc", "train.py"], {}, "abc-node7"),
    (["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "train.py"], {},
     "torchrun-node1-node7"),
    (["torchrun", "train.py"], {"PET_NNODES": "2", "PET_RDZV_ID": "pet"}, "pet-node7"),
    # one machine: the name stays as it was
    (["torchrun", "--standalone", "--nproc_per_node", "4", "train.py"], {}, ""),
    (["torchrun", "--nnodes", "1", "train.py"], {}, ""),
    (["python", "train.py", "--nnodes", "2"], {}, ""),
])
def test_output_names_carry_the_job_and_the_host(command, environ, tag):
    from memprof.capture.session import default_output
    from memprof.cli.record import job_tag
    assert job_tag(command, environ, "node7") == tag
    name = default_output("python3", 4242, tag=tag).name
    assert name == (f"memprof-{tag}-python3-4242.memprof" if tag else "memprof-python3-4242.memprof")


def test_host_label_is_an_option_of_record():
    code, out, _ = invoke("record", "--help")
    assert code == 0 and "--host-label NAME" in out


def _readme_sql() -> str:
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Many machines\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```sql\n", 1)[1].split("```", 1)[0]


def test_duckdb_reads_the_live_bytes_per_rank_that_memprof_gives(tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    _job(tmp_path)
    monkeypatch.chdir(tmp_path)  # the README's query reads job/*.memprof
    rows = duckdb.sql(_readme_sql()).fetchall()
    # at each rank's last step mark: its weights, and on rank 3 the nine tensors kept before it
    assert [(host, rank, live) for host, rank, _, live in rows] == [
        ("hostA", 0, 1 << 20), ("hostA", 1, 1 << 20), ("hostB", 2, 1 << 20), ("hostB", 3, (1 << 20) + 9 * 256 * KiB)]
    for host, rank, at_ns, live in rows:
        analysed = analyse(f"job/memprof-991-{host}.memprof")
        view = analysed.attribution(by="rank", at=at_ns - analysed.span.start_ns, layers=("torch_cpu",), top=None)
        (layer,) = view.result.layers
        assert {row.rank: row.live_bytes for row in layer.rows}[f"rank {rank}"] == live


def test_a_missing_recording_of_a_job_is_one_line_before_any_analysis(tmp_path):
    folder = _job(tmp_path)
    for args in ([folder / "memprof-991-hostA.memprof", tmp_path / "nope.memprof", "--format", "json"],
                 ["job", folder, tmp_path / "nope.memprof"]):
        code, out, err = invoke("report", *args)
        assert code == 5 and f"{tmp_path / 'nope.memprof'} does not exist" in err and "Traceback" not in err
        assert out == ""


def test_growth_judged_over_windows_is_said_per_window(tmp_path):
    """A job attached to without the agent (`record --pid`: no step marks, still running at
    the end) is judged over time windows: its leaks read "grows per window", "/window", as
    `report leaks` says, not "per step" (before 2026-12-07)."""
    folder = tmp_path / "job"
    for host in HOSTS:
        start = ANCHORS[host][0][0]
        rows = [row for row in _rows(host, leak_rank=None, start=start) if row["action"] != "mark"]
        pid = HOSTS[host][min(HOSTS[host])]
        rows += [ev(start + k * S // 2 + 30, "alloc", 0x7000_0000 + 0x10_0000 * k, 256 * KiB, layer="torch_cpu",
                    device="cpu", pid=pid, stack_id=2) for k in range(1, 41)]
        write_recording(folder / f"memprof-991-{host}.memprof", timeline_of(rows), meta=_meta(host))
    code, text, err = invoke("report", *sorted(folder.iterdir()))
    assert code == 0, err
    lines = [line for line in text.splitlines() if "torch_cpu grows" in line]
    assert len(lines) == 2 and all("torch_cpu grows per window: " in line and "/window" in line for line in lines)
    code, out, err = invoke("report", folder, "--format", "json")
    assert {leak["slope_unit"] for leak in json.loads(out)["leaks"] if leak["kind"] == "grows_per_step"} == {"window"}

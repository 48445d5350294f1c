"""Pieces of `memprof record` that need no privileges: live bytes, stack interning, output
names, executables, privileges, loss accounting, units."""
import numpy as np
import pyarrow as pa
import pytest

from memprof.analysis.loss import skipped_frees_by_layer
from memprof.errors import TargetError, UsageError
from memprof.model import RecordingMeta, SourceStats
from memprof.capture.livebytes import LiveBytes
from memprof.capture.may_record import CAP_BPF, CAP_PERFMON, effective_capabilities
from memprof.capture.session import default_output
from memprof.capture.target import resolve_executable
from memprof.sources.symbols.stacks import StackInterner
from memprof.units import format_bytes, parse_duration, parse_size


def _batch(rows):
    """rows: (ts, layer, action, addr, size), as the decoder's Arrow columns (decode.py)."""
    ts, layer, action, addr, size = zip(*rows)
    category = lambda values, names: pa.DictionaryArray.from_arrays(  # noqa: E731
        pa.array([names.index(v) for v in values], pa.int8()), pa.array(names))
    return {
        "ts_ns": np.array(ts, dtype=np.int64),
        "layer": category(layer, ["kernel_slab", "kernel_page"]),
        "action": category(action, ["alloc", "free", "mark"]),
        "addr": np.array(addr, dtype=np.uint64),
        "size_bytes": pa.array([s if s else None for s in size], pa.int64()),
    }


def test_live_bytes_follow_allocs_and_frees_across_batches():
    live = LiveBytes()
    live.update(_batch([(1, "kernel_slab", "alloc", 0x1000, 64), (2, "kernel_slab", "alloc", 0x2000, 128),
                        (3, "kernel_page", "alloc", 0x1000, 4096), (4, "kernel_slab", "free", 0x1000, 0)]))
    assert live.bytes_by_layer == {"kernel_slab": 128, "kernel_page": 4096}
    # Reuse of one address inside a batch: only its last event counts.
    live.update(_batch([(6, "kernel_slab", "alloc", 0x1000, 32), (5, "kernel_slab", "free", 0x2000, 0),
                        (7, "kernel_slab", "free", 0x1000, 0), (8, "kernel_slab", "alloc", 0x1000, 16)]))
    assert live.bytes_by_layer["kernel_slab"] == 16
    live.update(_batch([(9, "kernel_page", "free", 0x1000, 4096)]))
    assert live.bytes_by_layer["kernel_page"] == 0


class _Symbols:
    def resolve(self, addrs):
        from memprof.sources.symbols.kallsyms import KFrame
        names = {0x100: "trace_kmalloc", 0x200: "__kmalloc", 0x300: "alloc_pipe_info"}
        return [KFrame(names.get(int(a) + 1, "[unknown]"), "vmlinux", 0) for a in addrs]


def test_stack_interning_is_stable_and_symbolized_once_with_tracing_frames_dropped():
    stacks = {1: [0x100, 0x200, 0x300], 2: [0x200]}
    interner = StackInterner(lambda i: stacks[i], lambda pid: [], lambda: _Symbols())
    arr = lambda *v: np.array(v)  # noqa: E731
    ids = interner.intern(arr(1, 1, 2, 1), arr(0, 0, 0, 0), arr(7, 7, 7, 8), arr(0x300, 0x300, 0x200, 0x300))
    assert ids[0] == ids[1] and len(set(ids.tolist())) == 3  # pid 8 is another chain
    again = interner.intern(arr(1), arr(0), arr(7), arr(0x300))
    assert again[0] == ids[0]
    rows, frames = interner.drain_tables()
    by_id = {}
    names = dict(zip(frames["frame_id"], frames["function"]))
    for sid, depth, fid in zip(rows["stack_id"], rows["depth"], rows["frame_id"]):
        by_id.setdefault(sid, []).append(names[fid])
    assert by_id[int(ids[0])] == ["__kmalloc", "alloc_pipe_info"]  # trace_ frame dropped
    assert len(interner.drain_tables()[0]["stack_id"]) == 0  # nothing new


def test_default_output_is_named_after_the_command_and_pid(tmp_path):
    assert default_output("/usr/bin/python3", 42, tmp_path) == tmp_path / "memprof-python3-42.memprof"
    assert default_output("weird name;x", 7, tmp_path).name == "memprof-weird_name_x-7.memprof"


def test_a_job_tag_from_the_environment_cannot_leave_the_folder(tmp_path):
    # The tag comes from SLURM_JOB_ID or --host-label: whatever they hold, one file in tmp_path.
    for tag in ("../../etc/cron.d/x", "/etc/passwd", "..", "a/../../b"):
        out = default_output("python3", 7, tmp_path, tag=tag)
        assert out.parent == tmp_path and "/" not in out.name, out


def test_resolve_executable_errors_are_typed(tmp_path):
    assert resolve_executable(["true"]).endswith("/true")
    with pytest.raises(TargetError, match="command not found"):
        resolve_executable(["no-such-program-memprof"])
    plain = tmp_path / "data.txt"
    plain.write_text("not a program")
    plain.chmod(0o644)
    with pytest.raises(TargetError, match="cannot execute"):
        resolve_executable([str(plain)])
    with pytest.raises(TargetError, match="cannot execute"):
        resolve_executable([str(tmp_path)])


def test_capabilities_are_read_from_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text(f"Name:\tx\nCapEff:\t{(1 << CAP_BPF) | (1 << CAP_PERFMON):016x}\n")
    caps = effective_capabilities(str(status))
    assert caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1


def test_skipped_frees_map_to_layers():
    meta = RecordingMeta(sources={"kmem": SourceStats(missed={"kfree": 3, "kmem_cache_free": 4, "mm_page_free": 5, "kmalloc": 9})})
    assert skipped_frees_by_layer(meta) == {"kernel_slab": 7, "kernel_page": 5}


@pytest.mark.parametrize("text,expected", [("512MiB", 512 << 20), ("2GB", 2_000_000_000), ("10", 10), ("1.5KiB", 1536)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text,expected", [("500ms", 0.5), ("60", 60.0), ("2m", 120.0), ("1.5s", 1.5)])
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["abc", "5 parsecs", "", "-1s"])
def test_bad_durations_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_duration(bad)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(-(3 << 20)) == "-3.0 MiB"


@pytest.fixture
def driver_loaded(monkeypatch):
    """Whether this host is taken to have an NVIDIA driver loaded: set by the test."""
    from memprof import nvidia_driver
    answer = {"loaded": True}
    monkeypatch.setattr(nvidia_driver, "present", lambda: answer["loaded"])
    return answer


@pytest.mark.parametrize("text,expected", [
    ("kmem,torch,cuda", ("kmem", "torch", "cuda")),
    ("+native", ("kmem", "torch", "cuda", "native")),
    ("kmem,+native", ("kmem", "native")),
    ("cuda", ("cuda",)),
])
def test_sources_option(text, expected, driver_loaded):
    from cli.record import _sources
    assert _sources(None, None, text) == (expected, {})


NO_DRIVER = ("no NVIDIA driver (none of /proc/driver/nvidia, /dev/nvidiactl, /dev/dxg exists); "
             "--sources +cuda probes libcuda all the same")


@pytest.mark.parametrize("text,expected,left_out", [
    ("kmem,torch,cuda", ("kmem", "torch", "cuda"), {}),  # named: kept
    ("+cuda", ("kmem", "torch", "cuda"), {}),
    ("cuda,+native", ("cuda", "native"), {}),
    ("kmem,torch", ("kmem", "torch"), {}),  # not asked for: nothing left out
    ("+native", ("kmem", "torch", "native"), {"cuda": NO_DRIVER}),  # the defaults' cuda
    ("kmem,torch,cuda,native", ("kmem", "torch", "cuda", "native"), {}),
])
def test_without_a_driver_the_defaults_leave_cuda_out(text, expected, left_out, driver_loaded):
    """Where no NVIDIA driver is loaded, cuda is left out of the defaults (its programs were
    ~0.1 s of a first run's compile, and no CUDA call can allocate), with why; a user who
    names it keeps it (the tests' stand-in libcuda is such a case)."""
    from cli.record import _sources
    driver_loaded["loaded"] = False
    assert _sources(None, None, text) == (expected, left_out)


@pytest.mark.parametrize("loaded,expected,left_out", [
    (True, ("kmem", "torch", "cuda"), {}),
    (False, ("kmem", "torch"), {"cuda": NO_DRIVER}),
])
def test_without_the_option_the_defaults_are_taken_for_this_host(loaded, expected, left_out, driver_loaded):
    """Without --sources click passes None (its default), not the defaults' list, which
    would name cuda and so keep it."""
    from cli.record import _sources
    driver_loaded["loaded"] = loaded
    assert _sources(None, None, None) == (expected, left_out)


@pytest.mark.parametrize("bad", ["", ",", "+", "bogus", "kmem,+gpu"])
def test_bad_sources_are_usage_errors(bad):
    import click
    from cli.record import _sources
    with pytest.raises(click.BadParameter):
        _sources(None, None, bad)

"""Ring-buffer records → events-table columns (MemoryDecoder.decode), no kernel needed.
Category and nullable columns are Arrow arrays (decode.py: the recorder imports no pandas)."""
import numpy as np

from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.decode import MemoryDecoder


class _Interner:
    """Stands in for StackInterner: stack id = kernel stack id + 100 (ids are checked below)."""

    def intern(self, kstack, ustack, pid, call_site, py_stack=None):
        return kstack.astype(np.int64) + 100


def _records(*rows):
    recs = np.zeros(len(rows), dtype=R.EVENT_DTYPE)
    for i, row in enumerate(rows):
        for name, value in row.items():
            recs[i][name] = value
    return recs


def _decode(recs, native_sample_bytes=0):
    return MemoryDecoder(_Interner().intern, native_sample_bytes).decode(recs).columns


CUDA, NATIVE, SLAB = R.LAYER_CODES.index("cuda_driver"), R.LAYER_CODES.index("native_heap"), R.LAYER_CODES.index("kernel_slab")


def test_layers_actions_devices_and_sizes():
    cols = _decode(_records(
        dict(ts_ns=1, kind=R.SLAB_ALLOC, layer=SLAB, addr=0x10, size=64, requested=50, kstack_id=1, pid=7, tid=8),
        dict(ts_ns=2, kind=R.SLAB_FREE, layer=SLAB, addr=0x10, pid=9, tid=9),
        dict(ts_ns=3, kind=R.USER_ALLOC, layer=CUDA, addr=0x7f0000000000, size=5 << 32, kstack_id=2),
        dict(ts_ns=4, kind=R.USER_ALLOC, layer=CUDA, flags=R.FLAG_HOST, addr=0x20, size=4096, kstack_id=3),
        dict(ts_ns=5, kind=R.EXIT_MARK, pid=7, requested=0),
    ))
    assert cols["layer"].to_pylist() == \
        ["kernel_slab", "kernel_slab", "cuda_driver", "cuda_driver", None]  # a mark has no layer
    assert cols["action"].to_pylist() == ["alloc", "free", "alloc", "alloc", "mark"]
    assert cols["device"].to_pylist() == ["cpu", "cpu", "cuda", "cpu", "cpu"]  # pinned host memory is cpu
    assert cols["size_bytes"].to_pylist() == [64, None, 5 << 32, 4096, None]
    assert cols["requested_bytes"].to_pylist() == [50, None, 5 << 32, 4096, None]
    assert cols["stack_id"].to_pylist() == [101, None, 102, 103, None]
    assert cols["category"].to_pylist() == [None, None, None, None, "exit"]
    assert cols["pid"].tolist()[:2] == [7, 9]


def test_sampled_native_allocations_carry_their_weight():
    cols = _decode(_records(
        dict(ts_ns=1, kind=R.USER_ALLOC, layer=NATIVE, addr=0x10, size=1024),
        dict(ts_ns=2, kind=R.USER_ALLOC, layer=NATIVE, addr=0x20, size=1 << 20),
        dict(ts_ns=3, kind=R.USER_FREE, layer=NATIVE, addr=0x10),
    ), native_sample_bytes=8192)
    weight = cols["weight"]
    assert weight[0] == 8.0 and weight[1] == 1.0 and np.isnan(weight[2])


def test_sampled_kernel_allocations_carry_their_weight_and_the_libc_heap_keeps_its_own():
    """record --kernel-sample-bytes 16384: a 256-byte slab object stands for 64, a 4 KiB page
    for 4, a 64 KiB page for itself; frees weigh nothing; the libc heap, sampled apart, is
    weighted by its own N."""
    page = R.LAYER_CODES.index("kernel_page")
    recs = _records(
        dict(ts_ns=1, kind=R.SLAB_ALLOC, layer=SLAB, addr=0x10, size=256, kstack_id=1),
        dict(ts_ns=2, kind=R.PAGE_ALLOC, layer=page, addr=0x20, size=4096, kstack_id=1),
        dict(ts_ns=3, kind=R.PAGE_ALLOC, layer=page, addr=0x30, size=65536, kstack_id=1),
        dict(ts_ns=4, kind=R.SLAB_FREE, layer=SLAB, addr=0x10),
        dict(ts_ns=5, kind=R.USER_ALLOC, layer=NATIVE, addr=0x40, size=1024),
    )
    weight = MemoryDecoder(_Interner().intern, 8192, kernel_sample_bytes=16384).decode(recs).columns["weight"]
    assert weight[:3].tolist() == [64.0, 4.0, 1.0] and np.isnan(weight[3]) and weight[4] == 8.0
    unsampled = _decode(recs)["weight"]
    assert np.isnan(unsampled).all()  # null: each allocation counts once


def test_lifecycle_records_are_not_events_but_an_exec_is_a_mark():
    cols = _decode(_records(dict(ts_ns=1, kind=R.PROC_FORK, pid=5, tid=4), dict(ts_ns=2, kind=R.MAP_EXEC, pid=5),
                            dict(ts_ns=3, kind=R.PROC_EXIT, pid=5), dict(ts_ns=4, kind=R.PROC_EXEC, pid=6, tid=6)))
    # The exec ends the old image's user-space allocations (lifetimes.py): it is on the timeline.
    assert cols["ts_ns"].tolist() == [4] and cols["action"].to_pylist() == ["mark"]
    assert cols["category"].to_pylist() == ["exec"] and cols["pid"].tolist() == [6]
    assert cols["layer"].to_pylist() == [None]
    assert cols["size_bytes"].to_pylist() == [None] and cols["stack_id"].to_pylist() == [None]


def test_category_columns_come_in_the_schemas_own_types():
    """The writer stores an Arrow column of the schema's exact type as it is; any other type
    is cast, and Array.cast imports pyarrow.compute (0.1 s of the first poll)."""
    from memprof.recording.writer import TABLES
    cols = _decode(_records(dict(ts_ns=1, kind=R.SLAB_ALLOC, layer=SLAB, addr=0x10, size=64, kstack_id=1),
                            dict(ts_ns=5, kind=R.EXIT_MARK, pid=7)))
    schema = TABLES["events"]
    dictionaries = [field for field in schema if str(field.type).startswith("dictionary")]
    assert {field.name for field in dictionaries} == {"layer", "action", "device", "category"}
    for field in dictionaries:
        assert cols[field.name].type == field.type, field.name

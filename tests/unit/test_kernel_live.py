"""KernelLiveAddresses: which kernel allocations the target still holds, so that the teardown
waits for their frees and not for other processes' frees of addresses it once had. Batches
come from the real decoder (sources/ebpf/decode.py), as the session feeds them."""
from __future__ import annotations

import numpy as np

from memprof.capture.kernel_live import KernelLiveAddresses
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.decode import MemoryDecoder

SLAB, PAGE, TORCH = (R.LAYER_CODES.index(name) for name in ("kernel_slab", "kernel_page", "torch_cpu"))
BASE = 0xFFFF_8880_0000_0000


def _batch(decoder: MemoryDecoder, *rows) -> dict:
    recs = np.zeros(len(rows), dtype=R.EVENT_DTYPE)
    for i, row in enumerate(rows):
        for name, value in row.items():
            recs[i][name] = value
    return decoder.decode(recs).columns


def _decoder() -> MemoryDecoder:
    return MemoryDecoder(lambda kstack, ustack, pid, call_site, py_stack=None: kstack.astype(np.int64))


def _alloc(ts, addr, layer=SLAB):
    return dict(ts_ns=ts, kind=R.PAGE_ALLOC if layer == PAGE else R.SLAB_ALLOC, layer=layer, addr=addr, size=64)


def _free(ts, addr, layer=SLAB):
    return dict(ts_ns=ts, kind=R.PAGE_FREE if layer == PAGE else R.SLAB_FREE, layer=layer, addr=addr)


def test_frees_of_held_allocations_count_and_frees_of_released_or_unknown_addresses_do_not():
    decoder, live = _decoder(), KernelLiveAddresses()
    live.update(_batch(decoder, _alloc(1, BASE + 0x40), _alloc(2, BASE + 0x80), _alloc(3, BASE + 0xc0),
                       _free(4, BASE + 0x80)))
    # After the exit: 0x40 held (counts), 0x80 freed before (another process's reuse),
    # 0x100 never the target's, 0xc0 held (counts).
    late = _batch(decoder, _free(10, BASE + 0x40), _free(11, BASE + 0x80), _free(12, BASE + 0x100),
                  _free(13, BASE + 0xc0))
    assert live.frees_of_held(late) == 2
    live.update(late)
    assert live.held().size == 0
    assert live.frees_of_held(_batch(decoder, _free(20, BASE + 0x40))) == 0  # freed once already


def test_order_within_a_batch_is_by_time_not_by_position():
    decoder, live = _decoder(), KernelLiveAddresses()
    # One CPU's events come before another's in a batch: the free (ts 5) happened after the
    # allocation (ts 2) it follows in the batch, so the address is not held.
    live.update(_batch(decoder, _free(5, BASE + 0x40), _alloc(2, BASE + 0x40)))
    assert live.held().size == 0
    live.update(_batch(decoder, _free(7, BASE + 0x80), _alloc(9, BASE + 0x80)))
    assert live.held().size == 1


def test_a_page_and_a_slab_object_are_apart_and_user_space_rows_are_ignored():
    decoder, live = _decoder(), KernelLiveAddresses()
    live.update(_batch(decoder, _alloc(1, BASE + 0x1000, SLAB), _alloc(2, BASE + 0x1000, PAGE),
                       dict(ts_ns=3, kind=R.USER_ALLOC, layer=TORCH, addr=0x7F00_0000_1000, size=64),
                       dict(ts_ns=4, kind=R.EXIT_MARK, pid=7)))
    assert live.held().size == 2
    assert live.frees_of_held(_batch(decoder, _free(5, BASE + 0x1000, PAGE))) == 1
    assert live.frees_of_held(_batch(decoder, dict(ts_ns=6, kind=R.USER_FREE, layer=TORCH, addr=0x7F00_0000_1000))) == 0


def test_folding_keeps_the_answer():
    decoder = _decoder()
    folded, whole = KernelLiveAddresses(compact_at=3), KernelLiveAddresses(compact_at=1 << 30)
    rng = np.random.default_rng(5)
    held = set()
    for step in range(200):
        addr = BASE + 0x40 * int(rng.integers(0, 30))
        row = _free(step, addr) if addr in held else _alloc(step, addr)
        held ^= {addr}
        batch = _batch(decoder, row)
        folded.update(batch)
        whole.update(batch)
    assert whole._keys and not folded._unfolded >= 3  # one folded as it went, the other not yet
    assert folded.held().tolist() == whole.held().tolist()
    assert folded.held().size == len(held)

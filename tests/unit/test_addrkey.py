"""Kernel addresses keyed per recording (memprof/sources/ebpf/addrkey.py, issue 19 item 6): a
bijection that hides the layout, applied to the kernel rows only, and the analysis gives
exactly the answers it gives on the raw addresses."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pandas as pd
import pytest

from memprof.analysis.lifetimes import pair_lifetimes
from memprof.capture.livebytes import LiveBytes
from memprof.sources.ebpf import addrkey as A
from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.addrkey import AddressKey
from memprof.sources.ebpf.decode import MemoryDecoder
from tests.factories import typed_events

U64 = 0xFFFF_FFFF_FFFF_FFFF
DIRECT_MAP = 0xFFFF_8880_0000_0000  # where slab objects lie (x86-64, without KASLR's offset)
VMEMMAP = 0xFFFF_EA00_0000_0000     # where the struct pages lie
KERNEL_FLOOR = 0xFFFF_8000_0000_0000
SLAB, PAGE = R.LAYER_CODES.index("kernel_slab"), R.LAYER_CODES.index("kernel_page")
NATIVE = R.LAYER_CODES.index("native_heap")


def invert(key: AddressKey, images: np.ndarray) -> np.ndarray:
    """The inverse permutation, step by step from the last (only a test holds the words)."""
    xors, muls, final = key.words()
    x = images.astype(np.uint64) ^ np.uint64(final) ^ A._TOP
    top, x = x & A._TOP, x & A._BELOW_TOP
    for xor, mul, shift, mask in reversed(list(zip(xors, muls, A._SHIFTS, A._SHIFT_MASKS))):
        y = x.copy()  # undo x ^= (x >> s) & mask: the top bits are as they were; fixed point
        for _ in range(A.WORD_BITS // shift + 1):
            x = y ^ ((x >> np.uint64(shift)) & mask)
        x = (x * np.uint64(pow(mul, -1, 1 << A.WORD_BITS))) & A._BELOW_TOP
        x ^= np.uint64(xor)
    return x | top


def kernel_like(n: int, seed: int = 0) -> np.ndarray:
    """`n` distinct addresses as the kmem probes see them: slab objects of many sizes in the
    direct map, struct pages 64 bytes apart in vmemmap, and some runs of neighbours."""
    rng = np.random.default_rng(seed)
    slab = DIRECT_MAP + rng.integers(0, 1 << 34, n // 2, dtype=np.uint64) * np.uint64(8)
    pages = VMEMMAP + rng.integers(0, 1 << 26, n // 4, dtype=np.uint64) * np.uint64(64)
    runs = DIRECT_MAP + np.uint64(0x1234_5000) + np.arange(n - n // 2 - n // 4, dtype=np.uint64) * np.uint64(64)
    return np.unique(np.concatenate([slab, pages, runs]).astype(np.uint64))


# ---- the permutation ----

def test_it_is_a_bijection_inverted_exactly():
    key = AddressKey.generate()
    addrs = np.concatenate([kernel_like(200_000), np.array([0, 1, 7, 8, U64, U64 - 7, KERNEL_FLOOR], dtype=np.uint64),
                            np.random.default_rng(1).integers(0, U64, 100_000, dtype=np.uint64, endpoint=True)])
    images = key.apply(addrs)
    assert np.array_equal(invert(key, images), addrs)  # one-to-one: every image gives its address back
    assert np.unique(images).size == np.unique(addrs).size


def test_the_low_three_bits_pass_through_and_the_top_byte_is_flipped():
    key = AddressKey.generate()
    addrs = np.random.default_rng(2).integers(0, U64, 50_000, dtype=np.uint64, endpoint=True)
    images = key.apply(addrs)
    assert np.array_equal(images & np.uint64(7), addrs & np.uint64(7))
    assert np.array_equal(images >> np.uint64(56), (addrs >> np.uint64(56)) ^ np.uint64(0xFF))
    assert not (key.apply(kernel_like(10_000)) & np.uint64(7)).any()  # 8-aligned in, 8-aligned out


def test_images_show_no_kernel_layout():
    """No image looks like a kernel address (all are below 2^56), and what a layout would
    show is gone: struct pages 64 bytes apart are not 64 apart (or any
    one distance), objects of one region do not share their high bits, and it is not an xor
    with one key (image ^ address differs from one address to the next)."""
    key = AddressKey.generate()
    addrs = kernel_like(400_000)
    images = key.apply(addrs)
    assert (images < np.uint64(1 << 56)).all() and (addrs >= np.uint64(KERNEL_FLOOR)).all()
    neighbours = VMEMMAP + np.arange(10_000, dtype=np.uint64) * np.uint64(64)
    steps = np.diff(key.apply(neighbours).astype(np.int64))  # as a two's-complement distance
    assert np.unique(steps).size > 9_900
    assert np.unique(images >> np.uint64(40)).size > 16_000  # the addresses have 3 values of these bits
    assert np.unique(images ^ addrs).size == addrs.size


def test_one_flipped_bit_flips_about_half_of_the_others():
    """Avalanche: flipping one address bit among the 53 mixed ones (3..55) changes each
    image in about 26 of them, whichever bit it is (an xor would change exactly 1); a bit
    of the top byte (0xff in every kernel address) flips itself only."""
    key = AddressKey.generate()
    addrs = kernel_like(20_000)
    for bit in range(3, 64):
        flipped = key.apply(addrs) ^ key.apply(addrs ^ np.uint64(1 << bit))
        changed = np.unpackbits(flipped.view(np.uint8)).reshape(-1, 64).sum(axis=1)
        if bit >= 56:
            assert (flipped == np.uint64(1 << bit)).all()
            continue
        assert 23 <= changed.mean() <= 30, (bit, changed.mean())
        assert changed.min() >= 4, (bit, changed.min())
        reached = int(np.bitwise_or.reduce(flipped))
        assert reached == A._MIXED, (bit, f"{reached:#x}")  # every mixed bit depends on it


def test_each_recording_draws_its_own_key():
    addrs = kernel_like(1_000)
    a, b = AddressKey.generate(), AddressKey.generate()
    assert np.array_equal(a.apply(addrs), a.apply(addrs))  # stable within a recording
    assert not np.isin(a.apply(addrs), b.apply(addrs)).any()  # unrelated across recordings


def test_the_key_does_not_leave_the_object():
    key = AddressKey.generate()
    words = [w for group in key.words()[:2] for w in group] + [key.words()[2]]
    assert repr(key) == str(key) == "AddressKey(<secret>)"
    assert not any(f"{w:x}" in repr(key) or str(w) in repr(key) for w in words)
    for leak in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="never pickled"):
            leak(key)


def test_words_that_would_touch_the_low_bits_are_refused():
    good = dict(xors=(8, 16, 24, 32), multipliers=(9, 17, 25, 33), final=40)
    AddressKey(**good)
    for bad in (dict(good, xors=(1, 16, 24, 32)), dict(good, multipliers=(3, 17, 25, 33)),
                dict(good, final=4), dict(good, xors=(8, 16)), dict(good, final=1 << 60),
                dict(good, multipliers=(9 + (1 << 56), 17, 25, 33))):
        with pytest.raises(ValueError):
            AddressKey(**bad)


def test_shapes_and_types():
    key = AddressKey.generate()
    assert key.apply(np.array([], dtype=np.uint64)).size == 0
    grid = kernel_like(64)[:60].reshape(6, 10)
    out = key.apply(grid)
    assert out.shape == (6, 10) and out.dtype == np.uint64
    assert np.array_equal(out.reshape(-1), key.apply(grid.reshape(-1)))
    big = kernel_like(3 * A._CHUNK + 5)  # chunk edges: the same images as one at a time
    assert np.array_equal(key.apply(big)[A._CHUNK - 2:A._CHUNK + 2],
                          np.concatenate([key.apply(big[A._CHUNK - 2:A._CHUNK]), key.apply(big[A._CHUNK:A._CHUNK + 2])]))


# ---- the decode path ----

def _records(*rows) -> np.ndarray:
    recs = np.zeros(len(rows), dtype=R.EVENT_DTYPE)
    for i, row in enumerate(rows):
        for name, value in row.items():
            recs[i][name] = value
    return recs


class _Interner:
    def intern(self, kstack, ustack, pid, call_site, py_stack=None):
        return kstack.astype(np.int64) + 100


def _source() -> MemoryDecoder:
    return MemoryDecoder(_Interner().intern)


def test_kernel_rows_are_keyed_user_rows_and_marks_are_not():
    slab, page, heap = DIRECT_MAP + 0x1c40, VMEMMAP + 0x4_0040, 0x7F12_3456_7890
    recs = _records(
        dict(ts_ns=1, kind=R.SLAB_ALLOC, layer=SLAB, addr=slab, size=64),
        dict(ts_ns=2, kind=R.PAGE_ALLOC, layer=PAGE, addr=page, size=4096),
        dict(ts_ns=3, kind=R.USER_ALLOC, layer=NATIVE, addr=heap, size=32),
        dict(ts_ns=4, kind=R.USER_FREE, layer=NATIVE, addr=heap),
        dict(ts_ns=5, kind=R.PAGE_FREE, layer=PAGE, addr=page),
        dict(ts_ns=6, kind=R.SLAB_FREE, layer=SLAB, addr=slab),
        dict(ts_ns=7, kind=R.EXIT_MARK, pid=7),
    )
    source = _source()
    addr = source.decode(recs).columns["addr"]
    expected = source.address_key.apply(np.array([slab, page], dtype=np.uint64))
    assert addr.dtype == np.uint64
    assert addr.tolist() == [expected[0], expected[1], heap, heap, expected[1], expected[0], 0]
    assert (addr[[0, 1, 4, 5]] < np.uint64(1 << 56)).all()
    assert recs["addr"].tolist()[:2] == [slab, page]  # the ring's records are not written to


def test_an_address_keeps_its_image_from_one_poll_to_the_next_not_across_recordings():
    slab = DIRECT_MAP + 0x2000
    alloc = _records(dict(ts_ns=1, kind=R.SLAB_ALLOC, layer=SLAB, addr=slab, size=64))
    free = _records(dict(ts_ns=2, kind=R.SLAB_FREE, layer=SLAB, addr=slab),
                    dict(ts_ns=3, kind=R.USER_ALLOC, layer=NATIVE, addr=0x5000, size=8))  # a mixed batch
    one, other = _source(), _source()
    first = one.decode(alloc).columns["addr"][0]
    assert one.decode(free).columns["addr"][0] == first != slab
    assert other.decode(alloc).columns["addr"][0] != first


def _kernel_workload(seed: int = 3) -> np.ndarray:
    """Records of a kernel-heavy run with every case pairing knows: objects reused after
    their free, a free never seen (the address comes back while live), frees of objects
    allocated before the recording, page allocations and frees, user-space rows between,
    and objects still live at the end."""
    rng = np.random.default_rng(seed)
    pool = kernel_like(3_000, seed)
    rows = []
    live: dict[int, int] = {}
    for ts in range(1, 40_001):
        a = int(pool[rng.integers(pool.size)])
        is_page = a >= VMEMMAP
        kinds = (R.PAGE_ALLOC, R.PAGE_FREE) if is_page else (R.SLAB_ALLOC, R.SLAB_FREE)
        layer = PAGE if is_page else SLAB
        if a in live and rng.random() < 0.97:  # a few frees go unseen: "missed"
            rows.append((ts, kinds[1], layer, a, 0))
            del live[a]
        elif a not in live and rng.random() < 0.02:  # allocated before the recording
            rows.append((ts, kinds[1], layer, a, 0))
        else:
            live[a] = ts
            rows.append((ts, kinds[0], layer, a, 4096 if is_page else 64))
        if ts % 7 == 0:
            rows.append((ts, R.USER_ALLOC, NATIVE, 0x7F00_0000_0000 + 16 * (ts % 50), 16))
    recs = np.zeros(len(rows), dtype=R.EVENT_DTYPE)
    for name, values in zip(("ts_ns", "kind", "layer", "addr", "size"), zip(*rows)):
        recs[name] = values
    recs["pid"] = recs["tid"] = 42
    return recs


def _frame(columns: dict) -> pd.DataFrame:
    """The decoded columns as a reader would give them back."""
    as_list = lambda c: c.to_pylist()  # noqa: E731  (the decoder's Arrow columns)
    return typed_events({"ts_ns": columns["ts_ns"], "layer": as_list(columns["layer"]),
                         "action": as_list(columns["action"]), "addr": columns["addr"],
                         "size_bytes": as_list(columns["size_bytes"]), "pid": columns["pid"], "tid": columns["tid"]})


def test_pairing_gives_exactly_the_answers_of_the_raw_addresses():
    recs = _kernel_workload()
    keyed = _frame(_source().decode(recs).columns)
    raw = keyed.assign(addr=recs["addr"])
    assert not np.array_equal(keyed["addr"], raw["addr"])
    a, b = pair_lifetimes(raw), pair_lifetimes(keyed)
    assert a.missed_frees == b.missed_frees and a.unmatched_frees == b.unmatched_frees
    assert a.missed_frees["kernel_slab"] > 0 and a.unmatched_frees["kernel_page"] > 0  # every case is there
    others = [c for c in a.allocations.columns if c != "addr"]
    pd.testing.assert_frame_equal(a.allocations[others], b.allocations[others])
    assert (a.allocations["end_kind"] == "live").sum() > 100


def test_the_status_lines_live_bytes_stay_exact():
    """LiveBytes packs the layer code into an address's low bits (memprof/capture/livebytes.py):
    the keyed addresses keep them 0, so its per-layer sums are those of the raw addresses."""
    recs = _kernel_workload()
    source = _source()
    keyed, raw = LiveBytes(), LiveBytes()
    for batch in np.array_split(recs, 9):
        columns = source.decode(batch).columns
        keyed.update(columns)
        raw.update({**columns, "addr": batch["addr"]})
    assert dict(keyed.bytes_by_layer) == dict(raw.bytes_by_layer)
    assert keyed.bytes_by_layer["kernel_slab"] > 0 and keyed.bytes_by_layer["kernel_page"] > 0

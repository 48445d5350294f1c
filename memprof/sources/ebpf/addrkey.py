"""Kernel addresses keyed per recording, as the kernel's `%pK` hides them.

The kmem probes see raw kernel addresses: slab objects (direct-map addresses) and
`struct page` pointers (vmemmap addresses). Written as they are, a recording the invoking
user can read would tell them where the kernel's memory lies, which KASLR keeps from
them (issue 19, item 6). Analysis needs only the *identity* of an address: pairing an
alloc with its free, and seeing an address handed out again while still live
(memprof/analysis/lifetimes.py). So every kernel address is replaced, before anything
reaches the writer, by its image under a keyed permutation of uint64 drawn afresh for
each recording and never saved:

- a bijection: two addresses never share an image, so pairing stays exact, not merely
  likely;
- the low 3 bits pass through unchanged. Kernel objects are at least 8-aligned (slab
  objects: ARCH_SLAB_MINALIGN; struct page: 64 bytes), so those bits are 0 and say
  nothing; keeping them keeps the recorder's status line exact, which packs the layer
  code into them (memprof/capture/livebytes.py);
- the top byte is flipped, not mixed. It is 0xff in every kernel address (x86-64 with 4-
  or 5-level paging, arm64), so it says nothing either, and flipped to 0 it makes every
  image < 2^56: no image of a kernel address looks like one (a check for kernel pointers
  in a recording finds none, by construction, not by chance);
- the 53 bits between (3..55) are mixed through ROUNDS rounds of (xor a key word,
  multiply by an odd key word mod 2^56, xorshift right), then xored with a last key word.
  Multiplying carries low bits up, the shift carries high bits down: after three rounds
  every input bit reaches every output bit (measured: after two, all but one), so neighbours (adjacent struct pages 64 bytes
  apart, objects of one slab) land far apart, and differences, offsets within a page and
  the region an address lies in are gone. Unlike an xor with one key, one known (address,
  image) pair does not reveal the key: it holds 9 random words (~480 bits).

It is not a vetted block cipher. The reader of a recording knows no kernel address to
start from (that is what KASLR hides); what must not leak is the layout, and the images
carry none. Cost: 24 vectorised passes over a column, a cache-sized chunk at a time
(bench/RESULTS.md, "Kernel addresses keyed per recording").
"""
from __future__ import annotations

import secrets

from memprof.lazy_import import numpy as np

ROUNDS = 4
# Right shifts of the rounds: near half of the 56-bit word, so that each round's shift
# carries the upper half into the lower; distinct, so the rounds do not repeat one pattern.
_SHIFTS = (27, 29, 25, 28)
assert len(_SHIFTS) == ROUNDS
ALIGN_BITS = 3   # low bits kept as they are (0 in every kernel address: 8-aligned)
WORD_BITS = 56   # bits below the top byte, which is flipped (0xff in every kernel address)
_LOW = (1 << ALIGN_BITS) - 1
_MIXED = (1 << WORD_BITS) - 1 - _LOW                 # bits 3..55: the ones mixed
# Plain ints, made numpy's uint64 at each pass: importing this module imports no numpy
# (memprof/lazy_import.py).
_TOP = 0xFFFF_FFFF_FFFF_FFFF ^ ((1 << WORD_BITS) - 1)
_BELOW_TOP = (1 << WORD_BITS) - 1
# The bits each round's shifted copy may flip: those whose source (bit + shift) is below
# the top byte and that are not kept. Then a round reads bits 0..55 only and the top byte,
# which the multiplication dirties, never flows down: bits 0..55 of the image depend on
# bits 0..55 of the address alone, and the round stays invertible (top down).
_SHIFT_MASKS = tuple(((1 << (WORD_BITS - s)) - 1) & ~_LOW for s in _SHIFTS)
_CHUNK = 1 << 15  # addresses per pass: 256 KiB, within L2


class AddressKey:
    """A secret keyed permutation of uint64 addresses, for one recording.

    `apply(addrs)` returns the images of a uint64 array (a new array, same shape). The key
    lives in this object only: it has no repr of its words and refuses to be pickled, so it
    cannot reach meta.json, a log or another process by accident."""

    __slots__ = ("_xors", "_multipliers", "_final")

    def __init__(self, xors: tuple[int, ...], multipliers: tuple[int, ...], final: int):
        """Key words as given (tests use fixed ones); `generate()` draws them."""
        if len(xors) != ROUNDS or len(multipliers) != ROUNDS:
            raise ValueError(f"an address key has {ROUNDS} xor and {ROUNDS} multiplier words")
        # Xor words lie in the mixed bits only; multipliers are < 2^56 and ≡ 1 mod 8, so odd
        # (invertible mod 2^56) and x·m ≡ x mod 8 (the low bits stay as they are).
        if any(w & ~_MIXED for w in (*xors, final)) or any(m & ~(_MIXED | 1) or m & _LOW != 1 for m in multipliers):
            raise ValueError("key words must leave the low bits and the top byte of an address as they are")
        self._xors = tuple(xors)
        self._multipliers = tuple(multipliers)
        self._final = final

    @classmethod
    def generate(cls) -> "AddressKey":
        """A fresh key from the system's CSPRNG (secrets)."""
        def word() -> int:
            return secrets.randbits(64) & _MIXED
        return cls(tuple(word() for _ in range(ROUNDS)), tuple(word() | 1 for _ in range(ROUNDS)), word())

    def apply(self, addrs: np.ndarray) -> np.ndarray:
        """Images of `addrs` (any integer array, read as uint64), as a new uint64 array of the
        same shape. A kernel address (top byte 0xff) has an image below 2^56."""
        x = np.array(addrs, dtype=np.uint64, copy=True).reshape(-1)
        scratch = np.empty((2, min(x.size, _CHUNK)), dtype=np.uint64)
        # In-place passes a cache-sized chunk at a time: over a whole 10^7-row column each
        # pass would stream 160 MB through memory (16 ns an address here, against 6 ns so).
        for start in range(0, x.size, _CHUNK):
            self._mix(x[start:start + _CHUNK], scratch[:, :min(_CHUNK, x.size - start)])
        return x.reshape(np.shape(addrs))

    def _mix(self, x: np.ndarray, scratch: np.ndarray) -> None:
        """Apply the permutation to `x` in place (`scratch`: two rows as long as `x`)."""
        u64 = np.uint64
        top, shifted = scratch
        np.bitwise_and(x, u64(_TOP), out=top)
        for xor, mul, shift, mask in zip(self._xors, self._multipliers, _SHIFTS, _SHIFT_MASKS):
            x ^= u64(xor)
            x *= u64(mul)  # wraps mod 2^64; bits 0..55 are the product mod 2^56, the one we mean
            np.right_shift(x, u64(shift), out=shifted)
            shifted &= u64(mask)
            x ^= shifted
        x &= u64(_BELOW_TOP)
        x |= top
        x ^= u64(self._final | _TOP)  # the last key word, and the top byte flipped

    def words(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The key words (xors, multipliers, final), for tests that invert `apply`. Never
        write them anywhere: with them, every image gives its address back."""
        return self._xors, self._multipliers, self._final

    def __repr__(self) -> str:
        return "AddressKey(<secret>)"

    def __reduce__(self):
        raise TypeError("an AddressKey is never pickled: it must not leave the recorder's memory")

"""Seeded bijections over integer ranges, computed per element instead of stored.

The plan never materializes a permutation of samples. Wherever it needs "a random order of
``n`` things" it evaluates :func:`permute` at the indices it needs: a 4-round Feistel network
over the smallest even-width bit domain that holds ``n``, with cycle walking to stay inside
``[0, n)``. That is a true bijection for every key, costs O(1) memory, and O(1) time per
element (the domain is < 4n, so the expected number of walks is < 4 and in practice ~1.5).

Everything here is plain 64-bit integer arithmetic (splitmix64 finalizers), so the result
is identical on every machine and every numpy version: unlike ``numpy.random.Generator``,
whose streams numpy does not promise to keep stable across releases.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_ROUNDS = 4

U64 = NDArray[np.uint64]
I64 = NDArray[np.int64]


def mix64(x: int) -> int:
    """The splitmix64 finalizer on one Python int (a good 64-bit avalanche hash)."""
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * _C1) & _M64
    z = ((z ^ (z >> 27)) * _C2) & _M64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """A 64-bit key from a tuple of non-negative ints, e.g. ``derive_key(seed, epoch, TAG)``.

    Order matters and every part changes the result, so distinct uses of the same seed get
    unrelated streams as long as they pass distinct tags.
    """
    h = 0x243F6A8885A308D3
    for part in parts:
        h = mix64(h ^ (part & _M64))
    return h


def mix64_array(x: U64) -> U64:
    """Vectorized splitmix64 finalizer; wraps modulo 2**64 like the scalar version."""
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
    out: U64 = z ^ (z >> np.uint64(31))
    return out


def keys_for(base: int, *parts: ArrayLike) -> U64:
    """Per-element keys: ``base`` folded with each integer array in ``parts`` (broadcast)."""
    h = np.asarray(np.uint64(base))
    for part in parts:
        h = mix64_array(h ^ np.asarray(part).astype(np.uint64))
    return np.asarray(h, dtype=np.uint64)


def _half_bits(n: U64) -> U64:
    """Half the width of the smallest even bit domain holding ``[0, n)`` (at least 1 bit)."""
    nm1 = np.maximum(n, np.uint64(2)) - np.uint64(1)
    # float log2 is exact enough to land within one bit; fix it up with integer checks.
    bits = np.floor(np.log2(nm1.astype(np.float64))).astype(np.uint64) + np.uint64(1)
    too_small = (np.uint64(1) << bits) <= nm1
    bits = bits + too_small.astype(np.uint64)
    too_big = (bits > 1) & ((np.uint64(1) << (bits - np.uint64(1))) > nm1)
    bits = bits - too_big.astype(np.uint64)
    out: U64 = (bits + np.uint64(1)) >> np.uint64(1)
    return out


def _feistel(x: U64, half: U64, key: U64) -> U64:
    mask = (np.uint64(1) << half) - np.uint64(1)
    left = x >> half
    right = x & mask
    for i in range(_ROUNDS):
        round_key = key + np.uint64((i + 1) * _GOLDEN & _M64)
        left, right = right, left ^ (mix64_array(right ^ round_key) & mask)
    out: U64 = (left << half) | right
    return out


def permute(x: ArrayLike, n: ArrayLike, key: ArrayLike) -> I64:
    """Evaluate a seeded bijection of ``[0, n)`` at each ``x`` (vectorized, broadcasting).

    ``n`` and ``key`` may be scalars or arrays shaped like ``x`` (one domain/key per
    element). For a fixed ``(n, key)`` the map ``x -> permute(x, n, key)`` is a
    permutation of ``range(n)``.

    >>> sorted(permute(np.arange(10), 10, 7).tolist()) == list(range(10))
    True
    """
    xs = np.asarray(x, dtype=np.int64).astype(np.uint64)
    ns = np.broadcast_to(np.asarray(n, dtype=np.int64).astype(np.uint64), xs.shape)
    ks = np.broadcast_to(np.asarray(key, dtype=np.uint64), xs.shape)
    if xs.size == 0:
        return xs.astype(np.int64)
    half = _half_bits(ns)
    y = _feistel(xs, half, ks)
    out = np.where(ns <= 1, xs, y)
    todo = np.flatnonzero(out >= ns)
    # Cycle walking: re-encrypt values that fell outside [0, n) until they land inside.
    while todo.size:
        out[todo] = _feistel(out[todo], half[todo], ks[todo])
        todo = todo[out[todo] >= ns[todo]]
    return out.astype(np.int64)

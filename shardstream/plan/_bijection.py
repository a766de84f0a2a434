"""Seeded bijections over integer ranges, computed per element instead of stored.

The plan never materializes a permutation of samples. Wherever it needs "a random order of
``n`` things" it evaluates :func:`permute` at the indices it needs: a 4-round Feistel network
on the mixed-radix domain ``[0, a) x [0, b)`` with ``a = ceil(sqrt(n))``, ``b = ceil(n / a)``,
with cycle walking to stay inside ``[0, n)``. That is a true bijection for every key, costs
O(1) memory and O(1) time per element (the domain exceeds ``n`` by < ``sqrt(n)``, so a
second pass is rare).

Everything here is plain 64-bit integer arithmetic (splitmix64 finalizers), so the result
is identical on every machine and every numpy version: unlike ``numpy.random.Generator``,
whose streams numpy does not promise to keep stable across releases.
"""

from __future__ import annotations

import math

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
    """Per-element keys: ``base`` folded with each integer array in ``parts`` (broadcast;
    at least 1-D, because numpy warns on wrapping scalar arithmetic but not on arrays)."""
    h = np.full(1, base, dtype=np.uint64)
    for part in parts:
        h = mix64_array(h ^ np.atleast_1d(np.asarray(part)).astype(np.uint64))
    return h


def _isqrt_ceil(n: U64) -> U64:
    """``ceil(sqrt(n))`` elementwise, exact for every uint64 below 2**62."""
    r = np.ceil(np.sqrt(n.astype(np.float64))).astype(np.uint64)
    # The float estimate can be off by one either way near large perfect squares.
    r = r - ((r > 0) & ((r - np.uint64(1)) * (r - np.uint64(1)) >= n)).astype(np.uint64)
    out: U64 = r + (r * r < n).astype(np.uint64)
    return out


def _round(x: U64, key: U64 | np.uint64, radix: U64 | np.uint64) -> U64:
    """A keyed hash of ``x`` reduced to ``[0, radix)`` (radix < 2**32).

    Two multiply-xorshift steps, then Lemire's multiply-shift reduction instead of ``%``:
    integer division is the slowest ufunc numpy has.
    """
    z = (x ^ key) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(29))) * np.uint64(_C2)
    out: U64 = ((z >> np.uint64(32)) * radix) >> np.uint64(32)
    return out


def _feistel(x: U64, a: U64 | np.uint64, b: U64 | np.uint64, key: U64 | np.uint64) -> U64:
    """A 4-round Feistel network on the mixed-radix domain ``[0, a) x [0, b)``.

    Each round adds a keyed hash of one half to the other modulo its radix, which is
    invertible, so the network is a bijection of ``[0, a * b)`` for any ``a`` and ``b``.
    With ``a, b ~ sqrt(n)`` the domain exceeds ``n`` by less than ``sqrt(n)``: cycle walking
    almost never has to run a second pass (unlike a power-of-two domain, up to 4x ``n``).
    """
    left = x // b
    right = x - left * b
    for i in range(_ROUNDS):
        round_key = key + np.uint64((i + 1) * _GOLDEN & _M64)
        if i % 2 == 0:
            left = left + _round(right, round_key, a)
            left = np.where(left >= a, left - a, left)
        else:
            right = right + _round(left, round_key, b)
            right = np.where(right >= b, right - b, right)
    out: U64 = left * b + right
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
    if xs.size == 0:
        return xs.astype(np.int64)
    if np.ndim(n) == 0 and np.ndim(key) == 0:
        # One domain and key for all elements (a batch inside one window): scalar radices,
        # half the numpy calls of the general path.
        n_int = int(n)  # type: ignore[arg-type]
        if n_int <= 1:
            return xs.astype(np.int64)
        a_int = math.isqrt(n_int - 1) + 1
        a0, b0 = np.uint64(a_int), np.uint64(-(-n_int // a_int))
        # A 1-element key array: array arithmetic wraps silently, numpy scalars warn.
        k0 = np.full(1, int(key), dtype=np.uint64)  # type: ignore[arg-type]
        n0 = np.uint64(n_int)
        out = _feistel(xs, a0, b0, k0)
        todo = np.flatnonzero(out >= n0)
        while todo.size:
            out[todo] = _feistel(out[todo], a0, b0, k0)
            todo = todo[out[todo] >= n0]
        return out.astype(np.int64)
    ns = np.broadcast_to(np.asarray(n, dtype=np.int64).astype(np.uint64), xs.shape)
    ks = np.broadcast_to(np.asarray(key, dtype=np.uint64), xs.shape)
    a = np.maximum(_isqrt_ceil(ns), np.uint64(1))
    b = np.maximum((ns + a - np.uint64(1)) // a, np.uint64(1))
    out = _feistel(xs, a, b, ks)
    todo = np.flatnonzero(out >= ns)
    # Cycle walking: re-encrypt values that fell outside [0, n) until they land inside.
    while todo.size:
        out[todo] = _feistel(out[todo], a[todo], b[todo], ks[todo])
        todo = todo[out[todo] >= ns[todo]]
    return out.astype(np.int64)

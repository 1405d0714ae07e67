"""Java behaviour that RocketMQ's bytes depend on: String.hashCode and HashMap iteration order.

`jhash(s)` is Java's `String.hashCode`: h = 31*h + u over the UTF-16 code units of `s`, in
32-bit two's complement. It decides tag codes in the ConsumeQueue, IndexFile slots, and (via
HashMap bucket order) the byte order of a stored properties string.

Speed matters (the dispatcher hashes every key of every record), so instead of a Python loop
per character we evaluate the polynomial with `sum(map(mul, units, powers))`, which runs the
loop in C: h = sum(u[i] * 31^(n-1-i)) mod 2^32. (The reput dispatcher's common case hashes in
C itself: shm/_dispatch.c.)
"""

from __future__ import annotations

import array
from functools import lru_cache
from operator import mul

_MASK32 = 0xFFFFFFFF
_POWERS_LEN = 1 << 16  # covers any properties-sized string; longer strings extend it
_powers_desc: list[int] = []  # _powers_desc[-n:] == [31^(n-1), ..., 31^1, 31^0] mod 2^32


def _powers(n: int) -> list[int]:
    global _powers_desc
    if n > len(_powers_desc):
        size = max(n, _POWERS_LEN)
        ascending = [1] * size
        for i in range(1, size):
            ascending[i] = (ascending[i - 1] * 31) & _MASK32
        ascending.reverse()
        _powers_desc = ascending
    return _powers_desc


def _to_signed32(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


def jhash(s: str) -> int:
    """Java `String.hashCode(s)` as a signed 32-bit int."""
    if not s:
        return 0
    if s.isascii():
        units = s.encode("ascii")
    else:
        units = array.array("H", s.encode("utf-16-le"))
    n = len(units)
    powers = _powers(n)
    return _to_signed32(sum(map(mul, units, powers[len(powers) - n:])) & _MASK32)


@lru_cache(maxsize=4096)
def jhash_cached(s: str) -> int:
    """jhash for strings that repeat (tags, property names): one hash per distinct string."""
    return jhash(s)


def hashmap_bucket_hash(key: str) -> int:
    """HashMap.hash(key): the 32-bit hash with its high half folded into the low half."""
    h = jhash_cached(key) & _MASK32
    return h ^ (h >> 16)


def hashmap_capacity(size: int) -> int:
    """Table capacity of a default HashMap (16, load factor 0.75) after `size` puts."""
    capacity = 16
    while size > capacity * 3 // 4:
        capacity *= 2
    return capacity


def hashmap_order(keys: list[str], capacity: int | None = None) -> list[str]:
    """Iteration order of a java.util.HashMap filled with `keys` in this insertion order.

    Buckets iterate in index order; keys sharing a bucket keep insertion order (resizes split
    chains without reordering them). `capacity` defaults to what the map's size implies; pass a
    larger one when the Java map once held more keys than it does now (removals never shrink).
    """
    if capacity is None:
        capacity = hashmap_capacity(len(keys))
    return list(_order(tuple(keys), capacity))


@lru_cache(maxsize=4096)
def _order(keys: tuple[str, ...], capacity: int) -> tuple[str, ...]:
    """Messages of one producer repeat the same property names: one sort per distinct set."""
    mask = capacity - 1
    indexed = sorted((hashmap_bucket_hash(k) & mask, i, k) for i, k in enumerate(keys))
    return tuple(k for _, _, k in indexed)

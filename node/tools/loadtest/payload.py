"""The load-test body: a 32-byte header, then filler bytes.

    offset size field
         0    4 magic b"MQLT"
         4    4 run id (u32 LE): messages of other runs on the same topic are "foreign"
         8    4 producer index (u32 LE)
        12    8 sequence number within the producer (u64 LE)
        20    8 send time, ns since the epoch (u64 LE): end-to-end latency on the consumer
        28    4 CRC32 of the filler (u32 LE): the consumer checks the body arrived intact

A pure codec: `make` builds a body, `read` parses and checks one. The filler is a slice of a
seeded random block, so making a body costs one copy and one CRC.
"""

from __future__ import annotations

import random
import struct
from typing import NamedTuple

from shm.codec import crc32

MAGIC = b"MQLT"
HEADER = struct.Struct("<4sIIQQI")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 32


class Filler:
    """Slices of a random block, different per producer and sequence number."""

    def __init__(self, seed: int, max_size: int):
        rng = random.Random(seed)
        self.block = rng.randbytes(max(65536, 2 * max_size))

    def take(self, seq: int, size: int) -> bytes:
        start = (seq * 7919) % (len(self.block) - size)
        return self.block[start:start + size]


def make(run_id: int, producer: int, seq: int, send_ns: int, size: int, filler: Filler) -> bytes:
    assert size >= HEADER_SIZE, size
    rest = filler.take(seq, size - HEADER_SIZE)
    return HEADER.pack(MAGIC, run_id, producer, seq, send_ns, crc32(rest)) + rest


class Parsed(NamedTuple):
    run_id: int
    producer: int
    seq: int
    send_ns: int
    intact: bool


def read(body: bytes) -> Parsed | None:
    """The header of a load-test body and whether its filler is intact; None if it is not one."""
    if len(body) < HEADER_SIZE or body[:4] != MAGIC:
        return None
    _, run_id, producer, seq, send_ns, crc = HEADER.unpack_from(body)
    return Parsed(run_id, producer, seq, send_ns, crc32(memoryview(body)[HEADER_SIZE:]) == crc)

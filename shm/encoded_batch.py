"""Records encoded back to back, waiting for the single writer to place them: the unit every
encoder (the ingress workers, a writing front, the storage benchmarks) hands the append writer.
No I/O; the record layout is `shm.codec`'s.
"""

from __future__ import annotations

from shm.codec import (
    FLAG_BORNHOST_V6,
    MESSAGE_MAGIC,
    TRANSACTION_COMMIT,
    TRANSACTION_MASK,
    TRANSACTION_NOT,
    record_head,
    record_topic,
)
from shm.invariant import invariant


class EncodedBatch:
    """Records encoded back to back, waiting for the single writer to place them.

    The writer copies `data` into the log and patches, per record, QUEUEOFFSET+PHYSICALOFFSET
    (one 16-byte write at +20) and STORETIMESTAMP; nothing else. `queue_keys[i]` is
    "topic-queueId", or None for PREPARED/ROLLBACK records, which keep queue offset 0 and do not
    advance their queue.
    """

    __slots__ = ("data", "positions", "sizes", "queue_keys", "timestamp_offsets")

    def __init__(self) -> None:
        self.data = bytearray()
        self.positions: list[int] = []
        self.sizes: list[int] = []
        self.queue_keys: list[str | None] = []
        self.timestamp_offsets: list[int] = []

    def __len__(self) -> int:
        return len(self.positions)

    def add(self, record: bytes, topic: str | None = None) -> None:
        """Append one encoded record; pass its `topic` when known to skip re-reading it."""
        size, magic, queue_id, sys_flag = record_head(record)
        invariant(magic == MESSAGE_MAGIC and size == len(record), "EncodedBatch takes whole V1 records")
        advances = sys_flag & TRANSACTION_MASK in (TRANSACTION_NOT, TRANSACTION_COMMIT)
        self.positions.append(len(self.data))
        self.sizes.append(size)
        if advances:
            self.queue_keys.append(f"{topic if topic is not None else record_topic(record, sys_flag)}-{queue_id}")
        else:
            self.queue_keys.append(None)
        self.timestamp_offsets.append(56 if not sys_flag & FLAG_BORNHOST_V6 else 68)
        self.data += record

    def add_v4(self, record: bytes, queue_key: str | None) -> None:
        """Append a record made by `encode_v4` (IPv4 born host), whose queue key the caller knows."""
        self.positions.append(len(self.data))
        self.sizes.append(len(record))
        self.queue_keys.append(queue_key)
        self.timestamp_offsets.append(56)
        self.data += record

    def add_many_v4(self, records: bytes | bytearray, sizes: list[int], queue_keys: list[str]) -> None:
        """Append records made like `encode_v4`'s (IPv4 born host), back to back."""
        at = len(self.data)
        for size in sizes:
            self.positions.append(at)
            at += size
        invariant(at == len(self.data) + len(records), "record sizes must add up to the records")
        invariant(len(queue_keys) == len(sizes), "one queue key per record")
        self.sizes += sizes
        self.queue_keys += queue_keys
        self.timestamp_offsets += [56] * len(sizes)
        if not self.data and isinstance(records, bytearray):
            self.data = records  # a client batch travels alone: adopt its buffer, no copy
        else:
            self.data += records

    @property
    def size_bytes(self) -> int:
        return len(self.data)


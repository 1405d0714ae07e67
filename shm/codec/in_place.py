"""Fields of encoded records read and set in place, without decoding the record.

The record's layout is `shm.codec.record`'s table; what is here only looks at a field's place
in it: a follower finding record boundaries in bytes it received (`frame_size`), recovery's
look at a segment's first store time, the transaction service's look at a half's flags, the
archive's envelope (a record without its body) and back, a one-half batch's commit setting
its records' transaction bits. None of it checks a CRC: the records are read whole where
they are trusted (`decode`, `scan`).
"""

from __future__ import annotations

import struct

from shm.codec.properties import parse_properties
from shm.codec.record import (
    BLANK_MAGIC, FLAG_BORNHOST_V6, FLAG_STOREHOST_V6, MESSAGE_MAGIC, MESSAGE_MAGIC_V2, OFFSET_QUEUE_OFFSET,
    OFFSET_SYSFLAG, TRANSACTION_MASK, _BLANK, _FIXED_V4, _HEAD_SIZE, _I16, _I32, _I64, _topic_text, body_crc,
    store_timestamp_offset,
)
from shm.invariant import invariant


MIN_RECORD_SIZE = _FIXED_V4.size + 1 + 2  # the fixed fields (body length last), empty topic and properties: 91


def frame_size(buf, at: int, space: int) -> tuple[int, str]:
    """What starts at `at` of a segment with `space` bytes from there to its end: (its size, "")
    for a record's header or the segment's closing blank, (0, why) for anything else. Only the
    size and magic are looked at (a follower finding record boundaries in bytes it received;
    the CRC is checked where the records are read)."""
    size, magic = _BLANK.unpack_from(buf, at)
    if magic == BLANK_MAGIC:
        return (size, "") if size == space else (0, f"a blank of {size} bytes at {at} of a segment")
    if magic not in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2) or size < MIN_RECORD_SIZE or size > space:
        return 0, f"no record header (size {size}, magic {magic & 0xFFFFFFFF:#x})"
    return size, ""


def encode_blank(size: int) -> bytes:
    return _BLANK.pack(size, BLANK_MAGIC)


def peek_queue_offset(buf, pos: int = 0) -> int:
    """QUEUEOFFSET of the record at `pos` (any magic: the field's place is the same)."""
    return _I64.unpack_from(buf, pos + OFFSET_QUEUE_OFFSET)[0]


def peek_store_timestamp(buf, pos: int = 0) -> int | None:
    """STORETIMESTAMP of the V1 record at `pos` without decoding it; None when no V1 record
    starts there (recovery's look at each segment's first record)."""
    if len(buf) - pos < _HEAD_SIZE + 28:
        return None
    _, magic = _BLANK.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        return None
    sys_flag, = _I32.unpack_from(buf, pos + OFFSET_SYSFLAG)
    return _I64.unpack_from(buf, pos + store_timestamp_offset(sys_flag))[0]


def peek_transaction(buf, pos: int = 0) -> tuple[int, int]:
    """(the SYSFLAG's transaction bits, PREPAREDTRANSACTIONOFFSET) of the record at `pos`, read in
    place: `buf` needs only the record's fixed part and hosts (TRANSACTION_HEAD_BYTES)."""
    sys_flag, = _I32.unpack_from(buf, pos + OFFSET_SYSFLAG)
    return sys_flag & TRANSACTION_MASK, _I64.unpack_from(buf, pos + _prepared_at(sys_flag))[0]


TRANSACTION_HEAD_BYTES = 112  # `body_offset` with both hosts IPv6: what `peek_transaction` reads at most


def body_offset(sys_flag: int) -> int:
    """Where BODY starts in a record: its fixed part is 72 bytes plus the two hosts (either magic)."""
    return 72 + (20 if sys_flag & FLAG_BORNHOST_V6 else 8) + (20 if sys_flag & FLAG_STOREHOST_V6 else 8)


def _prepared_at(sys_flag: int) -> int:
    """Where PREPAREDTRANSACTIONOFFSET is: before BODYLENGTH, which is just before BODY."""
    return body_offset(sys_flag) - 12


def envelope(raw) -> bytes:
    """A whole record without its body (what the archive keeps beside the body column), so that
    `with_body(envelope(raw), body) == raw` byte for byte, whatever the record's magic or hosts."""
    at = body_offset(_I32.unpack_from(raw, OFFSET_SYSFLAG)[0])
    length = _I32.unpack_from(raw, at - 4)[0]
    return bytes(raw[:at]) + bytes(raw[at + length:])


def with_body(head: bytes, body: bytes) -> bytes:
    """The record `envelope` cut `body` out of. Raises ValueError when they do not belong
    together: another length, a TOTALSIZE that does not add up, another body CRC."""
    at = body_offset(_I32.unpack_from(head, OFFSET_SYSFLAG)[0])
    size, _, crc = struct.unpack_from(">iii", head, 0)
    length = _I32.unpack_from(head, at - 4)[0]
    if length != len(body) or size != len(head) + len(body):
        raise ValueError(f"a body of {len(body)} bytes in an envelope for {length} (TOTALSIZE {size})")
    if body and crc != body_crc(body):
        raise ValueError(f"body CRC {body_crc(body)} where the record says {crc}")
    return b"".join((head[:at], body, head[at:]))


def set_transaction(records: bytearray, sizes: list[int], transaction: int, prepared: int) -> None:
    """Encoded records back to back (`sizes`): each one's SYSFLAG transaction bits set to
    `transaction` and its PREPAREDTRANSACTIONOFFSET to `prepared`, in place (the BODYCRC covers the
    body only: nothing else changes). A one-half batch's commit stores its messages so."""
    at = 0
    for size in sizes:
        sys_flag = _I32.unpack_from(records, at + OFFSET_SYSFLAG)[0]
        _I32.pack_into(records, at + OFFSET_SYSFLAG, (sys_flag & ~TRANSACTION_MASK) | transaction)
        _I64.pack_into(records, at + _prepared_at(sys_flag), prepared)
        at += size
    invariant(at == len(records), "the record sizes must add up to the records", at, len(records))


def record_head(record) -> tuple[int, int, int, int]:
    """(TOTALSIZE, MAGICCODE, QUEUEID, SYSFLAG) of an encoded record."""
    size, magic = _BLANK.unpack_from(record, 0)
    return size, magic, _I32.unpack_from(record, 12)[0], _I32.unpack_from(record, OFFSET_SYSFLAG)[0]


def record_topic(record, sys_flag: int) -> str:
    """The TOPIC of a well-formed V1 record, read in place."""
    topic_at = _topic_at(record, 0, sys_flag)
    return _topic_text(bytes(record[topic_at + 1: topic_at + 1 + record[topic_at]]))


def record_properties(record, at: int = 0) -> dict[str, str]:
    """The PROPERTIES of the well-formed V1 record at `at`, parsed (a SQL92 selector reads them
    for each record it looks at; the body is not copied)."""
    topic_at = _topic_at(record, at, _I32.unpack_from(record, at + OFFSET_SYSFLAG)[0])
    props_at = topic_at + 1 + record[topic_at]
    props_len = _I16.unpack_from(record, props_at)[0]
    return parse_properties(bytes(record[props_at + 2: props_at + 2 + max(props_len, 0)]).decode("utf-8", "replace"))


def _topic_at(record, at: int, sys_flag: int) -> int:
    """Where the TOPIC length byte of the V1 record at `at` is: past its hosts and its body."""
    born = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    body_len_at = at + 68 + born + store
    return body_len_at + 4 + max(_I32.unpack_from(record, body_len_at)[0], 0)

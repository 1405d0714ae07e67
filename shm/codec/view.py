"""A client's view of a pulled record: the layout walked, nothing decoded until asked (FIXED_V4's
fields in one unpack, where BODY, TOPIC and PROPERTIES start), and the message ids of a batch."""

from __future__ import annotations

import struct

from shm.codec.properties import PROPERTY_UNIQ_KEY
from shm.codec.record import FLAG_BORNHOST_V6, FLAG_STOREHOST_V6, MESSAGE_MAGIC, MESSAGE_MAGIC_V2, _FIXED_V4, _I16, _I32, _I64


# ----------------------------------------------------------------------------------------------
# A client's view of a pulled record: the layout walked, nothing decoded until asked

TOTALSIZE = _I32  # the first field of every record: a reply's records are framed by it
PROPERTIES_LENGTH = _I16
_FIXED_V4_SIZE = _FIXED_V4.size
_V6_FLAGS = FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6
# TOTALSIZE (0), QUEUEOFFSET (20), SYSFLAG (36) and, both hosts IPv4, RECONSUMETIMES (72): one unpack
_QUEUE_FIELDS_V4 = struct.Struct(">i16xq8xi32xi")
# Positions in FIXED_V4's unpacked tuple (§2's field order).
FIXED_QUEUE_ID, FIXED_QUEUE_OFFSET, FIXED_PHYSICAL, FIXED_BORN_TS, FIXED_BORN_HOST = 3, 5, 6, 8, 9
FIXED_STORE_TS, FIXED_STORE_HOST, FIXED_RECONSUME, FIXED_BODY_LEN = 10, 11, 12, 14


def walk_v4(buf: bytes, at: int, size: int) -> tuple[tuple, int, int, int] | None:
    """An IPv4 record's layout checked and its fixed part unpacked, nothing else read:
    (FIXED_V4 fields, where BODY, TOPIC and PROPERTIES start). None for anything else (IPv6
    hosts, an odd layout): `decode` then reads it or names what is wrong. Magic V1 and V2."""
    if size <= _FIXED_V4_SIZE:
        return None
    fixed = _FIXED_V4.unpack_from(buf, at)
    magic, body_len = fixed[1], fixed[14]
    if fixed[7] & _V6_FLAGS or (magic != MESSAGE_MAGIC and magic != MESSAGE_MAGIC_V2) or fixed[0] != size:
        return None
    end, body_at = at + size, at + _FIXED_V4_SIZE
    p = body_at + body_len
    if body_len < 0 or p + 3 > end:
        return None
    if magic == MESSAGE_MAGIC:
        topic_len, p = buf[p], p + 1
        if topic_len >= 128:  # a negative signed byte in Java
            return None
    else:
        topic_len, p = _I16.unpack_from(buf, p)[0], p + 2
    props_at = p + topic_len + 2
    if topic_len <= 0 or props_at > end or props_at + _I16.unpack_from(buf, props_at - 2)[0] != end:
        return None
    return fixed, body_at, p, props_at


def walk_records_v4(buf: bytes) -> tuple[list, list[int]]:
    """`walk_v4` over a run of whole records (a pull reply), in one call: ([(FIXED_V4 fields,
    BODY, TOPIC, PROPERTIES start, record end)...] for the records it walked, [positions of
    those it left for `decode`]). Raises ValueError for a run that is not whole records."""
    walked, left = [], []
    at, end_of = 0, len(buf)
    unpack, i16_at, fixed_size = _FIXED_V4.unpack_from, _I16.unpack_from, _FIXED_V4_SIZE
    while at < end_of:  # walk_v4's checks, inlined: a call a record costs a third of the walk
        if end_of - at < 4:
            raise ValueError(f"{end_of - at} stray bytes after the last record")
        size = _I32.unpack_from(buf, at)[0]
        if size <= 0 or at + size > end_of:
            raise ValueError(f"record at byte {at} has size {size}")
        end = at + size
        if size > fixed_size:
            fixed = unpack(buf, at)
            body_at = at + fixed_size
            topic_at = body_at + fixed[14]
            if (fixed[1] == MESSAGE_MAGIC and not fixed[7] & _V6_FLAGS and fixed[0] == size and fixed[14] >= 0
                    and topic_at + 3 <= end):
                topic_len = buf[topic_at]
                props_at = topic_at + 3 + topic_len
                if 0 < topic_len < 128 and props_at <= end and props_at + i16_at(buf, props_at - 2)[0] == end:
                    walked.append((fixed, body_at, topic_at + 1, props_at, end))
                    at = end
                    continue
        left.append(at)  # V2 magic, IPv6 hosts, anything odd: `decode` reads it or names it
        at = end
    return walked, left


_UNIQ_NAME = PROPERTY_UNIQ_KEY.encode() + b"\x01"


def lone_uniq_key(buf: bytes, props_at: int) -> str | None:
    """UNIQ_KEY's value when its name occurs once in the properties that start at `props_at`,
    as a whole name, with a non-empty value; None otherwise (the caller parses them all)."""
    end = props_at + _I16.unpack_from(buf, props_at - 2)[0]
    at = buf.find(_UNIQ_NAME, props_at, end)
    if at < 0 or (at > props_at and buf[at - 1] != 2) or buf.find(_UNIQ_NAME, at + 1, end) >= 0:
        return None
    at += len(_UNIQ_NAME)
    stop = buf.find(b"\x02", at, end)
    value = buf[at: end if stop < 0 else stop]
    return value.decode("utf-8") if value else None


def offset_ids_py(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    """The offset msgId (`offset_msg_id`) of each appended record at `indices`, upper-case hex."""
    pack = _I64.pack  # (host + pack).hex() beats an f-string's :016X here
    return [(store_host + pack(physical[i])).hex().upper() for i in indices]


def queue_entries(runs: list[bytes]) -> list[tuple[int, memoryview, int]]:
    """(QUEUEOFFSET, the record's bytes, RECONSUMETIMES) of each record of `runs`, whole records
    back to back as a read hands them: only the fixed part is read (RECONSUMETIMES lies after
    the two hosts, whose sizes SYSFLAG gives). A record's bytes are a view into its run, not a
    copy (they are joined into a reply next): it keeps the run alive, never a mapping, as long as
    runs are bytes."""
    out = []
    unpack = _QUEUE_FIELDS_V4.unpack_from
    for run in runs:
        view, at, end = memoryview(run), 0, len(run)
        while at + _QUEUE_FIELDS_V4.size <= end:
            size, queue_offset, sys_flag, reconsume = unpack(run, at)
            assert size > 0 and at + size <= end, (at, size, end)  # (a reader hands whole records)
            if sys_flag & _V6_FLAGS:
                pos = at + 48 + (20 if sys_flag & FLAG_BORNHOST_V6 else 8) + 8 + (20 if sys_flag & FLAG_STOREHOST_V6 else 8)
                reconsume = _I32.unpack_from(run, pos)[0]
            out.append((queue_offset, view[at: at + size], reconsume))
            at += size
    return out

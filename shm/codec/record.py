"""The CommitLog record: its layout, `encode` and `decode` (RocketMQ 4.9 MessageVersion V1), pure functions over bytes, no I/O.

Every reader of the log (recovery, the reput dispatcher, HA, clients, the Spark jobs, the
`dump`/`verify` tools) calls `decode` below; every writer encodes with `encode`.

Record layout (all integers big-endian, signed). BH/SH = born/store host length: 8 for IPv4
(4 address bytes + i32 port), 20 for IPv6 (sysFlag bits 0x10 / 0x20). B, T, P = body, topic
and properties byte lengths.

| offset       | width | field                        |
|--------------|-------|------------------------------|
| 0            | 4     | TOTALSIZE (= 75+BH+SH+B+T+P) |
| 4            | 4     | MAGICCODE 0xDAA320A7 (V2 5.x: 0xDAA320AB, 2-byte topic length) |
| 8            | 4     | BODYCRC (crc32(body) & 0x7FFFFFFF, 0 for no body) |
| 12           | 4     | QUEUEID                      |
| 16           | 4     | FLAG                         |
| 20           | 8     | QUEUEOFFSET   (patched by the single writer) |
| 28           | 8     | PHYSICALOFFSET (patched by the single writer) |
| 36           | 4     | SYSFLAG                      |
| 40           | 8     | BORNTIMESTAMP (ms)           |
| 48           | BH    | BORNHOST                     |
| 48+BH        | 8     | STORETIMESTAMP (patched by the single writer) |
| 56+BH        | SH    | STOREHOST                    |
| 56+BH+SH     | 4     | RECONSUMETIMES               |
| 60+BH+SH     | 8     | PREPAREDTRANSACTIONOFFSET    |
| 68+BH+SH     | 4     | BODYLENGTH                   |
| 72+BH+SH     | B     | BODY                         |
| 72+BH+SH+B   | 1     | TOPICLENGTH (signed byte)    |
| 73+BH+SH+B   | T     | TOPIC (UTF-8)                |
| 73+..+T      | 2     | PROPERTIESLENGTH (signed short) |
| 75+..+T      | P     | PROPERTIES: name\x01value pairs joined by \x02 |

End of a segment: a BLANK record, i32 size (all bytes left in the file) + i32 0xCBD43194; only
those 8 bytes are written. A record is appended only when size + 8 <= bytes left.

`decode` returns a `Record`, a `Blank`, or a `Corruption` with a named kind — never a bare int.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

try:  # ISA-L computes the same CRC-32 as zlib, ~4x faster per 1 KiB body on this machine
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives identical values
    from zlib import crc32

from shm.codec.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, parse_properties, split_keys
from shm.codec.msgid import Host, decode_host, offset_msg_id


MESSAGE_MAGIC = -626843481  # 0xDAA320A7
MESSAGE_MAGIC_V2 = -626843477  # 0xDAA320AB (5.x; read-only support)
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

FLAG_COMPRESSED = 0x1
FLAG_MULTI_TAGS = 0x2
TRANSACTION_MASK = 0xC
TRANSACTION_NOT = 0x0
TRANSACTION_PREPARED = 0x4
TRANSACTION_COMMIT = 0x8
TRANSACTION_ROLLBACK = 0xC
FLAG_BORNHOST_V6 = 0x10
FLAG_STOREHOST_V6 = 0x20

OFFSET_QUEUE_OFFSET = 20
OFFSET_PHYSICAL_OFFSET = 28
OFFSET_SYSFLAG = 36
OFFSET_BORN_HOST = 48

MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767
MAX_RECORD_OVERHEAD = 64 * 1024  # a record may exceed maxMessageSize by this much

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_BLANK = struct.Struct(">ii")
# TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BORNTIMESTAMP
_HEAD = struct.Struct(">iiiiiqqiq")
_HEAD_SIZE = _HEAD.size  # 48


def _host_struct(born_len: int, store_len: int) -> struct.Struct:
    # From BORNHOST through BODYLENGTH: host, STORETIMESTAMP, host, RECONSUMETIMES, PREPARED, BODYLENGTH
    return struct.Struct(f">{born_len}sq{store_len}siqi")


_MIDDLE = {(b, s): _host_struct(b, s) for b in (8, 20) for s in (8, 20)}
# Through BODYLENGTH when both hosts are IPv4 (nearly every record): one (un)pack for the hot paths.
_FIXED_V4 = struct.Struct(">iiiiiqqiq8sq8siqi")
FIXED_V4 = _FIXED_V4  # public: readers that decode IPv4 records in one unpack (node.client.consumer)


class CorruptionKind(enum.Enum):
    END_OF_DATA = "end of data"  # zeros where a record would start: nothing was written here
    BAD_MAGIC = "bad magic"
    BAD_SIZE = "bad size"
    CRC_MISMATCH = "crc mismatch"
    TRUNCATED = "truncated"


class MessageIllegal(ValueError):
    """A message that may not be stored; `status` is the RocketMQ PutMessageStatus name."""

    def __init__(self, status: str, remark: str):
        super().__init__(f"{status}: {remark}")
        self.status = status
        self.remark = remark


@dataclass(frozen=True, slots=True)
class Blank:
    """End-of-segment padding: the reader moves to the next segment."""

    position: int
    size: int


@dataclass(frozen=True, slots=True)
class Corruption:
    """Why the bytes at `position` are not a record. `size` is TOTALSIZE when it was readable.
    END_OF_DATA is the normal end of a segment's data, not damage (see `is_damage`)."""

    position: int
    kind: CorruptionKind
    detail: str
    size: int = -1

    @property
    def is_damage(self) -> bool:
        return self.kind is not CorruptionKind.END_OF_DATA


@dataclass(frozen=True)
class Record:
    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties_string: str
    position: int = field(default=0, compare=False)

    @cached_property
    def properties(self) -> dict[str, str]:
        return parse_properties(self.properties_string)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(PROPERTY_KEYS, ""))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)


# ----------------------------------------------------------------------------------------------
# Small pieces


def body_crc(body: bytes | memoryview) -> int:
    return crc32(body) & 0x7FFFFFFF if len(body) else 0


def expected_size(sys_flag: int, body_len: int, topic_len: int, props_len: int, v2: bool = False) -> int:
    born = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    return 75 + born + store + max(body_len, 0) + topic_len + max(props_len, 0) + (1 if v2 else 0)


# ----------------------------------------------------------------------------------------------
# Encoding


def encode(
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    born_timestamp: int,
    born_host: bytes,
    store_host: bytes,
    properties: str = "",
    flag: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    store_timestamp: int = 0,
    max_message_size: int = 4 * 1024 * 1024,
) -> bytes:
    """One CommitLog record. The v6 host bits of sys_flag follow the host lengths.

    QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP default to 0 for the single writer to patch
    (see `shm.encoded_batch.EncodedBatch`). Raises MessageIllegal with RocketMQ's status for what may not be stored.
    """
    topic_raw = topic.encode("utf-8")
    props_raw = properties.encode("utf-8")
    _check_limits(topic_raw, body, props_raw, max_message_size)
    sys_flag = (sys_flag & ~(FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6)) | _host_flags(born_host, store_host)
    size = expected_size(sys_flag, len(body), len(topic_raw), len(props_raw))
    if size > max_message_size + MAX_RECORD_OVERHEAD:
        raise MessageIllegal("MESSAGE_ILLEGAL", f"record of {size} bytes exceeds maxMessageSize + 64 KiB")
    head = _HEAD.pack(size, MESSAGE_MAGIC, body_crc(body), queue_id, flag, queue_offset,
                      physical_offset, sys_flag, born_timestamp)
    middle = _MIDDLE[len(born_host), len(store_host)].pack(
        born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset, len(body))
    return b"".join((head, middle, body, bytes((len(topic_raw),)), topic_raw,
                     _I16.pack(len(props_raw)), props_raw))


def encode_v4(topic_raw: bytes, body: bytes, queue_id: int, flag: int, sys_flag: int, born_timestamp: int,
              born_host: bytes, store_host: bytes, props_raw: bytes, reconsume_times: int,
              max_message_size: int, prepared_transaction_offset: int = 0) -> bytes:
    """`encode` for the common case the writer path sees (IPv4 hosts, no offsets yet, topic and
    properties already UTF-8): one pack for the fixed part. Same bytes, same checks."""
    _check_limits(topic_raw, body, props_raw, max_message_size)
    size = 91 + len(body) + len(topic_raw) + len(props_raw)
    if size > max_message_size + MAX_RECORD_OVERHEAD:
        raise MessageIllegal("MESSAGE_ILLEGAL", f"record of {size} bytes exceeds maxMessageSize + 64 KiB")
    crc = crc32(body) & 0x7FFFFFFF if body else 0
    fixed = _FIXED_V4.pack(size, MESSAGE_MAGIC, crc, queue_id, flag, 0, 0, sys_flag & ~0x30, born_timestamp,
                           born_host, 0, store_host, reconsume_times, prepared_transaction_offset, len(body))
    return b"".join((fixed, body, bytes((len(topic_raw),)), topic_raw, _I16.pack(len(props_raw)), props_raw))


def _host_flags(born_host: bytes, store_host: bytes) -> int:
    if len(born_host) not in (8, 20) or len(store_host) not in (8, 20):
        raise MessageIllegal("MESSAGE_ILLEGAL", "a host must be 8 (IPv4) or 20 (IPv6) bytes")
    return (FLAG_BORNHOST_V6 if len(born_host) == 20 else 0) | (FLAG_STOREHOST_V6 if len(store_host) == 20 else 0)


def _check_limits(topic_raw: bytes, body: bytes, props_raw: bytes, max_message_size: int) -> None:
    if not topic_raw:
        raise MessageIllegal("MESSAGE_ILLEGAL", "topic is empty")
    if len(topic_raw) > MAX_TOPIC_BYTES:
        raise MessageIllegal("MESSAGE_ILLEGAL", f"topic of {len(topic_raw)} bytes exceeds {MAX_TOPIC_BYTES}")
    if len(props_raw) > MAX_PROPERTIES_BYTES:
        raise MessageIllegal("PROPERTIES_SIZE_EXCEEDED",
                             f"properties of {len(props_raw)} bytes exceed {MAX_PROPERTIES_BYTES}")
    if len(body) > max_message_size:
        raise MessageIllegal("MESSAGE_ILLEGAL",
                             f"message body size exceeded: {len(body)} > maxMessageSize {max_message_size}")


def store_timestamp_offset(sys_flag: int) -> int:
    return 48 + (20 if sys_flag & FLAG_BORNHOST_V6 else 8)


# ----------------------------------------------------------------------------------------------
# Decoding


def decode(buf, pos: int = 0, *, check_crc: bool = True, limit: int | None = None,
           read_body: bool = True) -> Record | Blank | Corruption:
    """Read the record that starts at `pos` of `buf` (bytes, bytearray, mmap or memoryview).

    `limit` is the end of readable data (a segment's write position); bytes past it are never
    read. CRC is checked only when asked and the body is non-empty, as RocketMQ's recovery does.
    With read_body=False (the dispatch path) the body is left out and its CRC is not checked.
    """
    end = len(buf) if limit is None else limit
    head = _check_head(buf, pos, end)
    if not isinstance(head, tuple):
        return head
    size, magic, sys_flag = head
    try:
        return _decode_body(buf, pos, size, magic, sys_flag, check_crc, read_body)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"unparseable record: {e}", size)


def _check_head(buf, pos: int, end: int) -> tuple[int, int, int] | Blank | Corruption:
    if end - pos < 8:
        return Corruption(pos, CorruptionKind.TRUNCATED, f"{end - pos} bytes left, a header needs 8")
    size, magic = _BLANK.unpack_from(buf, pos)
    if size == 0 and magic == 0:
        return Corruption(pos, CorruptionKind.END_OF_DATA, "zeros: no record was written here", 0)
    if magic == BLANK_MAGIC:
        if size < END_FILE_MIN_BLANK_LENGTH:
            return Corruption(pos, CorruptionKind.BAD_SIZE, f"blank record of size {size}", size)
        return Blank(pos, size)
    if magic not in (MESSAGE_MAGIC, MESSAGE_MAGIC_V2):
        return Corruption(pos, CorruptionKind.BAD_MAGIC, f"magic {magic & 0xFFFFFFFF:#010x}", size)
    if size < 91 or size > end - pos:
        kind = CorruptionKind.TRUNCATED if size > end - pos else CorruptionKind.BAD_SIZE
        return Corruption(pos, kind, f"TOTALSIZE {size} with {end - pos} bytes readable", size)
    sys_flag, = _I32.unpack_from(buf, pos + OFFSET_SYSFLAG)
    return size, magic, sys_flag


def _decode_body(buf, pos: int, size: int, magic: int, sys_flag: int, check_crc: bool,
                 read_body: bool) -> Record | Corruption:
    (_, _, crc, queue_id, flag, queue_offset, physical_offset, _, born_ts) = _HEAD.unpack_from(buf, pos)
    born_len = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    store_len = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    middle = _MIDDLE[born_len, store_len]
    born_host, store_ts, store_host, reconsume, prepared, body_len = middle.unpack_from(buf, pos + _HEAD_SIZE)
    at = pos + _HEAD_SIZE + middle.size
    body_len = max(body_len, 0)
    if at + body_len + 3 > pos + size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"body of {body_len} bytes overruns TOTALSIZE {size}", size)
    body = bytes(buf[at: at + body_len]) if read_body else b""
    at += body_len
    v2 = magic == MESSAGE_MAGIC_V2
    topic_len = _I16.unpack_from(buf, at)[0] if v2 else _signed_byte(buf[at])
    at += 2 if v2 else 1
    topic_raw = bytes(buf[at: at + max(topic_len, 0)])
    at += max(topic_len, 0)
    if at + 2 > pos + size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, "properties length overruns TOTALSIZE", size)
    props_len, = _I16.unpack_from(buf, at)
    want = expected_size(sys_flag, body_len, max(topic_len, 0), props_len, v2)
    if topic_len <= 0 or want != size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"TOTALSIZE {size} but fields add up to {want}", size)
    props_raw = bytes(buf[at + 2: at + 2 + max(props_len, 0)])
    if check_crc and read_body and body_len > 0 and body_crc(body) != crc:
        return Corruption(pos, CorruptionKind.CRC_MISMATCH, f"body CRC {body_crc(body)} != stored {crc}", size)
    return Record(size, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_ts,
                  decode_host(born_host), store_ts, decode_host(store_host), reconsume, prepared, body,
                  topic_raw.decode("utf-8"), props_raw.decode("utf-8"), pos)


def _signed_byte(b: int) -> int:
    return b - 256 if b > 127 else b


@dataclass(frozen=True, slots=True)
class ScanResult:
    """How far a run of valid records reaches: `end` is the first byte after the last valid one."""

    end: int
    records: int
    stopped_by: Blank | Corruption | None  # None: reached the limit exactly


def scan(buf, pos: int, limit: int, *, check_crc: bool = True) -> ScanResult:
    """Walk valid records from `pos` until a blank, a corruption or `limit`, without building
    Record objects: recovery's hot loop (hundreds of MB/s).
    """
    count = 0
    while pos < limit:
        head = _check_head(buf, pos, limit)
        if not isinstance(head, tuple):
            return ScanResult(pos, count, head)
        size, magic, sys_flag = head
        problem = _check_fields(buf, pos, size, magic, sys_flag, check_crc)
        if problem is not None:
            return ScanResult(pos, count, problem)
        pos += size
        count += 1
    return ScanResult(pos, count, None)


def _check_fields(buf, pos: int, size: int, magic: int, sys_flag: int, check_crc: bool) -> Corruption | None:
    born_len = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    store_len = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    body_at = pos + 72 + born_len + store_len
    body_len = max(_I32.unpack_from(buf, body_at - 4)[0], 0)
    v2 = magic == MESSAGE_MAGIC_V2
    topic_at = body_at + body_len
    if topic_at + 3 > pos + size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"body of {body_len} bytes overruns TOTALSIZE {size}", size)
    topic_len = _I16.unpack_from(buf, topic_at)[0] if v2 else _signed_byte(buf[topic_at])
    props_at = topic_at + (2 if v2 else 1) + max(topic_len, 0)
    if topic_len <= 0 or props_at + 2 > pos + size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"topic length {topic_len} does not fit TOTALSIZE {size}", size)
    props_len, = _I16.unpack_from(buf, props_at)
    want = expected_size(sys_flag, body_len, topic_len, props_len, v2)
    if want != size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"TOTALSIZE {size} but fields add up to {want}", size)
    if check_crc and body_len > 0:
        stored, = _I32.unpack_from(buf, pos + 8)
        actual = crc32(memoryview(buf)[body_at: body_at + body_len]) & 0x7FFFFFFF
        if actual != stored:
            return Corruption(pos, CorruptionKind.CRC_MISMATCH, f"body CRC {actual} != stored {stored}", size)
    return None


def dispatch_fields(buf, pos: int, limit: int) -> tuple | Blank | Corruption:
    """The reput dispatcher's decode: sizes checked, body neither copied nor CRC-checked (as
    RocketMQ's reput reads with checkCRC=false). A plain tuple, since building objects costs more
    than the decode: (TOTALSIZE, queueId, queueOffset, physicalOffset, sysFlag, storeTimestamp,
    topic, properties string)."""
    head = _check_head(buf, pos, limit)
    if not isinstance(head, tuple):
        return head
    size, magic, sys_flag = head
    if magic != MESSAGE_MAGIC or sys_flag & (FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6):
        item = decode(buf, pos, check_crc=False, limit=limit, read_body=False)
        if not isinstance(item, Record):
            return item
        return (size, item.queue_id, item.queue_offset, item.physical_offset, sys_flag, item.store_timestamp,
                item.topic, item.properties_string)
    fields = _FIXED_V4.unpack_from(buf, pos)
    body_len = max(fields[14], 0)
    topic_at = pos + _FIXED_V4.size + body_len
    topic_len = buf[topic_at] if topic_at + 3 <= pos + size else 0
    props_at = topic_at + 1 + topic_len
    if topic_len == 0 or topic_len > MAX_TOPIC_BYTES or props_at + 2 > pos + size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"topic does not fit TOTALSIZE {size}", size)
    props_len, = _I16.unpack_from(buf, props_at)
    if 91 + body_len + topic_len + max(props_len, 0) != size:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"TOTALSIZE {size} does not match its fields", size)
    try:
        topic = _topic_text(bytes(buf[topic_at + 1: props_at]))
        properties = bytes(buf[props_at + 2: props_at + 2 + max(props_len, 0)]).decode("utf-8")
    except UnicodeDecodeError as e:
        return Corruption(pos, CorruptionKind.BAD_SIZE, f"unparseable record: {e}", size)
    return size, fields[3], fields[5], fields[6], sys_flag, fields[10], topic, properties


@lru_cache(maxsize=4096)
def _topic_text(raw: bytes) -> str:
    return raw.decode("utf-8")

"""CommitLog record codec: pure functions over bytes, no I/O (RocketMQ 4.9 MessageVersion V1).

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
| 75+..+T      | P     | PROPERTIES: name\\x01value pairs joined by \\x02 |

End of a segment: a BLANK record, i32 size (all bytes left in the file) + i32 0xCBD43194; only
those 8 bytes are written. A record is appended only when size + 8 <= bytes left.

`decode` returns a `Record`, a `Blank`, or a `Corruption` with a named kind — never a bare int.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

try:  # ISA-L computes the same CRC-32 as zlib, ~4x faster per 1 KiB body on this machine
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib gives identical values
    from zlib import crc32

from shm.javacompat import hashmap_capacity, hashmap_order, jhash, jhash_cached

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

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_CLUSTER = "CLUSTER"

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# RocketMQ 5's timer (arbitrary delays): what the client sets, and what the broker adds
TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_PROPERTIES = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS)  # first found wins

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
class Host:
    ip: str
    port: int

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


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


@lru_cache(maxsize=4096)
def encode_host(ip: str, port: int) -> bytes:
    """Address bytes in network order, then the port as i32: 8 bytes (IPv4) or 20 (IPv6).
    Cached like decode_host: every msgId of a pull reply goes through here."""
    return ipaddress.ip_address(ip).packed + _I32.pack(port)


@lru_cache(maxsize=4096)
def decode_host(raw: bytes) -> Host:
    """Hosts repeat (one store host, few producers): cached, since ipaddress is slow."""
    return Host(str(ipaddress.ip_address(raw[:-4])), _I32.unpack(raw[-4:])[0])


def offset_msg_id(store_host: Host | bytes, physical_offset: int) -> str:
    """The store ("offset") msgId: store address, port i32, physical offset i64, upper hex."""
    raw = store_host if isinstance(store_host, bytes) else encode_host(store_host.ip, store_host.port)
    return (raw + _I64.pack(physical_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[Host, int]:
    raw = bytes.fromhex(msg_id)
    return decode_host(raw[:-8]), _I64.unpack(raw[-8:])[0]


def split_keys(keys: str) -> list[str]:
    """KEYS are separated by single spaces; empty pieces are skipped (as buildIndex does)."""
    return [k for k in keys.split(" ") if k]


def parse_properties(text: str) -> dict[str, str]:
    """Java MessageDecoder.string2messageProperties: keep `k\\x01v` pairs with both non-empty."""
    result: dict[str, str] = {}
    if not text:
        return result
    for pair in text.split(PROPERTY_SEPARATOR):
        name, separator, value = pair.partition(NAME_VALUE_SEPARATOR)
        if separator and name and value:
            result[name] = value
    return result


def properties_string(properties: dict[str, str | None], capacity: int | None = None) -> str:
    """Serialise like Java messageProperties2String over a HashMap filled in dict order.

    Pairs come out in Java HashMap iteration order, so the bytes match what RocketMQ writes for
    the same map; `None` values are skipped; no trailing separator.
    """
    names = hashmap_order([k for k, v in properties.items() if v is not None], capacity)
    return PROPERTY_SEPARATOR.join([f"{k}{NAME_VALUE_SEPARATOR}{properties[k]}" for k in names])


def tags_code(tags: str | None) -> int:
    """ConsumeQueue tag slot for a normal topic: jhash(TAGS) sign-extended, 0 for no tag."""
    return jhash_cached(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """IndexFile keyHash: abs(jhash(key)), where Java's abs(MIN_VALUE) case maps to 0."""
    h = jhash(key)
    return 0 if h == -2147483648 else abs(h)


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
              max_message_size: int) -> bytes:
    """`encode` for the common case the writer path sees (IPv4 hosts, no offsets yet, topic and
    properties already UTF-8): one pack for the fixed part. Same bytes, same checks."""
    _check_limits(topic_raw, body, props_raw, max_message_size)
    size = 91 + len(body) + len(topic_raw) + len(props_raw)
    if size > max_message_size + MAX_RECORD_OVERHEAD:
        raise MessageIllegal("MESSAGE_ILLEGAL", f"record of {size} bytes exceeds maxMessageSize + 64 KiB")
    crc = crc32(body) & 0x7FFFFFFF if body else 0
    fixed = _FIXED_V4.pack(size, MESSAGE_MAGIC, crc, queue_id, flag, 0, 0, sys_flag & ~0x30, born_timestamp,
                           born_host, 0, store_host, reconsume_times, 0, len(body))
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


def encode_blank(size: int) -> bytes:
    return _BLANK.pack(size, BLANK_MAGIC)


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


def body_offset(sys_flag: int) -> int:
    """Where BODY starts in a record: its fixed part is 72 bytes plus the two hosts (either magic)."""
    return 72 + (20 if sys_flag & FLAG_BORNHOST_V6 else 8) + (20 if sys_flag & FLAG_STOREHOST_V6 else 8)


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


def record_head(record) -> tuple[int, int, int, int]:
    """(TOTALSIZE, MAGICCODE, QUEUEID, SYSFLAG) of an encoded record."""
    size, magic = _BLANK.unpack_from(record, 0)
    return size, magic, _I32.unpack_from(record, 12)[0], _I32.unpack_from(record, OFFSET_SYSFLAG)[0]


def record_topic(record, sys_flag: int) -> str:
    """The TOPIC of a well-formed V1 record, read in place."""
    born = 20 if sys_flag & FLAG_BORNHOST_V6 else 8
    store = 20 if sys_flag & FLAG_STOREHOST_V6 else 8
    body_len_at = 68 + born + store
    topic_at = body_len_at + 4 + max(_I32.unpack_from(record, body_len_at)[0], 0)
    return _topic_text(bytes(record[topic_at + 1: topic_at + 1 + record[topic_at]]))


# ----------------------------------------------------------------------------------------------
# A client's view of a pulled record: the layout walked, nothing decoded until asked

TOTALSIZE = _I32  # the first field of every record: a reply's records are framed by it
PROPERTIES_LENGTH = _I16
_FIXED_V4_SIZE = _FIXED_V4.size
_V6_FLAGS = FLAG_BORNHOST_V6 | FLAG_STOREHOST_V6
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


# ----------------------------------------------------------------------------------------------
# The send path's one-pass encoders: many messages -> their records back to back, no record
# object or dict a message. Each writes exactly what `encode_v4` writes message by message; each
# returns None for anything unusual, and the caller's general path then refuses with the reason.

# A client's SEND_BATCH_MESSAGE body (RocketMQ's MessageDecoder.encodeMessages): per message
# TOTALSIZE, MAGIC (0), BODYCRC (0), FLAG, BODYLENGTH, BODY, PROPERTIESLENGTH (i16), PROPERTIES.
BATCH_MESSAGE_HEAD = struct.Struct(">iiiii")
BATCH_PROPS_LENGTH = _I16
MAX_MESSAGES_PER_BATCH = 4096


@lru_cache(maxsize=1024)
def topic_bytes(topic: str) -> bytes:
    return topic.encode("utf-8")


@lru_cache(maxsize=1024)
def _topic_part(topic_raw: bytes) -> bytes:
    """TOPICLENGTH (one byte) and the topic, as a V1 record holds them."""
    return bytes((len(topic_raw),)) + topic_raw


def _stored_names(names: tuple[str, ...], cluster: str) -> list[str] | None:
    """The names a coalesced send's properties are stored under, in Java HashMap order: WAIT
    dropped, CLUSTER added (its value is this node's), as the 4.9 broker stores them (§2.7).
    A delayed or timer send arrives with the names the write path added last (`SCHEDULED_TAILS`:
    REAL_TOPIC, REAL_QID, and TIMER_OUT_MS before them), put after CLUSTER as the broker puts
    them. None for names the one-pass encoders leave to the general path (empty, holding a
    separator)."""
    if any(not name or "\x01" in name or "\x02" in name for name in names):
        return None
    tail: tuple[str, ...] = ()
    if PROPERTY_DELAY in names or PROPERTY_TIMER_OUT_MS in names:
        for candidate in SCHEDULED_TAILS:
            if names[-len(candidate):] == candidate:
                names, tail = names[:-len(candidate)], candidate
                break
    stored = [name for name in names if name != PROPERTY_WAIT]
    if PROPERTY_CLUSTER not in stored:
        stored.append(PROPERTY_CLUSTER)
    # a map grows with each put and never shrinks: its most keys at once decide the buckets
    count = max(len(names) + (PROPERTY_CLUSTER not in names), len(stored) + len(tail))
    return hashmap_order(stored + list(tail), 16 if count <= 12 else hashmap_capacity(count))


SCHEDULED_TAILS = ((PROPERTY_TIMER_OUT_MS, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID), (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID))


@lru_cache(maxsize=1024)
def _properties_plan(names: tuple[str, ...], cluster: str) -> tuple[str, tuple[str, ...]] | None:
    """How the Python encoder stores a coalesced send's properties, worked out once per set of
    names (in the message's order): a `str.format` template of the stored text and the names
    whose values fill it, in order. The per-message work is then one format call (~0.7 us a
    message less than ordering and joining each message's pairs)."""
    order = _stored_names(names, cluster)
    if order is None:
        return None
    pieces, filled_by = [], []
    for name in order:
        if name == PROPERTY_CLUSTER:
            pieces.append(_literal(f"{name}\x01{cluster}"))
        else:
            pieces.append(_literal(f"{name}\x01") + "{}")
            filled_by.append(name)
    return "\x02".join(pieces), tuple(filled_by)


@lru_cache(maxsize=1024)
def properties_layout(names: tuple[str, ...], cluster: str) -> tuple | None:
    """`_properties_plan` for the C encoder: the stored text as UTF-8 literals and the names
    whose values go between them, alternating, a literal first and last."""
    order = _stored_names(names, cluster)
    if order is None:
        return None
    layout, literal = [], ""
    for i, name in enumerate(order):
        literal += ("\x02" if i else "") + f"{name}\x01"
        if name == PROPERTY_CLUSTER:
            literal += cluster
        else:
            layout += (literal.encode(), name)
            literal = ""
    layout.append(literal.encode())
    return tuple(layout)


def _literal(text: str) -> str:
    """`text` as literal text of a format template."""
    return text.replace("{", "{{").replace("}", "}}")


def encode_messages_v4_py(messages: list[dict], body: bytes, born: bytes, store_host: bytes, max_body: int,
                          cluster: str) -> tuple | None:
    """A SEND_MESSAGES request's messages (coalesced single sends) as records, for the common
    case: IPv4 hosts, nothing refused by the front, properties an object of non-empty
    strings without separators, every limit kept. Returns (records, sizes, queue keys, topics,
    queue ids, uniq keys, whether any send waits for the flush), or None for the general path.

    The messages' `bodySize`s are checked by the caller to add up to `body`."""
    if len(born) != 8 or len(store_host) != 8:
        return None
    view, at = memoryview(body), 0
    fixed, i16 = _FIXED_V4.pack, _I16.pack
    parts, sizes, queue_keys, topics, queue_ids, uniq_keys = [], [], [], [], [], []
    waits = False  # the request waits for the flush if any of its sends does
    try:
        for item in messages:
            topic, queue_id, size = item["topic"], item["queueId"], item["bodySize"]
            props = item.get("properties")
            props = {} if props is None else props
            flag, reconsume, born_ts = item.get("flag", 0), item.get("reconsumeTimes", 0), item.get("bornTimestamp", 0)
            if (type(props) is not dict or type(queue_id) is not int or type(flag) is not int or type(size) is not int
                    or type(reconsume) is not int or type(born_ts) is not int or "_refused" in item
                    or size > max_body):
                return None
            plan = _properties_plan(tuple(props), cluster)
            if plan is None or "\x02" in "".join(props.values()) or "" in props.values():  # TypeError: not a str
                return None
            topic_raw = topic_bytes(topic)  # TypeError: not a str (unhashable) ...
            if type(topic) is not str or not 0 < len(topic_raw) <= MAX_TOPIC_BYTES:
                return None
            if not waits and props.get(PROPERTY_WAIT) != "false":
                waits = True
            template, filled_by = plan
            props_raw = template.format(*[props[name] for name in filled_by]).encode()
            if len(props_raw) > MAX_PROPERTIES_BYTES:  # (so the record stays within maxMessageSize + 64 KiB)
                return None
            record_size = 91 + size + len(topic_raw) + len(props_raw)
            piece = view[at: at + size]
            parts += (fixed(record_size, MESSAGE_MAGIC, body_crc(piece), queue_id, flag, 0, 0, 0, born_ts, born,
                            0, store_host, reconsume, 0, size),
                      piece, _topic_part(topic_raw), i16(len(props_raw)), props_raw)
            at += size
            sizes.append(record_size)
            queue_keys.append(f"{topic}-{queue_id}")
            topics.append(topic)
            queue_ids.append(queue_id)
            uniq_keys.append(props.get(PROPERTY_UNIQ_KEY))
    except (KeyError, TypeError, AttributeError, struct.error, UnicodeEncodeError):  # struct.error: an int beyond its field
        return None
    return bytearray().join(parts), sizes, queue_keys, topics, queue_ids, uniq_keys, waits


def encode_batch_v4_py(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                       store_host: bytes, suffix: bytes, max_message_size: int,
                       limit: int = MAX_MESSAGES_PER_BATCH) -> tuple[bytearray, list[int], list[str | None]] | None:
    """A client batch body (`BATCH_MESSAGE_HEAD` per message) -> its records back to back, their
    sizes and each message's UNIQ_KEY. The 4.9 broker stores each inner message's own
    properties bytes, then the batch's (`suffix`: header properties plus CLUSTER) after a 0x02.
    None for anything unusual (a malformed body, non-ASCII properties, a limit exceeded)."""
    if not 0 < len(topic_raw) <= MAX_TOPIC_BYTES or not -(2**31) <= queue_id < 2**31:
        return None
    view, end, at = memoryview(data), len(data), 0
    topic_part = bytes((len(topic_raw),)) + topic_raw
    record_base = 91 + len(topic_raw)
    largest = max_message_size + MAX_RECORD_OVERHEAD
    parts, sizes, uniq_keys = [], [], []
    head, i16, fixed = BATCH_MESSAGE_HEAD.unpack_from, BATCH_PROPS_LENGTH, _FIXED_V4.pack
    head_size = BATCH_MESSAGE_HEAD.size
    while at < end:
        if len(sizes) >= limit or end - at < head_size + 2:
            return None
        size, magic, _, flag, body_len = head(data, at)
        props_at = at + head_size + body_len
        if body_len < 0 or props_at + 2 > end or body_len > max_message_size or magic != 0:
            return None
        props_len, = i16.unpack_from(data, props_at)
        if props_len < 0 or size != head_size + body_len + 2 + props_len or at + size > end:
            return None
        own = data[props_at + 2: props_at + 2 + props_len]
        if not own.isascii() or b"DELAY\x01" in own or b"TIMER_" in own:  # (the general path refuses a delay)
            return None
        props = own if not suffix else own + suffix if not own or own.endswith(b"\x02") else own + b"\x02" + suffix
        record_size = record_base + body_len + len(props)
        if len(props) > MAX_PROPERTIES_BYTES or record_size > largest:
            return None
        body = view[at + head_size: props_at]
        parts += (fixed(record_size, MESSAGE_MAGIC, body_crc(body), queue_id, flag, 0,
                        0, 0, born_timestamp, born_host, 0, store_host, 0, 0, body_len),
                  body, topic_part, i16.pack(len(props)), props)
        sizes.append(record_size)
        uniq_keys.append(find_uniq_key_ascii(own))
        at += size
    if not sizes:
        return None
    return bytearray().join(parts), sizes, uniq_keys


def find_uniq_key(properties: str) -> str | None:
    """UNIQ_KEY of a properties string without parsing all of it (the last one wins, as in Java)."""
    at = properties.rfind(PROPERTY_UNIQ_KEY + "\x01")
    if at < 0:
        return None
    if at > 0 and properties[at - 1] != "\x02":  # inside another pair: parse properly
        return parse_properties(properties).get(PROPERTY_UNIQ_KEY)
    end = properties.find("\x02", at)
    value = properties[at + len(PROPERTY_UNIQ_KEY) + 1: end if end >= 0 else None]
    return value or parse_properties(properties).get(PROPERTY_UNIQ_KEY)  # Java skips empty values


def find_uniq_key_ascii(properties: bytes) -> str | None:
    """`find_uniq_key` of ASCII properties bytes, without decoding them when UNIQ_KEY leads the
    string or follows a separator (what clients send)."""
    at = properties.rfind(b"UNIQ_KEY\x01")
    if at < 0:
        return None
    if at == 0 or properties[at - 1] == 2:
        end = properties.find(b"\x02", at)
        value = properties[at + 9: end if end >= 0 else None]
        if value:
            return value.decode("ascii")
    return find_uniq_key(properties.decode("ascii"))  # Java skips an empty value: the full rules


# ----------------------------------------------------------------------------------------------
# The C accelerators (shm/_encode.c), behind the functions the callers use. Built at install
# wherever gcc and the Python headers are; MQNODE_NATIVE=0 chooses the Python twins anywhere.
# tests/unit/test_native_encode.py holds the two to identical bytes for any input, with
# hypothesis. (The dispatcher's scan has its own C twin, shm/_dispatch.c, fused with the
# ConsumeQueue and index work; it stops in front of every record it does not take, and the
# Python scan over `dispatch_fields` takes it.)

try:
    from shm import _encode
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    _encode = None

NATIVE = _encode is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"


def encode_messages_v4_c(messages: list, body: bytes, born: bytes, store_host: bytes, max_body: int,
                         cluster: str) -> tuple | None:
    return _encode.encode_messages_v4(messages, body, born, store_host, max_body, cluster, properties_layout, crc32)


def encode_batch_v4_c(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                      store_host: bytes, suffix: bytes, max_message_size: int,
                      limit: int = MAX_MESSAGES_PER_BATCH) -> tuple | None:
    return _encode.encode_batch_v4(data, topic_raw, queue_id, born_timestamp, born_host, store_host, suffix,
                                   max_message_size, limit, crc32, find_uniq_key_ascii)


def offset_ids_c(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    """`offset_ids_py` for an 8-byte (IPv4) store host; ValueError for an index out of range."""
    return _encode.offset_ids(store_host, physical, indices)


def offset_ids(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    if NATIVE and len(store_host) == 8:
        return _encode.offset_ids(store_host, physical, indices)
    return offset_ids_py(store_host, physical, indices)


encode_messages_v4 = encode_messages_v4_c if NATIVE else encode_messages_v4_py
encode_batch_v4 = encode_batch_v4_c if NATIVE else encode_batch_v4_py

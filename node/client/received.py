"""Consumed messages: the records of a pull (or query) reply, decoded as they are used.

A reply carries raw CommitLog records (spec §2), up to 32 of ~1 KiB. `decode_messages` walks
them and checks each record's layout at once: its size, the body, topic and properties lengths
against that size. A malformed reply therefore fails the pull, never a later attribute access.
The fixed part of an IPv4 record (what nodes write) is unpacked in one call and the body sliced
out; the rest (topic, properties and what derives from them: msgId, tags, keys; the offset
msgId, the hosts as text) is decoded on first use and kept.

Why lazily: decoding every field of every record was ~60% of a draining consumer's CPU (py-spy,
1 KiB bodies). RocketMQ's Java client decodes every field eagerly. A consumer reads the body,
and often the msgId or tags, but rarely the born host or the offset msgId.
A message keeps its reply's bytes alive (one ~32 KiB buffer shared by up to 32 messages).

Records with IPv6 hosts, or any the fast walk does not recognise, go through the full codec
(`shm.codec.decode`) and arrive decoded already. Either way the fields are the same (tests
compare the two).
"""

from __future__ import annotations

import time
from functools import lru_cache

from node.client.producer import SendError
from node.protocol import PROPERTY_REPLY_ARRIVE_TIME
from shm.codec import (
    FIXED_BORN_HOST,
    FIXED_BORN_TS,
    FIXED_PHYSICAL,
    FIXED_QUEUE_ID,
    FIXED_QUEUE_OFFSET,
    FIXED_RECONSUME,
    FIXED_STORE_HOST,
    FIXED_STORE_TS,
    PROPERTIES_LENGTH,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    TOTALSIZE,
    Record,
    decode,
    decode_host,
    lone_uniq_key,
    offset_msg_id,
    parse_properties,
    split_keys,
    walk_records_v4,
    walk_v4,
)

_SIZE_AT = TOTALSIZE.unpack_from
_PROPS_LEN_AT = PROPERTIES_LENGTH.unpack_from

FIELDS = ("topic", "queue_id", "queue_offset", "msg_id", "offset_msg_id", "tags", "keys", "properties", "body",
          "born_timestamp", "store_timestamp", "born_host", "store_host", "reconsume_times")


def _fixed_field(index: int) -> property:
    """A read-only int field: one item of the record's unpacked fixed part."""
    return property(lambda message: message._fixed[index])


class ReceivedMessage:
    """A consumed message with RocketMQ's fields (see `FIELDS`). Read-only. Equal when every
    field is."""

    __slots__ = ("_body", "_buf", "_fixed", "_topic_at", "_props_at", "_topic", "_properties", "_offset_id",
                 "_hosts")

    # -- fixed fields and body: unpacked with the record ----------------------------------------

    queue_id = _fixed_field(FIXED_QUEUE_ID)
    queue_offset = _fixed_field(FIXED_QUEUE_OFFSET)
    born_timestamp = _fixed_field(FIXED_BORN_TS)
    store_timestamp = _fixed_field(FIXED_STORE_TS)
    reconsume_times = _fixed_field(FIXED_RECONSUME)
    commit_log_offset = _fixed_field(FIXED_PHYSICAL)  # the record's physical offset in the CommitLog
    flag = _fixed_field(4)
    sys_flag = _fixed_field(7)

    @property
    def body(self) -> bytes:
        return self._body

    # -- variable fields: decoded on first use, then kept (None until then; the full codec's
    # messages have them all from the start) -------------------------------------------------

    @property
    def topic(self) -> str:
        topic = self._topic
        if topic is None:
            self._topic = topic = _topic_text(self._buf[self._topic_at: self._props_at - 2])
        return topic

    @property
    def properties(self) -> dict[str, str]:
        properties = self._properties
        if properties is None:
            end = self._props_at + _PROPS_LEN_AT(self._buf, self._props_at - 2)[0]
            self._properties = properties = parse_properties(self._buf[self._props_at: end].decode("utf-8"))
        return properties

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        keys = self.properties.get(PROPERTY_KEYS)
        return split_keys(keys) if keys else []

    @property
    def msg_id(self) -> str:
        """The producer's UNIQ_KEY when it set one, else the offset msgId (as RocketMQ's
        MessageClientExt.getMsgId). Found in the properties' bytes without parsing them all when
        the key occurs once (what producers write): consumers that dedupe read it for every
        message."""
        properties = self._properties
        if properties is None:
            uniq = lone_uniq_key(self._buf, self._props_at)
            if uniq is not None:
                return uniq
            properties = self.properties
        return properties.get(PROPERTY_UNIQ_KEY) or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        offset_id = self._offset_id
        if offset_id is None:
            fixed = self._fixed
            self._offset_id = offset_id = offset_msg_id(fixed[FIXED_STORE_HOST], fixed[FIXED_PHYSICAL])
        return offset_id

    @property
    def born_host(self) -> str:
        hosts = self._hosts
        return _host_text(self._fixed[FIXED_BORN_HOST]) if hosts is None else hosts[0]

    @property
    def store_host(self) -> str:
        hosts = self._hosts
        return _host_text(self._fixed[FIXED_STORE_HOST]) if hosts is None else hosts[1]

    # -- as a value ------------------------------------------------------------------------------

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, name) for name in FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReceivedMessage):
            return NotImplemented
        return self.as_tuple() == other.as_tuple()

    __hash__ = None  # properties and keys are mutable, as they were in the NamedTuple

    def __repr__(self) -> str:
        body = self.body
        shown = repr(body[:32]) + (f"...({len(body)} bytes)" if len(body) > 32 else "")
        return (f"ReceivedMessage(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset}, "
                f"msg_id={self.msg_id!r}, tags={self.tags!r}, keys={self.keys!r}, body={shown})")

    def __reduce__(self):
        return _from_fields, self.as_tuple()

    def to_json(self) -> dict:
        out = {"topic": self.topic, "queueId": self.queue_id, "queueOffset": self.queue_offset, "msgId": self.msg_id,
               "offsetMsgId": self.offset_msg_id, "tags": self.tags, "keys": self.keys,
               "properties": self.properties, "bornTimestamp": self.born_timestamp,
               "storeTimestamp": self.store_timestamp}
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            out["bodyBase64"] = base64.b64encode(self.body).decode("ascii")
        return out


_new = object.__new__


def decode_messages(body: bytes | None, cls: type = None) -> list[ReceivedMessage]:
    """The records of a reply, in order, as `cls` (ReceivedMessage or a subclass); raises
    SendError("SYSTEM_ERROR") when its bytes are not a run of whole, well-formed records."""
    buf = bytes(body or b"")
    cls = cls or ReceivedMessage
    try:
        walked, left = walk_records_v4(buf)
    except ValueError:
        walked, left = (), True  # (the walk below names what is wrong)
    if not left:  # every record walked in one call (IPv4 hosts, magic V1: the common case)
        return [_walked(cls, buf, fixed, body_at, topic_at, props_at) for fixed, body_at, topic_at, props_at, _ in walked]
    out: list[ReceivedMessage] = []
    at, end = 0, len(buf)
    while at < end:
        if at + 4 > end:
            raise SendError("SYSTEM_ERROR", f"{end - at} stray bytes after the last record of the reply")
        size = _SIZE_AT(buf, at)[0]
        if size <= 0 or at + size > end:
            raise SendError("SYSTEM_ERROR", f"record at byte {at} of the reply has size {size}")
        message = _walk_v4(buf, at, size, cls)
        out.append(message or _decode_full(buf[at: at + size], cls))
        at += size
    return out


def _walk_v4(buf: bytes, at: int, size: int, cls: type) -> ReceivedMessage | None:
    """A message over an IPv4 record the codec walked (`walk_v4`); None for anything else."""
    walked = walk_v4(buf, at, size)
    if walked is None:
        return None
    return _walked(cls, buf, *walked)


def _walked(cls: type, buf: bytes, fixed: tuple, body_at: int, topic_at: int, props_at: int) -> ReceivedMessage:
    """A message over a walked record of `buf`: its body cut out, the rest decoded when asked."""
    message = _new(cls)
    message._body = buf[body_at: body_at + fixed[14]]  # the one field every consumer reads
    (message._buf, message._fixed, message._topic_at, message._props_at, message._topic, message._properties,
     message._offset_id, message._hosts) = buf, fixed, topic_at, props_at, None, None, None, None
    return message


def _decode_full(raw: bytes, cls: type = None) -> ReceivedMessage:
    record = decode(raw, check_crc=False)
    if not isinstance(record, Record):
        raise SendError("SYSTEM_ERROR", f"undecodable record in a reply: {record}")
    message = _from_fields(record.topic, record.queue_id, record.queue_offset, None, record.msg_id, None, None,
                           dict(record.properties), record.body, record.born_timestamp, record.store_timestamp,
                           str(record.born_host), str(record.store_host), record.reconsume_times)
    fixed = list(message._fixed)  # the fields a walked record has too (flag, sysFlag, physical offset)
    fixed[4], fixed[FIXED_PHYSICAL], fixed[7] = record.flag, record.physical_offset, record.sys_flag
    message._fixed = tuple(fixed)
    if cls is not None and cls is not ReceivedMessage:  # (a subclass adds slots: a copy of its own)
        copy = _new(cls)
        for name in ReceivedMessage.__slots__:
            if hasattr(message, name):
                setattr(copy, name, getattr(message, name))
        message = copy
    return message


class PoppedMessage(ReceivedMessage):
    """A message a pop handed out (node.client.pop): `receipt_handle` acks it or changes its
    invisible time while it is invisible to the group; `reconsume_times` counts the times it
    was handed out before this one."""

    __slots__ = ("receipt_handle", "consumer_group")

    def __repr__(self) -> str:
        return f"Popped{super().__repr__()[:-1]}, reconsume_times={self.reconsume_times}, receipt_handle={self.receipt_handle!r})"

    def to_json(self) -> dict:
        return super().to_json() | {"reconsumeTimes": self.reconsume_times, "receiptHandle": self.receipt_handle}


def popped(body: bytes | None, handles: list[str], reconsume: list[int], group: str) -> list[PoppedMessage]:
    """The messages of a pop's reply, each with what the reply says of it."""
    messages = decode_messages(body, PoppedMessage)
    if len(handles) != len(messages) or len(reconsume) != len(messages):
        raise SendError("SYSTEM_ERROR", f"a pop's reply has {len(messages)} messages, {len(handles)} receipt handles "
                                        f"and {len(reconsume)} reconsume times")
    for message, handle, times in zip(messages, handles, reconsume):
        fixed = message._fixed
        if fixed[FIXED_RECONSUME] != times:  # (the node counts the deliveries)
            message._fixed = (*fixed[:FIXED_RECONSUME], times, *fixed[FIXED_RECONSUME + 1:])
        message.receipt_handle, message.consumer_group = handle, group
    return messages


def _from_fields(topic, queue_id, queue_offset, _msg_id, offset_msg_id, _tags, _keys, properties, body,
                 born_timestamp, store_timestamp, born_host, store_host, reconsume_times) -> ReceivedMessage:
    """A message from decoded fields (the full codec's, or unpickling). msg_id, tags and keys
    derive from the properties, as they do for a walked record."""
    message = _new(ReceivedMessage)
    message._fixed = (0, 0, 0, queue_id, 0, queue_offset, 0, 0, born_timestamp, None, store_timestamp, None,
                      reconsume_times, 0, len(body))
    message._body, message._buf, message._topic, message._properties, message._offset_id, message._hosts = (
        body, b"", topic, properties, offset_msg_id, (born_host, store_host))
    return message


def pushed_reply(header: dict, body: bytes) -> ReceivedMessage:
    """A reply the node pushed to its requester (PUSH_REPLY_MESSAGE_TO_CLIENT: actors.replies), as
    RocketMQ's client makes it: the header's fields, ARRIVE_TIME added to its properties. Not
    stored when pushed: no queue offset or offset msgId."""
    properties = dict(header.get("properties") or {})
    properties[PROPERTY_REPLY_ARRIVE_TIME] = str(int(time.time() * 1000))
    return _from_fields(header.get("topic", ""), header.get("queueId", 0), 0, None, "", None, None, properties, body,
                        header.get("bornTimestamp", 0), header.get("storeTimestamp", 0), header.get("bornHost", ""),
                        header.get("storeHost", ""), header.get("reconsumeTimes", 0))


@lru_cache(maxsize=1024)
def _topic_text(raw: bytes) -> str:
    """A reply's records share a topic: its name is decoded once, not once a message."""
    return raw.decode("utf-8")


@lru_cache(maxsize=1024)
def _host_text(raw: bytes) -> str:
    return str(decode_host(raw))


def retopic(message: ReceivedMessage, topic: str) -> None:
    """Show `message` under `topic`: a retry's original topic (RETRY_TOPIC), as RocketMQ's
    consumer does before its listener sees it."""
    message._topic = topic

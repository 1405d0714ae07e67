"""A message to send, as the producer's callers build it (`node.client.Message`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from node import protocol
from shm.codec import (
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
)


@dataclass(slots=True)
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: list[str] | str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0
    wait: bool = True
    deliver_at_ms: int | None = None  # a timer: deliver at this epoch ms (TIMER_DELIVER_MS)
    delay_ms: int | None = None  # a timer: deliver this many ms after the send (TIMER_DELAY_MS)

    def __post_init__(self) -> None:
        if type(self.body) is not bytes:  # (a str as UTF-8, as send takes it; a batch encodes bytes only)
            self.body = body_bytes(self.body)
        if self.flag and not (type(self.flag) is int and -2**31 <= self.flag < 2**31):  # (struct's error in a batch)
            raise ValueError(f"a message's flag is a 32-bit integer, not {self.flag!r}")
        if self.deliver_at_ms is not None or self.delay_ms is not None:  # (a timer: most messages are none)
            for name in ("deliver_at_ms", "delay_ms"):  # (a str was "unsupported operand type(s) for +" in send)
                value = getattr(self, name)
                if value is not None and type(value) is not int:
                    raise TypeError(f"{name} is an int of milliseconds, not {type(value).__name__}")

    def wire_properties(self, uniq_key: str) -> dict[str, str]:
        """The properties the node stores: the user's, then the fields'. TypeError or ValueError for
        what the properties string cannot carry: a batch sends it as one string, where a `\x02` in a
        value began a property of its own ("x\x02TAGS\x01y" set the message's tags) and a value not
        a str was stored as its str() ("None"); an empty name or value, which RocketMQ's parser drops
        (its Message.putUserProperty refuses them too)."""
        props = _checked_properties(self.properties) if self.properties else {}
        if self.tags:
            props[PROPERTY_TAGS] = _checked_value("tags", self.tags)
        if self.keys:
            props[PROPERTY_KEYS] = _keys_text(self.keys)
        if self.delay_level:
            props[PROPERTY_DELAY] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_at_ms)
        if self.delay_ms is not None:
            props[PROPERTY_TIMER_DELAY_MS] = str(self.delay_ms)
        if not self.wait:
            props[PROPERTY_WAIT] = "false"
        props.setdefault(PROPERTY_UNIQ_KEY, uniq_key)
        return props

    def wire_properties_string(self, uniq_key: str) -> str:
        """`wire_properties` as the properties string; a plain message (no tags, keys, user
        properties but its UNIQ_KEY, delay or WAIT) skips the dict: batches are mostly such messages."""
        properties = self.properties
        if ((properties and (len(properties) > 1 or PROPERTY_UNIQ_KEY not in properties)) or self.tags or self.keys
                or self.delay_level or not self.wait or self.deliver_at_ms is not None or self.delay_ms is not None):
            return _props_string(self.wire_properties(uniq_key))
        return f"{PROPERTY_UNIQ_KEY}\x01{properties.get(PROPERTY_UNIQ_KEY, uniq_key) if properties else uniq_key}"


def create_reply(request, body: bytes | str, *, properties: dict[str, str] | None = None) -> Message:
    """The reply to a request-reply message (RocketMQ's MessageUtil.createReplyMessage): to the
    reply topic of the cluster that stored the request, carrying its CORRELATION_ID, REPLY_TO_CLIENT
    and TTL, MSG_TYPE "reply". `request` is a consumed message (its `properties`). ValueError for a
    message that is no request (no REPLY_TO_CLIENT) or whose node added no CLUSTER."""
    asked = request.properties
    cluster, requester = asked.get(PROPERTY_CLUSTER), asked.get(protocol.PROPERTY_REPLY_TO_CLIENT)
    if not requester:
        raise ValueError(f"create reply message fail: the message has no {protocol.PROPERTY_REPLY_TO_CLIENT} (no request)")
    if not cluster:
        raise ValueError(f"create reply message fail, requestMessage error, property[{PROPERTY_CLUSTER}] is null.")
    props = dict(properties or {})
    props.update({protocol.PROPERTY_MESSAGE_TYPE: protocol.REPLY_MESSAGE_FLAG, protocol.PROPERTY_REPLY_TO_CLIENT: requester})
    for name in (protocol.PROPERTY_CORRELATION_ID, protocol.PROPERTY_MESSAGE_TTL):  # (as Java's: none where the request had none)
        if asked.get(name):
            props[name] = asked[name]
    return Message(protocol.reply_topic(cluster), body_bytes(body), properties=props)


def _checked_properties(properties: dict[str, str]) -> dict[str, str]:
    for name, value in properties.items():
        if not isinstance(name, str):
            raise TypeError(f"property name {name!r} must be a str, not {type(name).__name__}")
        if not name or "\x01" in name or "\x02" in name:
            raise ValueError(f"property name {name!r}: a name is a non-empty str without \\x01 or \\x02 (the separators)")
        _checked_value(f"property {name!r}", value)
    return dict(properties)


def _checked_value(what: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} is empty: a message stores no empty value")
    if "\x02" in value:
        raise ValueError(f"{what} {value!r} holds \\x02, the properties' separator")
    return value


def _keys_text(keys) -> str:
    """`keys` (one str of space-separated keys, or an iterable of str) as the KEYS property."""
    if isinstance(keys, str):
        return _checked_value("keys", keys)
    if not isinstance(keys, Collection) or not all(isinstance(key, str) for key in keys):  # (sent again on a retry)
        raise TypeError(f"keys are a str or a list of str, not {keys!r}"[:200])
    return _checked_value("keys", " ".join(keys))


def _props_string(props: dict[str, str]) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items())


def body_bytes(body: bytes | bytearray | memoryview | str) -> bytes:
    """A message's body as bytes: a str as UTF-8. Anything else is refused: bytes(123) would be
    123 zero bytes, stored and delivered as if meant."""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body)
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")

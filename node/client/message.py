"""A message to send, as the producer's callers build it (`node.client.Message`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shm.codec import (
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

    def wire_properties(self, uniq_key: str) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
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


def _props_string(props: dict[str, str]) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items())

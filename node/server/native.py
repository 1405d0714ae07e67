"""The front's encode loops and its replies' offset msgIds in C (`node/server/_encode.c`), when they were
compiled at install.

`ENABLED` is False where no compiler was at hand (the extension is optional in pyproject.toml)
or when `MQNODE_NATIVE=0` is set, to measure or debug the Python loops. Either way the bytes
are the same: tests/unit/test_native_encode.py holds the two to each other, and the SendEncoder
tests in tests/unit/test_protocol.py run over both.
"""

from __future__ import annotations

import os

from node.server.batchbody import find_uniq_key_ascii
from shm.codec import crc32

try:
    from node.server import _encode
except ImportError:  # pragma: no cover - built wherever gcc and the Python headers are
    _encode = None

ENABLED = _encode is not None and os.environ.get("MQNODE_NATIVE", "1") != "0"


def encode_messages_v4(messages: list, body: bytes, born: bytes, store_host: bytes, max_body: int, cluster: str,
                       layout) -> tuple | None:
    """`node.server.sendcore.encode_messages_v4` in C; `layout` is `sendcore._properties_layout`."""
    return _encode.encode_messages_v4(messages, body, born, store_host, max_body, cluster, layout, crc32)


def encode_batch_v4(data: bytes, topic_raw: bytes, queue_id: int, born_timestamp: int, born_host: bytes,
                    store_host: bytes, suffix: bytes, max_message_size: int, limit: int) -> tuple | None:
    """`node.server.batchbody.encode_batch_v4` in C."""
    return _encode.encode_batch_v4(data, topic_raw, queue_id, born_timestamp, born_host, store_host, suffix,
                                   max_message_size, limit, crc32, find_uniq_key_ascii)


def offset_ids(store_host: bytes, physical: list[int], indices: list[int]) -> list[str]:
    """`node.server.sendreply.offset_ids` in C, for an IPv4 (8-byte) store host."""
    return _encode.offset_ids(store_host, physical, indices)

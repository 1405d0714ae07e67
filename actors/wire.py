"""The internal wire: every frame that passes between the processes of one node, in one place.

Clients speak docs/protocol.md (node.protocol); inside a node the services pass these frames
over ipc sockets in the run directory. None of them is a contract with anything outside the
node: a process only ever talks to processes of the same version. Each format is a pair of
pure functions (no sockets), and `tests/unit/test_protocol.py` round-trips them.

| frame | from → to | format |
| --- | --- | --- |
| a turn's sends | front → ingress / writer (ring `front-to-*`, actors.links) | `join_frames` of the sends' 4 frames each (below) |
| joined replies | ingress, writer, flush, pull, pop, transaction (rings `*-to-front`; a reply too large for a ring message: the front's `replies` socket) → front | per reply: u8 client-id length, i64 arrival ns (negated for replies to reads, which the front neither counts in flight nor times as puts; SERVICE_SEND for the pop or transaction service's own send, a re-put from its pseudo-client, which the front serves), u32 header length, u32 body length, id, header, body (`pack_replies`) |
| a send to encode | front → ingress / writer, within a turn's sends | 4 frames: client id, `{"t": arrival ns, "refused"?: {index: [status, remark]}}` (`send_meta`), the request header as the client sent it, its body |
| a read to serve | front → pull, pop, transaction (rings `front-to-pull-i`, `front-to-pop`, `front-to-transaction`) | one message: u8 client-id length, i64 arrival ns, id, the request header as JSON (as the router completed it, for pop) (`read_to_wire`); to pop and transaction also the answers to their re-puts, the service's pseudo-client as the id |
| an encoded group | ingress → writer (ring `ingress-i-to-writer`, `join_frames`) | 2 frames: JSON `{sizes, keys, stamps, atomic, pendings}`, the records back to back (`group_to_wire`) |
| held SYNC_FLUSH / SYNC_MASTER sends | writer → flush (ring `writer-to-flush`) | one JSON message: `[[client hex, arrival ns, offset to flush, reply header, offset to replicate], ...]` (0: no wait) (`waits_to_wire`) |
| "written moved" | writer → dispatcher | an empty frame on a conflated socket |
| "queue grew" | dispatcher → readers (PUB) | a reader's address (one byte: its watcher slot), then JSON `[[topic, queueId, new max offset], ...]` (`arrivals_to_wire`) |
| statistics | every process → front | JSON of its `statistics()`, once a second |
| "flushed" | flush thread → front (inproc) | an empty frame: look at `flushed` |
"""

from __future__ import annotations

import struct

import orjson

from actors.sendcore import PendingSend
from shm.encoded_batch import EncodedBatch
from shm.invariant import invariant

_REPLY_HEAD = struct.Struct(">BqII")
_READ_HEAD = struct.Struct("<Bq")
_FRAME_LENGTH = struct.Struct("<I")


def join_frames(messages: list[list[bytes]]) -> list[bytes]:
    """Several multi-frame messages as the parts of one ring message: each frame prefixed by its
    u32 length (the receiver knows how many frames a message has)."""
    parts = []
    for frames in messages:
        for frame in frames:
            parts += [_FRAME_LENGTH.pack(len(frame)), frame]
    return parts


def split_frames(data: bytes, per: int) -> list[list[bytes]]:
    """`join_frames`' messages back, `per` frames each. Our own bytes: a length that runs past
    the end is a bug, and stops the process."""
    out, frames, at, end = [], [], 0, len(data)
    while at < end:
        (size,) = _FRAME_LENGTH.unpack_from(data, at)
        at += 4
        invariant(at + size <= end, "a frame runs past its ring message")
        frames.append(data[at: at + size])
        at += size
        if len(frames) == per:
            out.append(frames)
            frames = []
    invariant(not frames, "a ring message ends inside a message")
    return out


SERVICE_SEND = -(1 << 63)  # a reply's arrival that marks it as a service's own send to the front (a re-put, from
# its pseudo-client), not an answer to pass on: those carry a send's arrival, or a read's negated (never this)


def pack_replies(replies: list[tuple]) -> bytes:
    """(client, arrival ns, header) or (client, arrival ns, header, body) per reply; a body may
    be a list of parts (a pop's records: joined once, here, not once more before)."""
    parts = []
    for reply in replies:
        client, arrival_ns, header = reply[0], reply[1], reply[2]
        body = reply[3] if len(reply) > 3 else b""
        if body.__class__ is list:
            parts += [_REPLY_HEAD.pack(len(client), arrival_ns, len(header), sum(map(len, body))), client, header]
            parts += body
        else:
            parts += [_REPLY_HEAD.pack(len(client), arrival_ns, len(header), len(body)), client, header, body]
    return b"".join(parts)


def unpack_replies(data: bytes) -> list[tuple[bytes, int, bytes, bytes]]:
    """`pack_replies`' tuples back. Our own bytes: a reply that runs past the end is a bug, and
    stops the process (a slice would cut its body short in silence)."""
    out, at, size = [], 0, _REPLY_HEAD.size
    while at < len(data):
        id_len, arrival_ns, header_len, body_len = _REPLY_HEAD.unpack_from(data, at)
        at += size
        header_at = at + id_len
        body_at = header_at + header_len
        invariant(body_at + body_len <= len(data), "a reply runs past its ring message")
        out.append((data[at: header_at], arrival_ns, data[header_at: body_at], data[body_at: body_at + body_len]))
        at = body_at + body_len
    return out


def reply_size(reply: tuple) -> int:
    """The bytes `pack_replies` makes of one reply."""
    body = reply[3] if len(reply) > 3 else b""
    size = sum(map(len, body)) if body.__class__ is list else len(body)
    return _REPLY_HEAD.size + len(reply[0]) + len(reply[2]) + size


def read_to_wire(read: tuple) -> list[bytes]:
    """A read the front passes on, (header, client, arrival ns, header as JSON), as a ring
    message's parts."""
    _, client, arrival_ns, header_raw = read
    return [_READ_HEAD.pack(len(client), arrival_ns), client, header_raw]


def read_size(client: bytes, header_raw: bytes) -> int:
    return _READ_HEAD.size + len(client) + len(header_raw)


def read_from_wire(message: bytes) -> tuple[dict, bytes, int]:
    """`read_to_wire`'s message -> (header, client, arrival ns). The front's own bytes: one
    that does not parse is a bug, and stops the process."""
    id_length, arrival_ns = _READ_HEAD.unpack_from(message)
    at = _READ_HEAD.size + id_length
    return orjson.loads(memoryview(message)[at:]), message[_READ_HEAD.size: at], arrival_ns


def send_meta(arrival_ns: int, refused: dict | None = None) -> dict:
    """What the front adds to a send it passes on: when it arrived, and which of its messages
    the topic table refused (by index, as text)."""
    return {"t": arrival_ns, "refused": refused} if refused else {"t": arrival_ns}


def read_meta(arrival_ns: int) -> bytes:
    return orjson.dumps({"t": arrival_ns})


def group_to_wire(batch: EncodedBatch, pendings: list[PendingSend], atomic: bool) -> list[bytes]:
    meta = {"sizes": batch.sizes, "keys": batch.queue_keys, "stamps": batch.timestamp_offsets, "atomic": atomic,
            "pendings": [p.to_wire() for p in pendings]}
    return [orjson.dumps(meta), bytes(batch.data)]


def group_from_wire(frames: list[bytes]) -> tuple[EncodedBatch, list[PendingSend], bool]:
    meta = orjson.loads(frames[0])
    batch = EncodedBatch()
    batch.data = bytearray(frames[1])
    batch.sizes, batch.queue_keys, batch.timestamp_offsets = meta["sizes"], meta["keys"], meta["stamps"]
    position, positions = 0, []
    for size in batch.sizes:
        positions.append(position)
        position += size
    invariant(position == len(batch.data), "record sizes must add up to the batch")
    batch.positions = positions
    return batch, [PendingSend.from_wire(p) for p in meta["pendings"]], meta["atomic"]


def waits_to_wire(waits: list[tuple]) -> bytes:
    """The writer process's held sends, to the flush actor (one JSON frame a turn)."""
    return orjson.dumps([[client.hex(), arrival_ns, offset, header.decode(), replicate]
                         for client, arrival_ns, offset, header, replicate in waits])


def waits_from_wire(frame: bytes) -> list[tuple]:
    return [(bytes.fromhex(client), arrival_ns, offset, header.encode(), replicate)
            for client, arrival_ns, offset, header, replicate in orjson.loads(frame)]


ARRIVALS_TO_ALL = 255  # the address every reader also subscribes to (no watcher slot has it)


def arrivals_to_wire(touched: dict[tuple[str, int], int], readers: list[int]) -> list[bytes]:
    """One frame a reader: its address (a watcher slot's number, the one byte its SUB subscribes
    to: the PUB sends nothing to a reader not addressed), then the JSON."""
    body = orjson.dumps([[topic, queue_id, max_offset] for (topic, queue_id), max_offset in touched.items()])
    return [bytes((reader,)) + body for reader in readers]


def arrivals_subscriptions(watcher: int) -> list[bytes]:
    return [bytes((watcher,)), bytes((ARRIVALS_TO_ALL,))]


def arrivals_from_wire(frame: bytes) -> list[tuple[str, int, int]]:
    return [(topic, queue_id, max_offset) for topic, queue_id, max_offset in orjson.loads(memoryview(frame)[1:])]

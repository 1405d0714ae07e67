"""ingress: validates and encodes send requests into CommitLog records, in batches.

Sockets: `requests` PULL (connected to the front's `ingress`), `records` PUSH (connected to the
writer), `replies` PUSH (refusals it answers itself: a request that waited in the send queue
longer than `waitTimeMillsInSendQueue`, or one that does not parse).

Several workers run side by side (`ingressWorkers`); each turns up to MAX_REQUESTS requests
into one EncodedBatch and ships it to the append writer as two frames: the records, and a JSON
list saying whose they are. A client's SEND_BATCH_MESSAGE travels alone, flagged atomic, so the
writer keeps it in one segment as RocketMQ does.
"""

from __future__ import annotations

import time

import orjson
import zmq

from actors.base import Actor, incoming, socket, wait_readable
from actors.wire import group_to_wire, pack_replies
from node import protocol
from node.client.frames import send_frames
from node.server.sendcore import PendingSend, SendEncoder, add_request_atomic
from shm.encoded_batch import EncodedBatch

MAX_REQUESTS = 256  # requests folded into one batch
MAX_RECORDS = 4096


class RequestBatcher:
    """Requests from the front -> (batch, pendings, atomic) groups plus replies for refusals.
    Shared by the ingress worker and by the writer when it encodes for itself."""

    def __init__(self, settings):
        self.settings = settings
        self.encoder = SendEncoder(settings)
        self.max_wait_ns = settings.waitTimeMillsInSendQueue * 1_000_000
        self.fast_fail = settings.brokerFastFailureEnable
        self.expired = self.malformed = 0

    def build(self, messages: list[list]) -> tuple[list[tuple[EncodedBatch, list[PendingSend], bool]], list]:
        """[client, meta, header, body] per request, meta and header as JSON frames or as the
        dicts a writing front parsed -> (batch, pendings, atomic) groups and refusals' replies."""
        groups, replies = [], []
        batch, pendings = EncodedBatch(), []
        now = time.monotonic_ns()
        for frames in messages:
            try:
                client, meta, header, body = frames
                # from a socket, JSON; from a front that writes, the dicts it already parsed
                # (parsing a coalesced request's header again cost ~0.4 us a message)
                if type(meta) is not dict:
                    meta, header = orjson.loads(meta), orjson.loads(header)
            except (ValueError, orjson.JSONDecodeError):
                self.malformed += 1  # not from the front: nobody to answer
                continue
            pending = PendingSend(client, header.get("opaque"), header["code"], meta["t"])
            pending.oneway = bool(header.get("oneway", False))
            if self.fast_fail and now - pending.arrival_ns > self.max_wait_ns:
                self.expired += 1
                self._refuse_all(pending, header, replies, "SYSTEM_BUSY",
                                 f"[TIMEOUT_CLEAN_QUEUE]broker busy, waited {(now - pending.arrival_ns) // 1_000_000} ms "
                                 f"in the send queue (waitTimeMillsInSendQueue {self.settings.waitTimeMillsInSendQueue})")
                continue
            for index, refusal in (meta.get("refused") or {}).items():
                header["messages"][int(index)]["_refused"] = refusal
            atomic = pending.code == protocol.SEND_BATCH_MESSAGE
            if atomic and pendings:
                groups.append((batch, pendings, False))
                batch, pendings = EncodedBatch(), []
            try:
                add_request_atomic(self.encoder, pending, header, body, self.encoder.born_host(header.get("bornHost")),
                                   batch)
            except protocol.ProtocolError as e:  # the client's bytes; anything else is a bug and stops us
                self.malformed += 1
                self._refuse_all(pending, header, replies, "SYSTEM_ERROR", f"malformed send request: {e}")
                continue
            pendings.append(pending)
            if atomic or len(batch) >= MAX_RECORDS:
                groups.append((batch, pendings, atomic))
                batch, pendings = EncodedBatch(), []
        if pendings:
            groups.append((batch, pendings, False))
        return groups, replies

    @staticmethod
    def _refuse_all(pending: PendingSend, header: dict, replies: list, status: str, remark: str) -> None:
        if pending.oneway:
            return
        if pending.code == protocol.SEND_MESSAGES:
            count = len(header.get("messages") or [])
            reply = protocol.reply_header(pending.opaque, status, remark, results=[{"status": status, "remark": remark}] * count)
        else:
            reply = protocol.reply_header(pending.opaque, status, remark)
        replies.append((pending.client, pending.arrival_ns, orjson.dumps(reply)))


class Ingress(Actor):
    name = "ingress"

    def open(self) -> None:
        self.batcher = RequestBatcher(self.settings)
        self.requests = socket(self.context, zmq.PULL, hwm=self.settings.sendQueueCapacity)
        self.requests.connect(self.endpoints["ingress"])
        self.records = socket(self.context, zmq.PUSH, hwm=1000)
        self.records.connect(self.endpoints["writer"])
        self.replies = socket(self.context, zmq.PUSH, hwm=100000)
        self.replies.connect(self.endpoints["replies"])
        self.batches = self.encoded = 0
        self.poll_items = [(self.requests, zmq.POLLIN)]

    def turn(self) -> None:
        if not wait_readable(self.poll_items, 50):
            return
        messages = list(incoming(self.requests, MAX_REQUESTS))
        groups, replies = self.batcher.build(messages)
        if replies:
            self.replies.send(pack_replies(replies))
        for group in groups:
            send_frames(self.records, group_to_wire(*group))
            self.batches += 1
            self.encoded += len(group[0])

    def statistics(self) -> dict:
        return super().statistics() | {"batches": self.batches, "recordsEncoded": self.encoded,
                                       "nativeEncode": self.batcher.encoder.native,
                                       "expired": self.batcher.expired, "malformed": self.batcher.malformed}

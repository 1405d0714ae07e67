"""ingress: validates and encodes send requests into CommitLog records, in batches.

Links (actors.links, rings in shared memory): in, the front's sends; out, encoded groups to the
writer and the replies to the sends it refuses itself (a request that waited in the send queue
longer than `waitTimeMillsInSendQueue`, or one that does not parse) to the front.

Several workers run side by side (`ingressWorkers`); the front hands each a turn's sends in
turn; each encodes them into EncodedBatch groups of up to MAX_RECORDS and ships each to the
append writer as two frames: a JSON list saying whose they are, and the records. A client's SEND_BATCH_MESSAGE travels alone, flagged atomic, so the
writer keeps it in one segment as RocketMQ does.
"""

from __future__ import annotations

import time

import orjson

from actors.base import Actor
from actors.links import Inbox, Outbox, inbox, outbox
from actors.wire import group_to_wire, join_frames, pack_replies, split_frames
from node import protocol
from actors.sendcore import PendingSend, SendEncoder, add_request_atomic
from shm.encoded_batch import EncodedBatch

MAX_RECORDS = 4096
MAX_GROUP_BYTES = 1 << 20  # a group closes past this (one request may exceed it alone): ring messages stay small


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
            if atomic or len(batch) >= MAX_RECORDS or len(batch.data) >= MAX_GROUP_BYTES:
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

    def __init__(self, settings, *, instance: int = 0):
        super().__init__(settings, instance=instance)
        self.batcher = RequestBatcher(settings)
        self.batches = self.encoded = 0
        self.inbox: Inbox | None = None
        self.records: Outbox | None = None
        self.replies: Outbox | None = None

    def open(self) -> None:
        self.inbox = inbox(self, lambda joined: split_frames(joined, 4))  # the router's sends
        self.records = outbox(self, f"{self.label}-to-writer", lambda group: join_frames([group_to_wire(*group)]))
        self.replies = outbox(self, f"{self.label}-to-front", lambda replies: [pack_replies(replies)])
        self.items = self.inbox.poll_items()

    def poll_items(self) -> list:
        return self.items

    def timeout_ms(self) -> int:
        return self.inbox.wait_ms(50)

    def step(self, events: set) -> None:
        messages = []
        for requests in self.inbox.take():
            messages += requests
        if not messages:
            return
        groups, replies = self.batcher.build(messages)
        if replies:
            self.replies.send_waiting(replies)
        for group in groups:
            self.records.send_waiting(group)
            self.batches += 1
            self.encoded += len(group[0])

    def statistics(self) -> dict:
        return super().statistics() | {"batches": self.batches, "recordsEncoded": self.encoded,
                                       "nativeEncode": self.batcher.encoder.native,
                                       "expired": self.batcher.expired, "malformed": self.batcher.malformed}

    def close(self) -> None:
        for end in (self.inbox, self.records, self.replies):
            if end is not None:
                end.close()
        super().close()

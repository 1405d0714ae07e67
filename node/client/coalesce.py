"""Coalescing: an AsyncProducer's concurrent single sends leave as one SEND_MESSAGES frame, and its
one reply settles each (a result, a retry with the same UNIQ_KEY, or the error left after the
retries). A mixin of node.client.producer.AsyncProducer, whose `__init__` makes the fields used
here: `queued`, `flush_handle`, `max_coalesce`, `linger`, `coalesced_in_flight`, `connection`,
`opaque`, `waiting`, `timeout`, `signs`, `credentials`, `retries`, `broker`.
"""

from __future__ import annotations

import asyncio
import time

import orjson

from node import protocol
from node.client.errors import SendError
from node.client.results import SendResult

# ZeroMQ takes no request while the queue to the node is full or no connection is up (a node not
# started, or a CURVE handshake it refused: a plaintext client, a wrong server key, a client key
# not in its allow-list)
NOT_TAKEN = "the connection took no request: its send queue is full, or no connection to the node is up"

# A send waiting for the next SEND_MESSAGES frame: its header entry, body, future and attempt.
Queued = tuple[dict, bytes, asyncio.Future, int]


def backoff(attempt: int) -> float:
    """Seconds before retrying a busy answer (a send, a send-back): 10, 40, 160 ms, ..."""
    return 0.01 * 4 ** attempt


class Coalescing:
    """The coalescing half of AsyncProducer (the module's docstring)."""

    def _coalesce(self, entry: dict, body: bytes, future: asyncio.Future | None = None,
                  attempt: int = 0) -> asyncio.Future:
        """Queue one send for the next SEND_MESSAGES frame. Its future gets the SendResult, or the
        SendError left after the retries (`_settle`). A sender awaits this future itself: each
        coroutine frame between them would be resumed again for every reply, and the retries
        run from the reply's callback instead (the client's CPU a send, docs/performance.md)."""
        loop = asyncio.get_running_loop()
        if self.connection is not None and self.connection.loop is not loop:  # (a loop after its connection's: node.client.producer)
            self.opened()
        if future is None:
            future = loop.create_future()
        self.queued.append((entry, body, future, attempt))
        if len(self.queued) >= self.max_coalesce:
            self._flush_queued()
        elif self.flush_handle is None:
            # Linger only behind a coalesced request still in flight: with none, waiting buys
            # nothing, and the sends made in this turn of the loop (say, 64 senders woken by one
            # reply) still leave together at its end.
            self.flush_handle = loop.call_later(self.linger, self._flush_queued) \
                if self.linger > 0 and self.coalesced_in_flight else loop.call_soon(self._flush_queued)
        return future

    def _flush_queued(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None
        queued, self.queued = self.queued, []
        if self.connection is None:  # closed meanwhile (a retry waking from its backoff): never hang
            for _, _, future, _ in queued:
                if not future.done():
                    future.set_exception(SendError("CLOSED", "the producer was closed"))
            return
        if not queued:
            return
        opaque = next(self.opaque)
        self.coalesced_in_flight += 1
        self.waiting[opaque] = (queued, time.monotonic() + self.timeout)
        header = {"code": protocol.SEND_MESSAGES, "opaque": opaque, "compact": True, "messages": [q[0] for q in queued]}
        body = b"".join(q[1] for q in queued)
        if self.signs:
            self.credentials.sign(header, body)
        if not self.connection.send([orjson.dumps(header), body]):
            del self.waiting[opaque]
            self._finish(queued, None, SendError("SYSTEM_BUSY", NOT_TAKEN))

    def _finish(self, waiter: asyncio.Future | list[Queued], reply: tuple | None, error: BaseException | None) -> None:
        """A reply (header, body), or the error in its place, to what waited for it. Coalesced
        sends get theirs in this very callback: through a future for the whole request, each
        reply took one more turn of the loop before any sender heard of it (~25 µs of a lone
        send's ack latency here, docs/performance.md)."""
        if isinstance(waiter, list):
            self.coalesced_in_flight -= 1
            self._spread(waiter, None if reply is None else reply[0], error)
        elif not waiter.done():  # its caller gave up (cancelled)
            if error is None:
                waiter.set_result(reply)
            else:
                waiter.set_exception(error)

    def _spread(self, queued: list[Queued], header: dict | None, error: BaseException | None) -> None:
        """A SEND_MESSAGES reply header (or the error in its place) to each coalesced send."""
        if error is not None:
            for item in queued:
                self._settle(item, None, error)
            return
        if "queueOffsets" in header and self._spread_compact(header, queued):
            return
        results = header.get("results")
        if not isinstance(results, list) or len(results) != len(queued):
            results = [{"status": header.get("status", "SYSTEM_ERROR"), "remark": header.get("remark", "")}] * len(queued)
        for item, result in zip(queued, results):
            self._settle(item, result, None)

    def _spread_compact(self, header: dict, queued: list[Queued]) -> bool:
        """The compact reply (every message stored, one status for all): ids and queue offsets in
        request order, the queue and topic each send's own. False for a reply that does not add up."""
        offsets, ids, offset_ids = header["queueOffsets"], header.get("msgId"), header.get("offsetMsgId")
        status = header.get("status")  # PUT_OK, or FLUSH_DISK_TIMEOUT when the flush ran late
        if not (isinstance(offsets, list) and isinstance(ids, str) and isinstance(offset_ids, str)
                and status in protocol.STORED_STATUSES):
            return False
        ids, offset_ids = ids.split(","), offset_ids.split(",")
        if not len(offsets) == len(ids) == len(offset_ids) == len(queued):
            return False
        for (entry, _, future, _), msg_id, offset_id, offset in zip(queued, ids, offset_ids, offsets):
            if not future.done():  # its sender gave up (cancelled)
                future.set_result(SendResult(status, msg_id, offset_id, entry["queueId"], offset, entry["topic"], self.broker))
        return True

    def _settle(self, item: Queued, result: dict | None, error: BaseException | None) -> None:
        """One send's outcome: its SendResult; a retry, with the same UNIQ_KEY (an unanswered
        request at once, SYSTEM_BUSY and the other retriable statuses after a backoff); or,
        after the last retry or for any other status or error, its SendError."""
        entry, body, future, attempt = item
        if future.done():  # its sender gave up (cancelled)
            return
        delay = None
        if error is None:
            status = result.get("status") if isinstance(result, dict) else "SYSTEM_ERROR"
            if status in protocol.STORED_STATUSES:
                future.set_result(SendResult(status, result["msgId"], result["offsetMsgId"], result["queueId"],
                                             result["queueOffset"], entry["topic"], self.broker))
                return
            error = SendError(status, result.get("remark", "") if isinstance(result, dict) else "")
            delay = backoff(attempt) if status in protocol.RETRIABLE_STATUSES else None
        elif isinstance(error, SendError) and error.status == "TIMEOUT":
            delay = 0.0
        if delay is None or attempt >= self.retries:
            future.set_exception(error)
        elif delay:
            asyncio.get_running_loop().call_later(delay, self._retry, entry, body, future, attempt + 1)
        else:
            self._coalesce(entry, body, future, attempt + 1)

    def _retry(self, entry: dict, body: bytes, future: asyncio.Future, attempt: int) -> None:
        if not future.done():  # not cancelled while it waited out the backoff
            self._coalesce(entry, body, future, attempt)

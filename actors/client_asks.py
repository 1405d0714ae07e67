"""What the node asks a client and waits for (RocketMQ's Broker2Client.callClient):
GET_CONSUMER_RUNNING_INFO (`mqnode admin consumer-status`), which the node cannot answer itself,
and CONSUME_MESSAGE_DIRECTLY (`mqnode query --msg-id ID --group G --client-id C`), a stored
message the member's listener is to consume now; the node asks the member over the member's own
connection and hands the member's answer to the admin that asked.

No socket, no clock: the front (its shell) sends the ask, passes `now` (monotonic ms) and replies.
An ask carries `askId`, the node's own (the client's `opaque`s are the client's, and what the
node sends unasked carries none); the member answers with CLIENT_ANSWER (9050) naming it. An
answer counts only from the connection the ask went to, so no other client can answer for a
member; one that comes late, twice or for an ask never made is dropped (counted). An ask not
answered within its time is answered SYSTEM_ERROR by the node, so an admin never waits on a
member that hangs. At most MAX_ASKS wait at once: beyond, SYSTEM_BUSY.
"""

from __future__ import annotations

import dataclasses

from shm.invariant import invariant

MAX_ASKS = 1024
DEFAULT_TIMEOUT_MS = 2000  # under an admin client's own default (3 s): the node says why first
MAX_TIMEOUT_MS = 10_000  # RocketMQ's callClient waits 10 s


@dataclasses.dataclass(frozen=True)
class Ask:
    asker: bytes  # the routing id of the connection that asked (an admin)
    opaque: object  # its request's opaque, for its reply
    member: bytes  # the routing id the ask went to: only an answer from there counts
    client_id: str
    deadline: int  # monotonic ms
    answer_field: str  # what the member's answer carries: runningInfo, consumeResult
    header: dict  # the ask as the member gets it, `askId` included


class ClientAsks:
    def __init__(self, limit: int = MAX_ASKS):
        self.limit = limit
        self.waiting: dict[str, Ask] = {}
        self.sequence = 0
        self.asked = self.answered = self.timed_out = self.dropped = 0

    def ask(self, asker: bytes, opaque, member: bytes, client_id: str, now: int, timeout_ms: int,
            answer_field: str, header: dict) -> Ask | None:
        """The ask now waiting (its header given its `askId`), or None when MAX_ASKS wait already."""
        if len(self.waiting) >= self.limit:
            return None
        invariant(0 < timeout_ms <= MAX_TIMEOUT_MS, f"an ask's timeout of {timeout_ms} ms (checked at the edge)")
        self.sequence += 1
        ask_id = f"ask-{self.sequence}"
        ask = self.waiting[ask_id] = Ask(asker, opaque, member, client_id, now + timeout_ms, answer_field,
                                         header | {"askId": ask_id})
        self.asked += 1
        return ask

    def get(self, ask_id: str) -> Ask | None:
        """A waiting ask (the message it needs read meanwhile), or None: it ran out already."""
        return self.waiting.get(ask_id)

    def drop(self, ask_id: str) -> Ask | None:
        """The ask answered by the node itself (the member unreachable, the message not found)."""
        return self.waiting.pop(ask_id, None)

    def answer(self, ask_id, member: bytes) -> Ask | None:
        """The ask a CLIENT_ANSWER from `member` completes, or None (dropped: late, twice, never
        asked, or from another connection than the one asked)."""
        ask = self.waiting.get(ask_id) if isinstance(ask_id, str) else None
        if ask is None or ask.member != member:
            self.dropped += 1
            return None
        del self.waiting[ask_id]
        self.answered += 1
        return ask

    def expire(self, now: int) -> list[Ask]:
        """The asks whose time ran out, removed: the shell answers each SYSTEM_ERROR."""
        late = [ask_id for ask_id, ask in self.waiting.items() if ask.deadline <= now]
        self.timed_out += len(late)
        return [self.waiting.pop(ask_id) for ask_id in late]

    def statistics(self) -> dict:
        return {"waiting": len(self.waiting), "asked": self.asked, "answered": self.answered,
                "timedOut": self.timed_out, "dropped": self.dropped}

"""The push consumer's membership of its group (node.client.push): its heartbeats (at start, every
`heartbeat_s`, at once when its subscriptions change after start and when its connection comes
back after a drop: the node drops a member with its connection, and a restarted front knows
none), the node's notices that the group changed, and the refusals said once. A mixin of
AsyncPushConsumer: it uses the consumer's `pull`, `group`, `client_id`, `options`,
`subscriptions`, `expression_types`, `queues`, `running`, `background`, `rejoining`,
`rebalance_wanted`, `heartbeat_s` and `errors_told`."""

from __future__ import annotations

import asyncio
import logging

from node import protocol
from node.client.producer import SendError
from node.client.push_state import FROM_WHERE

log = logging.getLogger("mqnode.push")
OUT_OF_REACH = ("TIMEOUT", "CLOSED")  # a node restarting or gone: not a refusal to tell of
REJOIN_TRIES = 24  # heartbeats after a dropped connection, 0.1 s apart doubling to 2 s: ~40 s, then the interval's


class Membership:
    async def _ask(self, header: dict) -> dict:
        reply, _ = await self.pull.client.request(header)
        if reply.get("status") != "OK":
            raise SendError(reply.get("status", "SYSTEM_ERROR"), reply.get("remark", ""))
        return reply

    def _on_notice(self, header: dict) -> None:
        if header.get("code") == protocol.NOTIFY_CONSUMER_IDS_CHANGED and self.rebalance_wanted is not None:
            self.rebalance_wanted.set()

    def _subscription_data(self, topic: str, expression: str) -> dict:
        """RocketMQ's SubscriptionData as a heartbeat carries it (expressionType only for SQL92)."""
        kind = self.expression_types.get(topic, protocol.EXPRESSION_TAG)
        return {"topic": topic, "subString": expression} | ({} if kind == protocol.EXPRESSION_TAG else
                                                              {"expressionType": kind})

    def _tell(self, what: str, error: SendError, line: str) -> None:
        """A refusal tried again later, said once per kind, status and remark (at most 16 said): a
        heartbeat or a look at the group the node refuses (an account the ACL denies, say) left
        the member holding no queue, in silence."""
        key = (what, error.status, error.remark)
        if key not in self.errors_told and len(self.errors_told) < 16:
            self.errors_told.add(key)
            log.warning("%s", line)

    def _on_lost(self) -> None:
        """The connection dropped: the node dropped this member with it (or its front restarted,
        forgetting every member), so heartbeat as soon as it answers again (ZeroMQ reconnects by
        itself), not at the next interval: until then the group would go on without it."""
        if self.running and (self.rejoining is None or self.rejoining.done()):
            self.rejoining = self._in_background(self._rejoin())

    async def _rejoin(self) -> None:
        for attempt in range(REJOIN_TRIES):
            if not self.running or await self._heartbeat():
                return
            await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))

    async def _heartbeat(self) -> bool:
        """HEART_BEAT with the group's data; whether the node took it."""
        data = {"groupName": self.group, "consumeType": "CONSUME_PASSIVELY", "messageModel": self.options.message_model,
                "consumeFromWhere": FROM_WHERE[self.options.consume_from_where.removeprefix("CONSUME_FROM_")],
                "subscriptionDataSet": [self._subscription_data(t, e) for t, e in sorted(self.subscriptions.items())],
                "queues": [{"topic": t, "queueId": q} for t, q in sorted(self.queues)]}
        try:
            reply = await self._ask({"code": protocol.HEART_BEAT, "clientID": self.client_id, "language": "PYTHON",
                                     "version": "mqnode", "consumerDataSet": [data]})
            expires_ms = reply.get("clientChannelExpiredTimeout")
            if expires_ms:  # beat at least three times within it
                self.heartbeat_s = min(self.options.heartbeat_interval, expires_ms / 3000)
            return True
        except SendError as e:  # tried again at the next interval; the node keeps us until clientChannelExpiredTimeout
            if e.status not in OUT_OF_REACH:
                self._tell("heartbeats", e, f"heartbeats of group {self.group} are refused: {e}")
            return False

    async def _subscribed(self) -> None:
        """A subscription made after start: the node hears of it now, as RocketMQ's subscribe
        sends a heartbeat at once (it waited for the next heartbeat and rebalance, up to 30 s),
        tells the group, and this member takes its share of the topic's queues."""
        await self._heartbeat()
        self.rebalance_wanted.set()

    def _in_background(self, coroutine) -> asyncio.Task:
        """`coroutine` as a task of the consumer's, which shutdown cancels."""
        task = asyncio.ensure_future(coroutine)
        self.background = [t for t in self.background if not t.done()] + [task]
        return task

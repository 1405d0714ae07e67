"""The gRPC proxy's RPCs (`apache.rocketmq.v2.MessagingService`): each call checked (the ACL's
signature, actors.proxy.auth), given meaning by the core (actors.proxy.core) and carried to the
front over the proxy's links (actors.proxy.shell.Proxy). Every refusal and failure is the
response's status, never a broken call (`answering`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from grpc import aio

from actors.proxy import auth, core, delivery, members
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.apis import service_pb2_grpc
from actors.proxy.core import Code, Refused, status
from actors.proxy.sessions import wall_ms
from actors.transaction_core import NO_HALF, WRONG_GROUP
from node import protocol
from node.client.producer import SendError

if TYPE_CHECKING:
    from actors.proxy.shell import Proxy

log = logging.getLogger("mqnode")
STREAM_COMMANDS = 10_000  # commands waiting to go down one Telemetry stream (beyond: a check is dropped, asked again)


class Call:
    """One RPC's context: who called (after the ACL's check) and what the core should answer."""

    def __init__(self, proxy: Proxy, name: str, context: aio.ServicerContext):
        self.proxy, self.name, self.context = proxy, name, context
        self.metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        proxy.calls[name] = proxy.calls.get(name, 0) + 1
        self.account = proxy.verifier.verify(self.metadata, context.peer() or "") if proxy.verifier else None
        client_id = self.metadata.get("x-mq-client-id")
        self.client = proxy.clients.seen(client_id, self.metadata) if client_id else None

    def remaining_ms(self) -> int | None:
        left = self.context.time_remaining()
        return None if left is None else int(left * 1000)


def answering(response_type, *, streaming: bool = False):
    """Wrap an RPC: every refusal and failure becomes the response's `status`, never a broken
    call (a bug is logged and answered INTERNAL_SERVER_ERROR)."""
    def wrap(method):
        name = method.__name__

        async def unary(self, request, context):
            try:
                return await method(self, Call(self.proxy, name, context), request)
            except BaseException as e:  # noqa: BLE001 (CancelledError: the client went; re-raised)
                return response_type(status=self.failure(name, e))

        async def stream(self, request, context):
            try:
                # (aclosing: a stream the client left is closed now, its GeneratorExit where it stands)
                async with contextlib.aclosing(method(self, Call(self.proxy, name, context), request)) as responses:
                    async for response in responses:
                        yield response
            except GeneratorExit:
                raise
            except BaseException as e:  # noqa: BLE001
                yield response_type(status=self.failure(name, e))

        return stream if streaming else unary
    return wrap


def _popped(done: asyncio.Future) -> list:
    """The messages of a finished pop; none when it failed or was cancelled."""
    if done.cancelled() or done.exception() is not None:
        return []
    return done.result()


class Service(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, proxy: Proxy):
        self.proxy = proxy

    def failure(self, name: str, error: BaseException) -> pb.Status:
        if isinstance(error, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
            raise error
        self.proxy.refused += 1
        if isinstance(error, Refused):
            return status(error.code, error.message)
        if isinstance(error, auth.Denied):
            return status(error.code, str(error))
        if isinstance(error, SendError):
            return core.status_of(error.status, error.remark)
        self.proxy.errors += 1
        log.exception("proxy: %s failed", name)
        return status(Code.INTERNAL_SERVER_ERROR, f"{name}: {type(error).__name__}: {error}")

    # -- routes, clients, settings ---------------------------------------------------------------

    @answering(rpc.QueryRouteResponse)
    async def QueryRoute(self, call: Call, request: rpc.QueryRouteRequest):
        topic = core.topic_name(request.topic)
        here = core.broker(self.proxy.settings, request.endpoints)
        return core.route(request.topic, await self.proxy.placements(call.account, topic, here))

    @answering(rpc.QueryAssignmentResponse)
    async def QueryAssignment(self, call: Call, request: rpc.QueryAssignmentRequest):
        topic, group = core.topic_name(request.topic), core.group_name(request.group)
        here = core.broker(self.proxy.settings, request.endpoints)
        return core.assignments(request.topic, await self.proxy.placements(call.account, topic, here),
                                await self.proxy.fifo(group))

    @answering(rpc.HeartbeatResponse)
    async def Heartbeat(self, call: Call, request: rpc.HeartbeatRequest):
        if call.client is None:
            raise Refused(Code.CLIENT_ID_REQUIRED, "x-mq-client-id is missing from the call's metadata")
        group = core.group_name(request.group) if request.HasField("group") and request.group.name else None
        self.proxy.clients.heard(call.client, request.client_type, group)
        await self.proxy.member_beat(call.client, call.account)
        return rpc.HeartbeatResponse(status=status(Code.OK))

    @answering(rpc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, call: Call, request: rpc.NotifyClientTerminationRequest):
        if call.client is None:
            raise Refused(Code.CLIENT_ID_REQUIRED, "x-mq-client-id is missing from the call's metadata")
        gone = self.proxy.clients.terminated_by(call.client.client_id)
        self.proxy.renewals.forget_client(call.client.client_id)
        if gone is not None:
            await self.proxy.member_gone(gone)
        return rpc.NotifyClientTerminationResponse(status=status(Code.OK))

    async def Telemetry(self, requests, context):
        """The settings exchange, and the node's commands to the client: each settings command the
        client sends is answered with the node's settings for it; a transaction check of a topic
        it publishes comes down as RecoverOrphanedTransactionCommand, an admin's ask of a consumer
        as PrintThreadStackTraceCommand or VerifyMessageCommand (actors.proxy.members), whose
        answers come up it. The stream stays open until the client closes it."""
        try:
            call = Call(self.proxy, "Telemetry", context)
        except auth.Denied as e:
            yield rpc.TelemetryCommand(status=status(e.code, str(e)))
            return
        if call.client is None:
            yield rpc.TelemetryCommand(status=status(Code.CLIENT_ID_REQUIRED, "x-mq-client-id is missing"))
            return
        commands: asyncio.Queue = asyncio.Queue(STREAM_COMMANDS)
        call.client.streams += 1
        self.proxy.streams.setdefault(call.client.client_id, []).append(commands)
        reader = asyncio.create_task(self._read_telemetry(call, requests, commands))
        try:
            while (command := await commands.get()) is not None:
                yield command
        finally:
            reader.cancel()
            call.client.streams -= 1
            queues = self.proxy.streams.get(call.client.client_id, [])
            if commands in queues:
                queues.remove(commands)
            if not queues:
                self.proxy.streams.pop(call.client.client_id, None)

    async def _read_telemetry(self, call: Call, requests, commands: asyncio.Queue) -> None:
        try:
            async for command in requests:
                call.client.last_seen = time.monotonic()
                answer = await self._telemetry(call, command)
                if answer is not None:
                    await commands.put(answer)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                commands.put_nowait(None)  # (the stream ends)

    async def _telemetry(self, call: Call, command: rpc.TelemetryCommand) -> rpc.TelemetryCommand | None:
        kind = command.WhichOneof("command")
        if kind in members.ANSWERS:
            self.proxy.client_answered(call.client, command)
            return None
        if kind != "settings":
            return None  # (nothing else is the client's to send)
        given = command.settings
        group = None
        try:
            if given.HasField("subscription") and given.subscription.HasField("group"):
                group_name = core.group_name(given.subscription.group)
                self.proxy.clients.heard(call.client, given.client_type, group_name)
                call.client.subscriptions = members.subscriptions_of(given)
                group = await self.proxy.group(group_name)
            else:
                self.proxy.clients.heard(call.client, given.client_type, None)
            if given.HasField("publishing"):  # (a transactional producer's halves are checked through it)
                call.client.topics = {core.topic_name(t, to_send=True) for t in given.publishing.topics}
                await self.proxy.publishing(call.client.topics)
            settings = core.settings_for(given, self.proxy.settings, group)
        except BaseException as e:  # noqa: BLE001
            return rpc.TelemetryCommand(status=self.failure("Telemetry", e))
        return rpc.TelemetryCommand(status=status(Code.OK), settings=settings)

    # -- sending ---------------------------------------------------------------------------------

    @answering(rpc.SendMessageResponse)
    async def SendMessage(self, call: Call, request: rpc.SendMessageRequest):
        """Each message checked (core.outgoing), then sent in batches of one topic and queue:
        a FIFO message to its group's queue, the others of a topic to one queue a request, in
        turn (as a producer's send_batch); a timed one alone. Each entry says its own result."""
        if not 0 < len(request.messages) <= core.MAX_SEND_MESSAGES:
            raise Refused(Code.BAD_REQUEST, f"a send carries 1 to {core.MAX_SEND_MESSAGES} messages, "
                                            f"not {len(request.messages)}")
        s, now = self.proxy.settings, int(time.time() * 1000)
        link = await self.proxy.link(call.account)
        plans = []
        for message in request.messages:
            try:
                plans.append(core.outgoing(message, s.maxMessageSize, s.timerMaxDelaySec * 1000, now))
            except Refused as e:
                plans.append(e)
        queues = await self._queues(link, plans)
        results: list = [plan if isinstance(plan, Refused) else None for plan in plans]
        grouped, single = core.batches(plans, lambda plan: queues[plan.message.topic](plan))
        # (a lone message goes as the client's single send: concurrent calls' messages, a RocketMQ 5
        # producer's one a call, leave together in one SEND_MESSAGES request)
        sends = [link.client.send_message(plans[indices[0]].message, queue_id=queue) if len(indices) == 1 else
                 link.client.send_batch(topic, [plans[i].message for i in indices], queue_id=queue)
                 for topic, queue, indices in grouped]
        sends += [link.client.send_message(plans[i].message, shard_key=plans[i].shard_key) for i in single]
        outcomes = await asyncio.gather(*sends, return_exceptions=True)
        for (_, _, indices), outcome in zip(grouped, outcomes):
            for n, i in enumerate(indices):
                results[i] = outcome[n] if isinstance(outcome, list) else outcome
        for i, outcome in zip(single, outcomes[len(grouped):]):
            results[i] = outcome
        entries = [self._entry(plan, result) for plan, result in zip(plans, results)]
        self.proxy.sent += sum(1 for e in entries if e.status.code == Code.OK)
        return core.send_response(entries)

    async def _queues(self, link, plans) -> dict:
        """topic -> its queue picker for this request; a topic the node refuses refuses its messages."""
        pickers = {}
        for i, plan in enumerate(plans):
            if isinstance(plan, Refused) or plan.message.topic in pickers:
                continue
            topic = plan.message.topic
            try:
                count = await link.client.queue_count(topic)
            except SendError as e:
                refusal = core.status_of(e.status, e.remark)
                for j, other in enumerate(plans):
                    if not isinstance(other, Refused) and other.message.topic == topic:
                        plans[j] = Refused(refusal.code, refusal.message)
                continue
            pickers[topic] = self.proxy.picker(topic, count)
        return pickers

    def _entry(self, plan, result) -> rpc.SendResultEntry:
        if isinstance(result, Refused):
            return rpc.SendResultEntry(status=status(result.code, result.message))
        if isinstance(result, SendError):
            return rpc.SendResultEntry(status=core.status_of(result.status, result.remark), message_id=plan.message_id)
        if isinstance(result, BaseException):
            return rpc.SendResultEntry(status=self.failure("SendMessage", result), message_id=plan.message_id)
        entry = rpc.SendResultEntry(status=core.status_of(result.status), message_id=result.msg_id,
                                    offset=result.queue_offset)
        if plan.message.deliver_at_ms is not None:  # a timer: the handle RecallMessage takes back
            entry.recall_handle = protocol.recall_handle(plan.message.topic, self.proxy.settings.brokerName,
                                                         plan.message.deliver_at_ms, result.msg_id)
        if plan.transactional:
            entry.transaction_id = core.transaction_id(result.offset_msg_id, result.queue_offset)
        return entry

    @answering(rpc.EndTransactionResponse)
    async def EndTransaction(self, call: Call, request: rpc.EndTransactionRequest):
        """END_TRANSACTION of the half the transaction_id names (its producer group: the topic)."""
        header = core.end_transaction(request)
        link = await self.proxy.link(call.account)
        reply, _ = await link.client.request(header)
        remark = reply.get("remark", "")
        if reply.get("status") == "SYSTEM_ERROR" and remark.startswith((NO_HALF, WRONG_GROUP)):
            raise Refused(Code.INVALID_TRANSACTION_ID, remark)  # (the client's: no half of its topic there)
        if reply.get("status") != "OK":
            return rpc.EndTransactionResponse(status=core.status_of(reply.get("status"), remark))
        self.proxy.ended += 1
        return rpc.EndTransactionResponse(status=status(Code.OK, reply.get("remark") or "OK"))

    @answering(rpc.RecallMessageResponse)
    async def RecallMessage(self, call: Call, request: rpc.RecallMessageRequest):
        """Cancel a timer message before it is due (RocketMQ 5.3): a recall stored for it, as
        Apache's RecallMessageProcessor stores it; answered with the message's id. In a cluster a
        handle of another group's message goes to that group's master (the client's access point
        is one proxy, its sends went to each group's)."""
        topic = core.topic_name(request.topic)
        try:
            handle_topic, broker, due_ms, _ = protocol.parse_recall_handle(request.recall_handle)
        except protocol.ProtocolError as e:
            raise Refused(Code.BAD_REQUEST, str(e)) from None
        if handle_topic != topic:
            raise Refused(Code.BAD_REQUEST, "recall failed, topic not match")
        elsewhere = None
        if broker != self.proxy.settings.brokerName:
            elsewhere = await self.proxy.master_of(topic, broker)
            if elsewhere is None:
                raise Refused(Code.BAD_REQUEST, f"recall failed, broker {broker!r} holds no queue of {topic} here")
        if due_ms <= time.time() * 1000:
            raise Refused(Code.BAD_REQUEST, "recall failed, timestamp invalid: the message is due or delivered")
        link = await self.proxy.link(call.account, elsewhere)
        try:
            message_id = await link.client.recall(topic, request.recall_handle)
        except SendError as e:
            return rpc.RecallMessageResponse(status=core.status_of(e.status, e.remark))
        self.proxy.recalled += 1
        return rpc.RecallMessageResponse(status=status(Code.OK, "OK"), message_id=message_id)

    @answering(rpc.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(self, call: Call, request):
        raise Refused(Code.NOT_IMPLEMENTED, "lite topics are not supported by this node")

    # -- receiving -------------------------------------------------------------------------------

    @answering(rpc.ReceiveMessageResponse, streaming=True)
    async def ReceiveMessage(self, call: Call, request: rpc.ReceiveMessageRequest):
        """Status first, then each message, then the time of delivery (as RocketMQ 5's proxy)."""
        fifo = await self.proxy.fifo(core.group_name(request.group))
        settings = self.proxy.settings
        plan = delivery.receive_plan(request, call.remaining_ms(), fifo, settings.defaultInvisibleTimeMills,
                                     settings.enablePropertyFilter)
        link = await self.proxy.link(call.account)
        popping = asyncio.ensure_future(link.pop(
            plan.topic, plan.group, max_count=plan.max_count, invisible_ms=plan.invisible_ms, wait_ms=plan.wait_ms,
            tags=plan.expression, queue_id=plan.queue_id, orderly=plan.orderly, expression_type=plan.expression_type))
        try:
            messages = await asyncio.shield(popping)
        except asyncio.CancelledError:  # (the client went while its pop waited at the node: what comes is not its)
            self.proxy.receives_left += 1
            popping.add_done_callback(lambda done: self.proxy.give_back(link, plan.group, _popped(done)))
            raise
        if not messages:
            yield rpc.ReceiveMessageResponse(status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        if request.auto_renew and call.client is not None:
            now = wall_ms()
            for message in messages:
                self.proxy.renewals.add(message.receipt_handle, plan.group, call.account, call.client.client_id,
                                        now + plan.invisible_ms, now)
        given = 0  # (a message counts as given once the stream asks for the next response)
        try:
            yield rpc.ReceiveMessageResponse(status=status(Code.OK))
            for message in messages:
                yield delivery.message_of(message, plan.invisible_ms)
                given += 1
        except BaseException:  # (GeneratorExit, CancelledError: the client left mid-stream)
            self.proxy.give_back(link, plan.group, messages[given:])
            raise
        self.proxy.received += len(messages)
        delivered = rpc.ReceiveMessageResponse()
        delivered.delivery_timestamp.GetCurrentTime()
        yield delivered

    @answering(rpc.AckMessageResponse)
    async def AckMessage(self, call: Call, request: rpc.AckMessageRequest):
        group = core.group_name(request.group)
        core.topic_name(request.topic)
        if not 0 < len(request.entries) <= core.MAX_RECEIVE_BATCH:
            raise Refused(Code.BAD_REQUEST, f"an ack carries 1 to {core.MAX_RECEIVE_BATCH} entries")
        given = [core.receipt_handle(entry.receipt_handle) for entry in request.entries]
        await self._renewals_settled(given)
        handles = [self.proxy.renewals.current(handle) for handle in given]  # (renewed since: the latest)
        link = await self.proxy.link(call.account)
        reply, _ = await link.client.request({"code": protocol.BATCH_ACK_MESSAGE, "consumerGroup": group,
                                              "extraInfos": handles})
        if reply.get("status") != "OK":
            return rpc.AckMessageResponse(status=core.status_of(reply.get("status"), reply.get("remark", "")))
        outcomes = reply.get("results") or []
        for handle in given:
            self.proxy.renewals.forget(handle)
        entries = [rpc.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                             status=core.status_of(outcome))
                   for entry, outcome in zip(request.entries, outcomes)]
        self.proxy.acked += sum(1 for outcome in outcomes if outcome == "OK")
        codes = {e.status.code for e in entries}
        top = entries[0].status if len(codes) == 1 else status(Code.MULTIPLE_RESULTS, "the entries' results differ")
        return rpc.AckMessageResponse(status=top, entries=entries)

    async def _renewals_settled(self, handles: list[str]) -> None:
        """An ack or change of a handle whose renewal is on its way to the node waits for the
        renewal's answer: the node takes only the latest handle, and that answer names it. (Sent
        with the old one, the ack was refused as stale and the message came back: a FIFO message
        consumed twice under load.)"""
        task = self.proxy.renewing
        if task is not None and not task.done() and not self.proxy.renewals.in_flight.isdisjoint(handles):
            await asyncio.wait({task})

    @answering(rpc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, call: Call, request: rpc.ChangeInvisibleDurationRequest):
        group = core.group_name(request.group)
        core.topic_name(request.topic)
        invisible = core.duration_ms(request.invisible_duration)
        if not 0 <= invisible <= core.edge_clients.INVISIBLE_MS_MAX:  # (0, RocketMQ 5's floor: a retry with no backoff)
            raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"invisible_duration must be 0 ms to "
                                                       f"{core.edge_clients.INVISIBLE_MS_MAX} ms, not {invisible} ms")
        given = core.receipt_handle(request.receipt_handle)
        await self._renewals_settled([given])
        handle = self.proxy.renewals.current(given)
        self.proxy.renewals.forget(given)  # (the client decides its time now: a push consumer's retry)
        link = await self.proxy.link(call.account)
        reply, _ = await link.client.request({"code": protocol.CHANGE_MESSAGE_INVISIBLETIME, "consumerGroup": group,
                                              "extraInfo": handle, "invisibleTime": invisible})
        if reply.get("status") != "OK":
            return rpc.ChangeInvisibleDurationResponse(status=core.status_of(reply.get("status"), reply.get("remark", "")))
        return rpc.ChangeInvisibleDurationResponse(status=status(Code.OK), receipt_handle=reply["extraInfo"])

    @answering(rpc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, call: Call, request):
        """The client gives up on a message it holds (a FIFO consumer past its attempts): it
        goes into %DLQ%<group> now and is retired. The handle is proven first (a change of the
        invisible time answers only to the one who holds it), then the stored message is handed
        back to the DLQ (CONSUMER_SEND_MSG_BACK, level -1) and acknowledged."""
        group, topic = core.group_name(request.group), core.topic_name(request.topic)
        given = core.receipt_handle(request.receipt_handle)
        await self._renewals_settled([given])
        handle = self.proxy.renewals.current(given)
        self.proxy.renewals.forget(given)
        where = core.handle_position(handle)
        if where[0] != topic:
            raise Refused(Code.INVALID_RECEIPT_HANDLE, f"the receipt handle is of topic {where[0]}, not {topic}")
        link = await self.proxy.link(call.account)
        held = await link.change_invisible(handle, core.FORWARD_HOLD_MS, group)
        pulled = await link.pull(where[0], where[1], where[2], max_count=1)
        message = next((m for m in pulled.messages if m.queue_offset == where[2]), None)
        if message is None:
            raise Refused(Code.MESSAGE_NOT_FOUND, f"no message at {where[0]}/{where[1]}/{where[2]} (cleaned away?)")
        await link.send_back(message, group, delay_level=-1)
        await link.ack(held, group)
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(Code.OK))

    # -- pulling: a queue from an offset, and the offsets ----------------------------------------------

    @answering(rpc.PullMessageResponse, streaming=True)
    async def PullMessage(self, call: Call, request: rpc.PullMessageRequest):
        """PULL_MESSAGE of one queue from the request's offset, long polling up to its timeout; the
        offset is not committed (UpdateOffset does, as RocketMQ 5's proxy pulls). The stream: a
        status, each message, then the offset to pull from next."""
        plan = delivery.pull_plan(request, call.remaining_ms(), self.proxy.settings.enablePropertyFilter)
        await self.proxy.ensure_topic(plan.topic)
        link = await self.proxy.link(call.account)
        result = await link.pull(plan.topic, plan.queue_id, plan.offset, max_count=plan.max_count,
                                 subscription=plan.expression, expression_type=plan.expression_type,
                                 suspend_ms=plan.wait_ms, group=plan.group)
        for response in delivery.pulled(result):
            yield response
        self.proxy.pulled += len(result.messages)

    @answering(rpc.UpdateOffsetResponse)
    async def UpdateOffset(self, call: Call, request: rpc.UpdateOffsetRequest):
        group, topic = core.group_name(request.group), core.topic_name(request.message_queue.topic)
        if request.offset < 0:
            raise Refused(Code.ILLEGAL_OFFSET, f"an offset is 0 or more, not {request.offset}")
        reply = await self.proxy.ask(call.account, {"code": protocol.UPDATE_CONSUMER_OFFSET, "consumerGroup": group,
                                                    "topic": topic, "queueId": core.queue_of(request.message_queue),
                                                    "commitOffset": request.offset})
        return rpc.UpdateOffsetResponse(status=core.status_of(reply.get("status"), reply.get("remark", "")))

    @answering(rpc.GetOffsetResponse)
    async def GetOffset(self, call: Call, request: rpc.GetOffsetRequest):
        group, topic = core.group_name(request.group), core.topic_name(request.message_queue.topic)
        reply = await self.proxy.ask(call.account, {"code": protocol.QUERY_CONSUMER_OFFSET, "consumerGroup": group,
                                                    "topic": topic, "queueId": core.queue_of(request.message_queue)})
        if reply.get("status") == "QUERY_NOT_FOUND":
            return rpc.GetOffsetResponse(status=status(Code.OFFSET_NOT_FOUND, reply.get("remark", "")))
        return rpc.GetOffsetResponse(status=core.status_of(reply.get("status"), reply.get("remark", "")),
                                     offset=reply.get("offset", 0))

    @answering(rpc.QueryOffsetResponse)
    async def QueryOffset(self, call: Call, request: rpc.QueryOffsetRequest):
        topic, queue = core.topic_name(request.message_queue.topic), core.queue_of(request.message_queue)
        policy = request.query_offset_policy
        if policy == pb.TIMESTAMP:
            if not 0 <= core.millis(request.timestamp) < 2**62:
                raise Refused(Code.BAD_REQUEST, "the timestamp is before 1970 or too far ahead")
            header = {"code": protocol.SEARCH_OFFSET_BY_TIMESTAMP, "topic": topic, "queueId": queue,
                      "timestamp": core.millis(request.timestamp)}
        else:
            header = {"code": protocol.GET_MAX_OFFSET if policy == pb.END else protocol.GET_MIN_OFFSET,
                      "topic": topic, "queueId": queue}
        reply = await self.proxy.ask(call.account, header)
        return rpc.QueryOffsetResponse(status=core.status_of(reply.get("status"), reply.get("remark", "")),
                                       offset=reply.get("offset", 0))

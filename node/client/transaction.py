"""The transactional producer: `AsyncTransactionProducer` (asyncio) and `TransactionProducer`
(blocking), RocketMQ's TransactionMQProducer (docs/protocol.md "Transactions").

`send_in_transaction` sends the message as a half (TRAN_MSG=true, PGROUP=group): stored, not yet
visible. Then it runs the local transaction, `execute(message, arg)`, and ends the half with
what that returns: COMMIT_MESSAGE makes the message visible, ROLLBACK_MESSAGE drops it, UNKNOW
(or an exception) leaves it open. The node asks about a half left open (CHECK_TRANSACTION_STATE,
after `transactionTimeOut`, every `transactionCheckInterval`) over the connection of a producer
of the group: `check(message)` answers with the same three states. So any producer of the group
can finish what another left open, a killed one's included.

Unlike RocketMQ's producer, the end is a request, not oneway: `send_in_transaction` returns once
the node has stored the outcome (the committed message is then readable), and its result says
how the end went (`end_status`; a failed end leaves the half to the check). The ends made in one
turn of the event loop (concurrent transactions, answered checks) leave as one END_TRANSACTIONS.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import inspect
import logging
from typing import Callable, NamedTuple

from node import protocol
from node.client import aio
from node.client.message import Message, body_bytes
from node.client.producer import AsyncProducer, SendError, SendResult
from node.client.producer_group import ProducerMembership, client_id_of
from node.client.received import decode_messages, retopic
from shm.codec import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION,
    PROPERTY_UNIQ_KEY,
    decode_msg_id,
)

log = logging.getLogger("mqnode.transaction")
CHECK_WORKERS = 64  # checks answered concurrently (a blocking `check` runs on a thread of its own)
CHECK_ENDS_IN_FLIGHT = 4096  # ends of answered checks awaiting the node's reply at once: a worker goes on to the
# next check meanwhile (when each waited for its end, 64 workers ended ~8k halves/s, a round trip a 64, and a
# pass over 100k halves was not answered before the next pass asked about 18k of them again)
CHECKS_WAITING = 1_000_000  # checks waiting their turn; beyond, one is dropped (the node asks again)


class LocalTransactionState(str, enum.Enum):
    """RocketMQ's LocalTransactionState (its names, UNKNOW's spelling included)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


COMMIT_MESSAGE = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK_MESSAGE = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
_END_CODES = {COMMIT_MESSAGE: 8, ROLLBACK_MESSAGE: 12, UNKNOW: 0}  # END_TRANSACTION's commitOrRollback


class TransactionSendResult(NamedTuple):
    status: str  # the half's send status
    msg_id: str  # the transaction id (the message's UNIQ_KEY)
    offset_msg_id: str  # the half's
    queue_id: int
    queue_offset: int  # the half's
    topic: str
    local_transaction_state: LocalTransactionState
    end_status: str  # "OK" once the node stored the outcome; else why not (the check will ask)

    @property
    def transaction_id(self) -> str:
        return self.msg_id


def _state(value) -> LocalTransactionState:
    try:
        return LocalTransactionState(value.value if isinstance(value, enum.Enum) else value)
    except ValueError:
        log.warning("a local transaction answered %r: taken as UNKNOW", value)
        return UNKNOW


class AsyncTransactionProducer:
    def __init__(self, endpoint: str, group: str, execute: Callable | None = None, check: Callable | None = None,
                 **options):
        protocol.check_group(group, "producer group")  # (the node refused its heartbeat: a SendError, later)
        self.group = group
        self.execute, self.check = execute, check
        self.producer = AsyncProducer(endpoint, **options)
        self.producer.on_request = self._on_request
        self.membership = ProducerMembership(self.producer, group, client_id_of(self))  # (the checks find it so)
        self.checks_waiting: collections.deque = collections.deque()  # (header, body)
        self.checking: set[asyncio.Task] = set()  # the workers answering them
        self.ending: set[asyncio.Task] = set()  # end requests, and answered checks' ends, on their way
        self.check_ends = asyncio.Semaphore(CHECK_ENDS_IN_FLIGHT)  # (bound to the loop that first waits on it)
        self.checks_answered = 0
        self.ends_queued: list[tuple[dict, asyncio.Future]] = []  # this turn's ends, sent together

    async def start(self) -> AsyncTransactionProducer:
        if not self.membership.started:
            await self.producer.start()
            try:
                await self.membership.start()  # known to the node before the first half: it can be asked about it
            except BaseException:
                await self.producer.close()  # (its tasks, else destroyed pending with the loop)
                raise
        return self

    async def close(self) -> None:
        for tasks in (self.checking, self.ending):  # checks being answered: their ends leave before the connection closes
            if tasks:
                await asyncio.wait(list(tasks), timeout=self.producer.timeout)
        await self.membership.stop()
        for task in [*self.checking, *self.ending]:
            task.cancel()
        await self.producer.close()

    async def __aenter__(self) -> AsyncTransactionProducer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- sending ---------------------------------------------------------------------------------

    async def send_half(self, topic: str, body: bytes | str, *, tags: str | None = None, keys=None,
                        properties: dict[str, str] | None = None, queue_id: int | None = None) -> tuple[Message, SendResult]:
        """The half alone (then `end` it): for callers that run the local transaction themselves."""
        await self.start()
        props = dict(properties or {})
        props[PROPERTY_TRANSACTION], props[PROPERTY_PRODUCER_GROUP] = "true", self.group
        props.setdefault(PROPERTY_UNIQ_KEY, self.producer.keys.next())
        message = Message(topic, body_bytes(body), tags, keys, props)
        return message, await self.producer.send_message(message, queue_id=queue_id)

    async def end(self, sent: SendResult, state: LocalTransactionState, *, from_check: bool = False,
                  commit_log_offset: int | None = None) -> str:
        """END_TRANSACTION for the half `sent`: "OK" once stored, else the status that says why not.
        The ends asked for in one turn of the event loop leave together (END_TRANSACTIONS)."""
        await self.start()
        if commit_log_offset is None:
            commit_log_offset = decode_msg_id(sent.offset_msg_id)[1]
        end = {"tranStateTableOffset": sent.queue_offset, "commitLogOffset": commit_log_offset,
               "commitOrRollback": _END_CODES[state], "msgId": sent.msg_id, "transactionId": sent.msg_id,
               "fromTransactionCheck": from_check}
        future = asyncio.get_running_loop().create_future()
        self.ends_queued.append((end, future))
        if len(self.ends_queued) == 1:
            asyncio.get_running_loop().call_soon(self._ship_ends)
        return await future

    def _ship_ends(self) -> None:
        queued, self.ends_queued = self.ends_queued, []
        for at in range(0, len(queued), protocol.MAX_ENDS_PER_REQUEST):
            self._hold(self._end_request(queued[at: at + protocol.MAX_ENDS_PER_REQUEST]))

    def _hold(self, coroutine) -> None:
        """`coroutine` as a task held until done (waited for, then cancelled, at close)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.ending.add(task)
        task.add_done_callback(self.ending.discard)

    async def _end_request(self, queued: list) -> None:
        if len(queued) == 1:
            header = {"code": protocol.END_TRANSACTION, "producerGroup": self.group, **queued[0][0]}
        else:
            header = {"code": protocol.END_TRANSACTIONS, "producerGroup": self.group, "ends": [e for e, _ in queued]}
        try:
            reply, _ = await self.producer.request(header)
        except SendError as e:
            statuses = [e.status] * len(queued)
        else:
            results = reply.get("results") if len(queued) > 1 else [reply]
            if not isinstance(results, list) or len(results) != len(queued):
                results = [reply] * len(queued)  # (refused whole)
            statuses = [r.get("status", "SYSTEM_ERROR") for r in results]
        for (_, future), status in zip(queued, statuses):
            if not future.done():
                future.set_result(status)

    async def send_in_transaction(self, topic: str, body: bytes | str, arg=None, *, tags: str | None = None, keys=None,
                                  properties: dict[str, str] | None = None,
                                  queue_id: int | None = None) -> TransactionSendResult:
        """Half, local transaction (`execute(message, arg)`, a coroutine function or not), end."""
        message, sent = await self.send_half(topic, body, tags=tags, keys=keys, properties=properties,
                                             queue_id=queue_id)
        state = await self._run(self.execute, message, arg)
        return _result(sent, state, await self.end(sent, state))

    async def _run(self, fn: Callable | None, *args) -> LocalTransactionState:
        if fn is None:
            return UNKNOW
        try:
            value = fn(*args)
            if inspect.isawaitable(value):
                value = await value
        except Exception:  # a local transaction that raised is unknown: the check asks later
            log.exception("the local transaction of producer group %s raised", self.group)
            return UNKNOW
        return _state(value)

    # -- checks ----------------------------------------------------------------------------------

    def _on_request(self, header: dict, body: bytes | None) -> None:
        if header.get("code") != protocol.CHECK_TRANSACTION_STATE or header.get("producerGroup") != self.group:
            return
        if len(self.checks_waiting) >= CHECKS_WAITING:
            return  # (asked again at the next check)
        self.checks_waiting.append((header, body))
        if len(self.checking) < CHECK_WORKERS:
            task = asyncio.get_running_loop().create_task(self._check_worker())
            self.checking.add(task)
            task.add_done_callback(self.checking.discard)

    async def _check_worker(self) -> None:
        while self.checks_waiting:
            await self._answer_check(*self.checks_waiting.popleft())

    async def _answer_check(self, header: dict, body: bytes | None) -> None:
        try:
            messages = decode_messages(body)
        except SendError:
            return  # (a record this client cannot read: left to the next check)
        if not messages:
            return
        message = messages[0]
        real = message.properties.get(PROPERTY_REAL_TOPIC)
        if real:  # the check shows the message as sent: its real topic and queue
            retopic(message, real)
        state = await self._run(self.check, message)
        if state is UNKNOW:
            return
        sent = SendResult("SEND_OK", header.get("transactionId") or message.msg_id, header.get("offsetMsgId", ""),
                          message.queue_id, header["tranStateTableOffset"], message.topic)
        await self.check_ends.acquire()
        self._hold(self._end_checked(sent, state, header["commitLogOffset"]))

    async def _end_checked(self, sent: SendResult, state: LocalTransactionState, commit_log_offset: int) -> None:
        try:
            status = await self.end(sent, state, from_check=True, commit_log_offset=commit_log_offset)
        finally:
            self.check_ends.release()
        if status == "OK":
            self.checks_answered += 1
        else:  # (asked about again at the next check)
            log.warning("the end of a checked transaction was not stored: %s", status)


def _result(sent: SendResult, state: LocalTransactionState, end_status: str) -> TransactionSendResult:
    return TransactionSendResult(sent.status, sent.msg_id, sent.offset_msg_id, sent.queue_id, sent.queue_offset,
                                 sent.topic, state, end_status)


class TransactionProducer(aio.Blocking):
    """The blocking transactional producer: the local transaction runs in the caller's thread,
    checks on a worker thread (they may block); sends on a private event-loop thread."""

    def __init__(self, endpoint: str, group: str, execute: Callable | None = None, check: Callable | None = None,
                 **options):
        self._start_loop("mqnode-transaction")
        self.execute = execute
        blocking_check = None if check is None else (lambda message: self.loop.run_in_executor(None, check, message))
        self.inner = self._made(self._make(endpoint, group, blocking_check, options))

    async def _make(self, endpoint, group, check, options) -> AsyncTransactionProducer:
        import zmq
        return await AsyncTransactionProducer(endpoint, group, None, check, context=zmq.Context(), **options).start()

    def send_in_transaction(self, topic: str, body: bytes | str, arg=None, **kwargs) -> TransactionSendResult:
        message, sent = self._call(self.inner.send_half(topic, body, **kwargs))
        state = UNKNOW
        if self.execute is not None:
            try:
                state = _state(self.execute(message, arg))
            except Exception:
                log.exception("the local transaction of producer group %s raised", self.inner.group)
        return _result(sent, state, self._call(self.inner.end(sent, state)))

    def request(self, header: dict, body: bytes | None = None, *, timeout: float | None = None):
        return self._call(self.inner.producer.request(header, body, timeout=timeout))

    @property
    def checks_answered(self) -> int:
        return self.inner.checks_answered

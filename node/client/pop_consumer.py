"""The pop consumer: RocketMQ 5's push consumer over pop (docs/protocol.md "Pop").

A member of a group that owns no queue: `pops_in_flight` pop loops per subscribed topic each
ask the node for up to `max_count` messages from any queue (long polling `wait_ms`), hand them to
the listener on a pool of `consume_threads` threads, `consume_batch` at a time, and ack those it
answered CONSUME_SUCCESS in one request, sent while the loop pops again. RECONSUME_LATER (or an exception) leaves a message
unacked: it comes back after its invisible time (or `reconsume_delay_ms`, when set, through a
change of its invisible time), `reconsume_times` one higher, and after the group's retryMaxTimes
goes to `%DLQ%<group>`. A member that dies costs only its in-flight messages' invisible time;
adding one helps at once. Pops ride through a restart of the node: a failed pop is tried again
after a backoff.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import zmq

from node import protocol
from node.client import aio
from node.client.consumer import AsyncPullConsumer
from node.client.producer import SendError, backoff
from node.client.push_state import CONSUME_SUCCESS, RECONSUME_LATER, ListenerStatuses
from node.client.received import PoppedMessage

__all__ = ["PopConsumer", "PopOptions", "CONSUME_SUCCESS", "RECONSUME_LATER"]


@dataclass
class PopOptions:
    consume_threads: int = 4  # threads calling the listener
    pops_in_flight: int = 4  # pop loops per subscribed topic
    max_count: int = 64  # messages a pop
    consume_batch: int = 1  # messages a listener call
    invisible_ms: int = 60_000
    wait_ms: int = 2_000  # long polling of an empty pop (shutdown waits at most this)
    orderly: bool = False  # each queue in order, the next message only after the one before is acked
    reconsume_delay_ms: int | None = None  # RECONSUME_LATER: back after this, instead of the invisible time
    timeout: float = 5.0  # the client's wait for an answer
    credentials: object = None

    def check(self) -> None:
        """ValueError naming what the node would refuse at every pop (the consumer popped nothing,
        again and again, and said nothing) or what starts no pop at all."""
        bounds = {"consume_threads": (1, 1000), "pops_in_flight": (1, 1000), "max_count": (1, protocol.POP_MAX_COUNT),
                  "consume_batch": (1, protocol.POP_MAX_COUNT), "invisible_ms": (1, protocol.INVISIBLE_MS_MAX),
                  "wait_ms": (0, protocol.SUSPEND_MS_MAX)}
        for name, (least, most) in bounds.items():
            value = getattr(self, name)
            if type(value) is not int or not least <= value <= most:
                raise ValueError(f"PopConsumer's {name} must be an integer from {least} to {most}, not {value!r}")
        if self.reconsume_delay_ms is not None and not (type(self.reconsume_delay_ms) is int
                                                        and 0 <= self.reconsume_delay_ms <= protocol.INVISIBLE_MS_MAX):
            raise ValueError(f"PopConsumer's reconsume_delay_ms must be None or 0 to {protocol.INVISIBLE_MS_MAX}, "
                             f"not {self.reconsume_delay_ms!r}")
        if not self.timeout > 0:
            raise ValueError(f"PopConsumer's timeout must be above 0 s, not {self.timeout!r}")


class PopConsumer:
    def __init__(self, endpoint: str | None = None, group: str | None = None, *, namesrv=None, **options):
        self.options = PopOptions(**options)  # (TypeError names an unknown option)
        self.options.check()
        if (endpoint is None) == (namesrv is None) or not group:
            raise ValueError("a pop consumer takes a group and endpoint= (one node) or namesrv= (a cluster)")
        protocol.check_group(group)
        self.endpoint, self.namesrv, self.group = endpoint, namesrv, group
        self.subscriptions: dict[str, tuple[str, str]] = {}  # topic -> (expression, its type)
        self.listener: Callable[[list[PoppedMessage]], str] | None = None
        self.statuses = ListenerStatuses(CONSUME_SUCCESS, RECONSUME_LATER, logging.getLogger("mqnode.pop"))
        self.loop = aio.new_event_loop()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.context = zmq.Context()
        self.consumer: AsyncPullConsumer | None = None
        self.stopping = False
        self.tasks: list[asyncio.Task] = []
        self.acking: set[asyncio.Future] = set()  # acks on their way
        self.consumed = self.acked = self.failed = self.ack_lost = self.pop_errors = 0
        self.errors_told: set[tuple[str, str]] = set()  # (status, remark) of failed pops, logged once each

    def subscribe(self, topic: str, tags="*", expression_type: str = protocol.EXPRESSION_TAG) -> None:
        """Pop `topic`'s messages that `tags` selects (a tag expression or a list of tags), or
        with `expression_type="SQL92"` those a SQL92 selector over their properties selects."""
        expression = tags if isinstance(tags, str) else "||".join(tags)
        protocol.check_expression(expression, expression_type)  # ValueError for a malformed one
        self.subscriptions[topic] = (expression, expression_type)

    def register_listener(self, listener: Callable[[list[PoppedMessage]], str]) -> None:
        self.listener = listener

    def start(self) -> PopConsumer:
        if self.listener is None or not self.subscriptions:
            raise ValueError("subscribe to a topic and register a listener before start")
        self.pool = ThreadPoolExecutor(self.options.consume_threads, thread_name_prefix=f"mqnode-pop-{self.group}")
        self.thread = aio.start_loop_thread(self.loop, f"mqnode-pop-{self.group}")
        self.thread.submit(self._start()).result()
        return self

    async def _start(self) -> None:
        self.consumer = AsyncPullConsumer(self.endpoint, namesrv=self.namesrv, timeout=self.options.timeout,
                                          context=self.context, credentials=self.options.credentials)
        await self.consumer.start()
        self.tasks = [asyncio.ensure_future(self._pop_loop(topic, *selects))
                      for topic, selects in self.subscriptions.items() for _ in range(self.options.pops_in_flight)]

    def shutdown(self) -> None:
        """Stop popping, let the listener finish what it holds and ack it, then close."""
        if self.thread is None:  # (never started, or shut down before)
            if not self.loop.is_closed():
                self.context.term()
                aio.close_stopped(self.loop)
            return
        self.stopping = True
        self.thread.submit(self._stop()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.pool.shutdown(wait=True)
        self.context.term()
        self.thread = None
        aio.close_stopped(self.loop)

    async def _stop(self) -> None:
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*list(self.acking), return_exceptions=True)
        await self.consumer.close()

    # -- the loop ----------------------------------------------------------------------------------

    async def _pop_loop(self, topic: str, tags: str, expression_type: str) -> None:
        o, failures = self.options, 0
        while not self.stopping:
            try:
                messages = await self.consumer.pop(topic, self.group, max_count=o.max_count, invisible_ms=o.invisible_ms,
                                                   wait_ms=o.wait_ms, tags=tags, orderly=o.orderly,
                                                   expression_type=expression_type)
                failures = 0
            except SendError as e:  # the node restarting or busy: again after a backoff
                self.pop_errors += 1
                if (e.status, e.remark) not in self.errors_told and e.status not in ("TIMEOUT", "CLOSED"):
                    self.errors_told.add((e.status, e.remark))  # (a topic gone, a group refused: said once, not in silence)
                    logging.getLogger("mqnode.pop").warning("pops of %s for group %s fail: %s: %s (tried again after "
                                                            "a backoff)", topic, self.group, e.status, e.remark)
                failures += 1
                await asyncio.sleep(backoff(min(failures, 4)))
                continue
            if messages:
                await self._consume(messages)

    async def _consume(self, messages: list[PoppedMessage]) -> None:
        """The listener over `messages`, then their acks on their way while the loop pops again
        (at most `pops_in_flight` acks of a loop's making pending; shutdown waits for them)."""
        done = await asyncio.get_running_loop().run_in_executor(self.pool, self._call_listener, messages)
        while len(self.acking) >= 2 * self.options.pops_in_flight:
            await asyncio.wait(self.acking, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.ensure_future(self._settle(messages, done))
        self.acking.add(task)
        task.add_done_callback(self.acking.discard)

    async def _settle(self, messages: list[PoppedMessage], done: list[bool]) -> None:
        succeeded = [m for m, ok in zip(messages, done) if ok]
        failed = [m for m, ok in zip(messages, done) if not ok]
        self.consumed += len(succeeded)
        self.failed += len(failed)
        try:
            if succeeded:
                results = await self.consumer.ack_batch(succeeded, self.group)
                self.acked += sum(results)
                self.ack_lost += len(results) - sum(results)  # (their time ran out: they come again)
            if failed and self.options.reconsume_delay_ms is not None:
                for message in failed:
                    await self.consumer.change_invisible(message, self.options.reconsume_delay_ms, self.group)
        except SendError:
            self.ack_lost += len(succeeded)  # not acked: they come back after their invisible time (at least once)

    def _call_listener(self, messages: list[PoppedMessage]) -> list[bool]:
        """On a pool thread: the listener over `consume_batch` messages at a time; True for each
        it consumed."""
        out, size = [], max(1, self.options.consume_batch)
        stopped: set[tuple[str, int]] = set()  # orderly: queues with a failure in this batch (the rest waits)
        for at in range(0, len(messages), size):
            chunk = messages[at: at + size]
            if self.options.orderly and any((m.topic, m.queue_id) in stopped for m in chunk):
                out += [False] * len(chunk)
                continue
            try:
                ok = self.statuses.succeeded(self.listener(chunk))
            except Exception:  # noqa: BLE001 - the user's listener: its failure is a RECONSUME_LATER
                ok = False
            if not ok:
                stopped.update((m.topic, m.queue_id) for m in chunk)
            out += [ok] * len(chunk)
        return out

    def statistics(self) -> dict:
        return {"consumed": self.consumed, "acked": self.acked, "failed": self.failed, "ackLost": self.ack_lost,
                "popErrors": self.pop_errors}

    def __enter__(self) -> PopConsumer:
        return self  # (subscribe, register a listener, then start)

    def __exit__(self, *exc) -> None:
        self.shutdown()

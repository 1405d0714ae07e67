"""The load generators: producer and consumer processes (spawned by `run`), each one asyncio loop.

Each worker reports cumulative figures to the coordinator every `interval` over a
multiprocessing queue, and appends per-message records (with `--verify`). Every loop is bounded:
producers by count, duration and the stop event; consumers by the queues' end once producing is
done, the drain timeout, and the abort event. A send is never repeated after a timeout (the
first may have been stored, and a repeat would be a duplicate the verifier must not excuse);
statuses that say "not stored, try again" (SYSTEM_BUSY) are retried with backoff.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter
from pathlib import Path

import zmq

from node import protocol
from node.client import AsyncProducer, AsyncPullConsumer, Message, SendError, aio
from node.tools.loadtest import payload, records
from node.tools.loadtest.histogram import LogHistogram
from node.tools.loadtest.params import RunParams, SizeSpec

RETRY_ATTEMPTS = 6          # SYSTEM_BUSY retries of one send before it counts as refused
PULL_BATCH = 32             # messages per pull (RocketMQ's default maxMsgNums)
SUSPEND_MS = 500            # long-poll hold of an empty pull
MAX_START_WAIT = 60.0       # seconds a worker waits for the node to answer at start
MAX_CATCH_UP = 1.0          # seconds a paced producer may fall behind before it stops catching up


def producer_main(params: dict, run_id: int, index: int, records_dir: str | None, reports, stop) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the coordinator decides
    worker = ProducerWorker(RunParams(**params), run_id, index, records_dir, reports, stop)
    aio.run(worker.run())


def consumer_main(params: dict, run_id: int, index: int, records_dir: str | None, reports, events,
                  starts: dict[tuple[int, int], int]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = ConsumerWorker(RunParams(**params), run_id, index, records_dir, reports, events, starts)
    aio.run(worker.run())


class _Reporting:
    """What both workers share: counters, the report loop, the record file."""

    role = ""

    def __init__(self, params: RunParams, index: int, records_dir: str | None, reports, dtype, kind: str):
        self.params = params
        self.index = index
        self.reports = reports
        self.messages = 0
        self.bytes = 0
        self.errors: Counter[str] = Counter()
        self.began: float | None = None
        self.ended: float | None = None
        self.records = records.RecordWriter(Path(records_dir) / f"{kind}-{index}.bin", dtype) if records_dir else None

    def report(self, done: bool = False) -> None:
        if self.records:
            self.records.flush()
        self.reports.put({"role": self.role, "index": self.index, "t": time.time(), "messages": self.messages,
                          "bytes": self.bytes, "errors": dict(self.errors), "began": self.began,
                          "ended": self.ended, "done": done, "cpu": time.process_time(), **self.extra()})

    def extra(self) -> dict:
        return {}

    async def report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.params.interval)
            self.poll_events()
            self.report()

    def poll_events(self) -> None:
        pass


async def _wait_for_node(ask):
    """Call `ask()` until the node answers (it may be restarting under --chaos), bounded."""
    deadline = time.monotonic() + MAX_START_WAIT
    while True:
        try:
            return await ask()
        except (SendError, zmq.ZMQError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class ProducerWorker(_Reporting):
    role = "producer"

    def __init__(self, params: RunParams, run_id: int, index: int, records_dir: str | None, reports, stop):
        super().__init__(params, index, records_dir, reports, records.SENT, "sent")
        self.run_id = run_id
        self.stop = stop
        self.stopped = False
        share, extra = divmod(params.count, params.producers) if params.count else (None, 0)
        self.share = None if share is None else share + (1 if index < extra else 0)
        self.rate = params.rate / params.producers
        sizes = SizeSpec.parse(params.size)
        self.size = sizes.sampler(params.seed * 1000 + index)
        self.filler = payload.Filler(params.seed * 1000 + index, sizes.largest)
        self.tags = itertools.cycle(params.tags.split(",")) if params.tags else itertools.repeat(None)
        self.outcomes = [0, 0, 0, 0]
        self.ack = LogHistogram()

    def extra(self) -> dict:
        return {"outcomes": self.outcomes, "ack": self.ack.to_sparse()}

    def poll_events(self) -> None:
        self.stopped = self.stopped or self.stop.is_set()

    async def run(self) -> None:
        p = self.params
        topics = p.topic_names
        self.report()  # at once: the coordinator learns the worker is up (and may attach a profiler)
        async with AsyncProducer(p.endpoint, linger_ms=p.linger_ms, timeout=p.send_timeout, retries=0) as producer:
            queues = [await _wait_for_node(lambda t=t: producer.queue_count(t)) for t in topics]
            reporter = asyncio.create_task(self.report_loop())
            self.began = time.time()
            self.plan = _Plan(self.share, p.batch, self.rate, self.began,
                              time.monotonic() + p.duration if p.duration else None)
            # `concurrency` long-lived senders, not a task per send: the generator's own CPU is
            # what a two-core machine takes from the node it measures.
            await asyncio.gather(*[self._sender(producer, topics, queues) for _ in range(p.concurrency)])
            self.ended = time.time()
            reporter.cancel()
        self.report(done=True)
        if self.records:
            self.records.close()

    async def _sender(self, producer: AsyncProducer, topics: list[str], queues: list[int]) -> None:
        while not self.stopped:
            claim = self.plan.claim()
            if claim is None:
                return
            seqs, unit, due = claim
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.plan.past_deadline():
                return
            topic = unit % len(topics)  # spread over topics, then over each topic's queues
            queue = (self.index + unit // len(topics)) % queues[topic]
            await self._send(producer, seqs, topic, queue)

    def _message(self, topic: str, seq: int) -> Message:
        body = payload.make(self.run_id, self.index, seq, time.time_ns(), self.size(), self.filler)
        keys = f"lt-{self.index}-{seq}" if self.params.keys else None
        return Message(topic, body, next(self.tags), keys)

    async def _send(self, producer: AsyncProducer, seqs: range, topic: int, queue: int) -> None:
        name = self.params.topic_names[topic]
        messages = [self._message(name, seq) for seq in seqs]
        status = "TIMEOUT"
        for attempt in range(RETRY_ATTEMPTS):
            began = time.perf_counter()
            try:
                if len(messages) == 1:
                    results = [await producer.send_message(messages[0], queue_id=queue)]
                else:
                    results = await producer.send_batch(name, messages, queue_id=queue)
            except SendError as e:
                status = e.status
                self.errors[status] += len(messages)
                if status in protocol.RETRIABLE_STATUSES and attempt + 1 < RETRY_ATTEMPTS:
                    await asyncio.sleep(0.01 * 2 ** attempt)
                    continue
                break
            except zmq.ZMQError as e:
                status = f"ZMQ:{e.errno}"
                self.errors[status] += len(messages)
                break
            self._acked(messages, seqs, topic, results, (time.perf_counter() - began) * 1e6)
            return
        outcome = records.UNKNOWN if status == "TIMEOUT" or status.startswith("ZMQ") else records.REFUSED
        self.outcomes[outcome] += len(messages)
        if self.records:
            for m, seq in zip(messages, seqs):
                self.records.add((self.index, seq, topic, -1, -1, len(m.body), outcome))
        if outcome == records.UNKNOWN:  # the node may be down: do not spin
            await asyncio.sleep(0.05)

    def _acked(self, messages: list[Message], seqs: range, topic: int, results, micros: float) -> None:
        for m, seq, r in zip(messages, seqs, results):
            outcome = records.ACKED if r.status == "PUT_OK" else records.STORED
            self.outcomes[outcome] += 1
            self.messages += 1
            self.bytes += len(m.body)
            self.ack.add(micros)
            if self.records:
                self.records.add((self.index, seq, topic, r.queue_id, r.queue_offset, len(m.body), outcome))
            if r.status != "PUT_OK":
                self.errors[r.status] += 1


class _Plan:
    """Hands out the producer's sends in order: (sequence numbers, unit index, due time). The
    due time paces the sends at `rate` (0: now); after a stall longer than MAX_CATCH_UP (the
    node was away) the schedule restarts from now instead of bursting to catch up."""

    def __init__(self, share: int | None, batch: int, rate: float, began: float, deadline: float | None):
        self.share, self.batch, self.rate, self.deadline = share, batch, rate, deadline
        self.sent = self.unit = 0
        self.paced_from, self.paced_sent = began, 0

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def claim(self) -> tuple[range, int, float] | None:
        if (self.share is not None and self.sent >= self.share) or self.past_deadline():
            return None
        count = self.batch if self.share is None else min(self.batch, self.share - self.sent)
        due = 0.0
        if self.rate:
            due = self.paced_from + (self.sent - self.paced_sent) / self.rate
            now = time.time()
            if due < now - MAX_CATCH_UP:
                self.paced_from, self.paced_sent, due = now, self.sent, now
        seqs, unit = range(self.sent, self.sent + count), self.unit
        self.sent += count
        self.unit += 1
        return seqs, unit, due


class ConsumerWorker(_Reporting):
    """Follows its share of the (topic, queue) pairs from the run's start offsets with long
    polling; once the producers are done, reads each queue up to its end at that moment, then
    stops. With --pop it pops the run's topics as a member of the run's pop group (every member
    from every queue), acking what it received, until the group has retired every queue up to
    its end at that moment."""

    role = "consumer"

    def __init__(self, params: RunParams, run_id: int, index: int, records_dir: str | None, reports, events,
                 starts: dict[tuple[int, int], int]):
        super().__init__(params, index, records_dir, reports, records.CONSUMED, "consumed")
        self.run_id = run_id
        self.produced, self.abort = events
        self.starts = dict(starts)
        self.offsets = dict(self.starts)
        self.producing_done = False
        self.aborted = False
        self.drain_deadline: float | None = None
        self.e2e = LogHistogram()
        self.foreign = 0
        self.unfinished: list[int] = []

    def extra(self) -> dict:
        return {"e2e": self.e2e.to_sparse(), "foreign": self.foreign, "unfinished": self.unfinished}

    def poll_events(self) -> None:
        self.aborted = self.aborted or self.abort.is_set()
        if not self.producing_done and self.produced.is_set():
            self.producing_done = True
            self.drain_deadline = time.monotonic() + self.params.drain_timeout

    async def run(self) -> None:
        self.report()
        reporter = asyncio.create_task(self.report_loop())
        if self.params.backlog:  # consume what was produced, after it was produced
            while not (self.producing_done or self.aborted):
                await asyncio.sleep(0.05)
                self.poll_events()
        async with AsyncPullConsumer(self.params.endpoint, timeout=self.params.send_timeout) as consumer:
            if self.params.pop:
                self.unfinished = await self._pop(consumer)
            else:
                done = await asyncio.gather(*[self._follow(consumer, q) for q in self.starts])
                self.unfinished = [f"{self.params.topic_names[t]}:{q}" for (t, q), finished in zip(self.starts, done)
                                   if not finished]
        reporter.cancel()
        self.report(done=True)
        if self.records:
            self.records.close()

    async def _follow(self, consumer: AsyncPullConsumer, pair: tuple[int, int]) -> bool:
        """Pull one queue until it is read to its end after producing ended; False if cut short."""
        topic, queue = self.params.topic_names[pair[0]], pair[1]
        target = None
        while not self.aborted:
            if self.producing_done and target is None:
                target = await _wait_for_node(lambda: consumer.max_offset(topic, queue))
            if target is not None and self.offsets[pair] >= target:
                return True
            if self.drain_deadline and time.monotonic() > self.drain_deadline:
                return False
            try:
                result = await consumer.pull(topic, queue, self.offsets[pair], max_count=PULL_BATCH,
                                             suspend_ms=SUSPEND_MS)
            except (SendError, zmq.ZMQError) as e:
                self.errors[getattr(e, "status", "ZMQ")] += 1
                await asyncio.sleep(0.05)
                continue
            if result.status == "OFFSET_ILLEGAL":
                self.errors["OFFSET_ILLEGAL"] += 1
            self._received(pair[0], result.messages)
            self.offsets[pair] = result.next_begin_offset
        return False

    async def _pop(self, consumer: AsyncPullConsumer) -> list[str]:
        """Pop every topic of the run in turn, ack what came; once producing ended, until the
        group's pop state has every queue retired up to its end then. The queues not retired
        by the drain deadline (or all, when aborted)."""
        group, names = self.params.pop_group, self.params.topic_names
        targets: dict[tuple[int, int], int] | None = None
        next_look = 0.0
        for t in itertools.cycle(range(len(names))):
            if self.aborted:
                break
            if self.producing_done and targets is None:
                targets = {pair: await _wait_for_node(lambda p=pair: consumer.max_offset(names[p[0]], p[1]))
                           for pair in self.starts}
            if targets is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 0.5
                left = await self._pop_left(consumer, targets)
                if not left or (self.drain_deadline and time.monotonic() > self.drain_deadline):
                    return left
            try:
                messages = await consumer.pop(names[t], group, max_count=PULL_BATCH, invisible_ms=self.params.invisible_ms,
                                              wait_ms=SUSPEND_MS // len(names) or 1)
            except (SendError, zmq.ZMQError) as e:
                self.errors[getattr(e, "status", "ZMQ")] += 1
                await asyncio.sleep(0.05)
                continue
            self._received(t, messages)
            if messages:
                try:
                    await consumer.ack_batch(messages)
                except (SendError, zmq.ZMQError) as e:  # (they come back after their invisible time)
                    self.errors[getattr(e, "status", "ZMQ")] += 1
        return [f"{names[t]}:{q}" for t, q in self.starts]

    async def _pop_left(self, consumer: AsyncPullConsumer, targets: dict[tuple[int, int], int]) -> list[str]:
        """The queues the group has not retired up to their target (its first message not yet
        acked is below it; a queue it never popped is where this run started it)."""
        names = self.params.topic_names
        try:
            state = await consumer.pop_state(self.params.pop_group)
        except (SendError, zmq.ZMQError) as e:
            self.errors[getattr(e, "status", "ZMQ")] += 1
            return [f"{names[t]}:{q}" for t, q in targets]
        return [f"{names[t]}:{q}" for (t, q), target in targets.items()
                if state.get(names[t], {}).get(str(q), {}).get("low", self.starts[t, q]) < target]

    def _received(self, topic: int, messages) -> None:
        now_ns = time.time_ns()
        if messages:  # the consume rate runs from the first message to the last
            self.ended = time.time()
            self.began = self.began or self.ended
        for m in messages:
            parsed = payload.read(m.body)
            self.messages += 1
            self.bytes += len(m.body)
            if parsed is not None and parsed.run_id != self.run_id:
                self.foreign += 1
                continue
            if parsed is None:
                row = (records.UNREADABLE, m.queue_offset, topic, m.queue_id, m.queue_offset, len(m.body), 0, self.index)
            else:
                self.e2e.add((now_ns - parsed.send_ns) / 1000)
                row = (parsed.producer, parsed.seq, topic, m.queue_id, m.queue_offset, len(m.body), parsed.intact,
                       self.index)
            if self.records:
                self.records.add(row)

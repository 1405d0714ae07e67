"""`scripts/bench-consume --pop`: pop consumption's figures (issue 46), 1 KiB bodies, clients beside
the node: PopConsumer members with a no-op listener over a backlog (one member, four member
processes), popped and acked; and how soon 100k messages whose invisible time ran out are all
handed out again after their due time. A benchmark, never a test.
"""

from __future__ import annotations

import multiprocessing
import time

from node.client import PullConsumer
from node.tools.bench_produce import BODY

GROUP = "BenchPop"


def _member(endpoint: str, topic: str, group: str, counts, index: int, stop, ready=None) -> None:
    from node.client.pop_consumer import CONSUME_SUCCESS, PopConsumer

    consumer = PopConsumer(endpoint, group, consume_threads=2, pops_in_flight=3, max_count=256, consume_batch=256,
                           wait_ms=500)
    consumer.subscribe(topic)
    consumer.register_listener(lambda messages: CONSUME_SUCCESS)
    if ready is not None:
        ready[index] = 1  # (its interpreter and imports are up: the clock may start)
    consumer.start()
    while not stop.is_set():
        counts[index] = consumer.statistics()["acked"]
        time.sleep(0.02)
    consumer.shutdown()


def throughput(endpoint: str, topic: str, total: int, members: int, group: str) -> float:
    """msgs/s popped and acked by `members` PopConsumer processes until `total` are acked, from
    the moment every member's process is up (a spawned interpreter importing the client takes
    ~0.5-1 s, a fifth of a 300k run: not the consumption's)."""
    context = multiprocessing.get_context("spawn")
    counts, ready, stop = context.Array("q", members), context.Array("b", members), context.Event()
    processes = [context.Process(target=_member, args=(endpoint, topic, group, counts, i, stop, ready))
                 for i in range(members)]
    started = time.perf_counter()
    for process in processes:
        process.start()
    try:
        while sum(ready) < members:
            if time.perf_counter() - started > 120:
                raise RuntimeError("the members did not start in 120 s")
            time.sleep(0.001)
        began, before = time.perf_counter(), sum(counts)
        while sum(counts) < total:
            if time.perf_counter() - began > 600:
                raise RuntimeError(f"only {sum(counts):,} of {total:,} acked in 600 s")
            time.sleep(0.01)
        elapsed, acked = time.perf_counter() - began, sum(counts) - before
    finally:
        stop.set()
        for process in processes:
            process.join(30)
    return acked / elapsed


def redelivery(endpoint: str, count: int, invisible_ms: int = 5000) -> tuple[float, float]:
    """`count` messages on a topic of their own, popped without acking; then popped again until
    all are back. Returns (seconds from the last one's due time until the last came back,
    msgs/s handed out again)."""
    from node.client import Message, Producer

    topic, group = "BenchPopRedelivery", GROUP + "-redelivery"
    with Producer(endpoint, timeout=30.0) as producer:
        for at in range(0, count, 256):
            producer.send_batch(topic, [Message(topic, BODY)] * min(256, count - at), queue_id=(at // 256) % 8)
    with PullConsumer(endpoint, timeout=30.0) as consumer:
        due, taken = 0.0, 0
        while taken < count:
            got = consumer.pop(topic, group, max_count=1024, invisible_ms=invisible_ms, wait_ms=1000)
            taken += len(got)
            if got:
                due = time.monotonic() + invisible_ms / 1000  # (the last pop's messages are due last)
        back, first = 0, None
        while back < count:
            got = consumer.pop(topic, group, max_count=1024, invisible_ms=600_000, wait_ms=1000)
            if got and first is None:
                first = time.monotonic()
            back += len(got)
            if time.monotonic() - due > 120:
                raise RuntimeError(f"only {back:,} of {count:,} came back")
        last = time.monotonic()
    return last - due, count / max(1e-9, last - (first or last))

"""scripts/bench-consume: the read path's speed on this machine, 1 KiB bodies, clients beside node.

Starts `mqnode start` on a temporary store, produces a backlog (batch sends), and prints: pull
throughput from one consumer process over the backlog (reading each body; again reading each
msgId too) and with 4 consumer processes (each taking a share of the queues), produce-to-consume
latency with long polling at a fixed 5k msgs/s, the dispatcher's lag (written - dispatched) under
batch-produce load, push consumers over the backlog (one member, four member processes;
node.tools.bench_push), and how soon a group's queues are consumed again after a member leaves
or is killed (`--pop`: pop consumption's figures instead, node.tools.bench_pop). A benchmark, never a test: the machine's floors (`node.tools.floors`) are
printed before and after the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import queue
import shutil
import tempfile
import time
from pathlib import Path

from node.client import AsyncProducer, AsyncPullConsumer, Message, aio
from node.tools import bench_push, floors
from node.tools.bench_produce import BODY, Usage, add_node_options, bench_node, node_options
from node.tools.pacing import paced
from shm.control_block import ControlBlock

TOPIC = "BenchConsume"
QUEUES = 8
EXPIRE_MS = 10_000  # clientChannelExpiredTimeout of the takeover figures' node


async def produce_backlog(endpoint: str, count: int, control: ControlBlock) -> tuple[float, int, int]:
    """Batch-send `count` messages; returns (msgs/s, max and mean dispatcher lag in bytes)."""
    lags: list[int] = []

    async def sample() -> None:
        while True:
            lags.append(control.get("written") - control.get("dispatched"))
            await asyncio.sleep(0.05)

    async with AsyncProducer(endpoint, timeout=10) as producer:
        messages = [Message(TOPIC, BODY) for _ in range(128)]
        sampler = asyncio.create_task(sample())

        async def sender(k: int) -> None:
            for i in range(count // 128 // 4):
                await producer.send_batch(TOPIC, messages, queue_id=(k + 4 * i) % QUEUES)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(4)])
        rate = (count // 128 // 4) * 128 * 4 / (time.perf_counter() - began)
        sampler.cancel()
    return rate, max(lags or [0]), sum(lags) // max(1, len(lags))


SELECT_ALL_SQL92 = "UNIQ_KEY IS NOT NULL"  # a SQL92 selector every message passes: its cost alone


async def drain(endpoint: str, queues: list[int], max_offsets: dict[int, int], ids: bool = False,
                sql92: str | None = None) -> int:
    """Pull the given queues to their end, all concurrently, reading every message's body (and
    with `ids` its msgId, as a consumer that dedupes does) as an application would: messages
    decode their fields on first use, so a drain that read nothing would flatter. Returns the
    messages received."""
    async with AsyncPullConsumer(endpoint, timeout=10) as consumer:
        async def one(q: int) -> int:
            offset, got, body_bytes = 0, 0, 0
            while offset < max_offsets[q]:
                result = await (consumer.pull(TOPIC, q, offset, max_count=32) if sql92 is None else
                                consumer.pull(TOPIC, q, offset, max_count=32, subscription=sql92, expression_type="SQL92"))
                for message in result.messages:
                    body_bytes += len(message.body)
                    if ids and not message.msg_id:
                        raise AssertionError(f"a message without a msgId at queue {q} offset {message.queue_offset}")
                got += len(result.messages)
                offset = result.next_begin_offset
            if body_bytes != got * len(BODY):
                raise AssertionError(f"queue {q}: {body_bytes} body bytes for {got} messages of {len(BODY)}")
            return got

        return sum(await asyncio.gather(*[one(q) for q in queues]))


def _drain_process(endpoint: str, queues: list[int], max_offsets: dict[int, int], ids: bool, sql92, out) -> None:
    """One drainer's count, or what stopped it (a str): the parent waits for one answer from each."""
    try:
        out.put(aio.run(drain(endpoint, queues, max_offsets, ids, sql92)))
    except BaseException as e:  # noqa: BLE001 (reported by the parent, which would wait for it forever)
        out.put(f"{type(e).__name__}: {e}")
        raise


def parallel_drain(endpoint: str, max_offsets: dict[int, int], processes: int, ids: bool = False,
                   sql92: str | None = None) -> float:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    shares = [[q for q in range(QUEUES) if q % processes == p] for p in range(processes)]
    workers = [context.Process(target=_drain_process, args=(endpoint, share, max_offsets, ids, sql92, out))
               for share in shares]
    began = time.perf_counter()
    for w in workers:
        w.start()
    answers: list = []
    while len(answers) < len(workers):
        try:
            answers.append(out.get(timeout=1))
        except queue.Empty:  # (one killed outright answers nothing: not waited for forever)
            if not any(w.is_alive() for w in workers) and out.empty():
                raise RuntimeError(f"{len(workers) - len(answers)} of {len(workers)} drainers died without an answer") from None
    elapsed = time.perf_counter() - began
    for w in workers:
        w.join()
    failures = [a for a in answers if isinstance(a, str)]
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(workers)} drainers failed: {failures[0]}")
    return sum(answers) / elapsed


async def end_to_end(endpoint: str, rate: int, seconds: float) -> tuple[float, float]:
    """Produce at `rate` to one queue while a long-polling consumer follows; (p50, p99) µs from
    send to receipt."""
    async with AsyncProducer(endpoint, linger_ms=0) as producer, AsyncPullConsumer(endpoint) as consumer:
        await producer.send("BenchLatency", b"warm", queue_id=0)
        start_offset = await consumer.max_offset("BenchLatency", 0)
        sent: dict[str, float] = {}
        latencies: list[float] = []
        total = int(rate * seconds)

        async def follow() -> None:
            offset = start_offset
            while len(latencies) < total:
                result = await consumer.pull("BenchLatency", 0, offset, suspend_ms=1000)
                now = time.perf_counter()
                for m in result.messages:
                    if m.msg_id in sent:
                        latencies.append(now - sent[m.msg_id])
                offset = result.next_begin_offset

        async def send(i: int) -> None:
            key = f"lat-{i}"
            sent[key] = time.perf_counter()  # before the send: the consumer may see it before the ack
            await producer.send("BenchLatency", BODY, queue_id=0, properties={"UNIQ_KEY": key})

        follower = asyncio.create_task(follow())
        await paced(rate, seconds, send)
        await asyncio.wait_for(follower, 30)
    latencies.sort()
    return latencies[len(latencies) // 2] * 1e6, latencies[int(len(latencies) * 0.99)] * 1e6


def takeover_figures(directory: Path, options: dict[str, str]) -> None:
    """How soon a group's queues are consumed again when a member leaves, on a node whose
    clientChannelExpiredTimeout is EXPIRE_MS (a killed member's closed connection is noticed at
    once; the timeout is for one cut off, whose connection stays open)."""
    directory.mkdir()
    with bench_node(directory, "ASYNC_FLUSH", None, options | {"clientChannelExpiredTimeout": str(EXPIRE_MS)}) as node:
        from node.client import Producer

        with Producer(node.endpoint) as producer:
            def send_each_queue() -> None:
                for q in range(QUEUES):
                    producer.send("BenchTakeover", b"x", queue_id=q)

            send_each_queue()
            left = bench_push.takeover(node.endpoint, "BenchTakeover", False, send_each_queue)
            killed = bench_push.takeover(node.endpoint, "BenchTakeover", True, send_each_queue)
    print(f"rebalance after a member unregisters: its queues consumed again after {left:.2f} s (target <= 1)")
    print(f"rebalance after a member is killed: after {killed:.2f} s (target <= clientChannelExpiredTimeout "
          f"{EXPIRE_MS / 1000:.0f} s + 1)")


def pop_figures(backlog: int, options: dict[str, str]) -> None:
    """`--pop`: PopConsumer members over the backlog (each count a group of its own, so each
    consumes all of it), and the redelivery of 100k messages whose invisible time ran out."""
    from node.tools import bench_pop

    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-pop-"))
    print(f"mqnode bench-consume --pop: 1 KiB bodies, backlog {backlog:,}, client(s) on the same machine")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        with bench_node(base, "ASYNC_FLUSH", None, options) as node:
            control = ControlBlock(base / "store" / "control")
            rate, _, _ = aio.run(produce_backlog(node.endpoint, backlog, control))
            print(f"backlog produced at {rate:,.0f} msgs/s")
            total = backlog // 128 // 4 * 128 * 4
            for members in (1, 4):
                usage = Usage(node)
                rate = bench_pop.throughput(node.endpoint, TOPIC, total, members, f"{bench_pop.GROUP}-{members}")
                print(f"pop, {members} PopConsumer process{'es' if members > 1 else ''}, no-op listener, popped and "
                      f"acked: {rate:>10,.0f} msgs/s (target >= 150,000); {usage.report()}")
            late, rate = bench_pop.redelivery(node.endpoint, 100_000)
            print(f"redelivery of 100,000 expired messages: the last back {late:.2f} s after its due time "
                  f"(target <= 2); handed out again at {rate:,.0f} msgs/s")
            control.close()
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, help="messages produced first (default 1,000,000; 300,000 with --pop)")
    parser.add_argument("--pop", action="store_true", help="pop consumption's figures instead (node.tools.bench_pop)")
    add_node_options(parser)
    args = parser.parse_args()
    options = node_options(args)
    if args.pop:
        return pop_figures(args.backlog or 300_000, options)
    args.backlog = args.backlog or 1_000_000
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-consume-"))
    print(f"mqnode bench-consume: 1 KiB bodies, backlog {args.backlog:,}, client(s) on the same machine")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        with bench_node(base, "ASYNC_FLUSH", None, {"enablePropertyFilter": "true", **options}) as node:
            control = ControlBlock(base / "store" / "control")
            rate, lag_max, lag_mean = aio.run(produce_backlog(node.endpoint, args.backlog, control))
            print(f"backlog produced at {rate:,.0f} msgs/s; dispatcher lag under that load: "
                  f"max {lag_max / 2**20:.1f} MiB, mean {lag_mean / 2**20:.1f} MiB")
            while control.get("dispatched") < control.get("written"):
                time.sleep(0.05)

            async def tops() -> dict[int, int]:
                async with AsyncPullConsumer(node.endpoint) as c:
                    return {q: await c.max_offset(TOPIC, q) for q in range(QUEUES)}

            max_offsets = aio.run(tops())
            usage = Usage(node)
            rate = parallel_drain(node.endpoint, max_offsets, 1)
            print(f"pull, 1 consumer process over the backlog : {rate:>10,.0f} msgs/s (target >= 250,000); "
                  f"{usage.report()}")
            usage = Usage(node)
            rate = parallel_drain(node.endpoint, max_offsets, 1, ids=True)
            print(f"pull, 1 consumer, reading msgIds too      : {rate:>10,.0f} msgs/s; {usage.report()}")
            usage = Usage(node)
            rate = parallel_drain(node.endpoint, max_offsets, 1, sql92=SELECT_ALL_SQL92)
            print(f"pull, 1 consumer, a SQL92 selector all pass: {rate:>10,.0f} msgs/s; {usage.report()}")
            usage = Usage(node)
            rate = parallel_drain(node.endpoint, max_offsets, 4)
            print(f"pull, 4 consumer processes                : {rate:>10,.0f} msgs/s; {usage.report()}")
            for rate in (1000, 5000):
                p50, p99 = aio.run(end_to_end(node.endpoint, rate, 5.0))
                print(f"produce-to-consume, long polling, {rate // 1000}k msgs/s: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs "
                      f"(target at 5k: <= 5,000)")
            for members, target in ((1, 150_000), (4, 200_000)):
                usage = Usage(node)
                rate = bench_push.throughput(node.endpoint, TOPIC, sum(max_offsets.values()), members)
                print(f"push consumer{'s' if members > 1 else ''}, {members} member process{'es' if members > 1 else ''}, "
                      f"no-op listener: {rate:>10,.0f} msgs/s (target >= {target:,}); {usage.report()}")
            control.close()
        takeover_figures(base / "takeover", options)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""`scripts/bench-request`: request-reply's figures (node.client.replies), 1 KiB bodies, clients
beside the node. A benchmark, never a test.

Starts `mqnode start` on a temporary store and a replier process (a PushConsumer whose listener
answers each request with `Producer.send_reply`, a 1 KiB reply), then prints: requests answered a
second with `--in-flight` (64) waiting at once from one AsyncRequester, their round trip's p50 and
p99 and the node's CPU a request (the request's send and store, its dispatch and pull, the reply's
push and store); and the round trip of lone requests at `--rate` (500) a second.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

from node.tools import floors
from node.tools.bench_produce import BODY, Usage, add_node_options, bench_node, node_options
from node.tools.pacing import paced

TOPIC, SERVERS, CALLERS = "BenchRequest", "BenchRepliers", "BenchCallers"


def _replier(endpoint: str, ready, stop) -> None:
    """A push consumer answering every request it gets, its batch's replies sent together."""
    from node.client import Producer
    from node.client.push import CONSUME_SUCCESS, PushConsumer

    producer = Producer(endpoint, timeout=30.0)

    def listener(messages) -> str:
        answers = [producer._call_async(producer.inner.send_reply(m, BODY)) for m in messages]
        for answer in answers:
            answer.result()
        return CONSUME_SUCCESS

    consumer = PushConsumer(endpoint, SERVERS, consume_from_where="LAST_OFFSET", consume_message_batch_max_size=32)
    consumer.subscribe(TOPIC)
    consumer.register_listener(listener)
    consumer.start()
    ready.set()
    stop.wait()
    consumer.shutdown()
    producer.close()


def _percentile(samples: list[float], share: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(len(samples) * share))] * 1000


async def in_flight(endpoint: str, count: int, concurrency: int) -> tuple[float, list[float]]:
    """(requests answered a second, each one's round trip in s) with `concurrency` waiting at once."""
    from node.client import AsyncRequester

    samples: list[float] = []
    async with AsyncRequester(endpoint, CALLERS, timeout=30.0) as requester:
        await requester.request(TOPIC, BODY, timeout=30)  # (the replier's queues assigned, its pulls waiting)
        left = iter(range(count))

        async def caller() -> None:
            for _ in left:
                began = time.perf_counter()
                await requester.request(TOPIC, BODY, timeout=30)
                samples.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return count / (time.perf_counter() - began), samples


async def lone(endpoint: str, rate: int, seconds: float) -> list[float]:
    from node.client import AsyncRequester

    samples: list[float] = []
    async with AsyncRequester(endpoint, CALLERS + "-lone", timeout=30.0) as requester:
        async def one(_: int) -> None:
            began = time.perf_counter()
            await requester.request(TOPIC, BODY, timeout=30)
            samples.append(time.perf_counter() - began)

        await paced(rate, seconds, one)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=50_000, help="requests with --in-flight waiting (default 50,000)")
    parser.add_argument("--in-flight", type=int, default=64, help="requests waiting at once (default 64)")
    parser.add_argument("--rate", type=int, default=500, help="lone requests a second (default 500, for 5 s)")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-request-"))
    print("mqnode bench-request: 1 KiB requests and replies, a push consumer process replying, clients on the "
          "same machine")
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    try:
        print(f"before: {floors.report(base)}", flush=True)
        with bench_node(base, "ASYNC_FLUSH", None, node_options(args)) as node:
            replier = context.Process(target=_replier, args=(node.endpoint, ready, stop), daemon=True)
            replier.start()
            try:
                if not ready.wait(120):
                    raise RuntimeError("the replier did not start in 120 s")
                usage = Usage(node)
                rate, samples = asyncio.run(in_flight(node.endpoint, args.count, args.in_flight))
                print(f"request-reply, {args.in_flight} in flight: {rate:>9,.0f} requests/s, round trip p50 "
                      f"{_percentile(samples, 0.5):.1f} ms, p99 {_percentile(samples, 0.99):.1f} ms; "
                      f"{usage.report(args.count)}", flush=True)
                samples = asyncio.run(lone(node.endpoint, args.rate, 5.0))
                print(f"request-reply, lone requests at {args.rate}/s: round trip p50 {_percentile(samples, 0.5):.1f} "
                      f"ms, p99 {_percentile(samples, 0.99):.1f} ms", flush=True)
            finally:
                stop.set()
                replier.join(30)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

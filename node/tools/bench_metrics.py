"""scripts/bench-metrics: what a scrape of /metrics costs. A benchmark, never a test.

Starts a node with `metricsPort`, creates `--topics` topics of 8 queues (one message a queue),
has one consumer group commit an offset on every queue (so each scrape reads every queue's max
offset for the lag), then times `--scrapes` scrapes (target: <= 200 ms for 1,000 topics x 8).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

from node.client import AsyncProducer, AsyncPullConsumer, aio
from node.tools.bench_produce import add_node_options, bench_node, node_options
from node.tools.local_node import free_port

QUEUES = 8


async def fill(endpoint: str, topics: int) -> None:
    async with AsyncProducer(endpoint, timeout=30.0) as producer:
        for first in range(0, topics, 100):
            await asyncio.gather(*[producer.send(f"Metrics{t}", b"m", queue_id=q)
                                   for t in range(first, min(topics, first + 100)) for q in range(QUEUES)])
    async with AsyncPullConsumer(endpoint, timeout=30.0) as consumer:
        for first in range(0, topics, 100):
            await asyncio.gather(*[consumer.commit("scraped", f"Metrics{t}", q, 0)
                                   for t in range(first, min(topics, first + 100)) for q in range(QUEUES)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=10)
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-metrics-"))
    port = free_port()
    try:
        with bench_node(base, "ASYNC_FLUSH", None, {"metricsPort": str(port), **node_options(args)}) as node:
            aio.run(fill(node.endpoint, args.topics))
            time.sleep(2)  # the services' statistics reach the front once a second
            url = f"http://127.0.0.1:{port}/metrics"
            times, size = [], 0
            for _ in range(args.scrapes):
                began = time.perf_counter()
                size = len(urllib.request.urlopen(url, timeout=30).read())
                times.append((time.perf_counter() - began) * 1000)
            times.sort()
            print(f"/metrics with {args.topics:,} topics x {QUEUES} queues and one group on each: {size:,} bytes; "
                  f"scrape p50 {times[len(times) // 2]:.0f} ms, max {times[-1]:.0f} ms (target <= 200 ms)")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

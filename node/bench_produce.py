"""scripts/bench-produce: the write path's speed on this machine, 1 KiB bodies, client beside node.

Starts `mqnode start` on a temporary store for each flush mode and prints:
ASYNC_FLUSH with send_batch and with concurrent single sends, SYNC_FLUSH with 64 concurrent
senders, ack latency p50/p99 at a fixed 5k msgs/s, and the node's CPU and memory (psutil over
every process of the node). A benchmark, never a test: the figures depend on the machine, so the
machine's floors (`node.floors`) are printed before and after them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil

from node import aio, floors
from node.client import AsyncProducer, Message
from node.local_node import NodeProcess, local_settings

BODY = bytes(range(256)) * 4


@contextlib.contextmanager
def bench_node(directory: Path, flush: str, ingress: int):
    """`mqnode start` on `directory` with this flush mode and ingress workers, stopped after."""
    node = NodeProcess(local_settings(directory, flushDiskType=flush, ingressWorkers=ingress),
                       directory / "node.log").start(timeout=120)
    try:
        yield node
    finally:
        node.stop(timeout=60, strict=False)


class Usage:
    """CPU seconds and peak RSS of the node's processes over a measured stretch."""

    def __init__(self, node: NodeProcess):
        self.processes = node.tree()
        self.cpu0 = self._cpu()
        self.began = time.perf_counter()

    def _cpu(self) -> float:
        total = 0.0
        for p in self.processes:
            try:
                times = p.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total

    def report(self) -> str:
        elapsed = time.perf_counter() - self.began
        rss = 0
        for p in self.processes:
            try:
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        return f"node CPU {100 * (self._cpu() - self.cpu0) / elapsed:.0f}% of one core, RSS {rss / 2**20:.0f} MiB"


async def batches(endpoint: str, count: int, batch: int, senders: int) -> float:
    async with AsyncProducer(endpoint) as producer:
        messages = [Message("BenchBatch", BODY) for _ in range(batch)]
        await producer.send_batch("BenchBatch", messages)

        async def sender(k: int) -> None:
            for _ in range(count // batch // senders):
                await producer.send_batch("BenchBatch", messages)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        return (count // batch // senders) * batch * senders / (time.perf_counter() - began)


async def singles(endpoint: str, count: int, senders: int, topic: str) -> float:
    async with AsyncProducer(endpoint) as producer:
        await producer.send(topic, BODY)

        async def sender(k: int) -> None:
            for _ in range(count // senders):
                await producer.send(topic, BODY)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        return (count // senders) * senders / (time.perf_counter() - began)


async def paced(rate: int, seconds: float, send: Callable[[int], Awaitable[None]]) -> None:
    """Start `send(i)` at `rate`/s for `seconds` and wait for them all. Only the sends in flight
    are held: with a list of every task (25k at 5k/s) the client's GC collected every ~300 ms,
    some collections pausing it ~15 ms, and the latency figures counted those pauses against
    the node (traced with gc.callbacks)."""
    in_flight: set[asyncio.Task] = set()
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(send(i))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    while in_flight:
        await asyncio.gather(*in_flight)


async def latency(endpoint: str, rate: int, seconds: float) -> tuple[float, float]:
    """Paced single sends at `rate`/s; (p50, p99) ack latency in µs."""
    async with AsyncProducer(endpoint, linger_ms=0) as producer:
        await producer.send("BenchLatency", BODY)
        samples: list[float] = []

        async def one(_: int) -> None:
            began = time.perf_counter()
            await producer.send("BenchLatency", BODY)
            samples.append(time.perf_counter() - began)

        await paced(rate, seconds, one)
        samples.sort()
        return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000, help="messages per throughput figure")
    parser.add_argument("--ingress-workers", type=int, nargs="+", default=[0, 2],
                        help="ingressWorkers settings to compare (0 = the writer encodes)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-produce-"))
    print(f"mqnode bench-produce: 1 KiB bodies, {psutil.cpu_count()} cores, client on the same machine")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        for ingress in args.ingress_workers:
            directory = base / f"async-{ingress}-{len(list(base.iterdir()))}"
            directory.mkdir()
            with bench_node(directory, "ASYNC_FLUSH", ingress) as node:
                usage = Usage(node)
                rate = aio.run(batches(node.endpoint, args.count, 128, 4))
                print(f"[ingressWorkers={ingress}] ASYNC_FLUSH send_batch (128/batch, 4 senders): {rate:>9,.0f} msgs/s "
                      f"(target >= 150,000); {usage.report()}")
                usage = Usage(node)
                rate = aio.run(singles(node.endpoint, args.count, 1024, "BenchSingle"))
                print(f"[ingressWorkers={ingress}] ASYNC_FLUSH concurrent single sends (1024):    {rate:>9,.0f} msgs/s "
                      f"(target >= 80,000); {usage.report()}")
                if ingress == args.ingress_workers[0]:
                    usage = Usage(node)
                    p50, p99 = aio.run(latency(node.endpoint, 5000, 5.0))
                    print(f"[ingressWorkers={ingress}] ack latency at 5k msgs/s: p50 {p50:,.0f} µs (target <= 300), "
                          f"p99 {p99:,.0f} µs (target <= 2,000); {usage.report()}")
        directory = base / "sync"
        directory.mkdir()
        with bench_node(directory, "SYNC_FLUSH", args.ingress_workers[0]) as node:
            usage = Usage(node)
            rate = aio.run(singles(node.endpoint, args.count // 2, 64, "BenchSync"))
            print(f"[ingressWorkers={args.ingress_workers[0]}] SYNC_FLUSH, 64 concurrent senders:            "
                  f"{rate:>9,.0f} msgs/s (target >= 50,000); {usage.report()}")
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

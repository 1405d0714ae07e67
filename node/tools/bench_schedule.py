"""scripts/bench-schedule: delayed delivery's speed. A benchmark, never a test.

Sends `--count` 1 KiB messages with delay level 1 (set to `--delay-s` seconds) as concurrent
single sends, and as many without a delay, alternately twice, and prints what a delay costs the
write path (target: no more than 20 %). Then, all of one level due at once, it reads the
delivered messages from their real topic and prints the delivery rate (target >= 50k msgs/s) and
how late the first ones were stored after their due time (target <= 150 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from node.client import AsyncProducer, AsyncPullConsumer, aio
from node.tools.bench_produce import BODY, add_node_options, bench_node, node_options

SENDERS = 1024


async def send_many(endpoint: str, topic: str, count: int, delay_level: int) -> float:
    async with AsyncProducer(endpoint, timeout=30.0) as producer:
        await producer.send(topic, BODY, delay_level=delay_level)

        async def sender(_: int) -> None:
            for _ in range(count // SENDERS):
                await producer.send(topic, BODY, delay_level=delay_level)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(SENDERS)])
        return count // SENDERS * SENDERS / (time.perf_counter() - began)


async def read_delivered(endpoint: str, topic: str, count: int, delay_ms: int, timeout: float) -> list[tuple[int, int]]:
    """(store time, due time) of each delivered message, as they arrive."""
    out: list[tuple[int, int]] = []
    async with AsyncPullConsumer(endpoint, timeout=30.0) as consumer:
        queues = await consumer.client.queue_count(topic)
        offsets = [0] * queues
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:  # (count: what was sent)
            results = await asyncio.gather(*[consumer.pull(topic, q, offsets[q], suspend_ms=200) for q in range(queues)])
            for q, result in enumerate(results):
                out += [(m.store_timestamp, m.born_timestamp + delay_ms) for m in result.messages]
                offsets[q] = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset
    return out


async def _level_one(endpoint: str) -> dict:
    from node import protocol

    async with AsyncProducer(endpoint) as client:
        info, _ = await client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return ((info.get("actors") or {}).get("schedule") or {}).get("levels", {}).get("1", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--delay-s", type=int, default=20, help="level 1's delay: all sends land before it is due")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-schedule-"))
    levels = " ".join([f"{args.delay_s}s"] * 18)
    try:
        with bench_node(base, "ASYNC_FLUSH", 0, {"messageDelayLevel": levels, **node_options(args)}) as node:
            plain, delayed = [], []
            for round_ in range(2):
                plain.append(aio.run(send_many(node.endpoint, "BenchPlain", args.count // 2, 0)))
                delayed.append(aio.run(send_many(node.endpoint, f"BenchDelayed{round_}", args.count // 2, 1)))
            print(f"concurrent single sends: plain {min(plain):,.0f}-{max(plain):,.0f} msgs/s, with a delay "
                  f"{min(delayed):,.0f}-{max(delayed):,.0f} msgs/s (cost {100 * (1 - sum(delayed) / sum(plain)):+.0f} %, "
                  f"target <= 20 %)", flush=True)
            delivered = []
            for round_ in range(2):
                delivered += aio.run(read_delivered(node.endpoint, f"BenchDelayed{round_}",
                                                    args.count // 2 // SENDERS * SENDERS + 1,
                                                    args.delay_s * 1000, timeout=args.delay_s + 120))
            if not delivered:
                print("nothing was delivered")
                return
            stored = sorted(s for s, _ in delivered)
            late = sorted(s - due for s, due in delivered)
            span = max(1, stored[-1] - stored[0]) / 1000
            first = sorted(delivered)[: max(1, len(delivered) // 100)]
            level = aio.run(_level_one(node.endpoint))
            print(f"the schedule service's level 1: {level.get('delivered'):,} delivered, {level.get('dropped')} dropped, "
                  f"offset {level.get('offset'):,} of {level.get('maxOffset'):,}")
            sent = 2 * (args.count // 2 // SENDERS * SENDERS + 1)  # (each round's first send warms up)
            print(f"read back {len(delivered):,} of {sent:,} at {len(delivered) / span:,.0f} "
                  f"msgs/s (target >= 50,000); the first 1 % stored {max(s - d for s, d in first)} ms after due at most "
                  f"(target <= 150); lateness p50 {late[len(late) // 2]} ms, p99 {late[int(len(late) * 0.99)]} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

"""scripts/bench-schedule: delayed delivery's speed. A benchmark, never a test.

Sends `--count` 1 KiB messages with delay level 1 (set to `--delay-s` seconds) as concurrent
single sends, and as many without a delay, alternately twice, and prints what a delay costs the
write path (target: no more than 20 %). Then, all of one level due at once, it reads the
delivered messages from their real topic and prints the delivery rate (target >= 50k msgs/s) and
how late the first ones were stored after their due time (target <= 150 ms).

Timers (`--timers`, 0 to skip): on a fresh node, `--timers` 16-byte timer messages due over
`--timer-span-s` seconds, and what holding them pending costs the schedule process (its USS:
heap plus the timer log's pages; the CommitLog's pages are the page cache's, shared; target
<= 200 MiB for 1,000,000 over 10 minutes). Then, on another fresh node, `--timer-rate` timers due
a second for `--timer-due-s` seconds, read back from their topic: lateness against the time each
asked for (target p99 <= timerPrecisionMs + 100 ms).
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
    """(store time, due time) of each delivered message, as they arrive. The due time is the
    node's: when the delayed copy was stored, plus the level's delay (RocketMQ's tag slot)."""
    out: list[tuple[int, str]] = []
    async with AsyncPullConsumer(endpoint, timeout=30.0) as consumer:
        queues = await consumer.client.queue_count(topic)
        offsets = [0] * queues
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:  # (count: what was sent)
            results = await asyncio.gather(*[consumer.pull(topic, q, offsets[q], suspend_ms=200) for q in range(queues)])
            for q, result in enumerate(results):
                out += [(m.store_timestamp, m.msg_id) for m in result.messages]
                offsets[q] = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset
        stored = await _schedule_store_times(consumer, {msg_id for _, msg_id in out})
    return [(at, stored[msg_id] + delay_ms) for at, msg_id in out if msg_id in stored]


async def _schedule_store_times(consumer, wanted: set[str]) -> dict[str, int]:
    """UNIQ_KEY -> store time of the delayed copies in SCHEDULE_TOPIC_XXXX queue 0 (level 1)."""
    found: dict[str, int] = {}
    offset = 0
    while True:
        result = await consumer.pull("SCHEDULE_TOPIC_XXXX", 0, offset, max_count=32)
        if not result.messages:
            return found
        found.update((m.msg_id, m.store_timestamp) for m in result.messages if m.msg_id in wanted)
        offset = result.next_begin_offset


async def _level_one(endpoint: str) -> dict:
    from node import protocol

    async with AsyncProducer(endpoint) as client:
        info, _ = await client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return ((info.get("actors") or {}).get("schedule") or {}).get("levels", {}).get("1", {})


SMALL = b"x" * 16


async def send_timers(endpoint: str, topic: str, due_times: list[int], senders: int = SENDERS) -> float:
    async with AsyncProducer(endpoint, timeout=60.0) as producer:
        await producer.send(topic, SMALL, deliver_at_ms=due_times[0])

        async def sender(k: int) -> None:
            for due in due_times[k::senders]:
                await producer.send(topic, SMALL, deliver_at_ms=due)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        return len(due_times) / (time.perf_counter() - began)


async def _schedule_stats(endpoint: str) -> dict:
    from node import protocol

    async with AsyncProducer(endpoint) as client:
        info, _ = await client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
    return (info.get("actors") or {}).get("schedule") or {}


def _wait_taken(endpoint: str, count: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        timers = aio.run(_schedule_stats(endpoint)).get("timers") or {}
        if timers.get("pending", 0) >= count or time.monotonic() > deadline:
            return timers
        time.sleep(1)


def _uss(process) -> int:
    return process.memory_full_info().uss


def timer_memory(base: Path, args) -> None:
    count, span = args.timers, args.timer_span_s
    (base / "timer-memory").mkdir()
    with bench_node(base / "timer-memory", "ASYNC_FLUSH", None, node_options(args)) as node:
        schedule = node.actor_process("schedule")
        before = _uss(schedule)
        start = int(time.time() * 1000) + 120_000  # none due while they are sent and counted
        due_times = [start + i * span * 1000 // count for i in range(count)]
        rate = aio.run(send_timers(node.endpoint, "BenchTimers", due_times))
        timers = _wait_taken(node.endpoint, count, timeout=120)
        after = _uss(schedule)
        log = timers.get("log", {})
        print(f"timers: {count:,} sent at {rate:,.0f} msgs/s, {timers.get('pending', 0):,} pending over {span} s in "
              f"{timers.get('slots', 0):,} slots; the schedule process grew {(after - before) / 2**20:,.0f} MiB "
              f"(USS; target <= 200 MiB for 1,000,000), the timer log holds {log.get('end', 0) - log.get('start', 0):,} "
              f"entries in {log.get('files')} files", flush=True)


async def read_timers(endpoint: str, topic: str, count: int, timeout: float) -> list[tuple[int, int]]:
    """(store time, asked due time) of each delivered timer."""
    out: list[tuple[int, int]] = []
    async with AsyncPullConsumer(endpoint, timeout=30.0) as consumer:
        queues = await consumer.client.queue_count(topic)
        offsets = [0] * queues
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            results = await asyncio.gather(*[consumer.pull(topic, q, offsets[q], suspend_ms=200) for q in range(queues)])
            for q, result in enumerate(results):
                out += [(m.store_timestamp, int(m.properties["TIMER_DELIVER_MS"])) for m in result.messages]
                offsets[q] = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset
    return out


def timer_lateness(base: Path, args) -> None:
    rate, seconds = args.timer_rate, args.timer_due_s
    options = node_options(args)
    (base / "timer-lateness").mkdir()
    with bench_node(base / "timer-lateness", "ASYNC_FLUSH", None, options) as node:
        start = int(time.time() * 1000) + 30_000
        due_times = [start + i * 1000 // rate for i in range(rate * seconds)]
        sent = aio.run(send_timers(node.endpoint, "BenchTimerDue", due_times))
        got = aio.run(read_timers(node.endpoint, "BenchTimerDue", len(due_times) + 1, timeout=seconds + 120))
        late = sorted(stored - due for stored, due in got)
        if not late:
            print("timers: nothing was delivered")
            return
        precision = int(options.get("timerPrecisionMs", 1000))
        print(f"timers: {len(due_times):,} due at {rate:,}/s for {seconds} s (sent at {sent:,.0f} msgs/s), {len(got):,} "
              f"read back; lateness p50 {late[len(late) // 2]} ms, p99 {late[len(late) * 99 // 100]} ms, max {late[-1]} ms "
              f"(target p99 <= {precision + 100} ms), early {sum(1 for x in late if x < 0)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--delay-s", type=int, default=20, help="level 1's delay: all sends land before it is due")
    parser.add_argument("--timers", type=int, default=1_000_000, help="pending timers for the memory figure (0: skip)")
    parser.add_argument("--timer-span-s", type=int, default=600)
    parser.add_argument("--timer-rate", type=int, default=10_000, help="timers due a second for the lateness figure (0: skip)")
    parser.add_argument("--timer-due-s", type=int, default=30)
    parser.add_argument("--skip-levels", action="store_true", help="only the timer figures")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-schedule-"))
    levels = " ".join([f"{args.delay_s}s"] * 18)
    try:
        if not args.skip_levels:
            levels_figures(base, levels, args)
        if args.timers:
            timer_memory(base, args)
        if args.timer_rate:
            timer_lateness(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def levels_figures(base: Path, levels: str, args) -> None:
    directory = base / "levels"
    directory.mkdir()
    with bench_node(directory, "ASYNC_FLUSH", None, {"messageDelayLevel": levels, **node_options(args)}) as node:
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


if __name__ == "__main__":
    main()

"""scripts/bench-clean: what deleting expired segments costs the write path, and whether deletion
keeps up with fast appends. A benchmark, never a test.

1. **Deleting under load.** A node with 64 MiB segments is filled with `--delete-gib` GiB (1 KiB
   bodies), the segments are aged past `fileReservedTime`, and producers then send batches at
   half the node's measured peak rate for `--seconds`: once without cleaning (the baseline) and
   once while `admin clean` deletes the aged segments and their ConsumeQueue and index files.
   Printed: the achieved produce rate and the ack p99 of both runs (target: the rate drops by
   less than 10 %, the p99 stays within 2x), and how fast the clean deleted.
2. **Keeping up.** A node whose `diskSpaceCleanForciblyRatio` is below the disk's use (so the
   clean service deletes whatever it may, age ignored) takes `--keep-up-mbps` MB/s of appends
   for `--seconds`; printed: the append and deletion rates and the most CommitLog bytes on disk
   at once (bounded when deletion keeps up).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path

from node import protocol
from node.client import AsyncProducer, Message, SendError, aio
from node.tools import floors
from node.tools.bench_produce import BODY, add_node_options, bench_node, node_options
from node.tools.pacing import paced

SEGMENT = 64 * 1024 * 1024
BATCH = 64  # messages a send_batch: 64 KiB
DAY_NS = 24 * 3600 * 10**9


async def fill(endpoint: str, total_bytes: int, senders: int = 4) -> float:
    """Send `total_bytes` of 1 KiB bodies in batches; returns MB/s."""
    batches = total_bytes // (len(BODY) * BATCH)
    async with AsyncProducer(endpoint, timeout=30.0) as producer:
        messages = [Message("BenchClean", BODY) for _ in range(BATCH)]

        async def sender(k: int) -> None:
            for _ in range(batches // senders):
                await producer.send_batch("BenchClean", messages)

        began = time.perf_counter()
        await asyncio.gather(*[sender(k) for k in range(senders)])
        return batches // senders * senders * BATCH * len(BODY) / (time.perf_counter() - began) / 1e6


async def paced_load(endpoint: str, rate: float, seconds: float, during=None) -> tuple[float, float, object, str]:
    """Batches at `rate` msgs/s for `seconds` (and `during()` alongside, when given); returns the
    achieved msgs/s (of the batches stored), the ack p99 in ms, what `during` returned, and the
    batches the node refused, by status ("" for none: a load beyond the node's is refused
    SYSTEM_BUSY, and counted, not raised)."""
    async with AsyncProducer(endpoint, timeout=30.0, linger_ms=0) as producer:
        messages = [Message("BenchClean", BODY) for _ in range(BATCH)]
        samples: list[float] = []
        refused: collections.Counter = collections.Counter()

        async def one(_: int) -> None:
            began = time.perf_counter()
            try:
                await producer.send_batch("BenchClean", messages)
            except SendError as e:
                refused[e.status] += 1
                return
            samples.append(time.perf_counter() - began)

        began = time.perf_counter()
        side = asyncio.ensure_future(during(producer)) if during else None
        await paced(max(1, int(rate / BATCH)), seconds, one)
        elapsed = time.perf_counter() - began
        result = await side if side else None
        samples.sort()
        p99 = samples[int(len(samples) * 0.99)] * 1e3 if samples else float("nan")
        return len(samples) * BATCH / elapsed, p99, result, _refusals(refused)


def _refusals(refused: collections.Counter) -> str:
    if not refused:
        return ""
    return "; batches refused: " + ", ".join(f"{count:,} {status}" for status, count in refused.most_common())


async def clean_now(producer: AsyncProducer) -> tuple[dict, float]:
    began = time.perf_counter()
    reply, _ = await producer.request({"code": protocol.DELETE_EXPIRED_COMMITLOG}, timeout=600)
    return reply, time.perf_counter() - began


def age(directory: Path) -> int:
    old = time.time_ns() - 4 * DAY_NS
    segments = sorted((directory / "commitlog").iterdir())
    for path in segments:
        os.utime(path, ns=(old, old))
    return len(segments)


def deleting_under_load(base: Path, gib: float, seconds: float, options: dict[str, str]) -> None:
    directory = base / "under-load"
    directory.mkdir()
    settings = {"mappedFileSizeCommitLog": SEGMENT, **options}
    with bench_node(directory, "ASYNC_FLUSH", None, settings) as node:
        mbps = aio.run(fill(node.endpoint, int(gib * 2**30)))
        peak = mbps * 1e6 / len(BODY)
        print(f"filled {gib:g} GiB at {mbps:,.0f} MB/s ({peak:,.0f} msgs/s: the peak); load at half of it", flush=True)
        half = peak / 2
        rate, p99, _, refused = aio.run(paced_load(node.endpoint, half, seconds))
        print(f"without cleaning: {rate:>9,.0f} msgs/s, ack p99 {p99:,.1f} ms{refused}", flush=True)
        aged = age(directory / "store")
        with_rate, with_p99, (reply, took), refused = aio.run(paced_load(node.endpoint, half, seconds, clean_now))
        deleted = reply.get("bytes", 0)
        print(f"while deleting:   {with_rate:>9,.0f} msgs/s, ack p99 {with_p99:,.1f} ms{refused}", flush=True)
        # a second baseline after: on a shared VM one run's p99 moves by several times
        after_rate, after_p99, _, refused = aio.run(paced_load(node.endpoint, half, seconds))
        print(f"without cleaning: {after_rate:>9,.0f} msgs/s, ack p99 {after_p99:,.1f} ms (again, after){refused}",
              flush=True)
        rate, p99 = (rate + after_rate) / 2, (p99 + after_p99) / 2
        print(f"deleting against the two runs without: rate {100 * (with_rate / rate - 1):+.1f} % (target > -10 %), "
              f"ack p99 x{with_p99 / p99:.2f} (target <= 2)")
        print(f"the clean deleted {reply.get('count')} of {aged} segments, {deleted / 2**30:.2f} GiB in {took:.1f} s "
              f"({deleted / took / 1e6:,.0f} MB/s, paced by deleteCommitLogFilesInterval); stopped: {reply.get('stopped')}")


def keeping_up(base: Path, mbps: float, seconds: float, options: dict[str, str]) -> None:
    directory = base / "keep-up"
    directory.mkdir()
    settings = {"mappedFileSizeCommitLog": SEGMENT, "diskMaxUsedSpaceRatio": 10, "diskSpaceCleanForciblyRatio": 0.01,
                "diskSpaceWarningLevelRatio": 0.99, **options}
    commitlog = directory / "store" / "commitlog"
    with bench_node(directory, "ASYNC_FLUSH", None, settings) as node:
        sizes: list[int] = []

        async def watch(_producer) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sizes.append(sum(p.stat().st_size for p in commitlog.iterdir() if p.is_file()))
                await asyncio.sleep(0.25)

        rate, p99, _, refused = aio.run(paced_load(node.endpoint, mbps * 1e6 / len(BODY), seconds, watch))
        appended = rate * len(BODY) * seconds
        # the first cleanResourceInterval lets segments pile up; after it, deletion keeps up when
        # the CommitLog on disk stops growing
        first, last = sizes[: len(sizes) // 3], sizes[-(len(sizes) // 3):]
        kept_up = max(last) <= max(first) + 2 * SEGMENT
        print(f"keeping up: appended {rate * len(BODY) / 1e6:,.0f} MB/s for {seconds:g} s ({appended / 2**30:.1f} GiB), "
              f"ack p99 {p99:,.1f} ms; CommitLog on disk at most {max(first) / 2**20:,.0f} MiB in the first third, "
              f"{max(last) / 2**20:,.0f} MiB in the last (deletion kept up: {'yes' if kept_up else 'no'}){refused}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delete-gib", type=float, default=4.0, help="GiB of aged segments to delete under load (0: skip)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each measured run")
    parser.add_argument("--keep-up-mbps", type=float, default=200.0, help="append rate of the keep-up run, MB/s (0: skip)")
    parser.add_argument("--keep-up-seconds", type=float, default=60.0, help="length of the keep-up run")
    add_node_options(parser)
    args = parser.parse_args()
    options = node_options(args)
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-clean-"))
    try:
        print(f"before: {floors.report(base)}", flush=True)
        if args.delete_gib > 0:
            deleting_under_load(base, args.delete_gib, args.seconds, options)
        if args.keep_up_mbps > 0:
            keeping_up(base, args.keep_up_mbps, args.keep_up_seconds, options)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

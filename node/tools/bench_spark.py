"""scripts/bench-spark: the Spark connector's speed on a local Spark (`local[2]` by default) beside a
node on this machine. A benchmark, never a test.

Prints: a batch read of `--count` 1 KiB messages into `count()` and into a Parquet write (target
>= 100k msgs/s), a batch write of `--count` rows into a topic (target >= 80k msgs/s), and a
streaming copy topic -> topic with a 1 s trigger while a producer sends 10k msgs/s: whether it
keeps up, and the end-to-end p99 from the send to the copy's arrival at a consumer (target <= 3 s).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path

from node.client import AsyncProducer, AsyncPullConsumer, Message, aio
from node.tools.bench_produce import add_node_options, bench_node, node_options
from node.tools.pacing import paced
from node.tools.pipeline import spark_session

QUEUES = 4
STAMP = struct.Struct(">q")


async def produce(endpoint: str, topic: str, count: int) -> float:
    async with AsyncProducer(endpoint, timeout=30.0) as producer:
        body = bytes(1024)
        batch = [Message(topic, body) for _ in range(128)]

        async def sender(q: int) -> None:
            for _ in range(count // 128 // QUEUES):
                await producer.send_batch(topic, batch, queue_id=q)

        began = time.perf_counter()
        await asyncio.gather(*[sender(q) for q in range(QUEUES)])
        return count / (time.perf_counter() - began)


def timed(label: str, count: int, action) -> None:
    began = time.perf_counter()
    result = action()
    elapsed = time.perf_counter() - began
    print(f"{label}: {count / elapsed:>9,.0f} msgs/s ({count:,} in {elapsed:.1f} s){result or ''}", flush=True)


async def latency_reader(endpoint: str, topic: str, stop: threading.Event, samples: list[float]) -> None:
    async with AsyncPullConsumer(endpoint, timeout=10.0) as consumer:
        offsets = [await consumer.max_offset(topic, q) for q in range(QUEUES)]
        while not stop.is_set():
            results = await asyncio.gather(*[consumer.pull(topic, q, offsets[q], suspend_ms=500) for q in range(QUEUES)])
            now = time.time_ns()
            for q, result in enumerate(results):
                for message in result.messages:
                    samples.append((now - STAMP.unpack_from(message.body)[0]) / 1e9)
                offsets[q] = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset


def streaming_copy(spark, endpoint: str, base: Path, rate: int, seconds: float) -> None:
    samples: list[float] = []
    stop = threading.Event()
    reader = threading.Thread(target=lambda: aio.run(latency_reader(endpoint, "BenchSparkCopy", stop, samples)),
                              daemon=True)
    reader.start()
    stream = (spark.readStream.format("mqnode").option("endpoint", endpoint).option("topic", "BenchSparkLive")
              .option("startingOffsets", "latest").load())
    query = (stream.select("body").writeStream.format("mqnode").option("endpoint", endpoint)
             .option("topic", "BenchSparkCopy").option("checkpointLocation", str(base / "copy-checkpoint"))
             .trigger(processingTime="1 second").start())
    time.sleep(3)  # the first micro-batch planned

    async def send_live() -> None:
        async with AsyncProducer(endpoint, timeout=10.0) as producer:
            pad = bytes(1016)

            async def one(_: int) -> None:
                await producer.send("BenchSparkLive", STAMP.pack(time.time_ns()) + pad)

            await paced(rate, seconds, one)

    aio.run(send_live())
    deadline = time.monotonic() + 30
    while len(samples) < rate * seconds * 0.999 and time.monotonic() < deadline:
        time.sleep(0.5)
    query.stop()
    stop.set()
    reader.join(5)
    samples.sort()
    sent = int(rate * seconds)
    if not samples:
        print("streaming copy: nothing arrived", flush=True)
        return
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    print(f"streaming copy at {rate:,} msgs/s, 1 s trigger: {len(samples):,} of {sent:,} copied "
          f"({'kept up' if len(samples) >= sent * 0.999 else 'fell behind'}); end-to-end p50 {p50:.2f} s, "
          f"p99 {p99:.2f} s (target <= 3 s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--stream-rate", type=int, default=10_000)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--reads-only", action="store_true", help="only the batch reads")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-spark-"))
    try:
        directory = base / "node"
        directory.mkdir()
        with bench_node(directory, "ASYNC_FLUSH", 0, {"defaultTopicQueueNums": QUEUES, **node_options(args)}) as node:
            rate = aio.run(produce(node.endpoint, "BenchSpark", args.count))
            print(f"produced {args.count:,} 1 KiB messages at {rate:,.0f} msgs/s", flush=True)
            spark = spark_session(args.master, "mqnode-bench-spark")
            try:
                frame = lambda: spark.read.format("mqnode").option("endpoint", node.endpoint).option(  # noqa: E731
                    "topic", "BenchSpark").load()
                timed("batch read into count()", args.count, lambda: f"; count() = {frame().count():,}")
                timed("batch read into Parquet", args.count,
                      lambda: frame().write.mode("overwrite").parquet(str(base / "parquet")))
                if args.reads_only:
                    return
                # generated as they are written (a cached 1 GiB frame does not fit the default 1 GiB heap)
                rows = spark.range(args.count).selectExpr("CAST(id AS STRING) AS body")
                rows = rows.selectExpr("CONCAT(body, REPEAT('x', 1024 - LENGTH(body))) AS body")
                timed("batch write into a topic", args.count, lambda: rows.write.format("mqnode").option(
                    "endpoint", node.endpoint).option("topic", "BenchSparkWrite").mode("append").save())
                streaming_copy(spark, node.endpoint, base, args.stream_rate, args.stream_seconds)
            finally:
                spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

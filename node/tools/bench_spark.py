"""scripts/bench-spark: the Spark connector's speed on a local Spark (`local[2]` by default) beside a
node on this machine. A benchmark, never a test.

Prints: a batch read of `--count` 1 KiB messages into `count()` and into a Parquet write (target
>= 100k msgs/s), a batch write of `--count` rows into a topic (target >= 80k msgs/s), and a
streaming copy topic -> topic with a 1 s trigger while a producer sends 10k msgs/s: whether it
keeps up, and the end-to-end p99 from the send to the copy's arrival at a consumer (target <= 3 s);
then, on a store of `--count` JSON-like ~1 KiB events whose node is stopped, an offline read into a
per-topic count (target <= 30 s for 1 GiB) and `pipeline archive`'s rate (target >= 50 MB/s of
CommitLog) and Parquet size (target <= a third of the CommitLog's); last, the node again with
`tieredArchiveDir` on that archive, its archived segments deleted, and one consumer pulling a
queue's archived offsets from the archive (target >= 20k msgs/s). `--offline-only`: just those.
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
    """Each copied message's age at arrival; a queue each, pulled on its own (in lockstep, an idle
    queue's long poll would hold the others back and the reader, not the copy, would lag)."""
    async with AsyncPullConsumer(endpoint, timeout=10.0) as consumer:
        async def follow(q: int) -> None:
            offset = await consumer.max_offset(topic, q)
            while not stop.is_set():
                result = await consumer.pull(topic, q, offset, suspend_ms=200)
                now = time.time_ns()
                samples.extend((now - STAMP.unpack_from(m.body)[0]) / 1e9 for m in result.messages)
                offset = result.next_begin_offset if result.status != "OFFSET_ILLEGAL" else result.min_offset

        await asyncio.gather(*[follow(q) for q in range(QUEUES)])


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

    async def send_live(rate: int, seconds: float) -> None:
        async with AsyncProducer(endpoint, timeout=10.0) as producer:
            pad = bytes(1016)

            async def one(_: int) -> None:
                await producer.send("BenchSparkLive", STAMP.pack(time.time_ns()) + pad)

            await paced(rate, seconds, one)

    # warm-up: the query's first batches start Spark's Python workers (seconds on this machine);
    # the figure is the steady state, so it starts once a trickle has gone through end to end
    deadline = time.monotonic() + 120
    while len(samples) < 100 and time.monotonic() < deadline:
        aio.run(send_live(200, 0.5))
        time.sleep(1)
    while True:  # and the trickle's last copies are in, so none is counted as the figure's
        seen = len(samples)
        time.sleep(1.5)
        if len(samples) == seen or time.monotonic() > deadline:
            break
    samples.clear()
    aio.run(send_live(rate, seconds))
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


def json_events(count: int, seed: int = 7) -> list[bytes]:
    """JSON-like event bodies of about 1 KiB: fields from small vocabularies and random numbers,
    as click streams and order events look (what the archive's size target is about); `count`
    distinct ones (the benchmark cycles through 50,000)."""
    import random

    import orjson

    rng = random.Random(seed)
    pages = [f"/shop/{c}/{i}" for c in ("shoes", "bags", "hats", "coats", "socks") for i in range(200)]
    agents = ["Mozilla/5.0 (X11; Linux x86_64) Firefox/131.0", "Mozilla/5.0 (Macintosh) Safari/605.1.15",
              "Mozilla/5.0 (Windows NT 10.0) Chrome/129.0", "okhttp/4.12.0"]
    words = ["alpha", "berlin", "cargo", "delta", "express", "fragile", "ground", "harbor", "inland", "jetty",
             "kiosk", "lisbon", "madrid", "north", "oslo", "paris", "quay", "rome", "south", "tokyo"]
    out = []
    for i in range(count):
        event = {"event": rng.choice(("view", "click", "add_to_cart", "purchase", "search")), "seq": i,
                 "user": rng.randrange(1_000_000), "session": f"{rng.getrandbits(64):016x}",
                 "ts": 1_764_000_000_000 + i * 7, "page": rng.choice(pages), "referrer": rng.choice(pages),
                 "agent": rng.choice(agents), "country": rng.choice(("DE", "FR", "US", "JP", "BR", "IN")),
                 "price": round(rng.uniform(1, 500), 2),
                 "items": [{"sku": f"SKU-{rng.randrange(100_000):06d}", "qty": rng.randrange(1, 5),
                            "price": round(rng.uniform(1, 200), 2), "warehouse": rng.choice(words)}
                           for _ in range(rng.randrange(5, 12))],
                 "tags": rng.sample(("new", "sale", "gift", "eco", "limited", "bundle", "clearance"), 3),
                 "note": " ".join(rng.choice(words) for _ in range(rng.randrange(10, 40)))}
        out.append(orjson.dumps(event))  # ~0.7-1.3 KiB, no padding: what compresses is the JSON's own
    return out


def offline_figures(spark, base: Path, count: int, options: dict) -> None:
    """A store of `count` JSON-like ~1 KiB events (about 1 GiB at a million), its node stopped:
    an offline read into a per-topic count, and the archive's rate and size against the CommitLog."""
    from node.pipeline import archive

    directory = base / "offline"
    directory.mkdir()
    bodies = json_events(min(count, 50_000))
    # 64 MiB segments: a partition each for the read, and sealed ones for the archive
    settings = {"defaultTopicQueueNums": QUEUES, "mappedFileSizeCommitLog": 64 * 2**20, **options}
    with bench_node(directory, "ASYNC_FLUSH", None, settings) as node:
        aio.run(produce_bodies(node.endpoint, "BenchEvents", bodies, count))
    store = directory / "store"
    commitlog = sum(p.stat().st_size for p in (store / "commitlog").iterdir())
    began = time.perf_counter()
    counts = spark.read.format("mqnode").option("store", str(store)).load().groupBy("topic").count().collect()
    took = time.perf_counter() - began
    print(f"offline read of a {commitlog / 2**30:.2f} GiB store into a per-topic count: {took:.1f} s "
          f"(target <= 30 s at 1 GiB; {sum(r['count'] for r in counts):,} messages)", flush=True)
    began = time.perf_counter()
    done = archive.run(spark, str(store), str(base / "archive"))
    took = time.perf_counter() - began
    parquet = sum(p.stat().st_size for p in (base / "archive").rglob("*.parquet"))
    print(f"archive: {done['bytes'] / 2**20 / took:,.0f} MB/s of CommitLog ({len(done['archived'])} sealed "
          f"segments, {done['rows']:,} rows; target >= 50); Parquet {parquet / 2**20:,.0f} MiB for "
          f"{done['bytes'] / 2**20:,.0f} MiB of CommitLog = {parquet / max(1, done['bytes']):.2f} (target <= 0.33)",
          flush=True)
    tiered_pull(directory, base / "archive", settings)


def tiered_pull(directory: Path, archive: Path, settings: dict) -> None:
    """The node again, now with `tieredArchiveDir`: `admin clean --force` deletes the archived
    segments, then one consumer pulls a queue's archived offsets (served from the Parquet
    archive, records rebuilt byte for byte) one pull at a time, as `PullConsumer` does."""
    from node.client.received import decode_messages
    from node.protocol import DELETE_EXPIRED_COMMITLOG, PULL_MESSAGE

    with bench_node(directory, "ASYNC_FLUSH", None, {**settings, "tieredArchiveDir": str(archive)}) as node:
        async def run() -> tuple[int, float, int]:
            async with AsyncPullConsumer(node.endpoint, timeout=120.0) as consumer:
                cleaned, _ = await consumer.client.request({"code": DELETE_EXPIRED_COMMITLOG, "force": True},
                                                           timeout=300.0)
                offset, pulled = 0, 0
                began = time.perf_counter()
                while True:  # what PullConsumer.pull does, reading the reply's `tiered` too
                    reply, body = await consumer.client.request({
                        "code": PULL_MESSAGE, "topic": "BenchEvents", "queueId": 0, "queueOffset": offset,
                        "maxMsgNums": 32, "subscription": "*"})
                    if reply["status"] != "FOUND" or not reply.get("tiered"):
                        break
                    pulled += len(decode_messages(body))
                    offset = reply["nextBeginOffset"]
                return pulled, time.perf_counter() - began, cleaned

        pulled, took, cleaned = aio.run(run())
    if cleaned.get("status") != "OK":
        print(f"tiered pull: admin clean failed: {cleaned.get('status')} {cleaned.get('remark', '')}", flush=True)
        return
    print(f"tiered pull, one consumer, queue 0 from offset 0 after {cleaned['count']} archived segments were "
          f"deleted: {pulled:,} messages at {pulled / max(took, 1e-9):,.0f} msgs/s (target >= 20k)", flush=True)


async def produce_bodies(endpoint: str, topic: str, bodies: list[bytes], count: int) -> None:
    async with AsyncProducer(endpoint, timeout=30.0) as producer:
        async def sender(k: int) -> None:
            for first in range(k * 128, count, 4 * 128):
                batch = [Message(topic, bodies[(first + i) % len(bodies)]) for i in range(min(128, count - first))]
                await producer.send_batch(topic, batch, queue_id=(first // 128) % QUEUES)

        await asyncio.gather(*[sender(k) for k in range(4)])


def transactional_writes(endpoint: str, rows: int, master: str = "local[2]") -> tuple[float, float]:
    """(plain, transactional) rows/s of a Spark batch write of `rows` 1 KiB rows into a topic, in
    one session, after an untimed warm-up write (scripts/bench-transactions --spark)."""
    spark = spark_session(master, "mqnode-bench-transactions")
    try:
        frame = spark.range(rows).selectExpr("CAST(id AS STRING) AS body")
        frame = frame.selectExpr("CONCAT(body, REPEAT('x', 1024 - LENGTH(body))) AS body")

        def write(topic: str, transactional: bool) -> float:
            began = time.perf_counter()
            (frame.write.format("mqnode").option("endpoint", endpoint).option("topic", topic)
             .option("transactional", str(transactional).lower()).mode("append").save())
            return rows / (time.perf_counter() - began)

        spark.range(20_000).selectExpr("CAST(id AS STRING) AS body").write.format("mqnode").option(
            "endpoint", endpoint).option("topic", "BenchTxWarm").option("transactional", "true").mode("append").save()
        return write("BenchTxPlain", False), write("BenchTxSpark", True)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--stream-rate", type=int, default=10_000)
    parser.add_argument("--stream-seconds", type=float, default=20.0)
    parser.add_argument("--reads-only", action="store_true", help="only the batch reads")
    parser.add_argument("--stream-only", action="store_true", help="only the streaming copy")
    parser.add_argument("--pull-batch-size", type=int, default=32,
                        help="the batch reads' pullBatchSize (with --node-option "
                             "maxTransferCountOnMessageInMemory=N, which caps a pull at the node)")
    parser.add_argument("--offline-only", action="store_true", help="only the offline read and the archive")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-spark-"))
    try:
        if args.offline_only:
            spark = spark_session(args.master, "mqnode-bench-offline")
            try:
                offline_figures(spark, base, args.count, node_options(args))
            finally:
                spark.stop()
            return
        directory = base / "node"
        directory.mkdir()
        with bench_node(directory, "ASYNC_FLUSH", None, {"defaultTopicQueueNums": QUEUES, **node_options(args)}) as node:
            spark = spark_session(args.master, "mqnode-bench-spark")
            try:
                if args.stream_only:
                    return streaming_copy(spark, node.endpoint, base, args.stream_rate, args.stream_seconds)
                count = args.count // 128 // QUEUES * 128 * QUEUES  # what `produce` sends: whole batches
                rate = aio.run(produce(node.endpoint, "BenchSpark", count))
                print(f"produced {count:,} 1 KiB messages at {rate:,.0f} msgs/s", flush=True)
                frame = lambda: spark.read.format("mqnode").option("endpoint", node.endpoint).option(  # noqa: E731
                    "topic", "BenchSpark").option("pullBatchSize", args.pull_batch_size).load()
                # warm-up, untimed: a first query starts Spark's Python workers and JVM code paths
                # (seconds here); the figures are the rates after it, as a running pipeline sees them
                aio.run(produce(node.endpoint, "BenchSparkWarm", 20_000))
                spark.read.format("mqnode").option("endpoint", node.endpoint).option("topic", "BenchSparkWarm").load(
                    ).write.mode("overwrite").parquet(str(base / "warm"))
                timed("batch read into count()", count, lambda: f"; count() = {frame().count():,}")
                timed("batch read into Parquet", count,
                      lambda: frame().write.mode("overwrite").parquet(str(base / "parquet")))
                if args.reads_only:
                    return
                # generated as they are written (a cached 1 GiB frame does not fit the default 1 GiB heap)
                rows = spark.range(args.count).selectExpr("CAST(id AS STRING) AS body")
                rows = rows.selectExpr("CONCAT(body, REPEAT('x', 1024 - LENGTH(body))) AS body")
                timed("batch write into a topic", args.count, lambda: rows.write.format("mqnode").option(
                    "endpoint", node.endpoint).option("topic", "BenchSparkWrite").mode("append").save())
                streaming_copy(spark, node.endpoint, base, args.stream_rate, args.stream_seconds)
                offline_figures(spark, base, args.count, node_options(args))
            finally:
                spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

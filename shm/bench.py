"""scripts/bench-store: the storage layer's speed on this machine, 1 KiB bodies.

Prints: append of pre-encoded batches of 64, encode + append per record, flush rate and latency
(fdatasync and msync), recovery with CRC checks, ConsumeQueue + IndexFile dispatch. A benchmark,
never a test: the figures depend on the machine and what else it is doing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from shm import settings as settings_module
from shm.codec import encode, encode_host, encode_v4, properties_string
from shm.commitlog import CommitLog
from shm.dispatch import reput
from shm.encoded_batch import EncodedBatch
from shm.recovery import recover
from shm.store import MessageStore
from shm.store_files import mark_clean_exit

BODY = bytes(range(256)) * 4  # 1 KiB
BORN = encode_host("127.0.0.1", 50000)
STORE = encode_host("127.0.0.1", 10911)
SEGMENT = 256 * 1024 * 1024


def _record(i: int) -> bytes:
    props = properties_string({"TAGS": "TagA", "KEYS": f"key-{i}", "UNIQ_KEY": f"{i:032X}", "CLUSTER": "DefaultCluster"})
    return encode(topic="BenchTopic", body=BODY, queue_id=i % 8, born_timestamp=1795000000000, born_host=BORN,
                  store_host=STORE, properties=props)


def bench_append(directory: Path, records: int) -> float:
    batches = []
    for start in range(0, records, 64):
        batch = EncodedBatch()
        for i in range(start, min(start + 64, records)):
            batch.add(_record(i % 1024))
        batches.append(batch)
    log = CommitLog(directory / "commitlog", SEGMENT)
    log.segments.last_writable().warm()
    began = time.perf_counter()
    for batch in batches:
        log.append_batch(batch, 1795000000000)
    elapsed = time.perf_counter() - began
    log.close()
    return records / elapsed


def bench_encode_append(directory: Path, records: int) -> float:
    log = CommitLog(directory / "commitlog", SEGMENT)
    log.segments.last_writable().warm()
    props = properties_string({"TAGS": "TagA", "CLUSTER": "DefaultCluster"})
    topic = b"BenchTopic"
    keys = [f"BenchTopic-{q}" for q in range(8)]
    began = time.perf_counter()
    for start in range(0, records, 64):  # what the node's writer does per send (IPv4 fast path)
        batch = EncodedBatch()
        for i in range(start, min(start + 64, records)):
            batch.add_v4(encode_v4(topic, BODY, i & 7, 0, 0, 1795000000000, BORN, STORE, props.encode(), 0,
                                   4 * 1024 * 1024), keys[i & 7])
        log.append_batch(batch, 1795000000000)
    elapsed = time.perf_counter() - began
    log.close()
    return records / elapsed


def bench_flush(directory: Path, method: str, rounds: int = 400) -> tuple[float, float, float]:
    """Append ~4 KiB then flush, repeatedly: flushes/s, p50 and p99 latency in µs."""
    log = CommitLog(directory / f"flush-{method}", SEGMENT)
    batch = EncodedBatch()
    for i in range(4):
        batch.add(_record(i))
    latencies = []
    for _ in range(rounds):
        log.append_batch(batch, 1795000000000)
        began = time.perf_counter()
        for segment in log.segments.files:
            if segment.position_flushed < segment.position_committed:
                segment.flush(method)
        latencies.append(time.perf_counter() - began)
    log.close()
    latencies.sort()
    return rounds / sum(latencies), latencies[len(latencies) // 2] * 1e6, latencies[int(len(latencies) * 0.99)] * 1e6


def _store_settings(root: Path):
    return settings_module.load(None, {"storePathRootDir": str(root), "mappedFileSizeCommitLog": SEGMENT,
                                       "maxHashSlotNum": 500000, "maxIndexNum": 2000000})


def bench_dispatch_and_recovery(directory: Path, records: int) -> tuple[float, float, float]:
    settings = _store_settings(directory / "store")
    store = MessageStore(settings)
    recover(store)
    for start in range(0, records, 64):
        batch = EncodedBatch()
        for i in range(start, min(start + 64, records)):
            batch.add(_record(i))
        store.commitlog.append_batch(batch, 1795000000000 + start)
    began = time.perf_counter()
    reput(store, 0)
    dispatch_rate = records / (time.perf_counter() - began)
    store.flush_all()
    size = store.commitlog.offset_written
    store.close()
    mark_clean_exit(settings.root)
    # abnormal recovery walks every segment with CRC checks (and re-dispatches, idempotently);
    # normal recovery of the same store walks the last three segments with CRC checks.
    store = MessageStore(settings)
    began = time.perf_counter()
    report = recover(store, clean=True)
    elapsed = time.perf_counter() - began
    walk_ms = report.phases_ms["commitlog"]
    store.close()
    return dispatch_rate, size / (walk_ms / 1000) / 1e6, size / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--dir", help="where to write (default: a temporary directory, removed after)")
    args = parser.parse_args()
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mqnode-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        print(f"mqnode bench-store: {args.records} records of 1 KiB, {os.cpu_count()} cores, in {base}")
        rate = bench_append(base / "a", args.records)
        print(f"append, pre-encoded batches of 64 : {rate:>12,.0f} records/s  (target >= 800,000)")
        rate = bench_encode_append(base / "b", args.records)
        print(f"encode + append per record        : {rate:>12,.0f} records/s  (target >= 300,000)")
        for method in ("fdatasync", "msync"):
            per_second, p50, p99 = bench_flush(base / "c", method)
            print(f"flush ({method:9}) after 4 KiB     : {per_second:>12,.0f} flushes/s, p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
        dispatch, walk, whole = bench_dispatch_and_recovery(base / "d", args.records)
        print(f"ConsumeQueue + IndexFile dispatch : {dispatch:>12,.0f} records/s  (target >= 200,000)")
        print(f"recovery walk with CRC check      : {walk:>12,.0f} MB/s       (target >= 300)")
        print(f"recovery, whole (normal, incl. load): {whole:>10,.0f} MB/s")
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

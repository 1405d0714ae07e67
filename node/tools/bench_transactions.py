"""scripts/bench-transactions: transactional messages' figures (issue 48), 1 KiB bodies, clients
beside the node. A benchmark, never a test.

Starts `mqnode start` on a temporary store (transactionTimeOut 1 s, transactionCheckInterval
10 s, so the check figure is measured in seconds, not minutes) and prints:
- transactional sends: half + local transaction + commit, `--in-flight` at once (64), from one
  AsyncTransactionProducer, with the node's CPU per message;
- checks: `--halves` (100,000) halves left open by a producer that is gone, then a producer of
  the group that answers COMMIT; how long from the last half stored until all are committed,
  beside transactionCheckInterval + 5 s (the figure's bound: the pass may start up to an
  interval after the halves fall due), and how long from the first check answered;
- with `--spark`: a plain and a transactional Spark write of `--rows` (1,000,000) rows in the
  same run, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from node.tools import floors
from node.tools.bench_produce import BODY, Usage, add_node_options, bench_node, node_options

TOPIC, GROUP = "BenchTx", "BenchTxPG"
CHECK_INTERVAL_MS, TIMEOUT_MS = 10_000, 1000


async def sends(endpoint: str, total: int, in_flight: int) -> float:
    """msgs/s of send_in_transaction (half, execute, commit) with `in_flight` at once."""
    from node.client import COMMIT_MESSAGE, AsyncTransactionProducer

    async with AsyncTransactionProducer(endpoint, GROUP, execute=lambda message, arg: COMMIT_MESSAGE,
                                        timeout=30.0) as producer:
        await producer.send_in_transaction(TOPIC, BODY)  # (the route, once)
        left = iter(range(total))
        failed = []

        async def worker() -> None:
            for _ in left:
                result = await producer.send_in_transaction(TOPIC, BODY)
                if result.end_status != "OK":
                    failed.append(result.end_status)

        began = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(in_flight)])
        elapsed = time.perf_counter() - began
    if failed:
        raise RuntimeError(f"{len(failed)} ends failed: {failed[:3]}")
    return total / elapsed


async def open_halves(endpoint: str, count: int, group: str) -> float:
    """`count` halves sent and left open (their producer closes without ending them); returns when
    the last was stored (monotonic s)."""
    from node.client import AsyncTransactionProducer

    async with AsyncTransactionProducer(endpoint, group, timeout=30.0) as producer:
        left = iter(range(count))

        async def worker() -> None:
            for _ in left:
                await producer.send_half(TOPIC + "Checked", BODY)

        await asyncio.gather(*[worker() for _ in range(64)])
        return time.monotonic()


def state(endpoint: str) -> dict:
    from node import protocol
    from node.client import Producer

    with Producer(endpoint, timeout=10.0) as client:
        reply, _ = client.request({"code": protocol.GET_TRANSACTION_STATE, "limit": 0})
    return reply


async def checks(endpoint: str, count: int) -> tuple[float, float]:
    """(s from the last half stored until all `count` are committed, s from the first check
    answered until then)."""
    from node.client import COMMIT_MESSAGE, AsyncTransactionProducer

    group = GROUP + "-checked"
    before = state(endpoint)["committed"]
    first = []

    def check(message):
        if not first:
            first.append(time.monotonic())
        return COMMIT_MESSAGE

    async with AsyncTransactionProducer(endpoint, group, check=check, timeout=30.0):
        stored = await open_halves(endpoint, count, group)
        deadline = stored + 120
        while state(endpoint)["committed"] - before < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {state(endpoint)['committed'] - before:,} of {count:,} committed in 120 s")
            await asyncio.sleep(0.05)
        done = time.monotonic()
    return done - stored, done - (first[0] if first else done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200_000, help="transactional sends (default 200,000)")
    parser.add_argument("--in-flight", type=int, default=64, help="transactions at once (default 64)")
    parser.add_argument("--halves", type=int, default=100_000, help="open halves to check (default 100,000)")
    parser.add_argument("--spark", action="store_true", help="also the Spark writes, plain and transactional")
    parser.add_argument("--rows", type=int, default=1_000_000, help="--spark: rows a write (default 1,000,000)")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-tx-"))
    options = {"transactionTimeOut": str(TIMEOUT_MS), "transactionCheckInterval": str(CHECK_INTERVAL_MS)}
    print("mqnode bench-transactions: 1 KiB bodies, client on the same machine")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        with bench_node(base, "ASYNC_FLUSH", None, options | node_options(args)) as node:
            usage = Usage(node)
            rate = asyncio.run(sends(node.endpoint, args.count, args.in_flight))
            print(f"transactional sends (half + commit), {args.in_flight} in flight: {rate:>10,.0f} msgs/s "
                  f"(target >= 30,000); {usage.report(args.count)}", flush=True)
            usage = Usage(node)
            total, answered = asyncio.run(checks(node.endpoint, args.halves))
            bound = CHECK_INTERVAL_MS / 1000 + 5
            print(f"checks of {args.halves:,} open halves: all committed {total:.1f} s after the last was stored "
                  f"(target <= transactionCheckInterval + 5 s = {bound:.0f} s), {answered:.1f} s after the first "
                  f"check was answered; {usage.report(args.halves)}", flush=True)
            if args.spark:
                from node.tools.bench_spark import transactional_writes
                plain, transactional = transactional_writes(node.endpoint, args.rows)
                print(f"Spark write of {args.rows:,} rows: plain {plain:,.0f} rows/s, transactional "
                      f"{transactional:,.0f} rows/s: {transactional / plain:.2f} x (target >= 0.7)", flush=True)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

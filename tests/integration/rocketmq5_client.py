"""Apache RocketMQ's official Python client (rocketmq-python-client, gRPC) against a node's proxy,
run as its own process by tests/integration/test_grpc.py and test_grpc_acl.py: the client's
generated protobuf modules and the node's (actors.proxy.apis) define the same messages, and one process may hold
only one of them. One JSON line on stdout per message sent or consumed, `{"error": ...}` for a
failure; the client's own log goes to ~/logs/rocketmq_python. `--tls` trusts the certificates of
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (the client takes no roots of its own).

    produce --topic T --count N [--tag X] [--keys K] [--message-group G] [--delay-ms D] [--async]
            [--recall N] (with --delay-ms: recall the first N sent, a {"recalled": id} line each)
    simple  --topic T --group G --want N [--invisible S] [--mode ack|none|change:S] [--seconds W]
            [--filter EXPR [--sql]] (a tag expression, or with --sql a SQL92 one)
    push    --topic T --group G --seconds W [--fail-first N] [--fail-all] [--sleep S] [--successes N] [--tries N]
            (--fail-first N: the first N tries of each message; --successes N, --tries N: done at N successes,
            N listener calls, within W)
    transaction --topic T --count N --end commit|rollback|none [--check-answer commit|rollback] [--seconds W]
            [--checks N] (a transactional Producer with a TransactionChecker: each message a half, then
            ended so; with --check-answer it stays up W answering the node's checks, a line per check,
            or until N messages were checked)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from rocketmq import (ClientConfiguration, ConsumeResult, Credentials, FilterExpression, Message, Producer,
                      PushConsumer, SimpleConsumer, TransactionChecker, TransactionResolution)
from rocketmq.grpc_protocol import FilterType
from rocketmq.v5.consumer.push import MessageListener


def line(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def received(message) -> dict:
    return {"id": message.message_id, "body": message.body.decode(), "tag": message.tag, "keys": sorted(message.keys),
            "properties": dict(message.properties), "attempt": message.delivery_attempt,
            "group": message.message_group, "topic": message.topic}


def produce(args, config) -> None:
    producer = Producer(config, (args.topic,), tls_enable=args.tls)
    producer.startup()
    try:
        futures = []
        for i in range(args.count):
            message = Message()
            message.topic, message.body = args.topic, f"{args.prefix}{i}".encode()
            if args.tag:
                message.tag = args.tag
            if args.keys:
                message.keys = args.keys
            message.add_property("index", str(i))
            if args.message_group:
                message.message_group = args.message_group
            if args.delay_ms:  # (this client sends the value as the Timestamp's seconds)
                message.delivery_timestamp = int(time.time() + args.delay_ms / 1000 + 0.999)
            if args.send_async:
                futures.append(producer.send_async(message))
                continue
            try:
                receipt = producer.send(message)
                line(id=receipt.message_id, offset=receipt.offset, index=i)
                if i < args.recall:
                    line(recalled=producer.recall_message(args.topic, receipt.recall_handle))
            except Exception as e:  # noqa: BLE001 (reported, and the test decides)
                line(error=f"{type(e).__name__}: {e}", index=i)
        for i, future in enumerate(futures):
            try:
                receipt = future.result(timeout=30)
                line(id=receipt.message_id, offset=receipt.offset, index=i)
            except Exception as e:  # noqa: BLE001
                line(error=f"{type(e).__name__}: {e}", index=i)
    finally:
        producer.shutdown()


def simple(args, config) -> None:
    selects = FilterExpression(args.filter, FilterType.SQL if args.sql else FilterType.TAG)
    consumer = SimpleConsumer(config, args.group, {args.topic: selects}, await_duration=2, tls_enable=args.tls)
    consumer.startup()
    got, deadline = 0, time.monotonic() + args.seconds
    try:
        while got < args.want and time.monotonic() < deadline:
            try:
                messages = consumer.receive(min(32, args.want - got), args.invisible)
            except Exception as e:  # noqa: BLE001
                line(error=f"{type(e).__name__}: {e}")
                time.sleep(0.5)
                continue
            for message in messages:
                got += 1
                out = received(message)
                if args.mode == "ack":
                    consumer.ack(message)
                elif args.mode.startswith("change:"):
                    consumer.change_invisible_duration(message, int(args.mode.split(":")[1]))
                    out["changed"] = True
                line(**out)
    finally:
        consumer.shutdown()


class Listener(MessageListener):
    def __init__(self, fail_first: int, fail_all: bool, sleep_s: float = 0.0, successes: int = 0, tries: int = 0):
        self.fail_first, self.fail_all, self.sleep_s = fail_first, fail_all, sleep_s
        self.lock = threading.Lock()
        self.stop_at, self.stop_after = successes, tries  # (0: never)
        self.successes, self.calls, self.done = 0, 0, threading.Event()
        self.tries: dict[str, int] = {}  # (a FIFO consumer retries in place: the delivery attempt stays)

    def consume(self, message) -> ConsumeResult:
        with self.lock:
            tries = self.tries[message.message_id] = self.tries.get(message.message_id, 0) + 1
            fail = self.fail_all or tries <= self.fail_first
            line(**received(message), result="FAILURE" if fail else "SUCCESS")
        time.sleep(self.sleep_s)  # (a slow listener: the proxy keeps its message invisible meanwhile)
        with self.lock:  # (counted once the listener is done with it: its result goes back as it returns)
            self.successes += not fail
            self.calls += 1
            if (self.stop_at and self.successes >= self.stop_at) or (self.stop_after and self.calls >= self.stop_after):
                self.done.set()
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def push(args, config) -> None:
    listener = Listener(args.fail_first, args.fail_all, args.sleep, args.successes, args.tries)
    consumer = PushConsumer(config, args.group, listener,
                            {args.topic: FilterExpression(args.filter)}, consumption_thread_count=4, tls_enable=args.tls)
    consumer.startup()
    try:
        if listener.done.wait(args.seconds):  # (without --successes or --tries: the whole time)
            time.sleep(1.0)  # the last result (an ack, a nack, a dead letter) on its way to the proxy
    finally:
        consumer.shutdown()


class Checker(TransactionChecker):
    def __init__(self, answer: str, checks: int = 0):
        self.answer, self.checks = answer, checks  # (checks: done once that many messages were checked; 0: never)
        self.checked: set[str] = set()
        self.done = threading.Event()

    def check(self, message):
        line(checked=message.message_id, body=message.body.decode(), topic=message.topic, answer=self.answer)
        self.checked.add(message.message_id)
        if self.checks and len(self.checked) >= self.checks:
            self.done.set()
        return {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK}.get(
            self.answer, TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED)


def transaction(args, config) -> None:
    checker = Checker(args.check_answer, args.checks)
    producer = Producer(config, (args.topic,), checker=checker, tls_enable=args.tls)
    producer.startup()
    try:
        for i in range(args.count):
            message = Message()
            message.topic, message.body = args.topic, f"{args.prefix}{i}".encode()
            try:
                transaction = producer.begin_transaction()
                receipt = producer.send(message, transaction)
                if args.end == "commit":
                    transaction.commit()
                elif args.end == "rollback":
                    transaction.rollback()
                line(id=receipt.message_id, transaction=receipt.transaction_id, index=i, end=args.end)
            except Exception as e:  # noqa: BLE001 (reported, and the test decides)
                line(error=f"{type(e).__name__}: {e}", index=i)
        if args.check_answer and checker.done.wait(args.seconds):
            time.sleep(1.0)  # (the client ends the half once check() returns: its answer on its way)
    finally:
        producer.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("produce", "simple", "push", "transaction"))
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--ak", default="")
    parser.add_argument("--sk", default="")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--prefix", default="m")
    parser.add_argument("--tag", default="")
    parser.add_argument("--keys", default="")
    parser.add_argument("--message-group", default="")
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--async", dest="send_async", action="store_true")
    parser.add_argument("--recall", type=int, default=0, help="produce: recall the first N sent (timers)")
    parser.add_argument("--filter", default="*")
    parser.add_argument("--sql", action="store_true", help="simple: --filter is a SQL92 expression")
    parser.add_argument("--want", type=int, default=1)
    parser.add_argument("--invisible", type=int, default=30)
    parser.add_argument("--mode", default="ack")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--fail-all", action="store_true")
    parser.add_argument("--successes", type=int, default=0, help="push: stop at this many successes (0: run --seconds)")
    parser.add_argument("--tries", type=int, default=0, help="push: stop at this many listener calls (0: run --seconds)")
    parser.add_argument("--sleep", type=float, default=0.0, help="push: seconds the listener takes a message")
    parser.add_argument("--end", choices=("commit", "rollback", "none"), default="commit")
    parser.add_argument("--checks", type=int, default=0, help="transaction: done once this many messages were checked")
    parser.add_argument("--check-answer", choices=("commit", "rollback", "unknown"), default="")
    parser.add_argument("--tls", action="store_true", help="TLS (trusting GRPC_DEFAULT_SSL_ROOTS_FILE_PATH's roots)")
    args = parser.parse_args()
    config = ClientConfiguration(args.endpoint, Credentials(args.ak, args.sk), request_timeout=5)
    {"produce": produce, "simple": simple, "push": push, "transaction": transaction}[args.command](args, config)


if __name__ == "__main__":
    main()

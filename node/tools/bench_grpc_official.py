"""The official RocketMQ 5 Python client's rates for scripts/bench-grpc, in a process of its own
(its generated protobuf modules and the node's define the same messages): `python -m
node.tools.bench_grpc_official HOST:PORT COUNT` sends COUNT 1 KiB messages with its Producer
(256 sends in flight) and receives them with its SimpleConsumer (32 a receive, each acked), and
prints both rates on one line."""

from __future__ import annotations

import sys
import time
from concurrent.futures import wait

TOPIC, GROUP, IN_FLIGHT = "BenchGrpcOfficial", "BenchGrpcOfficialG", 256


def main() -> None:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

    endpoint, count = sys.argv[1], int(sys.argv[2])
    config = ClientConfiguration(endpoint, Credentials("", ""), request_timeout=10)
    body = bytes(range(256)) * 4
    producer = Producer(config, (TOPIC,))
    producer.startup()
    began, pending = time.perf_counter(), []
    for _ in range(count):
        message = Message()
        message.topic, message.body = TOPIC, body
        pending.append(producer.send_async(message))
        if len(pending) >= IN_FLIGHT:
            wait(pending)
            pending = []
    wait(pending)
    sent = count / (time.perf_counter() - began)
    producer.shutdown()
    consumer = SimpleConsumer(config, GROUP, {TOPIC: FilterExpression("*")}, await_duration=1)
    consumer.startup()
    began, got = time.perf_counter(), 0
    while got < count and time.perf_counter() - began < 600:
        for message in consumer.receive(32, 60):
            consumer.ack(message)
            got += 1
    received = got / (time.perf_counter() - began)
    consumer.shutdown()
    print(f"send {sent:,.0f} msgs/s ({IN_FLIGHT} in flight), receive + ack {received:,.0f} msgs/s "
          f"(32 a receive, each acked)")


if __name__ == "__main__":
    main()

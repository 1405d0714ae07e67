"""scripts/bench-grpc: the gRPC proxy's speed (issue 47), 1 KiB bodies, clients beside the node.

Starts `mqnode start` on a temporary store and prints: SendMessage from an asyncio gRPC client
(grpc.aio with the node's stubs) with 32 messages a request; ReceiveMessage + AckMessage in
batches of 32 over what that stored; PullMessage of it all again, 32 a pull; and beside them the official RocketMQ 5 Python client's
send and receive rates (its Producer with sends in flight, its SimpleConsumer receiving 32 and
acking each), run in a process of their own (its protobuf modules and the node's cannot share
one). The node's CPU per message is printed with each (node.tools.bench_produce.Usage). Last,
the ceiling: the same client against a gRPC server that only answers, which is what Python's
gRPC costs on this machine before the node does anything. A benchmark, never a test.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node.tools import floors
from node.tools.bench_produce import BODY, Usage, add_node_options, bench_node, node_options

TOPIC, GROUP, BATCH = "BenchGrpc", "BenchGrpcG", 32
METADATA = (("x-mq-client-id", "bench-grpc"), ("x-mq-language", "PYTHON"))


def _stub(channel):
    from actors.proxy.apis import service_pb2_grpc

    return service_pb2_grpc.MessagingServiceStub(channel)


def _request(index: int):
    from actors.proxy.apis import definition_pb2 as pb
    from actors.proxy.apis import service_pb2 as rpc

    messages = []
    for i in range(BATCH):
        message = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY)
        message.system_properties.message_id = f"B{index:012X}{i:04X}"
        message.system_properties.message_type = pb.NORMAL
        messages.append(message)
    return rpc.SendMessageRequest(messages=messages)


async def send(endpoint: str, total: int, concurrency: int) -> float:
    """msgs/s stored by SendMessage requests of BATCH messages, `concurrency` in flight."""
    import grpc

    from actors.proxy.apis.definition_pb2 import Code

    requests = total // BATCH
    async with grpc.aio.insecure_channel(endpoint) as channel:
        stub, next_index, failed = _stub(channel), iter(range(requests)), []

        async def sender() -> None:
            for index in next_index:
                response = await stub.SendMessage(_request(index), metadata=METADATA, timeout=30)
                if response.status.code != Code.OK:
                    failed.append(response.status)

        await stub.SendMessage(_request(requests), metadata=METADATA, timeout=30)  # (creates the topic)
        began = time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    if failed:
        raise RuntimeError(f"{len(failed)} sends failed, the first: {failed[0]}")
    return requests * BATCH / elapsed


async def receive(endpoint: str, total: int, concurrency: int) -> float:
    """msgs/s received and acked in batches of BATCH, `concurrency` receivers."""
    import grpc

    from actors.proxy.apis import definition_pb2 as pb
    from actors.proxy.apis import service_pb2 as rpc

    group, topic = pb.Resource(name=GROUP), pb.Resource(name=TOPIC)
    request = rpc.ReceiveMessageRequest(group=group, message_queue=pb.MessageQueue(topic=topic, id=-1),
                                        batch_size=BATCH, filter_expression=pb.FilterExpression(type=pb.TAG,
                                                                                              expression="*"))
    request.invisible_duration.FromSeconds(60)
    request.long_polling_timeout.FromSeconds(1)
    done = [0]
    async with grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = _stub(channel)

        async def receiver() -> None:
            while done[0] < total:
                entries = [rpc.AckMessageEntry(message_id=r.message.system_properties.message_id,
                                               receipt_handle=r.message.system_properties.receipt_handle)
                           async for r in stub.ReceiveMessage(request, metadata=METADATA, timeout=30)
                           if r.HasField("message")]
                if not entries:
                    continue
                response = await stub.AckMessage(rpc.AckMessageRequest(group=group, topic=topic, entries=entries),
                                                 metadata=METADATA, timeout=30)
                if response.status.code != pb.Code.OK:
                    raise RuntimeError(f"ack failed: {response.status}")
                done[0] += len(entries)

        began = time.perf_counter()
        await asyncio.gather(*(receiver() for _ in range(concurrency)))
        return done[0] / (time.perf_counter() - began)


async def pull(endpoint: str, concurrency: int, queues: int = 8) -> tuple[float, int]:
    """(msgs/s, messages) read by PullMessage in batches of BATCH, every queue from offset 0 to
    its end (a pull consumer's reads; nothing is committed), `concurrency` pullers taking the
    queues in turn."""
    import collections

    import grpc

    from actors.proxy.apis import definition_pb2 as pb
    from actors.proxy.apis import service_pb2 as rpc

    pending, done = collections.deque((queue, 0) for queue in range(queues)), [0]
    async with grpc.aio.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = _stub(channel)

        async def puller() -> None:
            while pending:
                queue, offset = pending.popleft()
                request = rpc.PullMessageRequest(group=pb.Resource(name=GROUP), offset=offset, batch_size=BATCH,
                                                 message_queue=pb.MessageQueue(topic=pb.Resource(name=TOPIC), id=queue),
                                                 filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
                answers = [r async for r in stub.PullMessage(request, metadata=METADATA, timeout=30)]
                done[0] += sum(1 for r in answers if r.HasField("message"))
                if answers[0].status.code == pb.Code.OK:  # (else the queue is read to its end)
                    pending.append((queue, answers[-1].next_offset))

        began = time.perf_counter()
        await asyncio.gather(*(puller() for _ in range(concurrency)))
        return done[0] / (time.perf_counter() - began), done[0]


def _noop_server(port: int, ready) -> None:
    """A MessagingService that does nothing but answer (the canned answers as big as the node's):
    what Python's gRPC itself costs on this machine, the ceiling of the proxy's figures."""
    import grpc

    from actors.proxy.apis import definition_pb2 as pb
    from actors.proxy.apis import service_pb2 as rpc
    from actors.proxy.apis import service_pb2_grpc

    message = rpc.ReceiveMessageResponse()
    message.message.topic.name, message.message.body = TOPIC, BODY
    message.message.system_properties.message_id = "0102FC0000000136950B1B332800000000"
    message.message.system_properties.receipt_handle = f"1234 {TOPIC} 3 123456"
    ok = pb.Status(code=pb.OK, message="OK")

    class Noop(service_pb2_grpc.MessagingServiceServicer):
        async def SendMessage(self, request, context):
            return rpc.SendMessageResponse(status=ok, entries=[
                rpc.SendResultEntry(status=ok, message_id=m.system_properties.message_id) for m in request.messages])

        async def ReceiveMessage(self, request, context):
            yield rpc.ReceiveMessageResponse(status=ok)
            for _ in range(request.batch_size):
                yield message

        async def AckMessage(self, request, context):
            return rpc.AckMessageResponse(status=ok, entries=[rpc.AckMessageResultEntry(status=ok)
                                                              for _ in request.entries])

    async def serve() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Noop(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(serve())


def ceiling(count: int, concurrency: int) -> tuple[float, float]:
    """(send, receive + ack) msgs/s of the same client against `_noop_server`."""
    import multiprocessing

    from node.tools.local_node import free_port

    port, context = free_port(), multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=_noop_server, args=(port, ready), daemon=True)
    server.start()
    try:
        ready.wait(30)
        endpoint = f"127.0.0.1:{port}"
        return asyncio.run(send(endpoint, count, concurrency)), asyncio.run(receive(endpoint, count, concurrency))
    finally:
        server.kill()
        server.join(10)


def official(endpoint: str, count: int) -> str:
    """The official client's rates, from its own process (node/tools/bench_grpc_official.py)."""
    done = subprocess.run([sys.executable, "-m", "node.tools.bench_grpc_official", endpoint, str(count)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1:]}"
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=320_000, help="messages sent, then received (default 320,000)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--official-count", type=int, default=20_000,
                        help="messages the official client sends and receives (default 20,000)")
    add_node_options(parser)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mqnode-bench-grpc-"))
    print(f"mqnode bench-grpc: 1 KiB bodies, {args.count:,} messages, {args.concurrency} in flight, "
          f"client on the same machine")
    try:
        print(f"before: {floors.report(base)}", flush=True)
        with bench_node(base, "ASYNC_FLUSH", None, node_options(args)) as node:
            endpoint = f"127.0.0.1:{node.settings.grpc_port}"
            usage = Usage(node)
            rate = asyncio.run(send(endpoint, args.count, args.concurrency))
            print(f"SendMessage, asyncio gRPC, {BATCH} a request : {rate:>10,.0f} msgs/s (target >= 60,000); "
                  f"{usage.report(args.count)}", flush=True)
            usage = Usage(node)
            rate = asyncio.run(receive(endpoint, args.count // BATCH * BATCH + BATCH, args.concurrency))
            print(f"ReceiveMessage + AckMessage, {BATCH} a batch: {rate:>10,.0f} msgs/s (target >= 40,000); "
                  f"{usage.report(args.count)}", flush=True)
            usage = Usage(node)
            rate, pulled = asyncio.run(pull(endpoint, args.concurrency))
            print(f"PullMessage, {BATCH} a pull, 8 queues       : {rate:>10,.0f} msgs/s; {usage.report(pulled)}",
                  flush=True)
            print(f"official RocketMQ 5 Python client ({args.official_count:,} messages): "
                  f"{official(endpoint, args.official_count)}", flush=True)
        sent, received = ceiling(min(args.count, 96_000), args.concurrency)
        print(f"the ceiling: the same client against a gRPC server that only answers (grpc.aio, no node): "
              f"SendMessage {sent:,.0f} msgs/s, ReceiveMessage + AckMessage {received:,.0f} msgs/s", flush=True)
        print(f"after: {floors.report(base)}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

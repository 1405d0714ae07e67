"""RocketMQ 5's official clients (Python's, and Node.js's) against a cluster through one node's gRPC proxy: a name service
(in a thread of this process, as test_namesrv runs it) and two broker groups, each node with its
proxy. The proxy's routes name every group whose master serves gRPC (docs/protocol.md "gRPC"),
so the client spreads its sends over both groups and receives from both, each at its own proxy."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from nodes import NodeProcess, free_port, grpc_endpoint, node_settings, nodejs, nodejs_missing, official

from actors.namesrv import Namesrv
from actors.proxy.apis import definition_pb2 as pb
from actors.proxy.apis import service_pb2 as rpc
from actors.proxy.apis import service_pb2_grpc
from node import protocol
from node.client import Producer, PullConsumer

pytestmark = pytest.mark.slow
TOPIC, QUEUES = "GcOrders", 4
META = (("x-mq-client-id", "grpc-cluster-test"), ("x-mq-language", "PYTHON"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grpc-cluster")
    namesrv = Namesrv(f"tcp://127.0.0.1:{free_port()}", directory / "namesrv")
    thread = threading.Thread(target=namesrv.run, daemon=True)
    thread.start()
    assert namesrv.ready.wait(10)
    address = namesrv.listen[len("tcp://"):]
    nodes = []
    try:
        for name in ("broker-a", "broker-b"):  # (compact: two nodes' processes beside another module's, on 2 cores)
            settings = node_settings(directory / name / "store", runDir=str(directory / name / "run"),
                                     grpcServerPort=free_port(), namesrvAddr=address, brokerName=name,
                                     brokerClusterName="GrpcCluster", topology="compact")
            nodes.append(NodeProcess(settings, directory / f"{name}.log").start())
        for node in nodes:
            with Producer(node.endpoint) as producer:
                reply, _ = producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": TOPIC,
                                             "readQueueNums": QUEUES, "writeQueueNums": QUEUES})
                assert reply["status"] == "OK", reply
        _wait_for_both_groups(address)
        yield nodes
    finally:
        for node in nodes:
            node.stop(strict=False)
        namesrv.stop()
        thread.join(10)


def _wait_for_both_groups(address: str, topic: str = TOPIC) -> None:
    """Until the name service routes `topic` to both groups, each with its proxy's address."""
    deadline = time.monotonic() + 30
    with Producer(f"tcp://{address}") as names:
        while True:
            route, _ = names.request({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": topic})
            groups = {b["brokerName"] for b in route.get("brokerDatas") or [] if (b.get("grpcAddrs") or {}).get("0")}
            if groups == {"broker-a", "broker-b"}:
                return
            assert time.monotonic() < deadline, route
            time.sleep(0.2)


def test_one_proxys_route_names_both_groups_each_at_its_own_proxy(cluster):
    a, b = cluster
    with grpc.insecure_channel(grpc_endpoint(a)) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), metadata=META, timeout=10)
        assignments = stub.QueryAssignment(rpc.QueryAssignmentRequest(topic=pb.Resource(name=TOPIC),
                                                                      group=pb.Resource(name="GcG")),
                                           metadata=META, timeout=10)
    assert route.status.code == pb.Code.OK
    ports = {q.broker.name: {x.port for x in q.broker.endpoints.addresses} for q in route.message_queues}
    assert ports == {"broker-a": {a.settings.grpc_port}, "broker-b": {b.settings.grpc_port}}
    assert len(route.message_queues) == 2 * QUEUES
    assert sorted((x.message_queue.broker.name, x.message_queue.id) for x in assignments.assignments) == [
        ("broker-a", -1), ("broker-b", -1)]


def test_the_official_client_sends_over_both_groups_and_receives_every_message_once(cluster):
    a, b = cluster
    sent = official(a, "produce", "--topic", TOPIC, "--count", "40", "--prefix", "gc")
    assert not [line for line in sent if "error" in line], sent
    ids = {line["id"] for line in sent}
    deadline = time.monotonic() + 30  # (a send is answered once stored; its queue's entry follows the dispatch)
    while True:
        stored = [_stored_ids(node, TOPIC) for node in cluster]  # what each group holds, read over ZeroMQ
        if stored[0] | stored[1] >= ids or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stored[0] and stored[1] and not stored[0] & stored[1] and stored[0] | stored[1] == ids, stored
    got = official(a, "simple", "--topic", TOPIC, "--group", "GcG", "--want", "40", "--seconds", "60", timeout=120)
    received = [line["id"] for line in got if "id" in line]
    assert sorted(received) == sorted(ids), got  # each once, from both groups, and acked at each


@pytest.mark.skipif("no Node.js" in nodejs_missing(), reason=nodejs_missing() or "-")
def test_the_nodejs_client_sends_over_both_groups_and_receives_every_message_once(cluster):
    """The official Node.js client (grpc-js) follows the same route: a connection to each group's
    proxy, its sends spread over both, its receives from both."""
    a, b = cluster
    topic = "GcNodeOrders"
    _create_on_both(cluster, topic)
    sent = nodejs(b, "produce", "--topic", topic, "--count", "40", "--prefix", "nj")
    assert len(sent) == 40 and not [line for line in sent if "error" in line], sent
    held = [_stored_ids(node, topic) for node in cluster]
    assert held[0] and held[1] and held[0] | held[1] == {line["id"] for line in sent}, held
    got = nodejs(b, "simple", "--topic", topic, "--group", "GcNodeG", "--want", "40", "--seconds", "60", timeout=120)
    assert sorted(line["id"] for line in got if "id" in line) == sorted(line["id"] for line in sent), got


def _create_on_both(cluster, topic: str) -> None:
    for node in cluster:
        with Producer(node.endpoint) as producer:
            reply, _ = producer.request({"code": protocol.UPDATE_AND_CREATE_TOPIC, "topic": topic,
                                         "readQueueNums": QUEUES, "writeQueueNums": QUEUES})
            assert reply["status"] == "OK", reply
    _wait_for_both_groups(cluster[0].settings.namesrvAddr, topic)


def _stored_ids(node, topic: str) -> set[str]:
    with PullConsumer(node.endpoint) as consumer:
        return {m.msg_id for q in range(QUEUES) for m in consumer.pull(topic, q, 0, max_count=64).messages}


def test_a_recall_at_one_proxy_reaches_the_group_that_holds_the_message(cluster):
    """The official producer's sends go to each group's proxy, its recalls to its access point:
    a handle of the other group's message is forwarded to that group's master."""
    topic = "GcRecall"
    _create_on_both(cluster, topic)
    began = time.monotonic()
    sent = official(cluster[0], "produce", "--topic", topic, "--count", "12", "--delay-ms", "5000", "--recall", "12")
    assert not [line for line in sent if "error" in line], sent
    assert sorted(line["recalled"] for line in sent if "recalled" in line) == sorted(line["id"] for line in sent
                                                                                      if "id" in line)
    taken = _recalls_taken(cluster, 12)
    assert all(taken) and sum(taken) == 12, taken  # (both groups held some, and took their recalls)
    time.sleep(max(0.0, 7.0 - (time.monotonic() - began)))
    for node in cluster:  # past their time: none was delivered
        with PullConsumer(node.endpoint) as consumer:
            assert [m for q in range(QUEUES) for m in consumer.pull(topic, q, 0, max_count=64).messages] == []



def _recalls_taken(cluster, total: int) -> list[int]:
    """Each node's recalls taken, once they add up to `total` (or after 10 s): the statistics are
    up to a second old, and each node's are read at its own moment, so a count read as soon as it
    was non-zero could still miss recalls that node took a moment later."""
    deadline = time.monotonic() + 10
    while True:
        taken = []
        for node in cluster:
            with Producer(node.endpoint) as client:
                reply, _ = client.request({"code": protocol.GET_BROKER_RUNTIME_INFO})
            taken.append(reply["actors"]["schedule"]["timers"]["recalls"]["taken"])
        if sum(taken) >= total or time.monotonic() > deadline:
            return taken
        time.sleep(0.3)

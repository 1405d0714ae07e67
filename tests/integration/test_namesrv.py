"""The name service's shell on real sockets and files (in a thread: no Ray): what it answers to
bad input, and its table across a restart (its file); and a real node's registration and its
unregistration at a clean stop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import orjson
import pytest
import zmq
from nodes import ROOT, NodeProcess, free_port, node_settings

from actors.namesrv import TABLE_FILE, Namesrv
from node import protocol
from node.client import AsyncProducer
from node.server.preflight import hold_directory


@pytest.fixture
def serving(tmp_path):
    started = []

    def start() -> Namesrv:
        service = Namesrv(f"ipc://{tmp_path}/ns", tmp_path / "table")
        thread = threading.Thread(target=service.run, daemon=True)
        thread.start()
        assert service.ready.wait(10)
        started.append((service, thread))
        service.thread = thread
        return service

    yield start
    for service, thread in started:
        service.stop()
        thread.join(10)


def _ask(endpoint: str, frames: list[bytes]) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(5000), "no answer"
        return orjson.loads(sock.recv_multipart()[0])
    finally:
        sock.close()


REGISTRATION = {"code": protocol.REGISTER_BROKER, "brokerName": "broker-a", "clusterName": "C",
                "brokerAddr": "127.0.0.1:10911", "brokerId": 0, "haServerAddr": "127.0.0.1:10912"}
TOPICS = orjson.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": {
    "T": {"readQueueNums": 8, "writeQueueNums": 8, "perm": 6}}}})


def test_bad_input_gets_a_status_and_the_service_goes_on(serving):
    service = serving()
    endpoint = service.listen
    assert _ask(endpoint, [b"not json"])["status"] == "SYSTEM_ERROR"
    assert _ask(endpoint, [b"[1]"])["status"] == "SYSTEM_ERROR"
    assert _ask(endpoint, [orjson.dumps({"code": 10, "opaque": 3})]) | {} == {
        "code": protocol.REQUEST_CODE_NOT_SUPPORTED, "opaque": 3, "status": "REQUEST_CODE_NOT_SUPPORTED",
        "remark": "request code 10 is not one a name service serves"}
    assert _ask(endpoint, [orjson.dumps(REGISTRATION), b"{not json"])["status"] == "INVALID_PARAMETER"
    assert _ask(endpoint, [orjson.dumps(REGISTRATION), b"[]"])["status"] == "INVALID_PARAMETER"
    assert _ask(endpoint, [orjson.dumps(REGISTRATION | {"brokerName": "../x"}), TOPICS])["status"] == "INVALID_PARAMETER"
    assert _ask(endpoint, [orjson.dumps({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": ["T"]})])["status"] == \
        "TOPIC_NOT_EXIST"
    assert _ask(endpoint, [orjson.dumps(REGISTRATION), TOPICS])["status"] == "OK"
    route = _ask(endpoint, [orjson.dumps({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "T"})])
    assert route["brokerDatas"] == [{"cluster": "C", "brokerName": "broker-a", "brokerAddrs": {"0": "127.0.0.1:10911"}}]
    assert service.statistics()["refused"] == 5


def test_the_table_survives_a_restart_through_its_file(serving, tmp_path):
    first = serving()
    assert _ask(first.listen, [orjson.dumps(REGISTRATION), TOPICS])["status"] == "OK"
    first.stop()
    first.thread.join(10)
    assert (tmp_path / "table" / TABLE_FILE).exists()
    second = serving()  # (the first's loop wrote its file as it stopped)
    info = _ask(second.listen, [orjson.dumps({"code": protocol.GET_BROKER_CLUSTER_INFO})])
    assert info["clusterAddrTable"] == {"C": ["broker-a"]}
    assert _ask(second.listen, [orjson.dumps({"code": protocol.GET_ALL_TOPIC_LIST_FROM_NAMESERVER})])["topicList"] == ["T"]
    assert _ask(second.listen, [orjson.dumps({"code": protocol.UNREGISTER_BROKER,
                                              "brokerAddr": "127.0.0.1:10911"})])["status"] == "OK"
    assert _ask(second.listen, [orjson.dumps({"code": protocol.GET_ROUTEINFO_BY_TOPIC, "topic": "T"})])["status"] == \
        "TOPIC_NOT_EXIST"


@pytest.mark.slow
def test_a_node_that_stops_leaves_the_routes_at_once(serving, tmp_path):
    """A node registers with its name services (its registrar, in the clean service's process)
    and at a clean stop unregisters, so clients stop choosing it at once, not after the 120 s a
    silent node is kept. Before, the stop killed that process and the node stayed in the routes."""
    service = serving()
    settings = node_settings(tmp_path / "store", runDir=str(tmp_path / "run"), namesrvAddr=service.listen,
                             brokerName="broker-s", brokerClusterName="S")
    node = NodeProcess(settings, tmp_path / "node.log").start()
    try:
        deadline = time.monotonic() + 30
        while _ask(service.listen, [orjson.dumps({"code": protocol.GET_BROKER_CLUSTER_INFO})])["clusterAddrTable"] != \
                {"S": ["broker-s"]}:
            assert time.monotonic() < deadline, "the node never registered"
            time.sleep(0.2)
        _a_cluster_producer_serves_each_asyncio_run(service.listen)
    finally:
        assert node.stop() == 0
    info = _ask(service.listen, [orjson.dumps({"code": protocol.GET_BROKER_CLUSTER_INFO})])
    assert info["clusterAddrTable"] == {} and info["brokerAddrTable"] == {}, info


def _a_cluster_producer_serves_each_asyncio_run(namesrv: str) -> None:
    """A cluster's AsyncProducer, never started, used by one asyncio.run after another: each run's
    sends are answered and its routes are refreshed on that run's loop (never started, it kept the
    routes it first fetched for good; after the first run, its sends waited forever)."""
    producer = AsyncProducer(namesrv=namesrv)

    async def send() -> tuple[str, bool]:
        result = await asyncio.wait_for(producer.send("T", b"x"), 10)
        refresher = producer.cluster.routes.refresher
        return result.status, refresher is not None and refresher.get_loop() is asyncio.get_running_loop()

    assert [asyncio.run(send()) for _ in range(3)] == [("PUT_OK", True)] * 3


def test_a_second_name_service_on_a_directory_in_use_is_refused(tmp_path):
    """Two `mqnode namesrv --dir D` shared its pid file and their embedded Rays' session directory:
    the second is refused before it starts anything, naming the first (node.server.preflight)."""
    lock = hold_directory(tmp_path, "directory", "name service", "--dir")
    try:
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "namesrv", "--listen",
                               f"127.0.0.1:{free_port()}", "--dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    finally:
        lock.release()
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (f"mqnode namesrv: directory {tmp_path} is in use by another name service (pid "
                           f"{os.getpid()}): give each name service a --dir of its own\n")


@pytest.mark.parametrize("listen, said", [
    ("bad", "needs a host and a port of 1..65535"),  # (its actor crashed over and over)
    ("127.0.0.1:0", "needs a host and a port of 1..65535"),  # ("ready" on a port no client knew)
    ("127.0.0.1:99999", "needs a host and a port of 1..65535"),
])
def test_a_name_service_on_no_endpoint_is_refused_before_it_starts(tmp_path, listen, said):
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "namesrv", "--listen", listen, "--dir",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_node_listening_on_port_0_is_refused_as_its_ha_and_grpc_ports_would_be_1_and_2():
    from shm.settings_rules import endpoint_problem

    assert endpoint_problem("tcp://127.0.0.1:0") and endpoint_problem("tcp://:5") and endpoint_problem("ipc://")
    assert endpoint_problem("udp://127.0.0.1:5") and endpoint_problem("tcp://127.0.0.1:65536")
    assert not any(endpoint_problem(e) for e in ("tcp://127.0.0.1:10911", "tcp://[::1]:10911", "tcp://*:1",
                                                 "ipc:///tmp/node.sock"))


@pytest.mark.parametrize("command", ["stats", "topics"])
def test_admin_over_name_services_that_do_not_answer_waits_its_timeout(command):
    """(The name services' asks waited 5 s whatever --timeout said.)"""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", command, "--namesrv",
                           f"127.0.0.1:{free_port()}", "--timeout", "1"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and "within 1000 ms" in done.stderr, done.stderr
    assert time.monotonic() - began < 4.5

"""A cluster on a Ray cluster of three hosts: one name service and broker group a's master on the
first, broker group b's SYNC_MASTER on the second, its slave on the third, all started by `mqnode
cluster up --ray-address`. The hosts are network namespaces of their own with addresses of their
own (tests/nodes.py NetHosts, as root: CI), so every node serves, replicates and registers at an
address the other hosts reach and a lost host is every process in it killed; without root, three
raylets of this host on loopback (Ray's cluster utilities). Clients find everything through
`namesrv=`. The tests share the one cluster, in any order: sends and consumption over both groups,
a Spark read, the name service killed, a master killed (restarted where it was), a master's host
cut off while its slave is promoted, then healed (it restarts as its slave), a master's host
lost and its slave promoted (`Up` records which of broker-b's nodes is its master now); each
counts what it sent to a topic of its own, or only that what it sent is there."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import psutil
import pytest
from helpers import wait_until
from nodes import HOST_DISK_BLIND, ROOT, SMALL_STORE, NetHosts, free_port, node_settings, ray_cluster, ray_host, toml_lines

from node.client import AsyncProducer, Producer, PullConsumer, Requester, SendError
from node.client.push import CONSUME_SUCCESS, PushConsumer
from node.server import ray_setup
from node.tools.local_node import ClusterProcess, NodeProcess

pytestmark = pytest.mark.slow

TOPIC = "ORDERS"  # made with the cluster, on both groups
MESSAGES = 100_000
UP_TIMEOUT_S = 300


class Up:
    """The running cluster: its toml, its `up` process, the Ray cluster and what `ready` said."""

    def __init__(self, directory: Path):
        self.net = NetHosts("hostA", "hostB", "hostC") if NetHosts.available() else None
        try:
            self._start_ray()
        except BaseException:
            if self.net:
                self.net.down()
            raise
        ip = self.net.ip if self.net else dict.fromkeys(("hostA", "hostB", "hostC"), "127.0.0.1")
        self.directory = directory
        ports = {name: free_port() for name in ("namesrv", "namesrv2", "a", "b0", "b1")}
        self.namesrv = f"{ip['hostA']}:{ports['namesrv']}"
        self.namesrv2 = f"{ip['hostB']}:{ports['namesrv2']}"  # a second: every node registers with both
        self.listen = {name: f"tcp://{ip[host]}:{ports[name]}" for name, host in self.HOSTS.items()}
        self.stores = {name: directory / name for name in ("a", "b0", "b1")}
        ha = {name: free_port() for name in ("a", "b0", "b1")}  # (each HA link on its node's listen host)
        self.conf = directory / "cluster.toml"
        self.conf.write_text(f"""
[cluster]
name = "TestCluster"
runDir = "{directory / 'run'}"

[defaults]
topology = "compact"
grpcServerPort = 0
transientStorePoolEnable = false
{toml_lines(SMALL_STORE | HOST_DISK_BLIND)}

[[namesrv]]
listen = "{self.namesrv}"
rayNode = "hostA"

[[namesrv]]
listen = "tcp://{self.namesrv2}"
rayNode = "hostB"

[[node]]
brokerName = "broker-a"
store = "{self.stores['a']}"
listen = "{self.listen['a']}"
haListenPort = {ha['a']}
rayNode = "hostA"

[[node]]
brokerName = "broker-b"
store = "{self.stores['b0']}"
listen = "{self.listen['b0']}"
haListenPort = {ha['b0']}
brokerRole = "SYNC_MASTER"
rayNode = "hostB"

[[node]]
brokerName = "broker-b"
store = "{self.stores['b1']}"
listen = "{self.listen['b1']}"
haListenPort = {ha['b1']}
brokerRole = "SLAVE"
brokerId = 1
haMasterAddress = "{ip['hostB']}:{ha['b0']}"
rayNode = "hostC"
""")
        self.cluster = ClusterProcess(self.conf, directory / "up.log", ray_address=self.ray.address)
        self.ready: dict = {}
        self.b_master, self.b_master_role = "b0", "SYNC_MASTER"  # (until a test promotes its slave)

    @property
    def b_slave(self) -> str:
        """Which of broker-b's nodes is its slave now."""
        return {"b0": "b1", "b1": "b0"}[self.b_master]

    def create_topic(self, topic: str) -> dict:
        """`admin topic create` over the cluster, 8 queues a group; what each group answered, once
        the name service routes the topic to both and every node lists it (a slave's front takes
        its master's topics once a second)."""
        created = orjson.loads(self.cli("admin", "topic", "create", "--namesrv", self.namesrv, "--topic", topic,
                                        "--queues", "8"))
        wait_until(lambda: len(orjson.loads(self.cli("admin", "topics", "--namesrv", self.namesrv)).get(topic, {})) == 2,
                   10, f"the name service never had {topic} on both groups")
        for name, endpoint in self.listen.items():
            wait_until(lambda: topic in orjson.loads(self.cli("admin", "topics", "--endpoint", endpoint)), 10,
                       f"node {name} never had {topic}")
        return created

    def cli(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", *args], cwd=ROOT, capture_output=True,
                              timeout=timeout)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    def status(self) -> dict:
        return orjson.loads(self.cli("cluster", "status", "--conf", str(self.conf)))

    HOSTS = {"a": "hostA", "b0": "hostB", "b1": "hostC"}

    def start(self) -> None:
        self.ready = self.cluster.start(UP_TIMEOUT_S).ready

    def _start_ray(self) -> None:
        if self.net is None:
            self.ray, others = ray_cluster("hostA", "hostB", "hostC")
            self.hosts = dict(zip(("hostB", "hostC"), others))
            return
        self.ray, _ = ray_cluster("hostA", head_ip=self.net.ip["hostA"])
        self.hosts = {}
        for host in ("hostB", "hostC"):
            self.net.start_raylet(host, self.ray.address)

    def raylet(self, host: str) -> int:
        if self.net:
            return self.net.raylet(host)
        return self.hosts[host].all_processes["raylet"][0].process.pid

    def lose(self, host: str) -> None:
        """The host is gone, with every process on it."""
        if self.net:
            self.net.lose(host)
            return
        pids = [pid for name, on in self.HOSTS.items() if on == host for pid in self.node_pids(name)]
        self.ray.remove_node(self.hosts.pop(host), allow_graceful=False)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def bring_back(self, host: str) -> None:
        """The host is back, empty: a raylet joins the Ray cluster there again."""
        if self.net:
            self.net.start_raylet(host, self.ray.address)
        else:
            self.hosts[host] = ray_host(self.ray, host)

    def node_pids(self, name: str) -> list[int]:
        """The node's launcher (the Ray actor that runs it) and its services."""
        return self.cluster.node_pids(self.stores[name])

    def down(self) -> None:
        try:
            stopped = self.cluster.stop()
            self.ray.shutdown()
            assert stopped == 0 or not self.ready, f"cluster up exited {stopped} at its SIGTERM"
        finally:
            if self.net:
                self.net.down()


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    cluster = Up(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        cluster.create_topic(TOPIC)
        yield cluster
    finally:
        cluster.down()


def test_a_node_that_cannot_start_ends_up_with_its_own_reason_and_nothing_left_running(tmp_path):
    """`cluster up` whose node refuses to start (here its store's disk, too small for its segments;
    a port in use or a locked store alike): one line, `mqnode cluster failed: <part> did not start:
    <why>`, exit 1, every part started before it stopped. (Before: Ray's traceback of an actor
    whose creation raised.)"""
    from shm.disk import capacity_bytes

    conf = tmp_path / "cluster.toml"
    conf.write_text(f"""
[cluster]
name = "Refused"
runDir = "{tmp_path / 'run'}"

[defaults]
grpcServerPort = 0
{toml_lines(HOST_DISK_BLIND)}
mappedFileSizeCommitLog = {capacity_bytes(tmp_path)}

[[namesrv]]
listen = "127.0.0.1:{free_port()}"

[[node]]
brokerName = "broker-a"
store = "{tmp_path / 'a'}"
listen = "tcp://127.0.0.1:{free_port()}"
haListenPort = {free_port()}
""")
    done = subprocess.run([sys.executable, "-m", "node.tools.cli", "cluster", "up", "--conf", str(conf)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.startswith("mqnode cluster failed: broker-a/0 did not start: the store's disk"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and done.stdout.splitlines()[-2:] == ["mqnode cluster stopping",
                                                                                "mqnode cluster stopped"]
    assert not (tmp_path / "a" / "commitlog").exists()
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])],
               10, "a process of the refused cluster (its Ray's) still runs")
    assert not ray_setup.ray_dir_in(tmp_path / "run").exists()  # (its embedded Ray's session files: under /tmp here)


def test_every_part_is_ready_on_its_ray_node_and_status_shows_every_group(up):
    assert set(up.ready) == {f"namesrv@{up.namesrv}", f"namesrv@{up.namesrv2}", "broker-a/0", "broker-b/0", "broker-b/1"}
    raylet_b, raylet_c = up.raylet("hostB"), up.raylet("hostC")
    for pid in up.node_pids("b0"):
        assert psutil.Process(pid).ppid() == raylet_b
    for pid in up.node_pids("b1"):
        assert psutil.Process(pid).ppid() == raylet_c

    def slaves(status: dict) -> list[dict]:
        return [b for k, b in status["groups"].get("broker-b", {}).get("brokers", {}).items() if k != "0"]
    def settled() -> dict | None:
        status = up.status()
        return status if slaves(status) and slaves(status)[0]["lagBytes"] == 0 else None
    status = wait_until(settled, 30, "the slave never registered, or never caught up")
    assert status["clusters"] == {"TestCluster": ["broker-a", "broker-b"]}
    master, slave = up.b_master, up.b_slave
    b = status["groups"]["broker-b"]["brokers"]
    assert (b["0"]["address"], b["0"]["role"]) == (up.listen[master].removeprefix("tcp://"), up.b_master_role)
    assert [(s["address"], s["role"]) for s in slaves(status)] == [(up.listen[slave].removeprefix("tcp://"), "SLAVE")]
    assert b["0"]["health"] == slaves(status)[0]["health"] == status["groups"]["broker-a"]["brokers"]["0"]["health"] == "ok"
    second = orjson.loads(up.cli("admin", "cluster", "--namesrv", up.namesrv2))  # every node registers with each
    assert {name: sorted(g["brokers"]) for name, g in second["groups"].items()} == {"broker-a": ["0"],
                                                                                   "broker-b": ["0", "1"]}


def test_a_node_started_on_a_host_of_the_ray_cluster_runs_every_process_there(up, tmp_path):
    """`mqnode start --ray-address` on one of the cluster's hosts places the node's processes on
    that host's Ray node (docs/operations.md "On another host"). Ray attaches a driver to the node
    of the address it guesses for the host: with no route out, the host name's, here the head's;
    the node's processes then ran on the head, where its `listen` address does not exist."""
    if up.net is None:
        pytest.skip("the three Ray nodes share this host's loopback (not root): any of them is this host's")
    port = free_port()
    settings = node_settings(tmp_path / "store", listen=f"tcp://{up.net.ip['hostC']}:{port}", listenPort=port,
                             topology="compact")
    node = NodeProcess(settings, tmp_path / "node.log", ray_address=up.ray.address, netns=up.net.ns["hostC"]).start()
    try:
        pids = [int(f.read_text()) for f in settings.run_dir.glob("*.pid")]
        assert pids and {psutil.Process(pid).ppid() for pid in pids} == {up.raylet("hostC")}
        with Producer(settings.listen, timeout=5.0) as producer:
            assert producer.send("HERE", b"on hostC").status == "PUT_OK"
    finally:
        assert node.stop() == 0


def test_sends_through_the_name_service_reach_both_groups_and_a_group_of_three_takes_each_once(up):
    topic = "ORDERS_G3"
    assert up.create_topic(topic) == {"broker-a": {"status": "OK"}, "broker-b": {"status": "OK"}}
    consumed: list[str] = []
    lock = threading.Lock()

    def listener(messages):
        with lock:
            consumed.extend(m.msg_id for m in messages)
        return CONSUME_SUCCESS

    members = []
    for name in ("m1", "m2", "m3"):
        member = PushConsumer(group="G3", namesrv=up.namesrv, instance_name=name,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET", rebalance_interval=2)
        member.subscribe(topic)
        member.register_listener(listener)
        members.append(member.start())
    try:
        def shares():
            held = [{tuple(q) for q in m.statistics()["queues"] if q[1] == topic} for m in members]
            return len(set().union(*held)) == 16 and sum(map(len, held)) == 16 and all(held)
        wait_until(shares, 60, "the three members never shared the 16 queues")
        sent = asyncio.run(_send_all(up.namesrv, topic, MESSAGES))
        assert {r.broker for r in sent} == {"broker-a", "broker-b"}
        assert len({(r.broker, r.queue_id) for r in sent}) == 16
        wait_until(lambda: len(consumed) >= MESSAGES, 180, f"consumed {len(consumed)} of {MESSAGES}")
        time.sleep(1)  # (nothing more comes: each exactly once)
        counts = Counter(consumed)
        assert len(counts) == MESSAGES and max(counts.values()) == 1
        assert set(counts) == {r.msg_id for r in sent}
        status = orjson.loads(up.cli("admin", "topic", "--namesrv", up.namesrv, "--topic", topic))
        assert {name: sum(q["maxOffset"] for q in group["queues"].values()) for name, group in status.items()} \
            == Counter(r.broker for r in sent)  # each group's queues, asked at the group
        with PullConsumer(namesrv=up.namesrv) as reader:  # each group's message found by its ids, in that group
            for result in ({r.broker: r for r in sent}.values()):
                assert reader.view(result.offset_msg_id, topic).msg_id == result.msg_id
                assert reader.view(result.msg_id, topic).offset_msg_id == result.offset_msg_id
    finally:
        for member in members:
            member.shutdown()


def test_admin_with_namesrv_changes_and_shows_every_groups_master(up):
    """mqadmin's `-c Cluster`: a group's config, its offsets (shown and reset) and the group and
    topic deleted, on every group's master at once; a delete nobody could do fails."""
    topic, group = "ADMIN_ALL", "AdminAll"
    up.create_topic(topic)
    stored = Counter(r.broker for r in asyncio.run(_send_all(up.namesrv, topic, 64, batch=4)))
    assert set(stored) == {"broker-a", "broker-b"}

    def admin(*args: str, exit_code: int = 0) -> dict:
        done = subprocess.run([sys.executable, "-m", "node.tools.cli", "admin", *args, "--namesrv", up.namesrv],
                              cwd=ROOT, capture_output=True, timeout=60)
        assert done.returncode == exit_code, done.stderr.decode()
        return orjson.loads(done.stdout)

    updated = admin("group", "update", "--group", group, "--max-retries", "5")
    assert {name: config["retryMaxTimes"] for name, config in updated.items()} == {"broker-a": 5, "broker-b": 5}
    reset = admin("reset-offset", "--group", group, "--topic", topic, "--to", "last")
    assert {name: sum(shown[topic].values()) for name, shown in reset.items()} == stored  # (each queue's end)
    offsets = admin("offsets", "--group", group, "--topic", topic)
    assert {name: sum(q["consumerOffset"] for q in shown[topic].values()) for name, shown in offsets.items()} == stored
    deleted = {"deleted": group, "topicsDeleted": []}  # (no send-back made its retry or dead-letter topic)
    assert admin("group", "delete", "--group", group) == {"broker-a": deleted, "broker-b": deleted}
    again = admin("group", "delete", "--group", group, exit_code=1)
    assert {shown["status"] for shown in again.values()} == {"SUBSCRIPTION_GROUP_NOT_EXIST"}
    assert admin("topic", "delete", "--topic", topic) == {"broker-a": {"deleted": topic}, "broker-b": {"deleted": topic}}
    wait_until(lambda: topic not in admin("topics"), 10, f"the name service still routes {topic}")


def test_a_read_only_group_takes_no_new_sends_and_is_still_read(up):
    """brokerPermission 4 at a group's master (`admin config update`, mqadmin updateBrokerConfig:
    draining a group before maintenance): it registers its topics read-only at once, so a
    producer's route sends only to the other group while the group's messages are still read;
    back at 6, it takes sends again."""
    topic = "DRAINED"
    up.create_topic(topic)
    before = asyncio.run(_send_all(up.namesrv, topic, 2048))
    assert {r.broker for r in before} == {"broker-a", "broker-b"}
    master = up.listen[up.b_master]

    def perm_of_b() -> int:
        return orjson.loads(up.cli("admin", "topic", "--namesrv", up.namesrv, "--topic", topic))["broker-b"]["perm"]

    try:
        changed = orjson.loads(up.cli("admin", "config", "update", "--endpoint", master, "--set", "brokerPermission=4"))
        assert changed["brokerPermission"] == 4
        wait_until(lambda: perm_of_b() == 4, 15, "broker-b never registered read only")
        during = asyncio.run(_send_all(up.namesrv, topic, 2048))
        assert {r.broker for r in during} == {"broker-a"}
        with PullConsumer(namesrv=up.namesrv) as reader:
            on_b = [r for r in before if r.broker == "broker-b"]
            assert reader.view(on_b[-1].offset_msg_id, topic).msg_id == on_b[-1].msg_id
    finally:
        up.cli("admin", "config", "update", "--endpoint", master, "--set", "brokerPermission=6")
    wait_until(lambda: perm_of_b() == 6, 15, "broker-b never registered read and write again")
    assert {r.broker for r in asyncio.run(_send_all(up.namesrv, topic, 2048))} == {"broker-a", "broker-b"}


def test_requests_over_both_groups_are_answered_through_the_group_that_stored_each(up):
    """Request-reply through the name services: a Requester's requests go to both groups (it
    becomes a member at each node it asks), a cluster's push consumer answers each through the
    group whose master stored it, and every reply reaches its requester."""
    topic = "RPC_G"
    up.create_topic(topic)
    replier = Producer(namesrv=up.namesrv)

    def listener(messages):
        for message in messages:
            replier.send_reply(message, b"re:" + message.body)
        return CONSUME_SUCCESS

    servers = PushConsumer(group="RpcServers", namesrv=up.namesrv, consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                           rebalance_interval=2)
    servers.subscribe(topic)
    servers.register_listener(listener)
    servers.start()
    try:
        with Requester(namesrv=up.namesrv, group="RpcCallers") as requester, ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: requester.request(topic, f"q{i}", timeout=60), range(16)))
            assert len(requester.inner.memberships) == 2  # (a member at both groups' masters)
    finally:
        servers.shutdown()
        replier.close()
    assert [a.body for a in answers] == [f"re:q{i}".encode() for i in range(16)]


async def _send_all(namesrv: str, topic: str, count: int, batch: int = 64, senders: int = 8):
    async with AsyncProducer(namesrv=namesrv) as producer:
        async def sender(n: int):
            out = []
            for _ in range(n):
                out += await producer.send_batch(topic, [os.urandom(100) for _ in range(batch)])
            return out
        per = count // (batch * senders)
        results = sum(await asyncio.gather(*(sender(per) for _ in range(senders))), [])
        rest = count - len(results)
        while rest:
            results += await producer.send_batch(topic, [os.urandom(100) for _ in range(min(batch, rest))])
            rest = count - len(results)
        return results


def test_a_spark_read_over_both_groups_returns_everything(up, spark):
    topic, count = "ORDERS_SPARK", 20_000
    up.create_topic(topic)
    sent = asyncio.run(_send_all(up.namesrv, topic, count))
    assert {r.broker for r in sent} == {"broker-a", "broker-b"}
    frame = spark.read.format("mqnode").option("namesrv", up.namesrv).option("topic", topic).load()
    assert frame.count() == count
    assert {row.msgId for row in frame.select("msgId").collect()} == {r.msg_id for r in sent}
    assert frame.rdd.getNumPartitions() == 16


def _namesrv_pid(up) -> int:
    return int((up.directory / "run" / "namesrv-0" / "namesrv.pid").read_text())


def test_clients_keep_their_routes_while_the_name_service_restarts(up):
    with Producer(namesrv=up.namesrv, timeout=2.0) as producer:
        producer.send(TOPIC, b"before")  # (the route is known now)
        old = _namesrv_pid(up)
        os.kill(old, signal.SIGKILL)
        for i in range(50):  # the name service is away: the routes kept still serve
            assert producer.send(TOPIC, f"during {i}".encode()).status == "PUT_OK"
        with PullConsumer(namesrv=f"{up.namesrv};tcp://{up.namesrv2}") as consumer:  # one answers
            assert len(wait_until(lambda: _queues(consumer), 30, "neither name service answered")) == 16
        wait_until(lambda: _namesrv_pid(up) != old, 60, "Ray never restarted the name service")
        with PullConsumer(namesrv=up.namesrv) as consumer:  # a new client of the restarted one alone
            # (well within registerNameServerPeriod, 30 s: its file, test_namesrv.py, brings the table back)
            queues = wait_until(lambda: _queues(consumer), 10, "the restarted name service's routes")
        assert {b for b, _ in queues} == {"broker-a", "broker-b"} and len(queues) == 16


def _queues(consumer):
    try:
        return consumer.read_queues(TOPIC)
    except SendError:
        return None


class Sending:
    """Sends on a thread until stopped: (time, broker) of each acknowledged send, and the ids."""

    def __init__(self, namesrv: str):
        self.producer = Producer(namesrv=namesrv, timeout=1.0, isolation_s=60)
        self.acked: list[tuple[float, str, str]] = []
        self.failures = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            i += 1
            try:
                result = self.producer.send(TOPIC, f"m{i}".encode())
                self.acked.append((time.monotonic(), result.broker, result.msg_id))
            except SendError:
                self.failures += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)
        self.producer.close()


def _moved(sending: Sending, since: float, to: str) -> None:
    """From 5 s after `since` on, sends are acknowledged, all by `to` (for at least 2 s)."""
    wait_until(lambda: any(t > since + 7 for t, _, _ in sending.acked), 30, "no send was acknowledged 7 s after the loss")
    later = [b for t, b, _ in sending.acked if t > since + 5]
    assert later and set(later) == {to}, Counter(later)


def _everything(namesrv: str, group: str) -> set[str]:
    with PullConsumer(namesrv=namesrv) as consumer:
        return {m.msg_id for m in consumer.consume(TOPIC, group, start="first", idle_timeout=5)}


def test_a_killed_master_sends_move_to_the_other_group_and_it_comes_back_where_it_was(up):
    sending = Sending(up.namesrv)
    try:
        wait_until(lambda: {b for _, b, _ in sending.acked} == {"broker-a", "broker-b"}, 20, "sends never reached both")
        killed_at = time.monotonic()
        for pid in up.node_pids("a"):
            os.kill(pid, signal.SIGKILL)
        _moved(sending, killed_at, "broker-b")
        wait_until(lambda: up.status()["groups"].get("broker-a", {}).get("brokers", {}).get("0", {}).get("health") == "ok",
              120, "broker-a never came back")
    finally:
        sending.stop()
    acked = {msg_id for _, _, msg_id in sending.acked}
    assert acked <= _everything(up.namesrv, "after-kill")  # nothing acknowledged was lost


def test_a_master_cut_off_while_its_slave_is_promoted_comes_back_as_its_slave(up):
    """broker-b's master's host is cut off from the others, its processes alive; its slave is
    promoted, a SYNC_MASTER without a slave (its sends SLAVE_NOT_AVAILABLE). Healed, the old
    master's next registration is answered supersededBy and it restarts at once as the new
    master's slave (node.server.cluster.old_master; its fencing at that start is test_ha's): the
    group's sends are PUT_OK again."""
    if up.net is None:
        pytest.skip("a partition needs hosts of their own (root and iproute2: NetHosts)")
    old, new = up.b_master, up.b_slave
    old_pids = set(up.node_pids(old))
    up.net.cut(up.HOSTS[old])
    try:
        promoted = orjson.loads(up.cli("admin", "role", "--endpoint", up.listen[new], "--role", "SYNC_MASTER"))
        up.b_master, up.b_master_role = new, "SYNC_MASTER"
        with Producer(up.listen[new], retries=0) as producer:
            assert producer.send(TOPIC, b"no slave").status == "SLAVE_NOT_AVAILABLE"
    finally:
        up.net.heal(up.HOSTS[old])
    new_ha = orjson.loads(up.cli("admin", "ha", "--endpoint", up.listen[new]))["haListen"]
    old_address = up.listen[old].removeprefix("tcp://")

    def following() -> bool:
        brokers = up.status()["groups"]["broker-b"]["brokers"]
        slave = next((b for k, b in brokers.items() if k != "0" and b["address"] == old_address), {})
        return (slave.get("role"), slave.get("follows"), slave.get("health")) == ("SLAVE", new_ha, "ok")
    wait_until(following, 120, "the old master never came back as the promoted slave's slave")
    assert not old_pids & set(up.node_pids(old))  # (restarted: not one of its processes is the same)
    with Producer(up.listen[new], retries=0) as producer:
        assert producer.send(TOPIC, b"a slave again").status == "PUT_OK"
    assert promoted["epoch"] >= 1


def test_a_lost_masters_group_is_served_by_its_promoted_slave(up):
    old, new = up.b_master, up.b_slave
    sending = Sending(up.namesrv)
    try:
        wait_until(lambda: sum(1 for _, b, _ in sending.acked if b == "broker-b") > 50, 20, "no sends to broker-b")
        lost_at = time.monotonic()
        up.lose(up.HOSTS[old])  # its host is gone: nothing comes back there
        _moved(sending, lost_at, "broker-a")
        up.cli("admin", "role", "--endpoint", up.listen[new], "--role", "ASYNC_MASTER")  # (its own slave is lost)
        up.b_master, up.b_master_role = new, "ASYNC_MASTER"
        slave_address = up.listen[new].removeprefix("tcp://")
        wait_until(lambda: up.status()["groups"]["broker-b"]["brokers"].get("0", {}).get("address") == slave_address, 30,
              "the promoted slave never registered as broker-b's master")
    finally:
        sending.stop()
    acked = {msg_id for _, b, msg_id in sending.acked if b == "broker-b"}
    assert acked and acked <= _everything(up.namesrv, "after-loss")  # SYNC_MASTER: each was on the slave too
    # its host is back: Ray restarts the old master there, and it comes back as the new master's
    # slave, following the HA address the new master registered (on its own host's address)
    up.bring_back(up.HOSTS[old])
    old_master = up.listen[old].removeprefix("tcp://")
    new_master_ha = orjson.loads(up.cli("admin", "ha", "--endpoint", up.listen[new]))["haListen"]
    assert new_master_ha.rpartition(":")[0] == slave_address.rpartition(":")[0]

    def following() -> bool:
        brokers = up.status()["groups"]["broker-b"]["brokers"]
        slave = next((b for k, b in brokers.items() if k != "0" and b["address"] == old_master), {})
        return (slave.get("role"), slave.get("follows"), slave.get("health")) == ("SLAVE", new_master_ha, "ok")
    wait_until(following, 180, "the old master never came back as the promoted slave's slave")
    with Producer(namesrv=up.namesrv, timeout=5.0) as producer:  # what broker-b stores now, the old master copies
        after = [producer.send(TOPIC, f"after {i}".encode()) for i in range(200)]
    assert {r.broker for r in after} >= {"broker-b"}

    def copied() -> bool:
        brokers = up.status()["groups"]["broker-b"]["brokers"]
        slave = next((b for k, b in brokers.items() if k != "0" and b["address"] == old_master), {})
        return slave.get("lagBytes") == 0 and slave.get("writtenOffset") == brokers["0"].get("writtenOffset")
    wait_until(copied, 30, "the old master never copied what its new master stored")

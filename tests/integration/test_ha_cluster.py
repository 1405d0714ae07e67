"""A slave on another node of a Ray cluster: a local multi-node cluster (Ray's cluster utilities,
two raylets on this machine), the slave joining it with --ray-address and placed by `rayNode` on
the second Ray node, following a master (RocketMQ's link, served by the test: the golden
store's CommitLog, as RocketMQ 4.9.8 wrote it)."""

from __future__ import annotations

import time

import psutil
import pytest
from golden import GOLDEN_SETTINGS, GOLDEN_STORE, manifest
from nodes import FakeRocketMQMaster, NodeProcess, free_port, node_settings, ray_cluster

from node.client import PullConsumer
from shm.control_block import peek
from shm.mapped_file import file_name

pytestmark = pytest.mark.slow


def test_a_slave_runs_on_the_ray_node_it_names(tmp_path):
    cluster, (host_b,) = ray_cluster("hostA", "hostB")
    golden = b"".join(f.read_bytes() for f in sorted((GOLDEN_STORE / "commitlog").iterdir()))
    end = manifest()["maxPhyOffset"]
    master = FakeRocketMQMaster(golden[:end], GOLDEN_SETTINGS["mappedFileSizeCommitLog"])
    slave = node_settings(tmp_path / "slave", brokerRole="SLAVE", brokerId=1, haListenPort=free_port(),
                          haMasterAddress=f"127.0.0.1:{master.port}", haProtocol="rocketmq", rayNode="hostB",
                          **GOLDEN_SETTINGS)
    slave_node = None
    try:
        slave_node = NodeProcess(slave, tmp_path / "slave.log", ray_address=cluster.address).start(timeout=120)
        raylet = host_b.all_processes["raylet"][0].process.pid
        for label in slave_node.actor_labels():
            assert psutil.Process(slave_node.actor_process(label).pid).ppid() == raylet, label
        deadline = time.monotonic() + 30
        while peek(slave.root, "dispatched") < end:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        first = end - end % GOLDEN_SETTINGS["mappedFileSizeCommitLog"]  # an empty slave: the last segment on
        with open(slave.commitlog_dir / file_name(first), "rb") as copy:
            assert copy.read(end - first) == golden[first:end]
        with PullConsumer(slave.listen) as consumer:  # and it serves them
            assert consumer.max_offset("TopicA", 0) == manifest()["queues"]["TopicA"]["0"]["maxOffset"]
    finally:
        if slave_node is not None:
            slave_node.stop(strict=False)
        master.close()
        cluster.shutdown()


def _ha_store(directory, **overrides):
    """A store and its control block as the launcher leaves them, for an HA actor run in a thread."""
    from helpers import small_settings

    from actors import guard
    from shm.control_block import ROLE_CODES, ControlBlock
    from shm.epochs import EpochFile

    settings = small_settings(directory / "store", runDir=str(directory / "run"), **overrides)
    settings.root.mkdir(parents=True)
    settings.run_dir.mkdir(mode=0o700)
    guard.write_identity(settings)
    control = ControlBlock(settings.root / "control", create=True)
    control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    control.set("role", ROLE_CODES[settings.brokerRole])
    if not settings.is_slave:
        EpochFile(settings.root).genesis(0)
    return settings, control


def test_the_ha_link_is_curve_encrypted_and_allow_listed(tmp_path):
    """curveEnable on a master makes its HA link CURVE, with the client port's allow-list: a slave
    with haMasterPublicKeyFile and a listed key follows; a plaintext peer and an unlisted key get
    nothing. (The ha-server and ha-client in threads of this process: real sockets and files.)"""
    import threading

    import zmq
    import zmq.auth
    from helpers import message, open_store, put

    from actors.ha_client import HaClient
    from actors.ha_server import HaServer

    keys = {}
    for name in ("master", "slave", "stranger"):
        (tmp_path / name).mkdir()
        keys[name] = zmq.auth.create_certificates(tmp_path / name, "node")  # (public, secret) paths
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "slave.key").write_bytes((tmp_path / "slave" / "node.key").read_bytes())
    port = free_port()
    master, m_control = _ha_store(tmp_path / "m", curveEnable=True, curveSecretKeyFile=str(keys["master"][1]),
                                  curveClientKeysDir=str(allowed), haListenPort=port)
    store = open_store(master, lock=False)
    put(store, [message(i) for i in range(30)])
    end = store.commitlog.offset_written
    store.close()
    m_control.advance("written", end)
    m_control.advance("dispatched", end)

    def follower(name: str):
        settings, control = _ha_store(tmp_path / f"s-{name}", brokerRole="SLAVE", brokerId=1,
                                      haMasterAddress=f"127.0.0.1:{port}", curveSecretKeyFile=str(keys[name][1]),
                                      haMasterPublicKeyFile=str(keys["master"][0]))
        return HaClient(settings), control

    server = HaServer(master)
    slave, s_control = follower("slave")
    stranger, t_control = follower("stranger")
    actors = [server, slave, stranger]
    threads = [threading.Thread(target=actor.run, daemon=True) for actor in actors]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 20
        while s_control.get("written") < end:
            assert time.monotonic() < deadline, s_control.snapshot()
            time.sleep(0.05)
        plain = zmq.Context.instance().socket(zmq.DEALER)
        plain.setsockopt(zmq.LINGER, 0)
        plain.connect(f"tcp://127.0.0.1:{port}")
        plain.send(b"E")  # the history question: a plaintext peer never gets the answer
        assert not plain.poll(1000)
        plain.close(0)
        assert t_control.get("written") == 0  # an unlisted key never got a byte
        assert server.curve is not None and server.curve.statistics()["handshakesRefused"] >= 1
    finally:
        for actor in actors:
            actor.stop()
        for thread in threads:
            thread.join(10)
        for block in (m_control, s_control, t_control):
            block.close()

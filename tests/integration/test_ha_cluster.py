"""A slave on another node of a Ray cluster: a local multi-node cluster (Ray's cluster utilities,
two raylets on this machine), the slave joining it with --ray-address and placed by `rayNode` on
the second Ray node, following a master of its own."""

from __future__ import annotations

import time

import psutil
import pytest
from nodes import NodeProcess, free_port, node_settings

from node.client import Producer, PullConsumer
from shm.control_block import peek

pytestmark = pytest.mark.slow


def _written(settings) -> int:
    return peek(settings.root, "written")


def test_a_slave_runs_on_the_ray_node_it_names(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"hostA": 1},
                                                            "object_store_memory": 80 * 1024 * 1024})
    host_b = cluster.add_node(num_cpus=1, resources={"hostB": 1}, object_store_memory=80 * 1024 * 1024)
    master = node_settings(tmp_path / "master", haListenPort=free_port())
    slave = node_settings(tmp_path / "slave", brokerRole="SLAVE", brokerId=1, haListenPort=free_port(),
                          haMasterAddress=f"127.0.0.1:{master.ha_port}", rayNode="hostB")
    master_node = NodeProcess(master, tmp_path / "master.log").start()
    slave_node = None
    try:
        slave_node = NodeProcess(slave, tmp_path / "slave.log", ray_address=cluster.address).start(timeout=120)
        raylet = host_b.all_processes["raylet"][0].process.pid
        for label in slave_node.actor_labels():
            assert psutil.Process(slave_node.actor_process(label).pid).ppid() == raylet, label
        with Producer(master.listen) as producer:
            for i in range(200):
                producer.send("Clustered", f"m{i}".encode())
        deadline = time.monotonic() + 30
        while _written(slave) < _written(master):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with PullConsumer(slave.listen) as consumer:
            assert sum(consumer.max_offset("Clustered", q) for q in range(8)) == 200
    finally:
        if slave_node is not None:
            slave_node.stop(strict=False)
        master_node.stop(strict=False)
        cluster.shutdown()

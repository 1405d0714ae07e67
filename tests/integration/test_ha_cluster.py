"""A slave on another node of a Ray cluster: a local multi-node cluster (Ray's cluster utilities,
two raylets on this machine), the slave joining it with --ray-address and placed by `rayNode` on
the second Ray node, following a master (RocketMQ's link, served by the test: the golden
store's CommitLog, as RocketMQ 4.9.8 wrote it)."""

from __future__ import annotations

import time

import psutil
import pytest
from golden import GOLDEN_SETTINGS, GOLDEN_STORE, manifest
from nodes import FakeRocketMQMaster, NodeProcess, free_port, node_settings

from node.client import PullConsumer
from shm.control_block import peek
from shm.mapped_file import file_name

pytestmark = pytest.mark.slow


def test_a_slave_runs_on_the_ray_node_it_names(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"hostA": 1},
                                                            "object_store_memory": 80 * 1024 * 1024})
    host_b = cluster.add_node(num_cpus=1, resources={"hostB": 1}, object_store_memory=80 * 1024 * 1024)
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

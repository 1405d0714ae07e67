"""Running real nodes in tests: in this process (sharing one Ray session per module) or as a
`mqnode start` subprocess with its own embedded Ray (for kill -9 of every process)."""

from __future__ import annotations

from pathlib import Path

from node.tools.local_node import ROOT, NodeProcess, free_port
from shm import settings as settings_module

__all__ = ["ROOT", "NodeProcess", "free_port", "node_settings", "in_process_node"]


def node_settings(store: Path, **overrides):
    port = free_port()
    values = {"storePathRootDir": str(store), "listen": f"tcp://127.0.0.1:{port}", "listenPort": port,
              "mappedFileSizeCommitLog": 1024 * 1024, "mappedFileSizeConsumeQueue": 6000,
              "maxHashSlotNum": 1000, "maxIndexNum": 4000, "runDir": str(store) + "-run"}
    values.update(overrides)
    return settings_module.load(None, values)


def in_process_node(directory: Path, **overrides):
    """A node in this process on a Ray session the caller's module shares (fixture body)."""
    import logging

    import ray

    from node.server.launcher import Node

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             logging_level=logging.ERROR, log_to_driver=False)
    running = Node(node_settings(directory / "store", **overrides), out=lambda *a, **k: None)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        ray.shutdown()

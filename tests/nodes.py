"""Running real nodes in tests: in this process (sharing one Ray session per module) or as a
`mqnode start` subprocess with its own embedded Ray (for kill -9 of every process)."""

from __future__ import annotations

import dataclasses
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from shm import settings as settings_module

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_settings(store: Path, **overrides):
    port = free_port()
    values = {"storePathRootDir": str(store), "listen": f"tcp://127.0.0.1:{port}", "listenPort": port,
              "mappedFileSizeCommitLog": 1024 * 1024, "mappedFileSizeConsumeQueue": 6000,
              "maxHashSlotNum": 1000, "maxIndexNum": 4000, "runDir": str(store) + "-run"}
    values.update(overrides)
    return settings_module.load(None, values)


class NodeProcess:
    """`python -m node.cli start` with its own embedded Ray; `kill_all` is kill -9 of the tree."""

    def __init__(self, settings, log: Path):
        self.settings = settings
        self.log = log
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return self.settings.listen

    def start(self, timeout: float = 90.0) -> NodeProcess:
        args = [sys.executable, "-m", "node.cli", "start"]
        defaults = settings_module.Settings()
        for f in dataclasses.fields(self.settings):  # every setting the test changed, as a flag
            value = getattr(self.settings, f.name)
            if value != getattr(defaults, f.name):
                args += [f"--{f.name}", str(value).lower() if isinstance(value, bool) else str(value)]
        seen = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"mqnode ready" in self.log.read_bytes()[seen:]:
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited {self.process.returncode}: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"node not ready: {self.log.read_text()[-3000:]}")

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.process.pid)
        return [root, *root.children(recursive=True)]

    def actor_process(self, label: str) -> psutil.Process:
        """The Ray worker hosting actor `label` (each actor writes <runDir>/<label>.pid)."""
        return psutil.Process(int((self.settings.run_dir / f"{label}.pid").read_text()))

    def kill_all(self) -> None:
        processes = self.tree()
        for p in processes:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=10)
        self.process.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        processes = self.tree()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        _, alive = psutil.wait_procs(processes, timeout=10)
        for p in alive:  # nothing may be left behind; kill stragglers so the next test starts clean
            p.kill()
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
        return code


def in_process_node(directory: Path, **overrides):
    """A node in this process on a Ray session the caller's module shares (fixture body)."""
    import logging

    import ray

    from node.launcher import Node

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
             logging_level=logging.ERROR, log_to_driver=False)
    running = Node(node_settings(directory / "store", **overrides), out=lambda *a, **k: None)
    running.start()
    try:
        yield running
    finally:
        running.stop()
        ray.shutdown()

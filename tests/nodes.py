"""Running real nodes in tests: in this process (sharing one Ray session per module) or as a
`mqnode start` subprocess with its own embedded Ray (for kill -9 of every process)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.tools.local_node import ROOT, NodeProcess, free_port
from shm import settings as settings_module

__all__ = ["HOST_DISK_BLIND", "LEAN", "LEAN_SPLIT", "ROOT", "SMALL_STORE", "toml_lines", "FakeRocketMQMaster", "NodeProcess", "free_port", "grpc_endpoint", "node_settings",
           "in_process_node", "small_disk", "nodejs", "nodejs_missing", "official", "ray_cluster", "running_node", "read_exactly", "NetHosts"]


# The host's disk is not the test's: over RocketMQ's default 85 % (a CI disk with 38 of 252 GB free)
# clean deletes a test node's 1 MiB segments as soon as they are flushed, whatever their age, and
# over 90 % refuses sends. A shared CI disk has been seen with 287 MB free (over 99 %): at 1.0 the
# ratios never trip (the used share is rounded up to a whole per cent, at most 1.0), and a disk
# really full is met by the node's own ENOSPC handling. A test of cleaning sets its own ratios.
HOST_DISK_BLIND = {"diskMaxUsedSpaceRatio": 95, "diskSpaceCleanForciblyRatio": 1.0, "diskSpaceWarningLevelRatio": 1.0}

# A test node's files are small: a segment gets all its blocks when it is made (shm.mapped_file),
# so a node on the defaults holds 1 GiB of disk from its start, and the suite's nodes once held
# 10 GB at its end (a CI disk then filled past even HOST_DISK_BLIND's 99 %).
SMALL_STORE = {"mappedFileSizeCommitLog": 1024 * 1024, "mappedFileSizeConsumeQueue": 6000, "maxHashSlotNum": 1000,
               "maxIndexNum": 4000}


def toml_lines(values: dict) -> str:
    """`values` as lines of a TOML table's body (a cluster's `[defaults]`)."""
    return "\n".join(f"{name} = {str(value).lower() if isinstance(value, bool) else repr(value)}"
                     for name, value in values.items())


# A node's start is CPU-bound on two cores (~14 CPU-s, ~0.8 of it each service process): a test
# node runs no gRPC proxy and one pull worker unless its test names them (tests of the proxy, of
# its listener and its metrics, and one conformance node with two pull workers do).
LEAN = {"grpcServerPort": 0}
LEAN_SPLIT = {"pullWorkers": 1}


def node_settings(store: Path, **overrides):
    port = free_port()
    values = {"storePathRootDir": str(store), "listen": f"tcp://127.0.0.1:{port}", "listenPort": port,
              "runDir": str(store) + "-run", **SMALL_STORE, **HOST_DISK_BLIND, **LEAN}
    values.update(overrides)
    if values.get("topology", settings_module.Settings().topology) == "split":
        values = LEAN_SPLIT | values
    return settings_module.load(None, values)


@contextlib.contextmanager
def small_disk(path: Path, size: str):
    """A small disk of its own at `path` (a tmpfs of `size`: a full-disk test's), unmounted after;
    the test is skipped where this process may not mount one (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def running_node(directory: Path, **overrides):
    """A module fixture's body (`yield from running_node(tmp_path_factory.mktemp(name), ...)`): a
    `mqnode start` subprocess with its store, run directory and log under `directory`, stopped
    once the module is done."""
    settings = node_settings(directory / "store", runDir=str(directory / "run"), **overrides)
    process = NodeProcess(settings, directory / "node.log").start()
    try:
        yield process
    finally:
        process.stop(strict=False)


def in_process_node(directory: Path, *, after_stop=None, **overrides):
    """A node in this process on a Ray session the caller's module shares (fixture body). With
    `after_stop`, once the module's tests are done the node is stopped cleanly and
    `after_stop(node)` checks what it left (a failure there fails the module's teardown)."""
    from node.server import ray_setup
    from node.server.launcher import Node

    ray_setup.workers_set_up()
    ray_setup.init(None, None, 80 * 1024 * 1024, num_cpus=2)  # a Ray of its own: never a stale cluster
    running = Node(node_settings(directory / "store", **overrides), out=lambda *a, **k: None)
    running.start()
    try:
        yield running
        if after_stop is not None:
            running.stop()
            after_stop(running)
    finally:
        running.stop()
        ray_setup.shutdown()


RAY_HOST_MEMORY = 80 * 1024 * 1024  # each Ray node's object store: the nodes pass nothing through it


def ray_cluster(*hosts: str, head_ip: str | None = None):
    """A local Ray cluster (Ray's cluster utilities) of a raylet for each of `hosts`, the first its
    head, each with one CPU and a custom resource of its name (a node's `rayNode` names it). The
    head runs none of the helpers no node uses: the dashboard, the log monitor and the autoscaler's
    monitor (~2 CPU-s to start, and their turns while idle; ray_setup.start_head leaves them out of
    a node's own Ray too). `head_ip`: the address the head serves at (other hosts': NetHosts). The
    caller shuts it down."""
    from ray.cluster_utils import Cluster

    head, *others = hosts
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {head: 1}, "object_store_memory": RAY_HOST_MEMORY,
        "include_dashboard": False, "include_log_monitor": False, "no_monitor": True,
        **({"node_ip_address": head_ip} if head_ip else {})})
    return cluster, [ray_host(cluster, name) for name in others]


def ray_host(cluster, name: str):
    """One more raylet in `cluster` (ray_cluster), its custom resource `name`."""
    return cluster.add_node(num_cpus=1, resources={name: 1}, object_store_memory=RAY_HOST_MEMORY)


class NetHosts:
    """Hosts of their own on this machine: the first is this process's network namespace, each
    other one a network namespace (`ip netns`) with an address of its own on a bridge between
    them, in 198.18.0.0/15 (the range RFC 2544 sets aside for such tests, routed nowhere). A node
    there serves, replicates and registers at addresses other hosts reach (its loopback is its
    own), and a host can be lost whole: every process in it killed (`lose`), or cut off from the
    others for a while (`cut`, `heal`). Processes still share the file system. Needs root and
    iproute2 (`available`); `down` takes it all away."""

    def __init__(self, *names: str):
        tag = os.getpid() % 100_000
        self.names, self.bridge = names, f"mqb{tag}"
        self.ip = {name: f"198.18.{tag % 250}.{i + 1}" for i, name in enumerate(names)}
        self.ns = {name: f"mqt{tag}-{i}" for i, name in enumerate(names) if i}
        self.veth = {name: f"{self.bridge}v{i}" for i, name in enumerate(self.ns, 1)}  # its link to the bridge
        try:
            self._up()
        except BaseException:
            self.down()
            raise

    @staticmethod
    def available() -> bool:
        if os.geteuid() != 0 or not shutil.which("ip"):
            return False
        return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0

    @staticmethod
    def _ip(*args: str, check: bool = True) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        assert done.returncode == 0 or not check, f"ip {' '.join(args)}: {done.stderr}"

    def _up(self) -> None:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", f"{self.ip[self.names[0]]}/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for name, ns in self.ns.items():
            veth = self.veth[name]
            self._ip("netns", "add", ns)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._ip("-n", ns, "addr", "add", f"{self.ip[name]}/24", "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")

    def pids(self, name: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", self.ns[name]], capture_output=True, text=True)
        return [int(pid) for pid in done.stdout.split()]

    def start_raylet(self, name: str, address: str) -> int:
        """`ray start` on host `name`, joining the Ray cluster at `address` with one CPU and the
        custom resource `name`; the raylet's pid."""
        ray = str(Path(sys.executable).parent / "ray")
        done = subprocess.run(["ip", "netns", "exec", self.ns[name], ray, "start", "--address", address,
                               "--node-ip-address", self.ip[name], "--num-cpus", "1", "--resources", json.dumps({name: 1}),
                               "--object-store-memory", str(RAY_HOST_MEMORY), "--disable-usage-stats"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return self.raylet(name)

    def raylet(self, name: str) -> int:
        import psutil

        for pid in self.pids(name):
            try:
                if psutil.Process(pid).name() == "raylet":
                    return pid
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no raylet runs on {name}")

    def lose(self, name: str) -> None:
        """The host is gone: every process in it killed at once, and waited for."""
        import psutil

        for _ in range(20):  # (a process may start another while the first ones die)
            processes = []
            for pid in self.pids(name):
                try:
                    process = psutil.Process(pid)
                    process.kill()
                    processes.append(process)
                except psutil.NoSuchProcess:
                    continue
            if not processes:
                return
            psutil.wait_procs(processes, timeout=10)
        raise AssertionError(f"processes on {name} outlived 20 rounds of kill -9")

    def cut(self, name: str) -> None:
        """A partition: host `name` reaches no other host, nor they it; its processes live on."""
        self._ip("link", "set", self.veth[name], "down")

    def heal(self, name: str) -> None:
        self._ip("link", "set", self.veth[name], "up")

    def down(self) -> None:
        for name, ns in self.ns.items():
            self.lose(name)
            self._ip("netns", "del", ns, check=False)  # (its end of each veth pair goes with it)
        self._ip("link", "del", self.bridge, check=False)


def read_exactly(sock, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        assert chunk, "the peer closed the link"
        out += chunk
    return bytes(out)


class FakeRocketMQMaster:
    """A RocketMQ 4.x master's HA side as spec §12 specifies it, serving `log` (CommitLog bytes
    from offset 0) to one slave on a thread: it reads the slave's first 8-byte report, sends
    from there (an empty slave: from the last segment) in 12-byte-headed transfers of at most
    32 KiB within a segment, then heartbeats while it reads the slave's reports."""

    def __init__(self, log: bytes, segment: int):
        import socket
        import threading

        self.log, self.segment = log, segment
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import struct

        header = struct.Struct(">qi")
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return  # closed before a slave came
        end = len(self.log)
        with connection:
            start = int.from_bytes(read_exactly(connection, 8), "big", signed=True)
            at = start or end - end % self.segment
            while not self.stop.is_set() and at < end:
                size = min(32768, end - at, self.segment - at % self.segment)
                connection.sendall(header.pack(at, size) + self.log[at: at + size])
                at += size
            connection.settimeout(0.5)
            while not self.stop.is_set():
                try:
                    if not connection.recv(64):
                        return
                except TimeoutError:
                    connection.sendall(header.pack(at, 0))
                except OSError:
                    return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(5)


# -- RocketMQ 5's official Python client, in a process of its own --------------------------------------

OFFICIAL_CLIENT = Path(__file__).parent / "integration" / "rocketmq5_client.py"


def grpc_endpoint(node) -> str:
    return f"127.0.0.1:{node.settings.grpc_port}"


def official(node, command: str, *args: str, timeout: float = 90, **credentials) -> list[dict]:
    """Run the official client (over TLS to a node with a certificate); its JSON lines."""
    extra = [f"--{k}={v}" for k, v in credentials.items()]
    env = dict(os.environ)
    if node.settings.grpcTlsCertFile:
        extra.append("--tls")
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = node.settings.grpcTlsCertFile
    done = subprocess.run([sys.executable, str(OFFICIAL_CLIENT), command, "--endpoint", grpc_endpoint(node), *extra, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


# -- RocketMQ 5's official Node.js client (tests/nodejs, installed by scripts/_nodejs.sh) ----------------

NODEJS_CLIENT = Path(__file__).parent / "nodejs" / "client.js"


def nodejs_missing() -> str:
    """Why the Node.js client cannot run here ("" when it can): no `node` on the machine is a
    skip; `node` without the client's packages is a set-up fault the tests report."""
    if shutil.which("node") is None:
        return "no Node.js on this machine (the official Node.js client's tests need `node`, 16.19 or newer)"
    if not (NODEJS_CLIENT.parent / "node_modules" / "rocketmq-client-nodejs").is_dir():
        return "tests/nodejs has no node_modules: run scripts/test (or `npm ci --prefix tests/nodejs`)"
    return ""


def nodejs(node, command: str, *args: str, timeout: float = 90, **credentials) -> list[dict]:
    """Run the official Node.js client (tests/nodejs/client.js, the commands of the Python one's); its JSON lines."""
    missing = nodejs_missing()
    assert not missing, missing
    extra = [f"--{k}={v}" for k, v in credentials.items()]
    env = dict(os.environ)
    if node.settings.grpcTlsCertFile:
        extra.append("--tls")
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = node.settings.grpcTlsCertFile  # (grpc-js reads it as grpcio does)
    done = subprocess.run(["node", str(NODEJS_CLIENT), command, "--endpoint", grpc_endpoint(node), *extra, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

"""A node as a child process: `python -m node.tools.cli start` with its own embedded Ray.

Used by the load tester, the benchmarks and the crash tests: it starts a node from a `Settings`
(every setting that differs from the default becomes a `--<name>` flag), waits for its `ready`
line, lists its process tree (for psutil figures and kill -9), and stops it.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from shm import settings as settings_module

ROOT = Path(__file__).resolve().parents[2]  # the repository: node/tools/local_node.py


# Below Linux's ephemeral range (32768-60999) and above Ray's worker ports (10002-19999): a port
# the kernel hands out (bind to 0) is free now, but an outgoing connection of the node's own Ray
# may take it before the front binds it (seen: a front restarted a dozen times on EADDRINUSE).
LISTEN_PORTS = range(20000, 32768)


_PORTS = random.Random()  # (its own: a test that seeds the module's generator must not make it repeat)
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens at now, never one this process had from here before: the ports
    of one configuration are taken before anything binds them (seen: a cluster's two name
    services given one port, the second died on EADDRINUSE)."""
    for _ in range(1000):
        port = _PORTS.choice(LISTEN_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def start_flags(settings) -> list[str]:
    """The `--<name> value` flags that reproduce `settings` over the defaults."""
    args = []
    defaults = settings_module.Settings()
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if value != getattr(defaults, f.name):
            args += [f"--{f.name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def local_settings(directory: Path, **overrides):
    """Settings for a node of its own under `directory` (store/, run/), on a free port. The
    IndexFile is sized for a run, not RocketMQ's 5M slots x 20M entries (a 420 MB file each)."""
    port = free_port()
    values = {"storePathRootDir": str(directory / "store"), "listen": f"tcp://127.0.0.1:{port}", "listenPort": port,
              "runDir": str(directory / "run"), "maxHashSlotNum": 500_000, "maxIndexNum": 2_000_000}
    values.update(overrides)
    return settings_module.load(None, values)


# runs argv[2:] with a soft limit of argv[1] open files (as a host's default would start it)
_WITH_OPEN_FILES = ("import os, resource, sys; n = int(sys.argv.pop(1)); hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
                    "resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard)); "
                    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


class NodeProcess:
    """`python -m node.tools.cli start` with its own embedded Ray; `kill_all` is kill -9 of the tree."""

    def __init__(self, settings, log: Path, *, ray_address: str | None = None, open_files: int | None = None,
                 netns: str | None = None):
        self.settings = settings
        self.log = log
        self.ray_address = ray_address  # join this Ray cluster instead of embedding a Ray of its own
        self.open_files = open_files  # the soft limit of open files it starts with, else this process's
        self.netns = netns  # the network namespace it runs in (`ip netns exec`: a host of a test's own)
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return self.settings.listen

    def start(self, timeout: float = 90.0) -> NodeProcess:
        args = [sys.executable, "-m", "node.tools.cli", "start", *start_flags(self.settings)]
        if self.ray_address:
            args += ["--ray-address", self.ray_address]
        if self.open_files is not None:
            args = [sys.executable, "-c", _WITH_OPEN_FILES, str(self.open_files), *args[1:]]
        if self.netns:
            args = ["ip", "netns", "exec", self.netns, *args]  # (it execs the command: the pid is the node's)
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
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def actor_process(self, label: str) -> psutil.Process:
        """The Ray worker hosting actor `label` (each actor writes <runDir>/<label>.pid)."""
        return psutil.Process(int((self.settings.run_dir / f"{label}.pid").read_text()))

    def actor_labels(self) -> list[str]:
        return sorted(p.stem for p in self.settings.run_dir.glob("*.pid"))

    def kill_all(self) -> None:
        processes = self.tree()
        for p in processes:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(processes, timeout=10)
        self.process.wait(10)

    def stop(self, timeout: float = 30.0, *, strict: bool = True) -> int:
        """SIGTERM and wait; with `strict`, assert that no process of the node is left behind."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        processes = self.tree()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            code = self.process.returncode
        _, alive = psutil.wait_procs(processes, timeout=10)
        for p in alive:  # kill stragglers so whatever runs next starts clean
            p.kill()
        if strict:
            assert not alive, f"processes left behind: {[p.pid for p in alive]}"
        return code


def _is_launcher(pid: int) -> bool:
    """Whether `pid` is a node's launcher still (Ray titles its actor processes `ray::<class>`)."""
    try:
        return "NodeHost" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


class ClusterProcess:
    """`python -m node.tools.cli cluster up --conf ...` as a child process: its `ready` lines (part
    -> line), the processes of each node (by its store), and its stop (SIGTERM: `cluster down`)."""

    def __init__(self, conf: Path, log: Path, *, ray_address: str | None = None):
        self.conf, self.log, self.ray_address = conf, log, ray_address
        self.process: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.ready: dict[str, str] = {}

    def start(self, timeout: float = 300.0) -> ClusterProcess:
        import threading

        args = [sys.executable, "-m", "node.tools.cli", "cluster", "up", "--conf", str(self.conf)]
        if self.ray_address:
            args += ["--ray-address", self.ray_address]
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
        threading.Thread(target=lambda: self.lines.extend(line.decode() for line in self.process.stdout),
                         daemon=True).start()
        deadline = time.monotonic() + timeout
        while not any(line.startswith("mqnode cluster ready name=") for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cluster up not ready: {self.lines} (see {self.log})")
            time.sleep(0.2)
        for line in self.lines:
            if line.startswith("mqnode cluster ready part="):
                self.ready[line.split()[3].removeprefix("part=")] = line
        return self

    def node_pids(self, store: Path) -> list[int]:
        """The node on `store`: its launcher (the Ray actor that runs it, as `ready` said, while that
        process lives: Ray restarts a part's launcher in a process no line names) and its services
        (their pid files)."""
        from node.server import cluster

        part = next(p for p in cluster.load(self.conf).nodes if Path(p.settings.root) == Path(store))
        line = next(line for line in self.ready.values() if f"store={store} " in line)
        launcher = int(line.split(" pid=")[1].split()[0])
        services = [int(p.read_text()) for p in part.settings.run_dir.glob("*.pid")]
        return [launcher, *services] if _is_launcher(launcher) else services

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM (as `cluster down`) and wait: its exit status (None: never started)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return None if self.process is None else self.process.returncode

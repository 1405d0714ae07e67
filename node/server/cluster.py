"""A cluster of nodes on Ray: `mqnode cluster up|down|status --conf cluster.toml`.

The toml declares the parts (docs/operations.md "A cluster"):

    [cluster]                  name (brokerClusterName), runDir (where `up` keeps its pid file)
    [defaults]                 settings every node gets (any key of conf/broker.toml)
    [[namesrv]]                listen (host:port), dir (its table's file), rayNode (placement)
    [[node]]                   brokerName, store, listen, rayNode, brokerRole, brokerId,
                               haMasterAddress, and any other setting of that node

`up` starts (or with --ray-address joins) Ray, then each name service and each node as a Ray
actor placed on its `rayNode` (a node id or a custom resource only that Ray node has), prints one
`mqnode cluster ready part=...` line per part and serves until SIGINT/SIGTERM/SIGHUP (`down` sends it
one and waits), stopping the nodes first, then the name services. Every node gets
`namesrvAddr` (all the name services) and `brokerClusterName`.

A part is restarted where it was when it dies (Ray's restarts, without limit; placement is
hard, so it comes back on the host of its store and file). A node's launcher is the actor
(`NodeHost`, running node.server.launcher.Node): its services are its children, so a dead
launcher takes them along and its restart is the node's restart, recovery first. A node whose
service is gone for good exits the same way. A node whose Ray host is lost stays down until the
host is back; its group's slave can be promoted meanwhile (`mqnode admin role`). A node that
restarts asks the name services first (`role_now`): an old master whose slave was promoted comes
back as the new master's slave (fenced), a promoted slave as a master. An old master that the
name services tell of the later master (it was cut off while its slave was promoted) restarts
so at once (`old_master`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import tomllib
from pathlib import Path

from actors.base import write_pid_file
from node.server import namesrv as namesrv_module
from node.server import ray_setup
from node.server.signals import StopSignals
from shm import settings as settings_module
from shm.mapped_file import StoreError
from shm.settings import SettingsError

READY_TIMEOUT_S = 180.0
NODE_KEYS = {"store"}  # the toml's own name for storePathRootDir


@dataclasses.dataclass(frozen=True)
class NamesrvPart:
    listen: str  # a ZeroMQ endpoint
    directory: str
    ray_node: str = ""

    @property
    def label(self) -> str:
        return f"namesrv@{self.listen.removeprefix('tcp://')}"


@dataclasses.dataclass(frozen=True)
class NodePart:
    values: dict  # the node's settings (defaults, then its own table), namesrvAddr and cluster name added

    @property
    def settings(self):
        return settings_module.load(None, self.values)

    @property
    def label(self) -> str:
        s = self.settings
        return f"{s.brokerName}/{s.brokerId}"


@dataclasses.dataclass(frozen=True)
class ClusterConf:
    name: str
    run_dir: Path
    namesrvs: list[NamesrvPart]
    nodes: list[NodePart]

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.listen.removeprefix("tcp://") for n in self.namesrvs)


def load(path: str | Path) -> ClusterConf:
    """The cluster's parts from its toml. SettingsError names what is wrong."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SettingsError(f"cluster conf {path}: {e}") from None
    cluster = data.get("cluster") or {}
    name = str(cluster.get("name", "DefaultCluster"))
    # (a relative path is the directory `cluster up` runs in's: its parts do not run there)
    run_dir = Path(cluster.get("runDir") or Path.home() / "mqnode" / f"cluster-{name}").expanduser().absolute()
    namesrvs = [NamesrvPart(namesrv_module.endpoint_of(str(n.get("listen", f"127.0.0.1:{namesrv_module.DEFAULT_PORT}"))),
                            str(Path(n.get("dir") or run_dir / f"namesrv-{i}").expanduser().absolute()),
                            str(n.get("rayNode", "")))
                for i, n in enumerate(data.get("namesrv") or [])]
    if not namesrvs:
        raise SettingsError(f"cluster conf {path}: name at least one [[namesrv]]")
    defaults = {k: v for k, v in (data.get("defaults") or {}).items()}
    nodes = []
    for i, table in enumerate(data.get("node") or []):
        values = {**defaults, **table}
        if "store" in values:
            values["storePathRootDir"] = values.pop("store")
        values |= {k: settings_module.absolute_path(v) for k, v in values.items()
                   if k in settings_module.PATH_SETTINGS and isinstance(v, str) and v}
        if "storePathRootDir" not in values:
            raise SettingsError(f"cluster conf {path}: [[node]] {i + 1} needs its store")
        values["namesrvAddr"] = ";".join(n.listen.removeprefix("tcp://") for n in namesrvs)
        values["brokerClusterName"] = name
        part = NodePart(values)
        part.settings  # (SettingsError for a bad one, now)
        nodes.append(part)
    if not nodes:
        raise SettingsError(f"cluster conf {path}: name at least one [[node]]")
    labels = [n.label for n in nodes]
    if len(set(labels)) != len(labels):
        raise SettingsError(f"cluster conf {path}: two nodes with the same brokerName and brokerId")
    _refuse_shared_endpoints(path, namesrvs, nodes)
    return ClusterConf(name, run_dir, namesrvs, nodes)


def _refuse_shared_endpoints(path: Path, namesrvs: list[NamesrvPart], nodes: list[NodePart]) -> None:
    """Two parts bound at one address: the second would die on EADDRINUSE as it starts (a
    wildcard host may differ by machine, so only named hosts are compared)."""
    taken: dict[str, str] = {}
    named = [(f"[[namesrv]] {i + 1}", n.listen) for i, n in enumerate(namesrvs)]
    named += [(f"[[node]] {n.label}", n.settings.listen) for n in nodes]
    for part, endpoint in named:
        host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
        if host in ("*", "0.0.0.0", "::"):
            continue
        if endpoint in taken:
            raise SettingsError(f"cluster conf {path}: {part} listens at {endpoint}, as {taken[endpoint]} does")
        taken[endpoint] = part


class NodeHost:
    """A node's launcher in a Ray actor (see the module's docstring): starts it at construction
    (recovery, then its services as this actor's children) and exits the process when it fails."""

    def __init__(self, values: dict, ray_address: str):
        import ray

        from node.server.launcher import Node, StartFailed

        ray_setup.normal_priority()
        ray_setup.more_open_files()
        settings = settings_module.load(None, values)
        changed = role_now(settings, _cluster_info(settings))
        if changed:  # the group's master moved while this node was down (or it was promoted): follow the table
            logging.getLogger("mqnode").warning("node %s/%s starts as %s (the name service's table): %s",
                                                settings.brokerName, settings.brokerId, changed["brokerRole"], changed)
            settings = dataclasses.replace(settings, **changed)
        self.lines: list[str] = []
        self.start_error = ""
        self.node = Node(settings, ray_address=ray_address or "auto", out=self._out)
        try:
            self.node.start()
        except (SettingsError, StoreError, StartFailed, ray_setup.ForeignListener) as e:
            if ray.get_runtime_context().was_current_actor_reconstructed:
                raise  # (a restart that cannot start: the actor dies, as any that cannot)
            self.start_error = str(e)  # `up` says it as this node's reason (Cluster._start_node), not
            return  # as Ray's traceback of an actor whose creation raised
        self.watch = threading.Thread(target=self._watch, name="mqnode-node-host", daemon=True)
        self.watch.start()

    def _out(self, *parts, **_) -> None:
        self.lines.append(" ".join(str(p) for p in parts))

    def _watch(self) -> None:
        while not self.node.failed.wait(1.0):
            superseded = old_master(self.node)
            if superseded:
                self.node.fail(superseded)
        logging.getLogger("mqnode").error("node %s failed: %s; restarting it", self.node.settings.brokerName,
                                          self.node.failure)
        try:
            self.node.stop()
        finally:
            os._exit(1)  # Ray restarts this actor where it was: the node's restart, recovery first

    def ready_line(self) -> str:
        return self.lines[-1] if self.lines else ""

    def failed_start(self) -> str:
        """Why the node's first start failed (its settings, its store, its disk), or ""."""
        return self.start_error

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> bool:
        self.node.stop()
        return True


def old_master(node) -> str | None:
    """Why a node of a cluster that the name services answered `supersededBy` must restart: its
    group has a master of a later epoch (its slave, promoted while this node was cut off from
    it), and the restart (`role_now`) brings it back as that master's slave, fenced, where
    otherwise it would stay up taking no sends and copying nothing, its group without a slave.
    (A lone node waits as it is: restarted, it would be a master again. So does an old master
    that only a would-be slave's hello told: the name services may still name it the master.)"""
    control = node.control
    try:
        epoch = control.get("superseded_in_routes") if control is not None else 0
    except ValueError:  # (closed under this look: the node is stopping)
        return None
    if not epoch:
        return None
    return (f"the name services hold {node.settings.brokerName}'s master at epoch {epoch}, past this node's: "
            f"it restarts as that master's slave")


def role_now(settings, info: dict | None) -> dict:
    """The settings a node of a cluster restarts with, when the name services' table (`info`,
    GET_BROKER_CLUSTER_INFO's answer; None when none answered) says its group changed while it
    was down: {} to start as configured.

    A master whose group has another master now (its slave was promoted by `admin role`) comes
    back as that master's slave: its start fences what it wrote past their common history
    (node.server.fencing), as docs/operations.md "Replication" asks of an old master. A slave
    that the table names as its group's master (it was promoted, then restarted) comes back as
    a master, with the role it registered. The group's master is its live one, else the one the
    name services last knew (`lastMasterTable`: the group's nodes all stopped, each unregistering,
    as `cluster down` stops them): were roles to fall back to the toml's then, the old master,
    perhaps behind, would take sends again and the promoted one's fencing cut what only it had."""
    from actors.registrar import client_address

    if not info:
        return {}
    group = (info.get("brokerAddrTable") or {}).get(settings.brokerName) or {}
    addresses, live, own = group.get("brokerAddrs") or {}, info.get("brokerLiveTable") or {}, client_address(settings)
    master = addresses.get("0")
    if master and master in live:
        ha, role = live[master].get("haServerAddr", ""), live[master].get("role")
    else:
        last = (info.get("lastMasterTable") or {}).get(settings.brokerName) or {}
        master, ha, role = last.get("address"), last.get("haServerAddr", ""), last.get("role")
    if not master:
        return {}
    if not settings.is_slave and master != own:
        ids = [int(k) for k, address in addresses.items() if address == own and k != "0"]
        broker_id = ids[0] if ids else max([int(k) for k in addresses] + [settings.brokerId, 0]) + 1
        return {"brokerRole": "SLAVE", "brokerId": broker_id, "haMasterAddress": ha}
    if settings.is_slave and master == own:
        return {"brokerRole": role if role in ("ASYNC_MASTER", "SYNC_MASTER") else "ASYNC_MASTER", "brokerId": 0}
    return {}


def _cluster_info(settings) -> dict | None:
    """GET_BROKER_CLUSTER_INFO from the first of the node's name services that answers."""
    from node import protocol
    from node.security import Credentials
    from node.server.asker import NodeAsker

    for endpoint in protocol.namesrv_endpoints(settings.namesrvAddr):
        asker = NodeAsker(endpoint, Credentials(), timeout_ms=3000)
        try:
            reply = asker.ask({"code": protocol.GET_BROKER_CLUSTER_INFO})
            if reply.get("status") == "OK":
                return reply
        except TimeoutError:
            continue
        finally:
            asker.close()
    return None


def start_order(nodes: list[NodePart], info: dict | None) -> list[NodePart]:
    """The nodes as `up` starts them: the masters first, then the slaves, each by the role it
    will start with (`role_now`: the name services' table may have moved a group's master
    since the toml was written). A slave fences its log against its master's at its start
    (node.server.fencing), which needs the master up: an old master that comes back as the
    promoted one's slave, started first because the toml says master, skipped its fencing and
    then, with a tail to cut, stayed diverged until restarted by hand."""
    def slave(part: NodePart) -> bool:
        settings = part.settings
        return role_now(settings, info).get("brokerRole", settings.brokerRole) == "SLAVE"
    return sorted(nodes, key=slave)


class PartFailed(RuntimeError):
    """A part of the cluster did not start, for a reason of its own (`mqnode cluster failed: ...`)."""


class Cluster:
    """`up`'s parts under Ray: started in order (name services, then masters, then slaves, by
    the role each starts with), stopped in reverse."""

    def __init__(self, conf: ClusterConf, ray_address: str | None, out=print):
        self.conf, self.ray_address, self.out = conf, ray_address, out
        self.namesrvs: dict[str, object] = {}
        self.nodes: dict[str, object] = {}
        self.started_ray = False

    def up(self) -> None:
        ray_setup.prepare_embedded(self.ray_address)
        import ray

        self.conf.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.started_ray = ray_setup.init(self.ray_address, ray_setup.ray_dir_in(self.conf.run_dir),
                                          200 * 1024 * 1024, home=self.conf.run_dir)
        address = self.ray_address or ray.get_runtime_context().gcs_address
        for part in self.conf.namesrvs:
            handle = namesrv_module.launch(part.listen, part.directory, placement=ray_setup.place_on(part.ray_node))
            self.namesrvs[part.label] = handle
            self.out(f"mqnode cluster ready part={part.label} endpoint={part.listen} dir={part.directory}", flush=True)
        info = _cluster_info(self.conf.nodes[0].settings) if self.conf.nodes else None
        for part in start_order(self.conf.nodes, info):
            self._start_node(part, address)

    def _start_node(self, part: NodePart, address: str) -> None:
        import ray

        placement = ray_setup.place_on(part.settings.rayNode)
        handle = ray.remote(NodeHost).options(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=4,
                                              **placement).remote(part.values, address)
        failed = ray.get(handle.failed_start.remote(), timeout=READY_TIMEOUT_S)
        if failed:
            ray.kill(handle, no_restart=True)
            raise PartFailed(f"{part.label} did not start: {failed}")
        line = ray.get(handle.ready_line.remote(), timeout=READY_TIMEOUT_S)
        self.nodes[part.label] = handle
        self.out(f"mqnode cluster ready part={part.label} {line.removeprefix('mqnode ready ')}", flush=True)

    def down(self) -> None:
        import ray

        for label in reversed(list(self.nodes)):
            try:
                ray.get(self.nodes[label].stop.remote(), timeout=60)
            except Exception:  # gone or stuck: killed below
                pass
            ray.kill(self.nodes[label], no_restart=True)
        self.nodes.clear()
        for handle in self.namesrvs.values():
            namesrv_module.stop(handle)
        self.namesrvs.clear()
        if self.started_ray:
            ray_setup.shutdown()
            self.started_ray = False


def pid_file(conf: ClusterConf) -> Path:
    return conf.run_dir / "cluster.pid"


def run_up(conf: ClusterConf, ray_address: str | None, out=print) -> int:
    """`cluster up`: start every part, then serve until SIGINT/SIGTERM/SIGHUP (`cluster down`)."""
    if pid_file(conf).exists() and _alive(int(pid_file(conf).read_text() or 0)):
        print(f"mqnode cluster up: cluster {conf.name} runs already (pid file {pid_file(conf)})", file=sys.stderr)
        return 1
    cluster = Cluster(conf, ray_address, out)
    stops = StopSignals()
    failure = None
    try:
        try:
            cluster.up()
        except PartFailed as e:
            failure = str(e)
        else:
            stops.install()  # (again: joining a Ray cluster installed Ray's own handler over it)
            write_pid_file(pid_file(conf))
            out(f"mqnode cluster ready name={conf.name} parts={len(conf.namesrvs) + len(conf.nodes)} pid={os.getpid()}",
                flush=True)
        while not failure and not stops.wait(0.5):
            failure = cluster.started_ray and ray_setup.head_lost()  # (its parts' restarts need it)
        if failure:
            print(f"mqnode cluster failed: {failure}", file=sys.stderr, flush=True)
    finally:
        out("mqnode cluster stopping", flush=True)
        cluster.down()
        pid_file(conf).unlink(missing_ok=True)
        out("mqnode cluster stopped", flush=True)
    return 1 if failure else 0


def run_down(conf: ClusterConf, timeout: float = 120.0, out=print) -> int:
    """`cluster down`: SIGTERM to the `up` process, then wait for it to finish stopping."""
    try:
        pid = int(pid_file(conf).read_text())
    except (OSError, ValueError):
        print(f"mqnode cluster down: cluster {conf.name} is not running (no {pid_file(conf)})", file=sys.stderr)
        return 1
    if not _alive(pid):
        pid_file(conf).unlink(missing_ok=True)
        print(f"mqnode cluster down: cluster {conf.name} is not running", file=sys.stderr)
        return 1
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            print(f"mqnode cluster down: pid {pid} still runs after {timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    out(f"mqnode cluster down: cluster {conf.name} stopped", flush=True)
    return 0


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

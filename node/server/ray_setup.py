"""How a node uses Ray: its processes' priority, the embedded Ray's token, and where a node that
joins a Ray cluster places its processes (node.server.launcher starts them)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import psutil

from shm.cpus import available_cpus
from shm.settings import SettingsError


def normal_priority() -> None:
    """Ray starts workers at nice 15 (for batch jobs); the node's actors serve requests and must
    not lose the CPU to every other process. Lowering niceness needs privilege: best effort (an
    embedded Ray is started with RAY_worker_niceness=0 anyway)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass


OPEN_FILES = 65_536  # the soft limit a serving process asks for, where the hard limit allows


def more_open_files() -> None:
    """Raise this process's soft limit of open files to its hard limit (at most OPEN_FILES), as
    the JVM that RocketMQ runs in does for itself (MaxFDLimit). Every client connection is a file
    in the front's process (ZeroMQ's I/O thread), in the name service's, every gRPC one in the
    proxy's: at the common default soft limit of 1,024, a front holding ~1,000 idle clients
    accepted no more (the next client's sends timed out), the host's hard limit far above it.
    Best effort: a host whose hard limit is low keeps it (docs/operations.md)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass


LIMIT_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)  # out of descriptors (this process's, the host's), of mappings


def host_limits() -> str:
    """What a start that ran out of descriptors or mappings is told: every ConsumeQueue file the
    store holds is a mapping (and, before Python 3.13, a descriptor) in recovery's process."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        maps = Path("/proc/sys/vm/max_map_count").read_text().strip()  # (read only: raising it is the operator's)
    except OSError:
        maps = "unknown"
    return (f"each ConsumeQueue file of the store is a memory mapping and a descriptor here; this process may "
            f"open {soft} files and the host allows {maps} mappings (vm.max_map_count): raise them "
            f"(docs/operations.md \"Many topics and queues\")")


# glibc's mallopt parameters, and the values a node's processes run with
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 8 << 20  # allocations below come from the heap, whose pages stay mapped
TRIM_THRESHOLD = 64 << 20  # free memory a heap keeps at its top before it gives it back


def steady_heap() -> bool:
    """Keep the heap's pages for the next buffer, in this process only. A pop's answer of 256
    messages, or a pull's or a batch's, is a ~280 KiB bytes object made, sent and freed at every
    turn; glibc served each from a fresh mmap (or gave the heap's top back and grew it again), so
    every one of its pages was a page fault to zero and fill: ~0.7 faults a message in the pop
    service and the front each, a fifth of their CPU at 50k msgs/s (docs/operations.md). A heap
    that keeps up to TRIM_THRESHOLD free costs that much memory at most, a process. False where
    the C library has no mallopt (not glibc): nothing changes there."""
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def embedded_ray_token() -> None:
    """Ray runs whatever code a peer sends it, and its gRPC servers listen on every interface:
    the embedded Ray requires a token (Ray's token authentication), a fresh random one per start
    unless the environment names one, known only to this process and the ones Ray starts."""
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    os.environ["RAY_AUTH_MODE"] = "token"


def prepare_embedded(ray_address: str | None) -> bool:
    """Before Ray is imported: whether this process starts a Ray of its own (no `ray_address`,
    and no Ray session of a caller's, a test's say, in this process), and if so its settings."""
    embedded = not ray_address and "ray" not in sys.modules
    if embedded:  # Ray reads its authentication settings at import
        os.environ.setdefault("RAY_worker_niceness", "0")  # read by the raylet it starts
        more_open_files()  # (for Ray's own processes, which inherit it, and the workers they start)
        no_memory_killer()
        os.environ.pop("RAY_ADDRESS", None)  # a cluster is joined only when --ray-address names it
        embedded_ray_token()
        embedded_ray_on_loopback()
        workers_set_up()
    return embedded


def no_memory_killer() -> None:
    """Before the embedded Ray starts: its raylet kills none of the node's processes for the
    host's memory. Ray's memory monitor, once the host's memory is 95 % used, kills Ray workers,
    whoever uses the memory: a process of the host's other software holding 22 GiB of 24 made
    it kill every service of a node again and again (74 restarts in 20 s, the node deaf all the
    while) and leave the process that held the memory alone. A broker's services are not batch
    tasks to retry: memory running out is the kernel's OOM killer's to settle, by each process's
    own size. Read by the raylet from its environment; an operator who wants Ray's monitor sets
    RAY_memory_monitor_refresh_ms (docs/operations.md)."""
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")


def workers_set_up() -> None:
    """Before a Ray is started from this process: its workers run node.server.worker_setup.
    Named as Ray's workers read their `worker_process_setup_hook` from their environment (the
    raylet's, which is this process's): so it runs in every worker that Ray starts, the ones it
    starts before the node's job among them. The same hook in the job's runtime_env made Ray
    start every worker anew for that environment and leave those idle (a node start ~25 % dearer)."""
    os.environ["__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"] = "node.server.worker_setup.setup"


def init(ray_address: str | None, temp_dir: Path | None, object_store_memory: int,
         num_cpus: int | None = None, *, home: Path | None = None) -> bool:
    """Join the Ray cluster at `ray_address`, or start an embedded Ray in `temp_dir` (its head:
    `start_head`), unless this process is attached to one already: True when it started one (its
    owner stops it with `shutdown`). `home`: the private directory this process moves to first
    (its paths are absolute by then: shm.settings.absolute_paths)."""
    import ray

    if ray.is_initialized():
        return False
    if home is not None:  # Ray puts its driver's working directory first on every worker's sys.path:
        os.chdir(home)  # a user's queue.py or json.py there would be imported by each service for the stdlib's
    from node.server.worker_setup import without_arrow_serializers

    if ray_address:
        ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False)
        local = this_hosts_ray_node()
        if local is not None:  # (Ray attached this process to another host's raylet: see there)
            ray.shutdown()
            ray.init(address=ray_address, _node_ip_address=local, logging_level=logging.ERROR, log_to_driver=False)
    else:
        num_cpus = num_cpus or available_cpus()
        head = start_head(temp_dir, object_store_memory, num_cpus)
        if head is not None:
            ray.init(address=head.address, _node_ip_address=head.node_ip_address, logging_level=logging.ERROR,
                     log_to_driver=False)
        else:  # (a Ray whose private API moved: its own start, helpers and all)
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                     object_store_memory=object_store_memory, _temp_dir=temp_dir and str(temp_dir),
                     logging_level=logging.ERROR, log_to_driver=False, _node_ip_address=node_ip_address())
    without_arrow_serializers()  # (this process's context too, as its workers': node.server.worker_setup)
    if not ray_address:
        global _head_dir
        _head_dir = temp_dir
    return not ray_address


def this_hosts_ray_node() -> str | None:
    """None when the Ray node this process is attached to runs on this host (its address is one of
    this host's); else the address of the live Ray node that does, to attach to instead. Ray picks
    a driver's node by the address it guesses for the host (the interface that routes to the
    internet, else the host name's): on a host with no such route, or in a network namespace
    sharing the file system with another host's raylet, that was another host's node, and every
    process of a node joining the cluster ran there (where its `listen` could not be bound).
    SettingsError when no Ray node runs on this host."""
    import ray

    addresses = {a.address.split("%")[0] for nic in psutil.net_if_addrs().values() for a in nic}
    alive = [node for node in ray.nodes() if node.get("Alive")]
    attached = ray.get_runtime_context().get_node_id()
    if any(n["NodeID"] == attached and n.get("NodeManagerAddress") in addresses for n in alive):
        return None
    here = sorted({n["NodeManagerAddress"] for n in alive if n.get("NodeManagerAddress") in addresses})
    if not here:
        raise SettingsError(f"no live Ray node runs on this host ({', '.join(sorted(addresses))}): start one "
                            "here (`ray start --address <head>`) before joining the cluster")
    return here[0]


LOOPBACK = "127.0.0.1"
RAY_PROGRAMS = str(Path(__file__).with_name("ray_worker.py"))  # runs Ray's worker and agents, with less to import
_head = None  # the embedded Ray's head this process started (start_head), stopped by shutdown()
_head_dir: Path | None = None  # the session files of the Ray this process started: removed by shutdown()


def start_head(temp_dir: Path | None, object_store_memory: int, num_cpus: int):
    """An embedded Ray of one node: its GCS and raylet (with the agents the raylet starts),
    without the three helpers `ray.init(address="local")` adds that a node never uses: the log
    monitor (it sends workers' output to drivers, and the node takes none: `log_to_driver=False`;
    the services' logs reach the launcher by node.server.logs), the autoscaler's monitor (one node,
    nothing to scale) and the dashboard's API server (what the node asks of Ray, the GCS answers:
    node.server.supervision). Together ~2 CPU-s of each start and its idle time: 8 % of the test
    suite's CPU, which starts ~90 of them. Made as Ray's own `ray start --head --no-monitor` and
    `ray.cluster_utils` make a head (`ray._private.node.Node`); `ray.init` then attaches to it.
    None where that private API is not the one this was made for (Ray 2.60): `init` then starts
    Ray by `ray.init`, helpers and all (test_listeners finds them)."""
    import atexit
    import inspect

    global _head
    assert _head is None, "one embedded Ray a process"
    try:
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        params = RayParams(node_ip_address=node_ip_address(), num_cpus=num_cpus, object_store_memory=object_store_memory,
                           temp_dir=temp_dir and str(temp_dir), include_dashboard=False,
                           include_log_monitor=False, no_monitor=True, worker_path=RAY_PROGRAMS)
        # shutdown_at_exit=False: Ray's own would take SIGTERM from the launcher (node.server.signals);
        # the reaper kills the head's processes when this process dies without a word
        options = {"head": True, "shutdown_at_exit": False, "spawn_reaper": True, "ray_init_cluster": True}
        inspect.signature(Node).bind(params, **options)
    except (ImportError, TypeError) as error:
        logging.getLogger("mqnode").warning("the embedded Ray starts with ray.init: %s", error)
        return None

    class Head(Node):
        def start_api_server(self, *args, **kwargs) -> None:
            self._webui_url = None

        def start_raylet(self, *args, **kwargs) -> None:
            with _agents_run_by(RAY_PROGRAMS):
                super().start_raylet(*args, **kwargs)

    _head = Head(params, **options)
    atexit.unregister(shutdown)  # (once, however many heads this process has started and stopped)
    atexit.register(shutdown)  # (after ray.init's own: atexit runs the later one first)
    return _head


@contextlib.contextmanager
def _agents_run_by(runner: str):
    """While the raylet's command is made: the two agents it starts (and needs: it exits without
    either), the dashboard's and the runtime environments', are Ray's programs run by `runner`,
    as its workers are, so that what they never use is not imported (node.server.ray_worker):
    ~0.4 of their ~1.7 CPU-s at each start. Left as Ray makes them where Ray's private helper is
    not there, or makes another command than plain Python's (memray's, when asked)."""
    from ray._private import ray_constants, services

    build = getattr(services, "_build_python_executable_command_memory_profileable", None)
    agents = {getattr(ray_constants, "PROCESS_TYPE_DASHBOARD_AGENT", None),
              getattr(ray_constants, "PROCESS_TYPE_RUNTIME_ENV_AGENT", None)} - {None}
    if build is None:
        yield
        return

    def command(component, *args, **kwargs) -> list[str]:
        made = build(component, *args, **kwargs)
        plain = made and made[0] == sys.executable and set(made[1:]) <= {"-u"}
        return [*made, runner] if component in agents and plain else made

    services._build_python_executable_command_memory_profileable = command
    try:
        yield
    finally:
        services._build_python_executable_command_memory_profileable = build


def head_lost() -> str | None:
    """Which of the embedded Ray's own processes this process started (its GCS, its raylet) has
    exited, or None. Without its GCS nothing can restart a service, and Ray itself ends this
    process only a minute later (`gcs_rpc_server_reconnect_timeout_s`); without its raylet the
    services die."""
    head = _head
    if head is None:
        from ray._private import worker

        head = getattr(worker, "_global_node", None)  # (started by ray.init: the fallback)
        if head is None or not head.head:
            return None
    for kind, process in head.dead_processes():
        if kind in ("gcs_server", "raylet"):
            signalled = process.returncode in (-signal.SIGTERM, -signal.SIGKILL)
            return (f"Ray's {kind} (pid {process.pid}) exited with status {process.returncode}"
                    + (STOPPED_BY_RAY_STOP if signalled else ""))
    return None


# `ray stop` kills every Ray process of its user on the host by name (the raylet, the GCS, each
# `ray::` worker), an embedded Ray's too: a user's own Ray stopped the node (docs/operations.md)
STOPPED_BY_RAY_STOP = (" (killed: by the OOM killer, or by 'ray stop' on this host, which stops every Ray of its "
                       "user, a node's embedded one too)")


def node_ip_address() -> str | None:
    """127.0.0.1 once embedded_ray_on_loopback() was in force at Ray's import (a node's launcher);
    else Ray's choice, as for ray.init (a test's in-process node in a process that imported Ray)."""
    from ray._private import ray_constants

    return None if getattr(ray_constants, "ENABLE_RAY_CLUSTER", True) else LOOPBACK


def shutdown() -> None:
    """Detach from Ray, and stop the embedded Ray this process started, if it did, and remove its
    session files (its logs: a node's own log has what matters; each start's are ~1 MB)."""
    import ray

    global _head, _head_dir
    ray.shutdown()
    if _head is not None:
        _head.kill_all_processes(check_alive=False, allow_graceful=True)
        _head = None
    if _head_dir is not None:
        shutil.rmtree(_head_dir, ignore_errors=True)
        _head_dir = None


def placement(settings) -> dict:
    """Where a node joining a Ray cluster runs its processes: all on one Ray node, on the host of
    its store (they share its mapped files and ipc sockets). `rayNode` names it by node id or by a
    custom resource only it declares; by default it is the Ray node this process is attached to."""
    return place_on(settings.rayNode)


def place_on(wanted: str) -> dict:
    """Ray's options that put an actor on the Ray node `wanted` names (a node id, or a custom
    resource only it declares); "" = the Ray node this process runs on (see `placement`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = [node for node in ray.nodes() if node.get("Alive")]
    if not wanted:
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}
    for node in alive:
        if node.get("NodeID") == wanted:
            return {"scheduling_strategy": NodeAffinitySchedulingStrategy(wanted, soft=False)}
    if any(wanted in (node.get("Resources") or {}) for node in alive):
        return {"resources": {wanted: 0.001}}
    raise SettingsError(f"rayNode: no live Ray node has the id or the resource {wanted!r}")


# Ray's sockets live under its temp dir, in session_<date>_<pid>/sockets/plasma_store: 64 more
# bytes, and a Unix socket's path has 107 at most
RAY_DIR_MAX = 40


def session_dir(settings) -> Path:
    """Where an embedded Ray keeps its session (logs, sockets, spilled objects): `ray` in the node's
    run directory, or, when that path is too long for Ray's sockets, a private directory of its
    own under the system's temp dir; the launcher removes it at stop (node.server.launcher)."""
    return ray_dir_in(Path(settings.run_dir))


def ray_dir_in(directory: Path) -> Path:
    """`ray` in `directory`, or a private one under the temp dir when that path is too long or
    not ASCII (Ray's core worker takes its sockets' paths as ASCII)."""
    inside = directory / "ray"
    if len(str(inside)) <= RAY_DIR_MAX and str(inside).isascii():
        return inside
    digest = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"mqnode-ray-{os.getuid()}-{digest}"


def embedded_ray_on_loopback() -> None:
    """Before Ray is imported: keep the embedded Ray's node address 127.0.0.1. Otherwise Ray
    rewrites a loopback address to the host's LAN address (`resolve_ip_for_localhost`), and its
    GCS, raylet, workers and runtime-env agent listen on every interface or on that address; its
    gRPC servers listen on loopback only when the node address is exactly 127.0.0.1. With the
    switch below off (Ray's own name says Windows and macOS; on Linux it only means "no
    cluster"), `ray.init(address="local")` keeps 127.0.0.1 (verified with ray 2.60)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def private_token_file() -> None:
    """Ray keeps a token in ~/.ray/auth_token, written with the process's umask (often 0644):
    anyone on the host could read it and run code in the node's processes. Made 0600."""
    path = Path.home() / ".ray" / "auth_token"
    try:
        if path.exists() and path.stat().st_mode & 0o077:
            path.chmod(0o600)
    except OSError:
        pass  # not ours to change (another user's home): nothing of ours depends on it


LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def is_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or 127.x written as an IPv4-mapped IPv6 address (::ffff:127.0.0.1)."""
    try:
        address = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address in LOOPBACK_V4 or address == ipaddress.ip_address("::1")


def inline_limit() -> int:
    """The size under which Ray passes a task's argument in the task itself, not through its
    object store (`max_direct_call_object_size`: 100 KiB unless RAY_max_direct_call_object_size)."""
    return int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))


def allowed_hosts(settings) -> set[str]:
    """The addresses a node's settings name for it to listen on (loopback always)."""
    return {settings.listen_host, settings.ha_host, settings.metricsAddress}


def foreign_listeners(settings, processes) -> list[tuple[str, str]]:
    """(process, address) for each listening TCP socket of `processes` ((name, psutil.Process))
    on an address the settings do not name: a wildcard listener counts unless a setting names a
    wildcard."""
    allowed = allowed_hosts(settings)
    wildcard = bool(allowed & {"0.0.0.0", "::", "*"})
    out = []
    for name, process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except (psutil.Error, OSError):
            continue  # gone meanwhile: it listens on nothing
        for c in connections:
            if c.status != psutil.CONN_LISTEN:
                continue
            ip = c.laddr.ip
            if ip in allowed or (wildcard and ip in ("0.0.0.0", "::")):
                continue
            if is_loopback(ip):
                continue
            out.append((name, f"{ip}:{c.laddr.port}"))
    return out


def node_processes(pid_files, root_pid: int, embedded: bool) -> list:
    """The node's processes, named: with an embedded Ray the launcher and every descendant (Ray's
    own processes too, by their command name); joined to a cluster, the launcher and the
    service processes (Ray's are the cluster's, under its own settings)."""
    labels = {}
    for path in pid_files:
        try:
            labels[int(path.read_text())] = path.stem
        except (OSError, ValueError):
            continue
    root = psutil.Process(root_pid)
    candidates = [root, *root.children(recursive=True)] if embedded else [root]
    if not embedded:
        for pid in labels:
            try:
                candidates.append(psutil.Process(pid))
            except psutil.Error:
                continue
    out = []
    for process in candidates:
        try:
            name = labels.get(process.pid) or ("launcher" if process.pid == root_pid else process.name())
        except psutil.Error:
            continue
        out.append((f"{name} (pid {process.pid})", process))
    return out


class ForeignListener(RuntimeError):
    """A process of the node listens on an address its settings do not name."""

    def __init__(self, process: str, address: str):
        super().__init__(f"{process} listens on {address}")


def check_listeners(settings, pid_files, launcher_pid: int) -> None:
    """Every process of a node with an embedded Ray (the launcher and all it started) listens
    only where its settings say: loopback, `listen`'s host, `haListenAddress` (ha_host), `metricsAddress`.
    ForeignListener names the first that does not."""
    foreign = foreign_listeners(settings, node_processes(pid_files, launcher_pid, embedded=True))
    if foreign:
        raise ForeignListener(*foreign[0])

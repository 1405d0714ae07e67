"""A node listens only where its settings say: the embedded Ray on loopback, in both topologies; and
that Ray runs only the processes a node uses."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import psutil
import pytest

from nodes import NodeProcess, free_port, node_settings
from node.server import ray_setup
from node.server.topology import processes as service_processes


# what ray.init(address="local") adds and a node's embedded Ray leaves out (ray_setup.start_head)
UNUSED_RAY_HELPERS = ("_private/log_monitor.py", "autoscaler/_private/monitor.py", "dashboard/dashboard.py")
RAY_AGENTS = ("dashboard/agent.py", "runtime_env/agent/main.py")  # what the raylet needs: quiet stand-ins here


def _commands(processes) -> list[str]:
    """The command lines of those of `processes` still running."""
    out = []
    for process in processes:
        try:
            out.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize("topology", ["compact", "split"])
def test_every_process_of_a_running_node_listens_on_loopback_only(tmp_path, topology):
    node = NodeProcess(node_settings(tmp_path / "store", topology=topology, grpcServerPort=free_port()), tmp_path / "node.log").start()
    try:
        listening = []
        for process in node.tree():
            try:
                listening += [(process.name(), c.laddr.ip, c.laddr.port)
                              for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            except psutil.Error:
                continue
        assert listening, "a running node listens somewhere (its front, Ray's GCS)"
        assert all(ray_setup.is_loopback(ip) for _, ip, _ in listening), listening
        processes = ray_setup.node_processes(node.settings.run_dir.glob("*.pid"), node.process.pid, embedded=True)
        assert {name.split(" ")[0] for name, _ in processes} >= {"launcher", "front", "writer" if topology == "split"
                                                                else "dispatcher"}
        assert ray_setup.foreign_listeners(node.settings, processes) == []
        commands = _commands(node.tree())
        assert any("gcs_server" in command for command in commands), commands
        assert not [c for c in commands if any(helper in c for helper in UNUSED_RAY_HELPERS)], commands
        raylet = [c for c in commands if c.split(" ")[0].endswith("/raylet")]  # its workers' program and its agents' runner
        assert raylet and all(c.count("node/server/ray_worker.py") == 3 for c in raylet), raylet
        services = {"launcher"} | {process.label for process in service_processes(node.settings)}
        assert [name for name, process in processes if name.split(" ")[0] in services and _loaded_unused(process)] == []
        agents = [process for process in node.tree() if _agent(process)]
        assert len(agents) == 2 and not [process for process in agents if _loaded(process, "/ray/_raylet")], commands
        token = Path.home() / ".ray" / "auth_token"
        if token.exists():
            assert stat.S_IMODE(token.stat().st_mode) == 0o600
    finally:
        node.stop()


def _agent(process: psutil.Process) -> bool:
    """Whether `process` is one of the raylet's agents run by node.server.ray_worker (which keeps
    its command line: Ray's own agents retitle theirs `ray::DashboardAgent`...)."""
    try:
        program = process.cmdline()[1:4]
    except psutil.Error:
        return False
    return "node/server/ray_worker.py" in " ".join(program) and any(agent in " ".join(program) for agent in RAY_AGENTS)


def _loaded(process: psutil.Process, part: str) -> bool:
    try:
        return part in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


def _loaded_unused(process: psutil.Process) -> list[str]:
    """The compiled parts `process` has loaded of what the launcher and a service process start
    without: requests' charset_normalizer, jsonschema's rpds and yaml's own
    (node.server.ray_worker defers them), numpy's core (imported where the index is written, the
    timer log rebuilt, the archive read and a store with records recovered)."""
    return [part for part in ("/charset_normalizer/", "/rpds/", "/yaml/_yaml", "_multiarray_umath") if _loaded(process, part)]


def test_a_listener_on_an_address_the_settings_do_not_name_is_found(tmp_path):
    settings = node_settings(tmp_path / "store")
    with socket.socket() as wild:
        wild.bind(("0.0.0.0", 0))
        wild.listen()
        me = [("this test", psutil.Process())]
        assert ray_setup.foreign_listeners(settings, me) == [("this test", f"0.0.0.0:{wild.getsockname()[1]}")]
        opened = node_settings(tmp_path / "other", haListenAddress="0.0.0.0")  # a setting that names the wildcard
        assert ray_setup.foreign_listeners(opened, me) == []
    assert ray_setup.is_loopback("::ffff:127.0.0.1") and ray_setup.is_loopback("127.0.0.5")
    assert not ray_setup.is_loopback("10.0.0.1") and not ray_setup.is_loopback("::ffff:10.0.0.1")

"""The topology is data: the launcher starts what it declares, the docs name what it declares."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from nodes import ROOT

from node.server import topology
from shm import cpus
from shm import settings as settings_module
from shm.settings import SettingsError


def _settings(**values):
    return settings_module.load(None, {k: str(v) for k, v in values.items()})


def test_compact_puts_every_client_facing_service_in_the_front():
    compact = _settings(topology="compact")
    processes = topology.processes(compact)
    assert [p.label for p in processes] == ["allocator", "dispatcher", "clean", "schedule", "pop", "transaction",
                                            "ha-server", "proxy", "front"]
    slave = topology.processes(_settings(topology="compact", brokerRole="SLAVE", brokerId=1,
                                         haMasterAddress="127.0.0.1:10912", namesrvAddr="127.0.0.1:9876"))
    assert set(topology.SERVICES) == {service for p in slave for service in p.services}
    assert topology.hosts(compact)["write"] == ["front"] and topology.hosts(compact)["read"] == ["front"]


def test_the_proxy_runs_unless_its_port_is_0_and_follows_the_client_port():
    assert "proxy" in [p.label for p in topology.processes(_settings())]
    assert "proxy" not in [p.label for p in topology.processes(_settings(grpcServerPort=0))]
    assert _settings().grpc_port == 8081 and _settings(grpcServerPort=9876).grpc_port == 9876
    moved = _settings(listen="tcp://127.0.0.1:20911")
    assert moved.grpc_port == 20913 and moved.ha_port == 20912 and moved.grpc_host == "127.0.0.1"


def test_the_default_gives_every_service_but_routing_a_process_other_than_the_front():
    assert _settings().topology == "split"
    hosts = topology.hosts(_settings())
    assert hosts["ha-client"] == []  # (a slave's only)
    assert all(labels and "front" not in labels for service, labels in hosts.items() if service not in ("router", "ha-client", "register"))
    assert hosts["register"] == []  # (only with namesrvAddr)


def test_split_gives_every_service_a_process_and_scales_ingress_and_reads():
    processes = topology.processes(_settings(topology="split", ingressWorkers=2, pullWorkers=3))
    labels = [p.label for p in processes]
    assert labels[-1] == "front" and {"writer", "flush", "dispatcher", "allocator", "clean"} <= set(labels)
    assert [p.label for p in processes if p.kind == "ingress"] == ["ingress-0", "ingress-1"]
    assert [p.instance for p in processes if p.kind == "pull"] == [0, 1, 2]
    hosts = topology.hosts(_settings(topology="split", ingressWorkers=2, pullWorkers=3))
    assert all(len(labels) == 1 for service, labels in hosts.items() if service not in ("ingress", "read", "ha-client", "register"))
    assert hosts["ha-client"] == []  # a master follows nobody
    assert hosts["router"] == ["front"] and hosts["group commit"] == ["flush"]
    # with no ingress workers the writer encodes: the topology says so
    assert topology.hosts(_settings(topology="split"))["ingress"] == ["writer"]


def test_the_default_pull_workers_are_one_per_cpu_the_node_may_use_not_the_hosts():
    """As the JVM counts availableProcessors: the affinity mask (taskset, a container's cpuset) and
    the cgroup's CPU quota (a container's --cpus), not os.cpu_count() (the host's)."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); from shm import cpus, settings; "
            "print(cpus.available_cpus(), settings.load(None, {'topology': 'split'}).pull_processes)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "1"], done.stderr


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2: --cpus=2
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n", "cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000"}, None),
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.5),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_a_cgroup_cpu_quota_is_read_as_a_container_sees_it(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpus.cpu_quota(tmp_path) == quota
    if quota is not None:  # (rounded up, and never past the affinity mask)
        assert cpus.available_cpus(tmp_path) == min(math.ceil(quota), len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("name", settings_module.REPLACED_BY_TOPOLOGY)
def test_the_old_placement_flags_are_refused_naming_topology(name, tmp_path):
    with pytest.raises(SettingsError, match="topology = compact"):
        settings_module.load(None, {name: "false"})
    conf = tmp_path / "broker.conf"
    conf.write_text(f"{name} = true\n")
    with pytest.raises(SettingsError, match="topology"):
        settings_module.load(conf)


def test_workers_belong_to_the_split_topology():
    with pytest.raises(SettingsError, match="topology = split"):
        _settings(topology="compact", ingressWorkers=1)
    with pytest.raises(SettingsError, match="compact, split"):
        _settings(topology="sideways")


def test_architecture_md_names_the_declared_services_and_processes():
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Services")[1].split("##")[0]
    named = re.findall(r"^\| ([a-z -]+) \| ", table, re.MULTILINE)
    assert set(named) - {"service", "---"} == set(topology.SERVICES)
    placement = re.findall(r"^\| (compact|split) \| ([a-z-]+)[^|]* \| ([a-z ,-]+)", text, re.MULTILINE)
    slave = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "127.0.0.1:10912", "namesrvAddr": "127.0.0.1:9876"}
    for name, settings in (("compact", _settings(topology="compact", **slave)),
                           ("split", _settings(topology="split", ingressWorkers=1, **slave))):
        declared = {p.kind: set(p.services) for p in topology.processes(settings)}
        drawn = {process.removesuffix("-i"): {s.strip() for s in services.split("(")[0].split(",")}
                 for top, process, services in placement if top == name}
        assert drawn == declared, (name, drawn, declared)


def _shells(actor) -> list[type]:
    """The shell classes an actor built for a process runs: a host's members and threads, else itself."""
    from actors.host import Host

    if isinstance(actor, Host):
        return [type(shell) for shell in (*actor.members, *actor.threads)]
    return [type(actor)]


def test_each_service_has_one_shell_whichever_process_hosts_it():
    """The compact front's process is a host of the very shells split runs alone."""
    slave = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "127.0.0.1:10912", "namesrvAddr": "127.0.0.1:9876"}
    shells_by_topology = {}
    for name in topology.TOPOLOGIES:
        settings = _settings(topology=name, **slave)
        shells = {}
        for process in topology.processes(settings):
            built = topology.build(process, settings, {})
            for service, shell in zip(_service_order(process), _shells(built)):
                shells[service] = shell
        shells_by_topology[name] = shells
    compact, split = shells_by_topology["compact"], shells_by_topology["split"]
    assert {s: c.__name__ for s, c in compact.items()} == {s: c.__name__ for s, c in split.items() if s in compact}
    front = next(p for p in topology.processes(_settings(topology="compact")) if p.label == "front")
    assert [c.__name__ for c in _shells(topology.build(front, _settings(topology="compact"), {}))] == \
        ["Front", "Writer", "Pull", "Flush"]  # router, write, read in its loop; group commit on a thread


def _service_order(process) -> list[str]:
    """A process's shells' services, in `build`'s order (its kind's, the hosted, the threads)."""
    service_of = {"front": "router", "writer": "write", "pull": "read", "flush": "group commit", "ingress": "ingress",
                  "dispatcher": "dispatch", "allocator": "allocate", "clean": "clean", "schedule": "schedule",
                  "pop": "pop", "proxy": "proxy", "ha-server": "ha-server", "ha-client": "ha-client",
                  "transaction": "transaction check", "registrar": "register"}
    return [service_of[kind] for kind in (process.kind, *process.hosted, *process.threads)]


def test_with_name_services_the_clean_process_hosts_the_registrations():
    hosts = topology.hosts(_settings(namesrvAddr="127.0.0.1:9876;127.0.0.2:9876"))
    assert hosts["register"] == ["clean"] == hosts["clean"]
    with pytest.raises(SettingsError, match="namesrvAddr"):
        _settings(namesrvAddr="no port here")
    with pytest.raises(SettingsError, match="brokerName"):
        _settings(brokerName="a b")


def test_no_service_asks_which_topology_it_runs_in():
    for path in (ROOT / "actors").glob("**/*.py"):
        assert "topology" not in re.sub(r'""".*?"""|#.*', "", path.read_text(), flags=re.DOTALL), path.name


def test_every_kind_has_a_shell_and_an_unknown_kind_is_refused():
    from actors.base import Actor

    slave = dict(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:10912", namesrvAddr="127.0.0.1:9876")
    variants = [_settings(**shape, **roles) for shape in ({"topology": "compact"}, {"ingressWorkers": 2})
                for roles in ({}, slave)]
    kinds = {kind for settings in variants for p in topology.processes(settings) for kind in (p.kind, *p.hosted, *p.threads)}
    assert len(kinds) == 15  # every shell some topology runs (a new one must be counted here)
    assert all(issubclass(topology.actor_class(kind), Actor) for kind in kinds)
    with pytest.raises(KeyError, match="no shell of kind 'nope'"):
        topology.actor_class("nope")


def test_a_process_imports_only_the_services_it_runs():
    """Ray builds each process's shells in a fresh worker: the module it loads for `ActorHost`
    must not pull in every service, the whole client, nor the launcher's recovery and store
    (with numpy: ~0.2 s of CPU at each of a node's process starts and at every restart)."""
    code = ("import sys, node.server.actor_host, node.server.topology as t; t.actor_class('flush'); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('actors.', 'node.', 'shm.', 'numpy')))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split())
    assert "actors.flush" in loaded
    assert not loaded & {"actors.front", "actors.pop", "actors.proxy.shell", "actors.schedule", "actors.transaction",
                         "node.client.producer", "node.client.consumer", "node.server.launcher", "shm.recovery",
                         "shm.store", "numpy"}, loaded


KINDS = ("front", "ingress", "writer", "flush", "allocator", "dispatcher", "pull", "clean", "schedule", "pop",
         "transaction", "proxy", "ha-server", "ha-client", "registrar")


def test_no_service_process_loads_numpy_to_start():
    """numpy (~0.1 CPU-s) is imported where it is used (the index's writer, the timer log's rebuild,
    the archive's reads), not by the modules of any service's shell."""
    code = ("import sys, node.server.topology as t\n"
            f"for kind in {KINDS!r}: t.actor_class(kind)\n"
            "print('numpy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split() == ["False"]


@pytest.mark.parametrize("listen, local, host", [
    ("tcp://*:10911", "tcp://127.0.0.1:10911", "0.0.0.0"),  # ZeroMQ's wildcard: gRPC and a TCP HA listener bind 0.0.0.0
    ("tcp://0.0.0.0:10911", "tcp://127.0.0.1:10911", "0.0.0.0"),
    ("tcp://[::]:10911", "tcp://[::1]:10911", "::"),
    ("tcp://[::1]:10911", "tcp://[::1]:10911", "::1"),
    ("tcp://10.0.0.5:10911", "tcp://10.0.0.5:10911", "10.0.0.5"),
    ("ipc:///run/mq/front", "ipc:///run/mq/front", "127.0.0.1"),
])
def test_a_wildcard_listen_is_reached_on_loopback_and_bound_as_an_address(listen, local, host):
    settings = settings_module.load(None, {"listen": listen})
    assert settings.local_endpoint == local and settings.listen_host == host == settings.ha_host

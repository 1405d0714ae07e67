"""The cluster's toml and the role a node of a cluster restarts with (node.server.cluster)."""

from __future__ import annotations

import pytest

from node.server import cluster
from shm import settings as settings_module
from shm.settings import SettingsError

TOML = """
[cluster]
name = "C1"
runDir = "{run}"

[defaults]
topology = "compact"

[[namesrv]]
listen = "127.0.0.1:9876"

[[namesrv]]
listen = "tcp://127.0.0.1:9877"

[[node]]
brokerName = "broker-a"
store = "{run}/a"
listen = "tcp://127.0.0.1:10911"

[[node]]
brokerName = "broker-a"
store = "{run}/a1"
listen = "tcp://127.0.0.1:10921"
brokerRole = "SLAVE"
brokerId = 1
haMasterAddress = "127.0.0.1:10912"
"""


def test_a_toml_declares_name_services_and_nodes_that_register_with_all_of_them(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(TOML.format(run=tmp_path))
    conf = cluster.load(path)
    assert conf.name == "C1" and conf.namesrv_addr == "127.0.0.1:9876;127.0.0.1:9877"
    assert [n.label for n in conf.nodes] == ["broker-a/0", "broker-a/1"]
    slave = conf.nodes[1].settings
    assert slave.namesrvAddr == conf.namesrv_addr and slave.brokerClusterName == "C1"
    assert slave.topology == "compact" and str(slave.root) == f"{tmp_path}/a1"


def test_relative_paths_of_a_toml_are_those_of_the_directory_cluster_up_runs_in(tmp_path, monkeypatch):
    """(its parts run in its run directory, Ray's workers wherever Ray puts them)"""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cluster.toml"
    path.write_text(TOML.format(run="here").replace('runDir = "here"', 'runDir = "run"')
                    .replace('listen = "tcp://127.0.0.1:9877"', 'listen = "tcp://127.0.0.1:9877"\ndir = "ns"'))
    conf = cluster.load(path)
    assert conf.run_dir == tmp_path / "run" and [n.directory for n in conf.namesrvs] == [
        str(tmp_path / "run" / "namesrv-0"), str(tmp_path / "ns")]
    assert [n.settings.storePathRootDir for n in conf.nodes] == [str(tmp_path / "here" / "a"), str(tmp_path / "here" / "a1")]


@pytest.mark.parametrize("change, problem", [
    (lambda t: t.replace('[[namesrv]]\nlisten = "127.0.0.1:9876"\n\n[[namesrv]]\nlisten = "tcp://127.0.0.1:9877"', ""),
     "namesrv"),
    (lambda t: t.replace('brokerId = 1\n', 'brokerId = 0\n'), "brokerId"),
    (lambda t: t.replace('store = "{run}/a1"\n', ""), "store"),
    (lambda t: t.replace('topology = "compact"', 'topology = "sideways"'), "topology"),
    (lambda t: t + "\n[[node", "cluster conf"),
    (lambda t: t.replace('"tcp://127.0.0.1:9877"', '"127.0.0.1:9876"'), "as \\[\\[namesrv\\]\\] 1 does"),
    (lambda t: t.replace('"tcp://127.0.0.1:10921"', '"tcp://127.0.0.1:9877"'), "broker-a/1 listens at tcp://127.0.0.1:9877"),
])
def test_a_bad_toml_is_refused_naming_what(tmp_path, change, problem):
    path = tmp_path / "cluster.toml"
    path.write_text(change(TOML).format(run=tmp_path))
    with pytest.raises(SettingsError, match=problem):
        cluster.load(path)


def _settings(**values):
    return settings_module.load(None, {"namesrvAddr": "127.0.0.1:9876", "brokerName": "b", **values})


def _info(addrs: dict, live: dict) -> dict:
    return {"status": "OK", "brokerAddrTable": {"b": {"cluster": "C", "brokerName": "b", "brokerAddrs": addrs}},
            "brokerLiveTable": live}


def test_an_old_master_whose_slave_was_promoted_restarts_as_its_slave():
    old = _settings(listen="tcp://127.0.0.1:10911")
    info = _info({"0": "127.0.0.1:20911"}, {"127.0.0.1:20911": {"haServerAddr": "127.0.0.1:20912", "role": "ASYNC_MASTER"}})
    assert cluster.role_now(old, info) == {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "127.0.0.1:20912"}
    assert cluster.role_now(old, _info({"0": "127.0.0.1:10911"}, {"127.0.0.1:10911": {}})) == {}  # still its own
    assert cluster.role_now(old, _info({"0": "127.0.0.1:20911"}, {})) == {}  # a master not live: as configured
    assert cluster.role_now(old, None) == {} and cluster.role_now(old, {"brokerAddrTable": {}}) == {}


def test_a_promoted_slave_restarts_as_the_master_it_registered_as():
    promoted = _settings(listen="tcp://127.0.0.1:20911", brokerRole="SLAVE", brokerId=1,
                         haMasterAddress="127.0.0.1:10912")
    info = _info({"0": "127.0.0.1:20911"}, {"127.0.0.1:20911": {"role": "SYNC_MASTER"}})
    assert cluster.role_now(promoted, info) == {"brokerRole": "SYNC_MASTER", "brokerId": 0}
    following = _info({"0": "127.0.0.1:10911", "1": "127.0.0.1:20911"}, {"127.0.0.1:10911": {}})
    assert cluster.role_now(promoted, following) == {}


def test_with_every_node_of_the_group_stopped_the_last_master_the_name_services_knew_keeps_the_roles():
    """`cluster down` unregisters every node; at `cluster up` the name services' table has no
    live node of the group, only its last master. The promoted slave comes back as the master
    and the old master as its slave, whatever the toml says (before, the old master took sends
    again and the promoted one, now its slave, had its tail cut by fencing)."""
    last = {"b": {"address": "10.0.0.3:20911", "haServerAddr": "10.0.0.3:20912", "role": "SYNC_MASTER"}}
    info = {"status": "OK", "brokerAddrTable": {}, "brokerLiveTable": {}, "lastMasterTable": last}
    old = _settings(listen="tcp://10.0.0.2:10911", brokerRole="SYNC_MASTER")
    promoted = _settings(listen="tcp://10.0.0.3:20911", brokerRole="SLAVE", brokerId=1,
                         haMasterAddress="10.0.0.2:10912")
    assert cluster.role_now(old, info) == {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "10.0.0.3:20912"}
    assert cluster.role_now(promoted, info) == {"brokerRole": "SYNC_MASTER", "brokerId": 0}
    own = dict(info, lastMasterTable={"b": {"address": "10.0.0.2:10911", "haServerAddr": "10.0.0.2:10912"}})
    assert cluster.role_now(old, own) == {} and cluster.role_now(promoted, own) == {}  # as configured
    live = _info({"0": "10.0.0.2:10911"}, {"10.0.0.2:10911": {"haServerAddr": "10.0.0.2:10912"}})
    assert cluster.role_now(old, live | {"lastMasterTable": last}) == {}  # a live master is what counts


@pytest.mark.parametrize("values, bound, registered", [
    ({"listen": "tcp://127.0.0.1:10911"}, "127.0.0.1:10912", "127.0.0.1:10912"),  # one host: loopback
    ({"listen": "tcp://10.0.0.3:20911"}, "10.0.0.3:20912", "10.0.0.3:20912"),  # follows listen, as its port does
    ({"listen": "tcp://10.0.0.3:20911", "haListenAddress": "0.0.0.0"}, "0.0.0.0:20912", "10.0.0.3:20912"),
    ({"listen": "tcp://0.0.0.0:20911", "brokerIP1": "10.0.0.3"}, "0.0.0.0:20912", "10.0.0.3:20912"),
    ({"listen": "tcp://10.0.0.3:20911", "haListenAddress": "10.9.9.9", "haListenPort": 7000}, "10.9.9.9:7000",
     "10.9.9.9:7000"),  # named: as it is
    ({"listen": "ipc:///run/mq/node"}, "127.0.0.1:10912", "127.0.0.1:10912"),
])
def test_the_ha_server_serves_where_clients_reach_the_node_and_registers_an_address_other_hosts_reach(
        values, bound, registered):
    """A slave on another host, or the old master that comes back as a promoted slave's slave,
    follows the `haServerAddr` its group's master registered (role_now): a node that serves
    clients on a host's address serves its HA link there too, unless `haListenAddress` says
    otherwise, and a wildcard listener registers the store host (brokerIP1, or listen's)."""
    from actors.registrar import ha_address

    node = _settings(**values)
    assert f"{node.ha_host}:{node.ha_port}" == bound
    assert ha_address(node) == registered


def test_a_slaves_health_says_when_it_follows_nothing_and_a_promoted_ones_does_not():
    from node.tools.cli_cluster import _health

    follower = {"master": "10.0.0.2:10912", "connected": False, "lastError": "nothing heard"}
    assert _health({"status": "OK", "role": "SLAVE", "follower": follower}) == "not following 10.0.0.2:10912: nothing heard"
    assert _health({"status": "OK", "role": "SLAVE", "follower": follower | {"connected": True}}) == "ok"
    assert _health({"status": "OK", "role": "SYNC_MASTER", "follower": follower}) == "ok"  # (promoted: it follows no one)
    assert _health({"status": "SYSTEM_BUSY"}) == "SYSTEM_BUSY"


def test_an_old_master_leaves_the_routes_and_registers_no_more(tmp_path):
    """actors.ha_server marks a master that a would-be slave's later history superseded; its
    registrar unregisters once and sends nothing more, so the name services' lastMasterTable
    keeps the node promoted in its place (not the old master's periodic registrations)."""
    from nodes import node_settings

    from actors.registrar import Registrar
    from node import protocol
    from shm.control_block import ControlBlock

    settings = node_settings(tmp_path / "store", namesrvAddr="127.0.0.1:9876")
    settings.root.mkdir(parents=True)
    registrar = Registrar(settings)
    registrar.control = ControlBlock(settings.root / "control", create=True)
    registrar.control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    sent = []
    registrar._send_all = lambda header, body: sent.append(header["code"])
    registrar.step(set())
    assert sent == [protocol.REGISTER_BROKER]
    registrar.control.set("superseded_by", 1)
    for _ in range(3):
        registrar.next_register = 0.0  # (due: it would register now)
        registrar.step(set())
    assert sent == [protocol.REGISTER_BROKER, protocol.UNREGISTER_BROKER]
    registrar.control.close()


def test_up_starts_each_group_s_master_first_by_the_role_it_starts_with():
    """The toml says a is the master; the name services' table says its slave a1 was promoted:
    a1 starts first, so a (now a1's slave) fences its log against a running master."""
    def part(**values):
        return cluster.NodePart({"namesrvAddr": "127.0.0.1:9876", "brokerName": "b", **values})
    a = part(listen="tcp://10.0.0.2:10911", brokerRole="ASYNC_MASTER")
    a1 = part(listen="tcp://10.0.0.3:10911", brokerRole="SLAVE", brokerId=1, haMasterAddress="10.0.0.2:10912")
    other = part(brokerName="c", listen="tcp://10.0.0.4:10911")
    assert cluster.start_order([a, a1, other], None) == [a, other, a1]  # as configured
    last = {"b": {"address": "10.0.0.3:10911", "haServerAddr": "10.0.0.3:10912", "role": "ASYNC_MASTER"}}
    info = {"status": "OK", "brokerAddrTable": {}, "brokerLiveTable": {}, "lastMasterTable": last}
    assert cluster.start_order([a, a1, other], info) == [a1, other, a]


def test_a_master_the_name_service_says_is_older_than_its_groups_is_marked_an_old_master_and_leaves(tmp_path):
    """REGISTER_BROKER carries the node's epoch; an answer `supersededBy` (the name service
    holds the group's master at a later epoch) marks an old master, as a would-be slave's hello
    does (ControlBlock.superseded), and the registrar then unregisters."""
    import orjson

    from nodes import node_settings

    from actors.registrar import Registrar
    from node import protocol
    from shm.control_block import ROLE_CODES, ControlBlock
    from shm.epochs import EpochFile

    settings = node_settings(tmp_path / "store", namesrvAddr="127.0.0.1:9876")
    settings.root.mkdir(parents=True)
    EpochFile(settings.root).genesis(0)
    registrar = Registrar(settings)
    registrar.control = ControlBlock(settings.root / "control", create=True)
    registrar.control.publish_recovered(written=0, flushed=0, dispatched=0, min_offset=0)
    header, _ = registrar.registration()
    assert header["epoch"] == 0
    sent = []
    registrar._send_all = lambda header, body: sent.append(header["code"])
    answer = [orjson.dumps({"status": "OK", "masterAddr": "10.0.0.3:10911", "supersededBy": 1})]
    registrar.control.set("role", ROLE_CODES["SLAVE"])
    registrar._answered("tcp://127.0.0.1:9876", answer)  # (a slave: not its concern)
    assert registrar.control.superseded() == 0
    registrar.control.set("role", ROLE_CODES["ASYNC_MASTER"])
    registrar._answered("tcp://127.0.0.1:9876", answer)
    assert registrar.control.superseded() == 1 and registrar.control.get("superseded_by") == 0
    registrar.step(set())
    assert sent == [protocol.UNREGISTER_BROKER]
    # in a cluster the node then restarts (its NodeHost ends it), to come back as that master's
    # slave (role_now); a would-be slave's word alone does not restart it, nor anything once closed
    node = type("Node", (), {"settings": settings, "control": registrar.control})()
    assert "at epoch 1, past this node's: it restarts as that master's slave" in cluster.old_master(node)
    registrar.control.set("superseded_in_routes", 0)
    registrar.control.set("superseded_by", 2)
    assert cluster.old_master(node) is None
    registrar.control.set("superseded_in_routes", 1)
    registrar.control.close()
    assert cluster.old_master(node) is None

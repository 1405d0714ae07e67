"""The name service's route table (RocketMQ's RouteInfoManager) on a given clock, and the
client's side of routes: TopicRoute, fault tolerance, queue selection."""

from __future__ import annotations

import pytest

from actors.namesrv_core import EXPIRY_MS, RegistrationRefused, RouteTable
from node.client.routes import FaultTolerance, MessageQueue, QueueSelector, TopicRoute


def _register(table, name, address, broker_id=0, topics=None, now=0, cluster="C", epoch=None):
    header = {"brokerName": name, "clusterName": cluster, "brokerAddr": address, "brokerId": broker_id,
              "haServerAddr": address + "-ha"} | ({} if epoch is None else {"epoch": epoch})
    table_ = {t: {"readQueueNums": q, "writeQueueNums": q, "perm": 6} for t, q in (topics or {}).items()}
    return table.register(header, {"topicConfigSerializeWrapper": {"topicConfigTable": table_}}, now)


def test_a_topic_over_two_groups_routes_to_both_with_their_addresses():
    table = RouteTable()
    _register(table, "a", "h1:10911", topics={"T": 8})
    _register(table, "b", "h2:10911", topics={"T": 8, "U": 2})
    reply = _register(table, "b", "h3:10911", broker_id=1, topics={"ignored": 1})  # a slave says nothing of topics
    assert reply == {"masterAddr": "h2:10911", "haServerAddr": "h2:10911-ha"}
    route = table.route("T")
    assert [q["brokerName"] for q in route["queueDatas"]] == ["a", "b"]
    assert route["brokerDatas"][1]["brokerAddrs"] == {"0": "h2:10911", "1": "h3:10911"}
    assert table.route("ignored") is None and table.route("U")["queueDatas"][0]["writeQueueNums"] == 2
    assert table.cluster_info()["clusterAddrTable"] == {"C": ["a", "b"]}
    assert table.topics() == ["T", "U"]


def test_a_route_names_where_each_address_serves_grpc_when_it_registered_one():
    table = RouteTable()
    header = {"brokerName": "a", "clusterName": "C", "brokerAddr": "h1:10911", "brokerId": 0, "grpcAddr": "h1:8081"}
    body = {"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"readQueueNums": 2, "writeQueueNums": 2,
                                                                       "perm": 6}}}}
    table.register(header, body, 0)
    _register(table, "b", "h2:10911", topics={"T": 2})  # (grpc off there: no grpcAddr)
    route = table.route("T")
    assert route["brokerDatas"][0]["grpcAddrs"] == {"0": "h1:8081"} and "grpcAddrs" not in route["brokerDatas"][1]
    assert "grpcAddrs" not in table.cluster_info()["brokerAddrTable"]["a"]  # (the table itself stays RocketMQ's)
    version = table.version
    table.register(header | {"grpcAddr": "h1:9091"}, body, 1)  # the proxy moved: a change
    assert table.version > version and table.route("T")["brokerDatas"][0]["grpcAddrs"] == {"0": "h1:9091"}
    for bad in ("a b", "h1", "h1:port", "h1:0", "h1:70000", ":8081", 8081):
        with pytest.raises(RegistrationRefused, match="grpcAddr"):
            table.register(header | {"grpcAddr": bad}, body, 2)


def test_a_master_registration_replaces_its_groups_topics():
    table = RouteTable()
    _register(table, "a", "h1:1", topics={"T": 8, "V": 1})
    version = table.version
    _register(table, "a", "h1:1", topics={"T": 8, "V": 1})  # the same: nothing changed
    assert table.version == version
    _register(table, "a", "h1:1", topics={"T": 4})
    assert table.route("V") is None and table.route("T")["queueDatas"][0]["readQueueNums"] == 4
    assert table.version > version


def test_a_silent_address_leaves_after_the_expiry_and_an_empty_group_leaves_every_route():
    table = RouteTable()
    _register(table, "a", "h1:1", topics={"T": 8}, now=0)
    _register(table, "a", "h2:1", broker_id=1, now=0)
    _register(table, "a", "h1:1", topics={"T": 8}, now=EXPIRY_MS)  # the master keeps registering
    assert table.expire(EXPIRY_MS + 1) == ["h2:1"]
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "h1:1"}
    assert table.expire(2 * EXPIRY_MS + 1) == ["h1:1"]
    assert table.route("T") is None and table.cluster_info()["brokerAddrTable"] == {}
    assert table.cluster_info()["clusterAddrTable"] == {}


def test_a_promoted_slave_becomes_its_groups_master_and_unregister_takes_an_address_out():
    table = RouteTable()
    _register(table, "b", "m:1", topics={"T": 8})
    _register(table, "b", "s:1", broker_id=1)
    _register(table, "b", "s:1", broker_id=0, topics={"T": 8})  # `admin role` promoted it
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "s:1"}
    assert table.unregister({"brokerAddr": "m:1"}) and not table.unregister({"brokerAddr": "nobody:1"})
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "s:1"}


def test_a_master_older_than_its_groups_is_told_so_and_changes_nothing():
    """A slave promoted while its master was cut off (a partition, not a death): both register
    as the group's master. The later epoch keeps the master's slot, the topics and the last
    master; the old one is answered supersededBy (it then takes no sends and leaves)."""
    table = RouteTable()
    _register(table, "b", "m:1", topics={"T": 8}, epoch=0)
    _register(table, "b", "s:1", broker_id=1, epoch=0)
    _register(table, "b", "s:1", broker_id=0, topics={"T": 8, "U": 4}, epoch=1)  # promoted
    version = table.version
    answer = _register(table, "b", "m:1", topics={"T": 8, "Old": 1}, now=5, epoch=0)  # the partition heals
    assert answer == {"masterAddr": "s:1", "haServerAddr": "s:1-ha", "supersededBy": 1}
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "s:1"} and table.route("Old") is None
    assert table.cluster_info()["lastMasterTable"]["b"]["address"] == "s:1" and table.version == version
    assert table.statistics()["staleMasters"] == 1 and "m:1" in table.cluster_info()["brokerLiveTable"]
    assert table.unregister({"brokerAddr": "m:1"})  # (its leaving)
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "s:1"}
    newer = _register(table, "b", "m:1", topics={"T": 8}, epoch=2)  # promoted again later: it takes the slot
    assert "supersededBy" not in newer and table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "m:1"}
    plain = RouteTable()  # RocketMQ's brokers send no epoch: the later registration wins, as in RocketMQ
    _register(plain, "b", "s:1", topics={"T": 8}, epoch=1)
    assert "supersededBy" not in _register(plain, "b", "m:1", topics={"T": 8})
    assert plain.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "m:1"}
    with pytest.raises(RegistrationRefused, match="epoch"):
        _register(plain, "b", "m:1", epoch="1")


def test_the_snapshot_restores_the_tables_heard_from_at_the_restore():
    table = RouteTable()
    _register(table, "a", "h1:1", topics={"T": 8}, now=0)
    restored = RouteTable()
    restored.restore(table.snapshot(), now_ms=10 * EXPIRY_MS)
    assert restored.route("T") == table.route("T")
    assert restored.expire(10 * EXPIRY_MS + 1) == []  # a restart does not expire what it had
    assert restored.cluster_info()["clusterAddrTable"] == {"C": ["a"]}


def test_a_groups_last_master_outlives_its_unregistration_its_expiry_and_a_restart():
    """Which node was a group's master when every node of it stopped (`cluster down`
    unregisters each) is what their next starts ask (node.server.cluster.role_now)."""
    table = RouteTable()
    _register(table, "b", "m:1", topics={"T": 8})
    _register(table, "b", "s:1", broker_id=1)
    assert table.cluster_info()["lastMasterTable"]["b"]["address"] == "m:1"
    _register(table, "b", "s:1", broker_id=0, topics={"T": 8}, now=5)  # `admin role` promoted it
    assert table.unregister({"brokerAddr": "s:1"}) and table.unregister({"brokerAddr": "m:1"})
    assert table.route("T") is None and "b" not in table.cluster_info()["brokerAddrTable"]
    last = table.cluster_info()["lastMasterTable"]["b"]
    assert (last["address"], last["haServerAddr"], last["lastUpdateTimestamp"]) == ("s:1", "s:1-ha", 5)
    restored = RouteTable()
    restored.restore(table.snapshot(), now_ms=10 * EXPIRY_MS)
    restored.expire(30 * EXPIRY_MS)
    assert restored.cluster_info()["lastMasterTable"] == table.cluster_info()["lastMasterTable"]
    version = restored.version
    _register(restored, "b", "s:1", broker_id=0, topics={"T": 8}, now=40 * EXPIRY_MS)
    _register(restored, "b", "s:1", broker_id=0, topics={"T": 8}, now=41 * EXPIRY_MS)
    assert restored.version == version + 1  # (a master registering again changes nothing to persist)


@pytest.mark.parametrize("header, problem", [
    ({"brokerName": "a b"}, "brokerName"), ({"clusterName": ""}, "clusterName"), ({"brokerAddr": 5}, "brokerAddr"),
    ({"brokerId": -1}, "brokerId"), ({"brokerId": True}, "brokerId"),
])
def test_malformed_registrations_are_refused_naming_the_field(header, problem):
    table = RouteTable()
    good = {"brokerName": "a", "clusterName": "C", "brokerAddr": "h:1", "brokerId": 0}
    with pytest.raises(RegistrationRefused, match=problem):
        table.register(good | header, None, 0)
    with pytest.raises(RegistrationRefused, match="writeQueueNums"):
        table.register(good, {"topicConfigSerializeWrapper": {"topicConfigTable": {"T": {"readQueueNums": 1,
                                                                                         "writeQueueNums": "x"}}}}, 0)
    assert table.cluster_info()["brokerAddrTable"] == {}


def _route() -> TopicRoute:
    return TopicRoute("T", {"queueDatas": [{"brokerName": "a", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6},
                                           {"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6},
                                           {"brokerName": "c", "readQueueNums": 1, "writeQueueNums": 1, "perm": 4}],
                            "brokerDatas": [{"brokerName": "a", "brokerAddrs": {"0": "h1:1"}},
                                            {"brokerName": "b", "brokerAddrs": {"0": "h2:1", "1": "h3:1"}},
                                            {"brokerName": "c", "brokerAddrs": {"0": "ipc:///x"}}]})


def test_a_route_lists_writable_and_readable_queues_and_masters_as_endpoints():
    route = _route()
    assert route.write == [MessageQueue("a", "T", 0), MessageQueue("a", "T", 1), MessageQueue("b", "T", 0),
                           MessageQueue("b", "T", 1)]  # c is read-only
    assert MessageQueue("c", "T", 0) in route.read and len(route.read) == 5
    assert route.master("a") == "tcp://h1:1" and route.master("c") == "ipc:///x" and route.master("z") is None
    lost = TopicRoute("T", {"queueDatas": [{"brokerName": "b", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}],
                            "brokerDatas": [{"brokerName": "b", "brokerAddrs": {"2": "h4:1", "1": "h3:1"}}]})
    assert lost.write == [] and len(lost.read) == 2  # no master: nothing to send to, its slaves still read
    assert lost.reader("b") == "tcp://h3:1" and route.reader("b") == "tcp://h2:1" and lost.reader("z") is None


def test_sends_go_round_robin_and_pass_over_a_failed_or_slow_group_until_its_time_is_up():
    now = [0.0]
    faults = FaultTolerance(isolation_s=30, clock=lambda: now[0])
    selector, route = QueueSelector(faults), _route()
    assert [selector.select(route).broker for _ in range(4)] == ["a", "a", "b", "b"]
    faults.update("a", 5.0, failed=True)
    assert {selector.select(route).broker for _ in range(8)} == {"b"}
    assert selector.select(route, avoid="b").broker == "a"  # every other one is held out: any but the one left
    now[0] = 31.0
    assert {selector.select(route).broker for _ in range(8)} == {"a", "b"}
    faults.update("b", 600.0, failed=False)  # slow: RocketMQ's table holds it out 30 s
    assert {selector.select(route).broker for _ in range(8)} == {"a"}
    now[0] = 62.0
    faults.update("b", 1.0, failed=False)
    assert faults.available("b") and "b" not in faults.until

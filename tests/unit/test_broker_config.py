"""brokerPermission and the broker-config requests without a node: what each permission refuses,
how routes carry it, and which UPDATE_BROKER_CONFIG bodies are taken."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from helpers import small_settings

from actors.broker_config import BrokerConfig, Refused, parse_properties
from actors.offsets import ConsumerOffsets, SubscriptionGroups
from actors.router import Router, To
from actors.topics import TopicConfig, TopicTable
from node import protocol


class Control:
    """The control block's one slot this needs."""

    def __init__(self, value: int):
        self.slots = {"broker_permission": value}

    def get(self, name: str) -> int:
        return self.slots[name]

    def set(self, name: str, value: int) -> None:
        self.slots[name] = value


@pytest.fixture
def settings(tmp_path):
    return small_settings(tmp_path / "store", haSecretKey="s3cret-key")


def _router(tmp_path, settings, control) -> Router:
    config = tmp_path / "config"
    topics = TopicTable(config, auto_create=False, default_queues=4)
    topics.create("Plain", 4)
    topics.topics["Ordered"] = TopicConfig("Ordered", 4, 4, order=True)
    return Router(settings, topics, ConsumerOffsets(config), SubscriptionGroups(config),
                  config=BrokerConfig(settings, control))


def _ask(router: Router, code: int, body: bytes = b"", **fields) -> dict:
    route = router.route(protocol.Request({"code": code, "opaque": 1, **fields}, body))
    return orjson.loads(route.frames[0]) if route.to is To.ANSWER else {"to": route.to}


PULL = dict(topic="Plain", queueId=0, queueOffset=0, maxMsgNums=1)


@pytest.mark.parametrize("permission, pulls, ordered_sends, route_perm", [
    (6, True, True, 6), (4, True, False, 4), (2, False, True, 2), (0, False, False, 0)])
def test_each_permission_refuses_what_rocketmqs_does(tmp_path, settings, permission, pulls, ordered_sends, route_perm):
    router = _router(tmp_path, settings, Control(permission))
    pulled = _ask(router, protocol.PULL_MESSAGE, **PULL)
    assert (pulled == {"to": To.READ}) is pulls
    if not pulls:
        assert pulled["status"] == "NO_PERMISSION" and pulled["remark"].startswith("the broker[broker-a] pulling")
    assert (router.check_one("Ordered", 0) is None) is ordered_sends
    assert router.check_one("Plain", 0) is None  # (the routes steer producers away; a late one is served)
    assert router.check_one("Ordered", 0, own=True) is None  # a due delayed message is put whatever the permission
    assert _ask(router, protocol.GET_ROUTEINFO_BY_TOPIC, topic="Plain")["perm"] == route_perm


def test_an_update_changes_the_control_block_and_only_brokerpermission(tmp_path, settings):
    control = Control(6)
    router = _router(tmp_path, settings, control)
    assert _ask(router, protocol.UPDATE_BROKER_CONFIG, b"# drain\nbrokerPermission = 4\n")["brokerPermission"] == 4
    assert control.get("broker_permission") == 4
    for body in (b"", b"# nothing", b"flushDiskType=SYNC_FLUSH", b"brokerPermission=5", b"brokerPermission=x",
                 b"brokerPermission", b"\xff", b"brokerPermission=4\n" * 65):
        answer = _ask(router, protocol.UPDATE_BROKER_CONFIG, body)
        assert answer["status"] == "INVALID_PARAMETER", body
    assert control.get("broker_permission") == 4


def test_without_a_control_block_an_update_holds_in_the_core(settings):
    config = BrokerConfig(settings)  # (as a router made without a node's control block)
    config.answer(protocol.Request({"code": protocol.UPDATE_BROKER_CONFIG, "opaque": 1}, b"brokerPermission=2"))
    assert config.permission == 2 and config.read_refusal(protocol.PULL_MESSAGE)


def test_the_config_shows_every_setting_and_no_secret(tmp_path, settings):
    router = _router(tmp_path, settings, Control(2))
    route = router.route(protocol.Request({"code": protocol.GET_BROKER_CONFIG, "opaque": 1}, b""))
    shown = dict(line.split("=", 1) for line in route.frames[1].decode().splitlines())
    assert set(shown) == {f.name for f in dataclasses.fields(settings)}
    assert shown["brokerPermission"] == "2" and shown["haSecretKey"] == "******"
    assert shown["brokerName"] == "broker-a" and shown["aclEnable"] == "false"


def test_properties_text_as_java_writes_it():
    assert parse_properties(b"! comment\nbrokerPermission:2\r\n") == {"brokerPermission": 2}
    with pytest.raises(Refused, match="restart"):
        parse_properties(b"flushDiskType=SYNC_FLUSH")
    with pytest.raises(Refused, match="brokerPermision is no setting of the node"):  # (misspelt: no restart helps)
        parse_properties(b"brokerPermision=4")

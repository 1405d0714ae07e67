"""The front's part in replication (actors.front_ha) without a node: a slave takes its master's
config files as the ha-client writes them, once a second, and once more on the turn its
promotion is seen; a master never does."""

from __future__ import annotations

from helpers import small_settings

from actors.front_ha import LOOK_EVERY_S, FrontReplication
from actors.ha_client import write_config
from actors.offsets import ConsumerOffsets, SubscriptionGroups
from actors.topics import TopicTable
from shm.control_block import ROLE_CODES


class Control:
    """The control block's role and config counters, as a plain dict."""

    def __init__(self, role: str):
        self.values = {"role": ROLE_CODES[role], "config_changes": 0, "topics_deleted": 0}

    def get(self, name: str) -> int:
        return self.values[name]

    def set(self, name: str, value: int) -> None:
        self.values[name] = value

    def superseded(self) -> int:  # (shm.control_block.ControlBlock's: never an old master here)
        return 0


def node(tmp_path, role: str):
    """A front's tables over a store, and the master's table the ha-client ships into it."""
    settings = small_settings(tmp_path / "store")
    config = settings.root / "config"
    topics = TopicTable(config, auto_create=False, default_queues=4)
    control = Control(role)
    replication = FrontReplication(settings, control, topics, SubscriptionGroups(config), ConsumerOffsets(config))
    master = TopicTable(tmp_path / "master", auto_create=False, default_queues=4)
    return replication, control, topics, master


def ship(master: TopicTable, replication: FrontReplication, topic: str) -> None:
    """The master makes `topic`; the ha-client writes the master's file on the slave."""
    master.create(topic, 4)
    write_config(replication.settings.root / "config" / "topics.json", master.path.read_bytes())


def slave(control) -> bool:
    return control.get("role") == ROLE_CODES["SLAVE"]


def test_a_slave_takes_its_masters_topics_once_a_second(tmp_path):
    replication, control, topics, master = node(tmp_path, "SLAVE")
    ship(master, replication, "First")
    replication.follow(100.0, slave(control))
    assert topics.get("First") is not None
    ship(master, replication, "Second")
    replication.follow(100.0 + LOOK_EVERY_S / 2, slave(control))
    assert topics.get("Second") is None  # (not looked at yet)
    replication.follow(100.0 + LOOK_EVERY_S, slave(control))
    assert topics.get("Second") is not None


def test_a_slave_tells_its_readers_of_a_topic_its_master_deleted(tmp_path):
    """The deletion floors in the master's topics.json: the slave's readers and dispatcher read
    them again (the control block's `topics_deleted`), only when they changed."""
    replication, control, topics, master = node(tmp_path, "SLAVE")
    ship(master, replication, "Doomed")
    replication.follow(100.0, slave(control))
    assert control.get("topics_deleted") == 0  # (a topic made: nothing to read again)
    master.log_span = lambda: (0, 4096)
    master.delete("Doomed")
    write_config(replication.settings.root / "config" / "topics.json", master.path.read_bytes())
    replication.follow(100.0 + LOOK_EVERY_S, slave(control))
    assert topics.get("Doomed") is None and topics.deleted == {"Doomed": 4096}
    assert control.get("topics_deleted") == 1


def test_a_promoted_slave_takes_what_came_in_its_last_second_before_serving_as_master(tmp_path):
    replication, control, topics, master = node(tmp_path, "SLAVE")
    replication.follow(100.0, True)
    ship(master, replication, "JustMade")  # shipped after the last look, promoted before the next
    control.set("role", ROLE_CODES["ASYNC_MASTER"])
    replication.follow(100.1, slave(control))
    assert topics.get("JustMade") is not None
    topics.create("Later", 2)  # the new master's own change keeps what its master had
    assert {"JustMade", "Later"} <= set(TopicTable(topics.path.parent, auto_create=False, default_queues=4).topics)


def test_a_master_never_takes_the_files_as_its_masters(tmp_path):
    replication, control, topics, master = node(tmp_path, "ASYNC_MASTER")
    ship(master, replication, "Foreign")
    for second in range(3):
        replication.follow(100.0 + second * LOOK_EVERY_S, slave(control))
    assert topics.get("Foreign") is None


def test_a_route_names_a_wildcard_listener_by_the_address_clients_reach(tmp_path):
    """(a client of another host told tcp://0.0.0.0:PORT connects to its own host)"""
    import dataclasses

    replication = node(tmp_path, "ASYNC_MASTER")[0]
    settings = replication.settings
    for listen, broker_ip, told in (("tcp://0.0.0.0:10911", "127.0.0.1", "tcp://127.0.0.1:10911"),
                                    ("tcp://0.0.0.0:10911", "10.1.2.3", "tcp://10.1.2.3:10911"),
                                    ("tcp://[::]:10911", "fd00::7", "tcp://[fd00::7]:10911"),
                                    ("tcp://10.9.9.9:10911", "10.1.2.3", "tcp://10.9.9.9:10911"),
                                    ("ipc:///run/mq.sock", "10.1.2.3", "ipc:///run/mq.sock")):
        replication.settings = dataclasses.replace(settings, listen=listen, brokerIP1=broker_ip)
        assert replication.brokers({}) == {"0": told}, listen
    slaves = {"ha-server": {"slaves": [{"brokerId": 1, "endpoint": "tcp://10.1.2.4:10921"}]}}
    assert replication.brokers(slaves) == {"0": "ipc:///run/mq.sock", "1": "tcp://10.1.2.4:10921"}

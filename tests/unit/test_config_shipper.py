"""The ha-server's ConfigShipper (actors.ha_config) without a link: which config files go to which slave, looked at
every LOOK_MS or at once on the front's word; two writes of one size within one tick of the
file system's clock still go."""

from __future__ import annotations

import os

from actors import config_files
from actors.ha_config import ConfigShipper


def write(directory, name: str, text: str, mtime_ns: int) -> None:
    config_files.persist(directory / name, {"value": text})
    os.utime(directory / name, ns=(mtime_ns, mtime_ns))  # (one tick: the same mtime for both writes)


def test_a_new_slave_gets_every_file_and_then_only_what_changed(tmp_path):
    shipper = ConfigShipper(tmp_path)
    write(tmp_path, "topics.json", "a", 10**18)
    write(tmp_path, "consumerOffset.json", "o", 10**18)
    assert shipper.look(0)
    assert sorted(name for name, _ in shipper.changed_for("slave-1")) == ["consumerOffset.json", "topics.json"]
    assert shipper.changed_for("slave-1") == []
    write(tmp_path, "consumerOffset.json", "p", 10**18 + 5)
    assert not shipper.look(ConfigShipper.LOOK_MS - 1)  # (not yet)
    assert shipper.look(ConfigShipper.LOOK_MS)
    assert [name for name, _ in shipper.changed_for("slave-1")] == ["consumerOffset.json"]


def test_the_fronts_word_looks_at_once_and_tells_same_size_writes_apart(tmp_path):
    shipper = ConfigShipper(tmp_path)
    write(tmp_path, "topics.json", "a", 10**18)
    assert shipper.look(0, announced=1)
    assert [name for name, _ in shipper.changed_for("slave-1")] == ["topics.json"]
    write(tmp_path, "topics.json", "b", 10**18)  # same size, same mtime
    assert shipper.look(1, force=True, announced=2)
    assert [(name, content) for name, content in shipper.changed_for("slave-1")] == \
        [("topics.json", (tmp_path / "topics.json").read_bytes())]
    assert b'"b"' in (tmp_path / "topics.json").read_bytes()


def test_a_forgotten_slave_gets_everything_again(tmp_path):
    shipper = ConfigShipper(tmp_path)
    write(tmp_path, "subscriptionGroup.json", "g", 10**18)
    shipper.look(0)
    assert shipper.is_new("slave-1")
    assert len(shipper.changed_for("slave-1")) == 1
    assert not shipper.is_new("slave-1")
    shipper.forget("slave-1")
    assert shipper.is_new("slave-1")
    assert len(shipper.changed_for("slave-1")) == 1

"""The front's part in replication (actors.front hosts it): what GET_BROKER_HA_STATUS and
HA_ROLE are answered, the brokers GET_ROUTEINFO_BY_TOPIC lists, and on a slave its master's
config files read as the ha-client writes them."""

from __future__ import annotations

import orjson

from node import protocol
from actors.ha_status import ha_status
from actors.offsets import ConsumerOffsets, SubscriptionGroups
from shm.control_block import ROLE_CODES


LOOK_EVERY_S = 1.0  # how often a slave re-reads its master's config files


class FrontReplication:
    def __init__(self, settings, control, topics, groups, offsets):
        self.settings = settings
        self.control = control
        self.topics, self.groups, self.offsets = topics, groups, offsets
        self.config_seen: dict[str, tuple[int, int]] = {}  # a slave: the master's config files read
        self.next_look = 0.0
        self.was_slave = self.is_slave()
        self.old_master = control.superseded()  # as last looked at (each turn, in `follow`): 0, or an old master

    def is_slave(self) -> bool:
        return self.control.get("role") == ROLE_CODES["SLAVE"]

    def answer(self, request: protocol.Request, actor_stats: dict) -> list[bytes] | None:
        """The reply frames of an HA request; None for a promotion, which the ha-client makes.
        `admin ha` from what the HA processes reported; `admin role` on a master switches
        between ASYNC_MASTER and SYNC_MASTER here."""
        if request.code == protocol.GET_BROKER_HA_STATUS:
            status = ha_status(self.settings, self.control, actor_stats)
            return [orjson.dumps(protocol.reply_header(request.opaque, "OK", **status))]
        role = request.header["role"]
        if self.is_slave():
            return protocol.error_reply(request.opaque, "OK", "already a slave") if role == "SLAVE" else None
        if role == "SLAVE":
            return protocol.error_reply(
                request.opaque, "SYSTEM_ERROR", "a master becomes a slave by a restart with brokerRole = SLAVE and "
                                                "haMasterAddress (its log is then fenced against its new master)")
        self.control.set("role", ROLE_CODES[role])
        return [orjson.dumps(protocol.reply_header(request.opaque, "OK", role=role))]

    def superseded(self) -> str:
        """Why an old master takes no sends (actors.ha_server: a would-be slave's history is later)."""
        return (f"this node is an old master: another node of its group was a master in epoch "
                f"{self.old_master}, past this node's history (mqnode admin ha); promote that node "
                f"if it is not the master, and restart this one as its slave")

    def brokers(self, actor_stats: dict) -> dict[str, str]:
        """GET_ROUTEINFO_BY_TOPIC's brokerAddrs: brokerId -> client endpoint of this node, its
        master (as its welcome said) or its slaves (as their hellos said)."""
        s, slave = self.settings, self.is_slave()
        brokers = {str(s.brokerId if slave else 0): s.client_endpoint}
        for follower in actor_stats.get("ha-server", {}).get("slaves", []):
            if follower.get("brokerId") is not None and follower.get("endpoint"):
                brokers[str(follower["brokerId"])] = follower["endpoint"]
        master = actor_stats.get("ha-client", {}).get("masterEndpoint")
        if master and slave:
            brokers["0"] = master
        return dict(sorted(brokers.items()))

    def config_persisted(self) -> None:
        """topics.json or subscriptionGroup.json was written: the ha-server ships them before any
        record written after (so a slave holding a topic's messages holds the topic)."""
        self.control.set("config_changes", self.control.get("config_changes") + 1)
        self._tell_deletions()

    def _tell_deletions(self) -> None:
        """The readers and the dispatcher read the deletion floors again when they changed (a
        topic deleted here, or on a slave at its master), not at every change of the tables:
        topics.json of 10,000 topics takes ~40 ms to read."""
        if self.topics.floors_changed():
            self.control.set("topics_deleted", self.control.get("topics_deleted") + 1)

    def follow(self, now: float, slave: bool) -> None:
        """Each turn of the front: on a slave, its master's config files once a second; and once
        more on the turn a promotion is first seen, so what the ha-client wrote in the second
        before it is not missed (the new master would serve, and on its next change persist,
        tables without it). `slave`: whether the control block says this node is one now. And
        on a master, whether it is an old one (`old_master`, which the turn's sends read)."""
        if (slave and now >= self.next_look) or (self.was_slave and not slave):
            self.next_look = now + LOOK_EVERY_S
            self.follow_master_config()
        self.was_slave = slave
        self.old_master = self.control.superseded()  # (a turn's sends read this, not two slots each)

    def follow_master_config(self) -> None:
        """A slave: the topics, groups and consumer offsets its master has, as the ha-client
        writes them, re-read when they change; the tables are updated in place (the router
        holds them)."""
        config = self.settings.root / "config"
        for name in ("topics.json", "subscriptionGroup.json", "consumerOffset.json"):
            try:
                info = (config / name).stat()
            except OSError:
                continue
            version = (info.st_mtime_ns, info.st_size)
            if self.config_seen.get(name) == version:
                continue
            self.config_seen[name] = version
            if name == "topics.json":
                self.topics.load()
                self._tell_deletions()
            elif name == "subscriptionGroup.json":
                fresh = SubscriptionGroups(config)
                self.groups.groups, self.groups.counter = fresh.groups, fresh.counter
            else:
                self.offsets.table, self.offsets.dirty = ConsumerOffsets(config).table, False

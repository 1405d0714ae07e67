"""The name service's route table, without I/O: RocketMQ 4.9's RouteInfoManager in mqnode's terms.

Broker groups register (REGISTER_BROKER, every `registerNameServerPeriod` and whenever their
topics change); clients ask for a topic's route (GET_ROUTEINFO_BY_TOPIC) and operators for the
cluster (GET_BROKER_CLUSTER_INFO). The tables, as RocketMQ keeps them:

  brokers   brokerName -> {cluster, brokerName, brokerAddrs: {brokerId (text): address}}
  queues    topic -> brokerName -> {readQueueNums, writeQueueNums, perm, topicSysFlag}
  clusters  cluster -> brokerNames
  live      address -> {lastUpdateTimestamp (ms), brokerName, brokerId, haServerAddr, grpcAddr, dataVersion, ...}
  masters   brokerName -> {address, haServerAddr, role, lastUpdateTimestamp}: the master it last registered

Only a master (brokerId 0) says which topics its group holds; each of its registrations replaces
the group's queue data (a topic it no longer lists leaves the group's route). A slave promoted to
master registers as brokerId 0 with its own address, which replaces the old master's. An address
not heard from for `expiry_ms` (RocketMQ's 120 s) leaves the tables; a group with no address
left leaves every route. `masters` (mqnode's own) outlives both: which node a group's master was
when its nodes all stopped (a `cluster down` unregisters each) is what the next start of each
asks (node.server.cluster.role_now), so a slave promoted before stays the master, and the old
master stays its slave, whatever the cluster's toml says.

Crash policy: `snapshot()` is what the shell writes to its file (node.server.namesrv) and
`restore()` reads back; a restored address counts as heard from at the restore, so a group that
is gone for good leaves `expiry_ms` after the restart, and one alive re-registers well within.
"""

from __future__ import annotations

import re

MASTER_ID = 0
EXPIRY_MS = 120_000
MAX_BROKERS = 1024  # groups and addresses the table holds: a bound on a table anyone may register into
MAX_TOPICS_PER_BROKER = 100_000
NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.:-]{1,127}$")  # (a topic's characters; '.' and ':' for addresses)


class RegistrationRefused(ValueError):
    """A registration that cannot go into the table: answered with its remark."""


def _name(value, what: str) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.match(value):
        raise RegistrationRefused(f"{what} must be 1-127 characters of [%|a-zA-Z0-9_.:-], not {value!r}")
    return value


def _address(value, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 255 or any(c.isspace() for c in value):
        raise RegistrationRefused(f"{what} must be an address (host:port or a ZeroMQ endpoint), not {value!r}")
    return value


def _host_port(value: str, what: str) -> str:
    """`value` if it is `host:port` (what proxies route RocketMQ 5 clients to) or empty."""
    if not value:
        return ""
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not (host and port.isdigit() and 0 < int(port) < 65536):
        raise RegistrationRefused(f"{what} must be host:port, not {value!r}")
    return _address(value, what)


def _queue_data(name: str, config) -> dict:
    if not isinstance(config, dict):
        raise RegistrationRefused(f"topic {name}: its config must be an object")
    out = {}
    for field in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag"):
        value = config.get(field, 0 if field == "topicSysFlag" else None)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
            raise RegistrationRefused(f"topic {name}: {field} must be an integer 0..65535, not {value!r}")
        out[field] = value
    return out


class RouteTable:
    def __init__(self, *, expiry_ms: int = EXPIRY_MS):
        self.expiry_ms = expiry_ms
        self.brokers: dict[str, dict] = {}
        self.queues: dict[str, dict[str, dict]] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, dict] = {}
        self.masters: dict[str, dict] = {}  # brokerName -> its last master (see the module's docstring)
        self.version = 0  # +1 for every change of the tables (the shell persists when it moved)
        self.registrations = self.expired = 0
        self.stale_masters = 0  # registrations of a master older than its group's (answered supersededBy)

    # -- brokers ------------------------------------------------------------------------------------

    def register(self, header: dict, body: dict | None, now_ms: int) -> dict:
        """One REGISTER_BROKER: the reply's fields (the group's master and its HA address, for a
        slave). Raises RegistrationRefused for a malformed one."""
        name = _name(header.get("brokerName"), "brokerName")
        cluster = _name(header.get("clusterName"), "clusterName")
        address = _address(header.get("brokerAddr"), "brokerAddr")
        broker_id = header.get("brokerId")
        if not isinstance(broker_id, int) or isinstance(broker_id, bool) or broker_id < 0:
            raise RegistrationRefused(f"brokerId must be an integer >= 0, not {broker_id!r}")
        wrapper = (body or {}).get("topicConfigSerializeWrapper") or {}
        table = wrapper.get("topicConfigTable") or {}
        if not isinstance(table, dict) or len(table) > MAX_TOPICS_PER_BROKER:
            raise RegistrationRefused(f"topicConfigTable must be an object of at most {MAX_TOPICS_PER_BROKER} topics")
        queues = {_name(topic, "a topic"): _queue_data(topic, config) for topic, config in table.items()} \
            if broker_id == MASTER_ID else None
        if name not in self.brokers and len(self.brokers) >= MAX_BROKERS or \
                address not in self.live and len(self.live) >= MAX_BROKERS:
            raise RegistrationRefused(f"the name service holds {MAX_BROKERS} broker groups or addresses at most")
        epoch = header.get("epoch")  # mqnode's; a RocketMQ broker sends none
        if epoch is not None and (type(epoch) is not int or epoch < -1):
            raise RegistrationRefused(f"epoch must be an integer >= -1, not {epoch!r}")
        info = self._live_info(header, wrapper, name, cluster, broker_id, epoch, now_ms)  # (checks grpcAddr)
        self.registrations += 1
        newer = self._newer_master(name, address, epoch) if broker_id == MASTER_ID else None
        if newer is not None:  # an old master: heard from, but the group's master and its topics stay the newer one's
            self.live[address] = info
            self.stale_masters += 1
            return {"masterAddr": newer, "haServerAddr": self.live[newer]["haServerAddr"],
                    "supersededBy": self.live[newer]["epoch"]}
        changed = self._place(name, cluster, address, broker_id)
        if queues is not None:
            changed |= self._queues_of(name, queues)
        previous = self.live.get(address, {})
        self.live[address] = info
        grpc = info["grpcAddr"]
        if changed or previous.get("brokerId") != broker_id or previous.get("grpcAddr", "") != grpc:
            self.version += 1
        if broker_id == MASTER_ID:
            changed = self._master_of(name, address, self.live[address], now_ms)
            self.version += changed
        master = self.brokers[name]["brokerAddrs"].get(str(MASTER_ID), "")
        return {"masterAddr": master, "haServerAddr": self.live.get(master, {}).get("haServerAddr", "")}

    @staticmethod
    def _live_info(header: dict, wrapper: dict, name: str, cluster: str, broker_id: int, epoch, now_ms: int) -> dict:
        return {"lastUpdateTimestamp": now_ms, "brokerName": name, "brokerId": broker_id, "cluster": cluster,
                "haServerAddr": header.get("haServerAddr", ""),
                "grpcAddr": _host_port(header.get("grpcAddr") or "", "grpcAddr"),
                "dataVersion": wrapper.get("dataVersion"), "role": header.get("role", ""),
                "maxOffset": header.get("maxOffset", 0), "epoch": epoch}

    def _newer_master(self, name: str, address: str, epoch) -> str | None:
        """The live master of group `name` other than `address` that registered a later epoch
        than `epoch`: the registering master is an old one (its slave was promoted while it was
        cut off). None when either has no epoch (a RocketMQ broker): the later registration wins."""
        holder = self.brokers.get(name, {}).get("brokerAddrs", {}).get(str(MASTER_ID))
        info = self.live.get(holder) if holder != address else None
        if info is None or info["brokerId"] != MASTER_ID:
            return None
        later = info.get("epoch")
        return holder if type(epoch) is int and type(later) is int and later > epoch else None

    def _master_of(self, name: str, address: str, info: dict, now_ms: int) -> bool:
        """Remember `address` as group `name`'s master; whether that changed what is remembered."""
        master = {"address": address, "haServerAddr": info["haServerAddr"], "role": info["role"]}
        before = self.masters.get(name, {})
        self.masters[name] = master | {"lastUpdateTimestamp": now_ms}
        if len(self.masters) > MAX_BROKERS:  # (groups long gone go first)
            del self.masters[min(self.masters, key=lambda n: self.masters[n]["lastUpdateTimestamp"])]
        return {k: before.get(k) for k in master} != master

    def _place(self, name: str, cluster: str, address: str, broker_id: int) -> bool:
        group = self.brokers.setdefault(name, {"cluster": cluster, "brokerName": name, "brokerAddrs": {}})
        addrs = group["brokerAddrs"]
        before = dict(addrs), group["cluster"]
        for other in [key for key, value in addrs.items() if value == address and key != str(broker_id)]:
            del addrs[other]  # a slave promoted (or a master demoted): one id an address
        addrs[str(broker_id)] = address
        if group["cluster"] != cluster:
            self.clusters.get(group["cluster"], set()).discard(name)
            group["cluster"] = cluster
        self.clusters.setdefault(cluster, set()).add(name)
        return (dict(addrs), group["cluster"]) != before

    def _queues_of(self, name: str, queues: dict[str, dict]) -> bool:
        changed = False
        for topic in [t for t, groups in self.queues.items() if name in groups and t not in queues]:
            del self.queues[topic][name]
            changed = True
            if not self.queues[topic]:
                del self.queues[topic]
        for topic, data in queues.items():
            groups = self.queues.setdefault(topic, {})
            if groups.get(name) != data:
                groups[name] = data
                changed = True
        return changed

    def unregister(self, header: dict) -> bool:
        """UNREGISTER_BROKER: the address leaves its group (a stopping node). False if unknown."""
        address = header.get("brokerAddr")
        if address not in self.live:
            return False
        self._forget(address)
        return True

    def expire(self, now_ms: int) -> list[str]:
        """Forget the addresses not heard from for `expiry_ms`: the ones forgotten."""
        gone = [a for a, info in self.live.items() if now_ms - info["lastUpdateTimestamp"] > self.expiry_ms]
        for address in gone:
            self._forget(address)
            self.expired += 1
        return gone

    def _forget(self, address: str) -> None:
        info = self.live.pop(address)
        name = info["brokerName"]
        group = self.brokers.get(name)
        if group is not None:
            addrs = group["brokerAddrs"]
            for key in [k for k, v in addrs.items() if v == address]:
                del addrs[key]
            if not addrs:  # the group is gone: out of every route and its cluster
                del self.brokers[name]
                self.clusters.get(group["cluster"], set()).discard(name)
                if not self.clusters.get(group["cluster"]):
                    self.clusters.pop(group["cluster"], None)
                for topic in [t for t, groups in self.queues.items() if name in groups]:
                    del self.queues[topic][name]
                    if not self.queues[topic]:
                        del self.queues[topic]
        self.version += 1

    # -- what clients and operators ask ---------------------------------------------------------------

    def route(self, topic: str) -> dict | None:
        """RocketMQ's TopicRouteData for `topic`, or None when no live group holds it."""
        groups = self.queues.get(topic)
        if not groups:
            return None
        names = sorted(name for name in groups if name in self.brokers)
        if not names:
            return None
        return {"queueDatas": [{"brokerName": name, **groups[name]} for name in names],
                "brokerDatas": [self._broker_data(name) for name in names]}

    def _broker_data(self, name: str) -> dict:
        """RocketMQ's BrokerData, and where the group's addresses serve gRPC (`grpcAddrs`, by
        brokerId, for those that registered one: mqnode's own field, which its proxies route by)."""
        group = self.brokers[name]
        grpc = {key: self.live[address]["grpcAddr"] for key, address in group["brokerAddrs"].items()
                if self.live.get(address, {}).get("grpcAddr")}
        return group | {"grpcAddrs": grpc} if grpc else group

    def cluster_info(self) -> dict:
        return {"brokerAddrTable": dict(sorted(self.brokers.items())),
                "clusterAddrTable": {c: sorted(names) for c, names in sorted(self.clusters.items())},
                "brokerLiveTable": dict(sorted(self.live.items())),
                "lastMasterTable": dict(sorted(self.masters.items()))}

    def topics(self) -> list[str]:
        return sorted(self.queues)

    def statistics(self) -> dict:
        return {"brokerGroups": len(self.brokers), "addresses": len(self.live), "topics": len(self.queues),
                "registrations": self.registrations, "staleMasters": self.stale_masters, "expired": self.expired,
                "version": self.version}

    # -- the shell's file ---------------------------------------------------------------------------

    def snapshot(self) -> dict:
        return {"brokers": self.brokers, "queues": self.queues, "live": self.live, "masters": self.masters}

    def restore(self, data: dict, now_ms: int) -> None:
        """The tables of `snapshot()`, every address heard from now (see the module's docstring)."""
        self.brokers = {name: {"cluster": g["cluster"], "brokerName": name, "brokerAddrs": dict(g["brokerAddrs"])}
                        for name, g in data.get("brokers", {}).items()}
        self.queues = {t: dict(groups) for t, groups in data.get("queues", {}).items()}
        self.live = {a: dict(info, lastUpdateTimestamp=now_ms) for a, info in data.get("live", {}).items()}
        self.masters = {name: dict(master) for name, master in data.get("masters", {}).items()}
        self.clusters = {}
        for name, group in self.brokers.items():
            self.clusters.setdefault(group["cluster"], set()).add(name)
        self.version += 1

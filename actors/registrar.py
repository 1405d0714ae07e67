"""register: the node's registrations with its name services (RocketMQ's BrokerOuterAPI.registerBrokerAll).

Every `registerNameServerPeriod` ms, and within a second of its role, its brokerPermission or its topic table changing (the front
persists `config/topics.json`, RocketMQ's TopicConfigSerializeWrapper: the table and its data
version, sent as they are), the node sends REGISTER_BROKER to each name service of
`namesrvAddr`: its group (`brokerName`, `brokerClusterName`), its topics (each with the node's
`brokerPermission` as its perm while that is not 6, as RocketMQ registers them), its client address, its HA
address, its gRPC proxy's address (`grpcAddr`, mqnode's own field), its id (0 while it is a master: a slave promoted by `admin role` registers as its
group's master from the next registration on), its written offset and its epoch (mqnode's: the
name service keeps a group's master slot for the later epoch, and tells an older master so). At
stop it unregisters, and so does an old master (`ControlBlock.superseded`) for as long as it runs.

A shell without a process of its own: the topology hosts it in the clean process's loop, so it
gives its turn as `poll_items` / `timeout_ms` / `step` (actors.host). It reads only files and
the control block; one DEALER socket per name service, whose answers it counts.
"""

from __future__ import annotations

import logging
import time

import orjson
import zmq

from actors import config_files
from actors.base import Actor, incoming, socket
from node import protocol
from shm.control_block import ROLE_CODES, ROLE_NAMES
from shm.epochs import EpochFile

log = logging.getLogger("mqnode")

LOOK_EVERY_S = 1.0  # how often the topic table's file is looked at
MAX_REPLIES_PER_TURN = 64
DEFAULT_TOPIC = "TBW102"
READ_AND_WRITE = 6  # brokerPermission's default: each topic is registered with its own perm


def client_address(settings) -> str:
    """The address a route gives clients for this node: `host:port` for tcp (RocketMQ's form)."""
    return settings.client_endpoint.removeprefix("tcp://")


def ha_address(settings) -> str:
    return protocol.host_port(settings.advertised(settings.ha_host), settings.ha_port)


def grpc_address(settings) -> str:
    """Where RocketMQ 5 clients reach this node's gRPC proxy (`host:port`; "" when it is off):
    the name service hands it to the other nodes' proxies for their routes."""
    if not settings.grpc_port:
        return ""
    return protocol.host_port(settings.advertised(settings.grpc_host), settings.grpc_port)


class Registrar(Actor):
    name = "registrar"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.endpoints_ns = protocol.namesrv_endpoints(settings.namesrvAddr)
        self.topics_path = settings.root / "config" / "topics.json"
        self.sockets: list[zmq.Socket] = []
        self.topics_version: tuple | None = None  # (the topic file's mtime and size, the role) last registered
        self.next_look = self.next_register = 0.0
        self.opaque = 0
        self.sent = self.answered = self.refused = 0
        self.last_answer: dict[str, dict] = {}  # endpoint -> {"status", "at"}
        self.left = False  # an old master's unregistration sent (`_leave`)

    def open(self) -> None:
        for endpoint in self.endpoints_ns:
            s = socket(self.context, zmq.DEALER, hwm=16)
            protocol.ipv6_ready(s, endpoint)
            s.connect(endpoint)
            self.sockets.append(s)

    def poll_items(self) -> list:
        return [(s, zmq.POLLIN) for s in self.sockets]

    def timeout_ms(self) -> int:
        return max(0, min(50, int((min(self.next_look, self.next_register) - time.monotonic()) * 1000)))

    def step(self, events: set) -> None:
        for endpoint, s in zip(self.endpoints_ns, self.sockets):
            if s in events:
                for frames in incoming(s, MAX_REPLIES_PER_TURN):
                    self._answered(endpoint, frames)
        if self.control.superseded():
            return self._leave()
        now = time.monotonic()
        if now >= self.next_look:
            self.next_look = now + LOOK_EVERY_S
            # a promotion, or a change of brokerPermission, registers at once too
            version = (self._topics_version(), self.control.get("role"), self.control.get("broker_permission"))
            if version != self.topics_version:
                self.topics_version = version
                self.next_register = now  # RocketMQ registers at once after a topic change
        if now >= self.next_register:
            self.next_register = now + self.settings.registerNameServerPeriod / 1000
            self.register()

    def _topics_version(self) -> tuple[int, int] | None:
        try:
            info = self.topics_path.stat()
            return info.st_mtime_ns, info.st_size
        except OSError:
            return None

    def registration(self) -> tuple[dict, bytes]:
        """REGISTER_BROKER's header and body as this node stands now."""
        s = self.settings
        master = self.control.get("role") != ROLE_CODES["SLAVE"]
        wrapper = config_files.read(self.topics_path) or {}
        header = {"code": protocol.REGISTER_BROKER, "brokerName": s.brokerName, "clusterName": s.brokerClusterName,
                  "brokerAddr": client_address(s), "haServerAddr": ha_address(s), "grpcAddr": grpc_address(s),
                  "brokerId": 0 if master else max(s.brokerId, 1),
                  "role": ROLE_NAMES.get(self.control.get("role"), "UNKNOWN"),
                  "maxOffset": self.control.get("written"), "epoch": EpochFile(s.root).current}
        table = dict(wrapper.get("topicConfigTable") or {})
        if s.autoCreateTopicEnable:  # RocketMQ's TBW102: producers send a topic nobody has yet to the groups that create it
            table.setdefault(DEFAULT_TOPIC, {"topicName": DEFAULT_TOPIC, "readQueueNums": s.defaultTopicQueueNums,
                                             "writeQueueNums": s.defaultTopicQueueNums, "perm": 6, "topicSysFlag": 0})
        permission = self.control.get("broker_permission")
        if permission != READ_AND_WRITE:  # RocketMQ's: each topic registered with the node's permission instead
            table = {name: config | {"perm": permission} for name, config in table.items()}
        body = {"topicConfigSerializeWrapper": {"topicConfigTable": table,
                                                "dataVersion": wrapper.get("dataVersion") or {}}}
        return header, orjson.dumps(body)

    def register(self) -> None:
        header, body = self.registration()
        self._send_all(header, body)

    def _send_all(self, header: dict, body: bytes | None) -> None:
        for s in self.sockets:
            self.opaque += 1
            try:
                s.send_multipart(protocol.encode_request(header | {"opaque": self.opaque}, body), zmq.NOBLOCK)
                self.sent += 1
            except zmq.Again:
                pass  # not connected (the name service is down): the next period tries again

    def _answered(self, endpoint: str, frames: list[bytes]) -> None:
        try:
            reply = orjson.loads(frames[0])
        except (orjson.JSONDecodeError, IndexError):
            return
        self.answered += 1
        status = reply.get("status") if isinstance(reply, dict) else None
        if status != "OK":
            self.refused += 1
        else:
            self._superseded(endpoint, reply.get("supersededBy"))
        self.last_answer[endpoint] = {"status": status, "remark": reply.get("remark", "") if status != "OK" else "",
                                      "at": int(time.time() * 1000)}

    def _superseded(self, endpoint: str, epoch) -> None:
        """The name service holds another master of this group, registered with a later epoch
        (a slave promoted while this node was cut off from it): this is an old master."""
        if type(epoch) is int and epoch > self.control.get("superseded_in_routes") and \
                self.control.get("role") != ROLE_CODES["SLAVE"]:
            log.error("register: the name service %s holds this group's master at epoch %d, past this node's: this "
                      "is an old master; client sends are refused until it restarts as that master's slave",
                      endpoint, epoch)
            self.control.set("superseded_in_routes", epoch)

    def _leave(self) -> None:
        """An old master (`ControlBlock.superseded`: a would-be slave's history is later, or a name
        service holds a later master) leaves the routes and registers no more until it restarts:
        it takes no sends, and were it to go on registering as its group's master, the name
        services would remember it as the master (`lastMasterTable`) over the node promoted in
        its place."""
        if not self.left:
            self.left = True
            log.warning("register: this node is an old master: out of the name services' routes until it restarts")
            self._unregister()

    def _unregister(self) -> None:
        s = self.settings
        self._send_all({"code": protocol.UNREGISTER_BROKER, "brokerName": s.brokerName, "clusterName": s.brokerClusterName,
                        "brokerAddr": client_address(s), "brokerId": s.brokerId}, None)

    def drain(self) -> None:
        """Leave the routes at once (a stopping node), rather than 120 s later."""
        self._unregister()
        time.sleep(0.05)  # (the sockets' linger is 0: a moment for the frames to leave)

    def statistics(self) -> dict:
        return super().statistics() | {"namesrv": self.endpoints_ns, "registrationsSent": self.sent,
                                       "answered": self.answered, "refused": self.refused,
                                       "lastAnswer": self.last_answer}

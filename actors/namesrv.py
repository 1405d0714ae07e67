"""The name service's shell: a ROUTER socket on its `listen` endpoint, the node's framing
(node.protocol), the route table (actors.namesrv_core) and the file it is kept in.

Not a node's service: it has no store and no control block, so it is not an actors.base.Actor;
node.server.namesrv hosts it in a Ray actor of its own (supervised, restarted where it was) and
gives it a directory for its file. The table survives a restart through that file, written (to
a temporary name, then renamed) at most once a second after it changed; the next registrations
(every `registerNameServerPeriod`) bring back anything the last second lost.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import orjson
import zmq

from actors import config_files
from actors.base import incoming, socket, wait_readable
from actors.namesrv_core import RegistrationRefused, RouteTable
from node import protocol

POLL_MS = 200
MAX_REQUESTS_PER_TURN = 512
EXPIRE_EVERY_MS = 10_000  # RocketMQ's scanNotActiveBroker period
PERSIST_EVERY_MS = 1_000
TABLE_FILE = "namesrv.json"
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a registration of 100,000 topics is ~15 MiB


def wall_ms() -> int:
    return int(time.time() * 1000)


class Namesrv:
    label = "namesrv"

    def __init__(self, listen: str, directory: str | Path, *, expiry_ms: int | None = None, clock=wall_ms):
        self.listen = listen
        self.directory = Path(directory)
        self.clock = clock
        self.table = RouteTable(**({"expiry_ms": expiry_ms} if expiry_ms else {}))
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.started_at = time.time()
        self.requests = self.refused = 0
        self.persisted_version = 0
        self.next_expire = self.next_persist = 0
        self.socket: zmq.Socket | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def run(self) -> None:
        self._restore()
        self.socket = socket(zmq.Context.instance(), zmq.ROUTER)
        self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # (a larger frame drops its connection: never held)
        protocol.ipv6_ready(self.socket, self.listen)
        self.socket.bind(self.listen)
        self.ready.set()
        items = [(self.socket, zmq.POLLIN)]
        try:
            while not self.stopping.is_set():
                if wait_readable(items, POLL_MS):
                    for frames in incoming(self.socket, MAX_REQUESTS_PER_TURN):
                        self._answer(frames)
                self._housekeeping(self.clock())
            self._persist()
        finally:
            self.socket.close(0)

    def stop(self) -> None:
        self.stopping.set()

    def _restore(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / TABLE_FILE
        if path.exists():
            self.table.restore(orjson.loads(path.read_bytes()), self.clock())
            self.persisted_version = self.table.version

    def _persist(self) -> None:
        if self.table.version == self.persisted_version:
            return
        version = self.table.version
        if config_files.write(self.directory / TABLE_FILE, orjson.dumps(self.table.snapshot(), default=sorted)):
            self.persisted_version = version  # (else a full disk: again at the next period)

    def _housekeeping(self, now: int) -> None:
        if now >= self.next_expire:
            self.next_expire = now + EXPIRE_EVERY_MS
            self.table.expire(now)
        if now >= self.next_persist:
            self.next_persist = now + PERSIST_EVERY_MS
            self._persist()

    # -- requests -----------------------------------------------------------------------------------

    def _answer(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return  # (no identity and request: nothing to answer to)
        peer, rest = frames[0], frames[1:]
        self.requests += 1
        try:
            request = protocol.decode_request(rest)
            reply = self.reply_to(request)
        except protocol.ProtocolError as e:
            self.refused += 1
            reply = protocol.reply_header(protocol.opaque_of(rest), "SYSTEM_ERROR", str(e))
        try:
            self.socket.send_multipart([peer, orjson.dumps(reply, default=sorted)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # the peer is gone or not reading: it asks again

    def reply_to(self, request: protocol.Request) -> dict:
        header, code, opaque = request.header, request.code, request.opaque
        if code == protocol.REGISTER_BROKER:
            try:
                body = orjson.loads(request.body) if request.body else None
                if body is not None and not isinstance(body, dict):
                    raise RegistrationRefused("the body must be a JSON object")
                return protocol.reply_header(opaque, "OK", **self.table.register(header, body, self.clock()))
            except (orjson.JSONDecodeError, RegistrationRefused) as e:
                self.refused += 1
                return protocol.reply_header(opaque, "INVALID_PARAMETER", str(e))
        if code == protocol.UNREGISTER_BROKER:
            self.table.unregister(header)
            return protocol.reply_header(opaque, "OK")
        if code == protocol.GET_ROUTEINFO_BY_TOPIC:
            route = self.table.route(header.get("topic")) if isinstance(header.get("topic"), str) else None
            if route is None:
                return protocol.reply_header(opaque, "TOPIC_NOT_EXIST",
                                             f"no broker group of this name service holds topic {header.get('topic')!r}")
            return protocol.reply_header(opaque, "OK", **route)
        if code == protocol.GET_BROKER_CLUSTER_INFO:
            return protocol.reply_header(opaque, "OK", **self.table.cluster_info())
        if code == protocol.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            return protocol.reply_header(opaque, "OK", topicList=self.table.topics())
        return protocol.reply_header(opaque, "REQUEST_CODE_NOT_SUPPORTED",
                                     f"request code {code} is not one a name service serves")

    def statistics(self) -> dict:
        return {"actor": self.label, "pid": os.getpid(), "endpoint": self.listen,
                "uptimeSeconds": round(time.time() - self.started_at, 1), "requests": self.requests,
                "refused": self.refused, **self.table.statistics()}

"""The node asking itself: one DEALER on the node's client endpoint, answers matched by opaque."""

from __future__ import annotations

import threading

import orjson
import zmq

from node import protocol
from node.security import Credentials


class NodeAsker:
    """Requests the node makes of itself over its own client endpoint (the launcher's readiness
    probes, /metrics' GET_BROKER_RUNTIME_INFO and friends), one at a time: scrapes may come
    concurrently and one DEALER socket is not thread-safe. Signed and secured with the node's
    own identity (actors.guard) when the ACL or CURVE is on."""

    def __init__(self, endpoint: str, credentials: Credentials, *, timeout_ms: int = 5000):
        self.endpoint, self.timeout_ms = endpoint, timeout_ms
        self.credentials = credentials  # the node's own (actors.guard), for the ACL and CURVE
        self.lock = threading.Lock()
        self.context = zmq.Context.instance()
        self.socket = None
        self.opaque = 0

    def ask(self, header: dict) -> dict:
        with self.lock:
            if self.socket is None:
                self.socket = self.context.socket(zmq.DEALER)
                self.socket.setsockopt(zmq.LINGER, 0)
                self.credentials.secure(self.socket)
                protocol.ipv6_ready(self.socket, self.endpoint)
                self.socket.connect(self.endpoint)
            self.opaque += 1
            header = header | {"opaque": self.opaque}
            self.socket.send(orjson.dumps(self.credentials.sign(header) if self.credentials.signs else header))
            while self.socket.poll(self.timeout_ms):
                reply = orjson.loads(self.socket.recv_multipart()[0])
                if reply.get("opaque") == self.opaque:  # (a late answer to a timed-out ask is skipped)
                    return reply
            self.socket.close(0)  # no answer: a fresh socket for the next scrape
            self.socket = None
            raise TimeoutError(f"the node did not answer code {header['code']} within {self.timeout_ms} ms")

    def close(self) -> None:
        with self.lock:
            if self.socket is not None:
                self.socket.close(0)
                self.socket = None

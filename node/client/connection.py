"""A client's DEALER connection, driven by the event loop itself rather than through zmq.asyncio.

zmq.asyncio wraps every send and receive in a future and reads socket events through Flag
enums. Measured on this machine against a running node (docs/performance.md), a request and its
reply cost the client ~110 µs of CPU with 8 in flight and ~200 µs alone; a plain socket read
from the loop's reader callback costs ~55-70 and ~90-140 µs, and the round trip of a request the
front answers itself drops from ~340 to ~170 µs.

A reply never comes for a request the node took before its connection dropped (a front killed
and restarted: ZeroMQ reconnects underneath, and the new front knows nothing of it). A socket
monitor reports the drop (EVENT_DISCONNECTED), and `on_lost` lets the owner fail those requests
then, instead of at their deadlines (for a long poll, 15 s and more away).

ZMQ_FD is edge-triggered: it says that the socket's events may have changed, not that a message
is waiting. So the reader callback receives while ZMQ_EVENTS shows POLLIN (at most MAX_READ at a
time, then it yields the loop a turn), and every send looks at ZMQ_EVENTS afterwards: a send can
take the edge of a reply that arrived meanwhile, and nothing would wake the reader for it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import zmq
from zmq.backend import zmq_poll

from node import protocol
from node.client.errors import BadEndpoint
from node.frames import NOBLOCK, recv_frames, send_frames

MAX_READ = 256  # replies handled per reader callback before other callbacks get a turn
MAX_DRAIN_ROUNDS = 1024  # MAX_READ rounds read before the requests in flight at a drop are failed
FULL_RETRY_S = 0.001  # a full send queue is tried again this often, until the caller's deadline


class Connection:
    """One DEALER socket on the running loop; `on_frames` gets each reply's frames."""

    def __init__(self, context: zmq.Context, endpoint: str, on_frames: Callable[[list[bytes]], None], *,
                 hwm: int = 100_000, secure: Callable[[zmq.Socket], None] | None = None,
                 on_lost: Callable[[], None] | None = None):
        # A plain socket even when `context` is a zmq.asyncio.Context (both share libzmq's context).
        self.socket = zmq.Socket(context, zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTING_ID, b"p" + uuid.uuid4().bytes)  # stable across reconnects
        self.socket.setsockopt(zmq.SNDHWM, hwm)
        self.socket.setsockopt(zmq.RCVHWM, hwm)
        if secure is not None:  # CURVE's keys, before the connection's handshake
            secure(self.socket)
        try:
            address = protocol.broker_endpoint(endpoint)  # (host:port too: RocketMQ's form, a route's)
            protocol.ipv6_ready(self.socket, address)
            self.socket.connect(address)
        except zmq.ZMQError as e:
            self.socket.close()
            raise BadEndpoint(f"{endpoint!r} is no endpoint of a node (tcp://HOST:PORT, HOST:PORT or ipc://PATH): "
                              f"{e.strerror}") from None
        self.on_frames = on_frames
        self.loop = asyncio.get_running_loop()
        self.fd = self.socket.getsockopt(zmq.FD)
        self.poll_items = [(self.socket, zmq.POLLIN)]
        self.loop.add_reader(self.fd, self._readable)
        self.read_scheduled = False
        self.closed = False
        self.monitor: zmq.Socket | None = None
        if on_lost is not None:
            self._watch(context, on_lost)

    def _watch(self, context: zmq.Context, on_lost: Callable[[], None]) -> None:
        address = f"inproc://mqnode-monitor-{uuid.uuid4().hex}"
        self.socket.monitor(address, zmq.EVENT_DISCONNECTED)
        self.monitor = zmq.Socket(context, zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)
        self.on_lost = on_lost
        self.monitor_items = [(self.monitor, zmq.POLLIN)]
        self.monitor_fd = self.monitor.getsockopt(zmq.FD)
        self.loop.add_reader(self.monitor_fd, self._monitor_readable)
        self._monitor_readable()  # an edge comes only after a look has found the pipe empty

    def _monitor_readable(self) -> None:
        lost = False
        for _ in range(MAX_READ):  # (edge-triggered, as the socket's own FD)
            if self.closed or not zmq_poll(self.monitor_items, 0):
                break
            self.monitor.recv_multipart(zmq.NOBLOCK)  # the only event asked for: a drop
            lost = True
        else:
            self.loop.call_soon(self._monitor_readable)
        if lost:
            for _ in range(MAX_DRAIN_ROUNDS):  # replies that came before the drop are answers still
                if not self._read():
                    break
            self.on_lost()

    def send(self, frames: list[bytes]) -> bool:
        """Queue `frames` without blocking; False when the connection's queue is full."""
        try:
            send_frames(self.socket, frames, NOBLOCK)
            return True
        except zmq.Again:
            return False
        finally:
            self._look()

    async def send_by(self, frames: list[bytes], deadline: float) -> bool:
        """`send`, retrying while the queue is full until `deadline` (monotonic); False if it
        never took the frames."""
        while not self.send(frames):
            if self.closed or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(FULL_RETRY_S)
        return True

    def _look(self) -> None:
        """Schedule the reader if a reply waits that the FD may not announce."""
        if not self.read_scheduled and not self.closed and zmq_poll(self.poll_items, 0):
            self.read_scheduled = True
            self.loop.call_soon(self._readable)

    def _readable(self) -> None:
        self.read_scheduled = False
        if self._read():
            self._look()  # more are waiting: come back after the loop's other callbacks

    def _read(self) -> bool:
        """Hand up to MAX_READ waiting replies to `on_frames`; True when it stopped at MAX_READ."""
        socket = self.socket
        for _ in range(MAX_READ):
            if self.closed or not zmq_poll(self.poll_items, 0):  # reads ZMQ_EVENTS, as getsockopt would
                return False
            self.on_frames(recv_frames(socket))
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)  # before the socket closes its FD
            if self.monitor is not None:
                self.loop.remove_reader(self.monitor_fd)
        if self.monitor is not None:
            self.socket.disable_monitor()
            self.monitor.close(0)
        self.socket.close(0)

"""ha-server: a master's HA endpoint. Each connected slave gets the CommitLog's bytes from where
it stands, straight from the master's read-only mappings; its reports become `slave_acked`, which
the SYNC_MASTER sends wait for.

Sockets: on `haListenAddress:haListenPort` (settings.ha_host, ha_port), a ZeroMQ ROUTER (haProtocol = zmq; ROUTER_MANDATORY,
so a send to a slave whose connection dropped fails and ends its session at once) or a plain
TCP listener (haProtocol = rocketmq: RocketMQ 4.x's protocol, spec §12). Doorbells (FIFOs,
actors.base.Doorbell): `ha-wake` in, the writer's "written moved" while slaves follow; `acked`
out, "a slave acked more", to whoever holds the SYNC_MASTER sends (the front, or the flush
process).

The sessions' logic is `actors.ha_link.MasterSession`; this shell reads the log, sends, and
publishes in the control block `slave_acked` (the highest offset any following slave
confirmed, monotone) and `ha_slaves` (sessions following now). A session ends on a protocol
error (logged with its reason; nothing stored changes: the master only ever reads here), on
haHousekeepingInterval of silence, on a dropped connection, or when a second slave with the
same brokerId hellos while the first still answers.

On a node whose role is SLAVE it runs too, but refuses followers until `admin role` promotes
the node. A port already in use is retried every few seconds, the node serving meanwhile.
"""

from __future__ import annotations

import logging
import secrets
import socket as pysocket
import time

import orjson
import zmq

from actors.base import Actor, doorbell, incoming, wait_readable
from actors import guard, ha_link
from actors.ha_config import ConfigShipper, PopShipper
from actors.ha_link import HEADER, REPORT, LinkError, MasterSession, StreamDecoder, Superseded
from node import protocol
from shm.control_block import monotonic_ms
from shm import epochs
from shm.commitlog import CommitLog
from shm.control_block import ROLE_CODES

log = logging.getLogger("mqnode")
BIND_RETRY_MS = 3000
MAX_SESSIONS = 16
MAX_CHALLENGED = 64  # connections asked to prove an account and not yet answering (aclEnable)
CHALLENGE_MS = 10_000  # a challenge not answered within this is forgotten
MAX_TRANSFERS = 64  # per slave per turn: bounds a turn; the next turn goes on
MAX_ITEMS = 512
REPEAT_LOG_MS = 60_000  # the same refusal logged again only after this
IDLE_MS = 50  # (RocketMQ's master waits up to 100 ms for a put notification; the doorbell wakes this one)
DATA_HEAD = 1 + REPORT.size


class TcpPeer:
    """One RocketMQ-protocol connection: its socket, the reports it sent, what waits to go out."""

    def __init__(self, sock: pysocket.socket):
        self.sock = sock
        self.decoder = StreamDecoder()
        self.out = bytearray()


class HaServer(Actor):
    name = "ha-server"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.rocketmq = settings.haProtocol == "rocketmq"
        self.log: CommitLog | None = None  # these three opened by `open`, in the actor's thread
        self.epochs: epochs.EpochFile | None = None
        self.wake = self.acked_out = None  # doorbells: the writer's "written moved"; "a slave acked more"
        self.role_seen = 0
        self.sessions: dict[object, MasterSession] = {}  # routing id (zmq) or TcpPeer -> session
        self.endpoint = None  # the ROUTER or the TCP listener, once bound
        self.curve = None  # the allow-list's ZAP handler (curveEnable with curveClientKeysDir)
        self.next_bind_ms = 0
        self.bind_error = ""
        self.refused = self.closed = 0
        self.last_error = ""
        self.last_error_logged_ms = 0
        self.rate = _Rate()
        self.config = ConfigShipper(settings.root / "config", guard.acl_shipped(settings))
        self.pop = PopShipper(settings.root / "pop")
        self.config_changes_seen = 0  # the control block's `config_changes` when the files were last looked at
        self.acl = self.acl_file = None  # with aclEnable: who may follow (actors.acl), its file watched
        self.next_acl_look = 0.0
        self.challenged: dict[object, tuple[bytes, str, int]] = {}  # peer -> (hello, challenge, when), until its proof
        self.auth_refused = 0

    def open(self) -> None:
        s = self.settings
        self.log = CommitLog(s.commitlog_dir, s.mappedFileSizeCommitLog, readonly=True)
        self.log.segments.load()
        self.epochs = epochs.EpochFile(s.root)
        self.role_seen = self.control.get("role")
        self.wake = doorbell(s, "ha-wake", listen=True)
        self.acked_out = doorbell(s, "acked", listen=False)
        self.control.set("ha_slaves", 0)
        self.acl, self.acl_file = guard.open_acl(s) or (None, None)

    # -- the loop -----------------------------------------------------------------------------------

    def turn(self) -> None:
        now = monotonic_ms()
        if self.endpoint is None and now >= self.next_bind_ms:
            self._bind(now)
        items = [(self.wake.fileno(), zmq.POLLIN)]
        if self.endpoint is not None:  # (zmq_poll answers a plain socket by its descriptor)
            items.append((self.endpoint.fileno() if self.rocketmq else self.endpoint, zmq.POLLIN))
        if self.rocketmq:
            items += [(peer.sock.fileno(), zmq.POLLIN) for peer in self.sessions]
        ready = wait_readable(items, 1 if self._sending() else IDLE_MS)
        if self.wake.fileno() in ready:
            self.wake.drain()
        if self.endpoint is not None:
            if self.rocketmq:
                self._tcp_turn(ready)
            elif self.endpoint in ready or self.endpoint.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self._zmq_read()
        # `written` before the config files: a record below it was written after any topic or
        # group it needs was persisted (the front answers the change first), so the file that
        # holds it goes to each slave ahead of the record
        written = self.control.get("written")
        self._ship_config(monotonic_ms())
        self._send_all(monotonic_ms(), written)
        self._housekeeping_sessions(monotonic_ms())
        if time.monotonic() >= self.next_acl_look:
            self.next_acl_look = time.monotonic() + 1.0
            if self.acl is not None:
                guard.reload_acl(self.acl, self.acl_file)
            elif self.settings.is_slave:  # its master's ACL, once received: in force after a promotion too
                self.acl, self.acl_file = guard.open_masters_acl(self.settings) or (None, None)
                self.config.files |= guard.acl_shipped(self.settings)

    def _sending(self) -> bool:
        """Whether some slave could take more now (then the loop only glances at its sockets)."""
        written = self.control.get("written")
        return any(s.started and s.next_offset < written and s.next_offset < s.acked + ha_link.WINDOW
                   for s in self.sessions.values())

    def _bind(self, now: int) -> None:
        s = self.settings
        address = (s.ha_host, s.ha_port)
        try:
            if self.rocketmq:
                listener = pysocket.socket(pysocket.AF_INET6 if ":" in address[0] else pysocket.AF_INET)
                listener.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_REUSEADDR, 1)
                listener.bind(address)
                listener.listen(MAX_SESSIONS)
                listener.setblocking(False)
                self.endpoint = listener
            else:
                router = self.context.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.ROUTER_MANDATORY, 1)
                router.setsockopt(zmq.SNDHWM, 0)
                router.setsockopt(zmq.RCVHWM, 100000)
                router.setsockopt(zmq.SNDBUF, 4 * 1024 * 1024)
                # with curveEnable the link is CURVE-encrypted with the node's key pair, and the
                # allow-list (curveClientKeysDir) decides which slaves may follow, as on the client port
                self.curve = guard.secure_clients(router, s, self.context)
                try:
                    endpoint = protocol.tcp_endpoint(*address)
                    protocol.ipv6_ready(router, endpoint)
                    router.bind(endpoint)
                except zmq.ZMQError:
                    router.close(0)
                    if self.curve is not None:
                        self.curve.stop()  # (started again with the next try)
                        self.curve = None
                    raise
                self.endpoint = router
            self.bind_error = ""
        except (OSError, zmq.ZMQError) as e:
            self.bind_error = f"cannot bind {address[0]}:{address[1]}: {e}"
            self.next_bind_ms = now + BIND_RETRY_MS
            log.warning("ha-server: %s (retrying)", self.bind_error)

    def _master(self) -> bool:
        role = self.control.get("role")
        if role != self.role_seen:  # a promotion began an epoch: its history is in the file now
            self.role_seen = role
            self.epochs = epochs.EpochFile(self.settings.root)
        return role != ROLE_CODES["SLAVE"]

    # -- zmq ----------------------------------------------------------------------------------------------

    def _zmq_read(self) -> None:
        now = monotonic_ms()
        for frames in incoming(self.endpoint, MAX_ITEMS):
            if len(frames) != 2 or not frames[1]:
                continue  # not ours to answer: a malformed routing envelope
            peer, data = frames
            kind, payload = data[:1], data[1:]
            session = self.sessions.get(peer)
            try:
                if kind == ha_link.HELLO and self.acl is not None:
                    self._challenge(peer, payload, now)
                elif kind == ha_link.HELLO:
                    self._hello(peer, payload, now)
                elif kind == ha_link.PROOF:
                    self._proof(peer, payload, now)
                elif kind == ha_link.REPORT_KIND and session is not None and len(payload) == REPORT.size:
                    session.on_report(REPORT.unpack(payload)[0], self.control.get("written"), now)
                elif kind == ha_link.POP_TAKEN and session is not None and len(payload) == REPORT.size:
                    self.pop.took(peer, REPORT.unpack(payload)[0])
                elif kind == ha_link.HISTORY and self._master():
                    history = {"epochs": self.epochs.as_wire(), "maxOffset": self.control.get("written")}
                    self.endpoint.send_multipart([peer, ha_link.HISTORY + orjson.dumps(history)])
                elif kind == ha_link.BYE:  # (a refused follower's goodbye finds no session: nothing to end)
                    if session is not None:
                        self._end(peer, "the slave said goodbye")
                elif session is not None:
                    raise LinkError(f"an unknown message ({kind!r}, {len(data)} bytes)")
                else:
                    raise LinkError("a message before the hello")
            except LinkError as e:
                self._refuse(peer, str(e))
        self._publish_acks()

    def _challenge(self, peer: bytes, payload: bytes, now: int) -> None:
        """The ACL is on: a hello is answered with a fresh challenge, and kept for the proof."""
        if peer in self.sessions or peer in self.challenged:
            raise LinkError("a second hello on one link")
        if len(payload) > ha_link.MAX_HELLO:
            raise LinkError("the hello is too large")
        for old in [p for p, (_, _, when) in self.challenged.items() if now - when > CHALLENGE_MS]:
            del self.challenged[old]  # never answered
        if len(self.challenged) >= MAX_CHALLENGED:
            raise LinkError(f"{MAX_CHALLENGED} slaves are proving their accounts already")
        challenge = secrets.token_hex(16)
        self.challenged[peer] = (payload, challenge, now)
        self.endpoint.send_multipart([peer, ha_link.challenge_message(challenge)])

    def _proof(self, peer: bytes, payload: bytes, now: int) -> None:
        asked = self.challenged.pop(peer, None)
        if asked is None:
            raise LinkError("a proof nobody asked for (the ACL is off, or this connection sent no hello)")
        hello, challenge, _ = asked
        refusal = self.acl.replication_refusal(ha_link.parse_proof(payload), challenge, hello)
        if refusal is not None:
            self.auth_refused += 1
            raise LinkError(f"not authorised: {refusal}")
        self._hello(peer, hello, now)

    def _hello(self, peer: bytes, payload: bytes, now: int) -> None:
        if not self._master():
            raise LinkError("this node is a slave: follow its master")
        if peer in self.sessions:
            raise LinkError("a second hello on one link")
        if len(self.sessions) >= MAX_SESSIONS:
            raise LinkError(f"{MAX_SESSIONS} slaves follow already")
        session = MasterSession(self.settings, now, handshake=True)
        try:
            welcome = session.on_hello(payload, self.epochs.entries, self.control.get("written"), now)
        except Superseded as e:
            self._superseded(e.epoch)
            raise
        for other_peer, other in list(self.sessions.items()):
            if other.broker_id == session.broker_id:
                if self._alive(other_peer):
                    raise LinkError(f"a slave with brokerId {session.broker_id} follows already")
                self._end(other_peer, "replaced by a new connection of the same slave")
        self.endpoint.send_multipart([peer, welcome])
        self.sessions[peer] = session
        log.warning("ha-server: slave %s (%s) follows from offset %d", session.broker_id, session.endpoint,
                    session.next_offset)

    def _superseded(self, epoch: int) -> None:
        """A would-be slave holds sends of an epoch it began past this node's history: this is an
        old master, and what it takes now a later fencing would cut. The front takes no client
        send from here on, until the node restarts (docs/operations.md "Replication")."""
        if epoch > self.control.get("superseded_by"):
            log.error("ha-server: a would-be slave was a master in epoch %d, past this node's history (epoch %d): "
                      "this is an old master; client sends are refused until it restarts as that node's slave",
                      epoch, self.epochs.current)
            self.control.set("superseded_by", epoch)

    def _alive(self, peer) -> bool:
        """Whether the slave behind `peer` still has its connection (a heartbeat goes through)."""
        try:
            self.endpoint.send_multipart([peer, ha_link.DATA + REPORT.pack(self.sessions[peer].next_offset)])
            return True
        except zmq.ZMQError:
            return False

    def _refuse(self, peer, reason: str) -> None:
        self.refused += 1
        now = monotonic_ms()
        repeated = reason == self.last_error and now - self.last_error_logged_ms < REPEAT_LOG_MS
        if not repeated:  # (a follower refused for good asks again and again: one line a minute of it)
            self.last_error_logged_ms = now
            log.warning("ha-server: link closed: %s", reason)
        self.last_error = reason
        if not self.rocketmq:
            try:
                self.endpoint.send_multipart([peer, ha_link.REFUSED + reason.encode()[:1000]])
            except zmq.ZMQError:
                pass
        self._end(peer, reason)

    def _end(self, peer, why: str) -> None:
        self.challenged.pop(peer, None)
        session = self.sessions.pop(peer, None)
        self.config.forget(peer)
        self.pop.forget(peer)
        if isinstance(peer, TcpPeer):
            peer.sock.close()
        if session is not None:
            self.closed += 1
            log.warning("ha-server: slave %s left: %s", session.broker_id, why)
        self.control.set("ha_slaves", sum(1 for s in self.sessions.values() if s.started))

    # -- rocketmq (plain TCP) -------------------------------------------------------------------------

    def _tcp_turn(self, ready: set) -> None:
        now = monotonic_ms()
        if self.endpoint.fileno() in ready:
            self._accept(now)
        for peer in [p for p in self.sessions if p.sock.fileno() in ready]:
            try:
                data = peer.sock.recv(65536)
                if not data:
                    raise LinkError("the slave closed the connection")
                peer.decoder.feed(data)
                reports = peer.decoder.reports()
                if reports:  # RocketMQ uses the last complete one
                    self.sessions[peer].on_report(reports[-1], self.control.get("written"), now)
            except LinkError as e:
                self._refuse(peer, str(e))
            except OSError as e:
                self._end(peer, f"the connection broke: {e}")
        self._publish_acks()

    def _accept(self, now: int) -> None:
        for _ in range(MAX_SESSIONS):
            try:
                sock, address = self.endpoint.accept()
            except BlockingIOError:
                return
            if not self._master() or len(self.sessions) >= MAX_SESSIONS:
                log.warning("ha-server: refused %s: %s", address, "a slave" if not self._master() else "too many")
                sock.close()
                self.refused += 1
                continue
            sock.setblocking(False)
            session = MasterSession(self.settings, now, handshake=False)
            session.endpoint = f"{address[0]}:{address[1]}"
            self.sessions[TcpPeer(sock)] = session

    # -- sending ------------------------------------------------------------------------------------------

    def _send_all(self, now: int, written: int) -> None:
        min_offset = self.control.get("min_offset")
        for peer, session in list(self.sessions.items()):
            try:
                for _ in range(MAX_TRANSFERS):
                    if isinstance(peer, TcpPeer) and not self._flush_out(peer):
                        break  # the socket's buffer is full: wait for it
                    transfer = session.next_transfer(written, min_offset, now)
                    if transfer is None:
                        break
                    self._send(peer, transfer)
                    self.rate.add(now, transfer.size)
            except LinkError as e:
                self._refuse(peer, str(e))
            except zmq.ZMQError as e:
                self._end(peer, f"the connection dropped ({e})")
            except OSError as e:
                self._end(peer, f"the connection broke: {e}")
        self.control.set("ha_slaves", sum(1 for s in self.sessions.values() if s.started))

    def _send(self, peer, transfer: ha_link.Transfer) -> None:
        if isinstance(peer, TcpPeer):
            peer.out += HEADER.pack(transfer.offset, transfer.size)
            if transfer.size:
                peer.out += self._view(transfer.offset, transfer.size)
            self._flush_out(peer)
            return
        # one copy out of the mapping into a frame ZeroMQ then sends as it is (copy=False)
        frame = bytearray(DATA_HEAD + transfer.size)
        frame[:DATA_HEAD] = ha_link.DATA + REPORT.pack(transfer.offset)
        if transfer.size:
            frame[DATA_HEAD:] = self._view(transfer.offset, transfer.size)
        self.endpoint.send(peer, zmq.SNDMORE)
        self.endpoint.send(frame, copy=False)

    def _view(self, offset: int, size: int) -> memoryview:
        segments = self.log.segments
        segment = segments.find(offset)
        if segment is None or segment.offset_start + size > segment.offset_end or offset + size > segment.offset_end:
            segments.refresh()
            segment = segments.find(offset)
        if segment is None:
            raise LinkError(f"offset {offset} is in no segment of this master")
        at = offset - segment.offset_start
        return memoryview(segment.map)[at: at + size]

    @staticmethod
    def _flush_out(peer: TcpPeer) -> bool:
        """Send what waits; True when nothing is left waiting."""
        while peer.out:
            try:
                sent = peer.sock.send(peer.out)
            except BlockingIOError:
                return False
            del peer.out[:sent]
        return True

    def _ship_config(self, now: int) -> None:
        """The zmq link: each config file that changed since a slave last got it, looked at every
        LOOK_MS, at once when the front says it wrote one (`config_changes`) or a slave is new;
        and the pop log (PopShipper)."""
        if self.rocketmq:
            return
        if self.pop.due(now):
            self._ship_pop_log()
        changes = self.control.get("config_changes")
        new_slave = any(s.started and self.config.is_new(peer) for peer, s in self.sessions.items())
        if not self.config.look(now, force=changes != self.config_changes_seen or new_slave, announced=changes):
            return
        self.config_changes_seen = changes
        for peer, session in list(self.sessions.items()):
            if not session.started:
                continue
            try:
                for name, content in self.config.changed_for(peer):
                    self.endpoint.send_multipart([peer, ha_link.config_message(name, content)])
            except zmq.ZMQError as e:
                self._end(peer, f"the connection dropped ({e})")

    def _ship_pop_log(self) -> None:
        for peer, session in list(self.sessions.items()):
            if not (session.started and session.pop_log):  # (a slave that does not keep a copy gets none)
                continue
            try:
                for item in self.pop.items_for(peer):
                    self.endpoint.send_multipart([peer, item])
            except zmq.ZMQError as e:
                self._end(peer, f"the connection dropped ({e})")

    def _publish_acks(self) -> None:
        acked = max((s.acked for s in self.sessions.values() if s.started), default=0)
        if acked > self.control.get("slave_acked"):
            self.control.set("slave_acked", min(acked, self.control.get("written")))
            self.acked_out.ring()

    def _housekeeping_sessions(self, now: int) -> None:
        for peer, session in list(self.sessions.items()):
            if session.expired(now):
                self._end(peer, "nothing heard for haHousekeepingInterval")

    def follow_min_offset(self, min_offset: int) -> None:
        self.log.segments.forget_deleted_head()

    # -- statistics ------------------------------------------------------------------------------------

    def statistics(self) -> dict:
        stats = super().statistics()
        if self.epochs is None:  # (not opened yet)
            return stats
        now, written = monotonic_ms(), self.control.get("written")
        return stats | {
            "protocol": self.settings.haProtocol, "listen": protocol.host_port(self.settings.ha_host, self.settings.ha_port),
            "bound": self.endpoint is not None, "bindError": self.bind_error, "serving": self._master(),
            "epoch": self.epochs.current, "written": written, "slaveAcked": self.control.get("slave_acked"),
            "slaves": [s.statistics(written, now) for s in self.sessions.values() if s.started],
            "transferBytesPerSecond": self.rate.per_second(now), "refused": self.refused, "closed": self.closed,
            "lastError": self.last_error, "acl": self.acl is not None, "authRefused": self.auth_refused,
            **self.pop.statistics()}

    def close(self) -> None:
        if self.control is not None:
            self.control.set("ha_slaves", 0)
        for peer in list(self.sessions):
            if isinstance(peer, TcpPeer):
                peer.sock.close()
        if self.endpoint is not None:
            self.endpoint.close() if self.rocketmq else self.endpoint.close(0)
        self.endpoint = None
        if self.log is not None:
            self.log.close()
        if self.curve is not None:
            self.curve.stop()
        for bell in (self.wake, self.acked_out):
            if bell is not None:
                bell.close()
        super().close()


class _Rate:
    """Bytes sent over the last few seconds, per second (admin ha's transfer rate)."""

    WINDOW_MS = 5000

    def __init__(self):
        self.buckets: dict[int, int] = {}

    def add(self, now_ms: int, size: int) -> None:
        second = now_ms // 1000
        self.buckets[second] = self.buckets.get(second, 0) + size
        if len(self.buckets) > 10:
            for old in sorted(self.buckets)[:-6]:
                del self.buckets[old]

    def per_second(self, now_ms: int) -> int:
        since = now_ms // 1000 - self.WINDOW_MS // 1000
        return sum(v for k, v in self.buckets.items() if since <= k < now_ms // 1000) // (self.WINDOW_MS // 1000)


"""ha-client: a slave's follower. It is the slave's CommitLog writer: it appends what its master
sends, byte for byte, so the slave's log is a prefix of the master's; the slave's own dispatcher
builds its ConsumeQueues and index from it.

Two parts:
- `Follower`, the log's side with no socket: raw bytes in at the end of the log; `written` is
  published only at record boundaries (a transfer may cut a record in two; readers and the
  dispatcher never see half a record), after a check that each record header is one (magic,
  size within its segment). Bytes that are not records close the link and are zeroed: the
  master sent garbage, and nothing of it is kept.
- `HaClient`, the process: connects to `haMasterAddress` over the `haProtocol` link
  (actors.ha_link), reports its max offset after each append and every haSendHeartbeatInterval,
  reconnects after haHousekeepingInterval of silence. It also takes `admin role` from the front
  (the `ha-admin` socket): a promotion stops following, zeroes a cut record at the end, begins
  the next epoch at the written end (shm.epochs) and switches the node's role in the control
  block; the front then opens its write core, and this node's ha-server serves followers.

It also keeps the slave's copy of its master's pop log (`Q` items: shm.pop_log.PopReplica,
begun anew at each welcome), which the pop service takes over when the slave is promoted.

Restart (kill -9): it resumes at the control block's `written` (what lay past it is zeroed, as
the writer does) and asks its master for the rest.

Refused because its log holds bytes past the common history (the node's start could not ask
the master, or the master lost a tail it had sent: node.server.fencing), it sets `fence_pending`; the launcher ends the node, whose
restart cuts them. Any other refusal (no shared history, an old master) is said in `admin ha`
and asked again every DIVERGED_RETRY_MS.

A full disk (a segment, a config file or the pop log's copy refused) closes the link, as
RocketMQ's HAClient does, and the next connect (a second later) asks again from the log's end;
the slave's clean service makes room meanwhile. Dying instead would die again at every restart.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket as pysocket
import time

import orjson
import zmq

from actors.base import Actor, incoming, socket, wait_readable
from actors.wire import pack_replies
from actors.writer import WAKE_MARGIN_NS, dispatcher_wakes
from node import protocol
from actors import guard, ha_link
from actors.ha_link import REPORT, LinkError, SlaveSession, StreamDecoder
from shm.control_block import monotonic_ms
from shm import epochs
from shm.disk import NO_ROOM, write_whole
from shm.codec import frame_size
from shm.commitlog import CommitLog
from shm.control_block import ROLE_CODES
from shm.invariant import invariant
from shm.mapped_file import AllocationFailed
from shm.pop_log import POP_REPLICA, PopReplica, ReplicaGap

log = logging.getLogger("mqnode")
HEADER_PEEK = 8  # a record's size and magic: what `frame_size` looks at
RECONNECT_MS = 1000
DIVERGED_RETRY_MS = 10_000  # after a refusal because the histories parted: logged once, asked again this often
BYE_LINGER_MS = 200
MAX_ITEMS = 256  # link messages taken per turn
MAX_WALK = 1 << 20  # record headers checked per append, at most


class Follower:
    """The slave's CommitLog, appended raw (see the module docstring)."""

    def __init__(self, settings, control):
        self.control = control
        self.log = CommitLog(settings.commitlog_dir, settings.mappedFileSizeCommitLog,
                             keep_free=settings.commitlog_headroom)
        self.log.segments.load()
        written = control.get("written")
        self.scrubbed = self.log.discard_after(written)  # a killed predecessor's unpublished bytes
        self.log.segments.resume_at(written)
        self.end = self.boundary = written
        self.appended_bytes = 0

    def append(self, offset: int, body) -> int:
        """Place `body` at `offset` (the log's end); returns the new end. `publish` then makes
        the whole records readable."""
        invariant(offset == self.end, (offset, self.end))
        view, segments = memoryview(body), self.log.segments
        while view:
            segment = segments.last_writable(self.end)
            invariant(segment.offset_start <= self.end < segment.offset_end, (self.end, segment.offset_start))
            position = self.end - segment.offset_start
            n = min(len(view), segment.size - position)
            segment.write(position, view[:n])
            segment.set_written(position + n)
            self.end += n
            view = view[n:]
        self.appended_bytes += len(body)
        return self.end

    def publish(self) -> None:
        """Publish `written` at the last record boundary below the end. LinkError when what
        arrived is not records (then nothing of it stays)."""
        position, segments = self.boundary, self.log.segments
        for _ in range(MAX_WALK):
            if self.end - position < HEADER_PEEK:
                break
            segment = segments.find(position)
            at = position - segment.offset_start
            size, why = frame_size(segment.map, at, segment.size - at)
            if why:
                return self._garbage(position, why)
            if position + size > self.end:
                break  # the rest of this record comes in the next transfer
            position += size
        if position > self.boundary:
            self.boundary = position
            self.control.advance("written", position)

    def _garbage(self, position: int, why: str) -> None:
        if position > self.boundary:  # the whole records before it stay
            self.boundary = position
            self.control.advance("written", position)
        self.log.discard_after(self.boundary)
        self.log.segments.resume_at(self.boundary)
        self.end = self.boundary
        raise LinkError(f"the master sent {why} at offset {position}: dropped, reconnecting")

    def cut_tail(self) -> int:
        """Promotion: zero a record cut in two at the end; the log ends at `written`."""
        dropped = self.end - self.boundary
        self.log.discard_after(self.boundary)
        self.log.segments.resume_at(self.boundary)
        self.end = self.boundary
        return dropped

    def close(self) -> None:
        self.log.close()


class HaClient(Actor):
    name = "ha-client"

    def __init__(self, settings, **kwargs):
        super().__init__(settings, **kwargs)
        self.follower: Follower | None = None  # while the node is a slave (opened by `open`)
        self.pop_replica: PopReplica | None = None
        self.pop_reported = 0  # the copy's bytes taken, as last reported to the master (b"T")
        self.epochs: epochs.EpochFile | None = None
        self.rocketmq = settings.haProtocol == "rocketmq"
        self.curve_keys = None
        self.hello = b""  # this connection's hello payload, which a proof signs (a master with aclEnable)
        self.session: SlaveSession | None = None
        self.link = None  # a zmq DEALER, or a TCP socket (rocketmq)
        self.decoder = StreamDecoder()
        self.next_connect_ms = 0
        self.connects = self.link_errors = self.config_syncs = self.wakes_skipped = 0
        self.last_error = ""
        self.no_room = False  # the link closed for a full disk and nothing was appended since
        self.diverged = ""
        self.master_endpoint = ""  # the master's client endpoint (its welcome says it)
        self.behind_since_ms: int | None = None  # when the slave last fell behind its master

    def open(self) -> None:
        s = self.settings
        self.follower = Follower(s, self.control) if self.control.get("role") == ROLE_CODES["SLAVE"] else None
        self.pop_replica = PopReplica(s.root / POP_REPLICA)  # its master's pop log, for the pop service once promoted
        self.epochs = epochs.EpochFile(s.root)
        self.curve_keys = guard.ha_link_keys(s)
        self.wakes = dispatcher_wakes(self.context, self.endpoints)
        self.admin = socket(self.context, zmq.PULL, hwm=100)
        self.admin.connect(self.endpoints["ha-admin"])
        self.replies = socket(self.context, zmq.PUSH, hwm=1000)
        self.replies.connect(self.endpoints["replies"])

    # -- the loop ----------------------------------------------------------------------------------

    def turn(self) -> None:
        now = monotonic_ms()
        following = self.follower is not None
        if following and self.link is None and now >= self.next_connect_ms:
            self._connect(now)
        items = [(self.admin, zmq.POLLIN)]
        if self.link is not None:  # (zmq_poll answers a plain socket by its descriptor)
            items.append((self.link.fileno() if self.rocketmq else self.link, zmq.POLLIN))
        ready = wait_readable(items, 50)
        if self.admin in ready:
            for frames in incoming(self.admin, 10):
                self._admin(frames)
        if self.link is not None and self.follower is not None:
            try:
                if self.rocketmq:
                    if self.link.fileno() in ready:
                        self._read(now)
                elif self.link in ready or self.link.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    self._read(now)
                self._report(monotonic_ms())
                if self.session.expired(monotonic_ms()):
                    raise LinkError("nothing heard from the master for haHousekeepingInterval")
            except LinkError as e:
                self._disconnect(str(e), quietly=bool(self.diverged) and str(e) == self.last_error)
                if self.diverged:  # (only a change on the master's side, or a restart here, can mend it)
                    self.next_connect_ms = monotonic_ms() + DIVERGED_RETRY_MS
            except AllocationFailed as e:
                self._no_room(str(e))
            except OSError as e:
                if e.errno in NO_ROOM:
                    self._no_room(str(e))
                elif e.errno == errno.EIO:
                    raise  # the disk: fail-stop
                else:
                    self._disconnect(f"the link broke: {e}")

    def _connect(self, now: int) -> None:
        s = self.settings
        host, port = s.ha_master
        self.connects += 1
        self.next_connect_ms = now + RECONNECT_MS
        self.session = SlaveSession(s, self.follower.end, now, handshake=not self.rocketmq)
        if self.rocketmq:
            try:
                link = pysocket.create_connection((host, port), timeout=1.0)
            except OSError as e:
                self.last_error = f"cannot connect to {host}:{port}: {e}"
                return
            link.setblocking(False)
            self.decoder = StreamDecoder()
            self.link = link
            return
        self.link = socket(self.context, zmq.DEALER, hwm=0)
        self.link.setsockopt(zmq.ROUTING_ID, secrets.token_bytes(8))  # a fresh session each connect
        self.link.setsockopt(zmq.RCVBUF, 4 * 1024 * 1024)
        guard.secure_link(self.link, self.curve_keys)  # (a master with curveEnable)
        endpoint = protocol.tcp_endpoint(host, port)
        protocol.ipv6_ready(self.link, endpoint)
        self.link.connect(endpoint)
        hello = self.session.hello(s.brokerId, self.epochs.entries, s.client_endpoint)
        self.hello = hello[1:]
        self.link.send(hello)

    def _disconnect(self, why: str, *, quietly: bool = False) -> None:
        self.link_errors += 1
        self.last_error = why
        (log.debug if quietly else log.warning)("ha-client: link to %s closed: %s", self.settings.haMasterAddress, why)
        self._close_link()

    def _no_room(self, why: str) -> None:
        """A full disk: the link closes, a WARNING the first time until something is appended again."""
        self._disconnect(f"the disk is full: {why}", quietly=self.no_room)
        self.no_room = True

    def _close_link(self) -> None:
        if self.link is not None:
            if self.rocketmq:
                self.link.close()
            else:
                try:
                    self.link.send(ha_link.BYE, zmq.NOBLOCK)  # bye: the master drops the session at once
                except zmq.ZMQError:
                    pass
                self.link.close(linger=BYE_LINGER_MS)  # (long enough for the goodbye to leave)
        self.link, self.session = None, None

    def _read(self, now: int) -> None:
        """What the master sent: appended, checked and published to this node's readers, then
        reported (the ack SYNC_MASTER's sends wait for: never for bytes that are not records)."""
        end = self.follower.end
        try:
            self._receive(now)
        finally:
            if self.follower.end != end:
                self.follower.publish()
                self._report(now)
                self._wake_dispatcher()

    def _receive(self, now: int) -> None:
        if self.rocketmq:
            for _ in range(64):
                try:
                    data = self.link.recv(1 << 20)
                except BlockingIOError:
                    break
                if not data:
                    raise LinkError("the master closed the connection")
                self.decoder.feed(data)
                for offset, body in self.decoder.transfers():
                    self._transfer(offset, body, now)
            return
        for _ in range(MAX_ITEMS):
            try:
                message = self.link.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._message(message.buffer, now)

    def _message(self, data: memoryview, now: int) -> None:
        kind = bytes(data[:1])
        if kind == ha_link.DATA and len(data) >= 1 + REPORT.size:
            offset = REPORT.unpack_from(data, 1)[0]
            self._transfer(offset, data[1 + REPORT.size:], now)
        elif kind == ha_link.WELCOME:
            try:
                history = self.session.on_welcome(bytes(data[1:]), now)
            except LinkError as e:
                self.diverged = str(e)
                raise
            self.control.set("master_offset", self.session.master_end)
            self.epochs.adopt(history)
            self.diverged = ""
            self.pop_replica.clear()  # (its master ships the pop log's copy again, from its snapshot)
            self.pop_reported = 0
        elif kind == ha_link.CHALLENGE:  # the master's ACL is on: prove an account
            access_key, secret_key = ha_credentials(self.settings)
            if not (access_key and secret_key):
                raise LinkError("the master's ACL is on: set haAccessKey and haSecretKey (or MQNODE_ACCESS_KEY and "
                                "MQNODE_SECRET_KEY) to an account with admin or replication")
            challenge = ha_link.parse_challenge(data[1:])
            self.link.send(ha_link.proof_message(access_key, secret_key, challenge, self.hello))
        elif kind == ha_link.CONFIG:
            name, content = ha_link.parse_config(data[1:])
            write_config(self.settings.root / "config" / name, content)
            self.config_syncs += 1
        elif kind == ha_link.POP_LOG:
            part, gen, offset, chunk = ha_link.parse_pop(data[1:])
            take = self.pop_replica.snapshot_chunk if part == ha_link.POP_SNAPSHOT else self.pop_replica.journal_chunk
            try:
                take(gen, offset, chunk)
            except ReplicaGap as e:
                raise LinkError(str(e)) from e
        elif kind == ha_link.REFUSED:
            reason = bytes(data[1:]).decode("utf-8", "replace")
            if reason.startswith(ha_link.DIVERGED):
                self.diverged = reason
                self._cut_asked(reason)
            raise LinkError(f"the master refused: {reason}")
        else:
            raise LinkError(f"an unknown message from the master ({bytes(data[:1])!r}, {len(data)} bytes)")

    def _cut_asked(self, reason: str) -> None:
        """The master refused this log for bytes past their common history (node.server.fencing:
        this node's start could not ask it, or it lost them since). Only a restart may cut a log its readers have
        seen, so the launcher is told to end the node (`fence_pending`); its restart cuts them."""
        asked = ha_link.cut_asked(reason)
        if asked is not None and not self.control.get("fence_pending"):
            log.error("ha-client: this slave's log holds %d bytes past offset %d that its master %s does not have: "
                      "the node ends, and its restart cuts them", asked[0], asked[1], self.settings.haMasterAddress)
            self.control.set("fence_pending", asked[0])

    def _transfer(self, offset: int, body, now: int) -> None:
        if self.session.on_data(offset, len(body), now):
            if self.follower.end == 0 and offset > 0:
                self._start_empty_at(offset)
            self.session.appended(self.follower.append(offset, body))
            self.no_room = False
            self.session.master_end = max(self.session.master_end, offset + len(body))
        else:
            self.session.master_end = max(self.session.master_end, offset)
        self.control.set("master_offset", self.session.master_end)
        behind = self.session.master_end > self.follower.end
        if behind and self.behind_since_ms is None:
            self.behind_since_ms = now
        elif not behind:
            self.behind_since_ms = None

    def _start_empty_at(self, offset: int) -> None:
        """An empty slave's first transfer starts past 0 (the master's first segment, or its
        last on the RocketMQ link): its log begins at that segment."""
        invariant(offset % self.settings.mappedFileSizeCommitLog == 0, offset)
        follower = self.follower
        follower.end = follower.boundary = offset
        self.control.set("min_offset", offset)  # (the clean service's slot: it has deleted nothing yet)
        self.control.advance("written", offset)
        self.control.advance("dispatched", offset)
        segments = follower.log.segments
        for stray in [f for f in segments.files if f.offset_start < offset]:  # empty: made before the log had a start
            segments.files.remove(stray)
            stray.close()
        for stray in segments.segment_paths():
            if int(stray.name) < offset:
                stray.unlink(missing_ok=True)

    def _report(self, now: int) -> None:
        if self.session is not None and self.session.report_due(now):
            report = self.session.report(now)
            if self.rocketmq:
                self.link.send(report)  # 8 bytes: a non-blocking socket takes them or raises
            else:
                self.link.send(ha_link.REPORT_KIND + report, zmq.NOBLOCK)
        if (self.session is not None and self.session.welcomed and not self.rocketmq
                and self.pop_replica.taken != self.pop_reported):
            self.pop_reported = self.pop_replica.taken  # (only after b"Q" items: a master that ships them)
            self.link.send(ha_link.POP_TAKEN + REPORT.pack(self.pop_reported), zmq.NOBLOCK)

    def _wake_dispatcher(self) -> None:
        """As the writer does (actors.dispatcher): no wake-up while the dispatcher's promise to
        look again has more than WAKE_MARGIN_NS to run; a stream of transfers then costs it a
        timer wake-up a millisecond, not one a transfer."""
        if time.monotonic_ns() < self.control.get("reput_polling_until") - WAKE_MARGIN_NS:
            self.wakes_skipped += 1
            return
        try:
            self.wakes.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass

    # -- admin role -----------------------------------------------------------------------------------

    def _admin(self, frames: list[bytes]) -> None:
        client, meta, header_raw, _ = frames  # the front's own frames
        header = orjson.loads(header_raw)
        arrival = orjson.loads(meta)["t"]
        reply = self._promote(header)
        self.replies.send(pack_replies([(client, -arrival, orjson.dumps(reply))]))

    def _promote(self, header: dict) -> dict:
        role = header.get("role")
        opaque = header.get("opaque")
        if role not in ("ASYNC_MASTER", "SYNC_MASTER"):
            return protocol.reply_header(opaque, "SYSTEM_ERROR", f"a slave can be promoted to ASYNC_MASTER or "
                                                                 f"SYNC_MASTER, not {role!r}")
        if self.follower is None:
            self.control.set("role", ROLE_CODES[role])
            return protocol.reply_header(opaque, "OK", role=role, epoch=self.epochs.current)
        began = time.monotonic()
        self._close_link()
        dropped = self.follower.cut_tail()
        written = self.control.get("written")
        epoch = self.epochs.begin(written)
        self.follower.close()
        self.follower = None
        self.control.set("role", ROLE_CODES[role])  # last: the front opens its write core on seeing it
        log.warning("ha-client: promoted to %s at offset %d, epoch %d", role, written, epoch.epoch)
        return protocol.reply_header(opaque, "OK", role=role, epoch=epoch.epoch, offset=written,
                                     droppedBytes=dropped, tookMs=round((time.monotonic() - began) * 1000, 1))

    # -- statistics ------------------------------------------------------------------------------------

    def follow_min_offset(self, min_offset: int) -> None:
        """The slave's clean service deleted segments: drop their mappings, which hold their
        space until dropped (a slave's disk would otherwise only fill)."""
        if self.follower is not None:
            self.follower.log.segments.forget_deleted_head()

    def statistics(self) -> dict:
        stats = super().statistics()
        if self.epochs is None:  # (not opened yet)
            return stats
        session, follower = self.session, self.follower
        master_end = session.master_end if session is not None else 0
        own = follower.end if follower is not None else self.control.get("written")
        if session is not None and session.master_endpoint:
            self.master_endpoint = session.master_endpoint
        return stats | {"master": self.settings.haMasterAddress, "masterEndpoint": self.master_endpoint,
                        "protocol": self.settings.haProtocol,
                        "following": follower is not None, "connected": bool(session and session.welcomed),
                        "epoch": self.epochs.current, "masterOffset": master_end, "offset": own,
                        "written": self.control.get("written"), "lagBytes": max(0, master_end - own),
                        "lagMs": 0 if self.behind_since_ms is None else monotonic_ms() - self.behind_since_ms,
                        "receivedBytes": follower.appended_bytes if follower is not None else 0,
                        "connects": self.connects, "configSyncs": self.config_syncs, "linkErrors": self.link_errors, "lastError": self.last_error,
                        "diverged": self.diverged, "scrubbedBytes": follower.scrubbed if follower else 0,
                        "popReplica": self.pop_replica.statistics()}

    def close(self) -> None:
        if self.link is not None:
            self._close_link()
        if self.follower is not None:
            self.follower.close()
        super().close()


def write_config(path, content: bytes) -> None:
    """A config file as the master has it, replaced whole (the slave's front re-reads it); a
    full disk closes the link (the master sends its config files again at the next connect)."""
    if not write_whole(path, content, temporary=path.with_name(path.name + ".ha.tmp"), sync=False):
        raise OSError(errno.ENOSPC, f"no room for {path.name}")


def ha_credentials(settings) -> tuple[str, str]:
    """The account a slave proves to a master with aclEnable: haAccessKey / haSecretKey, each
    missing one from MQNODE_ACCESS_KEY / MQNODE_SECRET_KEY (as every client takes its own)."""
    return (settings.haAccessKey or os.environ.get("MQNODE_ACCESS_KEY", ""),
            settings.haSecretKey or os.environ.get("MQNODE_SECRET_KEY", ""))

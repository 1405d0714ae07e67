"""The HA link's logic without I/O: bytes and offsets in, what to send and what to do out.

Both ends of both link protocols share it; the ha-server and ha-client shells (actors.ha_server,
actors.ha_client) own the sockets, the clock and the files.

Two protocols (the setting `haProtocol`):

- `rocketmq`: RocketMQ 4.x's plain-TCP protocol, exactly as spec §12 describes. The slave
  writes 8-byte reports (i64, big-endian: the next CommitLog byte it needs); the master writes
  12-byte headers (i64 start offset, i32 body size) each followed by that many raw CommitLog
  bytes. No handshake: the first report is where the slave stands; 0 means an empty slave, sent
  from the start of the master's last segment. `StreamDecoder` cuts the TCP stream into both.
- `zmq` (the default): one ZeroMQ message per item, its first byte the kind:
      slave  -> master  b"H" + JSON hello {brokerId, maxOffset, epochs, endpoint, popLog}
                        b"P" + JSON proof {accessKey, signature} (the answer to b"A")
                        b"R" + i64 report (as RocketMQ's)
                        b"T" + i64 (the pop log's bytes taken since the welcome; only once b"Q" came)
                        b"B" (goodbye: the master ends the session at once)
                        b"E" (a start-up's question, no session: the master's history)
      master -> slave   b"A" + JSON {challenge} (with `aclEnable`: prove an account first)
                        b"W" + JSON welcome {epochs, maxOffset, keep}
                        b"X" + reason (refused; the master closes its side)
                        b"D" + i64 start offset + raw bytes (empty: the master's heartbeat)
                        b"E" + JSON {epochs, maxOffset} (the answer to b"E")
                        b"C" + file name + NUL + content (a config file changed: SYNCED_CONFIG)
                        b"Q" + b"S"|b"J" + u64 generation + u64 offset + bytes (the pop log:
                        its snapshot's chunks, then its journal's whole frames; at most
                        PopShipper.WINDOW bytes past the slave's last b"T" of what it took)
  The hello carries the slave's epoch history and the welcome the master's, so a slave whose
  log holds bytes the master never had is fenced (shm.epochs.common_prefix) before it follows.
  With the master's ACL on (`aclEnable`), the hello is answered with a fresh random challenge
  instead; the slave's proof signs its hello and that challenge with an account's secret key
  (the requests' HMAC scheme, node.security; `actors.acl.replication_header`), and only an
  account with `admin` or `replication` is welcomed. Before the welcome nothing of the log goes
  out and no report counts; anything else is refused (b"X", the reason). A proof captured on one
  connection fails on any other: its challenge is not asked again.

Flow control (both): the master sends at most `WINDOW` bytes past the slave's last report,
each transfer within one segment and at most `haTransferBatchSize` bytes (blank padding
included, as RocketMQ sends it).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import orjson

from actors.acl import ACL_CONFIG, replication_header
from node.security import signature
from shm import epochs

REPORT = struct.Struct(">q")
HEADER = struct.Struct(">qi")
WINDOW = 8 * 1024 * 1024  # bytes in flight to one slave (the zmq link; TCP has its own buffers too)
MAX_BODY = 64 * 1024 * 1024  # a header announcing more is garbage
MAX_HELLO = 1024 * 1024
HELLO, REPORT_KIND, WELCOME, REFUSED, DATA, BYE, HISTORY, CONFIG = b"H", b"R", b"W", b"X", b"D", b"B", b"E", b"C"
CHALLENGE, PROOF = b"A", b"P"
DIVERGED = "diverged: "  # opens a refusal because the two histories have parted (`admin ha` shows it as `diverged`)
POP_LOG = b"Q"  # + kind + generation u64 + offset u64 + bytes: the pop log's copy (actors.ha_config.PopShipper)
POP_SNAPSHOT, POP_JOURNAL = b"S", b"J"
POP_TAKEN = b"T"  # + int64: the pop log's bytes a slave took since its welcome (sent only to a master that ships them)
POP_AT = struct.Struct(">QQ")
MAX_PROOF = 4096
# the config files a slave keeps in step with its master (RocketMQ's SlaveSynchronize: topics,
# consumer offsets, delay offsets, subscription groups)
SYNCED_CONFIG = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json")
MAX_CONFIG = 64 * 1024 * 1024


def cut_first(dropped: int, keep: int) -> str:
    """The refusal of a follower whose log holds `dropped` bytes past `keep` that the master never
    had: its node's restart cuts them (node.server.fencing), then it follows."""
    return f"{DIVERGED}the follower must first drop {dropped} bytes past {keep} (restart it to truncate)"


_CUT_FIRST = re.compile(re.escape(DIVERGED) + r"the follower must first drop (\d+) bytes past (\d+) ")


def cut_asked(reason: str) -> tuple[int, int] | None:
    """(dropped, keep) of a `cut_first` refusal; None for any other reason."""
    found = _CUT_FIRST.match(reason)
    return (int(found[1]), int(found[2])) if found else None


class LinkError(Exception):
    """The peer broke the protocol: close the link, with this as the logged reason."""


class Superseded(LinkError):
    """The would-be slave began `epoch` past this master's history (shm.epochs.common_prefix):
    this master is an old one."""

    def __init__(self, epoch: int, reason: str):
        super().__init__(reason)
        self.epoch = epoch


# -- master side ---------------------------------------------------------------------------------------


@dataclass
class Transfer:
    offset: int
    size: int  # 0: a heartbeat


class MasterSession:
    """One slave's connection, as the master sees it. `now_ms` is the shell's monotonic clock."""

    def __init__(self, settings, now_ms: int, *, handshake: bool):
        self.segment_size = settings.mappedFileSizeCommitLog
        self.listen = settings.client_endpoint  # the master's, told to its slaves
        self.batch = settings.haTransferBatchSize
        self.heartbeat_ms = settings.haSendHeartbeatInterval
        self.housekeeping_ms = settings.haHousekeepingInterval
        self.handshake = handshake  # zmq: a hello comes first; rocketmq: the first report
        self.broker_id: int | None = None
        self.endpoint = ""
        self.pop_log = False  # its hello asked for the pop log's copy (b"Q" items)
        self.started = False  # data may flow (after the hello, or the first report)
        self.request_offset = -1
        self.acked = 0
        self.next_offset = 0
        self.last_read_ms = self.last_write_ms = now_ms
        self.sent_bytes = 0
        self.lag_since_ms: int | None = None  # when the slave last fell behind (for lag in ms)

    # what arrives

    def on_hello(self, payload: bytes, master_epochs: list[epochs.Epoch], master_end: int, now_ms: int) -> bytes:
        """The zmq hello: the welcome to send back. LinkError when it cannot follow."""
        self.last_read_ms = now_ms
        if self.started:
            raise LinkError("a second hello on one link")
        if len(payload) > MAX_HELLO:
            raise LinkError("the hello is too large")
        try:
            hello = orjson.loads(payload)
            broker_id, max_offset = hello["brokerId"], hello["maxOffset"]
            follower = epochs.from_wire(hello["epochs"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise LinkError(f"a malformed hello: {e}") from None
        if type(broker_id) is not int or broker_id < 1 or type(max_offset) is not int or max_offset < 0:
            raise LinkError("a hello needs brokerId >= 1 and maxOffset >= 0")
        fence = epochs.common_prefix(master_epochs, master_end, follower, max_offset)
        if fence.superseded:
            raise Superseded(fence.superseded, DIVERGED + fence.refusal)
        if fence.refusal:
            raise LinkError(DIVERGED + fence.refusal)
        if fence.dropped:  # the follower cuts its tail at its next start (node.server.fencing), then comes back
            raise LinkError(cut_first(fence.dropped, fence.keep))
        if max_offset > master_end:
            raise LinkError(f"the follower's offset {max_offset} is past the master's end {master_end}")
        self.broker_id, self.endpoint = broker_id, str(hello.get("endpoint", ""))[:256]
        self.pop_log = hello.get("popLog") is True
        self._start(max_offset, master_end)
        return WELCOME + orjson.dumps({"epochs": [[e.epoch, e.start, e.token] for e in master_epochs],
                                       "maxOffset": master_end, "keep": fence.keep, "endpoint": self.listen})

    def on_report(self, offset: int, master_end: int, now_ms: int) -> None:
        """A report (the slave's max offset). LinkError for one past the master's end."""
        self.last_read_ms = now_ms
        if offset < 0:
            raise LinkError(f"a negative report {offset}")
        if not self.started:
            if self.handshake:
                raise LinkError("a report before the hello")
            self._start(offset, master_end)
            return
        if offset > master_end:
            raise LinkError(f"the slave reports {offset}, past the master's end {master_end}")
        if offset > self.acked:
            self.acked = offset
            if offset >= master_end:
                self.lag_since_ms = None

    def _start(self, offset: int, master_end: int) -> None:
        if offset > master_end:
            raise LinkError(f"the slave asks for {offset}, past the master's end {master_end}")
        self.request_offset = self.acked = self.next_offset = offset
        if offset == 0 and not self.handshake:  # RocketMQ: an empty slave starts at the master's last segment
            self.next_offset = self.acked = master_end - master_end % self.segment_size
        # (the zmq link sends an empty slave everything the master still has: next_transfer)
        self.started = True

    # what to send

    def next_transfer(self, readable_end: int, min_offset: int, now_ms: int) -> Transfer | None:
        """The next transfer to send, if any: data below `readable_end` (within one segment, at
        most a batch, at most WINDOW past the last report), else a heartbeat when one is due."""
        if not self.started:
            return None
        if self.next_offset < min_offset and self.request_offset == 0 and self.sent_bytes == 0:
            self.next_offset = self.acked = min_offset  # an empty slave: from the first byte the master has
        if self.next_offset < min_offset:  # cleaned away on the master meanwhile: nothing to send from
            raise LinkError(f"the slave needs {self.next_offset}, below the master's min offset {min_offset}")
        if readable_end > self.acked and self.lag_since_ms is None:
            self.lag_since_ms = now_ms
        room = self.acked + WINDOW - self.next_offset
        if self.next_offset < readable_end and room > 0:
            segment_end = self.next_offset - self.next_offset % self.segment_size + self.segment_size
            size = min(readable_end, segment_end) - self.next_offset
            size = min(size, self.batch, room)
            transfer = Transfer(self.next_offset, size)
            self.next_offset += size
            self.sent_bytes += size
            self.last_write_ms = now_ms
            return transfer
        if now_ms - self.last_write_ms >= self.heartbeat_ms:
            self.last_write_ms = now_ms
            return Transfer(self.next_offset, 0)
        return None

    def expired(self, now_ms: int) -> bool:
        """Housekeeping: nothing heard from the slave for haHousekeepingInterval."""
        return now_ms - self.last_read_ms > self.housekeeping_ms

    def lag_ms(self, master_end: int, now_ms: int) -> int:
        return 0 if self.acked >= master_end or self.lag_since_ms is None else now_ms - self.lag_since_ms

    def statistics(self, master_end: int, now_ms: int) -> dict:
        return {"brokerId": self.broker_id, "endpoint": self.endpoint, "ackedOffset": self.acked,
                "lagBytes": max(0, master_end - self.acked), "lagMs": self.lag_ms(master_end, now_ms),
                "sentBytes": self.sent_bytes, "nextOffset": self.next_offset}


# -- slave side ------------------------------------------------------------------------------------------


class SlaveSession:
    """The follower's end of one link: checks each transfer lands at its own end."""

    def __init__(self, settings, max_offset: int, now_ms: int, *, handshake: bool):
        self.heartbeat_ms = settings.haSendHeartbeatInterval
        self.housekeeping_ms = settings.haHousekeepingInterval
        self.handshake = handshake
        self.max_offset = max_offset  # the end of what it holds (a record may be cut in two here)
        self.welcomed = not handshake
        self.master_end = 0
        self.master_endpoint = ""
        self.reported = -1
        self.last_report_ms = now_ms
        self.last_read_ms = now_ms
        self.received_bytes = 0

    def hello(self, broker_id: int, history: list[epochs.Epoch], endpoint: str) -> bytes:
        return HELLO + orjson.dumps({"brokerId": broker_id, "maxOffset": self.max_offset,
                                     "epochs": [[e.epoch, e.start, e.token] for e in history], "endpoint": endpoint,
                                     "popLog": True})

    def on_welcome(self, payload: bytes, now_ms: int) -> list[epochs.Epoch]:
        """The master's history, to adopt. LinkError when it says this log must be cut first."""
        self.last_read_ms = now_ms
        try:
            welcome = orjson.loads(payload)
            history = epochs.from_wire(welcome["epochs"])
            keep, self.master_end = int(welcome["keep"]), int(welcome["maxOffset"])
            self.master_endpoint = str(welcome.get("endpoint", ""))[:256]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise LinkError(f"a malformed welcome: {e}") from None
        if keep != self.max_offset:
            raise LinkError(f"the master keeps this log only below {keep}, not {self.max_offset}")
        self.welcomed = True
        return history

    def on_data(self, offset: int, size: int, now_ms: int) -> bool:
        """A transfer's header: whether it carries bytes to append at `offset` (False: a heartbeat).
        LinkError when it does not land at this log's end (RocketMQ's check)."""
        self.last_read_ms = now_ms
        if not self.welcomed:
            raise LinkError("data before the welcome")
        if size < 0 or size > MAX_BODY:
            raise LinkError(f"a transfer of {size} bytes")
        if size and offset != self.max_offset and self.max_offset:  # (an empty log starts where told)
            raise LinkError(f"a transfer at {offset}, but this log ends at {self.max_offset}")
        return size > 0

    def appended(self, end: int) -> None:
        self.received_bytes += end - self.max_offset
        self.max_offset = end

    def report_due(self, now_ms: int) -> bool:
        """After an append that moved the end, or as the heartbeat (haSendHeartbeatInterval)."""
        if not self.welcomed:
            return False
        return self.max_offset != self.reported or now_ms - self.last_report_ms >= self.heartbeat_ms

    def report(self, now_ms: int) -> bytes:
        self.reported, self.last_report_ms = self.max_offset, now_ms
        return REPORT.pack(self.max_offset)

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.last_read_ms > self.housekeeping_ms


# -- the RocketMQ link's byte stream ---------------------------------------------------------------------


class StreamDecoder:
    """Cuts a TCP byte stream into the RocketMQ link's items: the master reads 8-byte reports
    (only the last complete one matters, as RocketMQ reads them), the slave reads (offset,
    body) transfers. Holds at most one item's bytes plus a read."""

    def __init__(self):
        self.buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self.buffer += data

    def reports(self) -> list[int]:
        whole = len(self.buffer) - len(self.buffer) % REPORT.size
        values = [REPORT.unpack_from(self.buffer, at)[0] for at in range(0, whole, REPORT.size)]
        del self.buffer[:whole]
        return values

    def transfers(self) -> list[tuple[int, bytes]]:
        out, at = [], 0
        while len(self.buffer) - at >= HEADER.size:
            offset, size = HEADER.unpack_from(self.buffer, at)
            if size < 0 or size > MAX_BODY:
                raise LinkError(f"a transfer header announcing {size} bytes")
            if len(self.buffer) - at - HEADER.size < size:
                break
            out.append((offset, bytes(self.buffer[at + HEADER.size: at + HEADER.size + size])))
            at += HEADER.size + size
        del self.buffer[:at]
        return out


def config_message(name: str, content: bytes) -> bytes:
    return CONFIG + name.encode() + b"\0" + content


def parse_config(payload) -> tuple[str, bytes]:
    """A b"C" item's (file name, content); LinkError unless the name is one SYNCED_CONFIG or
    ACL_CONFIG names."""
    name, separator, content = bytes(payload).partition(b"\0")
    text = name.decode("utf-8", "replace")
    if not separator or text not in (*SYNCED_CONFIG, ACL_CONFIG) or len(content) > MAX_CONFIG:
        raise LinkError(f"a config item for {text[:40]!r}, not one of {', '.join(SYNCED_CONFIG)}, {ACL_CONFIG}")
    return text, content


def pop_message(kind: bytes, gen: int, offset: int, data: bytes) -> bytes:
    return POP_LOG + kind + POP_AT.pack(gen, offset) + data


def parse_pop(payload) -> tuple[bytes, int, int, bytes]:
    """A b"Q" item's (kind, generation, offset, bytes); LinkError for anything else."""
    if len(payload) < 1 + POP_AT.size or bytes(payload[:1]) not in (POP_SNAPSHOT, POP_JOURNAL) or \
            len(payload) > 1 + POP_AT.size + MAX_BODY:
        raise LinkError(f"a malformed pop log item ({len(payload)} bytes)")
    gen, offset = POP_AT.unpack_from(payload, 1)
    return bytes(payload[:1]), gen, offset, bytes(payload[1 + POP_AT.size:])


def challenge_message(challenge: str) -> bytes:
    return CHALLENGE + orjson.dumps({"challenge": challenge})


def parse_challenge(payload) -> str:
    """The master's challenge; LinkError for one that does not parse."""
    try:
        challenge = orjson.loads(bytes(payload))["challenge"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise LinkError(f"a malformed challenge: {e}") from None
    if not isinstance(challenge, str) or not 16 <= len(challenge) <= 256:
        raise LinkError("a challenge must be 16 to 256 characters")
    return challenge


def proof_message(access_key: str, secret_key: str, challenge: str, hello: bytes) -> bytes:
    """The slave's answer: its hello's payload (`hello`, without the kind byte) and the challenge,
    signed with its account's secret key."""
    header = replication_header(access_key, challenge)
    return PROOF + orjson.dumps({"accessKey": access_key, "signature": signature(secret_key, header, hello)})


def parse_proof(payload) -> dict:
    """A proof's {accessKey, signature}; LinkError for one that does not parse."""
    if len(payload) > MAX_PROOF:
        raise LinkError("the proof is too large")
    try:
        proof = orjson.loads(bytes(payload))
    except orjson.JSONDecodeError as e:
        raise LinkError(f"a malformed proof: {e}") from None
    if not isinstance(proof, dict):
        raise LinkError("a proof must be an object {accessKey, signature}")
    return proof

"""Turning send requests into CommitLog records. No I/O.

Used by the ingress workers (or by the append writer itself when `ingressWorkers = 0`): each
request's messages are validated and encoded into one shared `EncodedBatch`; a `PendingSend`
remembers where its records sit in the batch so the writer can answer once they are placed
(`actors.sendreply`). The one-pass encoders of coalesced sends and client batches are the codec's.

Stored properties follow the 4.9 broker (spec §2.7): the client's map, plus CLUSTER, minus WAIT
(which only decides whether the send waits for the flush), serialised in Java HashMap order. A
send with a delay level or a timer is moved where `actors.delays` says (SCHEDULE_TOPIC_XXXX
or the timer topic, with REAL_TOPIC/REAL_QID), on the one-pass path as on the general one.
"""

from __future__ import annotations

import ipaddress
import struct
import time
from dataclasses import dataclass, field

from node import protocol
from actors.delays import SCHEDULING, SPECIAL, Delays
from shm import codec
from shm.codec import (
    MAX_PROPERTIES_BYTES,
    PROPERTY_CLUSTER,
    PROPERTY_DELAY,
    PROPERTY_INNER_NUM,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION,
    PROPERTY_UNIQ_KEY,
    PROPERTY_WAIT,
    SCHEDULE_TOPIC,
    MessageIllegal,
    encode,
    encode_host,
    encode_v4,
    find_uniq_key,
    parse_properties,
    properties_string,
    topic_bytes,
)
from shm.encoded_batch import EncodedBatch
from shm.javacompat import hashmap_capacity


@dataclass(slots=True)
class PendingSend:
    """One client request on its way through the write path."""

    client: bytes
    opaque: object
    code: int
    arrival_ns: int
    oneway: bool = False
    wait: bool = True  # any message of the request waits for the flush (WAIT not "false")
    # per message: the record's index in the batch, or -1 when refused (see `refusals`)
    indices: list[int] = field(default_factory=list)
    refusals: dict[int, tuple[str, str]] = field(default_factory=dict)
    uniq_keys: list[str | None] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    queue_ids: list[int] = field(default_factory=list)
    compact: bool = False  # SEND_MESSAGES asked for the compact reply (docs/protocol.md)

    def to_wire(self) -> list:
        return [self.client.hex(), self.opaque, self.code, self.arrival_ns, self.oneway, self.wait,
                self.indices, {str(k): v for k, v in self.refusals.items()}, self.uniq_keys, self.topics,
                self.queue_ids, self.compact]

    @classmethod
    def from_wire(cls, item: list) -> PendingSend:
        return cls(bytes.fromhex(item[0]), item[1], item[2], item[3], item[4], item[5], item[6],
                   {int(k): tuple(v) for k, v in item[7].items()}, item[8], item[9], item[10], item[11])


class SendEncoder:
    def __init__(self, settings, clock=time.time):
        self.settings = settings
        self.store_host = encode_host(*settings.store_address)
        self.cluster = settings.brokerClusterName
        self.delay_levels = len(settings.delay_levels_ms())
        self.delays = Delays(settings, clock)
        self._born_cache: dict[str, bytes] = {}
        # the codec's one-pass encoders: in C where it was built, else in Python
        self._messages_v4 = codec.encode_messages_v4
        self._batch_v4 = codec.encode_batch_v4

    @property
    def native(self) -> bool:
        """Whether the one-pass encoders run in C (`statistics()` shows it as nativeEncode)."""
        return self._messages_v4 is codec.encode_messages_v4_c

    def born_host(self, text: str | None) -> bytes:
        """`ip:port` (or `[v6]:port`) as record bytes; absent -> 127.0.0.1:0. The front refuses
        a malformed one (actors.edge), so what reaches here parses."""
        raw = self._born_cache.get(text or "")
        if raw is None:
            raw = _parse_host(text) or encode_host("127.0.0.1", 0)
            if len(self._born_cache) < 10000:
                self._born_cache[text or ""] = raw
        return raw

    # -- requests -> records ---------------------------------------------------------------------

    def add_request(self, pending: PendingSend, header: dict, body: bytes, born: bytes, batch: EncodedBatch) -> None:
        """Encode the request's messages into `batch`; refusals are recorded in `pending`.
        Raises ProtocolError for a request that is malformed as a whole."""
        code = header["code"]
        pending.oneway = bool(header.get("oneway", False))
        if code == protocol.SEND_MESSAGE and "_reput" in header:
            self._add_reput(pending, header, body, born, batch)
        elif code == protocol.SEND_MESSAGES and header.get("_reput") is True:
            self._add_reputs(pending, header, body, batch)
        elif code == protocol.SEND_MESSAGE:
            pending.wait = self._add_message(pending, header, body, born, batch)
        elif code == protocol.SEND_MESSAGES:
            self._add_messages(pending, header, body, born, batch)
        elif code == protocol.SEND_BATCH_MESSAGE and header.get("oneHalf") is True:
            self._add_half_batch(pending, header, body, born, batch)
        elif code == protocol.SEND_BATCH_MESSAGE:
            self._add_batch(pending, header, body, born, batch)
        else:
            raise protocol.ProtocolError(f"code {code} is not a send")

    def _add_reput(self, pending, header, body, born, batch) -> None:
        """The schedule service's re-put (it came over the node's private socket, never from a
        client): a stored record's fields as given, its properties string stored as it was, so
        a delivered delayed message keeps DELAY, REAL_TOPIC and REAL_QID as RocketMQ 4.9's does.
        With `delay` (a send-back's retry) it goes through SCHEDULE_TOPIC_XXXX like any delayed
        send. A send-back (`wait`) is answered once stored as the mode promises, as the consumer
        is told it is stored; deliveries are `_add_reputs`'."""
        reput = header["_reput"]
        if reput.get("inner"):
            return self._add_committed_batch(pending, header, body, born, batch)
        topic, queue_id, properties = header["topic"], header["queueId"], reput["properties"]
        delay = reput.get("delay", 0)
        if delay > 0:
            props = parse_properties(properties)
            props[PROPERTY_DELAY], props[PROPERTY_REAL_TOPIC], props[PROPERTY_REAL_QID] = str(delay), topic, str(queue_id)
            properties, topic, queue_id = properties_string(props), SCHEDULE_TOPIC, min(delay, self.delay_levels) - 1
        index = len(pending.indices)
        pending.wait = reput.get("wait", False) is True
        pending.topics.append(topic)
        pending.queue_ids.append(queue_id)
        pending.uniq_keys.append(find_uniq_key(properties))
        pending.indices.append(-1)
        if header.get("_refused"):  # by the front's topic table (a topic deleted since)
            pending.refusals[index] = tuple(header["_refused"])
            return
        try:
            record = self._encode(topic, body, queue_id, header.get("flag", 0), header.get("bornTimestamp", 0), born,
                                  properties, header.get("reconsumeTimes", 0), reput.get("sysFlag", 0),
                                  reput.get("prepared", 0))
        except MessageIllegal as e:
            pending.refusals[index] = (e.status, e.remark)
            return
        pending.indices[index] = len(batch)
        self._add(batch, record, topic, queue_id, born)

    def _add_committed_batch(self, pending, header, body, born, batch) -> None:
        """A one-half batch's commit (`actors.reput.commit_batch_item`): each message of the
        half's batch body stored for the real topic and queue as a batch of halves' commits are
        (its own properties, then the half's after a 0x02; sysFlag COMMIT; PREPAREDTRANSACTIONOFFSET
        the half's offset), in one pass where the C encoder takes it."""
        reput = header["_reput"]
        topic, queue_id, suffix = header["topic"], header["queueId"], reput["properties"]
        transaction, prepared = reput["sysFlag"] & codec.TRANSACTION_MASK, reput["prepared"]
        born_timestamp = header.get("bornTimestamp", 0)
        pending.wait = True
        refused = header.get("_refused")  # by the front's topic table (the real topic deleted since)
        encoded = self._batch_v4(body, topic_bytes(topic), queue_id, born_timestamp, born, self.store_host,
                                 suffix.encode(), self.settings.maxMessageSize, protocol.MAX_MESSAGES_PER_REQUEST) \
            if not refused and len(born) == 8 and len(self.store_host) == 8 else None
        if encoded is not None:
            records, sizes, uniq_keys = encoded
            codec.set_transaction(records, sizes, transaction, prepared)
            start = len(batch)
            batch.add_many_v4(records, sizes, [f"{topic}-{queue_id}"] * len(sizes))
            indices = range(start, start + len(sizes))
        else:
            inner = protocol.decode_batch_body(body)  # (the node's own record: it parsed when it was stored)
            uniq_keys = [find_uniq_key(props) for _, _, props in inner]
            indices = []
            for body_bytes, flag, props in inner:
                try:
                    if refused:
                        raise MessageIllegal(*refused)
                    record = self._encode(topic, body_bytes, queue_id, flag, born_timestamp, born,
                                          _joined(props, suffix), 0, transaction, prepared)
                except MessageIllegal as e:
                    pending.refusals[len(pending.indices) + len(indices)] = (e.status, e.remark)
                    indices.append(-1)
                    continue
                indices.append(len(batch))
                self._add(batch, record, topic, queue_id, born)
        pending.topics += [topic] * len(indices)
        pending.queue_ids += [queue_id] * len(indices)
        pending.uniq_keys += uniq_keys
        pending.indices += indices

    def _add_reputs(self, pending, header, body, batch) -> None:
        """The schedule service's deliveries, many to a request (`_reput: true` on a
        SEND_MESSAGES): each message a `_reput` re-put with its own born host. One request per
        few hundred deliveries is what lets a level's backlog go out at tens of thousands a
        second. They are answered once stored as the mode promises (flushed, under SYNC_FLUSH):
        the schedule service counts a delivery done on its answer and persists its offsets by
        it, so an answer before the disk could, after a power loss, skip a message whose
        delivered copy was lost. (RocketMQ's re-put does not wait.)"""
        pending.compact = header.get("compact") is True
        at = 0
        for item in header["messages"]:
            size = item["bodySize"]
            self._add_reput(pending, item, body[at: at + size], self.born_host(item.get("bornHost")), batch)
            at += size
        pending.wait = True

    def _add_messages(self, pending, header, body, born, batch) -> None:
        messages = header.get("messages")
        if not isinstance(messages, list) or not 0 < len(messages) <= protocol.MAX_MESSAGES_PER_REQUEST:
            raise protocol.ProtocolError(f"`messages` must be a list of 1 to {protocol.MAX_MESSAGES_PER_REQUEST}")
        at = 0
        for item in messages:
            size = item.get("bodySize") if isinstance(item, dict) else None
            if not isinstance(size, int) or size < 0 or at + size > len(body):
                raise protocol.ProtocolError("each message needs a `bodySize` and the sizes must add up to the body")
            at += size
        if at != len(body):
            raise protocol.ProtocolError(f"bodies add up to {at} bytes but the body frame holds {len(body)}")
        pending.compact = header.get("compact") is True
        if self._add_messages_v4(pending, messages, body, born, batch):
            return
        at, waits = 0, False
        for item in messages:
            size = item["bodySize"]
            waits = self._add_message(pending, item, body[at: at + size], born, batch) or waits
            at += size
        pending.wait = waits

    def _add_messages_v4(self, pending, messages: list[dict], body: bytes, born: bytes, batch) -> bool:
        """`_add_messages` in one pass for the common case (`shm.codec.encode_messages_v4`), in C where it
        was built. False leaves `pending` and `batch` untouched for the general path, which
        names whatever is wrong."""
        asked = None
        if any(type(m) is dict and type(m.get("properties")) is dict and not SPECIAL.isdisjoint(m["properties"])
               for m in messages):
            asked, messages = messages, self.delays.scheduled_items(messages)
            if messages is None:
                return False
        encoded = self._messages_v4(messages, body, born, self.store_host, self.settings.maxMessageSize,
                                    self.cluster)
        if encoded is None:
            return False
        records, sizes, queue_keys, topics, queue_ids, uniq_keys, waits = encoded
        if asked is not None:  # a delayed send is answered with the topic and queue it asked for
            topics, queue_ids = [m["topic"] for m in asked], [m["queueId"] for m in asked]
        first = len(batch)
        batch.add_many_v4(records, sizes, queue_keys)
        pending.wait = waits
        pending.topics += topics
        pending.queue_ids += queue_ids
        pending.indices += range(first, first + len(sizes))
        pending.uniq_keys += uniq_keys
        return True

    def _add_message(self, pending, header, body, born, batch) -> bool:
        """Encode one message into `batch` (or record its refusal); returns whether it was
        stored and waits for the flush (WAIT not "false"). The caller sets `pending.wait`: a
        coalesced request waits if any of its sends does, so one WAIT=false send never speeds
        the others' acks past the disk."""
        index = len(pending.indices)
        topic, queue_id = header.get("topic"), header.get("queueId")
        pending.topics.append(topic if isinstance(topic, str) else "")
        pending.queue_ids.append(queue_id if isinstance(queue_id, int) else -1)
        pending.indices.append(-1)
        pending.uniq_keys.append(None)
        refused = header.get("_refused")  # set by the front (unknown topic, bad queue id)
        if refused:
            pending.refusals[index] = tuple(refused)
            return False
        try:
            properties = _client_properties(header.get("properties"))
            waits = properties.get(PROPERTY_WAIT) != "false"
            capacity = hashmap_capacity(len(properties) + (PROPERTY_CLUSTER not in properties))
            properties[PROPERTY_CLUSTER] = self.cluster
            properties.pop(PROPERTY_WAIT, None)
            pending.uniq_keys[index] = properties.get(PROPERTY_UNIQ_KEY)
            if not SCHEDULING.isdisjoint(properties):
                topic, queue_id, capacity = self._delay(properties, topic, queue_id, capacity)
            flag, reconsume_times = header.get("flag", 0), header.get("reconsumeTimes", 0)
            if type(flag) is not int or type(reconsume_times) is not int:  # ints beyond int32: struct.error
                flag, reconsume_times = _int(flag, "flag"), _int(reconsume_times, "reconsumeTimes")
            born_timestamp = _int(header.get("bornTimestamp", 0), "bornTimestamp")
            if len(born) == 8 and len(self.store_host) == 8:  # the common case, inlined
                record = encode_v4(topic_bytes(topic), body, queue_id, flag, 0, born_timestamp, born,
                                   self.store_host, properties_string(properties, capacity).encode(),
                                   reconsume_times, self.settings.maxMessageSize)
                pending.indices[index] = len(batch)
                batch.add_v4(record, f"{topic}-{queue_id}")
                return waits
            record = self._encode(topic, body, queue_id, flag, born_timestamp, born,
                                  properties_string(properties, capacity), reconsume_times)
        except MessageIllegal as e:
            pending.refusals[index] = (e.status, e.remark)
            return False
        except struct.error:
            pending.refusals[index] = ("MESSAGE_ILLEGAL", "queueId, flag or reconsumeTimes is out of the int32 range")
            return False
        pending.indices[index] = len(batch)
        self._add(batch, record, topic, queue_id, born)
        return waits

    def _encode(self, topic: str, body: bytes, queue_id: int, flag: int, born_timestamp: int, born: bytes,
                properties: str, reconsume_times: int, sys_flag: int = 0, prepared: int = 0) -> bytes:
        """`prepared`: a transaction's commit names its half's CommitLog offset (PREPAREDTRANSACTIONOFFSET)."""
        if len(born) == 8 and len(self.store_host) == 8:
            return encode_v4(topic_bytes(topic), body, queue_id, flag, sys_flag, born_timestamp, born, self.store_host,
                             properties.encode("utf-8"), reconsume_times, self.settings.maxMessageSize, prepared)
        return encode(topic=topic, body=body, queue_id=queue_id, flag=flag, sys_flag=sys_flag,
                      born_timestamp=born_timestamp, born_host=born, store_host=self.store_host, properties=properties,
                      reconsume_times=reconsume_times, max_message_size=self.settings.maxMessageSize,
                      prepared_transaction_offset=prepared)

    @staticmethod
    def _add(batch: EncodedBatch, record: bytes, topic: str, queue_id: int, born: bytes) -> None:
        if len(born) == 8:
            batch.add_v4(record, f"{topic}-{queue_id}")
        else:
            batch.add(record, topic)

    def _delay(self, properties: dict, topic: str, queue_id: int, capacity: int) -> tuple[str, int, int]:
        """The general path's `scheduled`, with the map's bucket count it leaves."""
        topic, queue_id = self.delays.scheduled(properties, topic, queue_id)
        return topic, queue_id, max(capacity, hashmap_capacity(len(properties)))

    def _add_batch(self, pending, header, body, born, batch) -> None:
        """SEND_BATCH_MESSAGE: inner messages keep their own properties bytes, then the batch's
        (header properties plus CLUSTER) after a 0x02, as the 4.9 broker stores them."""
        topic, queue_id = header.get("topic"), header.get("queueId")
        refused = header.get("_refused")
        if refused is None and self._add_batch_v4(pending, header, body, born, batch):
            return
        inner = protocol.decode_batch_body(body)
        try:
            batch_props = _client_properties(header.get("properties"))
        except MessageIllegal as e:
            refused, batch_props = refused or (e.status, e.remark), {}
        if batch_props.get(PROPERTY_WAIT) == "false":
            pending.wait = False
        asked = (topic, queue_id)  # (what the reply names: a batch of halves is stored elsewhere)
        if refused is None and _transactional(batch_props):
            try:
                topic, queue_id = self.delays.half_batch(batch_props, topic, queue_id)
            except MessageIllegal as e:
                refused = (e.status, e.remark)
        held_back = DELAYING if _transactional(batch_props) else SCHEDULING  # (a half's own TRAN_MSG is fine)
        if refused is None and (not held_back.isdisjoint(batch_props)
                                or any(not SCHEDULING.isdisjoint(parse_properties(props)) for _, _, props in inner)):
            refused = ("MESSAGE_ILLEGAL", "a batch may carry neither a DELAY level nor a timer (TIMER_*) nor "
                                          "TRAN_MSG, in its header or in a message")
        batch_props[PROPERTY_CLUSTER] = self.cluster
        suffix = properties_string(batch_props)
        born_timestamp = 0
        try:
            born_timestamp = _int(header.get("bornTimestamp", 0), "bornTimestamp")
        except MessageIllegal as e:
            refused = refused or (e.status, e.remark)
        for body_bytes, flag, inner_props in inner:
            index = len(pending.indices)
            pending.topics.append(asked[0] if isinstance(asked[0], str) else "")
            pending.queue_ids.append(asked[1] if isinstance(asked[1], int) else -1)
            pending.indices.append(-1)
            pending.uniq_keys.append(find_uniq_key(inner_props))
            if refused:
                pending.refusals[index] = tuple(refused)
                continue
            try:
                record = self._encode(topic, body_bytes, queue_id, flag, born_timestamp, born,
                                      _joined(inner_props, suffix), 0)
            except MessageIllegal as e:
                pending.refusals[index] = (e.status, e.remark)
                continue
            except struct.error:
                pending.refusals[index] = ("MESSAGE_ILLEGAL", "queueId or flag is out of the int32 range")
                continue
            pending.indices[index] = len(batch)
            self._add(batch, record, topic, queue_id, born)
        if any(i < 0 for i in pending.indices) and len(pending.refusals) < len(pending.indices):
            # a client batch is all or nothing: refuse the rest with the first reason
            reason = next(iter(pending.refusals.values()))
            raise _BatchRefused(reason)

    def _add_half_batch(self, pending, header, body, born, batch) -> None:
        """A SEND_BATCH_MESSAGE with `oneHalf` (mqnode's, for all-or-nothing writes: docs/protocol.md
        "Transactions"): the whole batch stored as ONE half, its body the batch body as sent, its
        properties the batch's (TRAN_MSG and PGROUP required) with REAL_TOPIC, REAL_QID and
        INNER_NUM, the message count. One end then commits or rolls back every message of it; a
        commit stores each one as a batch of halves' commits would have been stored."""
        topic, queue_id = header.get("topic"), header.get("queueId")
        inner = protocol.decode_batch_body(body)  # ProtocolError: the client's bytes do not parse
        pending.topics.append(topic if isinstance(topic, str) else "")
        pending.queue_ids.append(queue_id if isinstance(queue_id, int) else -1)
        pending.uniq_keys.append(",".join(find_uniq_key(props) or "" for _, _, props in inner))
        pending.indices.append(-1)
        try:
            refused = header.get("_refused")
            if refused:
                raise MessageIllegal(*refused)
            batch_props = _client_properties(header.get("properties"))
            if not _transactional(batch_props):
                raise MessageIllegal("MESSAGE_ILLEGAL", "`oneHalf` stores a batch of halves: its properties need "
                                                        "TRAN_MSG=true and PGROUP")
            if not DELAYING.isdisjoint(batch_props) or any(not SCHEDULING.isdisjoint(parse_properties(props))
                                                           for _, _, props in inner):
                raise MessageIllegal("MESSAGE_ILLEGAL", "a batch may carry neither a DELAY level nor a timer "
                                                        "(TIMER_*), in its header or in a message")
            half_topic, half_queue = self.delays.half_batch(batch_props, topic, queue_id)
            batch_props.pop(PROPERTY_INNER_NUM, None)
            batch_props[PROPERTY_CLUSTER] = self.cluster
            pending.wait = batch_props.get(PROPERTY_WAIT) != "false"
            # INNER_NUM last, after what each committed message's suffix is: its commit takes it off exactly
            properties = f"{properties_string(batch_props)}\x02{PROPERTY_INNER_NUM}\x01{len(inner)}"
            record = self._encode(half_topic, body, half_queue, 0, _int(header.get("bornTimestamp", 0), "bornTimestamp"),
                                  born, properties, 0)
        except MessageIllegal as e:
            pending.refusals[0] = (e.status, e.remark)
            return
        pending.indices[0] = len(batch)
        self._add(batch, record, half_topic, half_queue, born)

    def _add_batch_v4(self, pending, header, body, born, batch) -> bool:
        """`_add_batch` in one pass over the client's batch body, for the common case: IPv4
        hosts, ASCII properties, nothing refused. False leaves `pending` and `batch` untouched
        for the general path, which writes the same bytes and names whatever is wrong."""
        topic, queue_id = header.get("topic"), header.get("queueId")
        if len(born) != 8 or len(self.store_host) != 8 or not isinstance(topic, str) or type(queue_id) is not int:
            return False
        try:
            batch_props = _client_properties(header.get("properties"))
            born_timestamp = _int(header.get("bornTimestamp", 0), "bornTimestamp")
        except MessageIllegal:
            return False
        asked = (topic, queue_id)
        if _transactional(batch_props) and DELAYING.isdisjoint(batch_props):
            try:  # a batch of halves (mqnode): stored in the half queue, its real topic and queue named
                topic, queue_id = self.delays.half_batch(batch_props, topic, queue_id)
            except MessageIllegal:
                return False  # (the general path names what is wrong)
        elif not SCHEDULING.isdisjoint(batch_props):  # (refused by the general path; a message's own too)
            return False
        wait = batch_props.get(PROPERTY_WAIT) != "false"
        batch_props[PROPERTY_CLUSTER] = self.cluster
        encoded = self._batch_v4(body, topic_bytes(topic), queue_id, born_timestamp, born, self.store_host,
                                 properties_string(batch_props).encode(), self.settings.maxMessageSize,
                                 protocol.MAX_MESSAGES_PER_REQUEST)  # (None for a queueId beyond int32)
        if encoded is None:
            return False
        records, sizes, uniq_keys = encoded
        n = len(sizes)
        first = len(batch)
        batch.add_many_v4(records, sizes, [f"{topic}-{queue_id}"] * n)
        topic, queue_id = asked
        pending.wait = pending.wait and wait
        pending.topics += [topic] * n
        pending.queue_ids += [queue_id] * n
        pending.indices += range(first, first + n)
        pending.uniq_keys += uniq_keys
        return True




def _joined(inner_props: str, suffix: str) -> str:
    """A batch message's stored properties: its own, then the batch's after a 0x02 (4.9's)."""
    if not suffix:
        return inner_props
    return inner_props + suffix if inner_props.endswith("\x02") or not inner_props else inner_props + "\x02" + suffix


DELAYING = SCHEDULING - {PROPERTY_TRANSACTION}  # the names a batch may never carry


def _transactional(properties: dict) -> bool:
    """A batch of halves: TRAN_MSG "true" in its header (mqnode's; RocketMQ refuses such batches)."""
    return properties.get(PROPERTY_TRANSACTION) == "true"


class _BatchRefused(Exception):
    def __init__(self, reason: tuple[str, str]):
        super().__init__(reason[1])
        self.reason = reason


def add_request_atomic(encoder: SendEncoder, pending: PendingSend, header: dict, body: bytes, born: bytes,
                       batch: EncodedBatch) -> None:
    """`add_request`, all or nothing: on any failure the request's records leave the batch again.
    A refused client batch becomes per-message refusals; other failures propagate."""
    mark = (len(batch.data), len(batch))
    try:
        encoder.add_request(pending, header, body, born, batch)
    except BaseException as e:
        del batch.data[mark[0]:]
        for column in (batch.positions, batch.sizes, batch.queue_keys, batch.timestamp_offsets):
            del column[mark[1]:]
        if not isinstance(e, _BatchRefused):
            raise
        pending.indices = [-1] * len(pending.indices)
        pending.refusals = {i: e.reason for i in range(len(pending.indices))}


# -- small pieces ------------------------------------------------------------------------------------


def _client_properties(value) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):
        if len(value) > MAX_PROPERTIES_BYTES:
            raise MessageIllegal("MESSAGE_ILLEGAL", f"properties string of {len(value)} chars exceeds {MAX_PROPERTIES_BYTES}")
        return parse_properties(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(v, str) or "\x01" in k or "\x02" in k or "\x02" in v:
                raise MessageIllegal("MESSAGE_ILLEGAL", f"property {k!r} must be a string without \\x01/\\x02")
            if k and v:
                out[k] = v
        return out
    raise MessageIllegal("MESSAGE_ILLEGAL", "properties must be an object of strings or a RocketMQ properties string")


def _int(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**63) <= value < 2**63:
        raise MessageIllegal("MESSAGE_ILLEGAL", f"`{name}` must be a 64-bit integer")
    return value


def _parse_host(text: str | None) -> bytes | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    try:
        return encode_host(str(ipaddress.ip_address(host.strip("[]"))), int(port))
    except (ValueError, struct.error):
        return None

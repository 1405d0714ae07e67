"""The protocol's pure parts, the config-file format, topic names and the node's small codecs."""

from __future__ import annotations

import os
import pickle
import re

import orjson
import pytest
import zmq
from golden import GOLDEN_STORE
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from nodes import ROOT

from actors.wire import (
    arrivals_from_wire,
    arrivals_to_wire,
    pack_replies,
    read_from_wire,
    read_size,
    read_to_wire,
    reply_size,
    unpack_replies,
    waits_from_wire,
    waits_to_wire,
)
from node import protocol
from node.client.producer import SendError
from actors import config_files
from actors.sendcore import PendingSend, SendEncoder, add_request_atomic
from actors.sendreply import answer, reply, results
from actors.store_stats import StoreStats
from actors.offsets import ConsumerOffsets
from actors.topics import TopicTable, topic_error
from shm import codec
from shm import settings as settings_module
from shm.codec import decode
from shm.encoded_batch import EncodedBatch


def test_documented_example_exchange_is_what_the_code_sends():
    text = (ROOT / "docs" / "protocol.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text.split("## Example exchange")[1], re.DOTALL)
    request_json, *request_hex = blocks[0].splitlines()[:-1]
    request = protocol.encode_request(orjson.loads(request_json.removeprefix("frame 0: ")), b"hello")
    assert "".join(request_hex) == request[0].hex() and blocks[0].splitlines()[-1] == "frame 1: " + b"hello".hex()
    reply_json, *reply_hex = blocks[1].splitlines()
    assert bytes.fromhex("".join(reply_hex)) == orjson.dumps(orjson.loads(reply_json))
    batch_hex = "".join(blocks[2].split())
    assert bytes.fromhex(batch_hex) == protocol.encode_batch_body([(b"a", 0, "TAGS\x01T"), (b"bc", 0, "")])


@given(st.lists(st.tuples(st.binary(max_size=64), st.integers(-2**31, 2**31 - 1),
                          st.text(alphabet=st.characters(blacklist_characters="\x00", max_codepoint=0x2FF),
                                  max_size=20)), min_size=1, max_size=8))
def test_batch_body_round_trips(messages):
    assert protocol.decode_batch_body(protocol.encode_batch_body(messages)) == messages


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x01", b"\x00\x00\x00\x30" + bytes(20),
                                  protocol.encode_batch_body([(b"abc", 0, "")])[:-1]])
def test_malformed_batch_bodies_are_protocol_errors(body):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_batch_body(body)


@pytest.mark.parametrize("frames", [[], [b"{}", b"", b""], [b"nope"], [b"[]"], [b'{"code": "10"}'],
                                    [b'{"code": true}']])
def test_malformed_requests_are_named(frames):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_request(frames)


def test_config_files_read_fastjson_output_and_fall_back_to_bak(tmp_path):
    golden = (GOLDEN_STORE / "config" / "delayOffset.json").read_text()
    assert config_files.loads(golden) == {"offsetTable": {"3": 3}}
    assert config_files.dumps({"offsetTable": {3: 3}}) == golden
    path = tmp_path / "topics.json"
    config_files.persist(path, {"a": 1})
    config_files.persist(path, {"a": 2})
    assert config_files.read(path) == {"a": 2} and config_files.loads((tmp_path / "topics.json.bak").read_text()) == {"a": 1}
    path.write_text("{broken")
    assert config_files.read(path) == {"a": 1}


def test_a_config_file_the_full_disk_refuses_keeps_its_content_and_is_written_later(tmp_path):
    """/dev/full answers every write ENOSPC: the temporary made a link to it is a full disk."""
    path = tmp_path / "consumerOffset.json"
    config_files.persist(path, {"a": 1})
    temporary = tmp_path / "consumerOffset.json.tmp"
    temporary.symlink_to("/dev/full")
    assert config_files.persist(path, {"a": 2}) is False
    assert config_files.read(path) == {"a": 1} and not temporary.exists() and not temporary.is_symlink()
    assert config_files.persist(path, {"a": 3}) is True and config_files.read(path) == {"a": 3}


def test_consumer_offsets_the_full_disk_refused_stay_dirty_until_written(tmp_path):
    offsets = ConsumerOffsets(tmp_path)
    offsets.commit("G", "T", 0, 5)
    (tmp_path / "consumerOffset.json.tmp").symlink_to("/dev/full")
    assert offsets.persist() is False and offsets.dirty
    assert offsets.persist() is True and not offsets.dirty  # (the link went with the failed write)
    assert ConsumerOffsets(tmp_path).query("G", "T", 0) == 5


def test_a_topic_the_full_disk_kept_from_its_file_is_written_at_the_next_period(tmp_path):
    told = []
    topics = TopicTable(tmp_path, auto_create=True, default_queues=4)
    topics.on_persist = lambda: told.append(1)
    (tmp_path / "topics.json.tmp").symlink_to("/dev/full")
    assert topics.resolve("T")[0] is not None and topics.unwritten and not told  # (the slave hears of it once written)
    topics.persist_unwritten()
    assert not topics.unwritten and told == [1]
    assert TopicTable(tmp_path, auto_create=False, default_queues=4).get("T") is not None


def test_topic_names_and_auto_creation(tmp_path):
    assert topic_error("Topic_A-1%|x") is None
    for bad in ("", "a b", "x" * 128, "SCHEDULE_TOPIC_XXXX", None, "tópico"):
        assert topic_error(bad)
    table = TopicTable(tmp_path, auto_create=False, default_queues=4)
    assert table.resolve("New")[1] == "TOPIC_NOT_EXIST"
    assert table.resolve("bad name")[1] == "MESSAGE_ILLEGAL"
    table = TopicTable(tmp_path, auto_create=True, default_queues=4)
    assert table.resolve("New")[0].writeQueueNums == 4
    assert TopicTable(tmp_path, auto_create=False, default_queues=1).get("New").readQueueNums == 4


def test_joined_replies_round_trip():
    replies = [(b"client-1", 123, b'{"a":1}', b""), (b"", -5, b"", b"body"), (bytes(255), 2**62, b"x" * 70000, b"y")]
    assert unpack_replies(pack_replies(replies)) == replies
    assert unpack_replies(pack_replies([(b"c", 1, b"h")])) == [(b"c", 1, b"h", b"")]
    parts = [b"rec-1", memoryview(b"..rec-2..")[2:7], b""]  # a pop's records, joined only here
    assert unpack_replies(pack_replies([(b"c", 1, b"h", parts), (b"d", 2, b"i", b"z")])) == \
        [(b"c", 1, b"h", b"rec-1rec-2"), (b"d", 2, b"i", b"z")]


def test_a_read_and_the_sizes_of_replies_on_a_ring():
    header = {"code": 11, "topic": "T", "queueId": 3, "queueOffset": 7}
    raw = orjson.dumps(header)
    message = b"".join(read_to_wire((header, bytes(255), -2**62, raw)))
    assert read_from_wire(message) == (header, bytes(255), -2**62) and len(message) == read_size(bytes(255), raw)
    parts = [b"rec-1", memoryview(b"..rec-2..")[2:7]]
    for reply in [(b"c", 1, b"h"), (b"client", -5, b'{"a":1}', b"body"), (b"c", 2, b"i", parts)]:
        assert reply_size(reply) == len(pack_replies([reply]))


def test_the_other_internal_frames_round_trip():
    waits = [(b"\x00\x01client", 123, 4096, b'{"status":"PUT_OK"}', 8192)]
    assert waits_from_wire(waits_to_wire(waits)) == waits
    frames = arrivals_to_wire({("TopicA", 3): 17}, [1, 63])
    assert [frame[0] for frame in frames] == [1, 63]  # addressed: the byte each reader's SUB subscribes to
    assert [arrivals_from_wire(frame) for frame in frames] == [[("TopicA", 3, 17)]] * 2


def test_store_stats_tps_and_buckets():
    stats = StoreStats(0)
    assert stats.tps(10) == "0.00"  # nothing sampled yet
    for second in range(12):
        stats.sample(second * 1000, second * 100 + (second > 5) * 600, second * 1000, 0)
    # the last 10 s; before 60 s have passed, the 11 s so far
    assert stats.tps(10) == "160.00" and stats.tps(60) == f"{1700 / 11:.2f}"
    for ms in (0, 5, 30, 12000):
        stats.record_latency(ms)
    info = stats.runtime_info(61_000)
    assert info["putMessageEntireTimeMax"] == "12000" and "[10s~]:1" in info["putMessageDistributeTime"]
    assert info["runtime"] == "[ 0 days, 0 hours, 1 minutes, 1 seconds ]"


def test_encoder_refusals_keep_the_batch_clean(tmp_path):
    settings = settings_module.load(None, {"storePathRootDir": str(tmp_path), "maxMessageSize": 100})
    encoder = SendEncoder(settings)
    batch = EncodedBatch()
    good = PendingSend(b"c", 1, protocol.SEND_MESSAGE, 0)
    add_request_atomic(encoder, good, {"code": 10, "topic": "T", "queueId": 0, "properties": {"TAGS": "x"}}, b"ok",
                       encoder.born_host("10.0.0.1:5"), batch)
    too_big = PendingSend(b"c", 2, protocol.SEND_BATCH_MESSAGE, 0)
    body = protocol.encode_batch_body([(b"small", 0, ""), (b"x" * 101, 0, "")])
    add_request_atomic(encoder, too_big, {"code": 320, "topic": "T", "queueId": 0}, body, encoder.born_host(None), batch)
    assert len(batch) == 1 and too_big.indices == [-1, -1]
    assert {r for r, _ in too_big.refusals.values()} == {"MESSAGE_ILLEGAL"}
    record = decode(bytes(batch.data))
    assert record.properties == {"TAGS": "x", "CLUSTER": "DefaultCluster"} and str(record.born_host) == "10.0.0.1:5"
    header = orjson.loads(reply(too_big, results(too_big, [], [], encoder.store_host)))
    assert header["status"] == "MESSAGE_ILLEGAL" and header["code"] == protocol.MESSAGE_ILLEGAL


def test_fast_fail_answers_sends_that_waited_too_long(tmp_path):
    import time

    from actors.ingress import RequestBatcher

    settings = settings_module.load(None, {"storePathRootDir": str(tmp_path), "waitTimeMillsInSendQueue": 200})
    batcher = RequestBatcher(settings)
    header = orjson.dumps({"code": protocol.SEND_MESSAGE, "opaque": 9, "topic": "T", "queueId": 0})
    stale = [b"client", orjson.dumps({"t": time.monotonic_ns() - 300_000_000}), header, b"x"]
    fresh = [b"client", orjson.dumps({"t": time.monotonic_ns()}), header, b"y"]
    groups, replies = batcher.build([stale, fresh])
    assert len(replies) == 1 and batcher.expired == 1
    refused = orjson.loads(replies[0][2])
    assert refused["status"] == "SYSTEM_BUSY" and refused["remark"].startswith("[TIMEOUT_CLEAN_QUEUE]")
    assert sum(len(batch) for batch, _, _ in groups) == 1


def test_wait_false_and_flush_timeouts():
    from actors.sendreply import downgraded

    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent"})
    encoder = SendEncoder(settings)
    pending = PendingSend(b"c", 1, protocol.SEND_MESSAGES, 0)
    messages = [{"topic": "T", "queueId": 0, "bodySize": 1, "properties": {"WAIT": "false"}}]
    add_request_atomic(encoder, pending, {"code": protocol.SEND_MESSAGES, "messages": messages}, b"x",
                       encoder.born_host(None), EncodedBatch())
    assert pending.wait is False  # answered at append, even under SYNC_FLUSH
    header = orjson.loads(downgraded(reply(pending, results(pending, [0], [0], encoder.store_host)),
                                     "FLUSH_DISK_TIMEOUT"))
    assert header["results"][0]["status"] == "FLUSH_DISK_TIMEOUT"
    single = orjson.loads(downgraded(orjson.dumps({"code": 0, "status": "PUT_OK"}), "SLAVE_NOT_AVAILABLE"))
    assert single == {"code": protocol.SLAVE_NOT_AVAILABLE, "status": "SLAVE_NOT_AVAILABLE"}


@given(st.lists(st.sampled_from(["UNIQ_KEY", "\x01", "\x02", "A", "b", "UNIQ_KEY\x01X", "\x02UNIQ_KEY\x01"]),
                max_size=12))
def test_uniq_key_shortcut_agrees_with_the_full_parse(pieces):
    from shm.codec import find_uniq_key, find_uniq_key_ascii, parse_properties

    text = "".join(pieces)
    assert find_uniq_key(text) == parse_properties(text).get("UNIQ_KEY")
    assert find_uniq_key_ascii(text.encode()) == parse_properties(text).get("UNIQ_KEY")


def test_consumer_offsets_read_rocketmqs_file_and_write_its_format(tmp_path):
    from actors.offsets import ConsumerOffsets

    (tmp_path / "consumerOffset.json").write_text('{\n\t"offsetTable":{\n\t\t"TopicA@g1":{0:12,1:7\n\t\t}\n\t}\n}')
    offsets = ConsumerOffsets(tmp_path)
    assert offsets.query("g1", "TopicA", 1) == 7 and offsets.query("g1", "TopicA", 2) is None
    offsets.commit("g1", "TopicA", 2, 3)
    assert offsets.persist() and not offsets.persist()  # only when changed
    assert ConsumerOffsets(tmp_path).of_group("g1") == {"TopicA": {0: 12, 1: 7, 2: 3}}
    assert "{0:12,1:7,2:3" in (tmp_path / "consumerOffset.json").read_text()


# -- the consumer's record decoding: fast path == full codec ------------------------------------


def _v2(record: bytes) -> bytes:
    """The same message in RocketMQ 5's v2 layout: a two-byte topic length."""
    from shm import codec

    fixed = codec._FIXED_V4.size
    body_len = int.from_bytes(record[fixed - 4: fixed], "big")
    at = fixed + body_len
    out = bytearray(record[:at] + b"\x00" + record[at:])
    out[0:4] = (len(out)).to_bytes(4, "big")
    out[4:8] = codec.MESSAGE_MAGIC_V2.to_bytes(4, "big", signed=True)
    return bytes(out)


@pytest.mark.parametrize("v6, props, body", [
    (False, "UNIQ_KEY\x01AB12\x02TAGS\x01TagA\x02KEYS\x01k1 k2", b"x" * 300),
    (False, "", b""),
    (False, "TAGS\x01T\x02EMPTY\x01", b"\x00\xff"),
    (True, "KEYS\x01only", b"body"),
])
def test_pull_reply_decoding_matches_the_full_codec(v6, props, body):
    from node.client.received import _decode_full, decode_messages
    from shm import codec

    born = codec.encode_host("::1" if v6 else "10.1.2.3", 5000)
    store = codec.encode_host("fe80::2" if v6 else "127.0.0.1", 10911)
    sys_flag = (codec.FLAG_BORNHOST_V6 | codec.FLAG_STOREHOST_V6) if v6 else 0
    records = [codec.encode(topic="T%d" % i, body=body, queue_id=i, born_timestamp=111 + i, born_host=born,
                            store_host=store, properties=props, sys_flag=sys_flag, queue_offset=7 + i,
                            physical_offset=4096 * i, store_timestamp=222, reconsume_times=i) for i in range(3)]
    if not v6:
        records.append(_v2(records[0]))
    decoded = decode_messages(b"".join(records))
    assert decoded == [_decode_full(r) for r in records]  # every field, the lazily decoded ones too
    assert decoded[-1].body == body and decoded[-1].topic == ("T2" if v6 else "T0")
    assert pickle.loads(pickle.dumps(decoded)) == decoded and "queue_offset=7" in repr(decoded[0])
    for broken in (b"".join(records)[:-1], b"".join(records) + b"\x00\x00"):  # cut short; stray bytes after
        with pytest.raises(SendError):
            decode_messages(broken)


_PROPS = st.lists(st.sampled_from(["UNIQ_KEY\x01", "TAGS\x01a", "\x02", "KEYS\x01k1 k2", "é", "x"]), max_size=6).map("".join)


@given(st.lists(st.sampled_from(["UNIQ_KEY\x01", "UNIQ_KEY\x01u1", "X_UNIQ_KEY\x01u2", "\x02", "\x01", "é",
                                 "TAGS\x01a"]), max_size=8).map("".join))
def test_a_pulled_message_finds_its_msg_id_as_parsing_every_property_would(props):
    """msg_id's shortcut (UNIQ_KEY found in the raw bytes) agrees with the parsed properties,
    for odd properties too: the key twice, empty, as a suffix of another name."""
    from node.client.received import decode_messages
    from shm import codec

    store = codec.encode_host("127.0.0.1", 10911)
    raw = codec.encode(topic="T", body=b"b", queue_id=0, born_timestamp=1, born_host=store, store_host=store,
                       properties=props, physical_offset=4096)
    lazy, parsed = decode_messages(raw)[0], decode_messages(raw)[0]
    expected = parsed.properties.get("UNIQ_KEY") or codec.offset_msg_id(store, 4096)
    assert lazy.msg_id == expected == parsed.msg_id


_ONE_PASS = ["c", "python"]  # the one-pass encoders: node.server._encode, or the Python loops it mirrors


@pytest.mark.parametrize("one_pass", _ONE_PASS)
@given(st.lists(st.tuples(st.binary(max_size=40), st.integers(-2**31, 2**31 - 1), _PROPS), min_size=1, max_size=6),
       st.sampled_from([None, {"TAGS": "batch"}, {"WAIT": "false"}, {"DELAY": "2"}, {"é": "ü"}]),
       st.sampled_from(["10.0.0.1:5", "[::1]:7"]), st.sampled_from([0, 3, 2**31]))
def test_batch_fast_path_writes_what_the_general_path_writes(one_pass, messages, properties, born, queue_id):
    """SEND_BATCH_MESSAGE's one-pass encoder and its reply agree byte for byte with the general
    path (message by message through encode_v4 / encode), refusals included."""
    header = {"code": protocol.SEND_BATCH_MESSAGE, "opaque": 5, "topic": "Tb", "queueId": queue_id,
              "bornTimestamp": 1_700_000_000_000, "properties": properties}
    _fast_path_matches_general_path("_add_batch_v4", header, protocol.encode_batch_body(messages), born, one_pass)


_HALF_MESSAGE_PROPS = st.sampled_from([{}, {"TAGS": "a"}, {"KEYS": "k1 k2", "UNIQ_KEY": "u1"}, {"é": "ü"},
                                        {f"p{i}": "v" for i in range(13)}])


@pytest.mark.parametrize("one_pass", [*_ONE_PASS, "general"])
@given(st.lists(st.tuples(st.binary(max_size=40), st.integers(-2**31, 2**31 - 1), _HALF_MESSAGE_PROPS),
                min_size=1, max_size=5),
       st.sampled_from([{}, {"TAGS": "batch"}, {"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"},
                        {f"q{i}": "w" for i in range(12)}]),
       st.sampled_from(["10.0.0.1:5", "[::1]:7"]))
def test_a_one_half_batch_commits_what_a_batch_of_halves_commits(one_pass, messages, extra, born):
    """A one-half batch (SEND_BATCH_MESSAGE `oneHalf`) is one half; its commit stores, byte for
    byte, the records the commits of a batch of halves (one half a message) store, whichever
    encoder takes it (C, Python, or the general path message by message)."""
    from actors.reput import commit_batch_item, commit_item, stored_of

    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent"})
    general_only = type("GeneralOnly", (SendEncoder,), {"_add_batch_v4": lambda self, *args: False})
    encoder = _encoder(general_only if one_pass == "general" else SendEncoder, settings,
                       "python" if one_pass == "general" else one_pass)
    if one_pass == "general":
        encoder._batch_v4 = lambda *args: None
    header = {"code": protocol.SEND_BATCH_MESSAGE, "opaque": 5, "topic": "Tw", "queueId": 3,
              "bornTimestamp": 1_700_000_000_000, "properties": {"TRAN_MSG": "true", "PGROUP": "PG"} | extra}
    body = protocol.encode_batch_body([(b, f, codec.properties_string(p)) for b, f, p in messages])
    phy = 123_456_789

    def stored(request: dict, items: list | None = None) -> list[bytes]:
        batch = EncodedBatch()
        pending = PendingSend(b"c", 5, request["code"], 0)
        add_request_atomic(encoder, pending, request, body if items is None else b"".join(b for _, b in items),
                           encoder.born_host(born), batch)
        assert not pending.refusals, pending.refusals
        return [bytes(batch.data[at: at + size]) for at, size in zip(batch.positions, batch.sizes)]

    def committed(halves: list[bytes], make) -> list[bytes]:
        items = [make(stored_of(raw), phy, ("Tw", 3)) for raw in halves]
        return stored({"code": protocol.SEND_MESSAGES, "_reput": True, "compact": True,
                       "messages": [item for item, _ in items]}, items)

    halves = stored(header)
    [half] = stored(header | {"oneHalf": True})
    assert len(halves) == len(messages)
    record = decode(half)
    assert (record.topic, record.queue_id, record.body) == ("RMQ_SYS_TRANS_HALF_TOPIC", 0, body)
    assert record.properties["INNER_NUM"] == str(len(messages)) and record.properties["REAL_QID"] == "3"
    assert committed([half], commit_batch_item) == committed(halves, commit_item)
    for raw in committed([half], commit_batch_item):
        record = decode(raw, check_crc=True)
        assert record.sys_flag & codec.TRANSACTION_MASK == codec.TRANSACTION_COMMIT
        assert record.prepared_transaction_offset == phy and "INNER_NUM" not in record.properties


def test_a_one_half_batch_is_refused_whole():
    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent", "maxMessageSize": 100})
    encoder = SendEncoder(settings)
    header = {"code": protocol.SEND_BATCH_MESSAGE, "opaque": 5, "topic": "Tw", "queueId": 0, "oneHalf": True,
              "properties": {"TRAN_MSG": "true", "PGROUP": "PG"}}
    cases = [({"properties": {"PGROUP": "PG"}}, [(b"x", 0, "")], "TRAN_MSG"),
             ({"properties": {"TRAN_MSG": "true"}}, [(b"x", 0, "")], "PGROUP"),
             ({}, [(b"x", 0, ""), (b"y", 0, "DELAY\x012")], "DELAY"),
             ({}, [(b"x" * 60, 0, ""), (b"y" * 60, 0, "")], "maxMessageSize"),  # the batch as one body: over maxMessageSize
             ({"_refused": ["TOPIC_NOT_EXIST", "no topic Tw"]}, [(b"x", 0, "")], "no topic")]
    for change, messages, why in cases:
        batch, pending = EncodedBatch(), PendingSend(b"c", 5, protocol.SEND_BATCH_MESSAGE, 0)
        add_request_atomic(encoder, pending, header | change, protocol.encode_batch_body(messages),
                           encoder.born_host(None), batch)
        assert len(batch) == 0 and pending.indices == [-1], (change, messages)
        assert why in pending.refusals[0][1], (why, pending.refusals)
    with pytest.raises(protocol.ProtocolError):
        add_request_atomic(encoder, PendingSend(b"c", 5, protocol.SEND_BATCH_MESSAGE, 0), header, b"\x00\x00",
                           encoder.born_host(None), EncodedBatch())


def _fast_path_matches_general_path(fast_method: str, header: dict, body: bytes, born: str, one_pass: str) -> None:
    """Encode the request with `SendEncoder` (its one-pass encoders in C or in Python) and with
    one whose `fast_method` always declines; the batches, the pending sends and the replies must
    be identical, and the reply must be what the general `reply(results(...))` says."""
    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent", "maxMessageSize": 30})
    general_only = type("GeneralOnly", (SendEncoder,), {fast_method: lambda self, *args: False})

    def run(encoder_class):
        encoder, batch = _encoder(encoder_class, settings, one_pass), EncodedBatch()
        batch.add_v4(b"\x00" * 8, "other-0")  # the batch may already hold another request's records
        pending = PendingSend(b"c", header["opaque"], header["code"], 0)
        add_request_atomic(encoder, pending, orjson.loads(orjson.dumps(header)), body, encoder.born_host(born), batch)
        physical = [1000 * i for i in range(len(batch))]
        queue = list(range(len(batch)))
        answered = answer(pending, physical, queue, encoder.store_host)
        assert answered == reply(pending, results(pending, physical, queue, encoder.store_host))
        return (bytes(batch.data), batch.positions, batch.sizes, batch.queue_keys, batch.timestamp_offsets,
                pending.indices, pending.refusals, pending.uniq_keys, pending.topics, pending.queue_ids,
                pending.wait, answered)

    assert run(SendEncoder) == run(general_only)


_GOOD_PROPS = [None, {}, {"TAGS": "a"}, {"WAIT": "false"}, {"WAIT": "true", "TAGS": "t"}, {"é": "ü"},
               {"UNIQ_KEY": "u1", "KEYS": "k1 k2"}, {"CLUSTER": "mine"}, {"KEYS": "k", "p7": "v"}, {f"p{i}": "v" for i in range(7)},
               {f"p{i}": "v" for i in range(14)},
               # delays: moved by the write path, the names it adds in the broker's order
               {"DELAY": "2"}, {"DELAY": "0", "TAGS": "a"}, {"DELAY": "99", "WAIT": "false"},
               {f"p{i}": "v" for i in range(10)} | {"DELAY": "1"}, {"TIMER_DELAY_SEC": "30"},
               {"KEYS": "k", "TIMER_DELIVER_MS": "1700000005001"}, {"TIMER_DELAY_MS": "-5"},
               {"DELAY": "3", "TIMER_DELAY_MS": "100"}, {"WAIT": "true", "TIMER_DELAY_MS": "2500"}]
_GOOD_ENTRY = st.fixed_dictionaries(
    {"topic": st.sampled_from(["Ta", "Tb", "é"]), "queueId": st.sampled_from([0, 3]), "body": st.binary(max_size=30),
     "properties": st.sampled_from(_GOOD_PROPS)},
    optional={"flag": st.sampled_from([0, 7]), "reconsumeTimes": st.sampled_from([0, 2]),
              "bornTimestamp": st.just(1_700_000_000_000)})
_SPOILERS = [  # each spoils a request for the fast path in its own way
    {"_refused": ["MESSAGE_ILLEGAL", "refused by the front"]}, {"body": bytes(31)},
    {"queueId": 2**31}, {"queueId": True}, {"flag": 2**31}, {"flag": "x"}, {"reconsumeTimes": 2**31},
    {"bornTimestamp": 2**63}, {"bornTimestamp": False}, {"properties": {"DELAY": "x"}},
    {"properties": {"TIMER_DELAY_MS": "soon"}}, {"properties": {"REAL_TOPIC": "x", "DELAY": "1"}},
    {"properties": {"TIMER_DELAY_SEC": str(10**7)}}, {"properties": {"TIMER_OUT_MS": "5"}},
    {"properties": {"": "x"}}, {"properties": {"a": ""}}, {"properties": {"a\x01": "b"}},
    {"properties": {"a": "b\x02"}}, {"properties": {"n": 5}}, {"properties": {"big": "x" * 32800}}, {"properties": "TAGS\x01x"}, {"properties": ""},
    {"properties": []}]


@pytest.mark.parametrize("one_pass", _ONE_PASS)
@pytest.mark.parametrize("spoiler", [None, *_SPOILERS])
@hypothesis_settings(max_examples=40)
@given(st.lists(_GOOD_ENTRY, min_size=1, max_size=6), st.integers(0, 6), st.sampled_from(["10.0.0.1:5", "[::1]:7"]))
def test_coalesced_sends_fast_path_writes_what_the_general_path_writes(one_pass, spoiler, entries, at, born):
    """SEND_MESSAGES' one-pass encoder and its reply agree byte for byte with the general path
    (message by message through `_add_message`), refusals included."""
    if spoiler is not None:
        entries = entries[:at] + [entries[at % len(entries)] | spoiler] + entries[at:]
    messages = [{k: v for k, v in e.items() if k != "body"} | {"bodySize": len(e["body"])} for e in entries]
    header = {"code": protocol.SEND_MESSAGES, "opaque": 9, "messages": messages}
    _fast_path_matches_general_path("_add_messages_v4", header, b"".join(e["body"] for e in entries), born, one_pass)


@pytest.mark.parametrize("refused_at", [None, 1])
def test_the_compact_reply_gives_each_send_what_the_full_reply_gives(refused_at):
    """A SEND_MESSAGES request with `compact` is answered, when all its messages are stored,
    with comma-joined ids and a list of queue offsets instead of a dict a message; the client
    rebuilds from it the very SendResults the full `results` form gives, also when the flush
    actor downgrades it. A refusal anywhere keeps the full form."""
    import asyncio

    from node.client.producer import AsyncProducer
    from actors.sendreply import downgraded

    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent"})
    encoder = SendEncoder(settings)
    messages = [{"topic": f"T{i % 2}", "queueId": i, "bornTimestamp": 1, "bodySize": 2,
                 "properties": {"UNIQ_KEY": f"K{i}"} if i != 2 else {"TAGS": "no-uniq-key"}} for i in range(4)]
    if refused_at is not None:
        messages[refused_at]["_refused"] = ["MESSAGE_ILLEGAL", "refused by the front"]

    def answered(compact: bool) -> dict:
        pending = PendingSend(b"c", 5, protocol.SEND_MESSAGES, 0)
        header = {"code": protocol.SEND_MESSAGES, "opaque": 5, "compact": compact, "messages": messages}
        batch = EncodedBatch()
        add_request_atomic(encoder, pending, orjson.loads(orjson.dumps(header)), b"ab" * 4,
                           encoder.born_host("10.0.0.1:5"), batch)
        pending = PendingSend.from_wire(orjson.loads(orjson.dumps(pending.to_wire())))  # as the writer gets it
        return orjson.loads(answer(pending, [4096 * (i + 1) for i in range(len(batch))],
                                   [100 + i for i in range(len(batch))], encoder.store_host))

    def spread(header: dict) -> list:
        async def main():
            producer = AsyncProducer("tcp://127.0.0.1:9", context=zmq.Context())
            loop = asyncio.get_running_loop()
            queued = [(m, b"ab", loop.create_future(), producer.retries) for m in messages]
            producer._spread(queued, header, None)
            return [f.result() if f.exception() is None else f.exception().status for _, _, f, _ in queued]
        return asyncio.run(main())

    compact, full = answered(True), answered(False)
    assert ("results" in compact) == (refused_at is not None) and "results" in full
    if refused_at is None:
        assert compact["code"] == 0 and compact["status"] == "PUT_OK"
        assert compact["queueOffsets"] == [100, 101, 102, 103]
        assert len(orjson.dumps(compact)) < len(orjson.dumps(full)) / 2
    assert spread(compact) == spread(full)
    # the flush actor downgrades a late SYNC_FLUSH reply
    compact, full = (orjson.loads(downgraded(orjson.dumps(h), "FLUSH_DISK_TIMEOUT")) for h in (compact, full))
    assert spread(compact) == spread(full)
    assert {r.status for r in spread(compact) if not isinstance(r, str)} == {"FLUSH_DISK_TIMEOUT"}
    outcomes = spread(compact)
    assert outcomes[refused_at or 0] == ("MESSAGE_ILLEGAL" if refused_at else outcomes[0])
    stored = [r for r in outcomes if not isinstance(r, str)]
    assert [r.msg_id for r in stored if r.queue_id != 2] == [f"K{r.queue_id}" for r in stored if r.queue_id != 2]
    assert all(r.msg_id == r.offset_msg_id for r in stored if r.queue_id == 2)
    assert [r.topic for r in stored] == [f"T{r.queue_id % 2}" for r in stored]


def _encoder(encoder_class, settings, one_pass: str) -> SendEncoder:
    encoder = encoder_class(settings, clock=lambda: 1_700_000_000.0)  # timers count from a fixed now
    if one_pass == "c" and os.environ.get("MQNODE_NATIVE") == "0":
        pytest.skip("MQNODE_NATIVE=0: the C encoder is switched off")
    if one_pass == "python":
        encoder._messages_v4, encoder._batch_v4 = codec.encode_messages_v4_py, codec.encode_batch_v4_py
    else:
        assert encoder._messages_v4 is codec.encode_messages_v4_c and encoder._batch_v4 is codec.encode_batch_v4_c
    return encoder


@pytest.mark.parametrize("one_pass", _ONE_PASS)
def test_coalesced_sends_take_the_fast_path(one_pass):
    """The common coalesced request does take the one-pass encoder (the test above would pass
    if it never did)."""
    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent"})
    encoder = _encoder(SendEncoder, settings, one_pass)
    messages = [{"topic": "T", "queueId": i, "bornTimestamp": 1, "bodySize": 3,
                 "properties": {"UNIQ_KEY": f"K{i}", "TAGS": "a", "WAIT": "true"}} for i in range(4)]
    pending = PendingSend(b"c", 1, protocol.SEND_MESSAGES, 0)
    assert encoder._add_messages_v4(pending, messages, b"abc" * 4, encoder.born_host("10.0.0.1:5"), EncodedBatch())
    assert pending.uniq_keys == ["K0", "K1", "K2", "K3"] and pending.indices == [0, 1, 2, 3] and pending.wait


@pytest.mark.parametrize("fast", [True, False], ids=["one-pass", "general"])
def test_a_coalesced_request_waits_for_the_flush_if_any_of_its_sends_does(fast):
    """Coalescing must not let one WAIT=false send speed the others' PUT_OK past the disk under
    SYNC_FLUSH: the request is held for the flush when any stored send waits, and only when
    every stored one says WAIT=false is it answered at once."""
    settings = settings_module.load(None, {"storePathRootDir": "/nonexistent"})
    encoder = SendEncoder(settings)
    if not fast:
        encoder._add_messages_v4 = lambda *args: False

    def waits(*wait_props, refused_at: int | None = None) -> bool:
        messages = [{"topic": "T", "queueId": 0, "bodySize": 1, "properties": {"UNIQ_KEY": f"K{i}"} | props}
                    for i, props in enumerate(wait_props)]
        if refused_at is not None:
            messages[refused_at]["_refused"] = ["MESSAGE_ILLEGAL", "refused by the front"]
        pending = PendingSend(b"c", 1, protocol.SEND_MESSAGES, 0)
        header = {"code": protocol.SEND_MESSAGES, "opaque": 1, "messages": messages}
        add_request_atomic(encoder, pending, header, b"x" * len(messages), encoder.born_host("10.0.0.1:5"),
                           EncodedBatch())
        return pending.wait

    no_wait = {"WAIT": "false"}
    assert waits(no_wait, {}, no_wait) and waits({}, {"WAIT": "true"}) and waits({})
    assert not waits(no_wait, no_wait)
    assert not waits({}, no_wait, refused_at=0)  # a refused send is not stored: nothing to wait for


def test_uniq_keys_follow_message_client_id_setter_layout():
    """ip(4) pid(2) random(4) | ms since the month began(4) counter(2), upper hex; one counter
    across `next` and `next_many`, the time field from the caller's clock when given."""
    import os
    import time

    from node.client.uniq_keys import UniqKeys

    keys = UniqKeys()
    now_ms = int(time.time() * 1000)
    made = [keys.next(now_ms), *keys.next_many(2), keys.next(), keys.next(now_ms + 1)]
    assert all(re.fullmatch(r"[0-9A-F]{32}", k) for k in made) and len(set(made)) == len(made)
    assert {k[:20] for k in made} == {keys.prefix} and keys.prefix[8:12] == f"{os.getpid() & 0xFFFF:04X}"
    assert [int(k[28:], 16) for k in made] == list(range(5))
    assert int(made[0][20:28], 16) == now_ms - keys.month_start
    assert int(made[4][20:28], 16) == now_ms + 1 - keys.month_start
    assert 0 <= int(made[1][20:28], 16) - int(made[0][20:28], 16) < 60_000


def test_a_host_whose_name_does_not_resolve_still_makes_push_consumers_and_message_ids(monkeypatch):
    """A container's or laptop's hostname in no /etc/hosts or DNS: PushConsumer's client id (its
    clientIP) raised socket.gaierror before; both it and the msgIds take 127.0.0.1, as UniqKeys did."""
    import socket

    from node.client import uniq_keys
    from node.client.push import AsyncPushConsumer

    def unresolved(name):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "gethostbyname", unresolved)
    uniq_keys.local_ip.cache_clear()
    try:
        consumer = AsyncPushConsumer("tcp://127.0.0.1:1", "G", instance_name="i1")
        assert consumer.client_id == "127.0.0.1@i1"
        assert uniq_keys.UniqKeys().prefix.startswith("7F000001")
    finally:
        uniq_keys.local_ip.cache_clear()


def test_coalescing_never_lingers_in_front_of_an_idle_connection():
    """Sends made in one loop turn leave at its end as one SEND_MESSAGES, however long the
    linger; a send made while that request is in flight waits for the linger (or the reply)."""
    import asyncio
    import time

    import zmq.asyncio

    from node.client.producer import AsyncProducer

    async def main():
        context = zmq.asyncio.Context()
        front = context.socket(zmq.ROUTER)
        port = front.bind_to_random_port("tcp://127.0.0.1")
        producer = AsyncProducer(f"tcp://127.0.0.1:{port}", linger_ms=1500, context=context, timeout=20)
        producer.routes["T"] = 4  # no route lookup on the wire

        async def answer(frames):
            header = orjson.loads(frames[1])
            results = [{"status": "PUT_OK", "msgId": m["properties"]["UNIQ_KEY"], "offsetMsgId": "00",
                        "queueId": m["queueId"], "queueOffset": 0} for m in header["messages"]]
            reply = {"code": 0, "opaque": header["opaque"], "status": "PUT_OK", "results": results}
            await front.send_multipart([frames[0], orjson.dumps(reply)])
            return len(results)

        try:
            began = time.monotonic()
            first = asyncio.gather(*[producer.send("T", b"x") for _ in range(64)])
            request = await asyncio.wait_for(front.recv_multipart(), 1.0)  # not 1.5 s later
            assert time.monotonic() - began < 1.0
            late = asyncio.ensure_future(producer.send("T", b"y"))
            assert not await front.poll(400)  # the first is in flight: the late send lingers
            assert await answer(request) == 64
            assert len(await asyncio.wait_for(first, 5)) == 64
            assert await answer(await asyncio.wait_for(front.recv_multipart(), 5)) == 1
            assert (await asyncio.wait_for(late, 5)).status == "PUT_OK"
        finally:
            await producer.close()
            front.close(0)
            context.term()

    asyncio.run(main())


def test_a_connection_misses_no_reply_however_sends_and_replies_interleave():
    """ZMQ_FD is edge-triggered and a send can take the edge of a reply that arrived meanwhile:
    the client must find every reply anyway. A fake front answers in bursts, out of order,
    while the client keeps sending; every request gets its own reply, and none hangs."""
    import asyncio
    import random
    import threading

    from node.client.producer import AsyncProducer

    context = zmq.Context()
    front = context.socket(zmq.ROUTER)
    port = front.bind_to_random_port("tcp://127.0.0.1")
    total = 3000

    def serve():
        rng, pending, answered = random.Random(7), [], 0
        while answered < total:
            if front.poll(20):
                pending.append(front.recv_multipart())
            if pending and (len(pending) >= rng.randint(1, 40) or not front.poll(0)):
                rng.shuffle(pending)
                for client, header, *_ in pending:
                    opaque = orjson.loads(header)["opaque"]
                    front.send_multipart([client, orjson.dumps({"opaque": opaque, "status": "OK", "echo": opaque})])
                answered += len(pending)
                pending.clear()

    server = threading.Thread(target=serve, daemon=True)
    server.start()

    async def main():
        producer = AsyncProducer(f"tcp://127.0.0.1:{port}", context=context, timeout=10, retries=0)
        try:
            async def asker(n):
                for _ in range(n):
                    reply, _ = await producer.request({"code": 105, "topic": "T"})
                    assert reply["echo"] == reply["opaque"]

            await asyncio.wait_for(asyncio.gather(*[asker(total // 100) for _ in range(100)]), 30)
        finally:
            await producer.close()

    try:
        asyncio.run(main())
        server.join(5)
        assert not server.is_alive()
    finally:
        front.close(0)
        context.term()


def test_fast_frames_round_trip_as_pyzmq_multipart_does():
    from node.frames import NOBLOCK, recv_frames, send_frames

    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        a.bind("inproc://frames")
        b.connect("inproc://frames")
        messages = [[b"one"], [b"c", b"", b'{"t":1}', memoryview(b"body" * 3000)], [b""] * 5]
        expected = [[bytes(f) for f in frames] for frames in messages]
        for send, receive in ((send_frames, recv_frames), (zmq.Socket.send_multipart, recv_frames),
                              (send_frames, lambda sock: sock.recv_multipart())):
            for frames in messages:
                send(a, frames, NOBLOCK)
            got = []
            while b.poll(0):
                got.append(receive(b))
            assert got == expected
        with pytest.raises(zmq.Again):
            recv_frames(b)
    finally:
        a.close(0)
        b.close(0)
        context.term()


class _FakeFront:
    """A ROUTER standing in for the node's front, and an AsyncProducer connected to it (the
    route of topic T known, so only sends cross the wire). Use inside a running loop."""

    def __init__(self, **producer_options):
        import zmq.asyncio

        from node.client.producer import AsyncProducer

        self.context = zmq.asyncio.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.producer = AsyncProducer(f"tcp://127.0.0.1:{port}", context=self.context, **producer_options)
        self.producer.routes["T"] = 4

    async def take(self) -> tuple[bytes, dict]:
        import asyncio

        frames = await asyncio.wait_for(self.socket.recv_multipart(), 5)
        return frames[0], orjson.loads(frames[1])

    async def answer(self, client: bytes, header: dict, status: str) -> None:
        results = [{"status": status, "msgId": m["properties"]["UNIQ_KEY"], "offsetMsgId": "00",
                    "queueId": m["queueId"], "queueOffset": 7} for m in header["messages"]]
        reply = {"code": 0, "opaque": header["opaque"], "status": status, "results": results}
        await self.socket.send_multipart([client, orjson.dumps(reply)])

    async def busy_send(self, wait: float):
        """A send answered SYSTEM_BUSY, `wait` s after its reply arrived (in its backoff)."""
        import asyncio

        sending = asyncio.ensure_future(self.producer.send("T", b"x"))
        client, header = await self.take()
        await self.answer(client, header, "SYSTEM_BUSY")
        await asyncio.sleep(wait)
        assert not sending.done()
        return sending

    async def close(self) -> None:
        await self.producer.close()
        self.socket.close(0)
        self.context.term()


def test_a_coalesced_send_is_retried_on_busy_and_on_silence_and_fails_on_the_rest():
    """The retry loop of a single send: SYSTEM_BUSY and a reply that never comes (TIMEOUT) are
    sent again, as the same message (same UNIQ_KEY); a status that is not retriable fails the send
    at once; a send still busy after `retries` attempts fails with the last status."""
    import asyncio

    from node.client.producer import SendError

    async def main():
        fake = _FakeFront(timeout=0.3, retries=2)
        producer, take, answer = fake.producer, fake.take, fake.answer
        try:
            sending = asyncio.ensure_future(producer.send("T", b"x"))
            client, first = await take()
            await answer(client, first, "SYSTEM_BUSY")
            _, second = await take()  # unanswered: the send times out and goes again
            client, third = await take()
            keys = {h["messages"][0]["properties"]["UNIQ_KEY"] for h in (first, second, third)}
            assert len(keys) == 1 and len({h["opaque"] for h in (first, second, third)}) == 3
            await answer(client, third, "PUT_OK")
            result = await asyncio.wait_for(sending, 5)
            assert (result.status, result.queue_offset, result.msg_id) == ("PUT_OK", 7, keys.pop())

            illegal = asyncio.ensure_future(producer.send("T", b"y"))
            client, header = await take()
            await answer(client, header, "MESSAGE_ILLEGAL")
            with pytest.raises(SendError) as failed:
                await asyncio.wait_for(illegal, 5)
            assert failed.value.status == "MESSAGE_ILLEGAL"
            assert not await fake.socket.poll(100)  # not sent again

            busy = asyncio.ensure_future(producer.send("T", b"z"))
            for _ in range(3):
                client, header = await take()
                await answer(client, header, "SYSTEM_BUSY")
            with pytest.raises(SendError) as failed:
                await asyncio.wait_for(busy, 5)
            assert failed.value.status == "SYSTEM_BUSY"
            # every request answered or timed out: nothing waits, and no later send lingers
            assert producer.coalesced_in_flight == 0 and not producer.waiting
        finally:
            await fake.close()

    asyncio.run(main())


def test_a_send_waiting_to_retry_fails_when_the_producer_closes(monkeypatch):
    """A send in its backoff after SYSTEM_BUSY, and one whose request is in flight, when the
    producer is closed: CLOSED, not a hang and not a connection opened again."""
    import asyncio

    from node.client import coalesce
    from node.client.producer import SendError

    monkeypatch.setattr(coalesce, "backoff", lambda attempt: 0.5)  # (a coalesced send's retry: node.client.coalesce)

    async def main():
        fake = _FakeFront(timeout=5, retries=2)
        producer = fake.producer
        try:
            sending = await fake.busy_send(0.2)
            in_flight = asyncio.ensure_future(producer.send("T", b"unanswered"))
            await fake.take()
            await producer.close()
            for send in (sending, in_flight):
                with pytest.raises(SendError) as failed:
                    await asyncio.wait_for(send, 2)
                assert failed.value.status == "CLOSED"
            assert producer.connection is None and producer.coalesced_in_flight == 0
            assert not await fake.socket.poll(100)
        finally:
            await fake.close()

    asyncio.run(main())


def test_a_send_cancelled_in_its_backoff_is_not_sent_again(monkeypatch):
    """A sender that gives up (its task cancelled) while its send waits out a SYSTEM_BUSY
    backoff: the message is not sent again, and the producer goes on sending for others."""
    import asyncio

    from node.client import coalesce

    monkeypatch.setattr(coalesce, "backoff", lambda attempt: 0.3)  # (a coalesced send's retry: node.client.coalesce)

    async def main():
        fake = _FakeFront(timeout=5, retries=2)
        producer = fake.producer
        try:
            sending = await fake.busy_send(0.1)
            sending.cancel()
            assert not await fake.socket.poll(500)  # past the backoff: nothing sent again
            other = asyncio.ensure_future(producer.send("T", b"y"))
            client, header = await fake.take()
            assert len(header["messages"]) == 1
            await fake.answer(client, header, "PUT_OK")
            assert (await asyncio.wait_for(other, 2)).status == "PUT_OK"
        finally:
            await fake.close()

    asyncio.run(main())


def test_a_send_back_answered_busy_is_asked_again_and_a_refusal_is_not():
    """A busy answer (the schedule service restarting) stored nothing: the consumer asks again
    after a backoff. Any other refusal is the caller's answer at once."""
    import asyncio
    from types import SimpleNamespace

    import zmq.asyncio

    from node.client.consumer import AsyncPullConsumer
    from node.client.producer import SendError

    async def main():
        context = zmq.asyncio.Context()
        front = context.socket(zmq.ROUTER)
        port = front.bind_to_random_port("tcp://127.0.0.1")
        consumer = AsyncPullConsumer(f"tcp://127.0.0.1:{port}", context=context)
        await consumer.start()
        message = SimpleNamespace(topic="T", msg_id="7F0000015C2B7D9A23D1822A121D0000",
                                  offset_msg_id="7F00000100002A9F0000000000000000")

        async def answer(*statuses):
            for status in statuses:
                client, header = (await asyncio.wait_for(front.recv_multipart(), 5))[:2]
                assert orjson.loads(header)["code"] == 36
                reply = {"opaque": orjson.loads(header)["opaque"], "status": status, "remark": status.lower()}
                await front.send_multipart([client, orjson.dumps(reply)])

        try:
            asked = asyncio.ensure_future(consumer.send_back(message, "g"))
            await answer("SYSTEM_BUSY", "SYSTEM_BUSY", "OK")
            assert await asyncio.wait_for(asked, 5) is None
            asked = asyncio.ensure_future(consumer.send_back(message, "g"))
            await answer("SUBSCRIPTION_GROUP_NOT_EXIST")
            with pytest.raises(SendError, match="SUBSCRIPTION_GROUP_NOT_EXIST"):
                await asyncio.wait_for(asked, 5)
        finally:
            await consumer.close()
            front.close(0)
            context.term()

    asyncio.run(main())


def test_a_recall_handle_is_rocketmqs_and_anything_else_is_refused():
    import base64

    handle = protocol.recall_handle("Orders", "broker-a", 1795983177432, "7F0000011F895FFBADB094888ED80000")
    assert base64.urlsafe_b64decode(handle).decode() == "v1 Orders broker-a 1795983177432 7F0000011F895FFBADB094888ED80000"
    assert protocol.parse_recall_handle(handle) == ("Orders", "broker-a", 1795983177432, "7F0000011F895FFBADB094888ED80000")
    assert protocol.parse_recall_handle(protocol.recall_handle("T", "", 5, "ID"))[1] == ""  # (an endpoint client's)
    for bad in ("h", "", None, 5, "!!!", base64.urlsafe_b64encode(b"v2 T b 1 ID").decode(),
                base64.urlsafe_b64encode(b"v1 T b soon ID").decode(), base64.urlsafe_b64encode(b"v1 T b 1").decode(),
                base64.urlsafe_b64encode(b"\xff\xfe").decode()):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_recall_handle(bad)

import struct
import zlib

import pytest
from golden import GOLDEN_STORE, all_records, manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shm.codec import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V2,
    Blank,
    Corruption,
    CorruptionKind,
    MessageIllegal,
    Record,
    body_crc,
    decode,
    decode_msg_id,
    encode,
    encode_blank,
    encode_host,
    envelope,
    index_key_hash,
    properties_string,
    scan,
    tags_code,
    with_body,
)
from shm.encoded_batch import EncodedBatch

EXAMPLE = bytes.fromhex(
    "000000A7DAA320A73610A686000000030000000000000000000000070000000000000400000000000000018BCFE568007F00"
    "0001" "0000C3500000018BCFE5687B7F00000100002A9F0000000000000000000000000000000568656C6C6F09546F7069635465"
    "7374003E4B455953016B31206B3202554E49515F4B455901374630303030303133303339314236443335383634374237363030"
    "303030303002544147530154616741")
BORN = encode_host("127.0.0.1", 50000)
STORE = encode_host("127.0.0.1", 10911)
SEGMENT = 65536


def test_worked_example_record_byte_for_byte():
    props = properties_string({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "7F00000130391B6D358647B760000000"})
    record = encode(topic="TopicTest", body=b"hello", queue_id=3, born_timestamp=1700000000000, born_host=BORN,
                    store_host=STORE, properties=props, queue_offset=7, physical_offset=1024,
                    store_timestamp=1700000000123)
    assert record == EXAMPLE
    decoded = decode(EXAMPLE)
    assert decoded.msg_id == "7F00000100002A9F0000000000000400"
    assert decoded.body_crc == 907060870 == body_crc(b"hello")
    assert tags_code(decoded.tags) == 0x27A807
    assert [index_key_hash(f"TopicTest#{k}") for k in ("7F00000130391B6D358647B760000000", "k1", "k2")] == [
        789047430, 2746024, 2746025]


def _golden_bytes(offset: int, size: int) -> bytes:
    path = GOLDEN_STORE / "commitlog" / f"{offset - offset % SEGMENT:020d}"
    with open(path, "rb") as f:
        f.seek(offset % SEGMENT)
        return f.read(size)


def test_every_golden_record_decodes_as_the_manifest_says_and_reencodes_identically():
    for expected in all_records():
        offset = expected.get("commitLogOffset", expected.get("msgCommitLogOffset"))
        size = expected.get("wroteBytes", expected.get("storeSize"))
        raw = _golden_bytes(offset, size)
        record = decode(raw)
        assert isinstance(record, Record)
        assert (record.physical_offset, record.total_size, record.msg_id) == (offset, size, expected["msgId"])
        assert record.body.hex() == expected["bodyHex"] and record.body_crc == expected["bodyCRC"]
        assert record.properties == expected["properties"]
        assert record.store_timestamp == expected["storeTimestamp"]
        assert (str(record.born_host), str(record.store_host)) == ("127.0.0.1:50000", "127.0.0.1:10911")
        again = encode(topic=record.topic, body=record.body, queue_id=record.queue_id, flag=record.flag,
                       born_timestamp=record.born_timestamp, born_host=BORN, store_host=STORE,
                       properties=record.properties_string, queue_offset=record.queue_offset,
                       physical_offset=record.physical_offset, store_timestamp=record.store_timestamp)
        assert again == raw


def test_golden_batch_records_carry_inner_properties_then_cluster():
    batch = [p for p in manifest()["puts"] if p["kind"] == "batch"]
    assert len(batch) == 10
    for put in batch:
        record = decode(_golden_bytes(put["commitLogOffset"], put["wroteBytes"]))
        inner = {k: v for k, v in put["requestedProperties"].items()}
        ordered = {k: inner[k] for k in ("TAGS", "KEYS", "WAIT", "UNIQ_KEY") if k in inner}
        assert record.properties_string == properties_string(ordered) + "\x02" + put["batchProperties"]


def test_golden_segments_end_with_blank_records():
    for path in sorted((GOLDEN_STORE / "commitlog").iterdir())[:-1]:
        data = path.read_bytes()
        result = scan(data, 0, len(data))
        assert isinstance(result.stopped_by, Blank)
        assert result.stopped_by.size == len(data) - result.end
        assert struct.unpack_from(">ii", data, result.end) == (len(data) - result.end, BLANK_MAGIC)


# -- round trips ----------------------------------------------------------------------------------

topics = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda t: len(t.encode()) <= 127)
prop_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1, max_size=30)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(topic=topics, body=st.binary(max_size=3000), props=st.dictionaries(prop_text, prop_text, max_size=6),
       queue_id=st.integers(0, 2**31 - 1), flag=st.integers(-2**31, 2**31 - 1), v6=st.tuples(st.booleans(), st.booleans()),
       offsets=st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62)))
def test_encode_decode_round_trip(topic, body, props, queue_id, flag, v6, offsets):
    born = encode_host("::1" if v6[0] else "10.1.2.3", 1234)
    store = encode_host("fe80::1" if v6[1] else "127.0.0.1", 10911)
    text = properties_string(props)
    raw = encode(topic=topic, body=body, queue_id=queue_id, flag=flag, born_timestamp=offsets[2], born_host=born,
                 store_host=store, properties=text, queue_offset=offsets[0], physical_offset=offsets[1],
                 store_timestamp=offsets[2])
    record = decode(raw)
    assert isinstance(record, Record)
    assert (record.topic, record.body, record.properties, record.queue_id, record.flag) == (topic, body, props, queue_id, flag)
    assert (record.queue_offset, record.physical_offset, record.store_timestamp) == offsets
    assert bool(record.sys_flag & 0x10) == v6[0] and bool(record.sys_flag & 0x20) == v6[1]
    assert len(record.msg_id) == (56 if v6[1] else 32)
    assert decode_msg_id(record.msg_id) == (record.store_host, record.physical_offset)
    assert scan(raw, 0, len(raw)).end == len(raw)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(topic=topics, body=st.binary(max_size=3000), props=st.dictionaries(prop_text, prop_text, max_size=6),
       v6=st.tuples(st.booleans(), st.booleans()), v2=st.booleans())
def test_an_envelope_and_its_body_are_the_record_again(topic, body, props, v6, v2):
    """What the archive keeps (envelope and body) gives back the record byte for byte, whatever
    its hosts or magic; a body that does not belong is refused, never joined."""
    born = encode_host("::1" if v6[0] else "10.1.2.3", 1234)
    store = encode_host("fe80::1" if v6[1] else "127.0.0.1", 10911)
    raw = encode(topic=topic, body=body, queue_id=3, born_timestamp=7, born_host=born, store_host=store,
                 properties=properties_string(props), queue_offset=11, physical_offset=13, store_timestamp=17)
    if v2:  # MESSAGE_MAGIC_V2 (RocketMQ 5): a two-byte topic length after the body
        cut = len(raw) - 2 - len(properties_string(props).encode()) - len(topic.encode()) - 1
        raw = (struct.pack(">ii", len(raw) + 1, MESSAGE_MAGIC_V2) + raw[8:cut]
               + struct.pack(">h", len(topic.encode())) + raw[cut + 1:])
        assert decode(raw).topic == topic
    head = envelope(raw)
    assert len(head) == len(raw) - len(body) and with_body(head, body) == raw
    if body:
        with pytest.raises(ValueError, match="CRC"):
            with_body(head, bytes([body[0] ^ 1]) + body[1:])
    with pytest.raises(ValueError, match="envelope"):
        with_body(head, body + b"x")


@pytest.mark.parametrize("size", [0, 4 * 1024 * 1024])
def test_empty_and_4mib_bodies(size):
    body = bytes(range(256)) * (size // 256)
    raw = encode(topic="T", body=body, queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE)
    record = decode(raw)
    assert record.body == body and record.body_crc == (0 if size == 0 else zlib.crc32(body) & 0x7FFFFFFF)


# -- limits (DefaultMessageStoreTest.testPutLongMessage) ------------------------------------------

def test_limits_follow_rocketmq():
    max_size = 4 * 1024 * 1024
    encode(topic="t" * 127, body=b"x" * max_size, queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE,
           properties="k\x01" + "v" * (32767 - 2))
    cases = [
        (dict(body=b"x" * (max_size + 1)), "MESSAGE_ILLEGAL"),
        (dict(body=b"x" * (max_size + 64 * 1024)), "MESSAGE_ILLEGAL"),
        (dict(properties="k\x01" + "v" * (32768 - 2)), "PROPERTIES_SIZE_EXCEEDED"),
        (dict(topic="t" * 128), "MESSAGE_ILLEGAL"),
        (dict(topic=""), "MESSAGE_ILLEGAL"),
    ]
    for change, status in cases:
        args = dict(topic="T", body=b"x", queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE)
        args.update(change)
        with pytest.raises(MessageIllegal) as error:
            encode(**args)
        assert error.value.status == status
    # maxMessageSize is a setting: raising it admits the same body (testDynamicMaxMessageSize)
    encode(topic="T", body=b"x" * (max_size + 10), queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE,
           max_message_size=max_size + 10)
    with pytest.raises(MessageIllegal, match="message body size exceeded"):
        encode(topic="T", body=b"x" * 11, queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE,
               max_message_size=10)


# -- named outcomes -----------------------------------------------------------------------------

def test_decode_names_what_is_wrong():
    assert decode(encode_blank(100) + bytes(92)) == Blank(0, 100)
    assert decode(bytes(16)).kind is CorruptionKind.END_OF_DATA
    bad_magic = bytearray(EXAMPLE)
    bad_magic[5] ^= 0xFF
    assert decode(bad_magic).kind is CorruptionKind.BAD_MAGIC
    assert decode(EXAMPLE[:100]).kind is CorruptionKind.TRUNCATED
    assert decode(EXAMPLE[:5]).kind is CorruptionKind.TRUNCATED
    bad_crc = bytearray(EXAMPLE)
    bad_crc[88] ^= 1  # first body byte
    assert decode(bad_crc).kind is CorruptionKind.CRC_MISMATCH
    assert isinstance(decode(bad_crc, check_crc=False), Record)
    bad_size = bytearray(EXAMPLE)
    bad_size[93] = 3  # topic length no longer adds up
    result = decode(bad_size)
    assert isinstance(result, Corruption) and result.kind is CorruptionKind.BAD_SIZE and result.size == 167
    assert scan(bad_crc, 0, len(bad_crc)).stopped_by.kind is CorruptionKind.CRC_MISMATCH


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 300))
def test_decode_never_raises_on_garbage(garbage, position):
    data = EXAMPLE[:position % len(EXAMPLE)] + garbage
    for item in (decode(data), decode(data, 0, check_crc=False), scan(data, 0, len(data))):
        assert item is not None


def test_encoded_batch_leaves_three_fields_for_the_writer():
    batch = EncodedBatch()
    prepared = encode(topic="T", body=b"p", queue_id=1, born_timestamp=1, born_host=BORN, store_host=STORE, sys_flag=0x4)
    batch.add(encode(topic="T", body=b"a", queue_id=1, born_timestamp=1, born_host=BORN, store_host=STORE))
    batch.add(prepared)
    batch.add(encode(topic="T", body=b"b", queue_id=2, born_timestamp=1, born_host=encode_host("::1", 1), store_host=STORE))
    assert batch.queue_keys == ["T-1", None, "T-2"]
    assert batch.timestamp_offsets == [56, 56, 68]
    assert batch.positions[1] == batch.sizes[0]


# -- one codec: every reader of the layout agrees with `decode` ------------------------------------
# The dispatcher (`dispatch_fields`), the client (`walk_v4`, `decode_messages`), recovery
# (`peek_store_timestamp`) and the writer's batch (`record_head`, `record_topic`) each read part of
# a record in place. Over good records and the same bytes damaged, each either agrees with the
# full decode or declines (a None, a named Corruption); none raises, none reads past the record.

def _record(topic, body, props, v6, stamp):
    return encode(topic=topic, body=body, queue_id=5, flag=3, born_timestamp=7,
                  born_host=encode_host("::1" if v6[0] else "10.1.2.3", 1234),
                  store_host=encode_host("fe80::1" if v6[1] else "127.0.0.1", 10911),
                  properties=properties_string(props), queue_offset=11, physical_offset=4096, store_timestamp=stamp)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(topic=topics, body=st.binary(max_size=300), props=st.dictionaries(prop_text, prop_text, max_size=4),
       v6=st.tuples(st.booleans(), st.booleans()), stamp=st.integers(0, 2**62),
       flips=st.lists(st.tuples(st.integers(0, 600), st.integers(0, 255)), max_size=3), cut=st.integers(0, 700))
def test_every_partial_reader_agrees_with_decode(topic, body, props, v6, stamp, flips, cut):
    from node.client.producer import SendError
    from node.client.received import decode_messages
    from shm.codec import (dispatch_fields, peek_store_timestamp, record_head, record_properties, record_topic,
                           walk_records_v4, walk_v4)

    good = _record(topic, body, props, v6, stamp)
    raw = bytearray(good)
    for at, value in flips:
        if at < len(raw):
            raw[at] = value
    raw = bytes(raw[:cut]) if cut < len(raw) else bytes(raw)
    full = decode(raw, check_crc=False)

    item = dispatch_fields(raw, 0, len(raw))
    if isinstance(full, Record):
        assert item == (full.total_size, full.queue_id, full.queue_offset, full.physical_offset, full.sys_flag,
                        full.store_timestamp, full.topic, full.properties_string)
    else:
        assert not isinstance(item, tuple)

    # The client's walk is lazy: it checks the layout and leaves text undecoded until asked.
    walked = walk_v4(raw, 0, len(raw)) if len(raw) >= 4 else None
    if walked is not None:
        assert isinstance(full, Record) or "codec can't decode" in full.detail
        fixed, body_at, topic_at, props_at = walked
        if isinstance(full, Record):
            assert raw[body_at: body_at + fixed[14]] == full.body and full.total_size == len(raw)
            assert raw[topic_at: props_at - 2].decode() == full.topic
    try:  # the bulk walk (the Spark connector's) agrees with the single one, record for record
        many, left = walk_records_v4(raw)
    except ValueError:
        assert not isinstance(full, Record) or full.total_size != len(raw)  # not one whole record
    else:
        single = walk_v4(raw, 0, len(raw)) if len(raw) >= 4 and int.from_bytes(raw[:4], "big", signed=True) == len(raw) else None
        if single is not None and single[0][1] == -626843481:  # V1: the bulk walk takes V1 only
            assert [w[:4] for w in many] == [single] and left == []
        elif many:
            assert isinstance(full, Record) or "codec can't decode" in full.detail
    try:
        messages = decode_messages(raw)
    except SendError:
        assert not isinstance(full, Record) or full.total_size != len(raw)
    else:
        assert len(messages) == (1 if raw else 0)
        assert isinstance(full, Record) or not raw or walked is not None
        if isinstance(full, Record):
            assert all((m.topic, m.body, m.properties) == (full.topic, full.body, full.properties) for m in messages)

    if raw == good:
        assert isinstance(full, Record)
        assert peek_store_timestamp(raw) == stamp
        assert record_head(raw) == (len(raw), full.magic, 5, full.sys_flag)
        assert record_topic(raw, full.sys_flag) == topic
        assert record_properties(raw) == full.properties and record_properties(b"xx" + raw, 2) == full.properties


@pytest.mark.parametrize("born, store", [(encode_host("127.0.0.1", 1), encode_host("10.0.0.2", 2)),
                                         (encode_host("::1", 1), encode_host("fe80::2", 2))])
def test_a_records_transaction_bits_and_prepared_offset_are_read_from_its_head_alone(born, store):
    from shm.codec import TRANSACTION_COMMIT, TRANSACTION_HEAD_BYTES, peek_transaction
    record = encode(topic="T", body=b"x" * 300, queue_id=1, born_timestamp=1, born_host=born, store_host=store,
                    properties="a\x01b", sys_flag=TRANSACTION_COMMIT | 0x1, prepared_transaction_offset=123456789)
    assert peek_transaction(record[:TRANSACTION_HEAD_BYTES]) == (TRANSACTION_COMMIT, 123456789)
    assert peek_transaction(b"pad" + record, 3) == (TRANSACTION_COMMIT, 123456789)
    assert decode(record).prepared_transaction_offset == 123456789


def test_a_batch_body_less_its_first_messages_is_the_batch_of_the_rest():
    from node.protocol import decode_batch_body, encode_batch_body
    from shm.codec import batch_body_after
    messages = [(f"m{i}".encode() * i, i, f"K\x01v{i}") for i in range(5)]
    body = encode_batch_body(messages)
    for skip in range(6):
        rest = batch_body_after(body, skip)
        assert (decode_batch_body(rest) if rest else []) == messages[skip:]

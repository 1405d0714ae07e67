"""The column-wise decoding of pull replies (node.pipeline.columns) equals the record-by-record
path (node.pipeline.rows.records_batch) column for column, on generated records with every kind
of property oddity, on RocketMQ 4.9's golden store, under the offset and tag filters and every
schema the connector uses; what it cannot read exactly it declines (None), never guesses."""

from __future__ import annotations

import pyarrow as pa
import pytest
from golden import GOLDEN_STORE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.pipeline.columns import columns_batch
from node.pipeline.offline import SegmentReport, commitlog_dir, segments, walk
from node.pipeline.rows import ARCHIVE_SCHEMA, ARROW_SCHEMA, records_batch
from shm.codec import encode, encode_host, properties_string

SPARK_SCHEMA = pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f
                          for f in ARROW_SCHEMA])  # what arrow_schema gives Spark's DDL
BORN, STORE = encode_host("10.0.0.7", 5555), encode_host("127.0.0.1", 10911)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
odd = st.sampled_from(["", "\x02", "\x02junk", "\x02\x01novalue", "\x02name\x01", "\x02\x02"])


@st.composite
def records(draw) -> bytes:
    props = draw(st.dictionaries(text.filter(bool), text, max_size=5))
    for name in ("TAGS", "KEYS", "UNIQ_KEY"):
        if draw(st.booleans()):
            props[name] = draw(st.sampled_from(["", "a", "é", "k1 k2", " k3  k4 ", "ABC"]))
    return encode(topic=draw(st.sampled_from(["T", "Tö", "%RETRY%g"])), body=draw(st.binary(max_size=64)),
                  queue_id=draw(st.integers(0, 7)), flag=draw(st.integers(-5, 5)),
                  born_timestamp=draw(st.integers(0, 2**41)), born_host=draw(st.sampled_from([BORN, STORE])),
                  store_host=STORE, properties=properties_string(props) + draw(odd),
                  queue_offset=draw(st.integers(0, 100)), physical_offset=draw(st.integers(0, 2**40)),
                  store_timestamp=draw(st.integers(0, 2**41)), reconsume_times=draw(st.integers(0, 16)))


def assert_same(run: bytes, end: int = 2**62, tags=None, schema=ARROW_SCHEMA) -> None:
    fast, slow = columns_batch(run, end, tags, schema), records_batch([run], end, tags, schema)
    assert fast is not None, "declined a run it should read"
    for name in schema.names:
        assert fast.column(name).equals(slow.column(name)), (name, fast.column(name)[:3], slow.column(name)[:3])
    assert fast.schema.equals(slow.schema)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(records(), min_size=1, max_size=40), st.integers(0, 100),
       st.sampled_from([None, frozenset({"a"}), frozenset({"é", ""})]),
       st.sampled_from([ARROW_SCHEMA, SPARK_SCHEMA, ARCHIVE_SCHEMA]))
def test_columns_equal_the_record_by_record_path(run, end, tags, schema):
    assert_same(b"".join(run), end, tags, schema)


def test_golden_runs_read_alike():
    """RocketMQ 4.9's records: V1 magic, its properties and hosts; a run the fast path declines
    (none here, but say an IPv6 host) would be read by the other."""
    checked = 0
    for segment in segments(commitlog_dir(str(GOLDEN_STORE))):
        for run in walk(segment, SegmentReport()):
            if columns_batch(run, 2**62, None, ARROW_SCHEMA) is not None:
                assert_same(run)
                checked += 1
    assert checked


@pytest.mark.parametrize("record", [
    encode(topic="T", body=b"x", queue_id=0, born_timestamp=1, born_host=encode_host("::1", 1), store_host=STORE),
    encode(topic="T", body=b"x", queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE,
           properties="a\x01b\x02a\x01c"),  # a key twice: the last value wins, in the first one's place
    encode(topic="T", body=b"x", queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE)[:-1],  # torn
], ids=["ipv6-host", "key-twice", "torn"])
def test_what_it_cannot_read_exactly_it_declines(record):
    assert columns_batch(record, 2**62, None, ARROW_SCHEMA) is None


def test_text_that_is_not_utf8_is_declined():
    record = bytearray(encode(topic="T", body=b"x", queue_id=0, born_timestamp=1, born_host=BORN, store_host=STORE,
                              properties="a\x01bc"))
    record[-1] = 0xFF  # the last property byte
    assert columns_batch(bytes(record), 2**62, None, ARROW_SCHEMA) is None

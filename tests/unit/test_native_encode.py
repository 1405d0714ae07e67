"""shm._encode, the codec's one-pass encode loops in C, against the Python loops it mirrors.

One suite over both implementations (the NATS file store's conformance idea): for any input,
well-formed or not, the C function returns exactly what the Python one returns (the same bytes
and side lists, or None: take the general path). tests/unit/test_protocol.py checks the Python loops
against the general path, and runs its SendEncoder tests over both.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from node import protocol
from shm import codec
from shm.codec import encode_batch_v4_py, encode_host, encode_messages_v4_py, offset_ids_py, offset_msg_id

pytestmark = pytest.mark.skipif(os.environ.get("MQNODE_NATIVE") == "0", reason="MQNODE_NATIVE=0")

BORN, STORE = encode_host("10.0.0.1", 5), encode_host("10.0.0.2", 10911)
_GOOD_PROPS = [None, {}, {"TAGS": "a"}, {"WAIT": "false"}, {"WAIT": "true", "TAGS": "t"}, {"é": "ü"}, {"{x}": "v"},
               {"UNIQ_KEY": "u1", "KEYS": "k1 k2", "WAIT": "false"}, {"CLUSTER": "mine"}, {f"p{i}": "v" for i in range(14)}]
_GOOD = st.fixed_dictionaries(
    {"topic": st.sampled_from(["T", "é", "t" * 127]), "queueId": st.sampled_from([0, 3, 2**31 - 1]),
     "bodySize": st.integers(0, 30)},
    optional={"properties": st.sampled_from(_GOOD_PROPS), "flag": st.sampled_from([0, -(2**31)]),
              "reconsumeTimes": st.sampled_from([0, 2]), "bornTimestamp": st.sampled_from([1, -(2**63)])})
_SPOILERS = [  # each spoils a message for the one-pass loops in its own way
    {"queueId": 2**31}, {"queueId": True}, {"queueId": None}, {"flag": 2**31}, {"flag": "x"},
    {"reconsumeTimes": -(2**31) - 1}, {"bornTimestamp": 2**63}, {"bornTimestamp": None}, {"topic": ""},
    {"topic": "t" * 128}, {"topic": 5}, {"_refused": ["MESSAGE_ILLEGAL", "no"]}, {"bodySize": 31}, {"bodySize": True},
    {"properties": {"TAGS": "\ud800"}}, {"properties": {"TAGS": 5}}, {"properties": {"DELAY": "1"}},
    {"properties": {"": "x"}}, {"properties": {"a": ""}}, {"properties": {"a\x01": "b"}}, {"properties": {5: "b"}},
    {"properties": {"a": "b\x02"}}, {"properties": {"big": "x" * 32800}}, {"properties": "TAGS\x01x"},
    {"properties": []}]
_MESSAGE = st.tuples(_GOOD, st.one_of(st.just({}), st.sampled_from(_SPOILERS))).map(lambda pair: pair[0] | pair[1])

def test_the_c_encoder_is_built_and_chosen():
    """The suite must not pass by leaving C out: scripts/test installs with gcc at hand."""
    assert codec.NATIVE and codec._encode is not None
    assert codec.encode_messages_v4 is codec.encode_messages_v4_c and codec.encode_batch_v4 is codec.encode_batch_v4_c


@hypothesis_settings(max_examples=400)
@given(st.lists(st.one_of(_MESSAGE, st.just(5)), min_size=1, max_size=6), st.binary(min_size=0, max_size=200),
       st.sampled_from([BORN, BORN + b"\x00" * 12]))
def test_coalesced_sends_c_matches_python(messages, body, born):
    """Good messages, one of them perhaps spoiled: the C loop writes what the Python loop
    writes, and declines what it declines."""
    at = 0
    for item in messages:  # the caller's check: the sizes add up to the body
        if isinstance(item, dict):
            at += item["bodySize"]
    body = (body * (at // max(len(body), 1) + 1))[:at] if body else bytes(at)
    args = (messages, body, born, STORE, 30, "DefaultCluster")
    assert _plain(codec.encode_messages_v4_c(*args)) == _plain(encode_messages_v4_py(*args))


def test_coalesced_sends_c_writes_the_common_request():
    """The common request is encoded, not declined (the test above would pass if C always said None)."""
    messages = [{"topic": "T", "queueId": i, "bodySize": 2, "bornTimestamp": 1,
                 "properties": {"UNIQ_KEY": f"K{i}", "TAGS": "a", "WAIT": "false"}} for i in range(3)]
    args = (messages, b"abcdef", BORN, STORE, 1024, "DefaultCluster")
    encoded = codec.encode_messages_v4_c(*args)
    assert encoded is not None and encoded[6] is False and encoded[5] == ["K0", "K1", "K2"]
    assert _plain(encoded) == _plain(encode_messages_v4_py(*args))


_INNER = st.tuples(st.binary(max_size=40), st.integers(-2**31, 2**31 - 1),
                   st.lists(st.sampled_from(["UNIQ_KEY\x01u", "UNIQ_KEY\x01", "TAGS\x01a", "\x02", "é", "x"]), max_size=5).map("".join))


@hypothesis_settings(max_examples=400)
@given(st.lists(_INNER, min_size=0, max_size=6), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
       st.integers(0, 400), st.sampled_from([b"", b"CLUSTER\x01c", b"x" * 32760]), st.sampled_from([0, 3, 2**31, -1]),
       st.sampled_from([b"T", b"", b"t" * 128]), st.sampled_from([30, 1024]), st.sampled_from([2, 4096]))
def test_client_batches_c_matches_python(inner, flips, cut, suffix, queue_id, topic, max_size, limit):
    """Well-formed batch bodies, and the same with bytes flipped and cut short: the C loop keeps
    exactly what the Python loop keeps, and declines exactly what it declines."""
    data = bytearray(protocol.encode_batch_body(inner))
    for at, value in flips:
        if at < len(data):
            data[at] = value
    data = bytes(data[:cut] if cut < len(data) else data)
    args = (data, topic, queue_id, 1_700_000_000_000, BORN, STORE, suffix, max_size, limit)
    assert _plain(codec.encode_batch_v4_c(*args)) == _plain(encode_batch_v4_py(*args))


def test_the_c_encoder_keeps_no_memory():
    """Reference counts are right: a thousand requests through each loop leave nothing behind."""
    messages = [{"topic": "T", "queueId": i % 4, "bodySize": 100, "properties": {"UNIQ_KEY": f"K{i}", "TAGS": "a"}}
                for i in range(64)]
    body, batch_body = bytes(6400), protocol.encode_batch_body([(bytes(100), 0, "UNIQ_KEY\x01u")] * 64)

    def once():
        assert codec.encode_messages_v4_c(messages, body, BORN, STORE, 1024, "c") is not None
        assert codec.encode_batch_v4_c(batch_body, b"T", 0, 1, BORN, STORE, b"CLUSTER\x01c", 1024, 4096) is not None
        assert codec.encode_messages_v4_c(messages + [{"topic": 5}], body, BORN, STORE, 1024, "c") is None
        assert len(codec.offset_ids_c(STORE, physical, list(range(64)))) == 64
        with pytest.raises(IndexError):
            codec.offset_ids_c(STORE, physical, [0, 64])

    physical = [(1 << 40) + 1100 * i for i in range(64)]

    once()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(1000):
            once()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 1,000 rounds"


@hypothesis_settings(max_examples=200, deadline=None)
@given(st.binary(min_size=8, max_size=8), st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=40),
       st.data())
def test_offset_ids_c_matches_python(host, physical, data):
    indices = data.draw(st.lists(st.integers(0, len(physical) - 1), max_size=60))
    ids = codec.offset_ids_c(host, physical, indices)
    assert ids == offset_ids_py(host, physical, indices)
    assert all(offset_msg_id(host, physical[i]) == ids[k] for k, i in enumerate(indices))


def test_offset_ids_c_refuses_what_python_would_not_answer():
    with pytest.raises(IndexError, match="outside"):
        codec.offset_ids_c(STORE, [1, 2], [-1])  # Python would wrap; a refused message has no offset
    with pytest.raises(IndexError, match="outside"):
        codec.offset_ids_c(STORE, [1, 2], [2])
    with pytest.raises(ValueError, match="8 bytes"):
        codec.offset_ids_c(encode_host("::1", 5), [1], [0])  # answer() takes IPv6 hosts through Python
    with pytest.raises(OverflowError):
        codec.offset_ids_c(STORE, [2**63], [0])


def _plain(encoded):
    """An encoder's answer with its buffer as bytes, to compare."""
    return None if encoded is None else (bytes(encoded[0]), *encoded[1:])

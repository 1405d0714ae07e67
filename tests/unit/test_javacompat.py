import pytest
from golden import manifest

from shm.codec import parse_properties, properties_string
from shm.javacompat import hashmap_capacity, hashmap_order, jhash


@pytest.mark.parametrize("text,expected", [
    ("", 0), ("hello", 99162322), ("TagA", 2598919), ("polygenelubricants", -2147483648),
    ("\U0001F600", 1772899), ("é", 233),
])
def test_jhash_reference_values(text, expected):
    assert jhash(text) == expected


def _reference_jhash(text: str) -> int:
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@pytest.mark.parametrize("text", ["a" * 100000, "TopicA#key-1", "mixed ünïcødé 😀 keys", "x"])
def test_jhash_matches_the_definition(text):
    assert jhash(text) == _reference_jhash(text)


def test_hashmap_order_examples_from_the_spec():
    assert hashmap_order(["TAGS", "KEYS", "UNIQ_KEY"]) == ["KEYS", "UNIQ_KEY", "TAGS"]
    assert hashmap_order(["TAGS", "KEYS", "UNIQ_KEY", "CLUSTER"]) == ["KEYS", "UNIQ_KEY", "CLUSTER", "TAGS"]
    assert hashmap_capacity(12) == 16 and hashmap_capacity(13) == 32


def test_properties_string_reproduces_every_golden_single_put():
    """Built in the order the Java Message constructor and broker insert them."""
    insertion = ["TAGS", "KEYS", "WAIT", "UNIQ_KEY", "userProp", "DELAY", "CLUSTER", "REAL_TOPIC", "REAL_QID"]
    checked = 0
    for put in manifest()["puts"]:
        if "propertiesString" not in put:
            continue
        props = put["properties"]
        ordered = {k: props[k] for k in insertion if k in props}
        assert len(ordered) == len(props)
        assert properties_string(ordered) == put["propertiesString"]
        assert parse_properties(put["propertiesString"]) == props
        checked += 1
    assert checked >= 600


@pytest.mark.parametrize("text,expected", [
    ("", {}), ("a\x01b", {"a": "b"}), ("a\x01", {}), ("\x01b", {}), ("ab", {}),
    ("a\x01b\x02\x02c\x01d\x02", {"a": "b", "c": "d"}), ("a\x011\x02a\x012", {"a": "2"}),
    ("k\x01v\x01w", {"k": "v\x01w"}),
])
def test_parse_properties_follows_java_rules(text, expected):
    assert parse_properties(text) == expected

"""actors.config_files.dumps: fastjson's pretty format, whose beans of scalars come from a cache
(a table is written whole at each change). The cache must never change a byte of what is written."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors import config_files

scalars = st.one_of(st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.sampled_from(["", "a", "1", "true"]), st.none())
beans = st.dictionaries(st.sampled_from(["order", "perm", "name", "flag"]), scalars, max_size=4)
values = st.recursive(beans, lambda inner: st.one_of(
    st.dictionaries(st.sampled_from(["t1", "t2", "t3"]), inner, max_size=3),
    st.dictionaries(st.integers(0, 3), inner, max_size=3),
    st.lists(scalars, max_size=3)), max_leaves=12)


def _fresh(value) -> str:
    config_files._flat_beans.clear()
    return config_files.dumps(value)


def _table(value) -> dict:
    return {"table": {"entries": value}}  # (the cache serves a table's entries: from two levels down)


@settings(max_examples=300)
@given(st.lists(values, min_size=1, max_size=6))
def test_a_value_is_written_the_same_whatever_was_written_before(seen):
    seen = [_table(value) for value in seen]
    fresh = [_fresh(value) for value in seen]
    config_files._flat_beans.clear()
    assert [config_files.dumps(value) for value in seen] == fresh
    assert [config_files.dumps(value) for value in reversed(seen)] == fresh[::-1]


def test_equal_values_of_other_types_are_written_each_as_itself():
    table = _table({"a": {"x": True, "y": 1.0}, "b": {"x": 1, "y": 1}, "c": {"x": 1.0, "y": True}})
    assert config_files.dumps(table) == _fresh(table)
    assert config_files.dumps(table).count("true") == 2 and '"x":1,' in config_files.dumps(table)
    assert config_files.loads(config_files.dumps(table)) == table


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(config_files, "FLAT_BEANS_KEPT", 10)
    config_files._flat_beans.clear()
    for i in range(50):
        config_files.dumps(_table({f"t{i}": {"n": i}}))
    assert len(config_files._flat_beans) <= 10


def test_what_changes_at_each_write_is_not_kept():
    config_files._flat_beans.clear()
    config_files.dumps({"dataVersion": {"counter": 1, "timestamp": 2}, "offsetTable": {"T@G": {0: 5, 1: 7}}})
    assert not config_files._flat_beans

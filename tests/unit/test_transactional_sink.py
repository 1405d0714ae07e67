"""The transactional Spark sink's grouping of rows into one-half batches (node.pipeline.transactions),
without Spark or a node: the rows of each topic, queue and sharding key in their order, at most
BATCH rows and HALF_BYTES of bodies a half (one larger row alone), nothing lost or repeated."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from node.client import Message
from node.pipeline import transactions


@given(st.lists(st.tuples(st.sampled_from(["A", "B"]), st.sampled_from([None, 0, 1]),
                          st.sampled_from([1, 100, 300_000, 2_000_000])), max_size=60))
def test_rows_go_in_halves_of_a_bounded_size_in_their_order(rows):
    messages = [(Message(topic, bytes(size), keys=[str(i)]), queue, None) for i, (topic, queue, size) in enumerate(rows)]
    halves = list(transactions._batches(iter(messages)))
    for (topic, queue, _), group in halves:
        assert 0 < len(group) <= transactions.BATCH
        assert len(group) == 1 or sum(len(m.body) for m in group) <= transactions.HALF_BYTES
        assert {(m.topic, q) for m, q, _ in messages if m in group} == {(topic, queue)}
    for key in {(m.topic, q, s) for m, q, s in messages}:  # each key's rows, once each, in order
        sent = [m.keys for k, group in halves if k == key for m in group]
        assert sent == [m.keys for m, q, s in messages if (m.topic, q, s) == key]

"""Under split a send request crosses a ring: one too large for any ring message is the client's
mistake, refused with MESSAGE_ILLEGAL, and the front goes on serving (it must not die on it)."""

from __future__ import annotations

import pytest
from nodes import in_process_node
from test_front_door import Client

from node import protocol
from shm.ring import data_ring_capacity


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    yield from in_process_node(tmp_path_factory.mktemp("limits"), topology="split")


def test_a_request_larger_than_a_ring_message_is_refused_and_the_front_goes_on(node):
    client = Client(node.settings.listen)
    try:
        pid = (node.settings.run_dir / "front.pid").read_text()
        # messages each within maxMessageSize, together more than half the ring (what one ring
        # message may carry)
        size = node.settings.maxMessageSize
        count = data_ring_capacity(node.settings) // 2 // size + 1
        messages = [{"topic": "Limits", "queueId": 0, "bodySize": size} for _ in range(count)]
        reply, _ = client.ask({"code": protocol.SEND_MESSAGES, "messages": messages}, bytes(count * size))
        assert reply["status"] == "MESSAGE_ILLEGAL" and "at most" in str(reply), reply
        reply, _ = client.ask({"code": protocol.SEND_MESSAGE, "topic": "Limits", "queueId": 0}, b"after")
        assert reply["status"] == "PUT_OK", reply
        assert (node.settings.run_dir / "front.pid").read_text() == pid  # the same front answered
    finally:
        client.close()

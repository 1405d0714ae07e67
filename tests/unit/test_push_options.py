"""PushOptions.check: what RocketMQ's DefaultMQPushConsumer refuses at its start, and periods that
must pass (heartbeat_interval=0 sent heartbeats in a loop that never slept)."""

from __future__ import annotations

import pytest

from node.client.push_state import PushOptions


@pytest.mark.parametrize("options", [
    {"heartbeat_interval": 0}, {"rebalance_interval": -1}, {"persist_interval": 0}, {"consume_timeout": 0},
    {"timeout": 0}, {"pull_threshold_for_queue": 0}, {"pull_threshold_size_for_queue": 2048},
    {"suspend_current_queue_time_millis": 5}, {"max_reconsume_times": -2}, {"heartbeat_interval": "30"},
    {"consume_thread_min": 0}, {"pull_batch_size": 0},
])
def test_an_option_out_of_its_range_is_a_value_error_naming_it(options):
    name = next(iter(options))
    with pytest.raises(ValueError, match=name.split("_")[0]):
        PushOptions(**options).check()


def test_the_defaults_and_the_edges_pass():
    PushOptions().check()
    PushOptions(heartbeat_interval=0.5, suspend_current_queue_time_millis=10, max_reconsume_times=-1,
                pull_threshold_for_queue=65535, pull_threshold_size_for_queue=1024).check()


@pytest.mark.parametrize("options", [{"retries": -1}, {"retries": 1.5}, {"timeout": 0}, {"max_coalesce": 0},
                                     {"linger_ms": -5}])
def test_a_producer_option_no_producer_works_with_is_a_value_error_naming_it(options):
    """retries=-1 sent nothing and ended in an AssertionError of the client's ("unreachable")."""
    from node.client.producer import AsyncProducer

    with pytest.raises(ValueError, match=next(iter(options))):
        AsyncProducer("tcp://127.0.0.1:1", **options)

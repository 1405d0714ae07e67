"""The metrics' conversions without a node: RocketMQ's put-latency ranges as cumulative
Prometheus buckets, and the per-topic put counters' bound."""

from __future__ import annotations

from actors.writer import MAX_TOPICS, OTHER_TOPICS, TopicPuts
from node.server.metrics import _latency_buckets
from actors.sendcore import PendingSend


def test_rocketmqs_distribution_becomes_cumulative_buckets():
    text = "[<=0ms]:1 [0~10ms]:5 [10~50ms]:2 [50~100ms]:0 [500ms~1s]:1 [1~2s]:0 [10s~]:3"
    assert _latency_buckets(text) == [("0.0", 1), ("0.01", 6), ("0.05", 8), ("0.1", 8), ("1.0", 9),
                                      ("2.0", 9), ("+Inf", 12)]  # (le in seconds, Prometheus's base unit)
    assert _latency_buckets("") == []


def _pending(topics, indices, refusals=None) -> PendingSend:
    return PendingSend(b"c", 1, 9010, 0, indices=indices, refusals=refusals or {}, topics=topics)


def test_topic_puts_count_statuses_and_bytes_and_stay_bounded():
    puts = TopicPuts()
    sizes = [100, 200, 300, 400]
    puts.count(_pending(["A", "A"], [0, 1]), sizes)
    puts.count(_pending(["A", "B", "B"], [2, -1, 3], {1: ("TOPIC_NOT_EXIST", "no")}), sizes)
    assert puts.statistics() == {"A": {"messages": {"PUT_OK": 3}, "bytes": 600},
                                 "B": {"messages": {"PUT_OK": 1, "TOPIC_NOT_EXIST": 1}, "bytes": 400}}
    for i in range(MAX_TOPICS):  # a flood of made-up names
        puts.count(_pending([f"made-up-{i}"], [-1], {0: ("TOPIC_NOT_EXIST", "no")}), sizes)
    stats = puts.statistics()
    assert len(stats) == MAX_TOPICS + 1 and stats[OTHER_TOPICS]["messages"]["TOPIC_NOT_EXIST"] == 2

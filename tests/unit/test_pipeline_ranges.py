"""The Spark connector's planning without Spark: options, partition splits, trigger caps."""

from __future__ import annotations

import pytest

from node.pipeline.ranges import Options, PipelineError, QueueRange, split
from node.pipeline.source import _capped


def test_options_follow_kafkas_connector_and_name_what_is_wrong():
    o = Options.parse({"endpoint": "tcp://h:1", "topics": "A, B", "MINPARTITIONS": "4"})
    assert (o.topics, o.starting, o.ending, o.min_partitions, o.fail_on_data_loss) == (("A", "B"), "earliest", "latest", 4, True)
    assert Options.parse({"endpoint": "e", "topic": "A"}, streaming=True).starting == "latest"
    for options, message in [({"topic": "A"}, "endpoint"), ({"endpoint": "e"}, "topic"),
                             ({"endpoint": "e", "topic": "A", "startingOffsets": "[1]"}, "startingOffsets"),
                             ({"endpoint": "e", "topic": "A", "endingOffsets": '{"A": {"x": 1}}'}, "endingOffsets"),
                             ({"endpoint": "e", "topic": "A", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
                             ({"endpoint": "e", "topic": "A", "minPartitions": "many"}, "minPartitions"),
                             ({"endpoint": "e", "topic": "A", "minPartitions": "0"}, "minPartitions` must be a positive"),
                             ({"endpoint": "e", "topic": "A", "maxOffsetsPerTrigger": "-5"}, "maxOffsetsPerTrigger"),
                             ({"endpoint": "e", "topic": "A", "timeout": "soon"}, "timeout"),
                             ({"endpoint": "e", "topic": "A", "timeout": "0"}, "timeout")]:
        with pytest.raises(PipelineError, match=message):
            Options.parse(options)
    with pytest.raises(PipelineError, match="endingOffsets"):
        Options.parse({"endpoint": "e", "topic": "A", "endingOffsets": "latest"}, streaming=True)


def test_split_gives_a_range_per_queue_and_cuts_the_largest_for_min_partitions():
    starts, ends = {"T": {"0": 0, "1": 10, "2": 5}}, {"T": {"0": 100, "1": 10, "2": 25}}
    assert split(starts, ends, 0) == [QueueRange("T", 0, 0, 100), QueueRange("T", 2, 5, 25)]
    four = split(starts, ends, 4)
    assert len(four) == 4 and sum(r.end - r.start for r in four) == 120
    assert {(r.start, r.end) for r in four if r.queue_id == 0} == {(0, 50), (50, 100)} or len(
        [r for r in four if r.queue_id == 0]) == 3


def test_a_trigger_cap_is_shared_in_proportion_and_never_exceeded():
    start, latest = {"T": {"0": 0, "1": 0}}, {"T": {"0": 300, "1": 100}}
    assert _capped(start, latest, None) == latest
    capped = _capped(start, latest, 101)
    assert sum(capped["T"].values()) == 101 and capped["T"]["0"] > capped["T"]["1"]
    assert _capped({"T": {"0": 50}}, {"T": {"0": 40}}, 10) == {"T": {"0": 50}}  # never backwards

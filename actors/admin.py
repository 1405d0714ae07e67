"""Administration the router answers from its tables: topics and subscription groups created,
updated and deleted, as RocketMQ's mqadmin updateTopic / deleteTopic / updateSubGroup /
deleteSubGroup do, with RocketMQ's request codes (docs/protocol.md "Administration"). No I/O but
the tables' own persisting (config files written whole, fsynced, renamed, the old one kept as
`.bak`: actors.config_files).

The fields' types and ranges are the edge's (`actors.edge.CHECKS`); what is left here is
what needs the tables: a system topic, a group or topic that does not exist.
"""

from __future__ import annotations

from actors.topics import TopicConfig, topic_error

QUEUE_NUMS_MAX = 1024  # queues a topic may have (RocketMQ has no hard limit; its tools warn past a few hundred)
GROUP_FIELDS = {  # subscriptionGroup.json's fields an update may set, with their types
    "consumeEnable": bool, "consumeBroadcastEnable": bool, "consumeFromMinEnable": bool,
    "retryQueueNums": int, "retryMaxTimes": int, "whichBrokerWhenConsumeSlowly": int, "brokerId": int,
    "consumeMessageOrderly": bool,  # RocketMQ 5's: a FIFO group for gRPC consumers (docs/protocol.md "gRPC")
    "groupRetryPolicy": dict,  # RocketMQ 5's: how gRPC consumers back off between retries (edge.retry_policy_problem)
}


class AdminRefused(Exception):
    def __init__(self, status: str, remark: str):
        super().__init__(remark)
        self.status, self.remark = status, remark


def update_topic(topics, header: dict) -> dict:
    """UPDATE_AND_CREATE_TOPIC (17): the topic created or its queue counts and perm changed;
    fields left out keep their value (a new topic: the node's defaultTopicQueueNums, perm 6)."""
    name = header["topic"]
    problem = topic_error(name)
    if problem:
        raise AdminRefused("MESSAGE_ILLEGAL", problem)
    old = topics.get(name) or TopicConfig(name, topics.default_queues, topics.default_queues)
    config = TopicConfig(name, header.get("readQueueNums", old.readQueueNums),
                         header.get("writeQueueNums", old.writeQueueNums), header.get("perm", old.perm),
                         old.topicFilterType, old.topicSysFlag, header.get("order", old.order))
    topics.topics[name] = config
    topics.persist()
    return config.to_json()


def delete_topic(topics, offsets, header: dict) -> None:
    """DELETE_TOPIC_IN_BROKER (215): the topic's config, every group's offsets for it, and its
    messages: none stored under it so far is served again, to a topic created under the name
    later either (TopicTable.delete: its deletion floor). Its ConsumeQueue files go once every
    entry is below the floor (the dispatcher, or recovery: shm.store.MessageStore.drop_queues_of),
    their next queue offsets kept: a topic created again goes on from them rather than
    numbering from 0 (RocketMQ's), so no queue offset names two messages."""
    name = header["topic"]
    if topics.get(name) is None:
        raise AdminRefused("TOPIC_NOT_EXIST", f"topic {name} does not exist")
    if topic_error(name):
        raise AdminRefused("MESSAGE_ILLEGAL", f"the topic {name} is a system topic")
    topics.delete(name)
    offsets.forget(topic=name)


def update_group(groups, header: dict) -> dict:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): the group created (RocketMQ's defaults) or the
    fields given changed."""
    name = header["groupName"]
    changes = {field: header[field] for field in GROUP_FIELDS if field in header}
    return groups.update(name, changes)


def delete_group(groups, offsets, header: dict) -> None:
    """DELETE_SUBSCRIPTIONGROUP (207): the group's config and its committed offsets."""
    name = header["groupName"]
    if not groups.delete(name):
        raise AdminRefused("SUBSCRIPTION_GROUP_NOT_EXIST", f"subscription group {name} does not exist")
    offsets.forget(group=name)


def consume_refusal(groups, group: str | None) -> str | None:
    """NO_PERMISSION's remark for a pull naming a group whose consumeEnable is false."""
    config = groups.groups.get(group) if group else None
    if config is not None and config.get("consumeEnable") is False:
        return f"subscription group [{group}] does not have permission to consume (consumeEnable is false)"
    return None

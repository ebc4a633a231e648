"""The parts of a cluster partition every role of a node reaches (docs/design.md §14): its
replication state (`PartitionReplica`), its log, log writer and channel cursors, and the
errors of the cluster side."""

import sqlite3
import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.common.replication import (
    ReplicaRefusal,
    error_header,
)
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.log_writer import LogWriter, WriteRefused
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.message_queue import LogTopicQueue
from nsqpy.nsqd.partition_replica import PartitionReplica
from nsqpy.partition_log import PartitionLog

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic


class MasterRefusal(ValueError):
    """The master nsqlookupd answered a request with an error: it did not do it."""


class NotLedHere(Exception):
    """A client's command names a topic this cluster node does not hold and may not create:
    its publishers and consumers look it up again (`E_FAILED_ON_NOT_LEADER`)."""


class ClusterMetadataError(ValueError):
    """Metadata from etcd that this node cannot apply to a partition (it logs it and serves the
    others)."""


def replica_of(topic: "Topic") -> PartitionReplica | None:
    """The partition's cluster replication; None when it is not a cluster's."""
    replication = topic.replication
    return replication if isinstance(replication, PartitionReplica) else None


def held_replica(topic: "Topic") -> PartitionReplica:
    """The replication of a partition the cluster has given this node."""
    replication = topic.replication
    if not isinstance(replication, PartitionReplica):
        raise ClusterMetadataError(
            f"{topic.name}/{topic.partition} is not a cluster partition here"
        )
    return replication


def untold_finished(finished: list[bytes], told: Sequence[Iterable[str]]) -> list[bytes]:
    """The finished delayed messages of a channel (`CursorQueue.finished_delayed`) that not
    every follower was told of, given the IDs each follower's cursor push named."""
    if not told:
        return finished
    everywhere = set(told[0]).intersection(*told[1:])
    return [message_id for message_id in finished if message_id.decode() not in everywhere]


def hold(node: "ClusterNode", topic: "Topic", info: ReplicaInfo) -> PartitionReplica:
    """Make `info` what this node knows of the partition's replicas."""
    replica = replica_of(topic)
    if replica is None:
        replica = PartitionReplica(node, topic, info)
        topic.replication = replica
        for channel in topic.channels.values():
            # Its delayed messages finished from now on are kept for the followers, as a
            # channel made on a cluster's partition keeps them (`Channel.__init__`).
            if channel.cursor is not None and channel.cursor.finished_delayed is None:
                channel.cursor.finished_delayed = []
    else:
        replica.info = info
    return replica


def log_queue(topic: "Topic") -> LogTopicQueue:
    """A cluster partition is a log topic (docs/design.md §14): replication is of its log."""
    queue = topic.queue
    if not isinstance(queue, LogTopicQueue):
        raise ClusterMetadataError(
            f"{topic.name}/{topic.partition} is not stored as a log here: it cannot be replicated"
        )
    return queue


def delayed_snapshot(topic: "Topic") -> tuple[dict | None, bytes]:
    """The delayed messages of the partition's delay queue whose records are before the
    log's end: per channel how many (the header) and their IDs (8 bytes each, the payload);
    None when the index cannot be read (the follower then keeps what it copied)."""
    before = log_of(topic).written.offset
    queue = log_queue(topic).delay_queue
    if queue.closed:
        return None, b""
    try:
        held = queue.entries_before(before)
    except sqlite3.Error:
        return None, b""
    counts = [[channel, len(ids)] for channel, ids in held.items()]
    ids = [message_id for channel_ids in held.values() for message_id in channel_ids]
    return {"before": before, "channels": counts}, struct.pack(f">{len(ids)}q", *ids)


def cursor_of(channel: "Channel") -> CursorQueue:
    """A log topic's channel is a cursor into the partition's log."""
    queue = channel.queue
    if not isinstance(queue, CursorQueue):
        raise ClusterMetadataError(f"channel {channel.name} is not a cursor into a log")
    return queue


def log_of(topic: "Topic") -> PartitionLog[Message]:
    return log_queue(topic).log


def writer_of(topic: "Topic") -> LogWriter:
    return log_queue(topic).writer


def refused(reached: set[str], code: str, text: str) -> "ClusterWriteError":
    """A write that cannot be acknowledged. A follower has it, or may (`reached`): refused,
    it may still be stored (by one that leads next), and its publishers are told so. One
    that could not be reached, refused it, or closed the link (it died) has nothing it could
    lead with: a follower that comes back catches up from the leader, which cuts what it
    does not hold."""
    error = ClusterWriteError(code, text)
    error.maybe_stored = bool(reached)
    return error


class ClusterWriteError(WriteRefused):
    """A replicated write that could not be made: `code` is Youzan's error for the publisher."""


def refuse_unless_leading(topic: "Topic") -> None:
    """Only the partition's leader answers this (a node the info names that lost the data
    leads nothing)."""
    if not held_replica(topic).is_leader:
        raise ReplicaRefusal(error_header("E_FAILED_ON_NOT_LEADER", "not the leader"))


def is_stale_leader(error: Exception) -> bool:
    return isinstance(error, ReplicaRefusal) and error.code == "E_FAILED_ON_NOT_LEADER"

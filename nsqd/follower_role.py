"""A cluster node's partitions where it follows (docs/design.md §14): the groups its leader
sends, fenced by the write epoch and the leader's ID and taken only at its end, the channel
and cursor pushes, the delay queue's copy and the end a leader names (a longer log is cut
back to it)."""

import sqlite3
import struct
from typing import TYPE_CHECKING

from nsqpy.common.replication import (
    ReplicaRefusal,
    error_header,
)
from nsqpy.nsqd.cluster_partition import (
    cursor_of,
    held_replica,
    log_of,
    log_queue,
    writer_of,
)
from nsqpy.nsqd.delay_queue import DelayedRecord
from nsqpy.partition_log import Position

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic


class FollowerRole:
    """What `node` does as a follower of a partition."""

    def __init__(self, node: "ClusterNode") -> None:
        self.node = node

    async def on_put(self, topic: "Topic", header: dict, payload: bytes) -> dict:
        info = held_replica(topic).info
        leader, epoch = header.get("leader"), int(header.get("epoch", -1))
        if epoch > info.epoch_for_write and self.node.session is not None:
            # The leader knows a newer epoch than this node has seen: read it first.
            await self.node.session.reload(topic.name, topic.partition)
            info = held_replica(topic).info
        if epoch > info.epoch_for_write:
            # This node is behind (it started a moment ago, or etcd is out of its reach): it
            # takes nothing it cannot confirm, and the leader, not deposed by it, retries.
            raise ReplicaRefusal(
                error_header(
                    "E_CATCHING_UP",
                    f"epoch {epoch} is past what this node knows ({info.epoch_for_write})",
                )
            )
        if leader != info.leader:
            # Fencing: a deposed leader writes nothing.
            raise ReplicaRefusal(
                error_header(
                    "E_FAILED_ON_NOT_LEADER",
                    f"leader {leader} epoch {epoch}, expected {info.leader} epoch"
                    f" {info.epoch_for_write}",
                )
            )
        if epoch < info.epoch_for_write:
            # The right leader, not yet aware of the partition's newest epoch (an ISR join).
            raise ReplicaRefusal(
                error_header("E_STALE_EPOCH", f"epoch {epoch} < {info.epoch_for_write}")
            )
        replica = held_replica(topic)
        # A joining follower takes the groups of the leader admitting it, and only then.
        admitted = bool(header.get("admit")) and self.node.catch_ups.joining(topic, str(leader))
        if self.node.catch_ups.running(topic) and not admitted:
            raise ReplicaRefusal(error_header("E_CATCHING_UP", "catching up with the leader"))
        if replica.lost:
            raise ReplicaRefusal(
                error_header("E_CATCHING_UP", "this node's copy is a new incarnation's")
            )
        entry = tuple(int(value) for value in header["entry"])
        if len(entry) != 7:
            raise ValueError(f"an index entry has 7 fields, not {len(entry)}")
        log = log_of(topic)
        if "channels" in header:
            self.take_channels(topic, header["channels"], move=False)
        try:
            log.append_raw(entry, payload)
        except ValueError as error:
            end = Position(entry[3] + entry[4], entry[5] - 1 + entry[6])
            if end.offset <= log.written.offset and log.entry_ending_at(end) == entry:
                return {"end": list(log.written), "duplicate": True}
            if not admitted:
                self.node.catch_ups.start(topic)
            raise ReplicaRefusal(
                error_header("E_LOG_MISMATCH", str(error), end=list(log.written))
            ) from None
        except OSError as error:
            self.node.disk_failed(topic, error)
            raise ReplicaRefusal(error_header("E_WRITE_FAILED", str(error))) from None
        self.node.disk_recovered(topic)
        topic.replicated(entry[6], len(payload))
        if "delays" in header:
            log_queue(topic).index_delayed(
                [
                    DelayedRecord(str(channel), str(message_id).encode(), int(offset),
                                  int(count), int(due))
                    for channel, message_id, offset, count, due in header["delays"]
                ]
            )  # fmt: skip
        self.sync_soon(topic)
        return {"end": list(log.written)}

    def take_delayed_snapshot(self, topic: "Topic", delayed: dict, payload: bytes) -> None:
        """Admitted into the ISR: drop the delay queue's entries before the leader's end at
        admission that the leader no longer holds (finished or emptied while this node was
        not in the ISR; a catch-up indexes every delayed record it copies)."""
        held: dict[str, set[int]] = {}
        at = 0
        try:
            before = int(delayed["before"])
            for channel, count in delayed["channels"]:
                count = int(count)
                if count < 0 or at + 8 * count > len(payload):
                    raise ValueError(f"{len(payload)} bytes of delayed message IDs, too few")
                held[str(channel)] = set(struct.unpack_from(f">{count}q", payload, at))
                at += 8 * count
        except (KeyError, TypeError) as error:
            raise ValueError(f"the leader's delayed messages: {error!r}") from None
        if at != len(payload):
            raise ValueError(f"{len(payload)} bytes of delayed message IDs, expected {at}")
        try:
            dropped = log_queue(topic).delay_queue.keep_only(held, before)
        except sqlite3.Error as error:
            # Left as they are: the next catch-up (a new incarnation's, or after a failover)
            # reconciles again; nothing of this node stops over it.
            self.node.nsqd.log.error(
                "TOPIC(%s) partition %d: the delayed messages the leader finished could not be"
                " dropped - %s",
                topic.name,
                topic.partition,
                error,
            )
            return
        if dropped:
            self.node.nsqd.log.info(
                "TOPIC(%s) partition %d: %d delayed messages the leader finished dropped",
                topic.name,
                topic.partition,
                dropped,
            )
            self.sync_soon(topic)

    def sync_soon(self, topic: "Topic") -> None:
        if self.node.nursery is not None:
            writer_of(topic).sync_soon(self.node.nursery)

    def on_cursors(self, topic: "Topic", header: dict) -> dict:
        info = held_replica(topic).info
        if header.get("leader") != info.leader:
            raise ReplicaRefusal(error_header("E_FAILED_ON_NOT_LEADER", "not my leader"))
        self.take_channels(topic, header.get("channels", {}), move=True)
        acknowledged = header.get("acked") or {}
        for name, each in topic.channels.items():
            if not each.ephemeral:
                cursor_of(each).take_acknowledged_ranges(acknowledged.get(name, ()))
        for name, below in (header.get("delayed_emptied") or {}).items():
            held_channel = topic.channels.get(name)
            if held_channel is not None:
                cursor_of(held_channel).take_emptied_delayed(int(below))
        for name, message_ids in (header.get("delayed_done") or {}).items():
            held_channel = topic.channels.get(name)
            if held_channel is not None:
                cursor_of(held_channel).take_finished_delayed(
                    [str(message_id).encode() for message_id in message_ids]
                )
        for name, dues in (header.get("deferred") or {}).items():
            channel = topic.channels.get(name)
            if channel is not None:
                queue = cursor_of(channel)
                floor = queue.confirmed.offset
                # What the channel confirmed past no longer waits; the rest is the leader's.
                kept = {offset: due for offset, due in queue.delays.items() if offset >= floor}
                kept.update((int(offset), float(due)) for offset, due in dues.items())
                queue.delays = kept
        if "end" in header:
            self._check_end(topic, Position(*header["end"]), tuple(header.get("last") or ()))
        return {
            "end": list(log_of(topic).written),
            "catching_up": self.node.catch_ups.running(topic),
        }

    def _check_end(self, topic: "Topic", end: Position, last: tuple) -> None:
        """The leader, idle, ends at `end` with index entry `last`: cut what lies past it
        (a group the leader rolled back), or catch up when behind or apart."""
        if self.node.catch_ups.running(topic):
            return
        log = log_of(topic)
        if log.written == end:
            return
        if log.written.offset > end.offset and last and log.entry_ending_at(end) == last:
            self.node.nsqd.log.warning(
                "TOPIC(%s) partition %d: cutting back groups the leader does not have",
                topic.name,
                topic.partition,
            )
            log.truncate_to(end)
            return
        self.node.catch_ups.start(topic)

    def take_channels(self, topic: "Topic", channels: dict, *, move: bool) -> None:
        """A follower takes its leader's channels: missing ones are created where the
        leader's are; with `move`, existing ones move to the leader's confirmed position."""
        log = log_of(topic)
        for name in [name for name, channel in topic.channels.items() if not channel.ephemeral]:
            if name not in channels:
                # Deleted on the leader (`channels` is its whole set).
                topic.delete_channel(name)
        for name, (offset, count, *controls) in channels.items():
            exists = name in topic.channels
            if exists and not move:
                topic.channels[name].take_controls(*controls)
                continue
            channel = topic.get_channel(name)
            channel.take_controls(*controls)
            position = Position(int(offset), int(count))
            if position.offset > log.written.offset:
                position = log.written
            if position.offset < log.start.offset:
                position = log.start
            if cursor_of(channel).confirmed != position:
                cursor_of(channel).set_position(position)

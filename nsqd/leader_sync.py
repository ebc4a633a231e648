"""What a cluster leader tells its followers besides the writes (docs/design.md §14): its answers
to their MATCH, START and PULL (a catch-up's), a group's copy for `/topic/fixdata`, and the
pushes of its channels, their cursors and its log's end: every `--sync-timeout`, and at once
(coalesced) when a FIN moves a cursor."""

from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.common.replication import (
    CURSORS,
    PULL,
    ReplicaRefusal,
    error_header,
)
from nsqpy.nsqd.catch_up import PULL_MAX_BYTES, PULL_MAX_ENTRIES
from nsqpy.nsqd.cluster_partition import (
    cursor_of,
    held_replica,
    log_of,
    refuse_unless_leading,
    replica_of,
    untold_finished,
    writer_of,
)
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.peer_link import PeerUnavailable
from nsqpy.partition_log import Position
from nsqpy.partition_log.index import IndexEntry
from nsqpy.partition_log.segments import read_pieces
from nsqpy.partition_log.view import group_fault

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic


# Channel cursors moved by FINs reach the followers at most this long after the previous push
# (plus the push's round trip): what a failover redelivers beyond the messages in flight.
CURSOR_PUSH_INTERVAL = 0.005
# A follower that does not answer a push within this long misses it (the next one repeats it):
# one stalled follower must not hold back the pushes to the others for long.
CURSOR_PUSH_TIMEOUT = 1.0


class LeaderSync:
    """The leader's side of keeping `node`'s followers in step."""

    def __init__(self, node: "ClusterNode") -> None:
        self.node = node
        # Partitions whose channels' cursors moved: pushed to the followers at once, in the
        # order they moved (a dict: a set of topics would order them by their addresses).
        self._moved: dict[Topic, None] = {}
        self._moved_wakeup = trio.Event()

    def answer_match(self, topic: "Topic", header: dict) -> dict:
        # Only the leader's log is one a follower may cut its own back to: a node back on an
        # empty disk that the info still names (it leads nothing) would walk a follower's
        # log, which may hold the only copy of what was acknowledged, back to nothing.
        refuse_unless_leading(topic)
        log = log_of(topic)
        matched = False
        if header.get("entry"):
            entry = tuple(int(value) for value in header["entry"])
            if len(entry) != 7:
                raise ValueError(f"an index entry has 7 fields, not {len(entry)}")
            end = Position(entry[3] + entry[4], entry[5] - 1 + entry[6])
            matched = end.offset <= log.written.offset and log.entry_ending_at(end) == entry
        return {"match": matched, "start": list(log.start), "end": list(log.written)}

    def answer_start(self, topic: "Topic") -> tuple[dict, bytes]:
        """Where this log starts, for a follower that starts over there (`CatchUps`)."""
        refuse_unless_leading(topic)
        log = log_of(topic)
        snapshots = log.snapshot_files()
        boundary = log.entry_ending_at(log.start) if log.start.offset else None
        answer = {
            "start": list(log.start),
            "segment": log.first_segment_number,
            "boundary": list(boundary) if boundary is not None else None,
            "snapshots": [[offset, len(data)] for offset, data in sorted(snapshots.items())],
        }
        return answer, b"".join(data for _offset, data in sorted(snapshots.items()))

    def leader_header(self, topic: "Topic", info: ReplicaInfo) -> dict:
        """What every request of a leader to its followers says of the partition."""
        return {
            "topic": topic.name,
            "partition": topic.partition,
            "leader": self.node.node_id,
            "epoch": info.epoch_for_write,
        }

    def channel_positions(self, topic: "Topic") -> dict[str, list[int]]:
        """Each channel's confirmed position, `[offset, count]`, and its controls after them
        when it has any (`Channel.controls`: skipped, in order, rate and consumer limits)."""
        return {
            name: [*cursor_of(channel).confirmed, *channel.controls]
            for name, channel in topic.channels.items()
            if not channel.ephemeral
        }

    def _channel_ranges(self, topic: "Topic") -> dict[str, list[list[int]]]:
        """Each channel's ranges acknowledged beyond its confirmed position: a new leader
        does not deliver them again."""
        ranges = {}
        for name, channel in topic.channels.items():
            if not channel.ephemeral:
                acknowledged = cursor_of(channel).acknowledged_ranges()
                if acknowledged:
                    ranges[name] = acknowledged
        return ranges

    def _channel_deferrals(self, topic: "Topic") -> dict[str, dict[str, float]]:
        """Each channel's deferred messages (REQ with a delay, DPUBs not read yet) by offset,
        with their due times: a new leader holds them until then too."""
        deferrals = {}
        for name, channel in topic.channels.items():
            if not channel.ephemeral:
                dues = cursor_of(channel).deferred_dues()
                if dues:
                    deferrals[name] = {str(offset): due for offset, due in dues.items()}
        return deferrals

    async def push_channels(self, topic: "Topic") -> None:
        """The leader's channels and their confirmed positions, to its followers: every
        `--sync-timeout`, and before a channel's creation or move (setoffset) is answered (a
        consumer that moves to a new leader finds its channel where it was)."""
        info = topic.replication.info
        # Not a node the info names but that lost the data (back on an empty disk): its channel
        # set is empty, the followers would delete theirs, one of which leads next, and its
        # consumers would start again at the log's end, past what was not yet delivered.
        if info is None or not info.followers() or not held_replica(topic).is_leader:
            return
        version = topic.channels_version
        emptied: dict[CursorQueue, int] = {}
        for channel in topic.channels.values():
            cursor = cursor_of(channel)
            if cursor.finished_delayed is None:
                cursor.finished_delayed = []  # kept from now on, for the followers
            if cursor.emptied_delayed_below is not None:
                emptied[cursor] = cursor.emptied_delayed_below
        # The delayed messages finished that each follower's header named (it is made as the
        # request goes on the link, so it may name more than were finished now): forgotten
        # here once every follower has them. Another push may run meanwhile and finish first.
        told: list[dict[str, list[str]]] = []

        def header() -> dict:
            made = self.cursors_header(topic, info)
            told.append(made.get("delayed_done", {}))
            return made

        failed = False

        async def push(follower: str) -> None:
            nonlocal failed
            try:
                await self.node.link(follower).request(CURSORS, header, timeout=CURSOR_PUSH_TIMEOUT)
            except (PeerUnavailable, ReplicaRefusal) as error:
                failed = True
                self.node.nsqd.log.warning(
                    "TOPIC(%s) partition %d: channels to %s - %s",
                    topic.name,
                    topic.partition,
                    follower,
                    error,
                )

        async with trio.open_nursery() as pushing:
            for follower in info.followers():
                pushing.start_soon(push, follower)
        if not failed:
            # A follower that missed them (not reached, or its copy of the partition not made
            # yet) takes the channels with the partition's next write (`replicated_channels`
            # stays behind), not only at the next `--sync-timeout`: a leader that dies first
            # would leave a new leader without them, and their consumers would start at the end.
            topic.replicated_channels = version
            for name, channel in topic.channels.items():
                cursor = cursor_of(channel)
                if cursor.finished_delayed:
                    cursor.finished_delayed = untold_finished(
                        cursor.finished_delayed, [named.get(name, ()) for named in told]
                    )
            for cursor, below in emptied.items():
                if cursor.emptied_delayed_below == below:
                    cursor.emptied_delayed_below = None

    def cursors_header(self, topic: "Topic", info: ReplicaInfo, *, end: bool = False) -> dict:
        """A CURSORS request's header, made as it goes on the link (after every group sent
        before it): the channels' positions and deferred messages, and, while no group is
        being written or replicated (or with `end`), the log's end and its last index entry:
        a follower that has more holds groups the leader cut back, and cuts them too. (Made
        any earlier, it could name an end that a group acknowledged since has passed.)"""
        header = {**self.leader_header(topic, info), "channels": self.channel_positions(topic)}
        deferred = self._channel_deferrals(topic)
        if deferred:
            header["deferred"] = deferred
        acknowledged = self._channel_ranges(topic)
        if acknowledged:
            header["acked"] = acknowledged
        finished = {
            name: [message_id.decode() for message_id in done]
            for name, channel in topic.channels.items()
            if not channel.ephemeral and (done := cursor_of(channel).finished_delayed)
        }
        if finished:
            # The delayed messages finished since the followers last heard: a new leader does
            # not give them out again.
            header["delayed_done"] = finished
        emptied = {
            name: below
            for name, channel in topic.channels.items()
            if not channel.ephemeral and (below := cursor_of(channel).emptied_delayed_below)
        }
        if emptied:
            header["delayed_emptied"] = emptied
        log = log_of(topic)
        if end or (writer_of(topic).idle and log.written.offset > log.start.offset):
            header["end"] = list(log.written)
            header["last"] = list(log.entry_ending_at(log.written) or ())
        return header

    async def copy_of_group(self, topic: "Topic", entry: IndexEntry) -> bytes | None:
        """Another replica's stored bytes of a group this node's copy of which is corrupt
        (`/topic/fixdata`): asked of the leader and the ISR's other members in turn, taken
        from the first whose index holds the same entry and whose bytes hold its records."""
        replica = replica_of(topic)
        info = replica.info if replica is not None else None
        if info is None:
            return None
        peers = [info.leader, *info.isr]
        for peer in dict.fromkeys(
            node for node in peers if node not in ("", "?", self.node.node_id)
        ):
            try:
                reply = await self.node.link(peer).request(
                    PULL,
                    {
                        "topic": topic.name,
                        "partition": topic.partition,
                        "offset": entry[3],
                        "max_entries": 1,
                        "max_bytes": entry[4],
                    },
                )
            except (PeerUnavailable, ReplicaRefusal, ValueError) as error:
                self.node.nsqd.log.warning(
                    "TOPIC(%s) partition %d: no copy of the group at offset %d from %s - %s",
                    topic.name,
                    topic.partition,
                    entry[3],
                    peer,
                    error,
                )
                continue
            entries = reply.header.get("entries") or []
            if entries and tuple(entries[0]) == tuple(entry):
                if group_fault(entry, reply.payload) is None:
                    return reply.payload
        return None

    async def answer_pull(self, topic: "Topic", header: dict) -> tuple[dict, bytes]:
        log = log_of(topic)
        offset = int(header["offset"])
        max_bytes = int(header.get("max_bytes", PULL_MAX_BYTES))
        if not log.start.offset <= offset <= log.written.offset:
            raise ReplicaRefusal(
                error_header(
                    "E_OFFSET_OUT_OF_RANGE",
                    f"offset {offset} is outside this log ({log.start.offset} to"
                    f" {log.written.offset})",
                    start=list(log.start),
                    end=list(log.written),
                )
            )
        try:
            entries = log.entries_from(offset, int(header.get("max_entries", PULL_MAX_ENTRIES)))
        except ValueError as error:
            raise ReplicaRefusal(
                error_header(
                    "E_OFFSET_OUT_OF_RANGE",
                    str(error),
                    start=list(log.start),
                    end=list(log.written),
                )
            ) from None
        total = 0
        for index, entry in enumerate(entries):
            total += entry[4]
            if total > max_bytes and index > 0:
                entries = entries[:index]
                break
        answer = {
            "entries": [list(entry) for entry in entries],
            "end": list(log.written),
            "channels": self.channel_positions(topic),
        }
        # Read in a worker thread: megabytes for a catching-up follower must not hold up
        # this leader's publishes (`python -m bench.catch_up`).
        pieces = log.group_reads(entries)
        return answer, await network.current().run_sync(read_pieces, pieces)

    async def cursor_timer(self) -> None:
        while True:
            await trio.sleep(self.node.nsqd.options.sync_timeout)
            await self.send_cursors()

    def cursor_moved(self, topic: "Topic") -> None:
        """A channel's cursor moved (a FIN), or a channel deferred a message (REQ with a
        delay): the followers learn it at once, not at the next `--sync-timeout`, so a new
        leader repeats little more than the messages in flight, and holds deferred ones until
        due. Pushes are coalesced: the moves of one round trip go in one push."""
        self._moved[topic] = None
        self._moved_wakeup.set()

    async def push_moved_cursors(self) -> None:
        while True:
            await self._moved_wakeup.wait()
            self._moved_wakeup = trio.Event()
            moved, self._moved = self._moved, {}
            for topic in moved:
                if not topic.deleted:
                    await self.push_channels(topic)
            # The FINs of the next few milliseconds share one push: a consumer finishing
            # tens of thousands of messages a second costs a push per interval, not per FIN.
            await trio.sleep(CURSOR_PUSH_INTERVAL)

    async def send_cursors(self) -> None:
        """Each led partition's channels' confirmed positions, to its followers."""
        for topic in self.node.nsqd.all_partitions():
            await self.push_channels(topic)

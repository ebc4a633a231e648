"""A cluster follower catching up with its partition's leader (docs/design.md §14).

A follower catches up when its leader changed, when a group its leader sent does not follow its
end, when it is on the partition's catch-up list (a new, moved or returning replica), and when
it is in the ISR in an incarnation that does not hold the partition's data (a replaced disk).

1. **Match**: it walks its index back (`MATCH`, one entry a round trip) until an entry equals
   the leader's, and cuts its log there: what lies past it is an old leader's unacknowledged
   tail.
2. **Start over**: where nothing matches, or what it would continue from is before the
   leader's start (retention removed it there), it drops its log and starts it again at the
   leader's start (`START`), with the leader's segment numbering, the index entry ending there
   and the producer snapshots, so the copy is byte-identical from there.
3. **Copy** (`PULL`): entries and records from its end until it has the leader's.
4. **Join**: a node on the catch-up list asks its leader to enter the ISR (`JOIN`). The leader
   holds its writes, gives it what it wrote since, has the master add it, and answers with the
   info that holds it: it is in the ISR only at the leader's end, and every group acknowledged
   after counts it (Youzan's join session; Kafka's ISR expansion through the leader).

Progress (the leader's end as last seen, what was copied, the last error) is in
`/cluster/partitions` and, through the master, `/cluster/stats`.
"""

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.common.replication import JOIN, MATCH, PULL, START, ReplicaRefusal
from nsqpy.nsqd.peer_link import PeerUnavailable
from nsqpy.partition_log import LogCorruption, Position
from nsqpy.partition_log.index import entry_end

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic

logger = logging.getLogger("nsqd")

# What one catch-up pull asks for.
PULL_MAX_ENTRIES = 1000
PULL_MAX_BYTES = 8 * 1024 * 1024
# How long a joining follower waits for its leader's answer: the leader's own bound on an
# admission (`ClusterNode.ADMISSION_TIMEOUT`) and then some.
JOIN_TIMEOUT = 30.0
# A failing catch-up tries again after this (doubling up to the maximum).
RETRY_DELAY = 0.05
RETRY_MAX_DELAY = 1.0
# The same failure is logged again at most this often.
REPEATED_ERROR_INTERVAL = 30.0


@dataclass
class Progress:
    """One partition's catch-up, as `/cluster/partitions` reports it."""

    leader: str
    started: float
    leader_end: Position | None = None
    copied_bytes: int = 0
    copied_messages: int = 0
    started_over: int = 0
    phase: str = "matching"
    error: str = ""
    error_logged_at: float = -REPEATED_ERROR_INTERVAL

    def report(self, written: Position, now: float) -> dict:
        behind = None
        if self.leader_end is not None:
            behind = {
                "messages": max(self.leader_end.count - written.count, 0),
                "bytes": max(self.leader_end.offset - written.offset, 0),
            }
        return {
            "leader": self.leader,
            "phase": self.phase,
            "seconds": round(now - self.started, 3),
            "leader_end": list(self.leader_end) if self.leader_end is not None else None,
            "behind": behind,
            "copied_bytes": self.copied_bytes,
            "copied_messages": self.copied_messages,
            "started_over": self.started_over,
            "error": self.error,
        }


class CatchUps:
    """The partitions this node is catching up, one task each in the cluster's nursery."""

    def __init__(self, node: "ClusterNode") -> None:
        self.node = node
        self._running: dict[tuple[str, int], Progress] = {}
        # Partitions whose catch-up waits for its leader's answer to `JOIN`: the leader's
        # `PUT`s with `admit` are taken meanwhile, from that leader only.
        self._joining: dict[tuple[str, int], str] = {}

    def running(self, topic: "Topic") -> bool:
        return (topic.name, topic.partition) in self._running

    def joining(self, topic: "Topic", leader: str) -> bool:
        return self._joining.get((topic.name, topic.partition)) == leader

    def progress(self, topic: "Topic") -> dict | None:
        progress = self._running.get((topic.name, topic.partition))
        if progress is None:
            return None
        return progress.report(self.node.log_of(topic).written, trio.current_time())

    def forget(self, topic: "Topic") -> None:
        self._running.pop((topic.name, topic.partition), None)
        self._joining.pop((topic.name, topic.partition), None)

    def start(self, topic: "Topic") -> None:
        key = (topic.name, topic.partition)
        nursery = self.node.nursery
        info = topic.replication.info
        if key in self._running or nursery is None or info is None:
            return
        progress = Progress(info.leader, trio.current_time())
        self._running[key] = progress
        nursery.start_soon(self.node.contained, self._catch_up, topic, progress)

    async def _catch_up(self, topic: "Topic", progress: Progress) -> None:
        """Catch up until this node is a proven member of the ISR (joining it when it is on
        the catch-up list), or holds the partition no more.

        The partition may have been forgotten (moved off this node) before this task began:
        its `progress` is then no longer the running one, and it ends at once."""
        key = (topic.name, topic.partition)
        try:
            await self._until_caught_up(topic, progress)
        finally:
            if self._running.get(key) is progress:
                del self._running[key]
                self._joining.pop(key, None)

    async def _until_caught_up(self, topic: "Topic", progress: Progress) -> None:
        node = self.node
        key = (topic.name, topic.partition)
        delay = RETRY_DELAY
        # Until forgotten (the partition left this node): a catch-up started for it
        # afterwards (it came back) has a progress of its own.
        while not topic.deleted and self._running.get(key) is progress:
            info = topic.replication.info
            if info is None or info.leader in ("", "?", node.node_id):
                return
            progress.leader = info.leader
            try:
                await self._once(topic, info, progress)
            except (
                PeerUnavailable,
                ReplicaRefusal,
                ValueError,
                OSError,
                LogCorruption,
            ) as error:
                if topic.deleted:
                    return  # the partition left this node while an answer was awaited
                if isinstance(error, OSError):
                    node.disk_failed(topic, error)  # `/ping` says so until it writes again
                self._failed(topic, info, progress, error)
                await trio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, RETRY_MAX_DELAY)
                continue
            progress.error = ""
            node.disk_recovered(topic)
            if topic.replication.info is not info:
                continue  # the info changed meanwhile: catch up with what it says now
            if node.node_id in info.isr:
                if info.proven(node.node_id, node.incarnation):
                    return
                # In the ISR in an incarnation that lost the data: the master moves this
                # node to the catch-up list (it saw the incarnation change).
                progress.phase = "waiting to leave the ISR"
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
                continue
            if node.node_id not in info.catchup or node.session is None:
                return
            progress.phase = "joining"
            try:
                if await self._join(topic, info):
                    return
            except (PeerUnavailable, ReplicaRefusal, ValueError) as error:
                self._failed(topic, info, progress, error)
            await trio.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, RETRY_MAX_DELAY)

    def _failed(
        self, topic: "Topic", info: ReplicaInfo, progress: Progress, error: Exception
    ) -> None:
        text = str(error) or type(error).__name__
        now = trio.current_time()
        if text != progress.error or now - progress.error_logged_at >= REPEATED_ERROR_INTERVAL:
            progress.error_logged_at = now
            self.node.nsqd.log.warning(
                "TOPIC(%s) partition %d: catching up from %s - %s",
                topic.name,
                topic.partition,
                info.leader,
                text,
            )
        progress.error = text

    async def _once(self, topic: "Topic", info: ReplicaInfo, progress: Progress) -> None:
        """Match, start over if need be, and copy until this log ends where the leader's
        does."""
        link = self.node.link(info.leader)
        log = self.node.log_of(topic)
        base = {"topic": topic.name, "partition": topic.partition}
        progress.phase = "matching"
        matched = False
        while True:
            last = log.entry_ending_at(log.written) if log.written.offset else None
            reply = await link.request(MATCH, {**base, "entry": list(last) if last else None})
            leader_start = Position(*reply.header["start"])
            progress.leader_end = Position(*reply.header["end"])
            if last is None:
                # An empty log from the very beginning shares the leader's beginning.
                matched = log.written.offset == 0
                break
            if reply.header["match"]:
                matched = True
                break
            if log.written.offset <= max(leader_start.offset, log.start.offset):
                break  # nothing left here that the leader could say it has
            try:
                log.truncate_to(Position(last[3], last[5] - 1))
            except ValueError:
                break  # before the active index file: cheaper to start over than to walk
        if not matched or log.written.offset < leader_start.offset:
            await self._start_over(topic, link, base, progress)
        progress.phase = "copying"
        while True:
            try:
                reply = await link.request(
                    PULL, {**base, "offset": log.written.offset, "max_bytes": PULL_MAX_BYTES}
                )
            except ReplicaRefusal as refusal:
                if refusal.code == "E_OFFSET_OUT_OF_RANGE":
                    # Retention ran on the leader meanwhile: the next round starts over.
                    raise ValueError(f"{refusal}; starting over") from None
                raise
            progress.leader_end = Position(*reply.header["end"])
            entries = [tuple(entry) for entry in reply.header["entries"]]
            if not entries:
                self.node.follower.take_channels(topic, reply.header.get("channels", {}), move=True)
                return
            # The leader's channels first: a DPUB copied next goes into each one's delay queue.
            self.node.follower.take_channels(topic, reply.header.get("channels", {}), move=False)
            data = reply.payload
            at = 0
            for entry in entries:
                log.append_raw(entry, data[at : at + entry[4]])
                at += entry[4]
                topic.replicated(entry[6], entry[4])
                progress.copied_messages += entry[6]
                progress.copied_bytes += entry[4]
            self.node.index_copied(topic, data, Position(entries[0][3], entries[0][5] - 1))
            self.node.follower.sync_soon(topic)

    async def _start_over(self, topic: "Topic", link, base: dict, progress: Progress) -> None:
        progress.phase = "starting over"
        reply = await link.request(START, base)
        header = reply.header
        start = Position(*header["start"])
        boundary = tuple(header["boundary"]) if header.get("boundary") else None
        if boundary is not None and entry_end(boundary) != tuple(start):
            raise ValueError(f"the leader's boundary entry {boundary} does not end at {start}")
        snapshots = {}
        at = 0
        for offset, size in header.get("snapshots", []):
            snapshots[int(offset)] = reply.payload[at : at + int(size)]
            at += int(size)
        log = self.node.log_of(topic)
        self.node.nsqd.log.warning(
            "TOPIC(%s) partition %d: this replica holds nothing the leader's log (from offset"
            " %d) continues: starting it over there",
            topic.name,
            topic.partition,
            start.offset,
        )
        log.reset_to(start, int(header["segment"]), boundary, snapshots)
        self.node.log_started_over(topic)
        progress.started_over += 1

    async def _join(self, topic: "Topic", info: ReplicaInfo) -> bool:
        """Ask the leader to admit this node into the ISR; whether the info it answers with
        (applied here at once) holds it."""
        node = self.node
        session = node.session
        if session is None or node.leaving:
            return False
        log = node.log_of(topic)
        last = log.entry_ending_at(log.written) if log.written.offset else None
        key = (topic.name, topic.partition)
        self._joining[key] = info.leader
        try:
            reply = await node.link(info.leader).request(
                JOIN,
                {
                    "topic": topic.name,
                    "partition": topic.partition,
                    "node": node.node_id,
                    "incarnation": node.incarnation,
                    "end": list(log.written),
                    "last": list(last) if last else None,
                },
                timeout=JOIN_TIMEOUT,
            )
        finally:
            self._joining.pop(key, None)
        if topic.deleted:
            return False  # the partition left this node while the leader answered
        session.take_info(topic.name, topic.partition, reply.header["info"], reply.header["epoch"])
        joined = topic.replication.info
        if joined is None or node.node_id not in joined.isr:
            return False
        if "delayed" in reply.header and not topic.deleted:
            node.follower.take_delayed_snapshot(topic, reply.header["delayed"], reply.payload)
        return True

"""A cluster node's partitions where it leads (docs/design.md §14): each write replicated to the
ISR before it is acknowledged, what a failed round does (the master asked to drop a follower,
writes stopped and restored), a planned hand-over, a follower admitted into the ISR, and a
leader whose disk refuses writes resigning."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.common.replication import (
    CURSORS,
    PUT,
    ReplicaRefusal,
    error_header,
)
from nsqpy.nsqd.catch_up import PULL_MAX_ENTRIES
from nsqpy.nsqd.cluster_partition import (
    ClusterWriteError,
    MasterRefusal,
    delayed_snapshot,
    held_replica,
    is_stale_leader,
    log_of,
    refuse_unless_leading,
    refused,
    writer_of,
)
from nsqpy.nsqd.delay_queue import DelayedRecord
from nsqpy.nsqd.leader_sync import CURSOR_PUSH_TIMEOUT
from nsqpy.nsqd.peer_link import PeerUnavailable
from nsqpy.partition_log import Position
from nsqpy.partition_log.index import entry_end

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic


# A follower that cannot take a group is tried again for this long (backoff 2<<n ms, at most
# 200 ms apart, as Youzan) before the master is asked to drop it from the ISR.
REPLICATION_RETRY_SECONDS = 2.0
# A leader that cannot replicate probes its followers this often (doubling up to the maximum)
# until they answer, and tells the master after `UNWRITABLE_REPORT_AFTER`.
HEAL_PROBE_DELAY = 0.1
HEAL_PROBE_MAX_DELAY = 1.0
UNWRITABLE_REPORT_AFTER = 2.0
# How long a leader waits for the master to name the follower it handed a partition to.
HANDOVER_TIMEOUT = 3.0
# A leader whose disk refuses writes asks to hand its partition over again after this.
RESIGN_RETRY_INTERVAL = 2.0
# How long a leader may hold its writes to admit a follower into the ISR.
ADMISSION_TIMEOUT = 10.0


class LeaderRole:
    """What `node` does as the leader of a partition: `replicate` is each write's
    last step (`LogWriter.replicate`)."""

    def __init__(self, node: "ClusterNode") -> None:
        self.node = node

    async def replicate(
        self,
        topic: "Topic",
        writes: list[tuple[tuple, bytes]],
        delays: Sequence[DelayedRecord] = (),
    ) -> None:
        """Every ISR follower has `writes` (index entry, bytes) when this returns, and the
        delayed records among them (`delays`) in its delay queue; ClusterWriteError
        when that cannot be, after the master was asked to drop the followers that fail.

        The ISR is read again after each round: a node that joined it while the round was
        under way (with the next write epoch) gets the writes too before they are
        acknowledged, and so does one that the ISR holds once the master dropped the failed
        ones. So every member of the ISR at acknowledgement time has them: a new leader,
        elected from it, has every acknowledged message."""
        have: set[str] = set()
        # Followers that have the writes (they acknowledged them), or may: a request went out
        # and the follower fell silent (frozen, cut off), so it may still write them.
        reached: set[str] = set()
        replica = held_replica(topic)
        while True:
            info = replica.info
            if not replica.is_leader:
                raise refused(reached, "E_FAILED_ON_NOT_LEADER", "no longer the leader")
            if len(info.isr) <= info.replica // 2:
                # The master dropped members meanwhile (or they left): no majority.
                raise refused(
                    reached,
                    "E_FAILED_ON_NOT_WRITABLE",
                    f"the ISR ({len(info.isr)} of {info.replica}) is no majority",
                )
            missing = [follower for follower in replica.followers() if follower not in have]
            if not missing:
                return
            failed: dict[str, Exception] = {}
            version = topic.channels_version
            changed = version != topic.replicated_channels
            channels = self.node.sync.channel_positions(topic) if changed else None
            async with trio.open_nursery() as sending:
                for follower in missing:
                    sending.start_soon(
                        self._replicate_to,
                        follower,
                        topic,
                        info,
                        writes,
                        failed,
                        reached,
                        channels,
                        delays,
                    )
            have.update(follower for follower in missing if follower not in failed)
            if not failed:
                if channels is not None:
                    topic.replicated_channels = version
                continue
            try:
                await self._drop_failed(topic, info, failed)
            except ClusterWriteError as error:
                error.maybe_stored = bool(reached)
                raise

    async def _drop_failed(
        self, topic: "Topic", info: ReplicaInfo, failed: dict[str, Exception]
    ) -> None:
        """After followers failed a round: step down when one says this node is no longer
        the leader; stop writes when those left are no majority (or no master can be
        asked); else ask the master to drop the failed ones (the writes go on to whoever the
        ISR then holds). ClusterWriteError unless the master dropped them."""
        stale = [error for error in failed.values() if is_stale_leader(error)]
        if stale:
            self.node.nsqd.log.error(
                "TOPIC(%s) partition %d: a follower refused this leader - %s",
                topic.name,
                topic.partition,
                stale[0],
            )
            self.node.step_down(topic, info)
            if self.node.session is not None:
                self.node.session.refresh(topic.name, topic.partition)
            raise ClusterWriteError("E_FAILED_ON_NOT_LEADER", str(stale[0]))
        remaining = [node for node in info.isr if node not in failed]
        reasons = "; ".join(f"{node}: {error}" for node, error in failed.items())
        if len(remaining) <= info.replica // 2 or self.node.session is None:
            self._stop_writes(topic, info, reasons)
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", f"replication failed: {reasons}")
        self.node.nsqd.log.warning(
            "TOPIC(%s) partition %d: asking the master to drop %s from the ISR - %s",
            topic.name,
            topic.partition,
            ",".join(failed),
            reasons,
        )
        updated = await self.node.session.leave_isr(topic.name, topic.partition, list(failed), info)
        if updated is None:
            self._stop_writes(topic, info, reasons)
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", f"replication failed: {reasons}")

    # -- leader: healing -------------------------------------------------------------------

    def _stop_writes(self, topic: "Topic", info: ReplicaInfo, reasons: str) -> None:
        """Replication failed with no majority left (or no master to ask): the partition
        takes no publish until its followers answer again (`_restore_writes`), which may be
        long after the network healed, so this node does not wait to be told."""
        if not held_replica(topic).writable:
            return
        held_replica(topic).writable = False
        self.node.nsqd.log.error(
            "TOPIC(%s) partition %d: not writable, replication failed - %s",
            topic.name,
            topic.partition,
            reasons,
        )
        if self.node.nursery is not None:
            self.node.nursery.start_soon(self.node.contained, self._restore_writes, topic, info)

    async def _restore_writes(self, topic: "Topic", info: ReplicaInfo) -> None:
        """Probe the ISR followers until every one is at this leader's end again, then take
        writes again. Meanwhile: a majority that answers drops the rest from the ISR (through
        the master), and after `UNWRITABLE_REPORT_AFTER` the master is told, which may give
        the partition to a follower (one that its peers can reach, when this node cannot)."""
        started = trio.current_time()
        reported = False
        delay = HEAL_PROBE_DELAY
        while (
            not topic.deleted
            and topic.replication.info is info
            and not held_replica(topic).writable
        ):
            in_sync = await self._probe_followers(topic, info)
            if topic.replication.info is not info or held_replica(topic).writable:
                return  # the info changed meanwhile (`apply` decided), or another probe won
            lagging = [node for node in info.followers() if node not in in_sync]
            if not lagging:
                held_replica(topic).writable = True
                self.node.nsqd.log.info(
                    "TOPIC(%s) partition %d: every ISR follower is at this leader's end again;"
                    " writable",
                    topic.name,
                    topic.partition,
                )
                return
            session = self.node.session
            if session is not None and len(info.isr) - len(lagging) > info.replica // 2:
                if await session.leave_isr(topic.name, topic.partition, lagging, info):
                    return  # `apply` of the smaller ISR made it writable
            if session is not None and not reported:
                if trio.current_time() - started >= UNWRITABLE_REPORT_AFTER:
                    reported = await session.report_unwritable(topic.name, topic.partition, info)
            await trio.sleep(delay)
            delay = min(delay * 2, HEAL_PROBE_MAX_DELAY)

    async def _probe_followers(self, topic: "Topic", info: ReplicaInfo) -> set[str]:
        """The ISR followers that answer a push of the channels and this leader's end with
        the same end (one that held a group the leader cut back cuts it; one that is behind
        starts catching up)."""
        await writer_of(topic).drain()
        in_sync: set[str] = set()

        async def probe(follower: str) -> None:
            sent = {}

            def header() -> dict:
                sent.update(self.node.sync.cursors_header(topic, info, end=True))
                return sent

            try:
                reply = await self.node.link(follower).request(
                    CURSORS, header, timeout=CURSOR_PUSH_TIMEOUT
                )
            except (PeerUnavailable, ReplicaRefusal):
                return
            if reply.header.get("end") == sent.get("end") and not reply.header.get("catching_up"):
                in_sync.add(follower)

        async with trio.open_nursery() as probing:
            for follower in info.followers():
                probing.start_soon(probe, follower)
        return in_sync

    # -- leader: handing over ----------------------------------------------------------------

    async def hand_over(self, topic: "Topic", to: str) -> Position:
        """A planned leader transfer's first half, asked by the master: stop taking publishes,
        wait until what was taken is replicated, send the channels' positions and the log's
        end to the followers until `to` (an ISR follower) answers that it ends there too, and
        return that end. The master then names `to` leader; if it does not within
        `HANDOVER_TIMEOUT`, this node takes publishes again."""
        info = topic.replication.info
        if info is not None and to not in info.followers() and self.node.session is not None:
            # The master may have seen `to` join the ISR before this node's watch did.
            await self.node.session.reload(topic.name, topic.partition)
            info = topic.replication.info
        if info is None:
            raise ClusterWriteError("E_NOT_CLUSTER", "the partition is not a cluster's")
        if info.leader != self.node.node_id:
            raise ClusterWriteError("E_FAILED_ON_NOT_LEADER", "not the leader")
        if to not in info.followers():
            raise ClusterWriteError("E_NOT_IN_ISR", f"{to} is not an ISR follower")
        if not held_replica(topic).writable:
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", "not writable")
        held_replica(topic).handing_over = True
        try:
            with trio.fail_after(HANDOVER_TIMEOUT):
                # The probe drains the writes, sends the channels and this log's end. `to`
                # may lack groups acknowledged by the ISR before this node learned that `to`
                # had joined it; with publishes stopped, no PUT would show it the gap, but the
                # end does: it catches up, and the probe repeats until it has the whole log.
                delay = HEAL_PROBE_DELAY
                while to not in await self._probe_followers(topic, info):
                    await trio.sleep(delay)
                    delay = min(delay * 2, HEAL_PROBE_MAX_DELAY)
        except BaseException:
            held_replica(topic).handing_over = False
            raise
        if self.node.nursery is not None:
            self.node.nursery.start_soon(self.node.contained, self._end_handover, topic, info)
        return log_of(topic).written

    async def _end_handover(self, topic: "Topic", info: ReplicaInfo) -> None:
        await trio.sleep(HANDOVER_TIMEOUT)
        if topic.replication.info is info and held_replica(topic).handing_over:
            held_replica(topic).handing_over = False
            self.node.nsqd.log.warning(
                "TOPIC(%s) partition %d: the master did not move the leader; taking publishes"
                " again",
                topic.name,
                topic.partition,
            )

    async def _replicate_to(
        self,
        follower: str,
        topic: "Topic",
        info: ReplicaInfo,
        writes: list[tuple[tuple, bytes]],
        failed: dict[str, Exception],
        reached: set[str],
        channels: dict | None,
        delays: Sequence[DelayedRecord],
    ) -> None:
        link = self.node.link(follower)
        header = self.node.sync.leader_header(topic, info)
        if delays:
            # The followers index them as the leader did: a new leader's delay queue holds
            # every delayed message its ISR acknowledged.
            header["delays"] = [
                [record.channel, record.message_id.decode(), record.offset, record.count,
                 record.due_ms]
                for record in delays
            ]  # fmt: skip
        if channels is not None:
            # The channel set changed since the last group: the followers have it before the
            # messages published after it, so a new leader knows every channel they were
            # meant for.
            header["channels"] = channels
        replica = held_replica(topic)
        if follower not in info.isr:
            # Admitted, not yet confirmed by the master: it takes the leader's groups as the
            # admission's (`CatchUps`: only while it waits for its `JOIN`'s answer).
            header["admit"] = True
        deadline = trio.current_time() + REPLICATION_RETRY_SECONDS
        attempt = 0
        while True:
            try:
                for entry, data in writes:
                    # A peer that stalls (a cut link) is given up on by the deadline.
                    remaining = max(0.05, deadline - trio.current_time())
                    await link.request(PUT, {**header, "entry": list(entry)}, data, remaining)
                    reached.add(follower)
                return
            except (PeerUnavailable, ReplicaRefusal) as error:
                if isinstance(error, PeerUnavailable) and error.silent:
                    reached.add(follower)
                if follower not in replica.followers():
                    # The master took it out of the ISR meanwhile (a stopping node leaves
                    # it first): the write no longer waits for it.
                    return
                if is_stale_leader(error) or trio.current_time() >= deadline:
                    failed[follower] = error
                    return
                if isinstance(error, ReplicaRefusal) and error.code == "E_STALE_EPOCH":
                    if self.node.session is not None:
                        await self.node.session.reload(topic.name, topic.partition)
                    current = topic.replication.info
                    if current is None or current.leader != self.node.node_id:
                        failed[follower] = error
                        return
                    header["epoch"] = current.epoch_for_write
                attempt += 1
                await trio.sleep(min(0.2, (2 << attempt) / 1000))

    # -- leader: admitting a follower into the ISR ------------------------------------------

    async def admit(self, topic: "Topic", header: dict) -> tuple[dict, bytes]:
        """A follower on the catch-up list, caught up, asks to join the ISR (`JOIN`): with no
        group acknowledged meanwhile, give it what this leader wrote since its `end`, count
        it for every write from then on, and have the master add it with the next write
        epoch. The answer is the info that holds it, and the delayed messages this leader
        holds (`delayed_snapshot`)."""
        node, incarnation = str(header["node"]), str(header.get("incarnation") or "")
        end = Position(*(int(value) for value in header["end"]))
        last = tuple(int(value) for value in header["last"]) if header.get("last") else None
        replica = held_replica(topic)
        info = replica.info
        if node not in info.catchup and node not in info.isr and self.node.session is not None:
            # The master may have put it there before this node's watch said so.
            await self.node.session.reload(topic.name, topic.partition)
            info = replica.info
        refuse_unless_leading(topic)
        if node in info.isr and info.proven(node, incarnation):
            return {"info": info.to_json().decode(), "epoch": info.epoch}, b""
        if node not in info.catchup:
            raise ReplicaRefusal(
                error_header("E_NOT_CATCHUP", f"{node} is not on the partition's catch-up list")
            )
        session = self.node.session
        if session is None:
            raise ReplicaRefusal(error_header("E_NOT_CLUSTER", "no cluster to join"))
        writer = writer_of(topic)
        log = log_of(topic)
        try:
            with trio.fail_after(ADMISSION_TIMEOUT):
                async with writer.exclusive():
                    joined = await self._admit_exclusively(topic, node, incarnation, end, last)
                    # Taken once this node's info holds the follower (every cursor push from
                    # now on reaches it) and before the next write (what it holds past
                    # `before` came with the writes it was sent).
                    delayed, held_ids = delayed_snapshot(topic)
        except trio.TooSlowError:
            raise ReplicaRefusal(
                error_header("E_TIMEOUT", f"no admission within {ADMISSION_TIMEOUT:g} s")
            ) from None
        self.node.nsqd.log.info(
            "TOPIC(%s) partition %d: %s joined the ISR at offset %d (write epoch %d)",
            topic.name,
            topic.partition,
            node,
            log.written.offset,
            joined.epoch_for_write,
        )
        answer = {"info": joined.to_json().decode(), "epoch": joined.epoch}
        if delayed is not None:
            answer["delayed"] = delayed
        return answer, held_ids

    async def _admit_exclusively(
        self, topic: "Topic", node: str, incarnation: str, end: Position, last: tuple | None
    ) -> ReplicaInfo:
        """`_admit`'s part while no group is acknowledged (`LogWriter.exclusive`)."""
        replica = held_replica(topic)
        session = self.node.session
        if session is None:
            raise ReplicaRefusal(error_header("E_NOT_CLUSTER", "no cluster to join"))
        log = log_of(topic)
        info = replica.info
        refuse_unless_leading(topic)
        if end.offset > log.written.offset or (end.offset and log.entry_ending_at(end) != last):
            raise ReplicaRefusal(
                error_header(
                    "E_LOG_MISMATCH",
                    f"a log ending at {end.offset} is not this leader's",
                    end=list(log.written),
                )
            )
        await self._send_since(topic, info, node, end)
        # From here every write counts it, until an info holds it or shows it never will.
        replica.admitting[node] = info.epoch
        try:
            joined = await session.admit(topic.name, topic.partition, node, incarnation, info)
        except MasterRefusal as refusal:
            # A refused join never lands (the master's is conditional on this revision).
            replica.admitting.pop(node, None)
            raise ReplicaRefusal(error_header("E_JOIN_FAILED", str(refusal))) from None
        if joined is None or node not in joined.isr:
            raise ReplicaRefusal(error_header("E_JOIN_FAILED", "no answer from the master"))
        return joined

    async def _send_since(
        self, topic: "Topic", info: ReplicaInfo, node: str, end: Position
    ) -> None:
        """The groups this leader wrote after `end`, to a joining follower (`PUT` with
        `admit`)."""
        log = log_of(topic)
        link = self.node.link(node)
        header = {**self.node.sync.leader_header(topic, info), "admit": True}
        while end.offset < log.written.offset:
            entries = log.entries_from(end.offset, PULL_MAX_ENTRIES)
            for entry in entries:
                data = log.read_group_bytes([entry])
                await link.request(PUT, {**header, "entry": list(entry)}, data)
                end = Position(*entry_end(entry))

    def settle_admissions(self, topic: "Topic", info: ReplicaInfo) -> None:
        """Admitted followers stop counting apart once `info` holds them, or once it is of a
        later revision than the one their join was for (the master's join is conditional on
        that one, so it can no longer land)."""
        admitting = held_replica(topic).admitting
        for node, epoch in list(admitting.items()):
            if node in info.isr or info.epoch > epoch:
                del admitting[node]

    def disk_state(self, topic: "Topic", error: OSError | None) -> None:
        """The disk refused a write of a partition this node leads: its publishes are
        refused while it does, so the partition goes to a follower that can write (a planned
        hand-over the master runs), and this node catches up once space returns. None: it
        took one again."""
        replica = held_replica(topic)
        if error is None:
            replica.disk_error = ""
            return
        replica.disk_error = str(error)
        if (
            self.node.nursery is not None
            and self.node.session is not None
            and not replica.resigning
        ):
            replica.resigning = True
            self.node.nursery.start_soon(self.node.contained, self._resign, topic)

    async def _resign(self, topic: "Topic") -> None:
        replica = held_replica(topic)
        session = self.node.session
        try:
            while session is not None and replica.is_leader and replica.disk_error:
                self.node.nsqd.log.warning(
                    "TOPIC(%s) partition %d: the disk refuses this leader's writes (%s): asking"
                    " the master to hand the partition to a follower",
                    topic.name,
                    topic.partition,
                    replica.disk_error,
                )
                if await session.resign(topic.name, topic.partition, replica.info):
                    return
                await trio.sleep(RESIGN_RETRY_INTERVAL)
        finally:
            replica.resigning = False

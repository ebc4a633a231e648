"""The master's elections (docs/design.md §14): a new leader for each partition whose leader is
gone, lost its data or cannot replicate, among its live ISR members that prove their data
(the one with the most messages); ISR members gone or in a new incarnation moved to the
catch-up list; a leader's report that it cannot replicate or that its disk refuses writes;
and an operator's unclean election."""

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import (
    ReplicaInfo,
    same_disk_identity,
)
from nsqpy.nsqlookupd.coordinator_error import CoordinatorError
from nsqpy.nsqlookupd.node_reports import NodeCallError

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.coordinator import Coordinator

OFFSETS_TIMEOUT = 2.0
# A leader that refuses writes this long is replaced, when a majority answers without it.
UNWRITABLE_GRACE = 3.0


class Elections:
    """The coordinator's elections and ISR departures, as the master."""

    def __init__(self, coordinator: "Coordinator") -> None:
        self.coordinator = coordinator
        # A partition whose leader refuses writes -> since when (trio's clock).
        self._unwritable_since: dict[tuple[str, int], float] = {}

    async def _elect(
        self, topic: str, partition: int, info: ReplicaInfo, *, unwritable: bool = False
    ) -> bool:
        """`_elect_many` of one partition: whether it has a new leader."""
        elected = await self.elect_many([((topic, partition), info)], unwritable=unwritable)
        return (topic, partition) in elected

    async def elect_many(
        self,
        elections: list[tuple[tuple[str, int], ReplicaInfo]],
        *,
        unwritable: bool = False,
    ) -> set[tuple[str, int]]:
        """A new leader for each partition among its live ISR: the one with the most
        messages, ties to the node leading fewest (counting the leaders this pass makes, so
        a dead node's partitions spread). One pass whatever their number: each candidate
        node is asked once for the ends of all its partitions, side by side, and the new
        infos go out in as few transactions as fit (`nsqlookupd/info_writes.py`).
        `unwritable`: the leaders are alive but cannot replicate; they go to the catch-up
        list, and only a majority of the replicas answering without the leader may elect.
        The partitions that have a new leader."""
        started = trio.current_time()
        plans = []
        for key, info in elections:
            lost = set(self.coordinator.lost_members(info))
            candidates = [
                node
                for node in info.isr
                if node != info.leader and node in self.coordinator.nodes and node not in lost
            ]
            if not candidates and not unwritable:
                candidates = self._restarted_on_their_disks(info, lost)
            if candidates:
                plans.append((key, info, candidates, lost))
            elif not unwritable:
                # Only an ISR member in the incarnation the ISR counted on holds every
                # acknowledged message: without one alive, the partition waits for one to
                # come back (or for an operator's unclean election). A leader that is alive
                # and only short of followers is no such case: it is the complete replica.
                self._no_complete_replica(*key, info, lost)
        if not plans:
            return set()
        counts = await self._ask_counts({node for _k, _i, nodes, _l in plans for node in nodes})
        led = Counter(other.leader for other in self.coordinator.infos.values())
        writes = []
        for key, info, candidates, lost in plans:
            reachable = [node for node in candidates if key in counts.get(node, {})]
            if not reachable or (unwritable and len(reachable) <= info.replica // 2):
                continue
            leader = max(reachable, key=lambda node: (counts[node][key], -led[node]))
            led[leader] += 1
            led[info.leader] -= 1
            # The old leader, and members gone or in a new incarnation, catch up to come back.
            isr = tuple(
                node
                for node in info.isr
                if node != info.leader
                and (unwritable or node in self.coordinator.nodes)
                and node not in lost
            )
            if leader not in isr:
                # Back on its disk after an unclean stop, the longest of its ISR: it leads
                # in its new incarnation.
                isr = (leader, *isr)
            dropped = [node for node in info.isr if node not in isr]
            catchup = [*info.catchup, info.leader, *dropped]
            updated = replace(
                info,
                leader=leader,
                isr=isr,
                catchup=tuple(node for node in dict.fromkeys(catchup) if node != leader),
                epoch_for_write=info.epoch_for_write + 1,
            ).recording({leader: self.coordinator.nodes[leader].incarnation})
            writes.append((key, info, updated, counts[leader][key], lost))
        written = await self.coordinator.write_replica_infos(
            [(key, updated, info) for key, info, updated, _count, _lost in writes]
        )
        elected = set()
        for (key, info, updated, count, lost), done in zip(writes, written, strict=True):
            if not done:
                continue
            elected.add(key)
            self.coordinator.leaderless.pop(key, None)
            self.coordinator.lookupd.log.info(
                "CLUSTER: %s/%d: leader %s %s, %s leads (write epoch %d, %d messages)",
                *key,
                info.leader,
                "refused writes"
                if unwritable
                else ("is in a new incarnation" if info.leader in lost else "gone"),
                updated.leader,
                updated.epoch_for_write,
                count,
            )
        if len(elections) > 1:
            self.coordinator.lookupd.log.info(
                "CLUSTER: %d of %d partitions given a new leader in one pass, %.0f ms",
                len(elected),
                len(elections),
                (trio.current_time() - started) * 1000,
            )
        self.coordinator.election_passes += 1
        self.coordinator.elected += len(elected)
        return elected

    async def _ask_counts(self, nodes: set[str]) -> dict[str, dict[tuple[str, int], int]]:
        """How many messages each of `nodes` holds of each of its partitions (one
        `/cluster/partitions` call a node, side by side); a node that does not answer is
        left out."""
        counts: dict[str, dict[tuple[str, int], int]] = {}

        async def ask(node_id: str) -> None:
            node = self.coordinator.nodes.get(node_id)
            if node is None:
                return
            try:
                answer = await self.coordinator.call_node(
                    node, "GET", "/cluster/partitions", OFFSETS_TIMEOUT
                )
            except NodeCallError:
                return
            if node_id in self.coordinator.nodes:
                # Its report too: what a master that just took over has not polled yet.
                self.coordinator.reports.take(node_id, answer, trio.current_time())
            counts[node_id] = {
                (str(entry["topic"]), int(entry["partition"])): int(entry["end"][1])
                for entry in answer.get("partitions") or []
            }

        async with trio.open_nursery() as asking:
            for node in nodes:
                asking.start_soon(ask, node)
        return counts

    def _restarted_on_their_disks(self, info: ReplicaInfo, lost: set[str]) -> list[str]:
        """Where no ISR member proves it holds every acknowledged message but each one runs
        again: the members back on the disk the ISR counted on, in a new run of it (each
        stopped uncleanly, which may have cost its unsynced writes). What none of them
        kept no replica has, and waiting brings nothing more: the longest of them leads
        (a lost disk is no such member: it holds nothing)."""
        if any(node not in self.coordinator.nodes for node in info.isr):
            return []
        return [
            node
            for node in info.isr
            if node in lost
            and same_disk_identity(info.incarnation_of(node))
            == same_disk_identity(self.coordinator.nodes[node].incarnation)
        ]

    def _no_complete_replica(
        self, topic: str, partition: int, info: ReplicaInfo, lost: set[str]
    ) -> None:
        """Say once (in the log, and in `/cluster/stats` until it changes) why a partition
        whose leader is gone or lost its data has no leader to elect."""
        gone = [node for node in info.isr if node not in self.coordinator.nodes]
        reason = (
            "no ISR member that holds every acknowledged message is alive"
            f" (gone: {','.join(gone) or 'none'};"
            f" in a new incarnation: {','.join(sorted(lost)) or 'none'}); waiting for one to"
            " come back"
        )
        key = (topic, partition)
        if self.coordinator.leaderless.get(key) != reason:
            self.coordinator.leaderless[key] = reason
            self.coordinator.lookupd.log.error(
                "CLUSTER: %s/%d: unwritable: %s", topic, partition, reason
            )

    async def ask_count(self, node: str, topic: str, partition: int, counts: dict) -> None:
        info = self.coordinator.nodes.get(node)
        if info is None:
            return
        try:
            answer = await self.coordinator.call_node(
                info, "GET", "/partition/offsets", OFFSETS_TIMEOUT, topic=topic
            )
        except NodeCallError:
            return
        for entry in answer.get("partitions", []):
            if int(entry.get("partition", -1)) == partition:
                counts[node] = int(entry["end"]["count"])

    async def leave(
        self, topic: str, partition: int, info: ReplicaInfo, nodes: list[str]
    ) -> ReplicaInfo | None:
        """`nodes` leave the partition's ISR for its catch-up list: the info that says so,
        None when the partition changed meanwhile."""
        (updated,) = await self.leave_many([((topic, partition), info, nodes)])
        return updated

    async def leave_many(
        self, leaves: list[tuple[tuple[str, int], ReplicaInfo, list[str]]]
    ) -> list[ReplicaInfo | None]:
        """`_leave` for many partitions, their infos written together."""
        items = []
        for key, info, nodes in leaves:
            updated = replace(
                info,
                isr=tuple(node for node in info.isr if node not in nodes),
                catchup=tuple(dict.fromkeys([*info.catchup, *nodes])),
            )
            items.append((key, updated, info))
        written = await self.coordinator.write_replica_infos(items)
        results: list[ReplicaInfo | None] = []
        for (key, _info, nodes), done in zip(leaves, written, strict=True):
            if not done:
                results.append(None)
                continue
            self.coordinator.lookupd.log.info(
                "CLUSTER: %s/%d: %s left the ISR", *key, ",".join(nodes)
            )
            results.append(self.coordinator.infos.get(key))
        return results

    async def check_leader_health(self, now: float) -> None:
        """Leaders whose nodes report them not writable (not while handing over) for
        `UNWRITABLE_GRACE` are replaced: a leader that cannot replicate marks itself so and
        tells no one if it cannot reach the master either."""
        for key, info in sorted(self.coordinator.infos.items()):
            report = self.coordinator.reports.of(info.leader, key)
            if (
                key in self.coordinator.busy
                or report is None
                or report.get("role") != "leader"
                or report.get("writable")
                or report.get("handing_over")
            ):
                self._unwritable_since.pop(key, None)
                continue
            since = self._unwritable_since.setdefault(key, now)
            if now - since >= UNWRITABLE_GRACE:
                if await self._elect(*key, info, unwritable=True):
                    self._unwritable_since.pop(key, None)

    async def leader_unwritable(
        self, topic: str, partition: int, node: str, *, epoch: int
    ) -> ReplicaInfo:
        """A leader says it cannot replicate (`LeaderRole._restore_writes`): replaced now if
        a majority answers without it."""
        self.coordinator.require_master()
        info = await self.coordinator.current(topic, partition)
        self.coordinator.check_request(info, leader=node, epoch=epoch)
        if (topic, partition) not in self.coordinator.busy:
            if await self._elect(topic, partition, info, unwritable=True):
                self._unwritable_since.pop((topic, partition), None)
        return self.coordinator.infos[(topic, partition)]

    async def leader_resign(
        self, topic: str, partition: int, node: str, *, epoch: int
    ) -> ReplicaInfo:
        """A leader whose disk refuses writes hands the partition to a caught-up follower
        whose disk does not (a planned transfer); CoordinatorError when there is none."""
        self.coordinator.require_master()
        info = await self.coordinator.current(topic, partition)
        self.coordinator.check_request(info, leader=node, epoch=epoch)
        successor = self.coordinator.moves.successor(topic, partition, info, exclude={node})
        if successor is None:
            raise CoordinatorError(400, "E_NO_SUCCESSOR no caught-up follower can take it")
        return await self.coordinator.moves.transfer_leader(
            topic, partition, successor, "its leader's disk fails"
        )

    async def unclean_election(self, topic: str, partition: int, node: str | None) -> ReplicaInfo:
        """An operator's choice, as Kafka's unclean leader election: `node` (or the live
        replica with the most messages) leads the partition even though it may lack
        acknowledged messages, which are then lost; every other replica catches up from it,
        cutting what it holds that the new leader does not. Only for a partition no complete
        replica can lead (`leaderless`)."""
        self.coordinator.require_master()
        key = (topic, partition)
        info = await self.coordinator.current(topic, partition)
        lost = set(self.coordinator.lost_members(info))
        complete = [
            member
            for member in info.isr
            if member in self.coordinator.nodes and member not in lost and member != info.leader
        ]
        if info.leader in self.coordinator.nodes and info.leader not in lost:
            raise CoordinatorError(400, f"E_HAS_LEADER {info.leader} leads it and holds its data")
        if complete:
            raise CoordinatorError(
                400, f"E_COMPLETE_REPLICA_ALIVE {','.join(complete)} can lead it without a loss"
            )
        holders = [
            member
            for member in dict.fromkeys([info.leader, *info.isr, *info.catchup])
            if member in self.coordinator.nodes
        ]
        if node is None:
            counts: dict[str, int] = {}
            async with trio.open_nursery() as asking:
                for member in holders:
                    asking.start_soon(self.ask_count, member, topic, partition, counts)
            if not counts:
                raise CoordinatorError(400, "E_NO_REPLICA no live replica answers")
            node = max(counts, key=lambda member: counts[member])
        elif node not in holders:
            raise CoordinatorError(
                400, f"E_NOT_LIVE {node} is no live replica of {topic}/{partition}"
            )
        if key in self.coordinator.busy:
            raise CoordinatorError(400, "another move of the partition is under way")
        updated = replace(
            info,
            leader=node,
            isr=(node,),
            catchup=tuple(
                member for member in dict.fromkeys([*info.isr, *info.catchup]) if member != node
            ),
            epoch_for_write=info.epoch_for_write + 1,
            incarnations=(),
        ).recording({node: self.coordinator.nodes[node].incarnation})
        if not await self.coordinator.write_replica_info(topic, partition, updated, info):
            raise CoordinatorError(409, "E_STALE_EPOCH the partition changed meanwhile")
        self.coordinator.leaderless.pop(key, None)
        self.coordinator.lookupd.log.error(
            "CLUSTER: %s/%d: UNCLEAN ELECTION by an operator: %s leads (write epoch %d);"
            " acknowledged messages it does not hold are lost, and the other replicas cut"
            " what it lacks",
            topic,
            partition,
            node,
            updated.epoch_for_write,
        )
        return self.coordinator.infos[key]

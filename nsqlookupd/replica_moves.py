"""Where the master puts replicas (docs/design.md §14): the replica count kept (a new replica
on the least loaded node, the extra or departing ones dropped), a node being removed
emptied, planned leader transfers, an operator's replica move, a stopping node's leave, and
balance."""

import time
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

import trio

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.etcd import EtcdError
from nsqpy.nsqlookupd.coordinator_error import CoordinatorError
from nsqpy.nsqlookupd.node_reports import NodeCallError
from nsqpy.nsqlookupd.options import balance_window
from nsqpy.nsqlookupd.placement import (
    Move,
    new_replica_node,
    next_leader_move,
    next_replica_move,
    partition_load_factor,
)

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.coordinator import Coordinator

# How often the master looks for a balancing move.
BALANCE_INTERVAL = 2.0
# How long a moved replica may take to catch up (Youzan: 10 minutes).
MOVE_TIMEOUT = 600.0
# How long a leader takes to hand a partition over.
HANDOVER_TIMEOUT = 5.0
# Top-N balance considers this many of the busiest partitions (Youzan's topicTopNLimit).
TOPN_LIMIT = 100


class ReplicaMoves:
    """The coordinator's replica placement and moves, as the master."""

    def __init__(self, coordinator: "Coordinator") -> None:
        self.coordinator = coordinator
        # Removed nodes already said to hold nothing any more.
        self._announced_removed: set[str] = set()

    async def finish_removals(self) -> None:
        """A node being removed that holds nothing any more may be stopped, and stays on the
        removal list (given nothing) until it leaves the cluster, as Youzan's "done" state:
        balance would otherwise give the emptiest node replicas back before it is stopped."""
        removed = self.coordinator.removed_nodes()
        for node in removed:
            if node not in self._announced_removed:
                self._announced_removed.add(node)
                self.coordinator.lookupd.log.info(
                    "CLUSTER: %s holds no replica any more; it may be stopped", node
                )
        gone = [node for node in removed if node not in self.coordinator.nodes]
        if gone:
            self._announced_removed.difference_update(gone)
            await self.coordinator.change_state(
                removing=tuple(node for node in self.coordinator.state.removing if node not in gone)
            )

    async def keep_replicas(
        self, topic: str, partition: int, info: ReplicaInfo, now: float
    ) -> None:
        """A replica on the least loaded node without one where the partition has fewer than
        it should (counting neither nodes being removed nor nodes gone past
        `--cluster-replace-dead-after`); the departing ones dropped once the new ones are in
        the ISR; extra ones dropped (a lower replicator)."""
        after = self.coordinator.lookupd.options.cluster_replace_dead_after
        removing = set(self.coordinator.state.removing)
        gone_long = {
            node
            for node in info.catchup
            if node not in self.coordinator.nodes
            and after > 0
            and now - self.coordinator.gone_since[node] >= after
        }
        departing = (removing | gone_long) & {*info.isr, *info.catchup}
        if info.leader in removing and info.leader in self.coordinator.nodes:
            successor = self.successor(topic, partition, info, exclude=removing)
            if successor is not None:
                await self._try_transfer(topic, partition, successor, "its node is being removed")
            return
        staying = [
            node for node in dict.fromkeys([*info.isr, *info.catchup]) if node not in departing
        ]
        if len(staying) < info.replica:
            holders = {info.leader, *info.isr, *info.catchup}
            node = new_replica_node(
                topic,
                self.coordinator.eligible_nodes(),
                self.coordinator.infos,
                exclude=holders,
                loads=self.coordinator.reports.loads(),
            )
            if node is None:
                return
            updated = replace(info, catchup=(*info.catchup, node))
            if await self.coordinator.write_replica_info(topic, partition, updated, info):
                self.coordinator.lookupd.log.info(
                    "CLUSTER: %s/%d: a new replica on %s (%d of %d; departing: %s)",
                    topic,
                    partition,
                    node,
                    len(staying),
                    info.replica,
                    ",".join(sorted(departing)) or "none",
                )
            return
        staying_isr = [node for node in info.isr if node not in departing]
        if departing and len(staying_isr) >= info.replica:
            await self._drop(topic, partition, info, sorted(departing), "replaced")
            return
        if len(staying) > info.replica:
            extra = [node for node in info.catchup if node not in departing]
            extra += sorted(
                (node for node in info.followers() if node not in departing),
                key=lambda node: -self._replica_count(node),
            )
            await self._drop(
                topic, partition, info, extra[: len(staying) - info.replica], "too many replicas"
            )

    def _replica_count(self, node: str) -> int:
        return sum(1 for info in self.coordinator.infos.values() if info.holds(node))

    async def _drop(
        self, topic: str, partition: int, info: ReplicaInfo, nodes: list[str], why: str
    ) -> bool:
        """Drop follower or catch-up replicas (never the leader); they delete their copies."""
        nodes = [node for node in nodes if node != info.leader]
        if not nodes:
            return False
        updated = replace(
            info,
            isr=tuple(node for node in info.isr if node not in nodes),
            catchup=tuple(node for node in info.catchup if node not in nodes),
        )
        if await self.coordinator.write_replica_info(topic, partition, updated, info):
            self.coordinator.lookupd.log.info(
                "CLUSTER: %s/%d: %s no longer hold it (%s)", topic, partition, ",".join(nodes), why
            )
            return True
        return False

    def successor(self, topic: str, partition: int, info: ReplicaInfo, exclude=()) -> str | None:
        """The caught-up ISR follower a planned transfer would go to: the one leading
        fewest partitions."""
        leaders = Counter(other.leader for other in self.coordinator.infos.values())
        candidates = [
            node
            for node in info.followers()
            if node in self.coordinator.nodes
            and node not in exclude
            and self.coordinator.reports.caught_up((topic, partition), node)
            and not (self.coordinator.reports.of(node, (topic, partition)) or {}).get("disk_error")
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda node: (leaders[node], node))

    async def node_stopping(self, node: str, incarnation: str) -> dict:
        """A node about to stop (a clean stop, SIGTERM): each partition it leads goes to a
        caught-up follower by a planned hand-over, and it leaves every ISR it is in, all
        partitions side by side, while it still serves. Partitions with no follower to take
        over keep it as leader (its lease's revocation elects, if anyone can)."""
        self.coordinator.require_master()
        live = self.coordinator.nodes.get(node)
        if live is None:
            raise CoordinatorError(400, f"E_NOT_LIVE {node} is not a live node")
        if incarnation != live.incarnation:
            raise CoordinatorError(400, f"E_INCARNATION {node} is in another incarnation")
        done: dict[str, list] = {"handed_over": [], "left": [], "kept": []}

        async def move_off(topic: str, partition: int) -> None:
            try:
                info = await self.coordinator.current(topic, partition)
                if info.leader == node:
                    successor = self.successor(topic, partition, info, exclude={node})
                    if successor is None:
                        done["kept"].append(f"{topic}/{partition}: no caught-up follower")
                        return
                    await self.transfer_leader(topic, partition, successor, "its node is stopping")
                    done["handed_over"].append(f"{topic}/{partition}")
                for _attempt in range(3):
                    info = await self.coordinator.current(topic, partition)
                    if node not in info.followers():
                        return
                    if (
                        await self.coordinator.elections.leave(topic, partition, info, [node])
                        is not None
                    ):
                        done["left"].append(f"{topic}/{partition}")
                        return
            except (CoordinatorError, EtcdError) as error:
                done["kept"].append(f"{topic}/{partition}: {error}")

        async with trio.open_nursery() as moving:
            for (topic, partition), info in sorted(self.coordinator.infos.items()):
                if node in info.isr:
                    moving.start_soon(move_off, topic, partition)
        self.coordinator.lookupd.log.info(
            "CLUSTER: %s is stopping: %d leadership(s) handed over, %d ISR(s) left, kept: %s",
            node,
            len(done["handed_over"]),
            len(done["left"]),
            "; ".join(done["kept"]) or "none",
        )
        return done

    async def transfer_leader(self, topic: str, partition: int, to: str, why: str) -> ReplicaInfo:
        """Hand the partition's leadership to `to`, a live ISR follower: the leader drains
        and hands over, `to` is checked to have its whole log, then named leader."""
        key = (topic, partition)
        if key in self.coordinator.busy:
            raise CoordinatorError(400, "another move of the partition is under way")
        self.coordinator.busy.add(key)
        try:
            return await self._transfer(topic, partition, to, why)
        finally:
            self.coordinator.busy.discard(key)

    async def _try_transfer(self, topic: str, partition: int, to: str, why: str) -> bool:
        try:
            await self.transfer_leader(topic, partition, to, why)
        except (CoordinatorError, EtcdError) as error:
            self.coordinator.lookupd.log.warning(
                "CLUSTER: %s/%d: moving the leader to %s failed - %s", topic, partition, to, error
            )
            return False
        return True

    async def _transfer(self, topic: str, partition: int, to: str, why: str) -> ReplicaInfo:
        info = await self.coordinator.current(topic, partition)
        if info.leader == to:
            return info
        if to not in info.followers() or to not in self.coordinator.nodes:
            raise CoordinatorError(400, f"{to} is not a live ISR member of {topic}/{partition}")
        leader = self.coordinator.nodes.get(info.leader)
        if leader is None:
            raise CoordinatorError(400, f"the leader {info.leader} is not live")
        started = trio.current_time()
        try:
            answer = await self.coordinator.call_node(
                leader,
                "POST",
                "/cluster/leader/handover",
                HANDOVER_TIMEOUT,
                topic=topic,
                partition=partition,
                to=to,
            )
        except NodeCallError as error:
            raise CoordinatorError(400, f"the leader refused to hand over: {error}") from None
        end = int(answer["end"][1])
        counts: dict[str, int] = {}
        await self.coordinator.elections.ask_count(to, topic, partition, counts)
        if counts.get(to) != end:
            # The leader takes publishes again after its own timeout.
            raise CoordinatorError(
                400, f"{to} has {counts.get(to)} messages, the leader {end}: not caught up"
            )
        updated = replace(info, leader=to, epoch_for_write=info.epoch_for_write + 1)
        if not await self.coordinator.write_replica_info(topic, partition, updated, info):
            raise CoordinatorError(409, "E_CONFLICT the partition changed meanwhile")
        self.coordinator.lookupd.log.info(
            "CLUSTER: %s/%d: leader moved from %s to %s (%s), write epoch %d, %.0f ms",
            topic,
            partition,
            info.leader,
            to,
            why,
            updated.epoch_for_write,
            (trio.current_time() - started) * 1000,
        )
        return self.coordinator.infos[(topic, partition)]

    async def move_replica(
        self,
        topic: str,
        partition: int,
        source: str,
        destination: str,
        *,
        move_leader: bool,
        timeout: float = MOVE_TIMEOUT,
    ) -> ReplicaInfo:
        """Youzan's tryMoveTopicPartition: `destination` joins the catch-up list, catches up
        and joins the ISR; then the leadership moves to it (`move_leader`, when `source`
        leads) and `source` leaves. CoordinatorError with Youzan's texts."""
        key = (topic, partition)
        if key in self.coordinator.busy:
            raise CoordinatorError(400, "another balance is running, should wait")
        self.coordinator.busy.add(key)
        try:
            info = await self.coordinator.current(topic, partition)
            if destination not in info.isr:
                if destination not in info.catchup:
                    updated = replace(info, catchup=(*info.catchup, destination))
                    if not await self.coordinator.write_replica_info(
                        topic, partition, updated, info
                    ):
                        raise CoordinatorError(400, "catchup changed while wait moving")
                self.coordinator.lookupd.log.info(
                    "CLUSTER: %s/%d: moving from %s to %s, %s catching up",
                    topic,
                    partition,
                    source,
                    destination,
                    destination,
                )
                with trio.move_on_after(timeout) as waited:
                    while True:
                        moving = self.coordinator.infos.get(key)
                        if moving is None:
                            raise CoordinatorError(400, "E_TOPIC_NOT_EXIST")
                        if destination in moving.isr:
                            break
                        if destination not in moving.catchup:
                            raise CoordinatorError(400, "catchup changed while wait moving")
                        await self.coordinator.wait_changed(1.0)
                if waited.cancelled_caught:
                    raise CoordinatorError(400, "timeout waiting move topic")
            info = await self.coordinator.current(topic, partition)
            if info.leader == source:
                if not move_leader:
                    raise CoordinatorError(400, "can not move leader without moveleader param")
                await self._transfer(topic, partition, destination, "moved")
                info = await self.coordinator.current(topic, partition)
            if source in info.isr or source in info.catchup:
                await self._drop(topic, partition, info, [source], f"moved to {destination}")
            return self.coordinator.infos[key]
        finally:
            self.coordinator.busy.discard(key)

    def balance_allowed(self) -> str | None:
        """Why balancing does not run now, or None when it may."""
        window = balance_window(self.coordinator.lookupd.options)
        if window is None:
            return "switched off (--balance-interval=off)"
        hour = time.localtime().tm_hour
        if not window[0] <= hour <= window[1]:
            return f"outside --balance-interval {window[0]},{window[1]}"
        if not self.coordinator.is_master:
            return "not the master"
        if not self.coordinator.stable():
            return "the cluster is not stable"
        if any(node not in self.coordinator.reports.reports for node in self.coordinator.nodes):
            return "waiting for every node's report"
        return None

    def next_balance_move(self) -> Move | None:
        nodes = self.coordinator.eligible_nodes()
        infos = dict(self.coordinator.infos)
        loads = self.coordinator.reports.loads()
        groups = []
        if self.coordinator.state.topn_balance:
            busiest = sorted(loads, key=lambda key: -partition_load_factor(loads[key]))[:TOPN_LIMIT]
            groups.append([key for key in busiest if key in infos])

        move = next_leader_move(nodes, infos, self.coordinator.reports.caught_up, loads, groups)
        if move is None:
            move = next_replica_move(nodes, infos)
        return move

    async def balance_loop(self) -> None:
        while True:
            await trio.sleep(BALANCE_INTERVAL)
            if self.balance_allowed() is not None or self.coordinator.balancing is not None:
                continue
            self.coordinator.balance_rounds += 1
            move = self.next_balance_move()
            if move is None:
                continue
            self.coordinator.balancing = move
            try:
                self.coordinator.lookupd.log.info("CLUSTER: balancing: %s", move)
                if move.leader:
                    done = await self._try_transfer(
                        move.topic, move.partition, move.destination, "balance"
                    )
                else:
                    try:
                        await self.move_replica(
                            move.topic,
                            move.partition,
                            move.source,
                            move.destination,
                            move_leader=False,
                        )
                        done = True
                    except (CoordinatorError, EtcdError) as error:
                        self.coordinator.lookupd.log.warning(
                            "CLUSTER: balancing %s failed - %s", move, error
                        )
                        done = False
                self.coordinator.balance_moves += done
            finally:
                self.coordinator.balancing = None

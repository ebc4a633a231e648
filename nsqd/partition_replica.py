"""A cluster partition's side of the replication seam (`nsqd/replication.py`): who holds it,
and whether this node, as its leader, takes writes now (docs/design.md §14)."""

from typing import TYPE_CHECKING

from nsqpy.common.cluster_meta import ReplicaInfo

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.topic import Topic

# What a partition found on disk is until the cluster's metadata says who leads it.
UNKNOWN_REPLICA = ReplicaInfo(leader="?", isr=(), epoch=-1, epoch_for_write=-1)


class PartitionReplica:
    """The Replication of a partition held by cluster replicas; `ClusterNode` keeps `info`
    what the cluster's metadata says."""

    def __init__(self, node: "ClusterNode", topic: "Topic", info: ReplicaInfo) -> None:
        self.node = node
        self.topic = topic
        self.info = info
        # As the leader: whether its followers can take writes now.
        self.writable = True
        # A leader handing the partition to a follower (a planned leader transfer): it takes
        # no publish until the new leader does.
        self.handing_over = False
        # The info names this node in the ISR, but in an incarnation that held the data
        # before this one (a replaced or emptied disk, or a run after an unclean stop that
        # may have lost its unsynced writes): it proves nothing it holds, leads nothing and
        # counts for nothing until it caught up and joined again.
        self.lost = False
        # The last write of this copy the disk refused (full, failing); "" once one works.
        self.disk_error = ""
        # As the leader: asking the master to hand the partition over (its disk fails).
        self.resigning = False
        # It stopped leading on a follower's word; the next info naming it leader starts it
        # leading again (registration included).
        self.stepped_down = False
        # As the leader: followers admitted into the ISR whose entry the master has not
        # confirmed yet, with the info revision they were admitted at. Every write goes to
        # them too before it is acknowledged, until an info holds them or a later one shows
        # the join cannot happen any more (`LeaderRole.settle_admissions`).
        self.admitting: dict[str, int] = {}

    @property
    def is_leader(self) -> bool:
        return self.info.leader == self.node.node_id and not self.lost

    @property
    def is_follower(self) -> bool:
        return not self.is_leader

    def followers(self) -> list[str]:
        """Every node a write must reach before it is acknowledged: the ISR's followers and
        the admitted ones."""
        followers = list(self.info.followers())
        followers.extend(node for node in self.admitting if node not in self.info.isr)
        return followers

    def refusal(self) -> str | None:
        if self.lost and self.info.leader == self.node.node_id:
            # Named leader, holding nothing: writers wait for an election, not for a lookup.
            return "E_FAILED_ON_NOT_WRITABLE"
        if self.is_follower or self.handing_over:
            return "E_FAILED_ON_NOT_LEADER"
        if not self.writable:
            return "E_FAILED_ON_NOT_WRITABLE"
        return None

    def cursor_moved(self) -> None:
        # Youzan replicates an ordered channel's cursor on every FIN, and every other's on a
        # timer; here every cursor goes at once, coalesced (`LeaderSync.cursor_moved`), so a
        # failover repeats little more than what was in flight.
        self.node.sync.cursor_moved(self.topic)

    async def channels_changed(self) -> None:
        await self.node.sync.push_channels(self.topic)

    def describe(self) -> dict:
        return self.node.describe(self.topic)

    def stats(self) -> dict:
        state = self.describe()
        # A partition found on disk at startup, before etcd says who holds it, knows no
        # replicas: it is not reported under-replicated on a guess.
        known = self.info is not UNKNOWN_REPLICA
        replicas = self.info.replica if known else 0
        return {
            "cluster_role": state["role"],
            "cluster_leader": state["leader"],
            "cluster_isr": state["isr"],
            "cluster_catchup": state["catchup"],
            "cluster_write_epoch": state["write_epoch"],
            "cluster_writable": state["writable"],
            "cluster_replicas": replicas,
            # Fewer in-sync replicas than the topic asks for: one more loss may stop writes.
            "under_replicated": known and (len(state["isr"]) < replicas or self.lost),
        }

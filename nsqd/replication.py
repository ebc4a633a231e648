"""The seam between the broker and a partition's replication (docs/design.md §14).

The broker (topics, channels, the protocols, the HTTP API, the stats) reaches the cluster only
through a topic's `replication`: `SINGLE_NODE` for an nsqd alone, which does nothing, or the
cluster's `PartitionReplica` (`nsqd/cluster.py`) for a partition held by replicas.
"""

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from nsqpy.common.cluster_meta import ReplicaInfo


class Replication(Protocol):
    """What the broker asks of a partition's replication."""

    @property
    def info(self) -> "ReplicaInfo | None":
        """Who holds the partition, as the cluster's metadata says; None alone."""

    @property
    def is_follower(self) -> bool:
        """In a cluster, and not the partition's leader here: it takes no publish, and
        nsqlookupd does not list it."""

    def refusal(self) -> str | None:
        """Why the partition takes no publish here now (`E_FAILED_ON_NOT_LEADER`,
        `E_FAILED_ON_NOT_WRITABLE`); None when it takes one."""

    def cursor_moved(self) -> None:
        """A channel's cursor moved (FIN) or a message was deferred (REQ with a delay): the
        followers learn it soon, so a failover repeats little."""

    async def channels_changed(self) -> None:
        """The partition's channels changed: the followers have them when this returns."""

    def describe(self) -> dict:
        """The replica state `/partition/offsets` adds to a partition's entry."""

    def stats(self) -> dict:
        """The `cluster_*` keys `/stats` adds to a partition."""


class SingleNode:
    """An nsqd alone: every partition is its own, nothing to tell anyone."""

    info = None
    is_follower = False

    def refusal(self) -> str | None:
        return None

    def cursor_moved(self) -> None:
        pass

    async def channels_changed(self) -> None:
        pass

    def describe(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}


SINGLE_NODE = SingleNode()

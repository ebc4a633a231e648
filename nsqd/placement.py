"""Where a topic is served (docs/design.md, "Placement"): by this process, by another of
`--workers`, or refused here with the NSQ error a client acts on.

One interface answers it for the TCP, the HTTP and a cluster peer's replication paths, in the
two steps a request meets:

1. `worker_for(name, partition)`, before anything is resolved: the process that serves the
   partition a command or request names (-1: the topic's default partition); another
   worker's connection is handed over, or its publish (a peer's request) forwarded, by the
   connection layer (asked by the V2 interpreter `protocol_v2.py`, whose connection
   `connection.py` does the hop; `worker_http.py`; `peer_server.py`);
2. `refusal(topic, operation)`, once the partition is resolved in the process that serves
   it: None when this node serves the operation on it, else the error (a cluster follower,
   a leader that cannot replicate, `/disable/write`). `refuses_to_create(name)` says whether
   a client's command may create a topic here at all, and `partitions_here(name, numbers)`
   which of a topic's partitions this process holds (a request creating them all, the
   cluster's metadata applied).

Three implementations: `SingleNodePlacement` (an nsqd alone: everything here),
`ClusterPlacement` (the partition's replica state decides), `WorkerPlacement` (one of
`--workers`: a share of the partitions here, the others' by topic name and partition number,
each worker deciding its own partitions through the placement it wraps). Nothing else in
nsqd asks these questions.
"""

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nsqpy.common.names import is_valid_name

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster import ClusterNode
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic
    from nsqpy.nsqd.worker import Worker

NOT_LEADER = "E_FAILED_ON_NOT_LEADER"


class Operation(enum.Enum):
    PUBLISH = "publish"
    CONSUME = "consume"
    # Creating, deleting or changing a channel: the leader's, which the followers copy.
    CHANGE_CHANNELS = "change channels"


@dataclass(frozen=True, slots=True)
class OtherWorker:
    """The topic is served by worker `index` of this nsqd's `--workers`."""

    index: int


class Placement(Protocol):
    def worker_for(self, topic_name: bytes, partition: int) -> OtherWorker | None:
        """The other worker serving the partition a command names (-1: the topic's default
        partition); None when this process answers it (also for a name that is not valid:
        the handler refuses it)."""

    def refusal(self, topic: "Topic", operation: Operation) -> str | None:
        """The error for `operation` on a partition this process holds; None when this node
        serves it."""

    def refuses_to_create(self, topic_name: str) -> bool:
        """Whether a client's command may not create the (classic) topic here."""

    def partitions_here(self, topic_name: str, numbers: Iterable[int]) -> list[int]:
        """Those of a topic's partitions `numbers` that this process holds."""


class SingleNodePlacement:
    """An nsqd alone: every topic is served here; only `/disable/write` refuses publishes
    (Youzan answers it as it answers a node that does not lead, docs/protocol.md §3.3)."""

    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd

    def worker_for(self, topic_name: bytes, partition: int) -> OtherWorker | None:
        return None

    def refusal(self, topic: "Topic", operation: Operation) -> str | None:
        if operation is Operation.PUBLISH and self.nsqd.write_disabled_for(topic):
            return NOT_LEADER
        return None

    def refuses_to_create(self, topic_name: str) -> bool:
        return False

    def partitions_here(self, topic_name: str, numbers: Iterable[int]) -> list[int]:
        return list(numbers)


class ClusterPlacement(SingleNodePlacement):
    """A cluster node: a partition's leader serves it (a follower refuses, its clients look the
    leader up again), and publishes only while the leader can replicate them."""

    def __init__(self, nsqd: "NSQD", node: "ClusterNode") -> None:
        super().__init__(nsqd)
        self.node = node

    def refusal(self, topic: "Topic", operation: Operation) -> str | None:
        if operation is Operation.PUBLISH:
            return super().refusal(topic, operation) or topic.replication.refusal()
        return NOT_LEADER if topic.is_cluster_follower else None

    def refuses_to_create(self, topic_name: str) -> bool:
        return self.node.refuses_to_create(topic_name)


class WorkerPlacement:
    """One of `--workers`: a topic's partitions go round the workers from the one its name
    hashes to (`nsqd/worker.py`), so partition 0, where a classic command and a topic's
    default partition lead, is the name's; this worker's own partitions are placed by
    `within`."""

    def __init__(self, worker: "Worker", within: Placement) -> None:
        self.worker = worker
        self.within = within

    def worker_for(self, topic_name: bytes, partition: int) -> OtherWorker | None:
        try:
            name = topic_name.decode()
        except UnicodeDecodeError:
            return None
        if not is_valid_name(name):
            return None
        owner = self.worker.owner(name, partition)  # a hash of the name: once per command
        return None if owner == self.worker.index else OtherWorker(owner)

    def refusal(self, topic: "Topic", operation: Operation) -> str | None:
        return self.within.refusal(topic, operation)

    def refuses_to_create(self, topic_name: str) -> bool:
        return self.within.refuses_to_create(topic_name)

    def partitions_here(self, topic_name: str, numbers: Iterable[int]) -> list[int]:
        return [
            number
            for number in self.within.partitions_here(topic_name, numbers)
            if self.worker.owns(topic_name, number)
        ]


def placement_for(nsqd: "NSQD") -> Placement:
    """The placement an nsqd's options call for."""
    inner: Placement = (
        ClusterPlacement(nsqd, nsqd.cluster) if nsqd.cluster.enabled else SingleNodePlacement(nsqd)
    )
    return inner if nsqd.worker is None else WorkerPlacement(nsqd.worker, inner)

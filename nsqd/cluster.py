"""nsqd as a node of a cluster (docs/design.md §14): partition replicas, their replication and
catch-up. Off unless `--cluster-leadership-addresses` names etcd.

Each partition of a cluster topic has a `ReplicaInfo` (`common/cluster_meta.py`): a leader, the
in-sync replicas (ISR, the leader included), nodes catching up, and the write epoch. The master
nsqlookupd writes it to etcd; this node follows it (`ClusterSession` watches the keys) and
`apply` makes the local partition what the info says:

* **Leader**: it takes publishes and consumers and registers the partition with nsqlookupd.
  Its log writer sends every written group to each ISR follower, side by side, and a publish
  is answered once all of them have it (`replicate`); readers see a group only then. A
  follower that keeps failing is reported to the master, which drops it from the ISR; the
  write succeeds if the ISR left is still a majority of the replicas, else it is rolled back
  and refused (`E_FAILED_ON_NOT_WRITABLE`). A follower that says the leader is stale deposes
  it (`E_FAILED_ON_NOT_LEADER`).
* **Follower**: it refuses publishes and consumers (`E_FAILED_ON_NOT_LEADER`) and stays out
  of nsqlookupd; it writes the groups its leader sends if they carry the partition's write
  epoch and the leader's ID (fencing: a deposed leader cannot write) and start at its end.
  When that is not so, or its leader changed, it catches up: it finds where its log and the
  leader's part (`MATCH`), cuts its own back there, and pulls the rest (`PULL`). A node on
  the catch-up list then asks the master to join the ISR.
* **Cursors**: the leader sends its channels' confirmed positions to its followers every
  `--sync-timeout`, so a new leader resumes consumption close to where the old one was:
  redelivery is possible, loss is not.
"""

import logging
import os
import sqlite3
import struct
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from nsqpy import network
from nsqpy.common.cluster_meta import (
    ClusterKeys,
    NodeInfo,
    ReplicaInfo,
    TopicMeta,
    node_id,
    rpc_address,
)
from nsqpy.common.names import cluster_topic_problem, is_valid_name
from nsqpy.common.replication import (
    CURSORS,
    ERROR,
    JOIN,
    MATCH,
    OP_NAMES,
    PULL,
    PUT,
    REPLY,
    START,
    ReplicaRefusal,
    encode_frame,
    error_header,
)
from nsqpy.daemon.net import open_listener
from nsqpy.nsqd.backend import write_error
from nsqpy.nsqd.catch_up import PULL_MAX_BYTES, PULL_MAX_ENTRIES, CatchUps
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.data_path import CLEAN_STOP_FILE, data_incarnation, stored_incarnation
from nsqpy.nsqd.delay_queue import DelayedRecord
from nsqpy.nsqd.log_writer import LogWriter, WriteRefused
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.message_queue import LogTopicQueue
from nsqpy.nsqd.partition_replica import UNKNOWN_REPLICA, PartitionReplica
from nsqpy.nsqd.peer_link import PeerLink, PeerUnavailable
from nsqpy.nsqd.peer_server import PeerServer
from nsqpy.nsqd.tls import cluster_contexts
from nsqpy.partition_log import PartitionLog, Position
from nsqpy.partition_log.files import partitions_on_disk
from nsqpy.partition_log.index import IndexEntry, entry_end
from nsqpy.partition_log.segments import read_pieces
from nsqpy.partition_log.view import group_fault

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.cluster_session import ClusterSession
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic

logger = logging.getLogger("nsqd")

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
# Channel cursors moved by FINs reach the followers at most this long after the previous push
# (plus the push's round trip): what a failover redelivers beyond the messages in flight.
CURSOR_PUSH_INTERVAL = 0.005
# A leader whose disk refuses writes asks to hand its partition over again after this.
RESIGN_RETRY_INTERVAL = 2.0
# How long a stopping node waits for the master to move its partitions off it.
LEAVE_TIMEOUT = 2.0
# How long a leader may hold its writes to admit a follower into the ISR.
ADMISSION_TIMEOUT = 10.0
# A peer's request this node cannot serve is logged again at most this often.
REPEATED_REFUSAL_INTERVAL = 30.0
# A follower that does not answer a push within this long misses it (the next one repeats it):
# one stalled follower must not hold back the pushes to the others for long.
CURSOR_PUSH_TIMEOUT = 1.0


class MasterRefusal(ValueError):
    """The master nsqlookupd answered a request with an error: it did not do it."""


class NotLedHere(Exception):
    """A client's command names a topic this cluster node does not hold and may not create:
    its publishers and consumers look it up again (`E_FAILED_ON_NOT_LEADER`)."""


class ClusterMetadataError(ValueError):
    """Metadata from etcd that this node cannot apply to a partition (it logs it and serves the
    others)."""


def _replica_of(topic: "Topic") -> PartitionReplica | None:
    """The partition's cluster replication; None when it is not a cluster's."""
    replication = topic.replication
    return replication if isinstance(replication, PartitionReplica) else None


def _held(topic: "Topic") -> PartitionReplica:
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


def _hold(node: "ClusterNode", topic: "Topic", info: ReplicaInfo) -> PartitionReplica:
    """Make `info` what this node knows of the partition's replicas."""
    replica = _replica_of(topic)
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


def _log_queue(topic: "Topic") -> LogTopicQueue:
    """A cluster partition is a log topic (docs/design.md §14): replication is of its log."""
    queue = topic.queue
    if not isinstance(queue, LogTopicQueue):
        raise ClusterMetadataError(
            f"{topic.name}/{topic.partition} is not stored as a log here: it cannot be replicated"
        )
    return queue


def _delayed_snapshot(topic: "Topic") -> tuple[dict | None, bytes]:
    """The delayed messages of the partition's delay queue whose records are before the
    log's end: per channel how many (the header) and their IDs (8 bytes each, the payload);
    None when the index cannot be read (the follower then keeps what it copied)."""
    before = _log(topic).written.offset
    queue = _log_queue(topic).delay_queue
    if queue.closed:
        return None, b""
    try:
        held = queue.entries_before(before)
    except sqlite3.Error:
        return None, b""
    counts = [[channel, len(ids)] for channel, ids in held.items()]
    ids = [message_id for channel_ids in held.values() for message_id in channel_ids]
    return {"before": before, "channels": counts}, struct.pack(f">{len(ids)}q", *ids)


def _cursor(channel: "Channel") -> CursorQueue:
    """A log topic's channel is a cursor into the partition's log."""
    queue = channel.queue
    if not isinstance(queue, CursorQueue):
        raise ClusterMetadataError(f"channel {channel.name} is not a cursor into a log")
    return queue


def _log(topic: "Topic") -> PartitionLog[Message]:
    return _log_queue(topic).log


def _writer(topic: "Topic") -> LogWriter:
    return _log_queue(topic).writer


def _refused(reached: set[str], code: str, text: str) -> "ClusterWriteError":
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


# How often a partition this node should be catching up for is checked for a catch-up.
CATCH_UP_WATCH_INTERVAL = 1.0


def rpc_listen_address(options: "Options") -> str:
    """The replication listener's address `--rpc-port` names (`host:port`; without a host,
    the broadcast address's)."""
    host, _, port = options.rpc_port.rpartition(":")
    host = host.strip("[]") or options.broadcast_address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def open_rpc_listeners(options: "Options") -> list[trio.SocketListener]:
    """The replication listeners on sockets (the `--workers` supervisor binds them)."""
    return [await open_listener(rpc_listen_address(options))]


class ClusterNode:
    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd
        options = nsqd.options
        self.enabled = bool(options.cluster_leadership_addresses)
        self.keys = ClusterKeys(options.cluster_leadership_root_dir, options.cluster_id)
        self.node_id = ""
        self.rpc_port = 0
        self._links: dict[str, PeerLink] = {}
        self.nursery: trio.Nursery | None = None
        self.catch_ups = CatchUps(self)
        # Set once a clean stop asked the master to move this node off its partitions: it
        # joins no ISR from then on (caught up while it still serves, it would ask to).
        self.leaving = False
        # The node's incarnation: its data directory's identity (`nsqd/data_path.py`).
        self.incarnation = ""
        # The master nsqlookupd's HTTP address, as its leader session says.
        self.master_http: str | None = None
        self.session: ClusterSession | None = None
        # The replication links' mutual TLS (`--cluster-tls-*`), or None (plain TCP).
        self.server_tls, self.client_tls = cluster_contexts(options)
        # Partitions whose ordered channels' cursors moved: pushed to the followers at once.
        self._moved: set = set()
        self._moved_wakeup = trio.Event()
        self._refusals_logged: dict[tuple, float] = {}
        # The replication port's connections (`nsqd/peer_server.py`).
        self.peers = PeerServer(nsqd, self._answer, self.server_tls)

    # -- serving ---------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nsqd = self.nsqd
        options = nsqd.options
        # Partitions found on disk wait for the cluster to say who leads them.
        for topic in nsqd.all_partitions():
            if topic.partitioned and _replica_of(topic) is None:
                _hold(self, topic, UNKNOWN_REPLICA)
        worker = nsqd.worker
        listeners: list[trio.abc.Listener] = []
        if worker is not None:
            listeners.extend(worker.rpc_listeners())
        if not listeners:
            listeners.append(await network.current().listen(rpc_listen_address(options)))
        # The node's ID carries the port its peers connect to, which a proxy may front.
        self.rpc_port = options.broadcast_rpc_port or network.bound_address(listeners[0])[1]
        self.node_id = node_id(
            options.broadcast_address, self.rpc_port, nsqd.tcp_port, options.node_id
        )
        # A worker serves the listener its supervisor bound (and logged).
        listening = nsqd.log.info if worker is None else nsqd.log.debug
        listening("RPC: listening on %s", network.listening_on(listeners[0]))
        try:
            before = stored_incarnation(nsqd.data_path)
            # A worker's supervisor began the node's run (`nsqd/supervisor.py`).
            self.incarnation = data_incarnation(nsqd.data_path, starting=worker is None)
            if before is not None and self.incarnation != before:
                nsqd.log.warning(
                    "CLUSTER: the last stop was not clean (%s missing): this node is"
                    " incarnation %s now, and proves nothing it holds until it caught up",
                    CLEAN_STOP_FILE,
                    self.incarnation,
                )
        except OSError as error:
            # Unknown to every partition: this node holds nothing the ISR counts on until
            # it caught up and joined again, which is what a lost identity must mean.
            self.incarnation = os.urandom(16).hex()
            nsqd.log.error(
                "CLUSTER: cannot keep the data directory's identity (%s) - %s; this node is a new"
                " incarnation for every partition",
                nsqd.data_path,
                error,
            )
        if self.server_tls is None and self.enabled and (worker is None or worker.index == 0):
            nsqd.log.warning(
                "RPC: the replication links are not authenticated or encrypted: whoever reaches"
                " the rpc port can read and write the partitions' logs; give"
                " --cluster-tls-cert, --cluster-tls-key and --cluster-tls-root-ca-file"
                ' (docs/operations.md, "Securing a cluster")'
            )
        try:
            await self._serve_in_nursery(listeners, task_status)
        finally:
            # Closed: what fails from here (a write of the stop's last flush) starts nothing.
            self.nursery = None

    async def _serve_in_nursery(self, listeners: list, task_status) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(partial(trio.serve_listeners, self.peers.serve, listeners))
            nursery.start_soon(self._cursor_timer)
            nursery.start_soon(self._push_moved_cursors)
            nursery.start_soon(self._catch_up_watch)
            if self.enabled:
                # Not waited for: joining the cluster waits on etcd, and a SIGTERM must stop
                # the node even while etcd is away (docs/operations.md). Imported here: an
                # nsqd outside a cluster never loads the etcd session (a few MiB resident).
                from nsqpy.nsqd.cluster_session import ClusterSession

                self.session = ClusterSession(self)
                nursery.start_soon(self.session.run)
            self.peers.ready.set()
            task_status.started()

    async def leave(self) -> None:
        """A clean stop's first step (SIGTERM): the master hands over what this node leads to
        caught-up followers and drops it from the ISRs it follows, while it still serves, so
        its stop pauses no partition's writes for longer than a hand-over. Bounded by
        `LEAVE_TIMEOUT`: a master or etcd away lets the lease's revocation (or its end) do
        it instead, as for a node that dies."""
        self.leaving = True
        session = self.session
        if session is None or not any(
            (replica := _replica_of(topic)) is not None and self.node_id in replica.info.isr
            for topic in self.nsqd.all_partitions()
        ):
            return
        with trio.move_on_after(LEAVE_TIMEOUT) as waited:
            answer = await session.stopping()
        if waited.cancelled_caught or answer is None:
            self.nsqd.log.warning(
                "CLUSTER: the master did not hand this node's partitions over in %g s; its"
                " lease's revocation does",
                LEAVE_TIMEOUT,
            )
            return
        self.nsqd.log.info(
            "CLUSTER: leaving the cluster: %d leadership(s) handed over, %d ISR(s) left%s",
            len(answer.get("handed_over", [])),
            len(answer.get("left", [])),
            f"; kept: {answer['kept']}" if answer.get("kept") else "",
        )

    def control_plane(self) -> dict | None:
        """The `control_plane` object of `/stats`: what this node knows of etcd, the master
        and its own lease, and what is wrong now, since when (None outside a cluster, and
        until the node joined it)."""
        if self.session is None:
            return None
        view = self.session.health.to_json()
        view["node"] = self.node_id
        view["registered"] = bool(self.session.lease) and not self.session.health.lease_lost.holds
        return view

    def refuses_to_create(self, name: str) -> bool:
        """Whether a client's classic command may not create topic `name` here: in a cluster,
        a node creates a classic (single-node) topic only once it knows the cluster's topics,
        and only for a name that is none of them. The cluster's partitions come from its
        metadata, never from a client (a node started on an empty disk would otherwise make
        a diskqueue of a replicated topic's name before it hears of the topic)."""
        if not self.enabled:
            return False
        session = self.session
        return session is None or not session.loaded or name in session.metas

    def info(self) -> NodeInfo:
        nsqd = self.nsqd
        return NodeInfo(
            self.node_id,
            nsqd.options.broadcast_address,
            nsqd.tcp_port,
            nsqd.http_port,
            self.rpc_port,
            self.incarnation,
        )

    def link(self, node: str) -> PeerLink:
        link = self._links.get(node)
        if link is None:
            link = self._links[node] = PeerLink(rpc_address(node), ssl_context=self.client_tls)
        return link

    def describe(self, topic: "Topic") -> dict:
        """A cluster partition's replica state, for `/partition/offsets` and `/stats`."""
        info = _held(topic).info
        me = self.node_id
        if info.leader == me:
            role = "leader"
        elif me in info.isr:
            role = "follower"
        elif me in info.catchup:
            role = "catchup"
        else:
            role = "none"
        leader = info.leader.split(":")
        return {
            "role": role,
            "leader": f"{leader[0]}:{leader[2]}" if len(leader) == 4 else "",
            "leader_node": info.leader,
            "isr": list(info.isr),
            "catchup": list(info.catchup),
            "write_epoch": info.epoch_for_write,
            "writable": role == "leader" and _held(topic).writable and not _held(topic).lost,
            "catching_up": self.catch_ups.running(topic),
            # Whether this copy is the one the ISR counted on (not a replaced disk's).
            "incarnation": self.incarnation,
            "lost": _held(topic).lost,
            "catch_up": self.catch_ups.progress(topic),
            "disk_error": _held(topic).disk_error,
        }

    def unused_partitions(self, topic_names: list[str], partition: int) -> list[tuple[str, int]]:
        """Youzan's `/topic/cleanunused`: of the partitions of `topic_names` whose logs are on
        disk here (`partition` -1: all of them) and that this node does not serve, those the
        cluster's metadata gives to other nodes or no longer has; none before this node read
        the metadata (an unreachable etcd must not empty a disk). With `--workers`, each
        worker answers for the partitions it would own (every worker is asked)."""
        session = self.session
        if session is None or not session.loaded or not session.metas:
            return []
        unused = []
        me = self.node_id
        data_path = self.nsqd.data_path
        for name in topic_names:
            if not is_valid_name(name):
                continue
            for number in partitions_on_disk(data_path, name):
                if partition not in (-1, number) or self.nsqd.registry.get(name, number):
                    continue
                if not self.nsqd.placement.partitions_here(name, [number]):
                    continue
                info = session.infos.get((name, number))
                if name not in session.metas or info is None or not info.holds(me):
                    unused.append((name, number))
        return unused

    def coordinator_stats(self, topic_name: str, partition: int) -> dict:
        """Youzan's `/coordinator/stats`: the ISR and catch-up nodes of each partition of
        `topic_name` this node holds (`partition` -1: all of them; no topic: none), a node's
        own catch-up progress in percent of what its leader had when it started."""
        stats = []
        if topic_name:
            for topic in self.nsqd.registry.partitions(topic_name):
                if _replica_of(topic) is None or partition not in (-1, topic.partition):
                    continue
                info = _held(topic).info
                progress = self.catch_ups.progress(topic)
                stats.append(
                    {
                        "node": self.node_id,
                        "name": topic.name,
                        "partition": topic.partition,
                        "isr_stats": [{"hostname": "", "node_id": node} for node in info.isr],
                        "catchup_stats": [
                            {
                                "hostname": "",
                                "node_id": node,
                                "progress": _percent(progress) if node == self.node_id else 0,
                            }
                            for node in info.catchup
                        ],
                    }
                )
        return {"rpc_stats": None, "topic_coord_stats": stats}

    def log_of(self, topic: "Topic") -> PartitionLog[Message]:
        return _log(topic)

    def unsynced_logs(self) -> list[str]:
        """The held partitions whose log failed a sync in this run (a full or failing disk):
        writes they took may not be durable."""
        return [
            f"{topic.name}/{topic.partition}"
            for topic in self.nsqd.all_partitions()
            if _replica_of(topic) is not None and _log(topic).sync_error
        ]

    def index_copied(self, topic: "Topic", data: bytes, first: Position) -> None:
        """Groups a catch-up copied: their delayed records go into the delay queue."""
        _log_queue(topic).index_raw(data, first)

    def partition_reports(self) -> list[dict]:
        """Every cluster partition this node holds, as the master nsqlookupd reads them
        (`/cluster/partitions`) for leader health, hand-overs and load factors: its role and
        writability, its log's start and end, and how far its slowest channel is behind."""
        reports = []
        for topic in self.nsqd.all_partitions():
            replica = _replica_of(topic)
            if replica is None:
                continue
            queue = _log_queue(topic)
            log = queue.log
            confirmed = [cursor.confirmed.offset for cursor in queue.open_cursors()]
            entry = {
                "topic": topic.name,
                "partition": topic.partition,
                "start": list(log.start),
                "end": list(log.end),
                "channels": sorted(topic.channels),
                "channel_depth_bytes": log.end.offset - min(confirmed, default=log.end.offset),
                "handing_over": replica.handing_over,
            }
            entry.update(self.describe(topic))
            reports.append(entry)
        return reports

    # -- following the metadata --------------------------------------------------------------

    def apply(self, topic_name: str, partition: int, meta: TopicMeta, info: ReplicaInfo) -> None:
        """Make the local partition what `info` says this node is for it."""
        nsqd = self.nsqd
        me = self.node_id
        problem = cluster_topic_problem(topic_name)
        if problem is not None:
            raise ClusterMetadataError(problem)
        if partition < 0:
            raise ClusterMetadataError(f"partition {partition} is not a partition number")
        if not nsqd.placement.partitions_here(topic_name, [partition]):
            return  # another of this node's workers holds it
        topic = nsqd.registry.get(topic_name, partition)
        if not info.holds(me):
            if topic is not None and topic.replication.info is not None:
                if info.epoch < topic.replication.info.epoch:
                    return  # an older revision than the one applied
                # Moved off this node (a move, a node removal, a replacement): the replicas
                # that hold it now are the partition; this copy is of no more use.
                self._step_down(topic, info)
                self.forget(topic_name, partition, "no longer holds it")
            return
        if topic is not None and topic.replication.info is not None:
            kept = _log(topic).magic_code
            if meta.magic_code and kept and kept != meta.magic_code:
                # Deleted and created again while this node was away: what is on disk is the
                # old topic's, and the new one starts empty (Youzan's CheckMagicCode).
                self.forget(
                    topic_name,
                    partition,
                    f"it is of an earlier topic of that name: magic code {kept},"
                    f" the cluster's {meta.magic_code}",
                )
                topic = None
        if topic is None:
            topic = nsqd.create_partition(
                topic_name,
                partition,
                partitioned=True,
                ordered=meta.ordered_multi,
                ext=meta.ext,
                sync_every=meta.sync_every,
                replication=partial(PartitionReplica, self, info=info),
            )
        previous = topic.replication.info
        if previous is not None and info.epoch < previous.epoch:
            return  # an older revision than the one applied
        if meta.magic_code and _log(topic).magic_code != meta.magic_code:
            _log(topic).set_magic_code(meta.magic_code)
        self._take_meta(topic, meta)
        if info.leader != me and previous is not None and previous.leader == me:
            # Before `_hold`: stepping down tells a leader's consumers and nsqlookupd by what
            # the node held until now.
            self._step_down(topic, info)
        held = _replica_of(topic)
        was_lost = held is not None and held.lost
        _hold(self, topic, info)
        replica = _held(topic)
        replica.lost = me in info.isr and not info.proven(me, self.incarnation)
        if replica.lost and not was_lost:
            nsqd.log.error(
                "TOPIC(%s) partition %d: this node is in the ISR, but its data directory is a"
                " new incarnation (%s, the ISR counted on %s): it proves nothing it holds,"
                " leads nothing and counts for no write until it caught up and joined again",
                topic_name,
                partition,
                self.incarnation,
                info.incarnation_of(me),
            )
        _log_queue(topic).set_write_epoch(info.epoch_for_write)
        if info.leader == me and replica.lost:
            # The master elects a replica that holds the data, when one is alive.
            _log_queue(topic).stop_writes(
                ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", "this node lost the partition's data")
            )
            replica.writable = False
            replica.handing_over = False
            return
        if info.leader == me:
            was_leader = (
                previous is not None
                and previous.leader == me
                and not was_lost
                and not replica.stepped_down
            )
            replica.stepped_down = False
            self.settle_admissions(topic, info)
            _log_queue(topic).on_disk_state(partial(self._leader_disk_state, topic))
            _log_queue(topic).replicate_with(
                partial(self.replicate, topic) if info.followers() else None
            )
            _held(topic).writable = len(info.isr) > info.replica // 2
            _held(topic).handing_over = False
            # The channels the cluster gave the partition (an expansion copies the topic's).
            for name in info.channels:
                if name not in topic.channels and is_valid_name(name):
                    topic.get_channel(name)
            if not was_leader:
                nsqd.log.info(
                    "TOPIC(%s) partition %d: leader, write epoch %d, ISR %s",
                    topic_name,
                    partition,
                    info.epoch_for_write,
                    ",".join(info.isr),
                )
                nsqd.register_partition(topic)
                for channel in topic.channels.values():
                    channel.notify()
            return
        leader_changed = previous is None or previous.leader != info.leader
        _log_queue(topic).stop_writes(ClusterWriteError("E_FAILED_ON_NOT_LEADER", "not the leader"))
        _held(topic).writable = False
        _held(topic).handing_over = False
        replica.admitting.clear()
        _log_queue(topic).on_disk_state(None)
        if leader_changed or me in info.catchup or replica.lost:
            self.catch_ups.start(topic)

    def _take_meta(self, topic: "Topic", meta: TopicMeta) -> None:
        """The topic's settings that `/topic/meta/update` changes."""
        if meta.sync_every and meta.sync_every != topic.sync_every:
            topic.sync_every = meta.sync_every
            _log(topic).sync_every = max(1, meta.sync_every)
            self.nsqd.topology_changed(topic)
        topic.retention_days = meta.retention_day
        topic.channel_auto_create = not meta.disable_channel_auto_create

    def forget(self, topic_name: str, partition: int, why: str) -> None:
        """Delete the local copy of a partition the cluster no longer keeps here (moved away,
        or the topic deleted)."""
        topic = self.nsqd.registry.get(topic_name, partition)
        if topic is None or topic.replication.info is None:
            return
        self._step_down(topic, topic.replication.info)
        self.nsqd.log.info(
            "TOPIC(%s) partition %d: deleting the local replica (%s)", topic_name, partition, why
        )
        self.catch_ups.forget(topic)
        self.nsqd.delete_topic(topic_name, partition)

    def _step_down(self, topic: "Topic", info: ReplicaInfo) -> None:
        """This node no longer leads the partition: it stops taking writes (what it took and
        did not write yet is refused), leaves nsqlookupd's lists, and its consumers go (they
        look the new leader up)."""
        held = _replica_of(topic)
        was_leader = held is not None and held.is_leader
        _hold(self, topic, info)
        _log_queue(topic).stop_writes(
            ClusterWriteError("E_FAILED_ON_NOT_LEADER", "no longer the leader")
        )
        _held(topic).writable = False
        # Led no more, whatever the info it holds says (a follower deposed it before the
        # watch did): an info naming it leader makes it one again, from the start.
        _held(topic).stepped_down = True
        if was_leader:
            self.nsqd.log.info(
                "TOPIC(%s) partition %d: no longer the leader (now %s)",
                topic.name,
                topic.partition,
                info.leader or "none",
            )
            self.nsqd.unregister_partition(topic)
            for channel in topic.channels.values():
                for client in list(channel.clients.values()):
                    client.close_by_server()

    # -- leader: replicating ----------------------------------------------------------------

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
        replica = _held(topic)
        while True:
            info = replica.info
            if not replica.is_leader:
                raise _refused(reached, "E_FAILED_ON_NOT_LEADER", "no longer the leader")
            if len(info.isr) <= info.replica // 2:
                # The master dropped members meanwhile (or they left): no majority.
                raise _refused(
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
            channels = self._channel_positions(topic) if changed else None
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
        stale = [error for error in failed.values() if _is_stale_leader(error)]
        if stale:
            self.nsqd.log.error(
                "TOPIC(%s) partition %d: a follower refused this leader - %s",
                topic.name,
                topic.partition,
                stale[0],
            )
            self._step_down(topic, info)
            if self.session is not None:
                self.session.refresh(topic.name, topic.partition)
            raise ClusterWriteError("E_FAILED_ON_NOT_LEADER", str(stale[0]))
        remaining = [node for node in info.isr if node not in failed]
        reasons = "; ".join(f"{node}: {error}" for node, error in failed.items())
        if len(remaining) <= info.replica // 2 or self.session is None:
            self._stop_writes(topic, info, reasons)
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", f"replication failed: {reasons}")
        self.nsqd.log.warning(
            "TOPIC(%s) partition %d: asking the master to drop %s from the ISR - %s",
            topic.name,
            topic.partition,
            ",".join(failed),
            reasons,
        )
        updated = await self.session.leave_isr(topic.name, topic.partition, list(failed), info)
        if updated is None:
            self._stop_writes(topic, info, reasons)
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", f"replication failed: {reasons}")

    # -- leader: healing -------------------------------------------------------------------

    def _stop_writes(self, topic: "Topic", info: ReplicaInfo, reasons: str) -> None:
        """Replication failed with no majority left (or no master to ask): the partition
        takes no publish until its followers answer again (`_restore_writes`), which may be
        long after the network healed, so this node does not wait to be told."""
        if not _held(topic).writable:
            return
        _held(topic).writable = False
        self.nsqd.log.error(
            "TOPIC(%s) partition %d: not writable, replication failed - %s",
            topic.name,
            topic.partition,
            reasons,
        )
        if self.nursery is not None:
            self.nursery.start_soon(self.contained, self._restore_writes, topic, info)

    async def contained(
        self, task: Callable[..., Awaitable[None]], topic: "Topic", *args: Any
    ) -> None:
        """Run a partition's background task (a catch-up, restoring writes, ending a handover,
        resigning); an unexpected error is logged and costs that task, never the node and
        every other partition."""
        try:
            await task(topic, *args)
        except Exception:
            self.nsqd.log.exception(
                "TOPIC(%s) partition %d: internal error in %s",
                topic.name,
                topic.partition,
                task.__name__.lstrip("_").replace("_", " "),
            )

    async def _restore_writes(self, topic: "Topic", info: ReplicaInfo) -> None:
        """Probe the ISR followers until every one is at this leader's end again, then take
        writes again. Meanwhile: a majority that answers drops the rest from the ISR (through
        the master), and after `UNWRITABLE_REPORT_AFTER` the master is told, which may give
        the partition to a follower (one that its peers can reach, when this node cannot)."""
        started = trio.current_time()
        reported = False
        delay = HEAL_PROBE_DELAY
        while not topic.deleted and topic.replication.info is info and not _held(topic).writable:
            in_sync = await self._probe_followers(topic, info)
            if topic.replication.info is not info or _held(topic).writable:
                return  # the info changed meanwhile (`apply` decided), or another probe won
            lagging = [node for node in info.followers() if node not in in_sync]
            if not lagging:
                _held(topic).writable = True
                self.nsqd.log.info(
                    "TOPIC(%s) partition %d: every ISR follower is at this leader's end again;"
                    " writable",
                    topic.name,
                    topic.partition,
                )
                return
            session = self.session
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
        await _writer(topic).drain()
        in_sync: set[str] = set()

        async def probe(follower: str) -> None:
            sent = {}

            def header() -> dict:
                sent.update(self._cursors_header(topic, info, end=True))
                return sent

            try:
                reply = await self.link(follower).request(
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
        if info is not None and to not in info.followers() and self.session is not None:
            # The master may have seen `to` join the ISR before this node's watch did.
            await self.session.reload(topic.name, topic.partition)
            info = topic.replication.info
        if info is None:
            raise ClusterWriteError("E_NOT_CLUSTER", "the partition is not a cluster's")
        if info.leader != self.node_id:
            raise ClusterWriteError("E_FAILED_ON_NOT_LEADER", "not the leader")
        if to not in info.followers():
            raise ClusterWriteError("E_NOT_IN_ISR", f"{to} is not an ISR follower")
        if not _held(topic).writable:
            raise ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", "not writable")
        _held(topic).handing_over = True
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
            _held(topic).handing_over = False
            raise
        if self.nursery is not None:
            self.nursery.start_soon(self.contained, self._end_handover, topic, info)
        return _log(topic).written

    async def _end_handover(self, topic: "Topic", info: ReplicaInfo) -> None:
        await trio.sleep(HANDOVER_TIMEOUT)
        if topic.replication.info is info and _held(topic).handing_over:
            _held(topic).handing_over = False
            self.nsqd.log.warning(
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
        link = self.link(follower)
        header = self._leader_header(topic, info)
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
        replica = _held(topic)
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
                if _is_stale_leader(error) or trio.current_time() >= deadline:
                    failed[follower] = error
                    return
                if isinstance(error, ReplicaRefusal) and error.code == "E_STALE_EPOCH":
                    if self.session is not None:
                        await self.session.reload(topic.name, topic.partition)
                    current = topic.replication.info
                    if current is None or current.leader != self.node_id:
                        failed[follower] = error
                        return
                    header["epoch"] = current.epoch_for_write
                attempt += 1
                await trio.sleep(min(0.2, (2 << attempt) / 1000))

    # -- leader: admitting a follower into the ISR ------------------------------------------

    async def _admit(self, topic: "Topic", header: dict) -> tuple[dict, bytes]:
        """A follower on the catch-up list, caught up, asks to join the ISR (`JOIN`): with no
        group acknowledged meanwhile, give it what this leader wrote since its `end`, count
        it for every write from then on, and have the master add it with the next write
        epoch. The answer is the info that holds it, and the delayed messages this leader
        holds (`_delayed_snapshot`)."""
        node, incarnation = str(header["node"]), str(header.get("incarnation") or "")
        end = Position(*(int(value) for value in header["end"]))
        last = tuple(int(value) for value in header["last"]) if header.get("last") else None
        replica = _held(topic)
        info = replica.info
        if node not in info.catchup and node not in info.isr and self.session is not None:
            # The master may have put it there before this node's watch said so.
            await self.session.reload(topic.name, topic.partition)
            info = replica.info
        _refuse_unless_leading(topic)
        if node in info.isr and info.proven(node, incarnation):
            return {"info": info.to_json().decode(), "epoch": info.epoch}, b""
        if node not in info.catchup:
            raise ReplicaRefusal(
                error_header("E_NOT_CATCHUP", f"{node} is not on the partition's catch-up list")
            )
        session = self.session
        if session is None:
            raise ReplicaRefusal(error_header("E_NOT_CLUSTER", "no cluster to join"))
        writer = _writer(topic)
        log = _log(topic)
        try:
            with trio.fail_after(ADMISSION_TIMEOUT):
                async with writer.exclusive():
                    joined = await self._admit_exclusively(topic, node, incarnation, end, last)
                    # Taken once this node's info holds the follower (every cursor push from
                    # now on reaches it) and before the next write (what it holds past
                    # `before` came with the writes it was sent).
                    delayed, held_ids = _delayed_snapshot(topic)
        except trio.TooSlowError:
            raise ReplicaRefusal(
                error_header("E_TIMEOUT", f"no admission within {ADMISSION_TIMEOUT:g} s")
            ) from None
        self.nsqd.log.info(
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
        replica = _held(topic)
        session = self.session
        if session is None:
            raise ReplicaRefusal(error_header("E_NOT_CLUSTER", "no cluster to join"))
        log = _log(topic)
        info = replica.info
        _refuse_unless_leading(topic)
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
        log = _log(topic)
        link = self.link(node)
        header = {**self._leader_header(topic, info), "admit": True}
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
        admitting = _held(topic).admitting
        for node, epoch in list(admitting.items()):
            if node in info.isr or info.epoch > epoch:
                del admitting[node]

    # -- the disk ---------------------------------------------------------------------------

    def disk_failed(self, topic: "Topic", error: OSError) -> None:
        """A write of this node's copy failed: `/ping` says so until one works again."""
        replica = _held(topic)
        text = str(error)
        if replica.disk_error != text:
            self.nsqd.log.error(
                "TOPIC(%s) partition %d: the disk refused a write - %s",
                topic.name,
                topic.partition,
                text,
            )
        replica.disk_error = text
        self.nsqd.storage.health.write_done(
            write_error(_log(topic), error, _log(topic).active_segment_path)
        )

    def _leader_disk_state(self, topic: "Topic", error: OSError | None) -> None:
        """The disk refused a write of a partition this node leads: its publishes are
        refused while it does, so the partition goes to a follower that can write (a planned
        hand-over the master runs), and this node catches up once space returns. None: it
        took one again."""
        replica = _held(topic)
        if error is None:
            replica.disk_error = ""
            return
        replica.disk_error = str(error)
        if self.nursery is not None and self.session is not None and not replica.resigning:
            replica.resigning = True
            self.nursery.start_soon(self.contained, self._resign, topic)

    async def _resign(self, topic: "Topic") -> None:
        replica = _held(topic)
        session = self.session
        try:
            while session is not None and replica.is_leader and replica.disk_error:
                self.nsqd.log.warning(
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

    def disk_recovered(self, topic: "Topic") -> None:
        replica = _held(topic)
        if replica.disk_error:
            replica.disk_error = ""
            self.nsqd.storage.health.write_done(None)

    def log_started_over(self, topic: "Topic") -> None:
        """The partition's log started over at its leader's start (`CatchUps`): the channels'
        cursors stand there until the leader's positions come."""
        log = _log(topic)
        for channel in topic.channels.values():
            cursor = _cursor(channel)
            if cursor.confirmed != log.start:
                cursor.set_position(log.start)

    # -- leader: answering followers --------------------------------------------------------

    def _answer_match(self, topic: "Topic", header: dict) -> dict:
        # Only the leader's log is one a follower may cut its own back to: a node back on an
        # empty disk that the info still names (it leads nothing) would walk a follower's
        # log, which may hold the only copy of what was acknowledged, back to nothing.
        _refuse_unless_leading(topic)
        log = _log(topic)
        matched = False
        if header.get("entry"):
            entry = tuple(int(value) for value in header["entry"])
            if len(entry) != 7:
                raise ValueError(f"an index entry has 7 fields, not {len(entry)}")
            end = Position(entry[3] + entry[4], entry[5] - 1 + entry[6])
            matched = end.offset <= log.written.offset and log.entry_ending_at(end) == entry
        return {"match": matched, "start": list(log.start), "end": list(log.written)}

    def _answer_start(self, topic: "Topic") -> tuple[dict, bytes]:
        """Where this log starts, for a follower that starts over there (`CatchUps`)."""
        _refuse_unless_leading(topic)
        log = _log(topic)
        snapshots = log.snapshot_files()
        boundary = log.entry_ending_at(log.start) if log.start.offset else None
        answer = {
            "start": list(log.start),
            "segment": log.first_segment_number,
            "boundary": list(boundary) if boundary is not None else None,
            "snapshots": [[offset, len(data)] for offset, data in sorted(snapshots.items())],
        }
        return answer, b"".join(data for _offset, data in sorted(snapshots.items()))

    def _leader_header(self, topic: "Topic", info: ReplicaInfo) -> dict:
        """What every request of a leader to its followers says of the partition."""
        return {
            "topic": topic.name,
            "partition": topic.partition,
            "leader": self.node_id,
            "epoch": info.epoch_for_write,
        }

    def _channel_positions(self, topic: "Topic") -> dict[str, list[int]]:
        """Each channel's confirmed position, `[offset, count]`, and its controls after them
        when it has any (`Channel.controls`: skipped, in order, rate and consumer limits)."""
        return {
            name: [*_cursor(channel).confirmed, *channel.controls]
            for name, channel in topic.channels.items()
            if not channel.ephemeral
        }

    def _channel_ranges(self, topic: "Topic") -> dict[str, list[list[int]]]:
        """Each channel's ranges acknowledged beyond its confirmed position: a new leader
        does not deliver them again."""
        ranges = {}
        for name, channel in topic.channels.items():
            if not channel.ephemeral:
                acknowledged = _cursor(channel).acknowledged_ranges()
                if acknowledged:
                    ranges[name] = acknowledged
        return ranges

    def _channel_deferrals(self, topic: "Topic") -> dict[str, dict[str, float]]:
        """Each channel's deferred messages (REQ with a delay, DPUBs not read yet) by offset,
        with their due times: a new leader holds them until then too."""
        deferrals = {}
        for name, channel in topic.channels.items():
            if not channel.ephemeral:
                dues = _cursor(channel).deferred_dues()
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
        if info is None or not info.followers() or not _held(topic).is_leader:
            return
        version = topic.channels_version
        emptied: dict[CursorQueue, int] = {}
        for channel in topic.channels.values():
            cursor = _cursor(channel)
            if cursor.finished_delayed is None:
                cursor.finished_delayed = []  # kept from now on, for the followers
            if cursor.emptied_delayed_below is not None:
                emptied[cursor] = cursor.emptied_delayed_below
        # The delayed messages finished that each follower's header named (it is made as the
        # request goes on the link, so it may name more than were finished now): forgotten
        # here once every follower has them. Another push may run meanwhile and finish first.
        told: list[dict[str, list[str]]] = []

        def header() -> dict:
            made = self._cursors_header(topic, info)
            told.append(made.get("delayed_done", {}))
            return made

        failed = False

        async def push(follower: str) -> None:
            nonlocal failed
            try:
                await self.link(follower).request(CURSORS, header, timeout=CURSOR_PUSH_TIMEOUT)
            except (PeerUnavailable, ReplicaRefusal) as error:
                failed = True
                self.nsqd.log.warning(
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
                cursor = _cursor(channel)
                if cursor.finished_delayed:
                    cursor.finished_delayed = untold_finished(
                        cursor.finished_delayed, [named.get(name, ()) for named in told]
                    )
            for cursor, below in emptied.items():
                if cursor.emptied_delayed_below == below:
                    cursor.emptied_delayed_below = None

    def _cursors_header(self, topic: "Topic", info: ReplicaInfo, *, end: bool = False) -> dict:
        """A CURSORS request's header, made as it goes on the link (after every group sent
        before it): the channels' positions and deferred messages, and, while no group is
        being written or replicated (or with `end`), the log's end and its last index entry:
        a follower that has more holds groups the leader cut back, and cuts them too. (Made
        any earlier, it could name an end that a group acknowledged since has passed.)"""
        header = {**self._leader_header(topic, info), "channels": self._channel_positions(topic)}
        deferred = self._channel_deferrals(topic)
        if deferred:
            header["deferred"] = deferred
        acknowledged = self._channel_ranges(topic)
        if acknowledged:
            header["acked"] = acknowledged
        finished = {
            name: [message_id.decode() for message_id in done]
            for name, channel in topic.channels.items()
            if not channel.ephemeral and (done := _cursor(channel).finished_delayed)
        }
        if finished:
            # The delayed messages finished since the followers last heard: a new leader does
            # not give them out again.
            header["delayed_done"] = finished
        emptied = {
            name: below
            for name, channel in topic.channels.items()
            if not channel.ephemeral and (below := _cursor(channel).emptied_delayed_below)
        }
        if emptied:
            header["delayed_emptied"] = emptied
        log = _log(topic)
        if end or (_writer(topic).idle and log.written.offset > log.start.offset):
            header["end"] = list(log.written)
            header["last"] = list(log.entry_ending_at(log.written) or ())
        return header

    async def copy_of_group(self, topic: "Topic", entry: IndexEntry) -> bytes | None:
        """Another replica's stored bytes of a group this node's copy of which is corrupt
        (`/topic/fixdata`): asked of the leader and the ISR's other members in turn, taken
        from the first whose index holds the same entry and whose bytes hold its records."""
        replica = _replica_of(topic)
        info = replica.info if replica is not None else None
        if info is None:
            return None
        peers = [info.leader, *info.isr]
        for peer in dict.fromkeys(node for node in peers if node not in ("", "?", self.node_id)):
            try:
                reply = await self.link(peer).request(
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
                self.nsqd.log.warning(
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

    async def _answer_pull(self, topic: "Topic", header: dict) -> tuple[dict, bytes]:
        log = _log(topic)
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
            "channels": self._channel_positions(topic),
        }
        # Read in a worker thread: megabytes for a catching-up follower must not hold up
        # this leader's publishes (`python -m bench.catch_up`).
        pieces = log.group_reads(entries)
        return answer, await network.current().run_sync(read_pieces, pieces)

    # -- follower: taking writes ------------------------------------------------------------

    async def _on_put(self, topic: "Topic", header: dict, payload: bytes) -> dict:
        info = _held(topic).info
        leader, epoch = header.get("leader"), int(header.get("epoch", -1))
        if epoch > info.epoch_for_write and self.session is not None:
            # The leader knows a newer epoch than this node has seen: read it first.
            await self.session.reload(topic.name, topic.partition)
            info = _held(topic).info
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
        replica = _held(topic)
        # A joining follower takes the groups of the leader admitting it, and only then.
        admitted = bool(header.get("admit")) and self.catch_ups.joining(topic, str(leader))
        if self.catch_ups.running(topic) and not admitted:
            raise ReplicaRefusal(error_header("E_CATCHING_UP", "catching up with the leader"))
        if replica.lost:
            raise ReplicaRefusal(
                error_header("E_CATCHING_UP", "this node's copy is a new incarnation's")
            )
        entry = tuple(int(value) for value in header["entry"])
        if len(entry) != 7:
            raise ValueError(f"an index entry has 7 fields, not {len(entry)}")
        log = _log(topic)
        if "channels" in header:
            self.take_channels(topic, header["channels"], move=False)
        try:
            log.append_raw(entry, payload)
        except ValueError as error:
            end = Position(entry[3] + entry[4], entry[5] - 1 + entry[6])
            if end.offset <= log.written.offset and log.entry_ending_at(end) == entry:
                return {"end": list(log.written), "duplicate": True}
            if not admitted:
                self.catch_ups.start(topic)
            raise ReplicaRefusal(
                error_header("E_LOG_MISMATCH", str(error), end=list(log.written))
            ) from None
        except OSError as error:
            self.disk_failed(topic, error)
            raise ReplicaRefusal(error_header("E_WRITE_FAILED", str(error))) from None
        self.disk_recovered(topic)
        topic.replicated(entry[6], len(payload))
        if "delays" in header:
            _log_queue(topic).index_delayed(
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
            dropped = _log_queue(topic).delay_queue.keep_only(held, before)
        except sqlite3.Error as error:
            # Left as they are: the next catch-up (a new incarnation's, or after a failover)
            # reconciles again; nothing of this node stops over it.
            self.nsqd.log.error(
                "TOPIC(%s) partition %d: the delayed messages the leader finished could not be"
                " dropped - %s",
                topic.name,
                topic.partition,
                error,
            )
            return
        if dropped:
            self.nsqd.log.info(
                "TOPIC(%s) partition %d: %d delayed messages the leader finished dropped",
                topic.name,
                topic.partition,
                dropped,
            )
            self.sync_soon(topic)

    def sync_soon(self, topic: "Topic") -> None:
        if self.nursery is not None:
            _writer(topic).sync_soon(self.nursery)

    def _on_cursors(self, topic: "Topic", header: dict) -> dict:
        info = _held(topic).info
        if header.get("leader") != info.leader:
            raise ReplicaRefusal(error_header("E_FAILED_ON_NOT_LEADER", "not my leader"))
        self.take_channels(topic, header.get("channels", {}), move=True)
        acknowledged = header.get("acked") or {}
        for name, held in topic.channels.items():
            if not held.ephemeral:
                _cursor(held).take_acknowledged_ranges(acknowledged.get(name, ()))
        for name, below in (header.get("delayed_emptied") or {}).items():
            held_channel = topic.channels.get(name)
            if held_channel is not None:
                _cursor(held_channel).take_emptied_delayed(int(below))
        for name, message_ids in (header.get("delayed_done") or {}).items():
            held_channel = topic.channels.get(name)
            if held_channel is not None:
                _cursor(held_channel).take_finished_delayed(
                    [str(message_id).encode() for message_id in message_ids]
                )
        for name, dues in (header.get("deferred") or {}).items():
            channel = topic.channels.get(name)
            if channel is not None:
                queue = _cursor(channel)
                floor = queue.confirmed.offset
                # What the channel confirmed past no longer waits; the rest is the leader's.
                kept = {offset: due for offset, due in queue.delays.items() if offset >= floor}
                kept.update((int(offset), float(due)) for offset, due in dues.items())
                queue.delays = kept
        if "end" in header:
            self._check_end(topic, Position(*header["end"]), tuple(header.get("last") or ()))
        return {
            "end": list(_log(topic).written),
            "catching_up": self.catch_ups.running(topic),
        }

    def _check_end(self, topic: "Topic", end: Position, last: tuple) -> None:
        """The leader, idle, ends at `end` with index entry `last`: cut what lies past it
        (a group the leader rolled back), or catch up when behind or apart."""
        if self.catch_ups.running(topic):
            return
        log = _log(topic)
        if log.written == end:
            return
        if log.written.offset > end.offset and last and log.entry_ending_at(end) == last:
            self.nsqd.log.warning(
                "TOPIC(%s) partition %d: cutting back groups the leader does not have",
                topic.name,
                topic.partition,
            )
            log.truncate_to(end)
            return
        self.catch_ups.start(topic)

    def take_channels(self, topic: "Topic", channels: dict, *, move: bool) -> None:
        """A follower takes its leader's channels: missing ones are created where the
        leader's are; with `move`, existing ones move to the leader's confirmed position."""
        log = _log(topic)
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
            if _cursor(channel).confirmed != position:
                _cursor(channel).set_position(position)

    # -- cursors ------------------------------------------------------------------------------

    async def _cursor_timer(self) -> None:
        while True:
            await trio.sleep(self.nsqd.options.sync_timeout)
            await self.send_cursors()

    async def _catch_up_watch(self) -> None:
        """Every second, a catch-up for each partition the cluster lists this node as catching
        up for while none runs: the metadata starts one when it lists the node, and this makes
        sure a catch-up that ended early (its info changing under it, an answer for a copy
        deleted and made again) is not the partition's last."""
        while True:
            await trio.sleep(CATCH_UP_WATCH_INTERVAL)
            me = self.node_id
            for topic in self.nsqd.all_partitions():
                info = topic.replication.info
                if (
                    info is not None
                    and me in info.catchup
                    and info.leader not in ("", "?", me)
                    and not topic.deleted
                ):
                    self.catch_ups.start(topic)  # nothing when one runs

    def cursor_moved(self, topic: "Topic") -> None:
        """A channel's cursor moved (a FIN), or a channel deferred a message (REQ with a
        delay): the followers learn it at once, not at the next `--sync-timeout`, so a new
        leader repeats little more than the messages in flight, and holds deferred ones until
        due. Pushes are coalesced: the moves of one round trip go in one push."""
        self._moved.add(topic)
        self._moved_wakeup.set()

    async def _push_moved_cursors(self) -> None:
        while True:
            await self._moved_wakeup.wait()
            self._moved_wakeup = trio.Event()
            moved, self._moved = self._moved, set()
            for topic in moved:
                if not topic.deleted:
                    await self.push_channels(topic)
            # The FINs of the next few milliseconds share one push: a consumer finishing
            # tens of thousands of messages a second costs a push per interval, not per FIN.
            await trio.sleep(CURSOR_PUSH_INTERVAL)

    async def send_cursors(self) -> None:
        """Each led partition's channels' confirmed positions, to its followers."""
        for topic in self.nsqd.all_partitions():
            await self.push_channels(topic)

    # -- the replication port ------------------------------------------------------------------

    async def _answer(self, frame) -> bytes:
        header = frame.header
        topic = None
        try:
            topic = self.nsqd.registry.get(str(header.get("topic")), int(header.get("partition")))
            if topic is None or _replica_of(topic) is None:
                raise ReplicaRefusal(error_header("E_TOPIC_NOT_EXIST", "no such partition here"))
            if frame.op == PUT:
                return encode_frame(REPLY, await self._on_put(topic, header, frame.payload))
            if frame.op == CURSORS:
                return encode_frame(REPLY, self._on_cursors(topic, header))
            if frame.op == MATCH:
                return encode_frame(REPLY, self._answer_match(topic, header))
            if frame.op == PULL:
                answer, data = await self._answer_pull(topic, header)
                return encode_frame(REPLY, answer, data)
            if frame.op == START:
                answer, data = self._answer_start(topic)
                return encode_frame(REPLY, answer, data)
            if frame.op == JOIN:
                answer, data = await self._admit(topic, header)
                return encode_frame(REPLY, answer, data)
            raise ReplicaRefusal(error_header("E_INVALID", f"op {frame.op}"))
        except ReplicaRefusal as refusal:
            if frame.op in (PULL, START, JOIN):
                self._refused_peer(frame.op, topic, refusal.code, refusal.text)
            return encode_frame(ERROR, refusal.details)
        except (ValueError, TypeError, KeyError) as error:
            self._refused_peer(frame.op, topic, "E_INVALID", str(error))
            return encode_frame(ERROR, error_header("E_INVALID", str(error)))
        except OSError as error:
            # A disk that fails a read (or a write) is the peer's to know, and this node's.
            self._refused_peer(frame.op, topic, "E_IO", str(error))
            return encode_frame(ERROR, error_header("E_IO", str(error)))
        except Exception as error:
            # A bug must cost one request, never the peer's connection without a word.
            self.nsqd.log.exception("RPC: internal error answering %s", OP_NAMES.get(frame.op))
            return encode_frame(
                ERROR, error_header("E_INTERNAL", f"{type(error).__name__}: {error}")
            )

    def _refused_peer(self, op: int, topic: "Topic | None", code: str, text: str) -> None:
        """Log a peer's request this node could not serve: the same one at most every
        `REPEATED_REFUSAL_INTERVAL` (a follower retries about every second)."""
        if code in ("E_FAILED_ON_NOT_LEADER", "E_STALE_EPOCH", "E_CATCHING_UP"):
            return  # the usual fencing and catch-up traffic, said by the peer's own log
        where = f"TOPIC({topic.name}) partition {topic.partition}: " if topic is not None else ""
        key = (op, where, code, text)
        now = trio.current_time()
        if (
            now - self._refusals_logged.get(key, -REPEATED_REFUSAL_INTERVAL)
            < REPEATED_REFUSAL_INTERVAL
        ):
            return
        self._refusals_logged[key] = now
        if len(self._refusals_logged) > 1000:
            self._refusals_logged.clear()
        self.nsqd.log.warning(
            "RPC: %srefused a peer's %s - %s %s", where, OP_NAMES.get(op, op), code, text
        )


def _refuse_unless_leading(topic: "Topic") -> None:
    """Only the partition's leader answers this (a node the info names that lost the data
    leads nothing)."""
    if not _held(topic).is_leader:
        raise ReplicaRefusal(error_header("E_FAILED_ON_NOT_LEADER", "not the leader"))


def _is_stale_leader(error: Exception) -> bool:
    return isinstance(error, ReplicaRefusal) and error.code == "E_FAILED_ON_NOT_LEADER"


def _percent(progress: dict | None) -> int:
    """How far a catch-up is, in percent of the bytes it had to copy when it started."""
    if progress is None or progress["behind"] is None:
        return 0
    copied = progress["copied_bytes"]
    total = copied + progress["behind"]["bytes"]
    return 100 if not total else int(100 * copied / total)

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
from collections.abc import Awaitable, Callable
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
from nsqpy.nsqd.catch_up import CatchUps
from nsqpy.nsqd.data_path import data_incarnation
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.partition_replica import UNKNOWN_REPLICA, PartitionReplica
from nsqpy.nsqd.peer_link import PeerLink
from nsqpy.nsqd.peer_server import PeerServer
from nsqpy.nsqd.tls import cluster_contexts
from nsqpy.partition_log import PartitionLog, Position
from nsqpy.partition_log.files import partitions_on_disk

if TYPE_CHECKING:
    from nsqpy.nsqd.cluster_session import ClusterSession
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic
from nsqpy.nsqd.cluster_partition import (
    ClusterMetadataError,
    ClusterWriteError,
    cursor_of,
    held_replica,
    hold,
    log_of,
    log_queue,
    replica_of,
)
from nsqpy.nsqd.follower_role import FollowerRole
from nsqpy.nsqd.leader_role import LeaderRole
from nsqpy.nsqd.leader_sync import LeaderSync

logger = logging.getLogger("nsqd")

# How long a stopping node waits for the master to move its partitions off it.
LEAVE_TIMEOUT = 2.0
# A peer's request this node cannot serve is logged again at most this often.
REPEATED_REFUSAL_INTERVAL = 30.0


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
        # What the node does where it leads, what it tells its followers besides the writes,
        # and what it does where it follows.
        self.leader = LeaderRole(self)
        self.sync = LeaderSync(self)
        self.follower = FollowerRole(self)
        self._refusals_logged: dict[tuple, float] = {}
        # The replication port's connections (`nsqd/peer_server.py`).
        self.peers = PeerServer(nsqd, self._answer, self.server_tls)

    # -- serving ---------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nsqd = self.nsqd
        options = nsqd.options
        # Partitions found on disk wait for the cluster to say who leads them.
        for topic in nsqd.all_partitions():
            if topic.partitioned and replica_of(topic) is None:
                hold(self, topic, UNKNOWN_REPLICA)
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
            # A worker's supervisor began the node's run (`nsqd/supervisor.py`).
            self.incarnation = data_incarnation(
                nsqd.data_path, starting=worker is None, log=nsqd.log
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
            nursery.start_soon(self.sync.cursor_timer)
            nursery.start_soon(self.sync.push_moved_cursors)
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
            (replica := replica_of(topic)) is not None and self.node_id in replica.info.isr
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
        info = held_replica(topic).info
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
            "writable": role == "leader"
            and held_replica(topic).writable
            and not held_replica(topic).lost,
            "catching_up": self.catch_ups.running(topic),
            # Whether this copy is the one the ISR counted on (not a replaced disk's).
            "incarnation": self.incarnation,
            "lost": held_replica(topic).lost,
            "catch_up": self.catch_ups.progress(topic),
            "disk_error": held_replica(topic).disk_error,
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
                if replica_of(topic) is None or partition not in (-1, topic.partition):
                    continue
                info = held_replica(topic).info
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
        return log_of(topic)

    def unsynced_logs(self) -> list[str]:
        """The held partitions whose log failed a sync in this run (a full or failing disk):
        writes they took may not be durable."""
        return [
            f"{topic.name}/{topic.partition}"
            for topic in self.nsqd.all_partitions()
            if replica_of(topic) is not None and log_of(topic).sync_error
        ]

    def index_copied(self, topic: "Topic", data: bytes, first: Position) -> None:
        """Groups a catch-up copied: their delayed records go into the delay queue."""
        log_queue(topic).index_raw(data, first)

    def partition_reports(self) -> list[dict]:
        """Every cluster partition this node holds, as the master nsqlookupd reads them
        (`/cluster/partitions`) for leader health, hand-overs and load factors: its role and
        writability, its log's start and end, and how far its slowest channel is behind."""
        reports = []
        for topic in self.nsqd.all_partitions():
            replica = replica_of(topic)
            if replica is None:
                continue
            queue = log_queue(topic)
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
        problem = cluster_topic_problem(topic_name)
        if problem is not None:
            raise ClusterMetadataError(problem)
        if partition < 0:
            raise ClusterMetadataError(f"partition {partition} is not a partition number")
        if not self.nsqd.placement.partitions_here(topic_name, [partition]):
            return  # another of this node's workers holds it
        topic = self.nsqd.registry.get(topic_name, partition)
        if not info.holds(self.node_id):
            if topic is not None and topic.replication.info is not None:
                if info.epoch < topic.replication.info.epoch:
                    return  # an older revision than the one applied
                # Moved off this node (a move, a node removal, a replacement): the replicas
                # that hold it now are the partition; this copy is of no more use.
                self.step_down(topic, info)
                self.forget(topic_name, partition, "no longer holds it")
            return
        topic = self._local_partition(topic, topic_name, partition, meta, info)
        previous = topic.replication.info
        if previous is not None and info.epoch < previous.epoch:
            return  # an older revision than the one applied
        if meta.magic_code and log_of(topic).magic_code != meta.magic_code:
            log_of(topic).set_magic_code(meta.magic_code)
        self._take_meta(topic, meta)
        self._take_role(topic, info, previous)

    def _local_partition(
        self,
        topic: "Topic | None",
        topic_name: str,
        partition: int,
        meta: TopicMeta,
        info: ReplicaInfo,
    ) -> "Topic":
        """The partition's local copy, made when there is none or when the one there is of an
        earlier topic of that name."""
        if topic is not None and topic.replication.info is not None:
            kept = log_of(topic).magic_code
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
            topic = self.nsqd.create_partition(
                topic_name,
                partition,
                partitioned=True,
                ordered=meta.ordered_multi,
                ext=meta.ext,
                sync_every=meta.sync_every,
                replication=partial(PartitionReplica, self, info=info),
            )
        return topic

    def _take_role(self, topic: "Topic", info: ReplicaInfo, previous: ReplicaInfo | None) -> None:
        """Lead, follow, or (named leader in a new incarnation) refuse writes meanwhile."""
        me = self.node_id
        if info.leader != me and previous is not None and previous.leader == me:
            # Before `hold`: stepping down tells a leader's consumers and nsqlookupd by what
            # the node held until now.
            self.step_down(topic, info)
        held = replica_of(topic)
        was_lost = held is not None and held.lost
        hold(self, topic, info)
        replica = held_replica(topic)
        replica.lost = me in info.isr and not info.proven(me, self.incarnation)
        if replica.lost and not was_lost:
            self.nsqd.log.error(
                "TOPIC(%s) partition %d: this node is in the ISR, but its data directory is a"
                " new incarnation (%s, the ISR counted on %s): it proves nothing it holds,"
                " leads nothing and counts for no write until it caught up and joined again",
                topic.name,
                topic.partition,
                self.incarnation,
                info.incarnation_of(me),
            )
        log_queue(topic).set_write_epoch(info.epoch_for_write)
        if info.leader == me and replica.lost:
            # The master elects a replica that holds the data, when one is alive.
            log_queue(topic).stop_writes(
                ClusterWriteError("E_FAILED_ON_NOT_WRITABLE", "this node lost the partition's data")
            )
            replica.writable = False
            replica.handing_over = False
        elif info.leader == me:
            self._lead(topic, info, previous, was_lost)
        else:
            self._follow(topic, info, previous)

    def _lead(
        self, topic: "Topic", info: ReplicaInfo, previous: ReplicaInfo | None, was_lost: bool
    ) -> None:
        me = self.node_id
        replica = held_replica(topic)
        was_leader = (
            previous is not None
            and previous.leader == me
            and not was_lost
            and not replica.stepped_down
        )
        replica.stepped_down = False
        self.leader.settle_admissions(topic, info)
        log_queue(topic).on_disk_state(partial(self.leader.disk_state, topic))
        log_queue(topic).replicate_with(
            partial(self.leader.replicate, topic) if info.followers() else None
        )
        replica.writable = len(info.isr) > info.replica // 2
        replica.handing_over = False
        # The channels the cluster gave the partition (an expansion copies the topic's).
        for name in info.channels:
            if name not in topic.channels and is_valid_name(name):
                topic.get_channel(name)
        if not was_leader:
            self.nsqd.log.info(
                "TOPIC(%s) partition %d: leader, write epoch %d, ISR %s",
                topic.name,
                topic.partition,
                info.epoch_for_write,
                ",".join(info.isr),
            )
            self.nsqd.register_partition(topic)
            for channel in topic.channels.values():
                channel.notify()

    def _follow(self, topic: "Topic", info: ReplicaInfo, previous: ReplicaInfo | None) -> None:
        replica = held_replica(topic)
        leader_changed = previous is None or previous.leader != info.leader
        log_queue(topic).stop_writes(ClusterWriteError("E_FAILED_ON_NOT_LEADER", "not the leader"))
        replica.writable = False
        replica.handing_over = False
        replica.admitting.clear()
        log_queue(topic).on_disk_state(None)
        if leader_changed or self.node_id in info.catchup or replica.lost:
            self.catch_ups.start(topic)

    def _take_meta(self, topic: "Topic", meta: TopicMeta) -> None:
        """The topic's settings that `/topic/meta/update` changes."""
        if meta.sync_every and meta.sync_every != topic.sync_every:
            topic.sync_every = meta.sync_every
            log_of(topic).sync_every = max(1, meta.sync_every)
            self.nsqd.topology_changed(topic)
        topic.retention_days = meta.retention_day
        topic.channel_auto_create = not meta.disable_channel_auto_create

    def forget(self, topic_name: str, partition: int, why: str) -> None:
        """Delete the local copy of a partition the cluster no longer keeps here (moved away,
        or the topic deleted)."""
        topic = self.nsqd.registry.get(topic_name, partition)
        if topic is None or topic.replication.info is None:
            return
        self.step_down(topic, topic.replication.info)
        self.nsqd.log.info(
            "TOPIC(%s) partition %d: deleting the local replica (%s)", topic_name, partition, why
        )
        self.catch_ups.forget(topic)
        self.nsqd.delete_topic(topic_name, partition)

    def step_down(self, topic: "Topic", info: ReplicaInfo) -> None:
        """This node no longer leads the partition: it stops taking writes (what it took and
        did not write yet is refused), leaves nsqlookupd's lists, and its consumers go (they
        look the new leader up)."""
        held = replica_of(topic)
        was_leader = held is not None and held.is_leader
        hold(self, topic, info)
        log_queue(topic).stop_writes(
            ClusterWriteError("E_FAILED_ON_NOT_LEADER", "no longer the leader")
        )
        held_replica(topic).writable = False
        # Led no more, whatever the info it holds says (a follower deposed it before the
        # watch did): an info naming it leader makes it one again, from the start.
        held_replica(topic).stepped_down = True
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

    # -- the disk ---------------------------------------------------------------------------

    # -- the disk ---------------------------------------------------------------------------

    def disk_failed(self, topic: "Topic", error: OSError) -> None:
        """A write of this node's copy failed: `/ping` says so until one works again."""
        replica = held_replica(topic)
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
            write_error(log_of(topic), error, log_of(topic).active_segment_path)
        )

    def disk_recovered(self, topic: "Topic") -> None:
        replica = held_replica(topic)
        if replica.disk_error:
            replica.disk_error = ""
            self.nsqd.storage.health.write_done(None)

    def log_started_over(self, topic: "Topic") -> None:
        """The partition's log started over at its leader's start (`CatchUps`): the channels'
        cursors stand there until the leader's positions come."""
        log = log_of(topic)
        for channel in topic.channels.values():
            cursor = cursor_of(channel)
            if cursor.confirmed != log.start:
                cursor.set_position(log.start)

    # -- catching up ------------------------------------------------------------------------

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

    # -- the replication port ------------------------------------------------------------------

    async def _answer(self, frame) -> bytes:
        header = frame.header
        topic = None
        try:
            topic = self.nsqd.registry.get(str(header.get("topic")), int(header.get("partition")))
            if topic is None or replica_of(topic) is None:
                raise ReplicaRefusal(error_header("E_TOPIC_NOT_EXIST", "no such partition here"))
            if frame.op == PUT:
                return encode_frame(REPLY, await self.follower.on_put(topic, header, frame.payload))
            if frame.op == CURSORS:
                return encode_frame(REPLY, self.follower.on_cursors(topic, header))
            if frame.op == MATCH:
                return encode_frame(REPLY, self.sync.answer_match(topic, header))
            if frame.op == PULL:
                answer, data = await self.sync.answer_pull(topic, header)
                return encode_frame(REPLY, answer, data)
            if frame.op == START:
                answer, data = self.sync.answer_start(topic)
                return encode_frame(REPLY, answer, data)
            if frame.op == JOIN:
                answer, data = await self.leader.admit(topic, header)
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


def _percent(progress: dict | None) -> int:
    """How far a catch-up is, in percent of the bytes it had to copy when it started."""
    if progress is None or progress["behind"] is None:
        return 0
    copied = progress["copied_bytes"]
    total = copied + progress["behind"]["bytes"]
    return 100 if not total else int(100 * copied / total)

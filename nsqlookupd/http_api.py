"""nsqlookupd's HTTP API: Go nsqlookupd v1.3.0's http.go, plus Youzan's `/lookup` parameters
and `/listlookup` (docs/protocol.md §5). Always the v1 form: no envelope, real status codes."""

import json
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from nsqpy import network
from nsqpy.common.cluster_meta import TopicMeta, is_node_id
from nsqpy.common.errors import NO_CHANNEL_FOR_WRITERS
from nsqpy.common.names import cluster_topic_problem, is_valid_name
from nsqpy.common.version import VERSION
from nsqpy.daemon.http_access import HTTPAccess, NeedOf, cluster_route_needs, need_of
from nsqpy.daemon.http_server import (
    HTTPError,
    Request,
    Response,
    Router,
    text_response,
    v1_response,
)
from nsqpy.daemon.http_server import first_param as _first
from nsqpy.daemon.http_server import query_params as _query
from nsqpy.daemon.log import LOG_LEVELS, youzan_log_level
from nsqpy.etcd import EtcdError
from nsqpy.nsqlookupd.coordinator import CoordinatorError
from nsqpy.nsqlookupd.registry import ANY, active

if TYPE_CHECKING:
    from nsqpy.nsqlookupd.coordinator import Coordinator
    from nsqpy.nsqlookupd.operations import ClusterOperations
    from nsqpy.nsqlookupd.server import NSQLookupd

_HTTP_TIMEOUT = 5.0


async def _post(url: str, secret: str) -> None:
    """A standalone nsqlookupd's call of an nsqd, with the cluster secret when it has one
    (an nsqd run with --http-auth-required admits it)."""
    answer = await network.current().request(
        "POST", url, timeout=_HTTP_TIMEOUT, headers=network.bearer(secret)
    )
    answer.ok_body()


def _is_int(text: str) -> bool:
    """Go's strconv.Atoi accepts it (a sign, then ASCII digits)."""
    digits = text[1:] if text[:1] in "+-" else text
    return digits.isascii() and digits.isdigit()


def _topic_and_number(
    params: dict[str, list[str]], name: str, missing: str, allowed: range
) -> tuple[str, int]:
    """The topic and a partition number or count of Youzan's operations, with its errors."""
    topic = _first(params, "topic")
    if not topic:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    text = _first(params, name)
    if not text:
        raise HTTPError(400, missing)
    if not _is_int(text) or int(text) not in allowed:
        raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
    return topic, int(text)


def _topic_and_channel(params: dict[str, list[str]]) -> tuple[str, str]:
    """Go's http_api.GetTopicChannelArgs."""
    topic = _first(params, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = _first(params, "channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


# The operations: with --auth-http-address, an `admin` authorization on the request's topic
# (and channel), or on any topic for the node's and the cluster's.
OPERATIONS = {
    ("POST", "/topic/create"): "topic",
    ("POST", "/topic/delete"): "topic",
    ("POST", "/topic/tombstone"): "topic",
    ("POST", "/channel/create"): "channel",
    ("POST", "/channel/delete"): "channel",
    ("POST", "/topic/partition/expand"): "topic",
    ("POST", "/topic/partition/move"): "topic",
    ("POST", "/topic/partition/elect"): "topic",
    ("POST", "/topic/meta/update"): "topic",
    ("POST", "/disable/write"): "node",
    ("POST", "/loglevel/set"): "node",
    ("POST", "/cluster/node/remove"): "node",
    ("POST", "/cluster/upgrade/begin"): "node",
    ("POST", "/cluster/upgrade/done"): "node",
    ("POST", "/cluster/balance/topn"): "node",
    ("POST", "/cluster/lookupd/tombstone"): "node",
}
# What the nsqds ask of the master: with --cluster-secret, only the cluster's own callers.
NODE_REPORTS = (
    ("POST", "/cluster/isr/leave"),
    ("POST", "/cluster/isr/join"),
    ("POST", "/cluster/leader/unwritable"),
    ("POST", "/cluster/node/leave"),
    ("POST", "/cluster/leader/resign"),
)
# Auth servers' answers come within this (nsqd's default connect and request timeouts).
AUTH_TIMEOUT = 7.0


def http_access(lookupd: "NSQLookupd") -> HTTPAccess | None:
    options = lookupd.options
    if not (options.auth_http_address or options.cluster_secret):
        return None
    return HTTPAccess(
        auth_addresses=options.auth_http_address,
        timeout=AUTH_TIMEOUT,
        cluster_secrets=[options.cluster_secret] if options.cluster_secret else [],
        log=lookupd.log,
        realm="nsqlookupd",
    )


def route_needs(options) -> dict[tuple[str, str], NeedOf]:
    needs: dict[tuple[str, str], NeedOf] = {}
    if options.auth_http_address:
        needs.update({route: need_of("admin", scope) for route, scope in OPERATIONS.items()})
    needs.update(
        cluster_route_needs(NODE_REPORTS, options.cluster_secret, bool(options.auth_http_address))
    )
    return needs


class HTTPAPI:
    def __init__(self, lookupd: "NSQLookupd") -> None:
        self.lookupd = lookupd
        # Answered by the HTTP poller, except topic creation (a coroutine), which may call out
        # to nsqds.
        router = self.router = Router(access=http_access(lookupd))
        router.add("GET", "/ping", self.ping)
        router.add("GET", "/info", self.info)
        router.add("GET", "/debug", self.debug)
        router.add("GET", "/lookup", self.lookup)
        router.add("GET", "/topics", self.topics)
        router.add("GET", "/channels", self.channels)
        router.add("GET", "/nodes", self.nodes)
        router.add("GET", "/listlookup", self.listlookup)
        router.add("POST", "/topic/create", self.topic_create)
        router.add("POST", "/topic/delete", self.topic_delete)
        router.add("POST", "/channel/create", self.channel_create)
        router.add("POST", "/channel/delete", self.channel_delete)
        router.add("POST", "/topic/tombstone", self.topic_tombstone)
        router.add("POST", "/disable/write", self.disable_write)
        router.add("POST", "/cluster/isr/leave", self.isr_leave)
        router.add("POST", "/cluster/isr/join", self.isr_join)
        router.add("POST", "/cluster/leader/unwritable", self.leader_unwritable)
        router.add("POST", "/cluster/node/leave", self.node_leave)
        router.add("POST", "/cluster/leader/resign", self.leader_resign)
        router.add("GET", "/cluster/stats", self.cluster_stats)
        router.add("GET", "/stats", self.stats)
        # Youzan's operations (docs/operations.md, "Operating a replicated cluster").
        router.add("POST", "/topic/partition/expand", self.partition_expand)
        router.add("POST", "/topic/partition/move", self.partition_move)
        router.add("POST", "/topic/partition/elect", self.partition_elect)
        router.add("POST", "/topic/meta/update", self.meta_update)
        router.add("POST", "/cluster/node/remove", self.node_remove)
        router.add("POST", "/cluster/upgrade/begin", self.upgrade_begin)
        router.add("POST", "/cluster/upgrade/done", self.upgrade_done)
        router.add("POST", "/cluster/balance/topn", self.balance_topn)
        router.add("POST", "/cluster/lookupd/tombstone", self.lookupd_tombstone)
        router.add("POST", "/loglevel/set", self.set_log_level)
        for (method, path), need in route_needs(lookupd.options).items():
            router.require(method, path, need)

    def ping(self, request: Request) -> Response:
        return text_response(200, "OK")

    def info(self, request: Request) -> Response:
        return v1_response(200, {"version": VERSION})

    def topics(self, request: Request) -> Response:
        return v1_response(200, {"topics": self.lookupd.db.topics()})

    def channels(self, request: Request) -> Response:
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        partition = self._partition_filter(params)
        return v1_response(200, {"channels": self.lookupd.db.channels(topic, partition)})

    @staticmethod
    def _partition_filter(params: dict[str, list[str]]):
        text = _first(params, "partition")
        if text is None or text in ("", "*"):
            return ANY
        try:
            return int(text)
        except ValueError:
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION") from None

    def lookup(self, request: Request) -> Response:
        lookupd = self.lookupd
        options = lookupd.options
        db = lookupd.db
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        access_text = _first(params, "access")
        access = access_text or "r"
        if access not in ("r", "w"):
            raise HTTPError(400, "INVALID_ACCESS_MODE")
        partition = self._partition_filter(params)
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        coordinator = lookupd.coordinator

        channels = db.channels(topic, partition)
        timeout = options.inactive_producer_timeout
        # Official lookups (no `access`) hide tombstoned nodes as Go does; Youzan readers
        # (`access=r`) see them, so consumers can drain a node being retired (docs/protocol.md
        # §5.3); writers never do.
        lifetime = 0.0 if access_text == "r" else options.tombstone_lifetime
        producers = active(db.find_producers("topic", topic, "", partition), timeout, lifetime)
        partitions: dict[str, dict] = {}
        writable: dict[str, object] = {}
        dropped_for_no_channel = 0
        for registration in sorted(
            db.find_registrations("topic", topic, "", partition),
            key=lambda r: -1 if r[3] is None else r[3],
        ):
            pid = registration[3]
            if pid is None or pid < 0:
                continue
            live = active(db.producers_of(registration), timeout, lifetime)
            if coordinator is not None:
                # In a cluster only the partition's leader, as etcd says, is listed: a node
                # that lost it (frozen, cut off) may still be registered here. Writers get
                # it only while its ISR is a majority of the replicas.
                live = [p for p in live if coordinator.is_leader(topic, pid, p.peer)]
                if access == "w" and not coordinator.is_writable(topic, pid):
                    live = []
            if access == "w":
                live = [p for p in live if not p.tombstoned]
            if not live:
                continue
            if (
                access == "w"
                and not options.allow_write_with_nochannels
                and not db.find_registrations("channel", topic, ANY, pid)
            ):
                dropped_for_no_channel += 1
                continue
            partitions[str(pid)] = live[0].peer.as_json()
            writable.setdefault(live[0].peer.id, live[0])
        if access == "w":
            # Writers get exactly the nodes of the partitions they may write to: no classic
            # nodes, no tombstoned ones, none whose partitions have no channel yet.
            producers = list(writable.values())
            if dropped_for_no_channel and not partitions:
                raise HTTPError(404, NO_CHANNEL_FOR_WRITERS)
        document: dict = {"channels": channels}
        disabled = lookupd.write_disabled
        ordered = lookupd.topic_meta.get(topic, {}).get("ordered", False)
        blocked = access == "w" and (disabled == "all" or (disabled == "ordered" and ordered))
        if _first(params, "metainfo") or (blocked and disabled == "ordered"):
            document["meta"] = self._meta(topic, partitions)
        # With writes disabled, writers get null lists (Youzan's /disable/write).
        document["partitions"] = None if blocked else partitions
        document["producers"] = None if blocked else [p.peer.as_json() for p in producers]
        return v1_response(200, document)

    def _meta(self, topic: str, partitions: dict[str, dict]) -> dict:
        coordinator = self.lookupd.coordinator
        meta = coordinator.meta_of(topic) if coordinator is not None else None
        if meta is not None:
            return {
                "disable_channel_auto_create": meta.disable_channel_auto_create,
                "extend_support": meta.ext,
                "multi_part": meta.multi_part,
                "ordered": meta.ordered_multi,
                "partition_num": meta.partition_num,
                "replica": meta.replica,
            }
        stored = self.lookupd.topic_meta.get(topic, {})
        registered = {
            r[3]
            for r in self.lookupd.db.find_registrations("topic", topic, "")
            if r[3] is not None and r[3] >= 0
        }
        return {
            "disable_channel_auto_create": stored.get("disable_channel_auto_create", False),
            "extend_support": stored.get("extend_support", False),
            "multi_part": stored.get("multi_part", False),
            "ordered": stored.get("ordered", False),
            "partition_num": stored.get("partition_num", max(1, len(registered))),
            "replica": stored.get("replica", 1),
        }

    def nodes(self, request: Request) -> Response:
        db = self.lookupd.db
        options = self.lookupd.options
        clients = active(db.find_producers("client", "", ""), options.inactive_producer_timeout, 0)
        nodes = []
        for producer in clients:
            peer = producer.peer
            topics = []
            tombstones = []
            partitions: dict[str, list[str]] = {}
            for registration in db.registrations_of_peer(peer.id):
                if registration[0] != "topic":
                    continue
                topic = registration[1]
                if topic not in topics:
                    topics.append(topic)
                    own = db.registrations[registration][peer.id]
                    tombstones.append(own.is_tombstoned(options.tombstone_lifetime))
                if registration[3] is not None and registration[3] >= 0:
                    partitions.setdefault(topic, []).append(str(registration[3]))
            node = {**peer.official(), "tombstones": tombstones, "topics": topics}
            if peer.partitioned:
                node["partitions"] = partitions
            nodes.append(node)
        return v1_response(200, {"producers": nodes})

    def debug(self, request: Request) -> Response:
        data: dict[str, list[dict]] = {}
        for registration, producers in self.lookupd.db.registrations.items():
            category, key, subkey, partition = registration
            name = f"{category}:{key}:{subkey}"
            if partition is not None:
                name = f"{category}:{key}:{subkey}:{partition}"
            for producer in producers.values():
                peer = producer.peer
                data.setdefault(name, []).append(
                    {
                        "broadcast_address": peer.broadcast_address,
                        "hostname": peer.hostname,
                        "http_port": peer.http_port,
                        "id": peer.id,
                        "last_update": peer.last_update,
                        "tcp_port": peer.tcp_port,
                        "tombstoned": producer.tombstoned,
                        # Go prints the zero time.Time's UnixNano when never tombstoned.
                        "tombstoned_at": int(producer.tombstoned_at * 1e9)
                        if producer.tombstoned
                        else -6795364578871345152,
                        "version": peer.version,
                    }
                )
        return v1_response(200, dict(sorted(data.items())))

    def listlookup(self, request: Request) -> Response:
        lookupd = self.lookupd
        coordinator = lookupd.coordinator
        if coordinator is not None:
            tombstoned = coordinator.state.tombstoned_lookupds
            nodes = sorted(
                (node for key, node in coordinator.lookupds.items() if key not in tombstoned),
                key=lambda node: node.get("ID", ""),
            )
            return v1_response(
                200,
                {"lookupdleader": coordinator.master or {}, "lookupdnodes": nodes},
            )
        node = {
            "ID": f"{lookupd.options.broadcast_address}:{lookupd.http_port}:{lookupd.tcp_port}",
            "NodeIP": lookupd.options.broadcast_address,
            "TcpPort": str(lookupd.tcp_port),
            "HttpPort": str(lookupd.http_port),
            "RpcPort": "",
            "Epoch": 0,
        }
        return v1_response(200, {"lookupdleader": node, "lookupdnodes": [node]})

    # -- administration --------------------------------------------------------------------

    async def topic_create(self, request: Request) -> Response:
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        if self.lookupd.coordinator is not None:
            await self._create_in_cluster(topic, params)
            return v1_response(200)
        if _first(params, "partition_num") is not None or _first(params, "replicator") is not None:
            await self._create_partitioned(topic, params)
        self.lookupd.log.info("DB: adding topic(%s)", topic)
        self.lookupd.db.add_registration(("topic", topic, "", None))
        return v1_response(200)

    @staticmethod
    def _partition_params(params: dict[str, list[str]], *, max_replicator: int) -> tuple[int, int]:
        text = _first(params, "partition_num")
        if text is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION_NUM")
        if not text.isdigit() or not 1 <= int(text) <= 255:
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        replicator_text = _first(params, "replicator")
        if replicator_text is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC_REPLICATOR")
        if not replicator_text.isdigit() or not 1 <= int(replicator_text) <= max_replicator:
            raise HTTPError(400, "INVALID_ARG_TOPIC_REPLICATOR")
        return int(text), int(replicator_text)

    @staticmethod
    def _sync_every(params: dict[str, list[str]]) -> int:
        """Youzan's `syncdisk`, capped at 4000 as Youzan's nsqlookupd caps it; 0: none."""
        sync_text = _first(params, "syncdisk") or ""
        valid = sync_text.isascii() and sync_text.isdigit() and int(sync_text) > 0
        return min(int(sync_text), 4000) if valid else 0

    async def _create_in_cluster(self, topic: str, params: dict[str, list[str]]) -> None:
        """Youzan's `/topic/create` on the master: placement and replica sets in etcd."""
        problem = cluster_topic_problem(topic)
        if problem is not None:
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        partition_num, replicator = self._partition_params(params, max_replicator=5)
        retention = _first(params, "retention") or "0"
        if not _is_int(retention) or int(retention) < 0:
            raise HTTPError(400, "INVALID_ARG_TOPIC_RETENTION")
        sync_every = _first(params, "syncdisk") or "0"
        if not _is_int(sync_every) or int(sync_every) < 0:
            raise HTTPError(400, "INVALID_ARG_TOPIC_SYNC_DISK")
        meta = TopicMeta(
            partition_num,
            replicator,
            sync_every=int(sync_every),
            retention_day=int(retention),
            ordered_multi=_first(params, "orderedmulti") == "true",
            multi_part=_first(params, "multipart") == "true",
            ext=_first(params, "extend") == "true",
            disable_channel_auto_create=_first(params, "disable_channel_auto_create") == "true",
        )
        await self._operate(self._operations().create_topic(topic, meta))

    async def isr_leave(self, request: Request) -> Response:
        """A leader drops followers that cannot take its writes (`nsqd/cluster.py`)."""
        topic, partition, nodes, epoch, params = self._isr_params(request)
        leader = self._node_param(params, "leader")
        coordinator = self._coordinator()
        return await self._isr_change(
            coordinator.leave_isr(topic, partition, nodes, leader=leader, epoch=epoch)
        )

    async def isr_join(self, request: Request) -> Response:
        """A leader admits a follower that caught up into the ISR (`nsqd/cluster.py`)."""
        topic, partition, nodes, epoch, params = self._isr_params(request)
        leader = self._node_param(params, "leader")
        incarnation = _first(params, "incarnation") or ""
        coordinator = self._coordinator()
        return await self._isr_change(
            coordinator.join_isr(topic, partition, nodes[0], incarnation, leader, epoch)
        )

    async def leader_unwritable(self, request: Request) -> Response:
        """A leader that cannot replicate says so (`nsqd/cluster.py`)."""
        topic, partition, nodes, epoch, _params = self._isr_params(request)
        coordinator = self._coordinator()
        return await self._isr_change(
            coordinator.elections.leader_unwritable(topic, partition, nodes[0], epoch=epoch)
        )

    async def partition_elect(self, request: Request) -> Response:
        """POST /topic/partition/elect?topic=&partition=&unclean=true[&node=]: an operator
        elects a replica that may lack acknowledged messages (Kafka's unclean election), for a
        partition no complete replica can lead. The master elects complete ones by itself."""
        coordinator = self._coordinator()
        params = _query(request)
        topic = _first(params, "topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        partition_text = _first(params, "partition")
        if partition_text is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
        if not partition_text.isascii() or not partition_text.isdigit():
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION")
        if _first(params, "unclean") != "true":
            raise HTTPError(
                400,
                "E_CLEAN_ELECTION_IS_AUTOMATIC the master elects a replica that holds every"
                " acknowledged message by itself; unclean=true elects one that may not",
            )
        node = _first(params, "node") or None
        if node is not None and not is_node_id(node):
            raise HTTPError(400, "INVALID_ARG_NODE")
        return await self._isr_change(
            coordinator.elections.unclean_election(topic, int(partition_text), node)
        )

    async def leader_resign(self, request: Request) -> Response:
        """A leader whose disk refuses its writes gives the partition to a follower."""
        topic, partition, nodes, epoch, _params = self._isr_params(request)
        coordinator = self._coordinator()
        return await self._isr_change(
            coordinator.elections.leader_resign(topic, partition, nodes[0], epoch=epoch)
        )

    async def node_leave(self, request: Request) -> Response:
        """An nsqd about to stop (SIGTERM) has what it leads handed over and leaves the ISRs
        it follows (`ClusterNode.leave`)."""
        coordinator = self._coordinator()
        params = _query(request)
        node = self._node_param(params, "node")
        incarnation = _first(params, "incarnation") or ""
        try:
            done = await coordinator.moves.node_stopping(node, incarnation)
        except CoordinatorError as error:
            raise HTTPError(error.status, error.text) from None
        except EtcdError as error:
            raise HTTPError(500, f"E_ETCD {error}") from None
        return v1_response(200, done)

    def _coordinator(self) -> "Coordinator":
        coordinator = self.lookupd.coordinator
        if coordinator is None:
            raise HTTPError(400, "E_NOT_CLUSTER this nsqlookupd is not in a cluster")
        return coordinator

    def _isr_params(self, request: Request) -> tuple[str, int, list[str], int, dict]:
        """What every request of an nsqd about a partition's replicas names: the partition,
        the nodes it is about, and the revision (`epoch`) of the info it acts on."""
        self._coordinator()
        params = _query(request)
        topic = _first(params, "topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        partition_text = _first(params, "partition")
        if partition_text is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
        if not partition_text.isascii() or not partition_text.isdigit():
            raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION")
        nodes = [node for node in (_first(params, "node") or "").split(",") if node]
        if not nodes:
            raise HTTPError(400, "MISSING_ARG_NODE")
        if not all(is_node_id(node) for node in nodes):
            raise HTTPError(400, "INVALID_ARG_NODE")
        epoch_text = _first(params, "epoch")
        if epoch_text is None:
            raise HTTPError(400, "MISSING_ARG_EPOCH")
        if not epoch_text.isascii() or not epoch_text.isdigit():
            raise HTTPError(400, "INVALID_ARG_EPOCH")
        return topic, int(partition_text), nodes, int(epoch_text), params

    @staticmethod
    def _node_param(params: dict[str, list[str]], name: str) -> str:
        node = _first(params, name)
        if not node:
            raise HTTPError(400, f"MISSING_ARG_{name.upper()}")
        if not is_node_id(node):
            raise HTTPError(400, f"INVALID_ARG_{name.upper()}")
        return node

    async def _isr_change(self, change) -> Response:
        try:
            info = await change
        except CoordinatorError as error:
            raise HTTPError(error.status, error.text) from None
        except EtcdError as error:
            raise HTTPError(500, f"E_ETCD {error}") from None
        return v1_response(200, json.loads(info.to_json()))

    def stats(self, request: Request) -> Response:
        """nsqpy's own (Go's nsqlookupd has no `/stats`): the version and, in a cluster,
        the control plane as this nsqlookupd sees it (`control_plane`: what is wrong and
        since when) and whether it is the master."""
        coordinator = self.lookupd.coordinator
        return v1_response(
            200,
            {
                "version": VERSION,
                "is_master": coordinator.is_master if coordinator is not None else False,
                "control_plane": coordinator.control_plane() if coordinator is not None else None,
            },
        )

    def cluster_stats(self, request: Request) -> Response:
        """The cluster as this nsqlookupd sees it: Youzan's `stable`, `node_stat_list` (each
        node's leader and node load factors) and `topn_topics` (`?topn=N`), and beside them
        nsqpy's: nodes with their leaders and replicas, the master, etcd's reachability, the
        cluster state and each partition's replicas."""
        coordinator = self.lookupd.coordinator
        if coordinator is None:
            raise HTTPError(400, "E_NOT_CLUSTER this nsqlookupd is not in a cluster")
        params = _query(request)
        topn_text = _first(params, "topn") or "0"
        topn = int(topn_text) if topn_text.isdigit() else 0
        partitions = []
        for (topic, partition), info in sorted(coordinator.infos.items()):
            partitions.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "leader": info.leader,
                    "isr": list(info.isr),
                    # Where readers of any replica (range fetches) find each ISR member.
                    "isr_http": [
                        f"{node.ip}:{node.http_port}"
                        for node in map(coordinator.nodes.get, info.isr)
                        if node is not None
                    ],
                    "catchup": list(info.catchup),
                    "replica": info.replica,
                    "write_epoch": info.epoch_for_write,
                    "epoch": info.epoch,
                    "under_replicated": len(info.isr) < info.replica
                    or bool(coordinator.lost_members(info)),
                    # ISR members whose node came back on another disk: counted for nothing.
                    "lost": coordinator.lost_members(info),
                    # Why no leader can be elected (none holds every acknowledged message).
                    "unavailable": coordinator.leaderless.get((topic, partition), ""),
                    # Each replica catching up, as its node last said: how far behind, why not.
                    "catching_up": coordinator.catch_up_reports((topic, partition), info),
                }
            )
        stats = coordinator.node_stats()
        removed = coordinator.removed_nodes()
        removing = set(coordinator.state.removing) - set(removed)
        nodes = []
        node_stat_list = []
        for node_id, node in sorted(coordinator.nodes.items()):
            peer = self._peer_of(node.ip, node.tcp_port)
            hostname = peer.hostname if peer is not None else ""
            numbers = stats.get(node_id, {})
            node_stat_list.append(
                {
                    "hostname": hostname,
                    "broadcast_address": node.ip,
                    "tcp_port": node.tcp_port,
                    "http_port": node.http_port,
                    "leader_load_factor": numbers.get("leader_load_factor", 0.0),
                    "node_load_factor": numbers.get("node_load_factor", 0.0),
                }
            )
            nodes.append(
                {
                    "id": node_id,
                    "hostname": hostname,
                    "broadcast_address": node.ip,
                    "tcp_port": node.tcp_port,
                    "http_port": node.http_port,
                    "rpc_port": node.rpc_port,
                    # Its data directory's identity: a new one is a replaced disk.
                    "incarnation": node.incarnation,
                    "removing": node_id in removing,
                    "removed": node_id in removed,
                    **numbers,
                }
            )
        state = coordinator.state
        return v1_response(
            200,
            {
                "stable": coordinator.stable(),
                "node_stat_list": node_stat_list,
                "topn_topics": coordinator.topn_topics(topn) if topn > 0 else [],
                "master": coordinator.master,
                "is_master": coordinator.is_master,
                "etcd": {
                    "reachable": coordinator.etcd_ok,
                    "endpoints": coordinator.client.endpoints,
                    "error": coordinator.etcd_error,
                },
                # What is wrong with the control plane while it lasts: etcd unreachable, no
                # master, this nsqlookupd's lease lost, nodes whose lease was lost.
                "control_plane": coordinator.control_plane(),
                "upgrading": state.upgrading,
                "removing_nodes": sorted(removing),
                "removed_nodes": removed,
                "tombstoned_lookupds": list(state.tombstoned_lookupds),
                "topn_balance": state.topn_balance,
                "balance": {
                    "not_now": coordinator.moves.balance_allowed(),
                    "moving": str(coordinator.balancing) if coordinator.balancing else None,
                    "moves": coordinator.balance_moves,
                    "rounds": coordinator.balance_rounds,
                },
                "nodes": nodes,
                "nsqd_nodes": sorted(coordinator.nodes),
                "lookupd_nodes": sorted(coordinator.lookupds),
                "partitions": partitions,
            },
        )

    def _peer_of(self, address: str, tcp_port: int):
        """The registered nsqd peer at `address:tcp_port` (Youzan's SearchPeerClientByClusterID)."""
        for producer in self.lookupd.db.find_producers("client", "", ""):
            peer = producer.peer
            if peer.broadcast_address == address and peer.tcp_port == tcp_port:
                return peer
        return None

    # -- Youzan's cluster operations -----------------------------------------------------------

    def _operations(self) -> "ClusterOperations":
        operations = self.lookupd.operations
        if operations is None:
            raise HTTPError(500, "MISSING_COORDINATOR")
        return operations

    @staticmethod
    async def _operate(call) -> None:
        try:
            await call
        except CoordinatorError as error:
            raise HTTPError(error.status, error.text) from None
        except EtcdError as error:
            raise HTTPError(500, f"E_ETCD {error}") from None

    async def partition_expand(self, request: Request) -> Response:
        operations = self._operations()
        topic, count = _topic_and_number(
            _query(request), "partition_num", "MISSING_ARG_TOPIC_PARTITION_NUM", range(1, 256)
        )
        await self._operate(operations.expand(topic, count))
        return v1_response(200)

    async def partition_move(self, request: Request) -> Response:
        operations = self._operations()
        params = _query(request)
        topic, partition = _topic_and_number(
            params, "partition", "MISSING_ARG_TOPIC_PARTITION", range(255)
        )
        await self._operate(
            operations.move(
                topic,
                partition,
                _first(params, "move_leader") == "true",
                _first(params, "move_from") or "",
                _first(params, "move_to") or "",
            )
        )
        return v1_response(200)

    async def meta_update(self, request: Request) -> Response:
        operations = self._operations()
        params = _query(request)
        topic = _first(params, "topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        replicator = _first(params, "replicator")
        if replicator and (not _is_int(replicator) or not 0 < int(replicator) <= 5):
            raise HTTPError(400, "INVALID_ARG_TOPIC_REPLICATOR")
        sync_every = _first(params, "syncdisk")
        if sync_every and not _is_int(sync_every):
            raise HTTPError(400, "INVALID_ARG_TOPIC_SYNC_DISK")
        retention = _first(params, "retention")
        if retention and not _is_int(retention):
            raise HTTPError(400, "INVALID_ARG_TOPIC_RETENTION")
        auto_create = _first(params, "disable_channel_auto_create")
        await self._operate(
            operations.update_meta(
                topic,
                replicator=int(replicator) if replicator else None,
                sync_every=int(sync_every) if sync_every else None,
                retention_days=int(retention) if retention else None,
                disable_channel_auto_create=None if not auto_create else auto_create == "true",
                upgrade_ext=_first(params, "upgradeext") == "true",
            )
        )
        return v1_response(200)

    async def node_remove(self, request: Request) -> Response:
        operations = self._operations()
        node = _first(_query(request), "remove_node") or ""
        await self._operate(operations.remove_node(node))
        return v1_response(200)

    async def upgrade_begin(self, request: Request) -> Response:
        await self._operate(self._operations().set_upgrading(True))
        return v1_response(200)

    async def upgrade_done(self, request: Request) -> Response:
        await self._operate(self._operations().set_upgrading(False))
        return v1_response(200)

    async def balance_topn(self, request: Request) -> Response:
        operations = self._operations()
        enabled = _first(_query(request), "enable") == "true"
        await self._operate(operations.set_topn_balance(enabled))
        return v1_response(200)

    async def lookupd_tombstone(self, request: Request) -> Response:
        params = _query(request)
        node = _first(params, "node")
        if not node:
            raise HTTPError(400, "MISSING_ARG_NODE")
        operations = self._operations()
        await self._operate(operations.tombstone_lookupd(node, bool(_first(params, "restore"))))
        return v1_response(200)

    def set_log_level(self, request: Request) -> Response:
        """Youzan's POST /loglevel/set?loglevel=N (glog-style numbers, `nsqpy/daemon/log.py`)."""
        text = _first(_query(request), "loglevel")
        if not text:
            raise HTTPError(400, "MISSING_ARG_LEVEL")
        if not _is_int(text):
            raise HTTPError(400, "BAD_LEVEL_STRING")
        level = youzan_log_level(int(text))
        self.lookupd.log.setLevel(LOG_LEVELS[level])
        self.lookupd.log.info("log level set to %s", level)
        return v1_response(200)

    async def _create_partitioned(self, topic: str, params: dict[str, list[str]]) -> None:
        """Youzan's `/topic/create?partition_num=N&replicator=R`: place the partitions on the
        registered nsqds round-robin, through their HTTP API, and keep the topic's meta for
        `/lookup?metainfo=` (docs/protocol.md §5.6)."""
        partition_num, replicator = self._partition_params(params, max_replicator=5)
        if replicator > 1:
            raise HTTPError(
                400,
                "replicator > 1 needs a cluster: start nsqlookupd and nsqd with"
                " --cluster-leadership-addresses (docs/operations.md)",
            )
        options = self.lookupd.options
        nodes = active(
            self.lookupd.db.find_producers("client", "", ""),
            options.inactive_producer_timeout,
            options.tombstone_lifetime,
        )
        if not nodes:
            raise HTTPError(400, "no nsqd is registered to place the partitions on")
        flags = {
            "orderedmulti": _first(params, "orderedmulti") == "true",
            "ext": _first(params, "extend") == "true",
        }
        sync_every = self._sync_every(params)
        extra = {"syncdisk": sync_every} if sync_every else {}
        for partition in range(partition_num):
            peer = nodes[partition % len(nodes)].peer
            query = urlencode(
                {
                    "topic": topic,
                    "partition": partition,
                    **{key: "true" for key, on in flags.items() if on},
                    **extra,
                }
            )
            url = f"http://{peer.broadcast_address}:{peer.http_port}/topic/create?{query}"
            try:
                await _post(url, options.cluster_secret)
            except OSError as error:
                message = f"creating partition {partition} on {peer.id} failed: {error}"
                raise HTTPError(500, message) from None
        self.lookupd.topic_meta[topic] = {
            "partition_num": partition_num,
            "replica": 1,
            "ordered": flags["orderedmulti"],
            "extend_support": flags["ext"],
            "multi_part": _first(params, "multipart") == "true",
            "disable_channel_auto_create": _first(params, "disable_channel_auto_create") == "true",
        }

    def disable_write(self, request: Request) -> Response:
        """POST /disable/write?type=all|ordered (anything else enables writes again)."""
        kind = _first(_query(request), "type")
        self.lookupd.write_disabled = kind if kind in ("all", "ordered") else None
        return v1_response(200)

    async def topic_delete(self, request: Request) -> Response:
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        coordinator = self.lookupd.coordinator
        if coordinator is not None and topic in coordinator.metas:
            # A cluster topic: Youzan's delete, every partition at once.
            partition = _first(params, "partition")
            if not partition:
                raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION")
            if partition != "**":
                raise HTTPError(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
            await self._operate(self._operations().delete_topic(topic))
        db = self.lookupd.db
        for registration in db.find_registrations("channel", topic, ANY):
            self.lookupd.log.info("DB: removing channel(%s) from topic(%s)", registration[2], topic)
            db.remove_registration(registration)
        for registration in db.find_registrations("topic", topic, ""):
            self.lookupd.log.info("DB: removing topic(%s)", topic)
            db.remove_registration(registration)
        self.lookupd.topic_meta.pop(topic, None)
        return v1_response(200)

    def topic_tombstone(self, request: Request) -> Response:
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        node = _first(params, "node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        self.lookupd.log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        for registration in self.lookupd.db.find_registrations("topic", topic, ""):
            for producer in self.lookupd.db.producers_of(registration):
                peer = producer.peer
                if f"{peer.broadcast_address}:{peer.http_port}" == node:
                    producer.tombstone()
        return v1_response(200)

    async def channel_create(self, request: Request) -> Response:
        topic, channel = _topic_and_channel(_query(request))
        if self._cluster_topic(topic):
            # Made on every partition's leader, which takes it to its followers.
            await self._operate(self._operations().channel_everywhere(topic, channel, delete=False))
        self.lookupd.log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.lookupd.db.add_registration(("channel", topic, channel, None))
        self.lookupd.db.add_registration(("topic", topic, "", None))
        return v1_response(200)

    def _cluster_topic(self, topic: str) -> bool:
        coordinator = self.lookupd.coordinator
        return coordinator is not None and topic in coordinator.metas

    async def channel_delete(self, request: Request) -> Response:
        topic, channel = _topic_and_channel(_query(request))
        if self._cluster_topic(topic):
            await self._operate(self._operations().channel_everywhere(topic, channel, delete=True))
        registrations = self.lookupd.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self.lookupd.log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for registration in registrations:
            self.lookupd.db.remove_registration(registration)
        return v1_response(200)

"""The cluster's numbers, held and added up the way Go nsqadmin's `internal/clusterinfo` does.

Everything here is pure: bodies that nsqlookupd and nsqd returned go in (parsed JSON), the
types Go nsqadmin's `/api/*` serialises come out, with `to_json()` giving Go's field names in
Go's order so the API bodies match Go's byte for byte.

Where Go's aggregation has a bug we do what it means to do, and say so:

* `TopicStats.add` in Go folds the second node's channel into the *first node's own* channel
  object, so that node's row then shows the cluster total. Here a channel seen on several nodes
  gets a fresh aggregate (node `*`) and the per-node rows stay untouched. A channel seen on one
  node only is that node's entry, as in Go (`node` is the nsqd's address, `nodes` is null).
* The e2e aggregate's `min` is the minimum of the nodes' minimums (Go takes the max's min).

Beyond Go: a partition of a cluster topic (nsqd's docs/design.md §14) is on several nsqd, its
leader and its followers, and each reports it in /stats with its replica state (`cluster_*`).
Those copies are one partition, not several: `NodeStats` keeps one row per partition, the
leader's view (see `NodeStats.finish`), so totals count each message once.
"""

import time
from collections.abc import Iterable
from dataclasses import dataclass, field


def semver_key(version: str) -> tuple:
    """A sort key giving semver precedence (build metadata ignored); what Go parses with
    blang/semver. Anything that is not semver sorts as 0.0.0, as Go nsqadmin treats it."""
    core, _, _build = version.partition("+")
    core, _, prerelease = core.partition("-")
    parts = core.split(".")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return (0, 0, 0, (1,))
    # A release sorts after all its pre-releases; numeric identifiers before alphanumeric.
    pre: tuple = (1,)
    if prerelease:
        pre = (0, *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in prerelease.split(".")))
    return (int(parts[0]), int(parts[1]), int(parts[2]), pre)


# --------------------------------------------------------------------------------------------
# nsqd nodes, as nsqlookupd (/nodes, /lookup) or nsqd itself (/info + /stats) describes them


@dataclass
class ProducerTopic:
    topic: str
    tombstoned: bool = False

    def to_json(self) -> dict:
        return {"topic": self.topic, "tombstoned": self.tombstoned}


@dataclass
class Producer:
    """One nsqd (Go's clusterinfo.Producer)."""

    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    topics: list[ProducerTopic] | None = None
    # "lookupd-address/remote-address" for each nsqlookupd this nsqd is registered with.
    remote_addresses: list[str] | None = None
    out_of_date: bool = False

    @classmethod
    def from_lookupd(cls, body: dict) -> "Producer":
        """A producer entry of nsqlookupd's /nodes (topics + tombstones) or /lookup."""
        topic_names = body.get("topics") or []
        tombstones = body.get("tombstones") or []
        topics = [
            ProducerTopic(name, bool(tombstones[i]) if i < len(tombstones) else False)
            for i, name in enumerate(topic_names)
        ]
        return cls(
            remote_address=body.get("remote_address", ""),
            hostname=body.get("hostname", ""),
            broadcast_address=body.get("broadcast_address", ""),
            tcp_port=int(body.get("tcp_port", 0)),
            http_port=int(body.get("http_port", 0)),
            version=body.get("version", ""),
            topics=topics or None,
        )

    @classmethod
    def from_nsqd(cls, address: str, info: dict, stats: dict) -> "Producer":
        """An nsqd asked directly (--nsqd-http-address): its /info and /stats."""
        broadcast_address = info.get("broadcast_address", "")
        http_port = int(info.get("http_port", 0))
        host, _, port = address.rpartition(":")
        if not broadcast_address:  # very old nsqd: Go falls back to the address it was given
            broadcast_address, http_port = host, int(port or 0)
        topics = [ProducerTopic(t["topic_name"]) for t in stats.get("topics") or []]
        return cls(
            hostname=info.get("hostname") or host,
            broadcast_address=broadcast_address,
            tcp_port=int(info.get("tcp_port", 0)),
            http_port=http_port,
            version=info.get("version", ""),
            topics=topics or None,
        )

    @property
    def http_address(self) -> str:
        return f"{self.broadcast_address}:{self.http_port}"

    @property
    def tcp_address(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"

    def is_inconsistent(self, lookupd_count: int) -> bool:
        """Go's IsInconsistent: registered with fewer (or more) lookupds than there are."""
        return len(self.remote_addresses or []) != lookupd_count

    def to_json(self) -> dict:
        return {
            "remote_addresses": self.remote_addresses,
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topics": None if self.topics is None else [t.to_json() for t in self.topics],
            "out_of_date": self.out_of_date,
        }


def merge_lookupd_producers(responses: Iterable[tuple[str, dict]]) -> list[Producer]:
    """Go's GetLookupdProducers: the nsqd of every lookupd's /nodes, one entry per TCP address,
    each remembering which lookupds know it; the older versions are marked out of date."""
    by_address: dict[str, Producer] = {}
    for lookupd_address, body in responses:
        for entry in body.get("producers") or []:
            producer = Producer.from_lookupd(entry)
            known = by_address.get(producer.tcp_address)
            if known is None:
                if producer.topics:
                    producer.topics.sort(key=lambda t: t.topic)
                producer.remote_addresses = []
                by_address[producer.tcp_address] = known = producer
            assert known.remote_addresses is not None  # set above for each producer kept
            known.remote_addresses.append(f"{lookupd_address}/{producer.remote_address or 'N/A'}")
    producers = list(by_address.values())
    mark_out_of_date(producers)
    producers.sort(key=lambda p: p.hostname)
    return producers


def mark_out_of_date(producers: list[Producer]) -> None:
    if not producers:
        return
    newest = max(semver_key(p.version) for p in producers)
    for producer in producers:
        producer.out_of_date = semver_key(producer.version) < newest


def merge_topic_producers(bodies: Iterable[dict]) -> list[Producer]:
    """Go's GetLookupdTopicProducers: the union of /lookup's producers by HTTP address."""
    producers: list[Producer] = []
    seen: set[str] = set()
    for body in bodies:
        for entry in body.get("producers") or []:
            producer = Producer.from_lookupd(entry)
            if producer.http_address not in seen:
                seen.add(producer.http_address)
                producers.append(producer)
    return producers


def find_producer(producers: Iterable[Producer], node: str) -> Producer | None:
    """Go's Producers.Search: the nsqd whose broadcast HTTP address is `node`."""
    return next((p for p in producers if p.http_address == node), None)


# --------------------------------------------------------------------------------------------
# /stats numbers


@dataclass
class E2eLatency:
    """End-to-end processing latency percentiles (Go's E2eProcessingLatencyAggregate). Each
    percentile is a dict of floats; values are nanoseconds."""

    count: int = 0
    percentiles: list[dict[str, float]] | None = None
    topic: str = ""
    channel: str = ""
    host: str = ""

    @classmethod
    def from_nsqd(cls, body: dict | None) -> "E2eLatency":
        body = body or {}
        count = int(body.get("count") or 0)
        percentiles = None
        if body.get("percentiles") is not None:
            percentiles = []
            for entry in body["percentiles"]:
                value = float(entry.get("value", 0))
                percentile = {key: float(v) for key, v in entry.items()}
                percentile.update(min=value, max=value, average=value, count=float(count))
                percentiles.append(percentile)
        return cls(count=count, percentiles=percentiles)

    def add(self, other: "E2eLatency") -> None:
        """Merge another node's percentiles: counts add up, averages weighted by count."""
        self.host = "*"
        self.count += other.count
        for theirs in other.percentiles or []:
            if self.percentiles is None:
                self.percentiles = []
            ours = next(
                (p for p in self.percentiles if p.get("quantile") == theirs.get("quantile")), None
            )
            if ours is None:
                ours = {"quantile": theirs.get("quantile", 0.0)}
                self.percentiles.append(ours)
                ours["min"] = theirs.get("min", 0.0)
            ours["max"] = max(theirs.get("max", 0.0), ours.get("max", 0.0))
            ours["min"] = min(theirs.get("min", 0.0), ours["min"])
            ours["count"] = ours.get("count", 0.0) + theirs.get("count", 0.0)
            if ours["count"] == 0:
                ours["average"] = 0.0
                continue
            average = ours.get("average", 0.0)
            delta = theirs.get("average", 0.0) - average
            ours["average"] = average + delta * theirs.get("count", 0.0) / ours["count"]

    def to_json(self) -> dict:
        percentiles = None
        if self.percentiles is not None:
            # Go writes map[string]float64 with its keys sorted.
            percentiles = [{key: p[key] for key in sorted(p)} for p in self.percentiles]
        return {
            "count": self.count,
            "percentiles": percentiles,
            "topic": self.topic,
            "channel": self.channel,
            "host": self.host,
        }


@dataclass
class ClientStats:
    """A consumer connected to a channel on one nsqd."""

    node: str = ""
    remote_address: str = ""
    version: str = ""
    client_id: str = ""
    hostname: str = ""
    user_agent: str = ""
    connect_ts: int = 0
    connected: int = 0  # nanoseconds since connect_ts, when the stats were read
    in_flight_count: int = 0
    ready_count: int = 0
    finish_count: int = 0
    requeue_count: int = 0
    message_count: int = 0
    sample_rate: int = 0
    deflate: bool = False
    snappy: bool = False
    authed: bool = False
    auth_identity: str = ""
    auth_identity_url: str = ""
    tls: bool = False
    tls_cipher_suite: str = ""
    tls_version: str = ""
    tls_negotiated_protocol: str = ""
    tls_negotiated_protocol_is_mutual: bool = False
    # Youzan's cap on its messages in flight (nsqd's `/channel/setclientlimit`); None where
    # nsqd does not report one.
    limited_rdy: int | None = None

    @classmethod
    def from_nsqd(cls, node: str, body: dict, now: float | None = None) -> "ClientStats":
        known = cls.__dataclass_fields__
        client = cls(**{key: value for key, value in body.items() if key in known})
        client.node = node
        now_seconds = int(time.time() if now is None else now)
        client.connected = (now_seconds - client.connect_ts) * 1_000_000_000
        return client

    @property
    def port(self) -> str:
        return self.remote_address.rpartition(":")[2] if ":" in self.remote_address else "NA"

    @property
    def hostname_port(self) -> str:
        """What Go's UI shows as the client host: its hostname with the remote port."""
        return f"{self.hostname}:{self.port}"

    def to_json(self) -> dict:
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if self.limited_rdy is None:
            del fields["limited_rdy"]
        return fields


_COUNTERS = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
)


@dataclass
class ChannelStats:
    node: str = ""
    hostname: str = ""
    topic_name: str = ""
    channel_name: str = ""
    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    client_count: int = 0
    nodes: list["ChannelStats"] | None = None
    clients: list[ClientStats] | None = None
    paused: bool = False
    e2e_processing_latency: E2eLatency | None = None
    # Log topics (nsqd's docs/design.md §13): messages not yet confirmed, and messages in the
    # partitions' delay queues, all partitions.
    lag: int | None = None
    delayed_queue_count: int | None = None
    # Youzan's skip (nsqd's /channel/skip), on any partition; None where nsqd has no skip.
    skipped: bool | None = None
    # Youzan's rate limit in KiB/s (nsqd's `/channel/ratelimit`, 0: none), the highest of
    # the partitions'; None where nsqd reports none.
    rate_limit_kb: int | None = None
    # Poison messages (nsqd's dead letters): the attempt limit, how many went to the
    # dead-letter topic and how many wait there to be replayed; None on a channel without.
    max_attempts: int | None = None
    dead_letter_topic: str = ""
    dead_letter_count: int | None = None
    dead_letter_waiting: int | None = None

    @classmethod
    def from_nsqd(
        cls, node: str, hostname: str, topic_name: str, body: dict, now: float | None = None
    ) -> "ChannelStats":
        clients = body.get("clients")
        depth = int(body.get("depth", 0))
        backend_depth = int(body.get("backend_depth", 0))
        return cls(
            node=node,
            hostname=hostname,
            topic_name=topic_name,
            channel_name=body.get("channel_name", ""),
            depth=depth,
            memory_depth=depth - backend_depth,
            backend_depth=backend_depth,
            in_flight_count=int(body.get("in_flight_count", 0)),
            deferred_count=int(body.get("deferred_count", 0)),
            requeue_count=int(body.get("requeue_count", 0)),
            timeout_count=int(body.get("timeout_count", 0)),
            message_count=int(body.get("message_count", 0)),
            client_count=int(body.get("client_count", 0)),
            clients=(
                None
                if clients is None
                else [ClientStats.from_nsqd(node, client, now) for client in clients]
            ),
            paused=bool(body.get("paused", False)),
            e2e_processing_latency=E2eLatency.from_nsqd(body.get("e2e_processing_latency")),
            lag=int(body["lag"]) if "lag" in body else None,
            delayed_queue_count=(
                int(body["delayed_queue_count"]) if "delayed_queue_count" in body else None
            ),
            skipped=bool(body["skipped"]) if "skipped" in body else None,
            rate_limit_kb=int(body["rate_limit_kb"]) if "rate_limit_kb" in body else None,
            max_attempts=int(body["max_attempts"]) if "max_attempts" in body else None,
            dead_letter_topic=str(body.get("dead_letter_topic") or ""),
            dead_letter_count=(
                int(body["dead_letter_count"]) if "dead_letter_count" in body else None
            ),
            dead_letter_waiting=(
                int(body["dead_letter_waiting"]) if "dead_letter_waiting" in body else None
            ),
        )

    @classmethod
    def aggregate(cls, topic_name: str, channel_name: str) -> "ChannelStats":
        return cls(topic_name=topic_name, channel_name=channel_name)

    def add(self, other: "ChannelStats") -> None:
        """Go's ChannelStats.Add: fold one node's channel into this cluster-wide one."""
        self.node = "*"
        for counter in _COUNTERS:
            setattr(self, counter, getattr(self, counter) + getattr(other, counter))
        self.paused = self.paused or other.paused
        if other.lag is not None:
            self.lag = (self.lag or 0) + other.lag
        if other.delayed_queue_count is not None:
            self.delayed_queue_count = (self.delayed_queue_count or 0) + other.delayed_queue_count
        if other.skipped is not None:
            self.skipped = bool(self.skipped) or other.skipped
        if other.rate_limit_kb is not None:
            self.rate_limit_kb = max(self.rate_limit_kb or 0, other.rate_limit_kb)
        if other.dead_letter_count is not None:
            self.max_attempts = max(self.max_attempts or 0, other.max_attempts or 0)
            self.dead_letter_topic = self.dead_letter_topic or other.dead_letter_topic
            self.dead_letter_count = (self.dead_letter_count or 0) + other.dead_letter_count
            self.dead_letter_waiting = (self.dead_letter_waiting or 0) + (
                other.dead_letter_waiting or 0
            )
        self.nodes = sorted([*(self.nodes or []), other], key=lambda c: c.hostname)
        if self.e2e_processing_latency is None:
            self.e2e_processing_latency = E2eLatency(
                topic=self.topic_name, channel=self.channel_name, host=self.node
            )
        if other.e2e_processing_latency is not None:
            self.e2e_processing_latency.add(other.e2e_processing_latency)
        clients = [*(self.clients or []), *(other.clients or [])]
        self.clients = sorted(clients, key=lambda c: c.hostname) or None

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "channel_name": self.channel_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "message_count": self.message_count,
            "client_count": self.client_count,
            "nodes": None if self.nodes is None else [n.to_json() for n in self.nodes],
            "clients": None if self.clients is None else [c.to_json() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": _e2e_json(self.e2e_processing_latency),
            **({} if self.lag is None else {"lag": self.lag}),
            **({} if self.skipped is None else {"skipped": self.skipped}),
            **({} if self.rate_limit_kb is None else {"rate_limit_kb": self.rate_limit_kb}),
            **(
                {}
                if self.delayed_queue_count is None
                else {"delayed_queue_count": self.delayed_queue_count}
            ),
            **(
                {}
                if self.dead_letter_count is None
                else {
                    "max_attempts": self.max_attempts,
                    "dead_letter_topic": self.dead_letter_topic,
                    "dead_letter_count": self.dead_letter_count,
                    "dead_letter_waiting": self.dead_letter_waiting,
                }
            ),
        }


@dataclass
class LogRange:
    """What a partition's log holds: offsets (bytes) and counts (messages) of its retained
    start and its end."""

    start_offset: int
    start_count: int
    end_offset: int
    end_count: int

    @classmethod
    def from_nsqd(cls, body: dict) -> "LogRange | None":
        if "log_end_offset" not in body:
            return None
        return cls(
            int(body.get("log_start_offset", 0)),
            int(body.get("log_start_count", 0)),
            int(body["log_end_offset"]),
            int(body.get("log_end_count", 0)),
        )

    @property
    def retained(self) -> int:
        """Messages between the start and the end."""
        return self.end_count - self.start_count


def node_address(node_id: str) -> str:
    """`<ip>:<tcp port>` of a cluster node ID (`<ip>:<rpc port>:<tcp port>:<node id>`), the
    address nsqd's `cluster_leader` names; the ID itself when it has another shape."""
    parts = node_id.split(":")
    return f"{parts[0]}:{parts[2]}" if len(parts) == 4 else node_id


@dataclass
class ReplicaState:
    """A cluster partition's replicas as the nsqd that reported it knows them: its own role,
    the leader (`<ip>:<tcp port>`), the in-sync replicas and catch-up nodes (node IDs), the
    write epoch, and how many replicas the topic asks for."""

    role: str
    leader: str
    isr: list[str]
    catchup: list[str]
    write_epoch: int
    writable: bool
    replicas: int
    under_replicated: bool

    @classmethod
    def from_nsqd(cls, body: dict) -> "ReplicaState | None":
        if "cluster_role" not in body:
            return None
        isr = [str(node) for node in body.get("cluster_isr") or []]
        replicas = int(body.get("cluster_replicas", len(isr)))
        return cls(
            role=str(body["cluster_role"]),
            leader=str(body.get("cluster_leader", "")),
            isr=isr,
            catchup=[str(node) for node in body.get("cluster_catchup") or []],
            write_epoch=int(body.get("cluster_write_epoch", 0)),
            writable=bool(body.get("cluster_writable", False)),
            replicas=replicas,
            under_replicated=bool(body.get("under_replicated", len(isr) < replicas)),
        )

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    def to_json(self) -> dict:
        """nsqd's /stats keys, so scripts read nsqadmin's API as they read nsqd."""
        return {
            "cluster_role": self.role,
            "cluster_leader": self.leader,
            "cluster_isr": self.isr,
            "cluster_catchup": self.catchup,
            "cluster_write_epoch": self.write_epoch,
            "cluster_writable": self.writable,
            "cluster_replicas": self.replicas,
            "under_replicated": self.under_replicated,
        }


@dataclass
class TopicStats:
    node: str = ""
    hostname: str = ""
    topic_name: str = ""
    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    message_count: int = 0
    nodes: list["TopicStats"] | None = None
    channels: list[ChannelStats] | None = None
    paused: bool = False
    e2e_processing_latency: E2eLatency | None = None
    # One partition of a partitioned topic on its node (nsqd's `topic_partition`).
    partition: int | None = None
    # Log topics (nsqd's docs/design.md §13): the partition's log on this node.
    log: LogRange | None = None
    # Cluster topics (nsqd's docs/design.md §14): the partition's replicas, as this node knows.
    replica: ReplicaState | None = None

    @classmethod
    def from_nsqd(
        cls, node: str, hostname: str, body: dict, now: float | None = None
    ) -> "TopicStats":
        name = body.get("topic_name", "")
        depth = int(body.get("depth", 0))
        backend_depth = int(body.get("backend_depth", 0))
        return cls(
            node=node,
            hostname=hostname,
            topic_name=name,
            depth=depth,
            memory_depth=depth - backend_depth,
            backend_depth=backend_depth,
            message_count=int(body.get("message_count", 0)),
            channels=[
                ChannelStats.from_nsqd(node, hostname, name, channel, now)
                for channel in body.get("channels") or []
            ],
            paused=bool(body.get("paused", False)),
            e2e_processing_latency=E2eLatency.from_nsqd(body.get("e2e_processing_latency")),
            partition=int(body["topic_partition"]) if "topic_partition" in body else None,
            log=LogRange.from_nsqd(body),
            replica=ReplicaState.from_nsqd(body),
        )

    @property
    def in_flight_count(self) -> int:
        return sum(channel.in_flight_count for channel in self.channels or [])

    @property
    def channel_depth(self) -> int:
        """Messages waiting in the topic's channels (the topic's own queue is `depth`)."""
        return sum(channel.depth for channel in self.channels or [])

    @property
    def client_count(self) -> int:
        return sum(channel.client_count for channel in self.channels or [])

    @property
    def replicated_nodes(self) -> list["TopicStats"]:
        """The partitions (one row each) that belong to a cluster, by partition number."""
        rows = [node for node in self.nodes or [] if node.replica is not None]
        return sorted(rows, key=lambda node: node.partition or 0)

    @property
    def under_replicated_partitions(self) -> int:
        return sum(
            1
            for node in self.replicated_nodes
            if node.replica is not None and node.replica.under_replicated
        )

    def add(self, other: "TopicStats") -> None:
        """Go's TopicStats.Add: fold one node's topic into this cluster-wide one."""
        self.node = "*"
        self.depth += other.depth
        self.memory_depth += other.memory_depth
        self.backend_depth += other.backend_depth
        self.message_count += other.message_count
        self.paused = self.paused or other.paused
        for channel in other.channels or []:
            if self.channels is None:
                self.channels = []
            index = next(
                (i for i, c in enumerate(self.channels) if c.channel_name == channel.channel_name),
                None,
            )
            if index is None:
                self.channels.append(channel)
                continue
            merged = self.channels[index]
            if merged.nodes is None:
                # Still the first node's own entry: aggregate into a fresh one instead.
                first = merged
                merged = ChannelStats.aggregate(self.topic_name, channel.channel_name)
                merged.add(first)
                self.channels[index] = merged
            merged.add(channel)
        self.nodes = sorted(
            [*(self.nodes or []), other], key=lambda t: (t.hostname, t.partition or 0)
        )
        if self.e2e_processing_latency is None:
            self.e2e_processing_latency = E2eLatency(topic=self.topic_name, host=self.node)
        if other.e2e_processing_latency is not None:
            self.e2e_processing_latency.add(other.e2e_processing_latency)

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "depth": self.depth,
            "memory_depth": self.memory_depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "nodes": None if self.nodes is None else [n.to_json() for n in self.nodes],
            "channels": None if self.channels is None else [c.to_json() for c in self.channels],
            "paused": self.paused,
            "e2e_processing_latency": _e2e_json(self.e2e_processing_latency),
            # Beyond Go's shape, only where nsqd reported them.
            **({} if self.partition is None else {"partition": self.partition}),
            **(
                {}
                if self.log is None
                else {
                    "log_start_offset": self.log.start_offset,
                    "log_start_count": self.log.start_count,
                    "log_end_offset": self.log.end_offset,
                    "log_end_count": self.log.end_count,
                }
            ),
            **({} if self.replica is None else self.replica.to_json()),
            **(
                {"under_replicated_partitions": self.under_replicated_partitions}
                if self.replicated_nodes
                else {}
            ),
        }


def _e2e_json(e2e: E2eLatency | None) -> dict | None:
    return None if e2e is None else e2e.to_json()


@dataclass
class NodeStats:
    """Go's GetNSQDStats result: each node's topics, and its channels aggregated across nodes
    (keyed by channel name when one topic was selected, else by "topic:channel").

    A cluster partition reported by several nodes (leader and followers) is one row, chosen by
    `finish`: until then it waits in `replica_views`."""

    topics: list[TopicStats] = field(default_factory=list)
    channels: dict[str, ChannelStats] = field(default_factory=dict)
    # (the node's row, the topic selected when it was added)
    replica_views: list[tuple[TopicStats, str]] = field(default_factory=list)

    def add_node(
        self,
        node: str,
        hostname: str,
        body: dict,
        selected_topic: str = "",
        selected_channel: str = "",
        now: float | None = None,
    ) -> None:
        """One nsqd's /stats?format=json body."""
        for topic_body in body.get("topics") or []:
            topic = TopicStats.from_nsqd(node, hostname, topic_body, now)
            if selected_topic and topic.topic_name != selected_topic:
                continue
            if selected_channel and topic.channels:
                topic.channels = [c for c in topic.channels if c.channel_name == selected_channel]
            if topic.replica is not None:
                self.replica_views.append((topic, selected_topic))
                continue
            self._add_topic(topic, selected_topic)

    def _add_topic(self, topic: TopicStats, selected_topic: str) -> None:
        self.topics.append(topic)
        for channel in topic.channels or []:
            key = channel.channel_name
            if not selected_topic:
                key = f"{topic.topic_name}:{channel.channel_name}"
            merged = self.channels.get(key)
            if merged is None:
                merged = ChannelStats.aggregate(topic.topic_name, channel.channel_name)
                merged.node = topic.node
                self.channels[key] = merged
            merged.add(channel)

    def finish(self) -> "NodeStats":
        """Every node added: one row for each cluster partition, then the rows by hostname.

        The row of a cluster partition is its leader's: the leader takes the publishes and
        the consumers, so its numbers are the partition's (every holder watches the same
        metadata in etcd, so the replica state is the same). Of several nodes that say they
        lead, the one with
        the highest write epoch does (the others have not yet heard they were replaced). With
        no leader answering, a follower's view stands in, its role saying so."""
        chosen: dict[tuple[str, int | None], TopicStats] = {}
        for view, _selected in self.replica_views:
            key = (view.topic_name, view.partition)
            best = chosen.get(key)
            if best is None or _view_rank(view) > _view_rank(best):
                chosen[key] = view
        # In the order the nodes were added, as the other rows are.
        for view, selected_topic in self.replica_views:
            if chosen.get((view.topic_name, view.partition)) is view:
                self._add_topic(view, selected_topic)
        self.replica_views = []
        self.topics.sort(key=lambda t: t.hostname)
        return self


def _view_rank(view: TopicStats) -> tuple[bool, int, bool]:
    """How much a node's view of a cluster partition is to be believed: a leader's over a
    follower's, a newer write epoch over an older one, an ISR member's over a catch-up node's."""
    replica = view.replica
    if replica is None:
        return (False, -1, False)
    return (replica.is_leader, replica.write_epoch, replica.role == "follower")


def aggregate_topic(topic_name: str, per_node: Iterable[TopicStats]) -> TopicStats:
    """The cluster-wide view of one topic (Go's topicHandler)."""
    total = TopicStats(topic_name=topic_name)
    for topic in per_node:
        if topic.topic_name == topic_name:
            total.add(topic)
    return total


def aggregate_topics(per_node: Iterable[TopicStats]) -> dict[str, TopicStats]:
    """Every topic's cluster-wide view, by name, sorted by name."""
    totals: dict[str, TopicStats] = {}
    for topic in per_node:
        total = totals.get(topic.topic_name)
        if total is None:
            total = totals[topic.topic_name] = TopicStats(topic_name=topic.topic_name)
        total.add(topic)
    return dict(sorted(totals.items()))


def counter_stats(channels: dict[str, ChannelStats]) -> dict[str, dict]:
    """Go's counterHandler: messages per topic:channel:node, the map sorted by key."""
    stats: dict[str, dict] = {}
    for channel in channels.values():
        for per_node in channel.nodes or []:
            key = f"{channel.topic_name}:{channel.channel_name}:{per_node.node}"
            entry = stats.setdefault(
                key,
                {
                    "node": per_node.node,
                    "topic_name": channel.topic_name,
                    "channel_name": channel.channel_name,
                    "message_count": 0,
                },
            )
            entry["message_count"] += per_node.message_count
    return dict(sorted(stats.items()))


def warning_message(messages: list[str]) -> str:
    """Go's maybeWarnMsg: the `message` field of every /api reply."""
    return "WARNING: " + "; ".join(messages) if messages else ""

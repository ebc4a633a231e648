"""A cluster's metadata in etcd (docs/design.md §14): Youzan's key layout and JSON fields, kept
with etcd v3's leases and transactions instead of v2's TTL keys and compare-and-swap.

Under `/<root>/<cluster id>/`:

* `NsqdNodes/Node-<node id>`: a live nsqd (`NodeInfo`), on the nsqd's lease;
* `NsqlookupdInfo/NsqlookupdNodes/Node-<id>`: a live nsqlookupd, on its lease;
* `NsqlookupdInfo/LookupdLeaderSession`: the master nsqlookupd, created if absent on its lease;
* `Topics/<topic>/TopicMeta`: the topic's settings (`TopicMeta`);
* `Topics/<topic>/<partition>/ReplicaInfo`: leader, ISR, catch-up nodes and the write epoch
  (`ReplicaInfo`), written by the master only, each write conditional on the previous one's
  revision (its `Epoch`).

A node ID is `<ip>:<rpc port>:<tcp port>:<node id>`, Youzan's `GenNsqdNodeID`: it says where
the node's replication port is.
"""

import json
from dataclasses import dataclass, replace

from nsqpy.common.flags import Flag, Kind


class ClusterKeys:
    def __init__(self, root: str, cluster_id: str) -> None:
        self.base = f"/{root.strip('/')}/{cluster_id}/"
        self.nsqd_nodes = self.base + "NsqdNodes/"
        self.lookupd_nodes = self.base + "NsqlookupdInfo/NsqlookupdNodes/"
        self.lookupd_leader = self.base + "NsqlookupdInfo/LookupdLeaderSession"
        self.cluster_state = self.base + "NsqlookupdInfo/ClusterState"
        self.topics = self.base + "Topics/"

    def nsqd_node(self, node_id: str) -> str:
        return f"{self.nsqd_nodes}Node-{node_id}"

    def lookupd_node(self, node_id: str) -> str:
        return f"{self.lookupd_nodes}Node-{node_id}"

    def topic_meta(self, topic: str) -> str:
        return f"{self.topics}{topic}/TopicMeta"

    def replica_info(self, topic: str, partition: int) -> str:
        return f"{self.topics}{topic}/{partition}/ReplicaInfo"

    def parse_topic_key(self, key: str) -> tuple[str, int | None, str] | None:
        """(topic, partition or None, what) of a key under `Topics/`: `TopicMeta` or
        `ReplicaInfo`; None for any other key."""
        if not key.startswith(self.topics):
            return None
        parts = key[len(self.topics) :].split("/")
        if len(parts) == 2 and parts[1] == "TopicMeta":
            return parts[0], None, "TopicMeta"
        if len(parts) == 3 and parts[2] == "ReplicaInfo" and parts[1].isdigit():
            return parts[0], int(parts[1]), "ReplicaInfo"
        return None


def cluster_flags(defaults, *, alone: str, node_ttl: str) -> list[Flag]:
    """The cluster-mode flags nsqd and nsqlookupd share (Youzan's names, and etcd's TLS
    files); `alone` says what the daemon is without etcd, `node_ttl` what its lease
    guards."""
    return [
        Flag(
            "cluster-leadership-username",
            Kind.STRING,
            defaults.cluster_leadership_username,
            "cluster mode: etcd user (etcd's auth on)",
        ),
        Flag(
            "cluster-leadership-password",
            Kind.STRING,
            defaults.cluster_leadership_password,
            "cluster mode: the etcd user's password",
        ),
        Flag(
            "cluster-leadership-tls-cert",
            Kind.STRING,
            defaults.cluster_leadership_tls_cert,
            "cluster mode: client certificate for https:// etcd endpoints (etcd's"
            " --client-cert-auth)",
        ),
        Flag(
            "cluster-leadership-tls-key",
            Kind.STRING,
            defaults.cluster_leadership_tls_key,
            "cluster mode: the client certificate's private key",
        ),
        Flag(
            "cluster-leadership-tls-root-ca-file",
            Kind.STRING,
            defaults.cluster_leadership_tls_root_ca_file,
            "cluster mode: CA that signed etcd's certificate (default: the system's)",
        ),
        Flag(
            "cluster-id",
            Kind.STRING,
            defaults.cluster_id,
            "cluster mode: the cluster this node belongs to (its keys' prefix in etcd)",
        ),
        Flag(
            "cluster-leadership-addresses",
            Kind.STRING,
            defaults.cluster_leadership_addresses,
            "cluster mode: etcd v3 endpoints, comma-separated (http://127.0.0.1:2379);"
            f" empty: {alone}",
        ),
        Flag(
            "cluster-leadership-root-dir",
            Kind.STRING,
            defaults.cluster_leadership_root_dir,
            "cluster mode: the root of the cluster's keys in etcd",
        ),
        Flag("cluster-node-ttl", Kind.DURATION, defaults.cluster_node_ttl, node_ttl),
        Flag(
            "cluster-secret",
            Kind.STRING,
            defaults.cluster_secret,
            "cluster mode: a secret every nsqd and nsqlookupd of the cluster shares; given, their"
            " /cluster/* HTTP routes answer only requests carrying it (Authorization: Bearer)",
        ),
    ]


def node_id(ip: str, rpc_port: int, tcp_port: int, worker: int) -> str:
    return f"{ip}:{rpc_port}:{tcp_port}:{worker}"


def is_node_id(text: str) -> bool:
    """Whether `text` is a node ID as `node_id` makes them."""
    parts = text.rsplit(":", 3)
    return (
        len(parts) == 4
        and bool(parts[0])
        and all(part.isascii() and part.isdigit() for part in parts[1:])
        and 0 < int(parts[1]) < 65536
        and 0 < int(parts[2]) < 65536
    )


def rpc_address(node: str) -> tuple[str, int]:
    """Where a node's replication port is, from its ID."""
    ip, rpc_port, _rest = node.split(":", 2)
    return ip, int(rpc_port)


@dataclass(frozen=True)
class NodeInfo:
    id: str
    ip: str
    tcp_port: int
    http_port: int
    rpc_port: int
    # The node's data directory's identity (nsqpy's, as Kafka's directory IDs): a replaced
    # disk, an emptied directory, is a new incarnation, which holds none of what the old one
    # held (docs/design.md §14, "Incarnations").
    incarnation: str = ""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "ID": self.id,
                "NodeIP": self.ip,
                "TcpPort": str(self.tcp_port),
                "HttpPort": str(self.http_port),
                "RpcPort": str(self.rpc_port),
                "Incarnation": self.incarnation,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "NodeInfo":
        value = json.loads(data)
        return cls(
            str(value["ID"]),
            str(value["NodeIP"]),
            int(value["TcpPort"]),
            int(value["HttpPort"]),
            int(value.get("RpcPort") or 0),
            str(value.get("Incarnation") or ""),
        )


@dataclass(frozen=True)
class TopicMeta:
    partition_num: int
    replica: int
    sync_every: int = 0
    retention_day: int = 0
    ordered_multi: bool = False
    multi_part: bool = False
    ext: bool = False
    disable_channel_auto_create: bool = False
    # Youzan's MagicCode: set when the topic is created, so a copy of a partition kept on a
    # node from an earlier topic of the same name (deleted while the node was away) is known.
    magic_code: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "PartitionNum": self.partition_num,
                "Replica": self.replica,
                "SuggestLF": False,
                "SyncEvery": self.sync_every,
                "MagicCode": self.magic_code,
                "RetentionDay": self.retention_day,
                "OrderedMulti": self.ordered_multi,
                "MultiPart": self.multi_part,
                "Ext": self.ext,
                "DisableChannelAutoCreate": self.disable_channel_auto_create,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "TopicMeta":
        value = json.loads(data)
        return cls(
            int(value["PartitionNum"]),
            int(value["Replica"]),
            int(value.get("SyncEvery", 0)),
            int(value.get("RetentionDay", 0)),
            bool(value.get("OrderedMulti", False)),
            bool(value.get("MultiPart", False)),
            bool(value.get("Ext", False)),
            bool(value.get("DisableChannelAutoCreate", False)),
            int(value.get("MagicCode", 0)),
        )


def same_disk_identity(incarnation: str) -> str:
    """The data directory an incarnation (`NodeInfo.incarnation`) is a run of: a node that
    stopped uncleanly starts a new run of the same directory, `<identity>-<run>`."""
    return incarnation.partition("-")[0]


@dataclass(frozen=True)
class ReplicaInfo:
    """Who holds a partition. `epoch` is the etcd revision the info was written at (the
    condition of the next write); `epoch_for_write` is stamped into every index entry and
    checked by followers, and grows with every leader change and ISR join.

    `incarnations` (nsqpy's, `Incarnations` in the JSON) pairs each ISR member with the
    incarnation (`NodeInfo.incarnation`) it held the partition's data in when it entered the
    ISR: a member now in another incarnation lost that data and counts for nothing until it
    caught up and joined again. A member with none recorded (metadata written before
    incarnations) is taken as it is."""

    leader: str
    isr: tuple[str, ...]
    catchup: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    epoch_for_write: int = 1
    epoch: int = 0
    replica: int = 1
    incarnations: tuple[tuple[str, str], ...] = ()

    def followers(self) -> tuple[str, ...]:
        return tuple(node for node in self.isr if node != self.leader)

    def holds(self, node: str) -> bool:
        return node == self.leader or node in self.isr or node in self.catchup

    def incarnation_of(self, node: str) -> str:
        """The incarnation `node` entered the ISR in; "" when none is recorded."""
        for member, incarnation in self.incarnations:
            if member == node:
                return incarnation
        return ""

    def proven(self, node: str, incarnation: str) -> bool:
        """Whether `node`, now in `incarnation`, still holds what it held as an ISR member
        (or nothing says otherwise)."""
        recorded = self.incarnation_of(node)
        return not recorded or not incarnation or recorded == incarnation

    def recording(self, incarnations: dict[str, str]) -> "ReplicaInfo":
        """This info with `incarnations` recorded for the ISR members they name, and only the
        ISR members' kept."""
        merged = dict(self.incarnations)
        merged.update((node, value) for node, value in incarnations.items() if value)
        kept = tuple(sorted((node, value) for node, value in merged.items() if node in self.isr))
        return replace(self, incarnations=kept)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "Leader": self.leader,
                "ISR": list(self.isr),
                "CatchupList": list(self.catchup),
                "Channels": list(self.channels),
                "EpochForWrite": self.epoch_for_write,
                "Epoch": self.epoch,
                "Replica": self.replica,
                "Incarnations": dict(self.incarnations),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, epoch: int) -> "ReplicaInfo":
        """ValueError, KeyError or TypeError for JSON that is not a replica info."""
        value = json.loads(data)
        if not isinstance(value, dict):
            raise TypeError(f"a replica info is a JSON object, not {type(value).__name__}")
        incarnations = value.get("Incarnations") or {}
        if not isinstance(incarnations, dict):
            raise TypeError("Incarnations is not an object")
        return cls(
            str(value.get("Leader", "")),
            _node_list(value.get("ISR")),
            _node_list(value.get("CatchupList")),
            _node_list(value.get("Channels")),
            int(value.get("EpochForWrite", 0)),
            epoch,
            int(value.get("Replica", len(value.get("ISR") or ()) or 1)),
            tuple(sorted((str(node), str(inc)) for node, inc in incarnations.items())),
        )


def _node_list(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"not a list of names: {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class ClusterState:
    """What the master's operators set for the whole cluster (nsqpy's key; Youzan keeps it in
    the master's memory, so a new master forgets it): upgrade mode (no re-replication while
    nodes restart), the nsqd nodes being removed, the nsqlookupd nodes tombstoned (hidden
    from `/listlookup`), and top-N balance. `revision` is the key's, for the next write."""

    upgrading: bool = False
    removing: tuple[str, ...] = ()
    tombstoned_lookupds: tuple[str, ...] = ()
    topn_balance: bool = False
    revision: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "Upgrading": self.upgrading,
                "RemovingNodes": list(self.removing),
                "TombstonedLookupds": list(self.tombstoned_lookupds),
                "TopNBalance": self.topn_balance,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, revision: int) -> "ClusterState":
        value = json.loads(data)
        return cls(
            bool(value.get("Upgrading", False)),
            tuple(value.get("RemovingNodes") or ()),
            tuple(value.get("TombstonedLookupds") or ()),
            bool(value.get("TopNBalance", False)),
            revision,
        )


class TopicsView:
    """Every topic's meta and every partition's replica info, as read and watched from etcd."""

    def __init__(self, keys: ClusterKeys) -> None:
        self.keys = keys
        self.metas: dict[str, TopicMeta] = {}
        # Each meta's revision: the condition of its next write.
        self.meta_revisions: dict[str, int] = {}
        self.infos: dict[tuple[str, int], ReplicaInfo] = {}
        # The revision each key was last written or deleted at: an older value is stale.
        self._revisions: dict[str, int] = {}

    def take(self, key: str, value: bytes | None, revision: int) -> tuple | None:
        """Take one key's new value (None: deleted) at `revision`; `(topic, partition or None,
        "TopicMeta" or "ReplicaInfo")` for a topic key, None for any other. ValueError,
        KeyError or TypeError for a value that is not what the key should hold."""
        parsed = self.keys.parse_topic_key(key)
        if parsed is None:
            return None
        topic, partition, what = parsed
        if partition is None and what != "TopicMeta":
            return None  # a ReplicaInfo key always names its partition
        # What a write's own caller learns after awaiting it can come after the watch has
        # delivered a newer write (or the deletion) of the same key: an older revision never
        # replaces a newer one (a master that kept the older one would retry its next write
        # against it, and fail, for ever).
        if self._revisions.get(key, 0) > revision:
            return parsed
        self._revisions[key] = revision
        if what == "TopicMeta":
            if value is None:
                self.metas.pop(topic, None)
                self.meta_revisions.pop(topic, None)
            else:
                self.metas[topic] = TopicMeta.from_json(value)
                self.meta_revisions[topic] = revision
        else:
            assert partition is not None  # checked above
            if value is None:
                self.infos.pop((topic, partition), None)
            else:
                self.infos[(topic, partition)] = ReplicaInfo.from_json(value, revision)
        return parsed

"""nsqlookupd's options: Go nsqlookupd v1.3.0's flags and defaults (docs/protocol.md §7.2), plus
Youzan's `--allow-write-with-nochannels` for `/lookup?access=w` (docs/protocol.md §5.3)."""

import dataclasses
import socket
from dataclasses import dataclass, field

from nsqpy.common.cluster_meta import cluster_flags
from nsqpy.common.flags import Flag, FlagSet, Kind
from nsqpy.daemon.log import LOG_LEVELS
from nsqpy.daemon.main import standard_flags


@dataclass(frozen=True)
class Options:
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    verbose: bool = False  # deprecated, no effect
    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = field(default_factory=socket.gethostname)
    inactive_producer_timeout: float = 300.0
    tombstone_lifetime: float = 45.0
    allow_write_with_nochannels: bool = False
    # Cluster mode (docs/design.md §14), Youzan's names: on when an etcd address is given.
    cluster_id: str = "nsqpy"
    cluster_leadership_addresses: str = ""
    cluster_leadership_root_dir: str = "NSQMetaData"
    cluster_leadership_username: str = ""
    cluster_leadership_password: str = ""
    cluster_leadership_tls_cert: str = ""
    cluster_leadership_tls_key: str = ""
    cluster_leadership_tls_root_ca_file: str = ""
    cluster_node_ttl: float = 3.0
    cluster_secret: str = ""
    # Given, the operations (topic and channel creation and deletion, Youzan's partition and
    # cluster operations) need an `admin` authorization from these auth servers.
    auth_http_address: list[str] = field(default_factory=list)
    # How long a replica's node may stay gone before the master places the replica elsewhere.
    cluster_replace_dead_after: float = 300.0
    # Youzan's `balance_interval`: the hours of the day (local time, both included) in which the
    # master moves leaders and replicas to balance the nodes; empty: any time; "off": never.
    balance_interval: tuple[str, ...] = ()

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)


def build_flags(defaults: Options | None = None) -> FlagSet:
    d = defaults or Options()
    return FlagSet(
        "nsqlookupd",
        [
            *standard_flags(d.log_level, d.log_prefix, youzan=True),
            Flag(
                "tcp-address",
                Kind.STRING,
                d.tcp_address,
                "<addr>:<port> to listen on for TCP clients",
            ),
            Flag(
                "http-address",
                Kind.STRING,
                d.http_address,
                "<addr>:<port> to listen on for HTTP clients",
            ),
            Flag(
                "broadcast-address",
                Kind.STRING,
                d.broadcast_address,
                "address of this lookupd node, (default to the OS hostname)",
            ),
            Flag(
                "auth-http-address",
                Kind.STRING_LIST,
                (),
                "<addr>:<port> or a full url of an auth server (may be given multiple times);"
                " given, every operation (topic and channel creation and deletion, the partition"
                " and cluster operations) needs an admin authorization for the request's"
                " Authorization: Bearer secret",
                config_key="auth_http_addresses",
            ),
            Flag(
                "inactive-producer-timeout",
                Kind.DURATION,
                d.inactive_producer_timeout,
                "duration of time a producer will remain in the active list since its last ping",
            ),
            Flag(
                "tombstone-lifetime",
                Kind.DURATION,
                d.tombstone_lifetime,
                "duration of time a producer will remain tombstoned if registration remains",
            ),
            Flag(
                "allow-write-with-nochannels",
                Kind.BOOL,
                False,
                "[youzan] list partitions that have no channel yet in /lookup?access=w",
            ),
            *cluster_flags(
                d,
                alone="no cluster",
                node_ttl="cluster mode: how long a master nsqlookupd that stopped answering"
                " etcd stays master (its lease)",
            ),
            Flag(
                "balance-interval",
                Kind.STRING_LIST,
                list(d.balance_interval),
                "cluster mode: the hours of the day in which the master balances leaders and"
                " replicas, as START,END (Youzan's balance_interval, e.g. 2,4; may be given twice,"
                " once each); not given: at any time; off: never",
            ),
            Flag(
                "cluster-replace-dead-after",
                Kind.DURATION,
                d.cluster_replace_dead_after,
                "cluster mode: how long a replica's nsqd may be gone before the master gives the"
                " replica to another nsqd, which catches up from the leader (0 never)",
            ),
        ],
    )


class OptionsError(ValueError):
    """Options nsqlookupd refuses at start."""


def options_from_values(values: dict) -> Options:
    known = {f.name for f in dataclasses.fields(Options)}
    fields = {key: value for key, value in values.items() if key in known}
    if "balance_interval" in fields:
        fields["balance_interval"] = tuple(fields["balance_interval"] or ())
    options = Options(**fields)
    if options.log_level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level {options.log_level!r}")
    balance_window(options)  # refuses a bad --balance-interval at start
    if (
        options.auth_http_address
        and options.cluster_leadership_addresses
        and not options.cluster_secret
    ):
        raise OptionsError(
            "--auth-http-address in cluster mode needs --cluster-secret: the nsqds report to"
            " the master with it"
        )
    return options


def balance_window(options: Options) -> tuple[int, int] | None:
    """The hours in which balancing runs: (0, 23) for any time, None for never. OptionsError
    for a value that is not `off` or two hours."""
    items = [part.strip() for item in options.balance_interval for part in item.split(",")]
    items = [item for item in items if item]
    if not items:
        return (0, 23)
    if items == ["off"]:
        return None
    if len(items) != 2 or not all(item.isdigit() and int(item) <= 23 for item in items):
        raise OptionsError(
            f"invalid balance-interval {','.join(items)!r}: want START,END hours of the day"
            " (0-23), or off"
        )
    start, end = int(items[0]), int(items[1])
    if start > end:
        raise OptionsError(f"invalid balance-interval {start},{end}: START is after END")
    return start, end

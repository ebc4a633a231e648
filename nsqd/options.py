"""nsqd's options: Go nsqd v1.3.0's flags, defaults and config keys (docs/protocol.md §7.1).

The dataclass holds every default once; the flag table below reads them from it, so `--help`,
`--config` and the daemon agree. Durations are float seconds.
"""

import dataclasses
import os
import socket
from dataclasses import dataclass, field

from nsqpy.common.cluster_meta import cluster_flags
from nsqpy.common.flags import Flag, FlagSet, Kind
from nsqpy.common.guid import MAX_NODE_ID, default_node_id
from nsqpy.daemon.log import LOG_LEVELS
from nsqpy.daemon.main import standard_flags
from nsqpy.daemon.net import split_address


def _hostname() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Options:
    # basic
    node_id: int = field(default_factory=lambda: default_node_id(_hostname()))
    log_level: str = "info"
    log_prefix: str = "[nsqd] "
    verbose: bool = False  # deprecated, no effect
    worker_id: bool = False  # deprecated
    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    https_address: str = "0.0.0.0:4152"
    broadcast_address: str = field(default_factory=_hostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    lookupd_tcp_address: list[str] = field(default_factory=list)
    auth_http_address: list[str] = field(default_factory=list)
    http_auth_required: bool = False
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0

    # diskqueue
    data_path: str = ""
    mem_queue_size: int = 10000
    # `--workers`: processes sharing the topics (docs/design.md §15); "auto" is one per core.
    workers: str = "1"
    max_bytes_per_file: int = 100 * 1024 * 1024
    sync_every: int = 2500
    sync_timeout: float = 2.0
    # Log topics (Youzan): acknowledged-out-of-order ranges a channel may hold before it
    # stops reading.
    max_confirm_win: int = 500
    # A channel's attempt limit (0: none, as Go): a message delivered this many times goes to
    # the channel's dead-letter topic instead of out again.
    max_attempts: int = 0
    # Log topics (Youzan): a REQ with at least this delay moves the message to the partition's
    # delay queue (so do those made while the channel's window is full).
    req_to_end_threshold: float = 15 * 60.0
    # Youzan's compatibility switches: a PUB_EXT to a topic that is not ext keeps its message
    # and drops a header of only `##` keys (or `zan_test`); a client that did not IDENTIFY
    # `extend_support` may subscribe to an ext topic (it gets the messages without headers).
    allow_ext_compatible: bool = False
    allow_sub_ext_compatible: bool = False
    # Youzan's cap on TCP connections: one over it is told `too much client connections`.
    max_conn_for_client: int = 500_000
    # Youzan's channel delivery limit in KiB/s of bodies over 1 KiB (nsqd/rate_limit.py); 0 is
    # none (Youzan's default is 102400).
    channel_ratelimit_kb: int = 0
    # Youzan's cap on a log topic's body bytes taken and not yet acknowledged: a publish that
    # would pass it is refused E_PUB_TOO_MUCH_WAITING (HTTP 429).
    max_pub_waiting_size: int = 200 * 1024 * 1024
    # Youzan's cap on a channel's messages in the delay queue: a long REQ moves there below it,
    # a full window's or a much-requeued message's up to ten times it (0: no cap).
    max_channel_delayed_qnum: int = 160_000
    # Log topics: consumed segments are kept this many days, or up to this many bytes per day
    # of retention (Youzan's --retention-days and --retention-size-per-day).
    retention_days: int = 7
    retention_size_per_day: int = 16 * 1024**3
    # Topics, by name or shell-style pattern, stored as a log although created unpartitioned.
    log_topic: list[str] = field(default_factory=list)
    # Log topics: how long a partition remembers an idempotent producer it has not heard
    # from (nsqd/idempotence.py); its state is rebuilt from this much of the log.
    producer_id_expiration: float = 3600.0
    # Cluster mode (docs/design.md §14), Youzan's names: on when an etcd address is given.
    cluster_id: str = "nsqpy"
    cluster_leadership_addresses: str = ""
    cluster_leadership_root_dir: str = "NSQMetaData"
    cluster_leadership_username: str = ""
    cluster_leadership_password: str = ""
    cluster_leadership_tls_cert: str = ""
    cluster_leadership_tls_key: str = ""
    cluster_leadership_tls_root_ca_file: str = ""
    # Mutual TLS on the replication links (`--rpc-port`): this node's certificate and key,
    # and the cluster's CA, which must have signed every peer's.
    cluster_tls_cert: str = ""
    cluster_tls_key: str = ""
    cluster_tls_root_ca_file: str = ""
    rpc_port: str = "0"
    broadcast_rpc_port: int = 0
    cluster_node_ttl: float = 3.0
    cluster_secret: str = ""

    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_selection_count: int = 20
    queue_scan_worker_pool_max: int = 4
    queue_scan_dirty_percent: float = 0.25

    # msg and command
    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_req_timeout: float = 60 * 60.0
    client_timeout: float = 60.0  # Go's ClientTimeout: no flag; the default heartbeat is half

    # client overridable configuration
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0

    # statsd integration
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False

    # e2e message latency
    e2e_processing_latency_window_time: float = 10 * 60.0
    e2e_processing_latency_percentile: list[float] = field(default_factory=list)

    # TLS config
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"

    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True

    def effective_data_path(self) -> str:
        """Go nsqd stores data in the current directory when --data-path is empty."""
        return self.data_path or os.getcwd()

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)


def _parse_workers(text: str) -> str:
    """`--workers`: "auto", or a number from 1 up (a config file may give it as a number)."""
    worker_count(text)
    return text


def _parse_tls_required(text: str) -> str:
    # Go's tlsRequiredOption: lower-cased, "tcp-https", else ParseBool.
    if text.lower() == "tcp-https":
        return "tcp-https"
    lowered = text.lower()
    if lowered in ("1", "t", "true"):
        return "true"
    if lowered in ("0", "f", "false"):
        return "false"
    raise ValueError("parse error")


_TLS_VERSIONS = ("ssl3.0", "tls1.0", "tls1.1", "tls1.2", "tls1.3")
# A message's attempts are a uint16 on the wire.
MAX_ATTEMPTS = 65535


def _parse_tls_min_version(text: str) -> str:
    lowered = text.lower()
    if lowered == "":
        return "tls1.0"
    if lowered not in _TLS_VERSIONS:
        raise ValueError(f'unknown tlsVersionOption "{text}"')
    return lowered


def build_flags(defaults: Options | None = None) -> FlagSet:
    d = defaults or Options()
    return FlagSet(
        "nsqd",
        [
            *standard_flags(d.log_level, d.log_prefix, youzan=True),
            Flag(
                "node-id",
                Kind.INT64,
                d.node_id,
                "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
                config_key="id",
            ),
            Flag("worker-id", Kind.BOOL, False, "[deprecated] use --node-id"),
            Flag(
                "https-address",
                Kind.STRING,
                d.https_address,
                "<addr>:<port> to listen on for HTTPS clients",
            ),
            Flag(
                "http-address",
                Kind.STRING,
                d.http_address,
                "address to listen on for HTTP clients (<addr>:<port> for TCP/IP or <path> for unix socket)",
            ),
            Flag(
                "tcp-address",
                Kind.STRING,
                d.tcp_address,
                "address to listen on for TCP clients (<addr>:<port> for TCP/IP or <path> for unix socket)",
            ),
            Flag(
                "auth-http-address",
                Kind.STRING_LIST,
                (),
                "<addr>:<port> or a full url to query auth server (may be given multiple times)",
                config_key="auth_http_addresses",
            ),
            Flag(
                "http-auth-required",
                Kind.BOOL,
                False,
                "every HTTP route but /ping and /info asks --auth-http-address about the"
                " request's Authorization: Bearer secret (publish, subscribe or admin); off, only"
                " the routes that read or move messages do",
            ),
            Flag(
                "broadcast-address",
                Kind.STRING,
                d.broadcast_address,
                "address that will be registered with lookupd (defaults to the OS hostname)",
            ),
            Flag(
                "broadcast-tcp-port",
                Kind.INT,
                0,
                "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)",
            ),
            Flag(
                "broadcast-http-port",
                Kind.INT,
                0,
                "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)",
            ),
            Flag(
                "lookupd-tcp-address",
                Kind.STRING_LIST,
                (),
                "lookupd TCP address (may be given multiple times)",
                config_key="nsqlookupd_tcp_addresses",
            ),
            Flag(
                "http-client-connect-timeout",
                Kind.DURATION,
                d.http_client_connect_timeout,
                "timeout for HTTP connect",
            ),
            Flag(
                "http-client-request-timeout",
                Kind.DURATION,
                d.http_client_request_timeout,
                "timeout for HTTP request",
            ),
            Flag("data-path", Kind.STRING, "", "path to store disk-backed messages"),
            Flag(
                "workers",
                Kind.VALUE,
                d.workers,
                "processes that share the topics, each on a core: a number or 'auto' (one per"
                " core)",
                parse=_parse_workers,
                default_text=d.workers,
            ),
            Flag(
                "mem-queue-size",
                Kind.INT64,
                d.mem_queue_size,
                "number of messages to keep in memory (per topic/channel)",
            ),
            Flag(
                "max-bytes-per-file",
                Kind.INT64,
                d.max_bytes_per_file,
                "number of bytes per diskqueue file before rolling",
            ),
            Flag("sync-every", Kind.INT64, d.sync_every, "number of messages per diskqueue fsync"),
            Flag(
                "sync-timeout",
                Kind.DURATION,
                d.sync_timeout,
                "duration of time per diskqueue fsync",
            ),
            Flag(
                "max-confirm-win",
                Kind.INT64,
                d.max_confirm_win,
                "log topics: most message ranges a channel may hold acknowledged out of order"
                " before it stops reading",
            ),
            Flag(
                "max-attempts",
                Kind.INT,
                d.max_attempts,
                "a channel's attempt limit (0: none): a message delivered this many times goes"
                " to the channel's dead-letter topic <topic>.<channel>.dead instead of out again"
                " (a channel's own with /channel/setmaxattempts)",
            ),
            Flag(
                "allow-ext-compatible",
                Kind.BOOL,
                d.allow_ext_compatible,
                "a PUB_EXT to a topic that is not ext publishes its message, dropping a header"
                " of only '##' keys",
            ),
            Flag(
                "allow-sub-ext-compatible",
                Kind.BOOL,
                d.allow_sub_ext_compatible,
                "a client without extend_support may subscribe to an ext topic (no headers)",
            ),
            Flag(
                "max-conn-for-client",
                Kind.INT,
                d.max_conn_for_client,
                "TCP connections at most: one more is told 'too much client connections'",
            ),
            Flag(
                "max-channel-delayed-qnum",
                Kind.INT64,
                d.max_channel_delayed_qnum,
                "a channel's messages in its partition's delay queue: a long REQ moves there"
                " only below this, other moves up to ten times it (0: no cap)",
            ),
            Flag(
                "max-pub-waiting-size",
                Kind.INT64,
                d.max_pub_waiting_size,
                "a log topic refuses a publish that would leave more body bytes than this"
                " waiting to be acknowledged (E_PUB_TOO_MUCH_WAITING)",
            ),
            Flag(
                "channel-ratelimit-kb",
                Kind.INT,
                d.channel_ratelimit_kb,
                "each channel delivers bodies over 1 KiB at most this many KiB/s (0: no limit)",
            ),
            Flag(
                "req-to-end-threshold",
                Kind.DURATION,
                d.req_to_end_threshold,
                "log topics: a requeue with at least this delay moves the message to the"
                " partition's delay queue",
            ),
            Flag(
                "retention-days",
                Kind.INT,
                d.retention_days,
                "log topics: days a consumed segment is kept",
            ),
            Flag(
                "retention-size-per-day",
                Kind.INT64,
                d.retention_size_per_day,
                "log topics: bytes of consumed segments kept per day of retention",
            ),
            Flag(
                "log-topic",
                Kind.STRING_LIST,
                (),
                "store the topics this name or pattern (fnmatch: '*', 'orders.*') matches as"
                " logs, as partitioned topics are, though created unpartitioned (may be given"
                " multiple times)",
                config_key="log_topics",
            ),
            Flag(
                "producer-id-expiration",
                Kind.DURATION,
                d.producer_id_expiration,
                "log topics: how long a partition remembers an idempotent producer (PUB_SEQ,"
                " MPUB_SEQ) it has not heard from; a new leader reads this much of the log back",
            ),
            *cluster_flags(
                d,
                alone="a single node",
                node_ttl="cluster mode: how long a node that stopped answering etcd stays in the"
                " cluster (its lease; a leader's failover starts after it)",
            ),
            Flag(
                "broadcast-rpc-port",
                Kind.INT,
                d.broadcast_rpc_port,
                "cluster mode: the replication port other nsqds are told to use, when they"
                " reach this one through a proxy or NAT (default: --rpc-port's)",
            ),
            Flag(
                "rpc-port",
                Kind.STRING,
                d.rpc_port,
                "cluster mode: port (or <addr>:<port>) other nsqds replicate through (0: any)",
            ),
            Flag(
                "cluster-tls-cert",
                Kind.STRING,
                d.cluster_tls_cert,
                "cluster mode: this node's certificate for the replication links (mutual TLS)",
            ),
            Flag(
                "cluster-tls-key",
                Kind.STRING,
                d.cluster_tls_key,
                "cluster mode: the replication certificate's private key",
            ),
            Flag(
                "cluster-tls-root-ca-file",
                Kind.STRING,
                d.cluster_tls_root_ca_file,
                "cluster mode: the cluster's CA: replication peers must present a certificate it"
                " signed",
            ),
            Flag(
                "queue-scan-worker-pool-max",
                Kind.INT,
                d.queue_scan_worker_pool_max,
                "max concurrency for checking in-flight and deferred message timeouts",
            ),
            Flag(
                "queue-scan-selection-count",
                Kind.INT,
                d.queue_scan_selection_count,
                "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
            ),
            Flag(
                "msg-timeout",
                Kind.DURATION,
                d.msg_timeout,
                "default duration to wait before auto-requeing a message",
            ),
            Flag(
                "max-msg-timeout",
                Kind.DURATION,
                d.max_msg_timeout,
                "maximum duration before a message will timeout",
            ),
            Flag(
                "max-msg-size",
                Kind.INT64,
                d.max_msg_size,
                "maximum size of a single message in bytes",
            ),
            Flag(
                "max-req-timeout",
                Kind.DURATION,
                d.max_req_timeout,
                "maximum requeuing timeout for a message",
            ),
            Flag(
                "max-body-size",
                Kind.INT64,
                d.max_body_size,
                "maximum size of a single command body",
            ),
            Flag(
                "max-heartbeat-interval",
                Kind.DURATION,
                d.max_heartbeat_interval,
                "maximum client configurable duration of time between client heartbeats",
            ),
            Flag("max-rdy-count", Kind.INT64, d.max_rdy_count, "maximum RDY count for a client"),
            Flag(
                "max-output-buffer-size",
                Kind.INT64,
                d.max_output_buffer_size,
                "maximum client configurable size (in bytes) for a client output buffer",
            ),
            Flag(
                "max-output-buffer-timeout",
                Kind.DURATION,
                d.max_output_buffer_timeout,
                "maximum client configurable duration of time between flushing to a client",
            ),
            Flag(
                "min-output-buffer-timeout",
                Kind.DURATION,
                d.min_output_buffer_timeout,
                "minimum client configurable duration of time between flushing to a client",
            ),
            Flag(
                "output-buffer-timeout",
                Kind.DURATION,
                d.output_buffer_timeout,
                "default duration of time between flushing data to clients",
            ),
            Flag(
                "max-channel-consumers",
                Kind.INT,
                0,
                "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
            ),
            Flag(
                "statsd-address",
                Kind.STRING,
                "",
                "UDP <addr>:<port> of a statsd daemon for pushing stats",
            ),
            Flag(
                "statsd-interval",
                Kind.DURATION,
                d.statsd_interval,
                "duration between pushing to statsd",
            ),
            Flag(
                "statsd-mem-stats",
                Kind.BOOL,
                d.statsd_mem_stats,
                "toggle sending memory and GC stats to statsd",
            ),
            Flag(
                "statsd-prefix",
                Kind.STRING,
                d.statsd_prefix,
                "prefix used for keys sent to statsd (%s for host replacement)",
            ),
            Flag(
                "statsd-udp-packet-size",
                Kind.INT,
                d.statsd_udp_packet_size,
                "the size in bytes of statsd UDP packets",
            ),
            Flag(
                "statsd-exclude-ephemeral",
                Kind.BOOL,
                False,
                "Skip ephemeral topics and channels when sending stats to statsd",
            ),
            Flag(
                "e2e-processing-latency-window-time",
                Kind.DURATION,
                d.e2e_processing_latency_window_time,
                "calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile calculations from the past 60 seconds)",
            ),
            Flag(
                "e2e-processing-latency-percentile",
                Kind.FLOAT_LIST,
                (),
                "message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma separated '1.0,0.99,0.95', default none)",
                config_key="e2e_processing_latency_percentiles",
            ),
            Flag("tls-cert", Kind.STRING, "", "path to certificate file"),
            Flag("tls-key", Kind.STRING, "", "path to key file"),
            Flag(
                "tls-client-auth-policy",
                Kind.STRING,
                "",
                "client certificate auth policy ('require' or 'require-verify')",
            ),
            Flag("tls-root-ca-file", Kind.STRING, "", "path to certificate authority file"),
            Flag(
                "tls-required",
                Kind.VALUE,
                "false",
                "require TLS for client connections (true, false, tcp-https)",
                parse=_parse_tls_required,
                bool_flag=True,
                default_text="",
            ),
            Flag(
                "tls-min-version",
                Kind.VALUE,
                d.tls_min_version,
                "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
                parse=_parse_tls_min_version,
                default_text=d.tls_min_version,
            ),
            Flag(
                "deflate",
                Kind.BOOL,
                d.deflate,
                "enable deflate feature negotiation (client compression)",
            ),
            Flag(
                "max-deflate-level",
                Kind.INT,
                d.max_deflate_level,
                "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
            ),
            Flag(
                "snappy",
                Kind.BOOL,
                d.snappy,
                "enable snappy feature negotiation (client compression)",
            ),
        ],
    )


class OptionsError(ValueError):
    """Options Go nsqd refuses at start (`failed to instantiate nsqd - ...`)."""


def options_from_values(values: dict) -> Options:
    """Options from parsed flag values (after the config merge), validated as Go's nsqd.New."""
    known = {f.name for f in dataclasses.fields(Options)}
    options = Options(**{key: value for key, value in values.items() if key in known})
    if not 0 <= options.node_id <= MAX_NODE_ID:
        raise OptionsError("--node-id must be [0,1024)")
    if options.log_level not in LOG_LEVELS:
        raise OptionsError(f"invalid log level {options.log_level!r}")
    if not 1 <= options.max_deflate_level <= 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    for percentile in options.e2e_processing_latency_percentile:
        if not 0 < percentile <= 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {percentile}")
    if options.http_auth_required and not options.auth_http_address:
        raise OptionsError("--http-auth-required needs --auth-http-address")
    if (
        options.auth_http_address
        and options.cluster_leadership_addresses
        and not options.cluster_secret
    ):
        raise OptionsError(
            "--auth-http-address in cluster mode needs --cluster-secret: the master nsqlookupd"
            " reads partition offsets and moves channels with it"
        )
    if options.tls_client_auth_policy and options.tls_required == "false":
        options = options.replace(tls_required="true")
    if options.tls_client_auth_policy not in ("", "require", "require-verify"):
        raise OptionsError(
            f"invalid --tls-client-auth-policy {options.tls_client_auth_policy!r}"
            " (must be 'require' or 'require-verify')"
        )
    if options.tls_required != "false" and not (options.tls_cert and options.tls_key):
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    if bool(options.tls_cert) != bool(options.tls_key):
        raise OptionsError("--tls-cert and --tls-key must be given together")
    if options.mem_queue_size < 0:
        raise OptionsError("--mem-queue-size must be >= 0")
    if options.retention_days < 0:
        raise OptionsError("--retention-days must be >= 0")
    if options.max_confirm_win < 1:
        raise OptionsError("--max-confirm-win must be >= 1")
    if not 0 <= options.max_attempts <= MAX_ATTEMPTS:
        raise OptionsError(f"--max-attempts must be between 0 and {MAX_ATTEMPTS}")
    if options.sync_every < 1:
        raise OptionsError("--sync-every must be >= 1")
    if options.max_pub_waiting_size < 1:
        raise OptionsError("--max-pub-waiting-size must be >= 1")
    if options.max_channel_delayed_qnum < 0:
        raise OptionsError("--max-channel-delayed-qnum must be >= 0")
    if options.channel_ratelimit_kb < 0:
        raise OptionsError("--channel-ratelimit-kb must be >= 0")
    workers = worker_count(options.workers)
    if workers > 1 and split_address(options.tcp_address) is None:
        raise OptionsError("--workers above 1 needs a TCP host:port, not a unix socket")
    cluster_tls = (
        options.cluster_tls_cert,
        options.cluster_tls_key,
        options.cluster_tls_root_ca_file,
    )
    if any(cluster_tls) and not all(cluster_tls):
        raise OptionsError(
            "--cluster-tls-cert, --cluster-tls-key and --cluster-tls-root-ca-file must be given"
            " together (mutual TLS needs this node's certificate and the cluster's CA)"
        )
    return options


def worker_count(text: str) -> int:
    """`--workers`: a number from 1 up, or "auto" (this machine's cores)."""
    if text == "auto":
        return max(os.cpu_count() or 1, 1)
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise OptionsError(f"must be a number >= 1 or 'auto', not {text!r}")
    return int(text)

"""nsqd's HTTP API, endpoint for endpoint Go nsqd v1.3.0's http.go (docs/protocol.md §6.1).

Handlers check their arguments in Go's order and fail with Go's status and message, so a
client or nsqadmin sees the same response from either daemon.
"""

import array
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus

import trio

from nsqpy.common.command_parser import parse_http_mpub_body
from nsqpy.common.consume_offset import parse_consume_offset
from nsqpy.common.errors import ProtocolError
from nsqpy.common.goformat import GoNumbers, go_atoi, go_parse_int
from nsqpy.common.names import is_valid_name
from nsqpy.common.version import VERSION
from nsqpy.daemon.free_memory import release_free_memory
from nsqpy.daemon.http_access import HTTPAccess, NeedOf, cluster_route_needs, need_of
from nsqpy.daemon.http_server import (
    JSON_CONTENT_TYPE,
    NSQ_V1_HEADER,
    TEXT_CONTENT_TYPE,
    CachedResponse,
    CommitWait,
    HTTPError,
    Request,
    Response,
    Router,
    text_response,
    v1_response,
)
from nsqpy.daemon.http_server import first_param as _first
from nsqpy.daemon.http_server import query_params as _query
from nsqpy.daemon.log import parse_log_level, youzan_log_level
from nsqpy.nsqd import dead_letters
from nsqpy.nsqd.cluster_partition import ClusterWriteError, NotLedHere
from nsqpy.nsqd.connection import LIVE_CONNECTIONS
from nsqpy.nsqd.data_fix import fix_partition
from nsqpy.nsqd.ext_header import (
    TRACE_ID_KEY,
    ExtHeaderError,
    encode_fields,
    only_internal_keys,
    parse_fields,
    trace_id_of,
    with_http_headers,
)
from nsqpy.nsqd.hourly_bytes import HOURS
from nsqpy.nsqd.message_queue import RetainedLog
from nsqpy.nsqd.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from nsqpy.nsqd.metrics import render_metrics
from nsqpy.nsqd.options import MAX_ATTEMPTS
from nsqpy.nsqd.placement import NOT_LEADER, Operation
from nsqpy.nsqd.publish import PublishError, TooMuchWaiting, publish, publish_traced
from nsqpy.nsqd.stats import channel_debug_text, gather, memory_stats, text_report
from nsqpy.partition_log import ID_PARTITION_SHIFT, Position, record_size
from nsqpy.partition_log.files import LogFiles

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic

# Every successful publish gets the same bytes (Go's RespondV1 with the string "OK").
_OK = CachedResponse(200, b"OK", [NSQ_V1_HEADER, ("Content-Type", TEXT_CONTENT_TYPE)])
# A publish's OK: sent once the group commit has synced what it wrote.
_OK_WRITTEN = CachedResponse(
    200, b"OK", [NSQ_V1_HEADER, ("Content-Type", TEXT_CONTENT_TYPE)], after_commit=True
)
# A JSON body of `null` (v1_response sends None as an empty body).
_JSON_NULL = b"null"
# Go's boolParams for include_clients / include_mem and /mpub's binary.
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
# What Go's strconv.ParseBool takes (Youzan's `leaderOnly`).
_GO_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


# How many distinct /pub query strings are remembered before the memory starts afresh.
_PUB_TARGET_CACHE = 1024


# What each route needs (docs/operations.md, "Securing a cluster"): a permission, on the
# request's topic ("topic"), topic and channel ("channel"), or the node ("node").
# With --auth-http-address: the routes that read messages or move a channel's messages.
MESSAGE_ROUTES = {
    ("GET", "/partition/offsets"): ("subscribe", "topic"),
    ("GET", "/partition/search"): ("subscribe", "topic"),
    ("GET", "/partition/fetch"): ("subscribe", "topic"),
    ("POST", "/channel/setoffset"): ("subscribe", "channel"),
    ("POST", "/channel/emptydelayed"): ("subscribe", "channel"),
    ("POST", "/channel/requeuedelayed"): ("subscribe", "channel"),
    ("POST", "/channel/finishmemdelayed"): ("subscribe", "channel"),
    ("POST", "/channel/replaydeadletters"): ("subscribe", "channel"),
    ("POST", "/message/finish"): ("subscribe", "channel"),
    ("POST", "/channel/fixconfirmed"): ("subscribe", "channel"),
    ("GET", "/message/get"): ("subscribe", "topic"),
    ("GET", "/message/stats"): ("subscribe", "channel"),
}
# With --http-auth-required besides: every other route but /ping and /info.
EVERY_OTHER_ROUTE = {
    ("POST", "/pub"): ("publish", "topic"),
    ("POST", "/put"): ("publish", "topic"),
    ("POST", "/mpub"): ("publish", "topic"),
    ("POST", "/pub_ext"): ("publish", "topic"),
    ("POST", "/pubtrace"): ("publish", "topic"),
    ("POST", "/topic/create"): ("publish", "topic"),
    ("POST", "/channel/create"): ("subscribe", "channel"),
    ("GET", "/stats"): ("subscribe", "node"),
    ("GET", "/serverstats"): ("subscribe", "node"),
    ("GET", "/coordinator/stats"): ("subscribe", "node"),
    ("GET", "/message/historystats"): ("subscribe", "node"),
    ("GET", "/metrics"): ("subscribe", "node"),
    ("POST", "/topic/delete"): ("admin", "topic"),
    ("POST", "/topic/empty"): ("admin", "topic"),
    ("POST", "/topic/pause"): ("admin", "topic"),
    ("POST", "/topic/unpause"): ("admin", "topic"),
    ("POST", "/topic/greedyclean"): ("admin", "topic"),
    ("POST", "/topic/cleanunused"): ("admin", "node"),
    ("POST", "/topic/fixdata"): ("admin", "topic"),
    ("POST", "/channel/delete"): ("admin", "channel"),
    ("POST", "/channel/empty"): ("admin", "channel"),
    ("POST", "/channel/pause"): ("admin", "channel"),
    ("POST", "/channel/unpause"): ("admin", "channel"),
    ("POST", "/channel/skip"): ("admin", "channel"),
    ("POST", "/channel/setorder"): ("admin", "channel"),
    ("POST", "/channel/ratelimit"): ("admin", "channel"),
    ("POST", "/channel/setclientlimit"): ("admin", "channel"),
    ("POST", "/channel/unskip"): ("admin", "channel"),
    ("POST", "/channel/setmaxattempts"): ("admin", "channel"),
    ("PUT", "/delayqueue/enable"): ("admin", "node"),
    ("GET", "/config/*"): ("admin", "node"),
    ("PUT", "/config/*"): ("admin", "node"),
    ("POST", "/debug/freememory"): ("admin", "node"),
    ("GET", "/debug/connections"): ("subscribe", "node"),
    ("POST", "/loglevel/set"): ("admin", "node"),
    ("POST", "/disable/write"): ("admin", "node"),
}
# What the master nsqlookupd asks of a node: only the cluster's own callers (--cluster-secret);
# without one, an admin under --http-auth-required.
CLUSTER_ROUTES = (("GET", "/cluster/partitions"), ("POST", "/cluster/leader/handover"))


def http_access(nsqd: "NSQD") -> HTTPAccess | None:
    """nsqd's access to its HTTP routes; None when nothing is asked for."""
    options = nsqd.options
    internal = nsqd.worker.secret if nsqd.worker is not None else ""
    if not (options.auth_http_address or options.cluster_secret or internal):
        return None
    return HTTPAccess(
        auth_addresses=options.auth_http_address,
        timeout=options.http_client_connect_timeout + options.http_client_request_timeout,
        cluster_secrets=[secret for secret in (options.cluster_secret, internal) if secret],
        log=nsqd.log,
        realm="nsqd",
    )


def route_needs(options) -> dict[tuple[str, str], NeedOf]:
    """Each guarded route's need, by the options' mode."""
    table: dict[tuple[str, str], tuple[str, str]] = {}
    if options.auth_http_address:
        table.update(MESSAGE_ROUTES)
        if options.http_auth_required:
            table.update(EVERY_OTHER_ROUTE)
    needs = {route: need_of(*entry) for route, entry in table.items()}
    needs.update(
        cluster_route_needs(CLUSTER_ROUTES, options.cluster_secret, options.http_auth_required)
    )
    return needs


class HTTPAPI:
    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd
        self._pub_targets: dict[str, tuple[str, int, float]] = {}
        # Every handler but pause's answers at once, on the HTTP poller; a publish's answer waits
        # for the group commit (one fsync per queue for all of a poller pass's publishes).
        # Pausing waits for nsqd.dat to be written, off the poller.
        # A publish that overflows to a diskqueue is written with the rest of the poller
        # pass's (one write per queue), before its answer goes out.
        router = self.router = Router(
            commit=self._commit,
            commit_due=self._commit_due,
            writes=nsqd.storage,
            access=http_access(nsqd),
        )
        router.add("GET", "/ping", self.ping)
        router.add("GET", "/info", self.info)
        options = lambda: self.nsqd.options  # noqa: E731 - read at request time
        for path in ("/pub", "/put"):
            router.add(
                "POST",
                path,
                self.pub,
                max_body=lambda: options().max_msg_size,
                defers_writes=True,
            )
        router.add(
            "POST",
            "/mpub",
            self.mpub,
            max_body=lambda: options().max_body_size,
            defers_writes=True,
        )
        router.add("GET", "/stats", self.stats)
        router.add("POST", "/topic/create", self.topic_create)
        router.add("POST", "/topic/delete", self.topic_delete)
        router.add("POST", "/topic/empty", self.topic_empty)
        router.add("POST", "/topic/pause", self.topic_pause)
        router.add("POST", "/topic/unpause", self.topic_pause)
        router.add("POST", "/channel/create", self.channel_create)
        router.add("POST", "/channel/delete", self.channel_delete)
        router.add("POST", "/channel/empty", self.channel_empty)
        router.add("POST", "/channel/emptydelayed", self.channel_empty_delayed)
        router.add("POST", "/channel/requeuedelayed", self.channel_requeue_delayed)
        router.add("POST", "/channel/finishmemdelayed", self.channel_finish_memory_delayed)
        router.add("POST", "/message/finish", self.message_finish)
        router.add("GET", "/message/get", self.message_get)
        router.add("PUT", "/delayqueue/enable", self.delay_queue_enable)
        router.add("POST", "/channel/setmaxattempts", self.channel_set_max_attempts)
        router.add("POST", "/channel/replaydeadletters", self.channel_replay_dead_letters)
        router.add("POST", "/channel/pause", self.channel_pause)
        router.add("POST", "/channel/unpause", self.channel_pause)
        router.add("POST", "/channel/skip", self.channel_skip)
        router.add("POST", "/channel/unskip", self.channel_skip)
        router.add("POST", "/channel/setorder", self.channel_set_order)
        router.add("POST", "/channel/ratelimit", self.channel_rate_limit)
        router.add("POST", "/channel/fixconfirmed", self.channel_fix_confirmed)
        router.add("GET", "/serverstats", self.server_stats)
        router.add("GET", "/coordinator/stats", self.coordinator_stats)
        router.add("GET", "/message/stats", self.message_stats)
        router.add("GET", "/message/historystats", self.message_history_stats)
        router.add("POST", "/channel/setclientlimit", self.channel_set_client_limit)
        router.add("GET", "/config/*", self.config)
        router.add("PUT", "/config/*", self.config)
        router.add("POST", "/debug/freememory", self.free_memory)
        router.add("GET", "/debug/connections", self.debug_connections)
        router.add("GET", "/metrics", self.metrics)
        router.add("POST", "/pubtrace", self.pubtrace, max_body=lambda: options().max_msg_size)
        router.add("POST", "/pub_ext", self.pub_ext, max_body=lambda: options().max_msg_size)
        router.add("POST", "/disable/write", self.disable_write)
        router.add("POST", "/channel/setoffset", self.channel_setoffset)
        router.add("POST", "/topic/greedyclean", self.topic_greedyclean)
        router.add("POST", "/topic/cleanunused", self.topic_clean_unused)
        router.add("POST", "/topic/fixdata", self.topic_fix_data)
        router.add("GET", "/partition/offsets", self.partition_offsets)
        router.add("GET", "/partition/search", self.partition_search)
        router.add("GET", "/partition/fetch", self.partition_fetch)
        # Cluster mode (docs/design.md §14): what the master nsqlookupd asks of a node.
        router.add("GET", "/cluster/partitions", self.cluster_partitions)
        router.add("POST", "/cluster/leader/handover", self.leader_handover)
        router.add("POST", "/loglevel/set", self.set_log_level)
        if router.access is not None:
            for (method, path), need in route_needs(nsqd.options).items():
                router.require(method, path, need)

    async def _commit(self, write_groups: list) -> None:
        await self.nsqd.storage.commit(write_groups)

    def _commit_due(self) -> bool:
        return self.nsqd.storage.commit_due()

    # -- health and identity -------------------------------------------------------------

    def ping(self, request: Request) -> Response:
        health = self.nsqd.health
        if health != "OK":
            return text_response(500, health)
        return text_response(200, "OK")

    def server_stats(self, request: Request) -> Response:
        """Youzan's `GET /serverstats`: the version, health, start time and how many
        publishes nsqd refused because the disk refused their write."""
        nsqd = self.nsqd
        return v1_response(
            200,
            {
                "version": VERSION,
                "health": nsqd.health,
                "start_time": nsqd.start_time,
                "server_pub_failed": nsqd.storage.refused_publishes.total(),
            },
        )

    def coordinator_stats(self, request: Request) -> Response:
        """Youzan's `GET /coordinator/stats?topic=[&partition=]`: a cluster node's partitions
        of the topic with their ISR and catch-up nodes (`ClusterNode.coordinator_stats`);
        500 `Coordinator is disabled.` outside a cluster."""
        cluster = self.nsqd.cluster
        if not cluster.enabled:
            raise HTTPError(500, "Coordinator is disabled.")
        params = _query(request)
        topic_name = _first(params, "topic") or ""
        return v1_response(200, cluster.coordinator_stats(topic_name, _any_partition(params)))

    def message_stats(self, request: Request) -> Response:
        """Youzan's `GET /message/stats?topic=&channel=[&partition=]`: how the channel stands,
        as plain text for people (empty when the channel does not exist)."""
        topics, channel_name = self._topic_and_channel_name(_query(request))
        text = "".join(
            channel_debug_text(topic.channels[channel_name])
            for topic in topics
            if channel_name in topic.channels
        )
        return v1_response(200, text)

    def message_history_stats(self, request: Request) -> Response:
        """Youzan's `GET /message/historystats?topic=&partition=`: the bytes published to the
        partition in each of the 22 hours before the last two, oldest first; without either,
        every partition's bytes of the hour before this one."""
        params = _query(request)
        topic_name = _first(params, "topic") or ""
        partition_text = _first(params, "partition") or ""
        hour = time.localtime().tm_hour
        if not topic_name and not partition_text:
            latest = (hour + HOURS - 1) % HOURS
            return v1_response(
                200,
                {
                    "node_hourly_pub_size_stats": [
                        {
                            "topic_name": topic.name,
                            "topic_partition": str(topic.partition),
                            "hourly_pub_size": topic.hourly_bytes.current(topic.message_bytes)[
                                latest
                            ],
                        }
                        for topic in sorted(
                            self.nsqd.all_partitions(), key=lambda t: (t.name, t.partition)
                        )
                    ]
                    or None
                },
            )
        try:
            partition = go_atoi(partition_text.encode("utf-8", "surrogateescape"))
        except ValueError:
            if topic_name and partition_text:
                raise HTTPError(400, "INVALID_REQUEST") from None
            partition = 0
        topic = self.nsqd.registry.get(topic_name, partition)
        if topic is None:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST")
        buckets = topic.hourly_bytes.current(topic.message_bytes)
        oldest = hour + 2
        return v1_response(
            200, {"hourly_pub_size": [buckets[(oldest + n) % HOURS] for n in range(HOURS - 2)]}
        )

    def info(self, request: Request) -> Response:
        nsqd = self.nsqd
        options = nsqd.options
        return v1_response(
            200,
            {
                "version": VERSION,
                "broadcast_address": options.broadcast_address,
                "hostname": nsqd.hostname,
                "http_port": nsqd.http_port,
                "tcp_port": nsqd.tcp_port,
                "start_time": nsqd.start_time,
                "max_heartbeat_interval": int(options.max_heartbeat_interval * 1e9),
                "max_output_buffer_size": options.max_output_buffer_size,
                "max_output_buffer_timeout": int(options.max_output_buffer_timeout * 1e9),
                "max_deflate_level": options.max_deflate_level,
            },
        )

    # -- publishing ----------------------------------------------------------------------

    def _topic_from_query(self, params: dict[str, list[str]]):
        """The topic a publish names: created on first use as in Go; with Youzan's
        `&partition=` (other than -1), that existing partition (docs/protocol.md §6.2)."""
        return self._publish_topic(*self._publish_names(params))

    def _publish_names(self, params: dict[str, list[str]]) -> tuple[str, int]:
        """(topic name, partition or -1) of a publish's query; Go's 400s for bad ones."""
        topic_name = _first(params, "topic")
        if topic_name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic_name):
            raise HTTPError(400, "INVALID_TOPIC")
        partition_text = _first(params, "partition")
        if partition_text is None:
            return topic_name, -1
        return topic_name, _partition_number(partition_text)

    def _publish_topic(self, topic_name: str, partition: int):
        if partition == -1:
            try:
                topic = self.nsqd.topic_for_client(topic_name)
            except NotLedHere:
                raise HTTPError(400, NOT_LEADER) from None
            return self._placed(topic, Operation.PUBLISH)
        return self._writable_partition(topic_name, partition)

    def _writable_partition(self, topic_name: str, partition: int):
        """An existing partition (-1: the default one) a publish may write to; Youzan's 404
        and 400 otherwise."""
        topic = self.nsqd.get_partition(topic_name, partition)
        if topic is None:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST")
        return self._placed(topic, Operation.PUBLISH)

    def _placed(self, topic, operation: Operation):
        """`topic`, when this node serves `operation` on it (`nsqd/placement.py`); the
        placement's error otherwise."""
        refusal = self.nsqd.placement.refusal(topic, operation)
        if refusal is not None:
            raise HTTPError(400, refusal)
        return topic

    def pub(self, request: Request) -> Response:
        options = self.nsqd.options
        body = request.body
        if request.content_length > options.max_msg_size or len(body) > options.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        # Publishers repeat the same query string: remember what a valid one means.
        target = self._pub_targets.get(request.query_string)
        if target is None:
            target = self._pub_target(request)
            if len(self._pub_targets) >= _PUB_TARGET_CACHE:
                self._pub_targets.clear()
            self._pub_targets[request.query_string] = target
        topic_name, partition, defer = target
        topic = self._publish_topic(topic_name, partition)
        self._publish(topic, [body], defer)
        return _ok_written(topic)

    def _pub_target(self, request: Request) -> tuple[str, int, float]:
        """(topic name, partition or -1, defer seconds) of a /pub query, or Go's 400 for a
        bad one."""
        params = _query(request)
        topic_name, partition = self._publish_names(params)
        self._publish_topic(topic_name, partition)  # Go creates the topic before reading defer
        defer = 0.0
        defer_text = _first(params, "defer")
        if defer_text is not None:
            try:
                defer_ms = go_atoi(defer_text.encode("utf-8", "surrogateescape"))
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            if not 0 <= defer_ms <= self.nsqd.options.max_req_timeout * 1000:
                raise HTTPError(400, "INVALID_DEFER")
            defer = defer_ms / 1000
        return topic_name, partition, defer

    def mpub(self, request: Request) -> Response:
        options = self.nsqd.options
        body = request.body
        if request.content_length > options.max_body_size or len(body) > options.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params = _query(request)
        topic = self._topic_from_query(params)
        binary_text = _first(params, "binary")
        # Text mode is the default; a value other than true/1/false/0 means binary (Go).
        binary = binary_text is not None and _BOOL_PARAMS.get(binary_text, True)
        try:
            bodies = parse_http_mpub_body(body, binary, options.max_msg_size, options.max_body_size)
        except ProtocolError as error:
            raise HTTPError(413, error.code[2:]) from None
        if not bodies:
            return _OK
        self._publish(topic, bodies, 0.0)
        return _ok_written(topic)

    def _publish(self, topic, bodies: list[bytes], defer: float) -> None:
        try:
            publish(self.nsqd, topic, bodies, defer=defer)
        except PublishError as error:
            raise _publish_refused(error) from None

    # -- stats ---------------------------------------------------------------------------

    def stats(self, request: Request) -> Response:
        params = _query(request)
        json_format = _first(params, "format") == "json"
        topic_name = _first(params, "topic") or ""
        channel_name = _first(params, "channel") or ""
        include_clients = _BOOL_PARAMS.get(_first(params, "include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(_first(params, "include_mem") or "", True)
        need_clients = _first(params, "needClients")
        if need_clients is not None:
            # Youzan's: the clients only when asked for (without it, Go's default stays).
            include_clients = need_clients == "true"
        nsqd = self.nsqd
        topics, producers = gather(
            nsqd,
            topic_name,
            channel_name,
            include_clients,
            leader_only=_GO_BOOLS.get(_first(params, "leaderOnly") or "", False),
            partition=_first(params, "partition") or "",
        )
        memory = memory_stats() if include_mem else None
        if not json_format:
            return v1_response(200, text_report(nsqd, topics, producers, memory, nsqd.health))
        if topics is not None and _quantiles_as_go(nsqd.options.e2e_processing_latency_percentile):
            # Its only floats are those quantiles (nsqd/e2e.py writes whole ones as ints):
            # no walk through thousands of topics for a float to rewrite.
            topics = GoNumbers(topics)
        document = {
            "version": VERSION,
            "health": nsqd.health,
            "start_time": nsqd.start_time,
            "topics": topics,
        }
        if memory is not None:
            document["memory"] = memory
        document["producers"] = producers
        control_plane = nsqd.cluster.control_plane()
        if control_plane is not None:
            # nsqpy's (after Go's fields): etcd, the master, this node's lease, and what is
            # wrong with them now, since when.
            document["control_plane"] = control_plane
        return v1_response(200, document)

    # -- topics ---------------------------------------------------------------------------

    def topic_create(self, request: Request) -> Response:
        """Classic: the topic. Youzan (docs/protocol.md §6.2): `partition_num=N` creates partitions
        0..N-1, `partition=p` that one (nsqlookupd places partitions this way), with
        `orderedmulti=true` / `ext=true` flags and `syncdisk=N` (sync the log every N
        messages)."""
        params = _query(request)
        topic_name = _first(params, "topic")
        partition_num = _first(params, "partition_num")
        partition = _first(params, "partition")
        if partition_num is None and partition is None:
            self._topic_from_query(params)
            return v1_response(200)
        if topic_name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic_name):
            raise HTTPError(400, "INVALID_TOPIC")
        if partition_num is not None:
            # isascii: str.isdigit() also takes '²' and '٣', which int() refuses or reads.
            if not _is_ascii_digits(partition_num) or not 1 <= int(partition_num) <= 255:
                raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
            numbers: range | list[int] = range(int(partition_num))
        else:
            text = partition or ""
            if not _is_ascii_digits(text) or not 0 <= int(text) < 255:
                raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION")
            numbers = [int(text)]
        ordered = _first(params, "orderedmulti") == "true"
        ext = _first(params, "ext") == "true" or _first(params, "extend") == "true"
        # Youzan's `syncdisk=N`: this topic's log is synced every N messages.
        sync_text = _first(params, "syncdisk") or ""
        if sync_text and (not _is_ascii_digits(sync_text) or int(sync_text) < 1):
            raise HTTPError(400, "INVALID_ARG_SYNCDISK")
        # Under `--workers` every worker is asked for `partition_num` and makes its own share.
        for number in self.nsqd.placement.partitions_here(topic_name, numbers):
            self.nsqd.create_partition(
                topic_name,
                number,
                partitioned=True,
                ordered=ordered,
                ext=ext,
                sync_every=int(sync_text or 0),
            )
        return v1_response(200)

    def _partitions(self, params: dict[str, list[str]], topic_name: str) -> list:
        """The partitions a topic endpoint acts on: `partition=p` (Youzan), else all."""
        text = _first(params, "partition")
        registry = self.nsqd.registry
        if text is None or text in ("", "-1"):
            return registry.partitions(topic_name)
        topic = registry.get(topic_name, _partition_number(text))
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return [topic]

    def _existing_topic(self, params: dict[str, list[str]], validate: bool):
        topic_name = _first(params, "topic")
        if topic_name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if validate and not is_valid_name(topic_name):
            raise HTTPError(400, "INVALID_TOPIC")
        if topic_name not in self.nsqd.topics:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return self._partitions(params, topic_name)

    def topic_delete(self, request: Request) -> Response:
        params = _query(request)
        for topic in self._existing_topic(params, validate=False):
            partition = topic.partition if _first(params, "partition") else None
            self.nsqd.delete_topic(topic.name, partition)
        return v1_response(200)

    def topic_empty(self, request: Request) -> Response:
        for topic in self._existing_topic(_query(request), validate=True):
            try:
                topic.empty()
            except OSError:
                raise HTTPError(500, "INTERNAL_ERROR") from None
        return v1_response(200)

    async def topic_pause(self, request: Request) -> Response:
        for topic in self._existing_topic(_query(request), validate=False):
            if request.path.endswith("/unpause"):
                topic.unpause()
            else:
                topic.pause()
        await self.nsqd.persist_metadata()
        return v1_response(200)

    # -- channels -------------------------------------------------------------------------

    def _topic_and_channel_name(self, params: dict[str, list[str]]):
        """Go's getExistingTopicChannelFromQuery with http_api.GetTopicChannelArgs; the
        partitions it names (Youzan's `partition=`, else all of the topic's)."""
        topic_name = _first(params, "topic")
        if topic_name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic_name):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel_name = _first(params, "channel")
        if channel_name is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel_name):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        if topic_name not in self.nsqd.topics:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return self._partitions(params, topic_name), channel_name

    def _existing_channels(self, request: Request):
        topics, channel_name = self._topic_and_channel_name(_query(request))
        found = [(t, t.channels[channel_name]) for t in topics if channel_name in t.channels]
        if not found:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return found

    def _led_channels(self, request: Request):
        """`_existing_channels`, when this node may change them: a cluster partition's channels
        are its leader's (a channel made on a follower would never reach the leader)."""
        found = self._existing_channels(request)
        for topic, _channel in found:
            self._placed(topic, Operation.CHANGE_CHANNELS)
        return found

    async def channel_create(self, request: Request) -> Response:
        topics, channel_name = self._topic_and_channel_name(_query(request))
        for topic in topics:
            self._placed(topic, Operation.CHANGE_CHANNELS)
        for topic in topics:
            if topic.deleted:
                continue
            version = topic.channels_version
            topic.get_channel(channel_name)
            if topic.channels_version != version:
                await topic.replication.channels_changed()
        _not_deleted_meanwhile(topics)
        return v1_response(200)

    async def channel_delete(self, request: Request) -> Response:
        found = self._led_channels(request)
        for topic, channel in found:
            if topic.deleted:
                continue
            topic.delete_channel(channel.name)
            # A cluster's followers drop it before the answer, as they take a new one.
            await topic.replication.channels_changed()
        _not_deleted_meanwhile(topic for topic, _channel in found)
        return v1_response(200)

    def channel_empty(self, request: Request) -> Response:
        for _topic, channel in self._existing_channels(request):
            try:
                channel.empty()
            except OSError:
                raise HTTPError(500, "INTERNAL_ERROR") from None
        return v1_response(200)

    def channel_empty_delayed(self, request: Request) -> Response:
        """Youzan's `/channel/emptydelayed`: the channel's messages in its partition's delay
        queue go (those waiting in memory and the channel's other messages stay)."""
        found = self._led_channels(request)
        for _topic, channel in found:
            channel.empty_delayed()
        return v1_response(200)

    def channel_requeue_delayed(self, request: Request) -> Response:
        """`/channel/requeuedelayed`: the channel's delayed messages, in memory and in its
        partition's delay queue, are due now."""
        found = self._led_channels(request)
        requeued = sum(channel.requeue_delayed() for _topic, channel in found)
        self.nsqd.log.info("requeued %d delayed messages by %s", requeued, request.remote)
        return v1_response(200)

    def channel_finish_memory_delayed(self, request: Request) -> Response:
        """Youzan's `/channel/finishmemdelayed`: the messages the channel defers in memory
        are finished."""
        found = self._led_channels(request)
        for topic, channel in found:
            finished = channel.finish_memory_delayed()
            self.nsqd.log.info(
                "TOPIC(%s) partition %d channel %s: %d delayed messages finished by %s",
                topic.name,
                topic.partition,
                channel.name,
                len(finished),
                request.remote,
            )
        return v1_response(200)

    def message_finish(self, request: Request) -> Response:
        """Youzan's `/message/finish?topic=&channel=&partition=&msgid=`: finish one message
        whoever holds it (in flight, deferred, delayed). `msgid` is Youzan's decimal ID (our
        ID's value); nsqpy also takes `id=`, the 16 hex digits a client sees."""
        params = _query(request)
        found = self._existing_channels(request)
        message_id = _message_id_param(params)
        for topic, _channel in found:
            self._placed(topic, Operation.CONSUME)
        for topic, channel in found:
            if channel.finish_force(message_id):
                self.nsqd.log.info(
                    "TOPIC(%s) partition %d channel %s: message %s finished by %s",
                    topic.name,
                    topic.partition,
                    channel.name,
                    message_id.decode(),
                    request.remote,
                )
                return v1_response(200)
        raise HTTPError(500, "Message ID not in flight")

    def delay_queue_enable(self, request: Request) -> Response:
        """Youzan's `PUT /delayqueue/enable?enable=true`, which turns its delay queue on: a log
        topic's delay queue is always on here, so there is nothing to do."""
        _query(request)
        return v1_response(200)

    async def channel_set_max_attempts(self, request: Request) -> Response:
        """nsqpy's `/channel/setmaxattempts?topic=&channel=&max_attempts=N`: the channel's own
        attempt limit (0: none; empty: the flag's again), kept in nsqd.dat."""
        params = _query(request)
        found = self._existing_channels(request)
        text = _first(params, "max_attempts")
        if text is None:
            raise HTTPError(400, "MISSING_ARG_MAX_ATTEMPTS")
        limit: int | None = None
        if text != "":
            try:
                limit = go_atoi(text.encode())
            except ValueError:
                raise HTTPError(400, "INVALID_ARG_MAX_ATTEMPTS") from None
            if not 0 <= limit <= MAX_ATTEMPTS:
                raise HTTPError(400, "INVALID_ARG_MAX_ATTEMPTS")
        for topic, channel in found:
            channel.max_attempts = limit
            self.nsqd.topology_changed(topic, stored=not channel.ephemeral)
        return v1_response(200)

    def channel_replay_dead_letters(self, request: Request) -> Response:
        """nsqpy's `/channel/replaydeadletters?topic=&channel=`: the channel's dead letters
        waiting in its dead-letter topic's `replay` channel go back into it."""
        found = self._led_channels(request)
        for topic, channel in found:
            replayed = dead_letters.replay(channel)
            self.nsqd.log.info(
                "TOPIC(%s) partition %d channel %s: %d dead letters replayed by %s",
                topic.name,
                topic.partition,
                channel.name,
                replayed,
                request.remote,
            )
        return v1_response(200)

    async def channel_pause(self, request: Request) -> Response:
        for topic, channel in self._existing_channels(request):
            if request.path.endswith("/unpause"):
                channel.unpause()
            else:
                channel.pause()
            self.nsqd.topology_changed(topic, stored=not channel.ephemeral)
        # Written whole before the answer, as Go's handlers do: a Go nsqd given this data
        # directory after a kill -9 sees the pause too.
        await self.nsqd.persist_metadata()
        return v1_response(200)

    async def channel_skip(self, request: Request) -> Response:
        """Youzan's `/channel/skip` and `/channel/unskip` (docs/protocol.md §6.2): the channel
        moves to the end, its delayed messages go, and while skipped it drops what is
        published. Kept across restarts, and a cluster leader's followers take it."""
        skipped = not request.path.endswith("/unskip")
        return await self._change_channels(
            request,
            self._led_channels(request),
            lambda channel: channel.skip(skipped),
            "skipped" if skipped else "no longer skipped",
        )

    async def channel_set_order(self, request: Request) -> Response:
        """Youzan's `/channel/setorder?topic=&channel=[&partition=]&order=true|false`: the
        channel delivers in order, one message in flight, as SUB_ORDERED makes it, or FIFO
        again (its consumers are disconnected, as Youzan's are); 400 `INVALID_OPTION` for
        another `order`. Kept across restarts and sent to a cluster leader's followers."""
        order = _first(_query(request), "order")
        found = self._led_channels(request)
        if order not in ("true", "false"):
            raise HTTPError(400, "INVALID_OPTION")
        return await self._change_channels(
            request,
            found,
            lambda channel: channel.set_order(order == "true"),
            "in order" if order == "true" else "FIFO",
        )

    def channel_fix_confirmed(self, request: Request) -> Response:
        """Youzan's `/channel/fixconfirmed?topic=&channel=[&partition=]`: a log topic's
        channel reads again from its confirmed position what it neither holds (in flight,
        deferred) nor has acknowledged (`Channel.fix_confirmed`). 200, empty body."""
        for topic, channel in self._led_channels(request):
            channel.fix_confirmed()
            self.nsqd.log.info(
                "TOPIC(%s) partition %d channel %s: fix confirmed by %s",
                topic.name,
                topic.partition,
                channel.name,
                request.remote,
            )
        return v1_response(200)

    async def channel_rate_limit(self, request: Request) -> Response:
        """Youzan's `/channel/ratelimit?topic=&channel=[&partition=]&ratekilobytes=N`: the
        channel delivers bodies over 1 KiB at most N KiB a second (nsqd/rate_limit.py); 0 or
        less gives it the daemon's `--channel-ratelimit-kb` again (Youzan ignores it). 400
        `INVALID_OPTION` for what is not a number. Kept and sent to a leader's followers."""
        text = _first(_query(request), "ratekilobytes") or ""
        found = self._led_channels(request)
        try:
            kilobytes = go_atoi(text.encode())
        except ValueError:
            raise HTTPError(400, "INVALID_OPTION") from None
        limit = kilobytes if kilobytes > 0 else None
        return await self._change_channels(
            request,
            found,
            lambda channel: channel.set_rate_limit(limit),
            f"rate limited to {kilobytes} KiB/s" if limit else "rate limited as the daemon",
        )

    async def channel_set_client_limit(self, request: Request) -> Response:
        """Youzan's `/channel/setclientlimit?topic=&channel=[&partition=]&ready=N
        &client_prefix=P`: the channel's consumers whose address starts with P (all for an
        empty one) have at most N messages in flight whatever their RDY (0: none). Kept for
        consumers that subscribe later, across restarts and on a leader's followers (Youzan
        sets it on the consumers connected then). 400 `INVALID_OPTION` for a bad N."""
        params = _query(request)
        found = self._led_channels(request)
        try:
            ready = go_atoi((_first(params, "ready") or "").encode())
        except ValueError:
            raise HTTPError(400, "INVALID_OPTION") from None
        if not -(1 << 31) <= ready < 1 << 31:
            raise HTTPError(400, "INVALID_OPTION")  # Youzan keeps an int32
        prefix = _first(params, "client_prefix") or ""
        return await self._change_channels(
            request,
            found,
            lambda channel: channel.limit_clients(prefix, ready),
            f"consumers at {prefix!r}... limited to {ready} in flight",
        )

    async def _change_channels(
        self, request: Request, found: list, change: Callable[["Channel"], None], done: str
    ) -> Response:
        """Change each channel a control route names, logged with `done`; a cluster leader's
        followers take it before the answer, and `nsqd.dat` keeps it."""
        for topic, channel in found:
            if topic.deleted:
                continue
            change(channel)
            self.nsqd.log.info(
                "TOPIC(%s) partition %d channel %s: %s by %s",
                topic.name,
                topic.partition,
                channel.name,
                done,
                request.remote,
            )
            self.nsqd.topology_changed(topic, stored=not channel.ephemeral)
            await topic.replication.channels_changed()
        _not_deleted_meanwhile(topic for topic, _channel in found)
        return v1_response(200)

    # -- Youzan -------------------------------------------------------------------------------

    def pubtrace(self, request: Request) -> Response:
        """POST /pubtrace?topic=&partition=&trace_id= with Youzan's JSON reply (§6.2)."""
        body = self._youzan_body(request)
        params = _query(request)
        trace_text = _first(params, "trace_id") or ""
        if not _is_ascii_digits(trace_text) or int(trace_text) >= 1 << 64:
            raise HTTPError(400, "INVALID_TRACE_ID")
        topic = self._youzan_target(params)
        trace_id = int(trace_text)
        try:
            (message,) = publish_traced(self.nsqd, topic, [body], trace_ids=[trace_id])
        except PublishError as error:
            raise _publish_refused(error) from None
        return _traced_reply(message, trace_text, topic)

    def pub_ext(self, request: Request) -> Response:
        """POST /pub_ext?topic=&partition=&ext=<urlencoded JSON header>, `X-Nsqext-<Key>`
        request headers merged into it: Youzan's HTTP PUB_EXT (docs/protocol.md §6.2). The
        traced JSON reply when the header has `##trace_id`, `OK` otherwise."""
        body = self._youzan_body(request)
        params = _query(request)
        topic = self._youzan_target(params)
        # Youzan unescapes the (already decoded) parameter once more.
        ext_text = unquote_plus(_first(params, "ext") or "")
        if not ext_text:
            raise HTTPError(400, "E_INVALID_JSON_HEADER")
        try:
            fields = with_http_headers(parse_fields(ext_text), request.headers)
            trace_id = trace_id_of(fields)
        except ExtHeaderError as error:
            raise HTTPError(400, error.code) from None
        if not topic.ext and not (
            self.nsqd.options.allow_ext_compatible and only_internal_keys(fields)
        ):
            raise HTTPError(400, "E_EXT_NOT_SUPPORT")
        try:
            (message,) = publish_traced(
                self.nsqd,
                topic,
                [body],
                trace_ids=[trace_id or 0],
                ext_headers=[encode_fields(fields)],
            )
        except PublishError as error:
            raise _publish_refused(error) from None
        if trace_id is None:
            return _ok_written(topic)
        return _traced_reply(message, fields[TRACE_ID_KEY], topic)

    def _youzan_body(self, request: Request) -> bytes:
        """A Youzan HTTP publish's one message: Go's size checks."""
        options = self.nsqd.options
        body = request.body
        if request.content_length > options.max_msg_size or len(body) > options.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        return body

    def _youzan_target(self, params: dict[str, list[str]]):
        """The existing partition `topic=&partition=` names (-1 or none: the default one),
        writable here; Youzan's HTTP publishes never create a topic."""
        topic_name = _first(params, "topic")
        if topic_name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        partition = _partition_number(_first(params, "partition") or "-1")
        return self._writable_partition(topic_name, partition)

    async def channel_setoffset(self, request: Request) -> Response:
        """POST /channel/setoffset?topic=&channel=[&partition=] with a body `<type>:<value>`
        (`timestamp`, `virtual_queue`, `msgcount`, `special:-1`): the channel's partitions
        deliver from there on, also to consumers already connected (Youzan's; docs/design.md
        §13)."""
        found = self._existing_channels(request)
        body = request.body
        if not body:
            raise HTTPError(406, "MSG_EMPTY")
        try:
            kind, value = parse_consume_offset(body.decode("utf-8", "replace"))
        except ValueError as error:
            raise HTTPError(400, str(error)) from None
        for topic, channel in found:
            if topic.deleted:
                continue
            try:
                channel.seek(kind, value)
            except (ValueError, OSError) as error:
                if topic.deleted:
                    continue
                raise HTTPError(500, str(error)) from None
            self.nsqd.log.info(
                "set the channel offset of %s:%s: %s:%d", topic.full_name, channel.name, kind, value
            )
            # A cluster leader's followers move the cursor too before the answer.
            await topic.replication.channels_changed()
        _not_deleted_meanwhile(topic for topic, _channel in found)
        return v1_response(200)

    async def topic_greedyclean(self, request: Request) -> Response:
        """POST /topic/greedyclean?topic=[&partition=]: remove every segment all channels
        have consumed, whatever its age (Youzan's)."""
        partitions = self._existing_topic(_query(request), validate=False)
        try:
            await self.nsqd.clean_logs(partitions, greedy=True)
        except OSError as error:
            raise HTTPError(500, str(error)) from None
        _not_deleted_meanwhile(partitions)
        return v1_response(200)

    async def topic_clean_unused(self, request: Request) -> Response:
        """Youzan's `POST /topic/cleanunused?topic=[&partition=][&checkall=true][&dryrun=false]`:
        a cluster node removes the logs on its disk of partitions the cluster gives to other
        nodes or no longer has (`ClusterNode.unused_partitions`); a dry run (the default, as
        Youzan's) only logs which. Outside a cluster there is nothing to do. 200, empty body,
        as Youzan's."""
        params = _query(request)
        partition = _any_partition(params)
        cluster = self.nsqd.cluster
        dry_run = _first(params, "dryrun") != "false"
        if not cluster.enabled:
            return v1_response(200)
        names = [_first(params, "topic") or ""]
        if not names[0]:
            names = []
            if _first(params, "checkall") == "true":
                names = sorted(
                    entry.name
                    for entry in os.scandir(self.nsqd.data_path)
                    if entry.is_dir(follow_symlinks=False)
                )
        unused = cluster.unused_partitions(names, partition)
        for name, number in unused:
            self.nsqd.log.info(
                "TOPIC(%s) partition %d: %s the unused local data, by %s",
                name,
                number,
                "would remove" if dry_run else "removing",
                request.remote,
            )
            if not dry_run:
                files = LogFiles(self.nsqd.data_path, name, number)
                try:
                    await trio.to_thread.run_sync(files.remove_all)
                except OSError as error:
                    raise HTTPError(500, str(error)) from None
        return v1_response(200)

    async def topic_fix_data(self, request: Request) -> Response:
        """Youzan's `POST /topic/fixdata?topic=[&partition=][&checkcorrupt=true]`: check the
        partition's log against its index (every group with `checkcorrupt=true`, else its
        first and last) and repair what is wrong (`nsqd/data_fix.py`); what was found and
        done is logged. 200, empty body, as Youzan's."""
        params = _query(request)
        check_corrupt = _first(params, "checkcorrupt") == "true"
        for topic in self._existing_topic(params, validate=False):
            try:
                fix = await fix_partition(self.nsqd, topic, check_corrupt=check_corrupt)
            except OSError as error:
                if topic.deleted:
                    # `/topic/delete` removed its files while they were read: gone, as it
                    # would have been a moment earlier.
                    raise HTTPError(404, "TOPIC_NOT_FOUND") from None
                raise HTTPError(500, str(error)) from None
            self.nsqd.log.info(
                "TOPIC(%s) partition %d: fixdata by %s checked %d groups: %d corrupt, %d"
                " written again from another replica, %d skipped%s",
                topic.name,
                topic.partition,
                request.remote,
                fix.checked,
                len(fix.faults),
                fix.repaired,
                fix.skipped,
                f", cut back to offset {fix.cut_back_to.offset}" if fix.cut_back_to else "",
            )
        return v1_response(200)

    # -- range reads of log topics (docs/protocol.md §6.3) ---------------------------------------

    def _log_partitions(self, params: dict[str, list[str]]) -> list[tuple["Topic", RetainedLog]]:
        """The named partitions with their retained logs; 400 NOT_A_LOG_TOPIC without one."""
        topics = self._existing_topic(params, validate=False)
        partitions = []
        for topic in topics:
            retained = topic.queue.retained
            if retained is not None:
                partitions.append((topic, retained))
        if not partitions:
            raise HTTPError(400, "NOT_A_LOG_TOPIC")
        return partitions

    def _log_partition(self, params: dict[str, list[str]]) -> tuple["Topic", RetainedLog]:
        if _first(params, "partition") in (None, ""):
            raise HTTPError(400, "MISSING_ARG_PARTITION")
        return self._log_partitions(params)[0]

    def partition_offsets(self, request: Request) -> Response:
        """Each local partition's retained start and committed end, and its leader."""
        nsqd = self.nsqd
        leader = f"{nsqd.options.broadcast_address}:{nsqd.tcp_port}"
        partitions = []
        params = _query(request)
        for topic, log in self._log_partitions(params):
            entry = {
                "partition": topic.partition,
                "start": {"offset": log.start.offset, "count": log.start.count},
                "end": {"offset": log.end.offset, "count": log.end.count},
                "leader": leader,
            }
            entry.update(topic.replication.describe())
            partitions.append(entry)
        return v1_response(200, {"topic": _first(params, "topic"), "partitions": partitions})

    def partition_search(self, request: Request) -> Response:
        """A position by one of `timestamp` (unix seconds, fractions allowed: the first
        message published at or after it), `count` (the message with that many before it) or
        `offset` (the first record boundary at or after that virtual offset); each clamped to
        the retained start and the committed end."""
        params = _query(request)
        _topic, log = self._log_partition(params)
        count = _first(params, "count")
        offset = _first(params, "offset")
        if count is not None:
            position = log.position_of_count(_int_arg(count, "INVALID_ARG_COUNT"))
        elif offset is not None:
            position = log.position_at_or_after(_int_arg(offset, "INVALID_ARG_OFFSET"))
        else:
            try:
                seconds = float(_first(params, "timestamp") or "")
            except ValueError:
                raise HTTPError(400, "INVALID_ARG_TIMESTAMP") from None
            position = log.search_timestamp(int(seconds * 1_000_000_000))
        return v1_response(200, {"offset": position.offset, "count": position.count})

    def partition_fetch(self, request: Request) -> Response:
        """The stored records of `[offset, end)`, as written (`[4 size][record]...`), at most
        `max_bytes` (1 MiB by default) but at least one record; headers say where the first
        one stands and where the next fetch starts. Stateless and the same bytes on every
        replica, so a reader can repeat it anywhere. With `starts=true` (nsqpy's Spark
        reader), the body begins with where each record starts in the records, 4 bytes
        big-endian each, as many as `X-NSQ-Record-Starts` says."""
        params = _query(request)
        _topic, log = self._log_partition(params)
        offset = _int_arg(_first(params, "offset") or "0", "INVALID_ARG_OFFSET")
        end_text = _first(params, "end")
        end = _int_arg(end_text, "INVALID_ARG_OFFSET") if end_text else log.end.offset
        max_bytes = _int_arg(_first(params, "max_bytes") or str(1 << 20), "INVALID_ARG_OFFSET")
        if offset < log.start.offset:
            raise HTTPError(416, "OFFSET_BEFORE_START")
        start = log.position_at_or_after(offset)
        if start.offset != offset:
            raise HTTPError(400, "OFFSET_NOT_A_RECORD_BOUNDARY")
        starts: list[int] | None = [] if _first(params, "starts") == "true" else None
        data, following = log.read_raw(start, end, max(max_bytes, 1), starts=starts)
        headers = [
            NSQ_V1_HEADER,
            ("Content-Type", "application/octet-stream"),
            ("X-NSQ-Start-Count", str(start.count)),
            ("X-NSQ-Next-Offset", str(following.offset)),
            ("X-NSQ-Next-Count", str(following.count)),
        ]
        if starts is not None:
            # Where each record starts, ahead of the records: a reader need not walk them
            # again to find out.
            table = array.array("I", starts)
            if sys.byteorder == "little":
                table.byteswap()
            headers.append(("X-NSQ-Record-Starts", str(len(starts))))
            data = table.tobytes() + data
        return Response(200, data, headers)

    def message_get(self, request: Request) -> Response:
        """Youzan's `GET /message/get?topic=&partition=&search_mode=&search_pos=[&needext=true]`:
        one message of a log topic's partition found by `count` (the one with that many
        before it), `id` (Youzan's decimal ID; the partition is the ID's when not named),
        `virtual_offset` (the first record at or after it) or, nsqpy's, `timestamp` (unix
        seconds: the first published at or after it); its ID, trace ID, body, timestamp,
        attempts, offset, count and, with `needext=true`, its ext header."""
        params = _query(request)
        try:
            value = go_parse_int(_first(params, "search_pos") or "")
        except ValueError as error:
            raise HTTPError(400, str(error)) from None
        mode = _first(params, "search_mode") or ""
        if mode == "id" and not _first(params, "partition"):
            partition = value >> ID_PARTITION_SHIFT
            if not 0 <= partition < 1024:
                raise HTTPError(400, "invalid message id")
            params = {**params, "partition": [str(partition)]}
        topic, log = self._log_partition(params)
        need_ext = _first(params, "needext") == "true"
        if _first(params, "delayed_queue") == "true":
            return self._delayed_message(topic, log, params, mode, value, need_ext)
        position: Position | None
        if mode == "count":
            inside = log.start.count <= value < log.end.count
            position = log.position_of_count(value) if inside else None
        elif mode == "id":
            position = log.position_of_id(value)
        elif mode == "virtual_offset":
            position = log.position_at_or_after(value)
        elif mode == "timestamp":
            position = log.search_timestamp(value * 1_000_000_000)
        else:
            raise HTTPError(400, "search mode should be one of id/count/virtual_offset/timestamp")
        found = log.read(position, 1) if position is not None else []
        if not found:
            raise HTTPError(404, f"no message at {mode} {value} in the partition's log")
        (message,) = found
        return v1_response(
            200,
            {
                "id": int(message.id, 16),
                "trace_id": message.trace_id,
                "body": message.body.decode("utf-8", "replace"),
                "timestamp": message.timestamp,
                "attempts": message.attempts,
                "offset": message.offset,
                "queue_cnt_index": message.count,
                "ext": message.ext_header.decode("utf-8", "replace") if need_ext else "",
            },
        )

    def _delayed_message(
        self, topic, log: RetainedLog, params: dict, mode: str, value: int, need_ext: bool
    ) -> Response:
        """`/message/get?delayed_queue=true&search_mode=id&channel=`: a channel's message in
        the partition's delay queue, by its ID, with Youzan's answer (`orig_id` the ID it
        was published with: nsqpy's copy keeps it, so both are the same) and errors."""
        delay_queue = getattr(topic.queue, "delay_queue", None)
        if delay_queue is None:
            raise HTTPError(404, "no delayed queue on the topic")
        if mode != "id":
            raise HTTPError(400, "delayed queue search mode must be id")
        channel = _first(params, "channel") or ""
        if not channel:
            raise HTTPError(400, "delayed queue search channel must be given")
        entry = delay_queue.find(channel, value)
        found = log.read(Position(entry[0], entry[1]), 1) if entry is not None else []
        if not found:
            raise HTTPError(404, "no message found in delayed queue")
        (message,) = found
        return v1_response(
            200,
            {
                "id": value,
                "orig_id": value,
                "trace_id": message.trace_id,
                "body": message.body.decode("utf-8", "replace"),
                "timestamp": message.timestamp,
                "attempts": message.attempts,
                "offset": message.offset,
                "ext": message.ext_header.decode("utf-8", "replace") if need_ext else "",
            },
        )

    def cluster_partitions(self, request: Request) -> Response:
        """Every cluster partition this node holds, as the master nsqlookupd reads them for
        leader health, hand-overs and load factors: its role and writability, its log's
        start and end, and how far its slowest channel is behind."""
        nsqd = self.nsqd
        return v1_response(
            200, {"node": nsqd.cluster.node_id, "partitions": nsqd.cluster.partition_reports()}
        )

    async def leader_handover(self, request: Request) -> Response:
        """POST /cluster/leader/handover?topic=&partition=&to=<node id>: the first half of a
        planned leader transfer (`ClusterNode.hand_over`), asked by the master nsqlookupd."""
        params = _query(request)
        topic, _log = self._log_partition(params)
        to = _first(params, "to")
        if not to:
            raise HTTPError(400, "MISSING_ARG_NODE")
        try:
            end = await self.nsqd.cluster.leader.hand_over(topic, to)
        except ClusterWriteError as error:
            raise HTTPError(400, f"{error.code} {error}") from None
        except trio.TooSlowError:
            raise HTTPError(500, "E_TIMEOUT the partition's writes did not drain") from None
        return v1_response(200, {"end": list(end)})

    def set_log_level(self, request: Request) -> Response:
        """Youzan's POST /loglevel/set?loglevel=N (glog-style numbers, `nsqpy/daemon/log.py`)."""
        text = _first(_query(request), "loglevel")
        if not text:
            raise HTTPError(400, "MISSING_ARG_LEVEL")
        try:
            level = youzan_log_level(int(text))
        except ValueError:
            raise HTTPError(400, "BAD_LEVEL_STRING") from None
        self.nsqd.set_options(log_level=level)
        return v1_response(200)

    def disable_write(self, request: Request) -> Response:
        """POST /disable/write?type=all|ordered (anything else enables writes again)."""
        kind = _first(_query(request), "type")
        self.nsqd.write_disabled = kind if kind in ("all", "ordered") else None
        return v1_response(200)

    # -- runtime configuration -------------------------------------------------------------

    def config(self, request: Request) -> Response:
        nsqd = self.nsqd
        name = request.path[len("/config/") :]
        if request.method == "PUT":
            body = request.body
            if not body or len(body) > nsqd.options.max_msg_size:
                raise HTTPError(413, "INVALID_VALUE")
            if name == "nsqlookupd_tcp_addresses":
                try:
                    addresses = json.loads(body)
                except (ValueError, RecursionError):  # deep nesting too (Go: max depth)
                    raise HTTPError(400, "INVALID_VALUE") from None
                if addresses is None:
                    # Go unmarshals null into a nil slice: no lookupds, and `null` back.
                    nsqd.set_options(lookupd_tcp_address=[])
                    return Response(
                        200, _JSON_NULL, [("Content-Type", JSON_CONTENT_TYPE), NSQ_V1_HEADER]
                    )
                if not isinstance(addresses, list) or not all(
                    isinstance(a, str) for a in addresses
                ):
                    raise HTTPError(400, "INVALID_VALUE")
                nsqd.set_options(lookupd_tcp_address=addresses)
            elif name == "log_level":
                try:
                    level = parse_log_level(body.decode("utf-8", "replace"))
                except ValueError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                nsqd.set_options(log_level=level)
            else:
                raise HTTPError(400, "INVALID_OPTION")
        try:
            value = nsqd.option_by_config_name(name)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None
        return v1_response(200, value)

    def metrics(self, request: Request) -> Response:
        body = render_metrics(self.nsqd).encode()
        return Response(200, body, [("Content-Type", METRICS_CONTENT_TYPE)])

    def debug_connections(self, request: Request) -> Response:
        """nsqpy's: the clients connected, and the connection objects alive (clients' and
        another worker's forwarded ones, not the links between workers). Once every client
        has gone, both are 0: a connection's end frees it."""
        alive = sum(1 for connection in LIVE_CONNECTIONS if not connection.protocol.internal)
        return v1_response(200, {"clients": len(self.nsqd.clients), "connections": alive})

    def free_memory(self, request: Request) -> Response:
        """Go's debug.FreeOSMemory: a full collection, then the free pages back to the system."""
        gc.collect()
        release_free_memory()
        return v1_response(200)


class TLSRequiredRouter:
    """The plain HTTP port under `--tls-required=true` (Go's TLSRequired; `tcp-https` is
    TLSRequiredExceptHTTP and leaves plain HTTP open): every request gets Go's 403."""

    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd

    def body_limit(self, method: str, path: str) -> int | None:
        return None  # every request gets the 403, whatever its body

    async def dispatch(self, request: Request) -> Response:
        return self.respond_inline(request)

    async def commit(self, write_groups: Sequence[CommitWait] = ()) -> None:
        pass  # nothing here writes

    def commit_due(self) -> bool:
        return False

    def waits_for_commit(self, response: Response) -> bool:
        return False

    def write_pass(self) -> AbstractContextManager[None]:
        return nullcontext()

    def respond_inline(self, request: Request) -> Response:
        port = _port(self.nsqd.https_address)
        # Go writes this body by hand, spaces and all, and sets no Content-Type.
        body = f'{{"message": "TLS_REQUIRED", "https_port": {port}}}'.encode()
        return Response(403, body, [NSQ_V1_HEADER, ("Content-Type", TEXT_CONTENT_TYPE)])


def _not_deleted_meanwhile(partitions: Iterable["Topic"]) -> None:
    """A route that awaits per partition (a cluster's followers told, a clean) skips a
    partition `/topic/delete` removed meanwhile, and says Go's 404 TOPIC_NOT_FOUND for it: gone,
    as it would have been a moment earlier, where its closed files gave a 500."""
    if any(topic.deleted for topic in partitions):
        raise HTTPError(404, "TOPIC_NOT_FOUND")


def _any_partition(params: dict[str, list[str]]) -> int:
    """Youzan's optional `partition=` of its node-wide routes: -1 (every one) when absent;
    400 INVALID_REQUEST when it is not a number."""
    text = _first(params, "partition") or ""
    if not text:
        return -1
    try:
        return go_atoi(text.encode("utf-8", "surrogateescape"))
    except ValueError:
        raise HTTPError(400, "INVALID_REQUEST") from None


# The topic and channel endpoints that act on every partition of the topic when the request
# names none (`HTTPAPI._partitions`). Under `--workers` a topic's partitions lie with several
# workers: such a request is answered by each and their answers joined (`nsqd/worker_http.py`).
EVERY_PARTITION_ROUTES = frozenset(
    {
        ("POST", "/topic/delete"),
        ("POST", "/topic/empty"),
        ("POST", "/topic/pause"),
        ("POST", "/topic/unpause"),
        ("POST", "/topic/greedyclean"),
        ("POST", "/topic/fixdata"),
        ("POST", "/channel/create"),
        ("POST", "/channel/delete"),
        ("POST", "/channel/empty"),
        ("POST", "/channel/emptydelayed"),
        ("POST", "/channel/requeuedelayed"),
        ("POST", "/channel/finishmemdelayed"),
        ("POST", "/channel/setmaxattempts"),
        ("POST", "/channel/replaydeadletters"),
        ("POST", "/channel/pause"),
        ("POST", "/channel/unpause"),
        ("POST", "/channel/skip"),
        ("POST", "/channel/unskip"),
        ("POST", "/channel/setorder"),
        ("POST", "/channel/ratelimit"),
        ("POST", "/channel/fixconfirmed"),
        ("POST", "/channel/setclientlimit"),
        ("POST", "/channel/setoffset"),
        ("POST", "/message/finish"),
        ("GET", "/message/stats"),
        ("GET", "/partition/offsets"),
        ("GET", "/coordinator/stats"),
    }
)


def partition_scope(method: str, path: str, params: dict[str, list[str]]) -> int | None:
    """The partition a request about a topic is for: the one `partition=` names, -1 for the
    topic's default partition (none named, or a value the handler refuses), or None for
    every partition of the topic (`EVERY_PARTITION_ROUTES` without `partition=`, and
    `/topic/create?partition_num=N`)."""
    text = _first(params, "partition")
    if text is not None and _is_ascii_digits(text):
        return int(text)
    if (method, path) in EVERY_PARTITION_ROUTES and text in (None, "", "-1"):
        return None
    if path == "/topic/create" and text is None and _first(params, "partition_num") is not None:
        return None
    return -1


def _partition_number(text: str) -> int:
    """A `partition=` value as Go's strconv.Atoi reads it; 400 INVALID_ARG_TOPIC_PARTITION."""
    try:
        return go_atoi(text.encode("utf-8", "surrogateescape"))
    except ValueError:
        raise HTTPError(400, "INVALID_ARG_TOPIC_PARTITION") from None


def _traced_reply(message, trace_text: str, topic) -> Response:
    """Youzan's JSON answer to a traced HTTP publish, sent after the group commit."""
    response = v1_response(
        200,
        {
            "status": "OK",
            "id": int(message.id, 16),
            "trace_id": trace_text,
            "queue_offset": message.offset,
            "rawsize": record_size(message, topic.ext),
        },
    )
    response.after_commit = True
    response.write_group = topic.queue.write_group
    return response


def _ok_written(topic) -> Response:
    """OK to a publish, once it is written: a log topic's answer carries its write group."""
    group = topic.queue.write_group
    if group is None:
        return _OK_WRITTEN
    return _OK_WRITTEN.for_write(group)


def _is_ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _port(address: str | None) -> int:
    return int(address.rsplit(":", 1)[1]) if address and ":" in address else 0


def _publish_refused(error: PublishError) -> HTTPError:
    """503 EXITING while nsqd exits. Go answers 503 EXITING to any PutMessage error; a full
    disk is no exit, so it gets 500 INTERNAL_ERROR (which Go's /pub also answers). Youzan's
    429 when too much waits in the topic."""
    if isinstance(error, TooMuchWaiting):
        return HTTPError(429, f"E_PUB_TOO_MUCH_WAITING {error}")
    return HTTPError(503, "EXITING") if error.exiting else HTTPError(500, "INTERNAL_ERROR")


def _int_arg(text: str, error: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise HTTPError(400, error) from None


def _message_id_param(params: dict[str, list[str]]) -> bytes:
    """The message a `/message/finish` names: Youzan's `msgid` (decimal) or `id` (16 hex
    digits); 400 INVALID_REQUEST as Youzan's for anything else."""
    decimal = _first(params, "msgid")
    if decimal is not None:
        if not decimal.isascii() or not decimal.isdigit() or int(decimal) >= 1 << 64:
            raise HTTPError(400, "INVALID_REQUEST")
        return b"%016x" % int(decimal)
    text = _first(params, "id") or ""
    if len(text) != 16 or not all(c in "0123456789abcdef" for c in text):
        raise HTTPError(400, "INVALID_REQUEST")
    return text.encode()


def _quantiles_as_go(quantiles: list[float]) -> bool:
    """Whether Python writes each of these floats as Go does (no exponent form)."""
    return all(1e-6 <= quantile < 1e21 for quantile in quantiles)

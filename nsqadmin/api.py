"""Go nsqadmin's JSON API (`/api/*`, `/ping`, `/config/:opt`), so scripts written against Go
nsqadmin work unchanged: same paths, methods, bodies, field names and order, `message`
warnings and `{"message": "..."}` errors with Go's status codes.

Each reply that Go builds from several nodes says in `message` which ones failed
(`WARNING: ...`); when every node failed it is `502 UPSTREAM_ERROR: ...`, as in Go.
"""

import ipaddress
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from aiohttp import web

from nsqpy.common.flags import Kind
from nsqpy.common.goformat import go_json
from nsqpy.daemon.log import LOG_LEVELS, parse_log_level
from nsqpy.nsqadmin.actions import CHANNEL_LIMITS, ActionError, is_same_origin
from nsqpy.nsqadmin.cluster import RequestError, UpstreamError
from nsqpy.nsqadmin.options import build_flags
from nsqpy.nsqadmin.statistics import FILTERS, rank_name, statistics
from nsqpy.nsqadmin.stats import aggregate_topic, counter_stats, find_producer, warning_message

if TYPE_CHECKING:
    from nsqpy.nsqadmin.server import NSQAdmin


def v1_response(body: Any, status: int = 200) -> web.Response:
    """Go's http_api.V1 decorator: JSON with NSQ's v1 content-type header."""
    response = web.Response(
        status=status,
        body=go_json(body),
        content_type="application/json",
        charset="utf-8",
    )
    response.headers["X-NSQ-Content-Type"] = "nsq; version=1.0"
    return response


def v1_error(status: int, message: str) -> web.Response:
    return v1_response({"message": message}, status)


def upstream_error(error: UpstreamError) -> web.Response:
    return v1_error(502, f"UPSTREAM_ERROR: {error}")


async def _json_body(request: web.Request) -> dict:
    """The request's JSON object (Go decodes into a struct: anything else is a 400)."""
    text = await request.text()
    try:
        body = json.loads(text)
    except ValueError as error:
        raise ActionError(400, str(error) or "INVALID_BODY") from None
    if not isinstance(body, dict):
        raise ActionError(400, "INVALID_BODY")
    return body


class API:
    def __init__(self, admin: "NSQAdmin") -> None:
        self.admin = admin

    @property
    def _lookupds(self) -> list[str]:
        return self.admin.options.lookupd_http_address

    @property
    def _nsqds(self) -> list[str]:
        return self.admin.options.nsqd_http_address

    def routes(self, prefix: str) -> list[web.RouteDef]:
        return [
            web.get(f"{prefix}/ping", self.ping),
            web.get(f"{prefix}/api/topics", self.topics),
            web.post(f"{prefix}/api/topics", self.create_topic_channel),
            web.get(f"{prefix}/api/topics/{{topic}}", self.topic),
            web.post(f"{prefix}/api/topics/{{topic}}", self.topic_action),
            web.delete(f"{prefix}/api/topics/{{topic}}", self.delete_topic),
            web.get(f"{prefix}/api/topics/{{topic}}/{{channel}}", self.channel),
            web.post(f"{prefix}/api/topics/{{topic}}/{{channel}}", self.channel_action),
            web.post(
                f"{prefix}/api/topics/{{topic}}/{{channel}}/client", self.channel_client_action
            ),
            web.delete(f"{prefix}/api/topics/{{topic}}/{{channel}}", self.delete_channel),
            web.get(f"{prefix}/api/nodes", self.nodes),
            web.get(f"{prefix}/api/nodes/{{node}}", self.node),
            web.delete(f"{prefix}/api/nodes/{{node}}", self.tombstone_node_for_topic),
            web.get(f"{prefix}/api/counter", self.counter),
            web.get(f"{prefix}/api/statistics", self.statistics),
            web.get(f"{prefix}/api/statistics/{{sort_by}}", self.statistics),
            web.get(
                f"{prefix}/api/coordinators/{{node}}/{{topic}}/{{partition}}", self.coordinator
            ),
            web.get(f"{prefix}/api/cluster/stats", self.cluster_stats),
            web.get(f"{prefix}/api/graphite", self.graphite),
            web.get(f"{prefix}/config/{{opt}}", self.config),
            web.put(f"{prefix}/config/{{opt}}", self.config),
        ]

    async def ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", content_type="text/plain", charset="utf-8")

    # ---------------------------------------------------------------------------- reads

    async def topics(self, request: web.Request) -> web.Response:
        cluster = self.admin.cluster
        try:
            if request.query.get("inactive") == "true":
                # Topics nsqlookupd knows that no nsqd produces, with their channels; Go
                # answers an empty map without nsqlookupd.
                inactive: dict[str, list[str]] = {}
                messages: list[str] = []
                if self._lookupds:
                    inactive, messages = await cluster.get_inactive_topics(self._lookupds)
                return v1_response({"topics": inactive, "message": warning_message(messages)})
            topics, messages = await cluster.get_topics(self._lookupds, self._nsqds)
        except UpstreamError as error:
            return upstream_error(error)
        return v1_response({"topics": topics, "message": warning_message(messages)})

    async def topic(self, request: web.Request) -> web.Response:
        topic_name = request.match_info["topic"]
        cluster = self.admin.cluster
        try:
            producers, messages = await cluster.get_topic_producers(
                topic_name, self._lookupds, self._nsqds, unknown_is_failure=True
            )
            stats, more = await cluster.get_nsqd_stats(
                producers, topic_name, include_clients=False, none_is_failure=True
            )
        except UpstreamError as error:
            return upstream_error(error)
        total = aggregate_topic(topic_name, stats.topics)
        return v1_response(
            {**total.to_json(), "message": warning_message(messages + more)},
        )

    async def channel(self, request: web.Request) -> web.Response:
        topic_name = request.match_info["topic"]
        channel_name = request.match_info["channel"]
        cluster = self.admin.cluster
        try:
            producers, messages = await cluster.get_topic_producers(
                topic_name, self._lookupds, self._nsqds, unknown_is_failure=True
            )
            stats, more = await cluster.get_nsqd_stats(
                producers, topic_name, channel_name, none_is_failure=True
            )
        except UpstreamError as error:
            return upstream_error(error)
        channel = stats.channels.get(channel_name)
        # Go embeds a nil *ChannelStats for an unknown channel: only `message` is written.
        body = channel.to_json() if channel is not None else {}
        return v1_response({**body, "message": warning_message(messages + more)})

    async def nodes(self, request: web.Request) -> web.Response:
        try:
            producers, messages = await self.admin.cluster.get_producers(
                self._lookupds, self._nsqds
            )
        except UpstreamError as error:
            return upstream_error(error)
        return v1_response(
            {"nodes": [p.to_json() for p in producers], "message": warning_message(messages)}
        )

    async def node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        cluster = self.admin.cluster
        try:
            producers, messages = await cluster.get_producers(self._lookupds, self._nsqds)
        except UpstreamError as error:
            return upstream_error(error)
        producer = find_producer(producers, node)
        if producer is None:
            return v1_error(404, "NODE_NOT_FOUND")
        try:
            stats, _ = await cluster.get_nsqd_stats([producer])
        except UpstreamError as error:
            return upstream_error(error)
        total_clients = sum(
            len(channel.clients or []) for topic in stats.topics for channel in topic.channels or []
        )
        return v1_response(
            {
                "node": node,
                "topics": [topic.to_json() for topic in stats.topics],
                "total_messages": sum(topic.message_count for topic in stats.topics),
                "total_clients": total_clients,
                "message": warning_message(messages),
            }
        )

    async def counter(self, request: web.Request) -> web.Response:
        cluster = self.admin.cluster
        try:
            producers, messages = await cluster.get_producers(self._lookupds, self._nsqds)
            stats, more = await cluster.get_nsqd_stats(
                producers, include_clients=False, none_is_failure=True
            )
        except UpstreamError as error:
            return upstream_error(error)
        return v1_response(
            {"stats": counter_stats(stats.channels), "message": warning_message(messages + more)}
        )

    async def statistics(self, request: web.Request) -> web.Response:
        """Youzan's statistics: without a sort, the sorts there are; with one, its top ten
        (nsqadmin/statistics.py)."""
        sort_by = request.match_info.get("sort_by", "")
        if not sort_by:
            return v1_response({"filters": list(FILTERS)})
        try:
            top, messages = await statistics(
                self.admin.cluster, self._lookupds, self._nsqds, sort_by
            )
        except UpstreamError as error:
            return upstream_error(error)
        return v1_response(
            {
                "rank_name": rank_name(sort_by),
                "top10": [item.to_json() for item in top],
                "message": warning_message(messages),
            }
        )

    async def coordinator(self, request: web.Request) -> web.Response:
        """Youzan's coordinator of a topic's partition on one node: its ISR and catch-up
        nodes, as the node's `/coordinator/stats` says; 404 NODE_NOT_FOUND for a node that
        does not produce the topic."""
        node, topic = request.match_info["node"], request.match_info["topic"]
        cluster = self.admin.cluster
        try:
            producers, messages = await cluster.get_topic_producers(
                topic, self._lookupds, self._nsqds
            )
        except UpstreamError as error:
            return upstream_error(error)
        producer = find_producer(producers, node)
        if producer is None:
            return v1_error(404, "NODE_NOT_FOUND")
        stats: dict = {}
        try:
            stats = await cluster.get_coordinator_stats(
                producer, topic, request.match_info["partition"]
            )
        except RequestError as error:
            messages = [*messages, str(error)]
        return v1_response({**stats, "message": warning_message(messages)})

    async def cluster_stats(self, request: web.Request) -> web.Response:
        """Youzan's `/api/cluster/stats`: the master nsqlookupd's `/cluster/stats`; 503
        `Service Unavailable` when no nsqlookupd given is the master of a cluster."""
        try:
            stats, _errors = await self.admin.cluster.get_cluster_stats(self._lookupds)
        except UpstreamError as error:
            return upstream_error(error)
        if stats is None:
            return v1_error(503, "Service Unavailable")
        return v1_response(stats)

    async def graphite(self, request: web.Request) -> web.Response:
        """Go's graphiteHandler: a channel's rate over the last statsd interval, from
        `--graphite-url`'s `/render`. The arguments are checked first, as Go does."""
        if request.query.get("metric") != "rate":
            return v1_error(400, "INVALID_ARG_METRIC")
        target = request.query.get("target")
        if target is None:
            return v1_error(400, "INVALID_ARG_TARGET")
        options = self.admin.options
        interval = int(options.statsd_interval)
        query = urllib.parse.urlencode(
            {
                "format": "json",
                "from": f"-{interval * 2}sec",
                "target": target,
                "until": f"-{interval}sec",
            }
        )
        url = f"{options.graphite_url}/render?{query}"
        try:
            series = await self.admin.cluster.get_json(url)
            rate = float(series[0]["datapoints"][0][0])
        except (RequestError, LookupError, TypeError, ValueError) as error:
            # Go answers 500 when graphite cannot be asked (no --graphite-url included).
            self.admin.log.error("graphite request failed - %s", error)
            return v1_error(500, "INTERNAL_ERROR")
        return v1_response({"rate": "N/A" if rate < 0 else f"{rate / interval:.2f}"})

    # ---------------------------------------------------------------------------- actions

    async def _act(self, request: web.Request, action) -> web.Response:
        """Run an admin action: 200 with Go's `message`, or its error reply."""
        if not is_same_origin(request):
            return v1_error(403, "FORBIDDEN_ORIGIN")
        try:
            self.admin.actions.check_admin(request)
            messages = await action()
        except ActionError as error:
            return v1_error(error.status, error.message)
        except UpstreamError as error:
            return upstream_error(error)
        return v1_response({"message": warning_message(messages)})

    async def create_topic_channel(self, request: web.Request) -> web.Response:
        async def create() -> list[str]:
            body = await _json_body(request)
            return await self.admin.actions.create(
                request, str(body.get("topic") or ""), str(body.get("channel") or "")
            )

        return await self._act(request, create)

    async def topic_action(self, request: web.Request) -> web.Response:
        async def act() -> list[str]:
            body = await _json_body(request)
            return await self.admin.actions.topic_action(
                request, str(body.get("action") or ""), request.match_info["topic"]
            )

        return await self._act(request, act)

    async def channel_action(self, request: web.Request) -> web.Response:
        async def act() -> list[str]:
            body = await _json_body(request)
            action = str(body.get("action") or "")
            topic, channel = request.match_info["topic"], request.match_info["channel"]
            if action == "reset":
                return await self.admin.actions.reset_channel(
                    request, topic, channel, body.get("timestamp")
                )
            if action in CHANNEL_LIMITS:
                return await self.admin.actions.channel_limit(request, topic, channel, body)
            return await self.admin.actions.channel_action(request, action, topic, channel)

        return await self._act(request, act)

    async def channel_client_action(self, request: web.Request) -> web.Response:
        """Youzan's channel client actions: `finish` one message by ID on a node's partition
        (`{"action":"finish","node","partition","msgid"}`), and the `sink` and
        `sink_removal` notifications (`{"action","order"}`)."""

        async def act() -> list[str]:
            body = await _json_body(request)
            return await self.admin.actions.channel_client_action(
                request, request.match_info["topic"], request.match_info["channel"], body
            )

        return await self._act(request, act)

    async def delete_topic(self, request: web.Request) -> web.Response:
        return await self._act(
            request,
            lambda: self.admin.actions.delete_topic(request, request.match_info["topic"]),
        )

    async def delete_channel(self, request: web.Request) -> web.Response:
        return await self._act(
            request,
            lambda: self.admin.actions.delete_channel(
                request, request.match_info["topic"], request.match_info["channel"]
            ),
        )

    async def tombstone_node_for_topic(self, request: web.Request) -> web.Response:
        async def tombstone() -> list[str]:
            try:
                body = await _json_body(request)
            except ActionError:
                raise ActionError(400, "INVALID_BODY") from None
            return await self.admin.actions.tombstone(
                request, str(body.get("topic") or ""), request.match_info["node"]
            )

        return await self._act(request, tombstone)

    # ---------------------------------------------------------------------------- /config

    async def config(self, request: web.Request) -> web.Response:
        """Go's doConfig: read any option by its config name; set nsqlookupd_http_addresses
        (a JSON list) or log_level; only from --allow-config-from-cidr."""
        options = self.admin.options
        if options.allow_config_from_cidr:
            network = ipaddress.ip_network(options.allow_config_from_cidr, strict=False)
            peer = request.transport.get_extra_info("peername") if request.transport else None
            try:
                address = ipaddress.ip_address(peer[0]) if peer else None
            except ValueError:
                address = None
            if address is None:
                return v1_error(400, "INVALID_REMOTE_ADDR")
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            if address.version != network.version or address not in network:
                return v1_error(403, "FORBIDDEN")
        name = request.match_info["opt"]
        if request.method == "PUT" and not is_same_origin(request):
            return v1_error(403, "FORBIDDEN_ORIGIN")
        if request.method == "PUT":
            body = await request.read()
            if not body or len(body) > 1024 * 1024:
                return v1_error(413, "INVALID_VALUE")
            if name == "nsqlookupd_http_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    return v1_error(400, "INVALID_VALUE")
                if not isinstance(addresses, list) or not all(
                    isinstance(a, str) for a in addresses
                ):
                    return v1_error(400, "INVALID_VALUE")
                self.admin.set_options(options.replace(lookupd_http_address=addresses))
            elif name == "log_level":
                try:
                    level = parse_log_level(body.decode("utf-8", "replace"))
                except ValueError:
                    return v1_error(400, "INVALID_VALUE")
                self.admin.set_options(options.replace(log_level=level))
                self.admin.log.setLevel(LOG_LEVELS[level])
            else:
                return v1_error(400, "INVALID_OPTION")
        value = _option_by_config_name(self.admin.options, name)
        if value is _MISSING:
            return v1_error(400, "INVALID_OPTION")
        return v1_response(value)


_MISSING: Any = object()


def _option_by_config_name(options, name: str) -> Any:
    """An option's value as Go's getOptByCfgName returns it (durations in nanoseconds)."""
    for flag in build_flags().flags.values():
        if flag.config_key != name:
            continue
        value = getattr(options, flag.dest, _MISSING)
        if flag.kind is Kind.DURATION and value is not _MISSING:
            return round(value * 1_000_000_000)
        return value
    return _MISSING

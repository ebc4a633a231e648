"""The web UI: server-rendered pages (usable without JavaScript) and the forms that act.

Pages: Streams (every topic), Topic, Channel, Nodes, Node, Counter, Lookup; the paths are Go
nsqadmin's. A node or nsqlookupd that cannot be reached puts a banner on the page, which
shows everything else it could get.

Forms POST to the page they sit on, with an `action` field. Destructive actions (empty,
delete, tombstone) first answer with a confirmation page; then the action runs and the
browser is redirected to the page to look at, which shows what happened once (a "flash").
Only --admin-user users see the buttons or may post, and a form posted from another site
(its Origin header names another host) is refused.
"""

import asyncio
import datetime
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import jinja2
from aiohttp import web
from markupsafe import Markup

from nsqpy.common.version import VERSION
from nsqpy.nsqadmin.actions import CHANNEL_LIMITS, ActionError, is_same_origin, unix_seconds
from nsqpy.nsqadmin.charts import render_chart, render_sparkline
from nsqpy.nsqadmin.cluster import RequestError, UpstreamError
from nsqpy.nsqadmin.statistics import FILTERS, rank_name, statistics
from nsqpy.nsqadmin.stats import (
    E2eLatency,
    NodeStats,
    aggregate_topic,
    aggregate_topics,
    counter_stats,
    find_producer,
    node_address,
)

if TYPE_CHECKING:
    from nsqpy.nsqadmin.server import NSQAdmin

T = TypeVar("T")


@dataclass(frozen=True)
class Flash:
    level: str  # "success" or "warning"
    text: str
    details: tuple[str, ...] = ()


class FlashStore:
    """What an action did, shown once on the page it redirects to. The redirect carries a
    random key, never the text itself."""

    _LIMIT = 256
    _LIFETIME = 300.0

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[float, Flash]] = OrderedDict()

    def put(self, flash: Flash) -> str:
        key = secrets.token_urlsafe(9)
        self._entries[key] = (time.monotonic(), flash)
        while len(self._entries) > self._LIMIT:
            self._entries.popitem(last=False)
        return key

    def pop(self, key: str | None) -> Flash | None:
        if not key or key not in self._entries:
            return None
        created, flash = self._entries.pop(key)
        return flash if time.monotonic() - created < self._LIFETIME else None


@dataclass
class Problems:
    """What went wrong while building one page: `errors` when a whole question failed (no
    node answered), `warnings` for the nodes that did not answer."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    async def get(self, call: Awaitable[tuple[T, list[str]]], default: T) -> T:
        try:
            value, warnings = await call
        except UpstreamError as error:
            if str(error) not in self.errors:
                self.errors.append(str(error))
            return default
        self.warnings.extend(warnings)
        return value


def percentile_average(e2e: E2eLatency | None, quantile: float) -> float | None:
    """The average latency (ns) at `quantile` in `e2e`, for a table cell; None when no
    message was measured (nsqd then reports 0)."""
    if e2e is None or not e2e.count:
        return None
    for percentile in e2e.percentiles or []:
        if percentile.get("quantile") == quantile:
            return percentile.get("average")
    return None


def quantiles(e2e: E2eLatency | None) -> list[float]:
    return [p.get("quantile", 0.0) for p in (e2e.percentiles if e2e else None) or []]


# A channel's actions that ask first: the question, the confirming button, what is said after.
_CONFIRMED_CHANNEL_ACTIONS = {
    "empty": ("Empty {what}? Its queued messages are lost.", "Empty channel", "Emptied {what}."),
    "emptydelayed": (
        "Empty the delay queue of {what}? Its delayed messages are lost.",
        "Empty delayed",
        "Emptied the delay queue of {what}.",
    ),
    "requeuedelayed": (
        "Deliver every delayed message of {what} now?",
        "Requeue delayed",
        "Requeued the delayed messages of {what}: they are delivered now.",
    ),
    "replaydeadletters": (
        "Put the dead letters of {what} back into it?",
        "Replay dead letters",
        "Replayed the dead letters of {what}.",
    ),
    "skip": (
        "Skip {what}? What waits in it and what is published until it is unskipped is"
        " dropped, its delayed messages too.",
        "Skip channel",
        "Skipped {what}: it drops what is published.",
    ),
    "unskip": (
        "Unskip {what}? It delivers what is published from now on.",
        "Unskip channel",
        "Unskipped {what}.",
    ),
}


def url_part(text: str) -> str:
    return quote(text, safe="")


def partition_layout(total) -> tuple[int, int] | None:
    """(partitions, replicas) of a replicated cluster's topic, for the Streams badge."""
    if total is None or not total.replicated_nodes:
        return None
    rows = total.replicated_nodes
    return len(rows), max(node.replica.replicas for node in rows)


class Pages:
    def __init__(self, admin: "NSQAdmin", env: jinja2.Environment, prefix: str) -> None:
        self.admin = admin
        self.env = env
        self.prefix = prefix
        env.globals.update(
            node_address=node_address,
            percentile_average=percentile_average,
            quantiles=quantiles,
            url_part=url_part,
        )

    def routes(self) -> list[web.RouteDef]:
        p = self.prefix
        index = [web.get(f"{p}/", self.streams)]
        if p:
            index.append(web.get(p, self.streams))
        return [
            *index,
            web.get(f"{p}/topics", self.streams),
            web.get(f"{p}/topics/{{topic}}", self.topic),
            web.post(f"{p}/topics/{{topic}}", self.topic_form),
            web.get(f"{p}/topics/{{topic}}/{{channel}}", self.channel),
            web.post(f"{p}/topics/{{topic}}/{{channel}}", self.channel_form),
            web.get(f"{p}/nodes", self.nodes),
            web.post(f"{p}/nodes", self.nodes_form),
            web.get(f"{p}/nodes/{{node}}", self.node),
            web.post(f"{p}/nodes/{{node}}", self.node_form),
            web.get(f"{p}/counter", self.counter),
            web.get(f"{p}/statistics", self.statistics),
            web.get(f"{p}/coordinators/{{node}}/{{topic}}/{{partition}}", self.coordinator),
            web.get(f"{p}/lookup", self.lookup),
            web.post(f"{p}/lookup", self.lookup_form),
        ]

    # ---------------------------------------------------------------------------- helpers

    @property
    def _lookupds(self) -> list[str]:
        return self.admin.options.lookupd_http_address

    @property
    def _nsqds(self) -> list[str]:
        return self.admin.options.nsqd_http_address

    def _render(
        self,
        request: web.Request,
        template: str,
        status: int = 200,
        problems: Problems | None = None,
        **context: Any,
    ) -> web.Response:
        actions = self.admin.actions
        page = {
            "base": self.prefix,
            "version": VERSION,
            "user": actions.user(request),
            "is_admin": actions.is_admin(request),
            "lookupds": self._lookupds,
            "nsqds": self._nsqds,
            "errors": problems.errors if problems else [],
            "warnings": problems.warnings if problems else [],
            "flash": self.admin.flash.pop(request.query.get("flash")),
            "now": time.time(),
            "nav": "",
            "request_path": request.rel_url.raw_path,
        }
        page.update(context)
        html = self.env.get_template(template).render(**page)
        return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")

    def _url(self, *parts: str) -> str:
        return self.prefix + "/" + "/".join(url_part(p) for p in parts)

    def _charts(self, topic: str, channel: str = "") -> list[Markup]:
        history, now = self.admin.history, time.time()
        return [
            Markup(
                render_chart(
                    "Message rate",
                    history.rate_points(topic, channel),
                    now,
                    unit="/s",
                    css_class="rate",
                )
            ),
            Markup(
                render_chart(
                    "Depth" if channel else "Depth (topic + channels)",
                    history.depth_points(topic, channel),
                    now,
                    css_class="depth",
                )
            ),
        ]

    # ---------------------------------------------------------------------------- pages

    async def streams(self, request: web.Request) -> web.Response:
        problems = Problems()
        cluster = self.admin.cluster
        topics, producers = await asyncio.gather(
            problems.get(cluster.get_topics(self._lookupds, self._nsqds), []),
            problems.get(cluster.get_producers(self._lookupds, self._nsqds), []),
        )
        stats = await problems.get(
            cluster.get_nsqd_stats(producers, include_clients=False), NodeStats()
        )
        totals = aggregate_topics(stats.topics)
        history, now = self.admin.history, time.time()
        rows = []
        for name in sorted(set(topics) | set(totals)):
            total = totals.get(name)
            rows.append(
                {
                    "name": name,
                    "total": total,
                    "layout": partition_layout(total),
                    "rate": history.rate(name),
                    "sparkline": Markup(
                        render_sparkline(
                            history.rate_points(name), now, label=f"{name} message rate"
                        )
                    ),
                }
            )
        return self._render(request, "streams.html", problems=problems, nav="streams", rows=rows)

    async def topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(
            cluster.get_topic_producers(name, self._lookupds, self._nsqds), []
        )
        stats = await problems.get(
            cluster.get_nsqd_stats(producers, name, include_clients=False), NodeStats()
        )
        total = aggregate_topic(name, stats.topics)
        history = self.admin.history
        channels = sorted(total.channels or [], key=lambda c: c.channel_name)
        cluster_stats = None
        if self._lookupds:
            # Also when no nsqd reports the topic: the master says why a partition is led
            # by no one, and how far each catching-up replica is behind.
            cluster_stats = await problems.get(cluster.get_cluster_stats(self._lookupds), None)
        catch_ups = {
            f"{entry['partition']}:{progress['node']}": progress
            for entry in (cluster_stats or {}).get("partitions", [])
            if entry.get("topic") == name
            for progress in entry.get("catching_up") or []
        }
        return self._render(
            request,
            "topic.html",
            problems=problems,
            nav="streams",
            topic=name,
            total=total,
            nodes=total.nodes or [],
            has_logs=any(node.log is not None for node in total.nodes or []),
            # Cluster partitions: one row each, its leader's view (NodeStats.finish).
            replicas=total.replicated_nodes,
            node_pages={p.tcp_address: p.http_address for p in producers},
            channels=channels,
            rate=history.rate(name),
            channel_rates={c.channel_name: history.rate(name, c.channel_name) for c in channels},
            charts=self._charts(name),
            can_tombstone=bool(self._lookupds),
            cluster=cluster_stats,
            catch_ups=catch_ups,
        )

    async def channel(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        name = request.match_info["channel"]
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(
            cluster.get_topic_producers(topic, self._lookupds, self._nsqds), []
        )
        stats = await problems.get(cluster.get_nsqd_stats(producers, topic, name), NodeStats())
        channel = stats.channels.get(name)
        return self._render(
            request,
            "channel.html",
            problems=problems,
            nav="streams",
            topic=topic,
            name=name,
            channel=channel,
            nodes=(channel.nodes or []) if channel else [],
            clients=(channel.clients or []) if channel else [],
            rate=self.admin.history.rate(topic, name),
            charts=self._charts(topic, name),
        )

    async def nodes(self, request: web.Request) -> web.Response:
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(cluster.get_producers(self._lookupds, self._nsqds), [])
        stats = await problems.get(
            cluster.get_nsqd_stats(producers, include_clients=False), NodeStats()
        )
        by_node: dict[str, dict[str, int]] = {}
        for topic in stats.topics:
            totals = by_node.setdefault(topic.node, {"clients": 0, "messages": 0, "depth": 0})
            totals["clients"] += topic.client_count
            totals["messages"] += topic.message_count
            totals["depth"] += topic.depth
        cluster_stats = None
        if self._lookupds:
            cluster_stats = await problems.get(cluster.get_cluster_stats(self._lookupds), None)
        return self._render(
            request,
            "nodes.html",
            problems=problems,
            nav="nodes",
            producers=producers,
            node_totals=by_node,
            lookupd_count=len(self._lookupds),
            cluster=cluster_stats,
        )

    async def node(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(cluster.get_producers(self._lookupds, self._nsqds), [])
        producer = find_producer(producers, node)
        if producer is None:
            return self._render(
                request,
                "node.html",
                status=404,
                problems=problems,
                nav="nodes",
                node=node,
                producer=None,
                topics=[],
            )
        stats = await problems.get(cluster.get_nsqd_stats([producer]), NodeStats())
        topics = sorted(stats.topics, key=lambda t: t.topic_name)
        total_clients = sum(len(c.clients or []) for t in topics for c in t.channels or [])
        return self._render(
            request,
            "node.html",
            problems=problems,
            nav="nodes",
            node=node,
            producer=producer,
            topics=topics,
            total_messages=sum(t.message_count for t in topics),
            total_clients=total_clients,
            can_tombstone=bool(self._lookupds),
        )

    async def counter(self, request: web.Request) -> web.Response:
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(cluster.get_producers(self._lookupds, self._nsqds), [])
        stats = await problems.get(
            cluster.get_nsqd_stats(producers, include_clients=False), NodeStats()
        )
        total = sum(entry["message_count"] for entry in counter_stats(stats.channels).values())
        return self._render(request, "counter.html", problems=problems, nav="counter", total=total)

    async def statistics(self, request: web.Request) -> web.Response:
        """Youzan's Statistics page: the top ten topics or channels by the sort chosen."""
        sort_by = request.query.get("sort", FILTERS[0])
        problems = Problems()
        top = await problems.get(
            statistics(self.admin.cluster, self._lookupds, self._nsqds, sort_by), []
        )
        return self._render(
            request,
            "statistics.html",
            problems=problems,
            nav="statistics",
            filters=FILTERS,
            sort_by=sort_by,
            rank_name=rank_name(sort_by),
            top=top,
        )

    async def coordinator(self, request: web.Request) -> web.Response:
        """Youzan's coordinator of a topic's partition, as one node's `/coordinator/stats`
        says: its ISR and the nodes catching up."""
        node, topic = request.match_info["node"], request.match_info["topic"]
        partition = request.match_info["partition"]
        problems = Problems()
        cluster = self.admin.cluster
        producers = await problems.get(
            cluster.get_topic_producers(topic, self._lookupds, self._nsqds), []
        )
        producer = find_producer(producers, node)
        coordinators: list[dict] = []
        if producer is not None:
            try:
                stats = await cluster.get_coordinator_stats(producer, topic, partition)
                coordinators = stats.get("topic_coord_stats") or []
            except RequestError as error:
                problems.errors.append(str(error))
        return self._render(
            request,
            "coordinator.html",
            status=200 if producer is not None else 404,
            problems=problems,
            nav="streams",
            node=node,
            topic=topic,
            partition=partition,
            producer=producer,
            coordinators=coordinators,
        )

    async def lookup(self, request: web.Request) -> web.Response:
        problems = Problems()
        cluster = self.admin.cluster
        inactive: dict[str, list[str]] = {}
        if self._lookupds:
            inactive = await problems.get(cluster.get_inactive_topics(self._lookupds), {})
        return self._render(
            request, "lookup.html", problems=problems, nav="lookup", inactive=inactive
        )

    # ---------------------------------------------------------------------------- forms

    async def topic_form(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        form = await request.post()
        action = str(form.get("action", ""))
        actions = self.admin.actions
        topic_page = self._url("topics", topic)
        if action == "delete":
            return await self._act(
                request,
                form,
                question=f"Delete topic {topic} from every nsqd and nsqlookupd?",
                confirm_label="Delete topic",
                run=lambda: actions.delete_topic(request, topic),
                done=f"Deleted topic {topic}.",
                then=self._next(form, self._url("")),
                cancel=topic_page,
            )
        if action == "empty":
            return await self._act(
                request,
                form,
                question=f"Empty topic {topic}? Its queued messages are lost.",
                confirm_label="Empty topic",
                run=lambda: actions.topic_action(request, "empty", topic),
                done=f"Emptied topic {topic}.",
                then=topic_page,
                cancel=topic_page,
            )
        if action in ("pause", "unpause"):
            return await self._act(
                request,
                form,
                run=lambda: actions.topic_action(request, action, topic),
                done=f"{'Paused' if action == 'pause' else 'Unpaused'} topic {topic}.",
                then=topic_page,
            )
        if action == "expand":
            count = str(form.get("partition_num", ""))
            return await self._act(
                request,
                form,
                question=f"Expand topic {topic} to {count} partitions? Keyed producers then"
                " send some keys to other partitions.",
                confirm_label="Expand topic",
                run=lambda: actions.expand(request, topic, count),
                done=f"Expanded topic {topic} to {count} partitions.",
                then=topic_page,
                cancel=topic_page,
            )
        if action == "move":
            partition = str(form.get("partition", ""))
            source, destination = str(form.get("move_from", "")), str(form.get("move_to", ""))
            move_leader = form.get("move_leader") == "true"
            return await self._act(
                request,
                form,
                question=f"Move partition {partition} of topic {topic} from {source} to"
                f" {destination}{' (its leadership too)' if move_leader else ''}? The new copy"
                " catches up first; then the old one is deleted.",
                confirm_label="Move partition",
                run=lambda: actions.move(
                    request, topic, partition, source, destination, move_leader
                ),
                done=f"Moved partition {partition} of topic {topic} to {destination}.",
                then=topic_page,
                cancel=topic_page,
            )
        return self._message(request, 400, "Unknown action", f"No such action: {action!r}.")

    async def nodes_form(self, request: web.Request) -> web.StreamResponse:
        """A replicated cluster's node actions: remove a node, begin or finish an upgrade."""
        form = await request.post()
        action = str(form.get("action", ""))
        actions = self.admin.actions
        nodes_page = self._url("nodes")
        if action == "remove_node":
            node = str(form.get("node_id", ""))
            return await self._act(
                request,
                form,
                question=f"Remove nsqd {node} from the cluster? Every replica it holds moves to"
                " other nodes; then it holds nothing and can be stopped.",
                confirm_label="Remove node",
                run=lambda: actions.remove_node(request, node),
                done=f"Removing {node}: its replicas are moving to other nodes.",
                then=nodes_page,
                cancel=nodes_page,
            )
        if action in ("upgrade_begin", "upgrade_done"):
            begin = action == "upgrade_begin"
            return await self._act(
                request,
                form,
                question="Begin upgrade mode? Until it is finished, no replica is moved or"
                " re-created while nodes restart."
                if begin
                else "Finish upgrade mode? Replicas are moved and re-created again as needed.",
                confirm_label="Begin upgrade" if begin else "Finish upgrade",
                run=lambda: actions.set_upgrading(request, begin),
                done="Upgrade mode on." if begin else "Upgrade mode off.",
                then=nodes_page,
                cancel=nodes_page,
            )
        return self._message(request, 400, "Unknown action", f"No such action: {action!r}.")

    async def channel_form(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        channel = request.match_info["channel"]
        form = await request.post()
        action = str(form.get("action", ""))
        actions = self.admin.actions
        channel_page = self._url("topics", topic, channel)
        what = f"channel {channel} of topic {topic}"
        if action == "delete":
            return await self._act(
                request,
                form,
                question=f"Delete {what} from every nsqd and nsqlookupd?",
                confirm_label="Delete channel",
                run=lambda: actions.delete_channel(request, topic, channel),
                done=f"Deleted {what}.",
                then=self._next(form, self._url("topics", topic)),
                cancel=channel_page,
            )
        confirmed = _CONFIRMED_CHANNEL_ACTIONS.get(action)
        if confirmed is not None:
            question, confirm_label, done = confirmed
            return await self._act(
                request,
                form,
                question=question.format(what=what),
                confirm_label=confirm_label,
                run=lambda: actions.channel_action(request, action, topic, channel),
                done=done.format(what=what),
                then=channel_page,
                cancel=channel_page,
            )
        if action in ("pause", "unpause"):
            return await self._act(
                request,
                form,
                run=lambda: actions.channel_action(request, action, topic, channel),
                done=f"{'Paused' if action == 'pause' else 'Unpaused'} {what}.",
                then=channel_page,
            )
        if action in CHANNEL_LIMITS:
            names = ("action", *CHANNEL_LIMITS[action])
            settings = {name: str(form.get(name, "")) for name in names}
            if action == "ratelimit":
                rate = settings["ratekilobytes"].strip()
                done = f"{what} delivers at most {rate} KiB/s of bodies over 1 KiB."
                if rate in ("0", ""):
                    done = f"{what} is rate limited as each nsqd's --channel-ratelimit-kb says."
            else:
                prefix = settings["client_prefix"].strip()
                consumers = f"consumers at {prefix}… hold" if prefix else "every consumer holds"
                done = f"{what}: {consumers} at most {settings['ready'].strip()} in flight."
            return await self._act(
                request,
                form,
                run=lambda: actions.channel_limit(request, topic, channel, settings),
                done=done[0].upper() + done[1:],
                then=channel_page,
            )
        if action == "reset":
            moment = str(form.get("timestamp", ""))
            try:
                when = datetime.datetime.fromtimestamp(unix_seconds(moment), datetime.UTC)
                moment_text = when.strftime("%Y-%m-%d %H:%M:%S UTC")
            except ActionError:
                moment_text = moment
            return await self._act(
                request,
                form,
                question=f"Reset {what} to {moment_text}? Its consumers get every message"
                " published since then again.",
                confirm_label="Reset channel",
                run=lambda: actions.reset_channel(request, topic, channel, moment),
                done=f"Reset {what} to {moment_text}.",
                then=channel_page,
                cancel=channel_page,
            )
        return self._message(request, 400, "Unknown action", f"No such action: {action!r}.")

    async def node_form(self, request: web.Request) -> web.StreamResponse:
        node = request.match_info["node"]
        form = await request.post()
        action = str(form.get("action", ""))
        topic = str(form.get("topic", ""))
        if action != "tombstone" or not topic:
            return self._message(request, 400, "Unknown action", f"No such action: {action!r}.")
        topic_page = self._url("topics", topic)
        return await self._act(
            request,
            form,
            question=(
                f"Tombstone topic {topic} on nsqd {node}? nsqlookupd stops listing this nsqd "
                f"for the topic, and the topic is deleted on that nsqd."
            ),
            confirm_label="Tombstone",
            run=lambda: self.admin.actions.tombstone(request, topic, node),
            done=f"Tombstoned topic {topic} on {node}.",
            then=self._next(form, topic_page),
            cancel=self._next(form, topic_page),
        )

    async def lookup_form(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        topic = str(form.get("topic", "")).strip()
        channel = str(form.get("channel", "")).strip()
        what = f"topic {topic}" + (f" and its channel {channel}" if channel else "")
        actions = self.admin.actions
        settings = {
            key: str(form.get(key, "")).strip()
            for key in ("partition_num", "replicator", "retention", "syncdisk")
        }
        settings.update(
            (flag, "true") for flag in ("orderedmulti", "extend") if form.get(flag) == "true"
        )
        if not settings["partition_num"]:
            run = lambda: actions.create(request, topic, channel)  # noqa: E731
        else:
            settings["replicator"] = settings["replicator"] or "1"
            what = f"topic {topic} ({settings['partition_num']} partitions ×"
            what += f" {settings['replicator']} replicas)"
            what += f" and its channel {channel}" if channel else ""

            async def run() -> list[str]:
                return await actions.create_partitioned(request, topic, settings, channel)

        return await self._act(
            request,
            form,
            run=run,
            done=f"Created {what}.",
            then=self._url("topics", topic)
            if settings["partition_num"] or not self._lookupds
            else self._url("lookup"),
        )

    def _next(self, form, default: str) -> str:
        """Where to go after an action: a page named by the form's `next`, never a URL."""
        pages = {
            "lookup": self._url("lookup"),
            "streams": self._url(""),
            "nodes": self._url("nodes"),
        }
        node = str(form.get("node_page", ""))
        if node:
            pages["node"] = self._url("nodes", node)
        return pages.get(str(form.get("next", "")), default)

    async def _act(
        self,
        request: web.Request,
        form,
        *,
        run: Callable[[], Awaitable[list[str]]],
        done: str,
        then: str,
        question: str = "",
        confirm_label: str = "",
        cancel: str = "",
    ) -> web.StreamResponse:
        """Check who asks and from where, confirm if `question`, run, redirect to `then`."""
        if not is_same_origin(request):
            return self._message(
                request, 403, "Forbidden", "This form was posted from another site."
            )
        if not self.admin.actions.is_admin(request):
            return self._message(
                request,
                403,
                "Forbidden",
                "Only admin users may change the cluster (--admin-user); "
                f"you are {self.admin.actions.user(request) or 'not signed in'}.",
            )
        if question and form.get("confirm") != "yes":
            fields = {k: str(v) for k, v in form.items() if k != "confirm"}
            return self._render(
                request,
                "confirm.html",
                question=question,
                confirm_label=confirm_label,
                fields=fields,
                action_url=request.rel_url.raw_path,
                cancel=cancel or then,
            )
        try:
            failures = await run()
        except ActionError as error:
            return self._message(request, error.status, "Refused", error.message)
        except UpstreamError as error:
            failures = [str(error)]
            done = "Nothing done: no node could be reached."
        flash = Flash("warning" if failures else "success", done, tuple(failures))
        raise web.HTTPSeeOther(f"{then}?flash={self.admin.flash.put(flash)}")

    def _message(self, request: web.Request, status: int, title: str, text: str) -> web.Response:
        return self._render(request, "message.html", status=status, title=title, text=text)

"""The admin actions, shared by the JSON API (api.py) and the UI's forms (pages.py): who may
act, what each action asks of which nsqd and nsqlookupd (cluster.py), and the notification
Go nsqadmin sends for it (notify.py).

Each returns the texts of the nodes that failed (a partial failure still did the rest), and
raises `ActionError` for a request Go would refuse (403 FORBIDDEN, 400 INVALID_TOPIC ...) or
`cluster.UpstreamError` when no node could be asked at all.
"""

import datetime
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web

from nsqpy.common.names import is_valid_channel_name, is_valid_topic_name
from nsqpy.nsqadmin.cluster import ClusterInfo
from nsqpy.nsqadmin.notify import Notifier, admin_action
from nsqpy.nsqadmin.options import Options

TOPIC_ACTIONS = ("pause", "unpause", "empty")
# A log topic's channel also empties its partitions' delay queues, or makes every delayed
# message due now (nsqd's `/channel/emptydelayed`, `/channel/requeuedelayed`); a channel with
# dead letters puts them back (`/channel/replaydeadletters`).
CHANNEL_ACTIONS = (
    *TOPIC_ACTIONS,
    "emptydelayed",
    "requeuedelayed",
    "replaydeadletters",
    "skip",
    "unskip",
)

# A log topic's channel limits (nsqd's `/channel/ratelimit`, `/channel/setclientlimit`) and
# the settings each takes.
CHANNEL_LIMITS = {
    "ratelimit": ("ratekilobytes",),
    "setclientlimit": ("ready", "client_prefix"),
}


def is_same_origin(request: web.Request) -> bool:
    """A request that changes the cluster is ours unless its Origin names another host.

    A page on any other site can make an operator's browser send a form post, or a "simple"
    cross-site `fetch` (a `text/plain` JSON body needs no preflight), with whatever access the
    operator's network or proxy grants; the browser then sends that site's Origin. Clients
    that send no Origin (curl, scripts) are let through.
    """
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    hosts = {request.host, request.headers.get("X-Forwarded-Host", "")}
    return origin != "null" and urlsplit(origin).netloc in hosts


class ActionError(Exception):
    """A refused action: the HTTP status and Go's message (`FORBIDDEN`, `INVALID_TOPIC`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Actions:
    def __init__(
        self, get_options: Callable[[], Options], cluster: ClusterInfo, notifier: Notifier
    ) -> None:
        self._get_options = get_options  # PUT /config can swap the options while we run
        self.cluster = cluster
        self.notifier = notifier

    @property
    def options(self) -> Options:
        return self._get_options()

    def user(self, request: web.Request) -> str | None:
        return request.headers.get(self.options.acl_http_header)

    def is_admin(self, request: web.Request) -> bool:
        return self.options.is_admin(self.user(request))

    def check_admin(self, request: web.Request) -> None:
        if not self.is_admin(request):
            raise ActionError(403, "FORBIDDEN")

    def _notify(
        self, request: web.Request, action: str, topic: str, channel: str = "", node: str = ""
    ) -> None:
        self.notifier.notify(admin_action(action, topic, channel, node, request))

    @property
    def _lookupds(self) -> list[str]:
        return self.options.lookupd_http_address

    @property
    def _nsqds(self) -> list[str]:
        return self.options.nsqd_http_address

    async def create(self, request: web.Request, topic: str, channel: str = "") -> list[str]:
        self.check_admin(request)
        _check_topic(topic)
        if channel:
            _check_channel(channel)
        errors = await self.cluster.create_topic_channel(
            topic, channel, self._lookupds, self._nsqds
        )
        self._notify(request, "create_topic", topic)
        if channel:
            self._notify(request, "create_channel", topic, channel)
        return errors

    async def topic_action(self, request: web.Request, action: str, topic: str) -> list[str]:
        """pause, unpause or empty a topic on every nsqd that has it."""
        self.check_admin(request)
        if action not in TOPIC_ACTIONS:
            raise ActionError(400, "INVALID_ACTION")
        self._notify(request, f"{action}_topic", topic)
        return await self.cluster.topic_channel_action(
            action, topic, "", self._lookupds, self._nsqds
        )

    async def channel_action(
        self, request: web.Request, action: str, topic: str, channel: str
    ) -> list[str]:
        """pause, unpause, empty, emptydelayed, requeuedelayed, replaydeadletters, skip or
        unskip a channel on every nsqd that has its topic."""
        self.check_admin(request)
        if action not in CHANNEL_ACTIONS:
            raise ActionError(400, "INVALID_ACTION")
        self._notify(request, f"{action}_channel", topic, channel)
        return await self.cluster.topic_channel_action(
            action, topic, channel, self._lookupds, self._nsqds
        )

    async def channel_limit(
        self, request: web.Request, topic: str, channel: str, settings: dict
    ) -> list[str]:
        """A channel's Youzan limits on every nsqd that has its topic: `ratelimit` with
        `ratekilobytes` (0: the nsqd's own), `setclientlimit` with `ready` and
        `client_prefix` (empty: every consumer). 400 `INVALID_OPTION` for a count that is
        not a number."""
        self.check_admin(request)
        action = str(settings.get("action") or "")
        names = CHANNEL_LIMITS.get(action)
        if names is None:
            raise ActionError(400, "INVALID_ACTION")
        query = {}
        for name in names:
            given = settings.get(name)
            value = "" if given is None else str(given).strip()
            if name != "client_prefix":
                try:
                    value = str(int(value))
                except ValueError:
                    raise ActionError(400, "INVALID_OPTION") from None
            query[name] = value
        self._notify(request, f"{action}_channel", topic, channel)
        return await self.cluster.topic_channel_action(
            action, topic, channel, self._lookupds, self._nsqds, query
        )

    async def channel_client_action(
        self, request: web.Request, topic: str, channel: str, body: dict
    ) -> list[str]:
        """Youzan's client actions of a channel (see `API.channel_client_action`); Youzan's
        refusals: 400 `INVALID_NSQD_NODE`, `INVALID_MSGID: <why>`, `INVALID_MSGID: Message
        ID not in flight`, `INVALID_ACTION`."""
        self.check_admin(request)
        action = str(body.get("action") or "")
        if action in ("sink", "sink_removal"):
            self._notify(request, action, topic, channel)
            return []
        if action != "finish":
            raise ActionError(400, "INVALID_ACTION")
        node = str(body.get("node") or "")
        if not node:
            raise ActionError(400, "INVALID_NSQD_NODE")
        text = str(body.get("msgid") or "")
        try:
            message_id = int(text, 10)
        except ValueError:
            raise ActionError(
                400, f'INVALID_MSGID: strconv.ParseInt: parsing "{text}": invalid syntax'
            ) from None
        if message_id <= 0:
            raise ActionError(400, "INVALID_MSGID")
        try:
            partition = int(body.get("partition") or 0)
        except (TypeError, ValueError):
            raise ActionError(400, "INVALID_ARG_TOPIC_PARTITION") from None
        errors = await self.cluster.finish_message(topic, channel, node, partition, message_id)
        if any("not in flight" in error for error in errors):
            raise ActionError(400, "INVALID_MSGID: Message ID not in flight")
        self._notify(request, "finish_message", topic, channel, node)
        return errors

    async def reset_channel(
        self, request: web.Request, topic: str, channel: str, timestamp: object
    ) -> list[str]:
        """A log topic's channel delivers again from a point in time (Youzan's reset)."""
        self.check_admin(request)
        timestamp = unix_seconds(timestamp)
        self._notify(request, "reset_channel", topic, channel)
        return await self.cluster.reset_channel(
            topic, channel, timestamp, self._lookupds, self._nsqds
        )

    async def delete_topic(self, request: web.Request, topic: str) -> list[str]:
        self.check_admin(request)
        errors = await self.cluster.delete_topic(topic, self._lookupds, self._nsqds)
        self._notify(request, "delete_topic", topic)
        return errors

    async def delete_channel(self, request: web.Request, topic: str, channel: str) -> list[str]:
        self.check_admin(request)
        errors = await self.cluster.delete_channel(topic, channel, self._lookupds, self._nsqds)
        self._notify(request, "delete_channel", topic, channel)
        return errors

    async def tombstone(self, request: web.Request, topic: str, node: str) -> list[str]:
        """Tombstone `node` (an nsqd's broadcast HTTP address) for `topic` on every
        nsqlookupd, and delete the topic on that nsqd."""
        self.check_admin(request)
        _check_topic(topic)
        errors = await self.cluster.tombstone_node_for_topic(topic, node, self._lookupds)
        self._notify(request, "tombstone_topic_producer", topic, node=node)
        return errors

    # -- a replicated cluster's operations (the master nsqlookupd's, docs/operations.md) --

    async def create_partitioned(
        self, request: web.Request, topic: str, settings: dict[str, str], channel: str = ""
    ) -> list[str]:
        """Youzan's `/topic/create` with `partition_num`, `replicator`, `retention`,
        `syncdisk`, `orderedmulti` and `extend`, on the master nsqlookupd; then `channel` on
        every partition's leader (the master's `/channel/create`)."""
        self.check_admin(request)
        _check_topic(topic)
        if channel:
            _check_channel(channel)
        for key in ("partition_num", "replicator", "retention", "syncdisk"):
            value = settings.get(key, "")
            if value and not (value.isascii() and value.isdigit()):
                raise ActionError(400, f"INVALID_{key.upper()}")
        query = {"topic": topic, **{k: v for k, v in settings.items() if v}}
        errors = await self._operate("topic/create", query)
        self._notify(request, "create_topic", topic)
        if channel and not errors:
            errors = await self._operate("channel/create", {"topic": topic, "channel": channel})
            self._notify(request, "create_channel", topic, channel)
        return errors

    async def expand(self, request: web.Request, topic: str, partition_num: str) -> list[str]:
        self.check_admin(request)
        _check_topic(topic)
        if not (partition_num.isascii() and partition_num.isdigit()):
            raise ActionError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        query = {"topic": topic, "partition_num": partition_num}
        errors = await self._operate("topic/partition/expand", query)
        self._notify(request, "expand_topic", topic)
        return errors

    async def move(
        self,
        request: web.Request,
        topic: str,
        partition: str,
        source: str,
        destination: str,
        move_leader: bool,
    ) -> list[str]:
        self.check_admin(request)
        _check_topic(topic)
        query = {
            "topic": topic,
            "partition": partition,
            "move_from": source,
            "move_to": destination,
            "move_leader": "true" if move_leader else "false",
        }
        errors = await self._operate("topic/partition/move", query)
        self._notify(request, "move_partition", topic, node=destination)
        return errors

    async def remove_node(self, request: web.Request, node: str) -> list[str]:
        self.check_admin(request)
        errors = await self._operate("cluster/node/remove", {"remove_node": node})
        self._notify(request, "remove_node", "", node=node)
        return errors

    async def set_upgrading(self, request: web.Request, upgrading: bool) -> list[str]:
        self.check_admin(request)
        path = "cluster/upgrade/begin" if upgrading else "cluster/upgrade/done"
        errors = await self._operate(path, {})
        self._notify(request, "begin_upgrade" if upgrading else "finish_upgrade", "")
        return errors

    async def _operate(self, path: str, query: dict[str, str]) -> list[str]:
        if not self._lookupds:
            raise ActionError(400, "this needs a replicated cluster's nsqlookupd")
        return await self.cluster.cluster_operation(self._lookupds, path, query)


def unix_seconds(value: object) -> int:
    """Unix seconds from a number, its digits, or an ISO 8601 time (UTC unless it says)."""
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit():
            value = int(text)
        else:
            try:
                moment = datetime.datetime.fromisoformat(text)
            except ValueError:
                raise ActionError(400, "INVALID_TIMESTAMP") from None
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.UTC)
            value = int(moment.timestamp())
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ActionError(400, "INVALID_TIMESTAMP")
    return value


def _check_topic(topic: str) -> None:
    if not is_valid_topic_name(topic):
        raise ActionError(400, "INVALID_TOPIC")


def _check_channel(channel: str) -> None:
    if not is_valid_channel_name(channel):
        raise ActionError(400, "INVALID_CHANNEL")

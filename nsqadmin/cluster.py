"""The cluster client: asks nsqlookupd and nsqd over HTTP and adds their answers up, as Go
nsqadmin's `internal/clusterinfo` (data.go) does.

Every nsqd or nsqlookupd is asked concurrently. One that cannot be reached does not spoil the
answer: each method returns what the others said plus a list of error texts (Go's PartialErr),
and raises `UpstreamError` only when every node asked failed (Go's "failed to query any ...").
Pages show the texts in a banner; `/api/*` puts them in `message` as `WARNING: ...`.
"""

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import aiohttp

from nsqpy.common.flags import go_quote
from nsqpy.nsqadmin.stats import (
    NodeStats,
    Producer,
    mark_out_of_date,
    merge_lookupd_producers,
    merge_topic_producers,
)

T = TypeVar("T")

# What Go's http_api client sends: nsqd and nsqlookupd answer v1 bodies to it.
_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
# The `Authorization` header of the request nsqadmin is answering (the person acting): its
# requests to nsqds and nsqlookupds carry it, so that they judge the person, not nsqadmin.
ACTING_CREDENTIAL: ContextVar[str | None] = ContextVar("acting_credential", default=None)


class UpstreamError(Exception):
    """Every nsqd or nsqlookupd asked failed; str() names them and why."""


class RequestError(Exception):
    """One request failed; str() is the text shown to the operator."""


def endpoint(address: str, path: str, query: dict[str, str] | None = None) -> str:
    """`http://address/path?query`; an address given with its scheme keeps it (https)."""
    base = address if "://" in address else f"http://{address}"
    url = f"{base.rstrip('/')}/{path}"
    if query:
        url += "?" + urlencode(query, quote_via=quote)
    return url


class ClusterInfo:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        log: logging.Logger,
        quiet: bool = False,
        auth_secret: str = "",
    ) -> None:
        self.session = session
        self.log = log
        # Sent when no person's credential is (NSQADMIN_HTTP_CLIENT_AUTH_SECRET): the chart
        # poller.
        self.auth_secret = auth_secret
        self.quiet = quiet  # the chart poller's: no warning every two seconds per dead node

    # ---------------------------------------------------------------------------- plumbing

    async def get_json(self, url: str) -> Any:
        body = await self.request("GET", url)
        try:
            return json.loads(body)
        except ValueError as error:
            raise RequestError(f'Get "{url}": invalid JSON - {error}') from None

    async def post(self, url: str, body: bytes = b"") -> None:
        await self.request("POST", url, body)

    async def request(self, method: str, url: str, body: bytes = b"") -> bytes:
        """One request as Go's http_api client makes it: the body of a 200, else an error
        naming the URL. A 403 naming an `https_port` (an nsqd whose plain HTTP port requires
        TLS) is retried over HTTPS there, with the --http-client-tls-* settings."""
        verb = method.capitalize()
        self.log.debug("CI: %s %s", method, url)
        headers = _ACCEPT
        credential = ACTING_CREDENTIAL.get() or (
            f"Bearer {self.auth_secret}" if self.auth_secret else None
        )
        if credential:
            headers = {**_ACCEPT, "Authorization": credential}
        try:
            async with self.session.request(
                method, url, headers=headers, data=body or None
            ) as response:
                body = await response.read()
                status, reason = response.status, response.reason
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise RequestError(f'{verb} "{url}": {describe(error)}') from None
        if status == 403 and url.startswith("http://"):
            https_url = https_endpoint(url, body)
            if https_url is not None:
                return await self.request(method, https_url, body)
        if status != 200:
            # Go's http_api client names the status and quotes the body, not the URL.
            text = go_quote(body.decode("utf-8", "replace"))
            raise RequestError(f"got response {status} {reason} {text}")
        return body

    async def _gather(
        self, calls: list[Awaitable[T]], kind: str, *, none_is_failure: bool = False
    ) -> tuple[list[T], list[str]]:
        """Run the calls concurrently: the answers that came, the errors of those that did
        not; UpstreamError when there were calls and all of them failed, or, with
        `none_is_failure`, when there were none (Go compares the error count with the call
        count, so asking no node at all is "failed to query any")."""
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        results: list[T] = []
        errors: list[str] = []
        for outcome in outcomes:
            if isinstance(outcome, RequestError):
                errors.append(str(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results.append(outcome)
        if (calls or none_is_failure) and len(errors) == len(calls):
            raise UpstreamError(f"failed to query any {kind}: " + "\n".join(errors))
        self._warn(errors)
        return results, errors

    async def _post_all(self, urls: Iterable[str], body: bytes = b"") -> list[str]:
        """POST `body` to each URL; the errors (Go's nsqlookupdPOST / producersPOST never fail
        whole)."""
        outcomes = await asyncio.gather(
            *(self.post(url, body) for url in urls), return_exceptions=True
        )
        errors = []
        for outcome in outcomes:
            if isinstance(outcome, RequestError):
                errors.append(str(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
        self._warn(errors)
        return errors

    def _warn(self, errors: list[str]) -> None:
        if not self.quiet:
            for error in errors:
                self.log.warning("%s", error)

    # ---------------------------------------------------------------------------- nsqlookupd

    async def get_lookupd_topics(self, lookupds: list[str]) -> tuple[list[str], list[str]]:
        bodies, errors = await self._gather(
            [self.get_json(endpoint(a, "topics")) for a in lookupds], "nsqlookupd"
        )
        topics = {topic for body in bodies for topic in body.get("topics") or []}
        return sorted(topics), errors

    async def get_lookupd_topic_channels(
        self, topic: str, lookupds: list[str]
    ) -> tuple[list[str], list[str]]:
        bodies, errors = await self._gather(
            [self.get_json(endpoint(a, "channels", {"topic": topic})) for a in lookupds],
            "nsqlookupd",
        )
        channels = {channel for body in bodies for channel in body.get("channels") or []}
        return sorted(channels), errors

    async def get_lookupd_producers(self, lookupds: list[str]) -> tuple[list[Producer], list[str]]:
        async def nodes(address: str) -> tuple[str, dict]:
            return address, await self.get_json(endpoint(address, "nodes"))

        responses, errors = await self._gather([nodes(a) for a in lookupds], "nsqlookupd")
        return merge_lookupd_producers(responses), errors

    async def get_lookupd_topic_producers(
        self, topic: str, lookupds: list[str], *, unknown_is_failure: bool = False
    ) -> tuple[list[Producer], list[str]]:
        async def lookup(address: str) -> dict:
            try:
                return await self.get_json(endpoint(address, "lookup", {"topic": topic}))
            except RequestError as error:
                # nsqlookupd answers 404 TOPIC_NOT_FOUND for a topic it does not know. Go's
                # API reports that as an upstream failure (`unknown_is_failure`); the pages
                # show it as what it is, a topic without producers.
                if "TOPIC_NOT_FOUND" in str(error) and not unknown_is_failure:
                    return {}
                raise

        bodies, errors = await self._gather([lookup(a) for a in lookupds], "nsqlookupd")
        return merge_topic_producers(bodies), errors

    async def get_inactive_topics(
        self, lookupds: list[str]
    ) -> tuple[dict[str, list[str]], list[str]]:
        """Topics nsqlookupd knows that no nsqd produces, with their channels (Go's
        `/api/topics?inactive=true`)."""
        topics, errors = await self.get_lookupd_topics(lookupds)

        async def channels_if_inactive(topic: str) -> list[str] | None:
            producers, _ = await self.get_lookupd_topic_producers(topic, lookupds)
            if producers:
                return None
            channels, _ = await self.get_lookupd_topic_channels(topic, lookupds)
            return channels

        outcomes = await asyncio.gather(
            *(channels_if_inactive(t) for t in topics), return_exceptions=True
        )
        inactive: dict[str, list[str]] = {}
        for topic, outcome in zip(topics, outcomes, strict=True):
            if isinstance(outcome, UpstreamError):
                errors.append(str(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            elif outcome is not None:
                inactive[topic] = outcome
        return inactive, errors

    # ---------------------------------------------------------------------------- nsqd

    async def get_nsqd_topics(self, nsqds: list[str]) -> tuple[list[str], list[str]]:
        bodies, errors = await self._gather(
            [self.get_json(endpoint(a, "stats", {"format": "json"})) for a in nsqds], "nsqd"
        )
        topics = {t["topic_name"] for body in bodies for t in body.get("topics") or []}
        return sorted(topics), errors

    async def _nsqd_producer(self, address: str) -> Producer:
        info = await self.get_json(endpoint(address, "info"))
        stats = await self.get_json(
            endpoint(address, "stats", {"format": "json", "include_clients": "false"})
        )
        return Producer.from_nsqd(address, info, stats)

    async def get_nsqd_producers(self, nsqds: list[str]) -> tuple[list[Producer], list[str]]:
        producers, errors = await self._gather([self._nsqd_producer(a) for a in nsqds], "nsqd")
        mark_out_of_date(producers)
        return producers, errors

    async def get_nsqd_topic_producers(
        self, topic: str, nsqds: list[str]
    ) -> tuple[list[Producer], list[str]]:
        producers, errors = await self.get_nsqd_producers(nsqds)
        having = [p for p in producers if any(t.topic == topic for t in p.topics or [])]
        return having, errors

    async def get_nsqd_stats(
        self,
        producers: list[Producer],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
        *,
        none_is_failure: bool = False,
    ) -> tuple[NodeStats, list[str]]:
        """Go's GetNSQDStats: every producer's /stats, per node and per channel. With
        `none_is_failure`, no producer at all is Go's `failed to query any nsqd: `."""
        query = {"format": "json"}
        if topic:
            query["topic"] = topic
            if channel:
                query["channel"] = channel
        if not include_clients:
            query["include_clients"] = "false"

        async def stats(producer: Producer) -> tuple[Producer, dict]:
            return producer, await self.get_json(endpoint(producer.http_address, "stats", query))

        responses, errors = await self._gather(
            [stats(p) for p in producers], "nsqd", none_is_failure=none_is_failure
        )
        now = time.time()
        result = NodeStats()
        for producer, body in responses:
            result.add_node(producer.http_address, producer.hostname, body, topic, channel, now)
        return result.finish(), errors

    # ---------------------------------------------------------------------------- either mode

    async def get_topics(
        self, lookupds: list[str], nsqds: list[str]
    ) -> tuple[list[str], list[str]]:
        if lookupds:
            return await self.get_lookupd_topics(lookupds)
        return await self.get_nsqd_topics(nsqds)

    async def get_producers(
        self, lookupds: list[str], nsqds: list[str]
    ) -> tuple[list[Producer], list[str]]:
        if lookupds:
            return await self.get_lookupd_producers(lookupds)
        return await self.get_nsqd_producers(nsqds)

    async def get_topic_producers(
        self, topic: str, lookupds: list[str], nsqds: list[str], *, unknown_is_failure: bool = False
    ) -> tuple[list[Producer], list[str]]:
        if lookupds:
            return await self.get_lookupd_topic_producers(
                topic, lookupds, unknown_is_failure=unknown_is_failure
            )
        return await self.get_nsqd_topic_producers(topic, nsqds)

    # ---------------------------------------------------------------------------- actions

    async def create_topic_channel(
        self, topic: str, channel: str, lookupds: list[str], nsqds: list[str]
    ) -> list[str]:
        """Go's CreateTopicChannel: the topic (and channel) on every nsqlookupd, the channel
        on every nsqd that has the topic. With --nsqd-http-address there is no lookupd to tell,
        so the topic (and channel) is created on every nsqd given (Go does nothing then)."""
        topic_query = {"topic": topic}
        channel_query = {"topic": topic, "channel": channel}
        if not lookupds:
            errors = await self._post_all(endpoint(a, "topic/create", topic_query) for a in nsqds)
            if channel:
                errors += await self._post_all(
                    endpoint(a, "channel/create", channel_query) for a in nsqds
                )
            return errors
        errors = await self._post_all(endpoint(a, "topic/create", topic_query) for a in lookupds)
        if channel:
            errors += await self._post_all(
                endpoint(a, "channel/create", channel_query) for a in lookupds
            )
            producers, more = await self.get_lookupd_topic_producers(topic, lookupds)
            errors += more
            errors += await self._post_all(
                endpoint(p.http_address, "channel/create", channel_query) for p in producers
            )
        return errors

    async def delete_topic(self, topic: str, lookupds: list[str], nsqds: list[str]) -> list[str]:
        # The producers first: once lookupd forgets the topic it cannot say who had it.
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        query = {"topic": topic}
        errors += await self._post_all(endpoint(a, "topic/delete", query) for a in lookupds)
        errors += await self._post_all(
            endpoint(p.http_address, "topic/delete", query) for p in producers
        )
        return errors

    async def delete_channel(
        self, topic: str, channel: str, lookupds: list[str], nsqds: list[str]
    ) -> list[str]:
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        query = {"topic": topic, "channel": channel}
        errors += await self._post_all(endpoint(a, "channel/delete", query) for a in lookupds)
        errors += await self._post_all(
            endpoint(p.http_address, "channel/delete", query) for p in producers
        )
        return errors

    async def topic_channel_action(
        self,
        action: str,
        topic: str,
        channel: str,
        lookupds: list[str],
        nsqds: list[str],
        settings: dict[str, str] | None = None,
    ) -> list[str]:
        """pause, unpause or empty a topic (channel "") or a channel on every nsqd that has
        the topic (Go's actionHelper); `settings` go with it (a channel's limits)."""
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        kind = "channel" if channel else "topic"
        query = {"topic": topic, "channel": channel} if channel else {"topic": topic}
        query.update(settings or {})
        errors += await self._post_all(
            endpoint(p.http_address, f"{kind}/{action}", query) for p in producers
        )
        return errors

    async def finish_message(
        self, topic: str, channel: str, node: str, partition: int, message_id: int
    ) -> list[str]:
        """nsqd `node`'s `/message/finish` of one message of a channel's partition; the error
        when it refused."""
        query = {
            "topic": topic,
            "channel": channel,
            "partition": str(partition),
            "msgid": str(message_id),
        }
        return await self._post_all([endpoint(node, "message/finish", query)])

    async def reset_channel(
        self, topic: str, channel: str, timestamp: int, lookupds: list[str], nsqds: list[str]
    ) -> list[str]:
        """Youzan's reset: every partition of the channel, on every nsqd that has the topic,
        delivers again from the first message published at or after `timestamp` (unix
        seconds), through nsqd's `/channel/setoffset`."""
        producers, errors = await self.get_topic_producers(topic, lookupds, nsqds)
        query = {"topic": topic, "channel": channel}
        errors += await self._post_all(
            (endpoint(p.http_address, "channel/setoffset", query) for p in producers),
            b"timestamp:%d" % timestamp,
        )
        return errors

    async def tombstone_node_for_topic(
        self, topic: str, node: str, lookupds: list[str]
    ) -> list[str]:
        """Go's TombstoneNodeForTopic: tombstone the nsqd for the topic on every nsqlookupd
        (so consumers stop finding it there), then delete the topic on that nsqd."""
        errors = await self._post_all(
            endpoint(a, "topic/tombstone", {"topic": topic, "node": node}) for a in lookupds
        )
        errors += await self._post_all([endpoint(node, "topic/delete", {"topic": topic})])
        return errors

    # ---------------------------------------------------------------------------- clusters

    async def get_message_histories(self, producers: list[Producer]) -> list[dict]:
        """Every producer's `/message/historystats` (Youzan's: the last full hour of each
        partition it holds); a node without the route (Go's nsqd) adds nothing."""

        async def history(producer: Producer) -> dict:
            return await self.get_json(endpoint(producer.http_address, "message/historystats"))

        outcomes = await asyncio.gather(
            *(history(producer) for producer in producers), return_exceptions=True
        )
        found = []
        for outcome in outcomes:
            if isinstance(outcome, dict):
                found.append(outcome)
            elif isinstance(outcome, BaseException) and not isinstance(outcome, RequestError):
                raise outcome
        return found

    async def get_coordinator_stats(self, producer: Producer, topic: str, partition: str) -> dict:
        """The node's `/coordinator/stats` for a topic's partition; RequestError as any."""
        query = {"topic": topic, **({"partition": partition} if partition else {})}
        return await self.get_json(endpoint(producer.http_address, "coordinator/stats", query))

    async def get_cluster_stats(self, lookupds: list[str]) -> tuple[dict | None, list[str]]:
        """The replicated cluster as its master nsqlookupd sees it (`/cluster/stats`), or
        None when no nsqlookupd given is in a cluster; the errors of those that failed."""
        errors: list[str] = []
        found = None
        for address in lookupds:
            try:
                stats = await self.get_json(endpoint(address, "cluster/stats"))
            except RequestError as error:
                if "E_NOT_CLUSTER" not in str(error):
                    errors.append(str(error))
                continue
            if found is None or stats.get("is_master"):
                found = stats
            if stats.get("is_master"):
                break
        if found is None and errors and len(errors) == len(lookupds):
            raise UpstreamError("failed to query any nsqlookupd: " + "\n".join(errors))
        return found, errors

    async def cluster_operation(
        self, lookupds: list[str], path: str, query: dict[str, str]
    ) -> list[str]:
        """One of Youzan's operations (`/topic/partition/expand`, `/cluster/node/remove`, ...)
        on the master nsqlookupd, whichever of `lookupds` it is: the others answer that they
        are not. The errors; UpstreamError when none took it."""
        refusals = []
        for address in lookupds:
            try:
                await self.post(endpoint(address, path, query))
            except RequestError as error:
                text = str(error)
                if "Not nsqlookup leader" in text or "E_FAILED_ON_NOT_LEADER" in text:
                    continue
                refusals.append(text)
                continue
            return []
        if refusals:
            return refusals
        raise UpstreamError("failed to query any nsqlookupd: no master nsqlookupd answered")


def https_endpoint(url: str, body: bytes) -> str | None:
    """Go's httpsEndpoint: the same URL over HTTPS at the `https_port` a 403 names."""
    try:
        port = int(json.loads(body).get("https_port") or 0)
    except (ValueError, AttributeError, TypeError):
        return None
    if not port:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return parts._replace(scheme="https", netloc=f"{host}:{port}").geturl()


def describe(error: BaseException) -> str:
    """A short reason for a failed request, in the spirit of Go's net errors."""
    if isinstance(error, TimeoutError):
        return "timeout awaiting response"
    if isinstance(error, aiohttp.ClientConnectorError):
        os_error = error.os_error
        reason = os_error.strerror or (os.strerror(os_error.errno) if os_error.errno else "")
        return f"dial tcp {error.host}:{error.port}: connect: {(reason or str(os_error)).lower()}"
    return str(error) or type(error).__name__

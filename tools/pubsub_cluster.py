"""Where nsq_pubsub finds topics and how it publishes: what the nsqlookupds say about a topic
(every producer of a classic topic, each partition's leader of a partitioned one), shared by
every subscriber and publish, and the publisher behind `/pub` and `/mpub` (docs/tools.md,
"nsq_pubsub")."""

import asyncio
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from nsqpy.client.asyncio import Producer, Target, Targets
from nsqpy.client.blocking import NSQError
from nsqpy.client.security import NO_SECURITY, Security
from nsqpy.client.smart import (
    RETRYABLE_ERRORS,
    LookupdDiscovery,
    LookupUnavailable,
    SmartClientError,
    SmartProducer,
    TopicLayout,
    lookupd_json,
    merge_lookups,
)
from nsqpy.common.command import encode_dpub, encode_mpub, encode_pub
from nsqpy.daemon.http_server import HTTPError

__all__ = ["Layouts", "Publisher", "TopicView"]

# nsqlookupd's `/nodes` (where a new topic is published) is asked again after this long.
NODES_MAX_AGE = 5.0
# A publish that gets no answer from an nsqd within this long fails over to the next one.
PUBLISH_TIMEOUT = 5.0
# An nsqd that refuses a publish with these could not take it (a failing disk, a partition
# that moved); the next nsqd may. Any other refusal is the publish's own fault.
_PUBLISH_FAILURES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})


# -- where topics are --------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicView:
    """A topic as the nsqlookupds see it: the merged partition layout, every producer, and
    the replica count its meta announces."""

    layout: TopicLayout
    producers: tuple[str, ...]
    replica: int = 1

    @property
    def partitioned(self) -> bool:
        """Read by partition at each leader. nsqpy's nsqd registers a classic topic with an
        nsqpy nsqlookupd as partition 0, so one partition alone, unreplicated, plain, is a
        classic topic, read from every producer."""
        layout = self.layout
        return (
            layout.partition_num > 1
            or self.replica > 1
            or layout.ordered
            or layout.extend_support
            or len(layout.partitions) > 1
        )

    def targets(self) -> Targets:
        layout = self.layout
        if self.partitioned:
            found = tuple(Target(address, p) for p, address in sorted(layout.partitions.items()))
        else:
            found = tuple(Target(address) for address in self.producers)
        return Targets(found, ordered=layout.ordered, extend=layout.extend_support)

    @property
    def nodes(self) -> list[str]:
        """Where a classic publish may go: the producers, else the partition leaders."""
        return list(self.producers) or list(dict.fromkeys(self.layout.partitions.values()))


def _lookup_peer(peer: dict) -> str:
    host = str(peer["broadcast_address"])
    return f"[{host}]:{peer['tcp_port']}" if ":" in host else f"{host}:{peer['tcp_port']}"


class Layouts:
    """What every nsqlookupd says about topics, shared by the subscribers and publishes: one
    lookup of a topic at a time, its answer kept `max_age` seconds. Lookups are the client
    core's lookup rounds (`nsqpy/client/discovery.py`: which nsqlookupds to ask, learnt from
    `/listlookup` every minute, which rest after a failure), run with urllib in worker
    threads by the smart client's LookupdDiscovery."""

    def __init__(self, lookupd_http_addresses: Iterable[str], http_timeout: float = 2.0) -> None:
        self.discovery = LookupdDiscovery(lookupd_http_addresses, http_timeout=http_timeout)
        self.http_timeout = http_timeout
        self._views: dict[str, tuple[float, TopicView]] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._nodes: tuple[float, list[str]] | None = None

    async def get(self, topic: str, max_age: float) -> TopicView:
        """The topic's view, looked up unless one younger than `max_age` is kept.
        LookupUnavailable when no nsqlookupd answered."""
        loop = asyncio.get_running_loop()
        kept = self._views.get(topic)
        if kept is not None and loop.time() - kept[0] < max_age:
            return kept[1]
        running = self._running.get(topic)
        if running is None:
            running = asyncio.create_task(asyncio.to_thread(self._lookup, topic))
            self._running[topic] = running
            running.add_done_callback(lambda task: self._looked_up(topic, task))
        # Shielded: a subscriber that leaves does not cancel the others' lookup.
        return await asyncio.shield(running)

    def forget(self, topic: str) -> None:
        self._views.pop(topic, None)

    async def nodes(self) -> list[str]:
        """Every nsqd registered with the nsqlookupds (`/nodes`)."""
        loop = asyncio.get_running_loop()
        if self._nodes is not None and loop.time() - self._nodes[0] < NODES_MAX_AGE:
            return self._nodes[1]
        nodes = await asyncio.to_thread(self._fetch_nodes)
        self._nodes = (loop.time(), nodes)
        return nodes

    def close(self) -> None:
        for task in self._running.values():
            task.cancel()

    def _looked_up(self, topic: str, task: asyncio.Task) -> None:
        self._running.pop(topic, None)
        if not task.cancelled() and task.exception() is None:
            self._views[topic] = (asyncio.get_running_loop().time(), task.result())

    def _lookup(self, topic: str) -> TopicView:
        answers = self.discovery.lookup_answers(topic, "r")
        producers: dict[str, None] = {}
        replica = 1
        for _url, document in answers:
            for peer in (document or {}).get("producers") or []:
                producers[_lookup_peer(peer)] = None
            meta = (document or {}).get("meta") or {}
            replica = max(replica, int(meta.get("replica") or 1))
        return TopicView(merge_lookups(topic, "r", answers), tuple(producers), replica)

    def _fetch_nodes(self) -> list[str]:
        nodes: dict[str, None] = {}
        for url in self.discovery.lookupds:
            try:
                document = self._get_json(url, "/nodes", {})
            except (OSError, ValueError):
                continue
            for peer in (document or {}).get("producers") or []:
                nodes[_lookup_peer(peer)] = None
        return list(nodes)

    def _get_json(self, url: str, path: str, params: dict[str, str]) -> dict | None:
        """A lookupd's v1 answer; None for 404 (a topic it does not know)."""
        return lookupd_json(url, path, params, self.http_timeout)


# -- publishing -------------------------------------------------------------------------------


def _refusal(error: NSQError) -> HTTPError:
    """nsqd's TCP refusal of a publish as nsqd's HTTP API answers the same mistake."""
    text = error.text
    if error.code == "E_BAD_MESSAGE" and "too big" in text:
        return HTTPError(413, "MSG_TOO_BIG")
    if error.code == "E_BAD_BODY" and "too big" in text:
        return HTTPError(413, "BODY_TOO_BIG")
    if error.code in ("E_BAD_MESSAGE", "E_BAD_BODY"):
        return HTTPError(400, error.code[2:])
    if error.code == "E_BAD_TOPIC":
        return HTTPError(400, "INVALID_TOPIC")
    if error.code == "E_INVALID" and text.startswith("E_INVALID DPUB"):
        return HTTPError(400, "INVALID_DEFER")
    if error.code in ("E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"):
        return HTTPError(400, error.code)
    if error.code == "E_TOPIC_NOT_EXIST":
        return HTTPError(404, error.code)
    return HTTPError(502, f"UPSTREAM_ERROR: {text}")


class Publisher:
    """Where `/pub` and `/mpub` go. With nsqd addresses: one nsqd per publish, round-robin,
    the next one when an nsqd cannot take it (go-nsq's hostpool habit of nsq_to_nsq). With
    nsqlookupd: a partitioned topic through the smart client (partition leaders, retries); a
    classic one to one of its producers, or, when no nsqd has it yet, to an nsqd of `/nodes`."""

    def __init__(
        self,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        layouts: "Layouts | None" = None,
        identify: dict | None = None,
        security: Security = NO_SECURITY,
        lookup_interval: float = 60.0,
    ) -> None:
        self.nsqd_tcp_addresses = list(nsqd_tcp_addresses)
        self.layouts = layouts
        self.lookup_interval = lookup_interval
        self.producer = Producer(
            identify or {},
            security.context(),
            timeout=PUBLISH_TIMEOUT,
            auth_secret=security.auth_secret,
        )
        self.smart: SmartProducer | None = None
        if layouts is not None:
            self.smart = SmartProducer(
                layouts.discovery.lookupds,
                identify=identify,
                lookup_interval=lookup_interval,
                security=security,
            )
        self._turn = itertools.count()
        self.messages = 0

    async def publish(self, topic: str, bodies: list[bytes], defer_ms: int | None) -> None:
        """Publish; HTTPError with nsqd's answer for a refusal, 502 UPSTREAM_ERROR when no
        nsqd could take it."""
        if self.layouts is None:
            await self._to_nsqds(self.nsqd_tcp_addresses, topic, bodies, defer_ms)
        else:
            await self._through_lookupd(topic, bodies, defer_ms)
        self.messages += len(bodies)

    async def close(self) -> None:
        await self.producer.close()
        if self.smart is not None:
            self.smart.close()

    async def _through_lookupd(self, topic: str, bodies: list[bytes], defer_ms: int | None) -> None:
        assert self.layouts is not None and self.smart is not None
        try:
            view = await self.layouts.get(topic, self.lookup_interval)
        except LookupUnavailable as error:
            raise HTTPError(502, f"UPSTREAM_ERROR: {error}") from None
        if view.partitioned and defer_ms is None:
            smart = self.smart
            try:
                if len(bodies) == 1:
                    await asyncio.to_thread(smart.publish, topic, bodies[0])
                else:
                    await asyncio.to_thread(smart.multi_publish, topic, bodies)
            except NSQError as error:
                raise _refusal(error) from None
            except (SmartClientError, OSError, ValueError) as error:
                raise HTTPError(502, f"UPSTREAM_ERROR: {error}") from None
            return
        nodes = view.nodes
        if not nodes:
            nodes = await self.layouts.nodes()
            # The nsqd that takes it registers the topic: look it up afresh next time.
            self.layouts.forget(topic)
        if not nodes:
            raise HTTPError(502, "UPSTREAM_ERROR: no nsqd is registered with nsqlookupd")
        await self._to_nsqds(nodes, topic, bodies, defer_ms)

    async def _to_nsqds(
        self, addresses: list[str], topic: str, bodies: list[bytes], defer_ms: int | None
    ) -> None:
        if defer_ms is not None:
            command = encode_dpub(topic, defer_ms, bodies[0])
        elif len(bodies) == 1:
            command = encode_pub(topic, bodies[0])
        else:
            command = encode_mpub(topic, bodies)
        first = next(self._turn)
        failures = []
        for offset in range(len(addresses)):
            address = addresses[(first + offset) % len(addresses)]
            try:
                await self.producer.send(address, command)
                return
            except NSQError as error:
                if error.code not in _PUBLISH_FAILURES and error.code not in RETRYABLE_ERRORS:
                    raise _refusal(error) from None
                failures.append(f"{address}: {error}")
            except (OSError, TimeoutError) as error:
                failures.append(f"{address}: {error or type(error).__name__}")
        raise HTTPError(502, "UPSTREAM_ERROR: " + "; ".join(failures))

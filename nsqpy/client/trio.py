"""The trio adapter of `nsqpy.client`: a smart consumer and a producer for trio programs, over
the client's sans-IO core (`nsqpy.client.core`) and the project's codec (`nsqpy.common`).

    async with open_consumer("t", "c", lookupd_http_addresses=["127.0.0.1:4161"]) as consumer:
        async for message in consumer:
            ...
            await message.finish()

    async with Producer("127.0.0.1:4150") as producer:
        await producer.publish("t", b"hello")

The consumer follows the core's `SubscriptionPlan`: every partition (or nsqd) a lookup lists,
its leader followed when it moves, a lost connection made again after a backoff and a new
lookup, `max_in_flight` spread as RDY. Its tasks live in the nursery `open_consumer` opens, so
they end with the `async with`; lookups ask nsqlookupd over trio streams, in the rounds of
the client's sans-IO discovery (`nsqpy.client.discovery`, the blocking adapter's too).
"""

import json
import math
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import outcome
import trio

from nsqpy.client.blocking import USER_AGENT, NSQError, split_address
from nsqpy.client.core import (
    HEARTBEAT,
    RETRYABLE_ERRORS,
    DeliveredMessage,
    Key,
    ProducerSequences,
    PublishRouter,
    PublishRun,
    SubscriptionError,
    SubscriptionReader,
    Target,
    Targets,
    consumer_identify,
    consumer_plan,
    ready_counts,
    targets_of,
)
from nsqpy.client.discovery import (
    HTTP_HEADERS,
    LookupdDirectory,
    LookupdGet,
    LookupUnavailable,
    Round,
    TopicLayout,
    advance,
    read_lookupd_answer,
)
from nsqpy.client.smart import PublishFailed
from nsqpy.common.command import (
    CLS,
    MAGIC_V2,
    NOP,
    encode_command,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_touch,
)
from nsqpy.common.errors import NON_FATAL_CODES
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, Frame, FrameDecoder
from nsqpy.common.http_response import ResponseParser

__all__ = ["Consumer", "LookupdDiscovery", "Message", "Producer", "SmartProducer", "open_consumer"]

RECEIVE_SIZE = 256 * 1024
CONNECT_TIMEOUT = 5.0


class LookupdDiscovery(LookupdDirectory):
    """`LookupdDirectory` (nsqpy/client/discovery.py) asking its questions on trio streams,
    one connection a GET, each within `http_timeout`."""

    async def lookup(self, topic: str, access: str = "r") -> TopicLayout:
        """`/lookup?topic=&access=&metainfo=true` on every lookupd, merged. LookupUnavailable
        when none answers."""
        return await self._run(self.lookup_round(topic, access))

    async def _run(self, round: Round):
        step = advance(round, outcome.Value(None))
        while isinstance(step, LookupdGet):
            step = advance(round, await outcome.acapture(self._get, step))
        return step.value

    async def _get(self, request: LookupdGet) -> dict | None:
        where = urllib.parse.urlsplit(request.url)
        query = urllib.parse.urlencode(request.params)
        target = where.path + request.path + (f"?{query}" if query else "")
        head = [f"GET {target} HTTP/1.1", f"Host: {where.netloc}", "Connection: close"]
        head += [f"{name}: {value}" for name, value in HTTP_HEADERS.items()]
        parser = ResponseParser()
        with trio.move_on_after(self.http_timeout):
            try:
                await self._ask(where, ("\r\n".join(head) + "\r\n\r\n").encode(), parser)
            except trio.BrokenResourceError as error:
                raise ConnectionError(f"{request.url}: {error}") from None
            return read_lookupd_answer(request.url, parser.status, parser.take_body())
        raise TimeoutError(f"{request.url} did not answer in {self.http_timeout}s")

    @staticmethod
    async def _ask(where: urllib.parse.SplitResult, head: bytes, parser: ResponseParser) -> None:
        secure = where.scheme == "https"
        port = where.port or (443 if secure else 80)
        stream: trio.abc.Stream = await trio.open_tcp_stream(where.hostname or "", port)
        if secure:
            context = ssl.create_default_context()
            stream = trio.SSLStream(stream, context, server_hostname=where.hostname)
        async with stream:
            await stream.send_all(head)
            while not parser.complete:
                data = await stream.receive_some(RECEIVE_SIZE)
                if not data:
                    raise ConnectionError("the connection closed before the whole answer")
                parser.feed(data)


class _Connection:
    """One V2 connection on a trio stream: the magic and IDENTIFY, then request/answer pairs
    until it is subscribed (`reader` takes over from there)."""

    def __init__(self, address: str, stream: trio.SocketStream) -> None:
        self.address = address
        self.stream = stream
        self.identify_reply: dict = {}
        self.decoder = FrameDecoder()
        # Frames read past the last answer (a subscription's reader takes them).
        self.frames: list[Frame] = []
        self._send_lock = trio.Lock()

    @classmethod
    async def open(cls, address: str, identify: dict) -> "_Connection":
        host, port = split_address(address)
        with trio.fail_after(CONNECT_TIMEOUT):
            stream = await trio.open_tcp_stream(host, port)
            connection = cls(address, stream)
            try:
                settings = {"user_agent": USER_AGENT, "feature_negotiation": True, **identify}
                await connection.send(MAGIC_V2 + encode_identify(settings))
                reply = await connection.answer()
                connection.identify_reply = json.loads(reply) if reply.startswith(b"{") else {}
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
        return connection

    async def send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def answer(self) -> bytes:
        """The next response frame's data; NSQError for an error frame (heartbeats answered)."""
        while True:
            while not self.frames:
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    raise trio.BrokenResourceError(f"nsqd {self.address} closed the connection")
                self.frames.extend(self.decoder.receive_data(data))
            frame = self.frames.pop(0)
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise NSQError(frame.data.decode("utf-8", "replace"))
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                continue
            if frame.data == HEARTBEAT:
                await self.send(NOP)
                continue
            return frame.data

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self.stream)


@dataclass(eq=False)
class Message(DeliveredMessage):
    """A delivered message (`DeliveredMessage`), answered on the connection it came from."""

    _link: "_Link | None" = field(default=None, repr=False)

    async def finish(self) -> bool:
        """FIN; False when its connection is gone (nsqd then delivers the message again)."""
        return await self._answer(encode_fin(self.id))

    async def requeue(self, delay_ms: int = 0) -> bool:
        return await self._answer(encode_req(self.id, delay_ms))

    async def touch(self) -> bool:
        return self._link is not None and await self._link.send(encode_touch(self.id))

    async def _answer(self, data: bytes) -> bool:
        if self.responded or self._link is None:
            return False
        self.responded = True
        return await self._link.send(data)


class _Link:
    """A subscribed connection, read by a task of the consumer's nursery."""

    def __init__(self, target: Target, connection: _Connection, reader: SubscriptionReader):
        self.target = target
        self.connection = connection
        self.reader = reader
        self.max_rdy = int(connection.identify_reply.get("max_rdy_count", 2500))
        self.rdy = 0
        self.closed = False
        self.cancel_scope = trio.CancelScope()

    async def send(self, data: bytes) -> bool:
        if self.closed:
            return False
        try:
            await self.connection.send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False
        return True


class Consumer:
    """A smart consumer of `topic`/`channel` on trio; made by `open_consumer`."""

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        lookupd_http_addresses: Iterable[str] = (),
        nsqd_tcp_addresses: Iterable[str] = (),
        max_in_flight: int = 1,
        ordered: bool | None = None,
        lookup_interval: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        identify: dict | None = None,
        desired_tag: str = "",
        start_from: str | dict[int, str] | None = None,
    ) -> None:
        lookupds = list(lookupd_http_addresses)
        self._nsqds = list(nsqd_tcp_addresses)
        if not lookupds and not self._nsqds:
            raise ValueError("give nsqlookupd HTTP addresses or nsqd TCP addresses")
        self.topic = topic
        self.channel = channel
        self.max_in_flight = max_in_flight
        self.discovery = LookupdDiscovery(lookupds) if lookupds else None
        self._identify = consumer_identify(identify, desired_tag)
        self._plan = consumer_plan(
            start_from, lookup_interval, backoff_initial, backoff_max, ordered
        )
        self._links: dict[int | str, _Link] = {}
        self._send, self._receive = trio.open_memory_channel[Message](math.inf)
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.error: BaseException | None = None

    # -- the consumer's side --

    def __aiter__(self) -> "Consumer":
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            if self.error is not None:
                raise self.error from None
            raise StopAsyncIteration from None

    def connected_partitions(self) -> dict[int | str, str]:
        """Partition (or, on a classic nsqd, its address) -> the nsqd subscribed to now."""
        return {slot: link.target.address for slot, link in self._links.items()}

    def refresh(self) -> None:
        """Look the topic up again now."""
        self._plan.request_lookup()
        self._wake.set()

    # -- supervision --

    async def _run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._follow_lookup()
            task_status.started()
            plan = self._plan
            while True:
                await self._subscribe_due()
                with trio.move_on_at(plan.next_wakeup(trio.current_time())):
                    await self._wake.wait()
                self._wake = trio.Event()
                if plan.lookup_due(trio.current_time()):
                    await self._follow_lookup()

    async def _lookup(self) -> Targets:
        if self.discovery is None:
            return Targets(tuple(Target(address) for address in self._nsqds))
        layout = await self.discovery.lookup(self.topic, "r")
        return targets_of(layout)

    async def _follow_lookup(self) -> None:
        try:
            targets = await self._lookup()
        except LookupUnavailable:
            self._plan.lookup_failed(trio.current_time())
            return
        for target in self._plan.looked_up(targets, trio.current_time()):
            link = self._links.get(target.slot)
            if link is not None:
                await self._close_link(link)

    async def _subscribe_due(self) -> None:
        for target in self._plan.due(trio.current_time()):
            try:
                await self._subscribe(target)
            except NSQError as error:
                if self._plan.refused(error.code):
                    self._plan.not_connected(target)
                    self._wake.set()
                    continue
                if error.code not in RETRYABLE_ERRORS:
                    self._stop(error)
                    return
                self._plan.subscribe_failed(target, trio.current_time())
            except (OSError, trio.BrokenResourceError, trio.TooSlowError, ValueError):
                self._plan.subscribe_failed(target, trio.current_time())
        self._rebalance()

    async def _subscribe(self, target: Target) -> None:
        plan = self._plan
        extend = plan.extend
        connection = await _Connection.open(target.address, plan.identify(self._identify))
        try:
            command, args, detail = plan.sub_command(target, self.topic, self.channel)
            await connection.send(encode_command(command, *args))
            await connection.answer()
        except BaseException:
            await connection.aclose()
            raise
        if not plan.subscribed(target):
            await connection.aclose()
            return
        reader = SubscriptionReader(detail=detail, extend=extend, decoder=connection.decoder)
        link = _Link(target, connection, reader)
        self._links[target.slot] = link
        assert self._nursery is not None
        self._nursery.start_soon(self._read, link)

    def _rebalance(self) -> None:
        links = list(self._links.values())
        counts = ready_counts(self.max_in_flight, [link.max_rdy for link in links])
        for link, rdy in zip(links, counts, strict=True):
            if rdy != link.rdy:
                link.rdy = rdy
                assert self._nursery is not None
                self._nursery.start_soon(link.send, encode_rdy(rdy))

    async def _read(self, link: _Link) -> None:
        connection = link.connection
        with link.cancel_scope:
            try:
                # First the frames that came with the SUB's answer.
                events = link.reader.receive_frames(connection.frames)
                connection.frames = []
                while True:
                    if events.reply:
                        await link.send(events.reply)
                    for delivery in events.deliveries:
                        self._send.send_nowait(
                            Message(
                                delivery.id,
                                delivery.body,
                                delivery.attempts,
                                delivery.timestamp,
                                link.target.partition,
                                link.target.address,
                                delivery.offset,
                                delivery.record_size,
                                delivery.ext_header,
                                _link=link,
                            )
                        )
                    if events.closed:
                        break
                    data = await connection.stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        break
                    events = link.reader.receive_data(data)
            except (SubscriptionError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await self._lost(link)

    async def _lost(self, link: _Link) -> None:
        link.closed = True
        await link.connection.aclose()
        if self._links.get(link.target.slot) is link:
            del self._links[link.target.slot]
            self._plan.lost(link.target, trio.current_time())
            self._rebalance()
            self._wake.set()

    async def _close_link(self, link: _Link) -> None:
        """Leave a connection on purpose (a moved partition, or closing)."""
        if self._links.get(link.target.slot) is link:
            del self._links[link.target.slot]
            self._plan.lost(link.target, trio.current_time(), retired=True)
        link.closed = True
        link.cancel_scope.cancel()
        await link.connection.aclose()

    def _stop(self, error: BaseException) -> None:
        self.error = error
        self._send.close()

    async def _close(self) -> None:
        for link in list(self._links.values()):
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await link.send(encode_rdy(0) + CLS)
            await self._close_link(link)
        self._send.close()


@asynccontextmanager
async def open_consumer(topic: str, channel: str, **options) -> AsyncIterator[Consumer]:
    """A running `Consumer` (see its arguments); closed, every connection with it, when the
    block ends. Subscribed to what the first lookup found when the block starts."""
    consumer = Consumer(topic, channel, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer._run)
        try:
            yield consumer
        finally:
            await consumer._close()
            nursery.cancel_scope.cancel()


class Producer:
    """Publishes to one nsqd over TCP, each command answered before the next is sent."""

    def __init__(self, nsqd_tcp_address: str, identify: dict | None = None) -> None:
        self.address = nsqd_tcp_address
        self._identify = dict(identify or {})
        self._connection: _Connection | None = None
        self._lock = trio.Lock()

    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def publish(self, topic: str, body: bytes, partition: int | None = None) -> None:
        """PUB (to `partition` of a partitioned topic); NSQError when nsqd refuses it."""
        await self._request(encode_pub(topic, body, *_partition(partition)))

    async def multi_publish(
        self, topic: str, bodies: list[bytes], partition: int | None = None
    ) -> None:
        await self._request(encode_mpub(topic, bodies, *_partition(partition)))

    async def request_with(self, command: Callable[[dict], bytes]) -> bytes:
        """Send the command `command` makes from the connection's IDENTIFY answer (what the
        nsqd serves), made once the connection is open; its answer."""
        return await self._request(command)

    async def _request(self, command: bytes | Callable[[dict], bytes]) -> bytes:
        async with self._lock:
            if self._connection is None:
                self._connection = await _Connection.open(self.address, self._identify)
            if not isinstance(command, bytes):
                command = command(self._connection.identify_reply)
            try:
                await self._connection.send(command)
                return await self._connection.answer()
            except NSQError as error:
                if error.code not in NON_FATAL_CODES:
                    # nsqd closes the connection after a fatal error: the next publish opens
                    # a new one.
                    await self.aclose()
                raise
            except BaseException:
                # Broken, or cancelled while waiting: whether nsqd answered is unknown, and a
                # late answer must not be read as the next command's. The next one reconnects.
                await self.aclose()
                raise

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.aclose()


class SmartProducer:
    """Publishes to topics found through nsqlookupd, following their partitions' leaders, on
    the core's `PublishRouter` (the blocking `nsqpy.client.smart.SmartProducer`'s): a key's
    partition or the next one round-robin; a publish refused with E_FAILED_ON_NOT_LEADER,
    E_FAILED_ON_NOT_WRITABLE or E_TOPIC_NOT_EXIST, or whose connection broke, is retried after
    a new lookup (at once elsewhere, then after a doubling pause) until `publish_timeout`.
    Idempotent by default on log topics, as the blocking one (docs/client.md): a retry after an
    answer lost in a leader failover stores nothing twice."""

    def __init__(
        self,
        lookupd_http_addresses: Iterable[str],
        *,
        lookup_interval: float = 60.0,
        publish_timeout: float = 10.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        identify: dict | None = None,
        idempotent: bool = True,
        producer_id: str | None = None,
    ) -> None:
        self.discovery = LookupdDiscovery(list(lookupd_http_addresses))
        self.publish_timeout = publish_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._router = PublishRouter(lookup_interval=lookup_interval, backoff_max=backoff_max)
        self.idempotent = idempotent
        self._sequences = ProducerSequences(producer_id, idempotent=idempotent)
        self.producer_id = self._sequences.producer_id
        self._identify = self._sequences.identify(dict(identify or {}))
        self._producers: dict[str, Producer] = {}

    async def __aenter__(self) -> "SmartProducer":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def publish(
        self, topic: str, body: bytes, *, key: Key | None = None, partition: int | None = None
    ) -> Target:
        """Publish one message; where it went. PublishFailed when no attempt succeeded
        within `publish_timeout`, NSQError for any other refusal."""
        return await self._publish(topic, [body], key, partition)

    async def multi_publish(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        key: Key | None = None,
        partition: int | None = None,
    ) -> Target:
        return await self._publish(topic, bodies, key, partition)

    async def _publish(
        self, topic: str, bodies: list[bytes], key: Key | None, partition: int | None
    ) -> Target:
        run = PublishRun(
            self._router,
            self._sequences,
            topic,
            bodies,
            key,
            partition,
            trio.current_time(),
            self.publish_timeout,
            (self.backoff_initial, self.backoff_max),
        )
        while True:
            refresh = run.take_refresh()
            try:
                layout = await self._layout(topic, refresh)
            except LookupUnavailable as error:
                run.lookup_failed(error)
                layout = None
            step = run.next(layout, trio.current_time())
            if step is None:
                raise PublishFailed(*run.failure(trio.current_time()))
            if not isinstance(step, Target):
                await trio.sleep(step)
                continue
            producer = self._producers.get(step.address)
            if producer is None:
                producer = self._producers[step.address] = Producer(step.address, self._identify)
            try:
                # An nsqd that stopped answering without closing: the attempt ends at the
                # publish's deadline.
                deadline = run.attempts.deadline
                with trio.fail_after(max(deadline - trio.current_time(), 0.001)):
                    await producer.request_with(partial(run.command, step.partition))
                return step
            except NSQError as error:
                decision = run.answered_with_error(error, step, trio.current_time())
                if decision == "resend":
                    continue
                if decision == "raise":
                    raise
                going_on = decision == "retry"
            except (OSError, trio.BrokenResourceError, trio.TooSlowError) as error:
                going_on = run.answer_lost(error, step, trio.current_time())
            if not going_on:
                raise PublishFailed(*run.failure(trio.current_time()))

    async def _layout(self, topic: str, refresh: bool):
        fresh = None if refresh else self._router.cached(topic, trio.current_time())
        if fresh is not None:
            return fresh
        try:
            layout = await self.discovery.lookup(topic, "w")
        except LookupUnavailable:
            last = self._router.last(topic)
            if last is None:
                raise
            return last
        return self._router.looked_up(topic, layout, trio.current_time())

    async def aclose(self) -> None:
        producers, self._producers = self._producers, {}
        for producer in producers.values():
            await producer.aclose()


def _partition(partition: int | None) -> tuple[int, ...]:
    return () if partition is None else (partition,)

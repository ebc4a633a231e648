"""The asyncio adapter of `nsqpy.client`: connections, a smart consumer (`Subscription`) and a
pipelining producer on asyncio streams, over the client's sans-IO core (`nsqpy.client.core`:
what to subscribe to and when, RDY, backoff, what a refusal teaches, message decoding) and
the project's codec (`nsqpy.common`). nsq_pubsub's NSQ side, and the client of asyncio users.

Why asyncio and not the blocking adapter's sockets and threads, for nsq_pubsub: every
subscriber of nsq_pubsub is a consumer of its own, with one connection to each nsqd (or
partition leader) it reads, and the HTTP side is aiohttp on an event loop. With threads a
subscriber costs a reading thread per connection and a supervisor, so 1,000 subscribers on one
nsqd are 2,000 threads taking turns on the GIL, and every message crosses from a reading thread
into the loop before it can be written to the subscriber's socket. Here a subscriber is a task
per connection plus one that keeps its subscriptions up, read by the same loop that writes to
its HTTP client: a message goes from nsqd's frame to the subscriber's socket without a thread
switch, and the loop waits for the HTTP side before it FINishes (the contract in nsq_pubsub's
docstring). tests/tools/test_nsq_pubsub.py holds 1,000 SSE subscribers this way, each with its
own nsqd connection, in one thread.
"""

import asyncio
import json
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable

from nsqpy.client import core
from nsqpy.client.blocking import USER_AGENT, NSQError, split_address
from nsqpy.client.core import (
    HEARTBEAT,
    SubscriptionReader,
    Target,
    Targets,
    consumer_identify,
    consumer_plan,
    ready_counts,
)
from nsqpy.client.security import auth_to_send
from nsqpy.common.command import (
    CLS,
    MAGIC_V2,
    NOP,
    encode_auth,
    encode_command,
    encode_fin,
    encode_identify,
    encode_rdy,
    encode_req,
    encode_touch,
)
from nsqpy.common.frame import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameDecoder,
)

__all__ = [
    "Connection",
    "Delivery",
    "Producer",
    "SubscribeError",
    "Subscription",
    "Target",
    "Targets",
]

RECEIVE_SIZE = 256 * 1024
# How long a closing subscriber waits for nsqd's CLOSE_WAIT after its REQs and CLS, and how
# long a connection attempt may take.
CLOSE_TIMEOUT = 2.0
CONNECT_TIMEOUT = 5.0
# A subscriber with no connection at all (nsqd down, topic not registered yet) tries again
# this often, instead of waiting a whole lookupd poll interval.
IDLE_RETRY_INTERVAL = 1.0
# A lost connection is reconnected after this pause (nsqd may be restarting).
RECONNECT_DELAY = 1.0
_CLIENT_ID = socket.gethostname().split(".")[0]
_HOSTNAME = socket.gethostname()


class SubscribeError(Exception):
    """No nsqd could be subscribed to; the text says what each one answered."""


class Connection:
    """One V2 connection on asyncio streams: the magic, IDENTIFY (and the TLS upgrade when
    nsqd grants it), then frames. Heartbeats are answered as they are read."""

    def __init__(
        self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.address = address
        self.reader = reader
        self.writer = writer
        self.identify_reply: dict = {}
        self._decoder = FrameDecoder()
        self._backlog: deque[Frame] = deque()

    @classmethod
    async def open(
        cls,
        address: str,
        identify: dict,
        tls: ssl.SSLContext | None = None,
        timeout: float = CONNECT_TIMEOUT,
        auth_secret: str = "",
    ) -> "Connection":
        """Connect and IDENTIFY. With `tls`, TLS is asked for (`tls_v1`) and required: an
        nsqd that does not grant it is an error, not a silent plain-text connection. An nsqd
        that answers `auth_required` gets `AUTH <auth_secret>` (SecurityMismatch without
        one)."""
        host, port = split_address(address)
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            connection = cls(address, reader, writer)
            try:
                settings = {
                    "client_id": _CLIENT_ID,
                    "hostname": _HOSTNAME,
                    "user_agent": USER_AGENT,
                    "feature_negotiation": True,
                    **identify,
                }
                if tls is not None:
                    settings["tls_v1"] = True
                writer.write(MAGIC_V2 + encode_identify(settings))
                reply = await connection.response()
                connection.identify_reply = json.loads(reply) if reply.startswith(b"{") else {}
                if tls is not None:
                    if not connection.identify_reply.get("tls_v1"):
                        raise ConnectionError(f"nsqd {address} did not grant TLS")
                    await writer.start_tls(tls, server_hostname=host)
                    await connection.response()  # nsqd's OK, the first frame over TLS
                secret = auth_to_send(address, connection.identify_reply, auth_secret)
                if secret is not None:
                    writer.write(encode_auth(secret))
                    await connection.response()
            except BaseException:
                connection.abort()
                raise
        return connection

    async def frames(self) -> list[Frame]:
        """The next frames (at least one; heartbeats are answered with NOP and left out).
        ConnectionError when nsqd closed the connection."""
        if self._backlog:
            frames = list(self._backlog)
            self._backlog.clear()
            return frames
        while True:
            data = await self.reader.read(RECEIVE_SIZE)
            if not data:
                raise ConnectionError(f"nsqd {self.address} closed the connection")
            frames = self._decoder.receive_data(data)
            kept = [
                frame
                for frame in frames
                if frame.frame_type != FRAME_TYPE_RESPONSE or frame.data != HEARTBEAT
            ]
            if len(kept) != len(frames):
                self.send(NOP)
            if kept:
                return kept

    async def response(self) -> bytes:
        """The next response frame's data (frames read past it wait for `frames`); NSQError
        for an error frame. For the handshake, before any message can come."""
        while True:
            frames = await self.frames()
            for index, frame in enumerate(frames):
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    continue
                self._backlog.extend(frames[index + 1 :])
                if frame.frame_type == FRAME_TYPE_ERROR:
                    raise NSQError(frame.data.decode("utf-8", "replace"))
                return frame.data

    def send(self, data: bytes) -> None:
        """Queue bytes for nsqd; dropped once the connection is closing (nsqd then treats
        whatever they answered as it treats a closed connection)."""
        if not self.writer.is_closing():
            self.writer.write(data)

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    def close(self) -> None:
        """Close after what is queued has been sent."""
        self.writer.close()

    def abort(self) -> None:
        self.writer.transport.abort()


# -- subscribing ------------------------------------------------------------------------------


class Delivery:
    """A message handed to a subscriber, answered on the connection it came from."""

    __slots__ = ("link", "id", "body", "attempts", "timestamp")

    def __init__(
        self, link: "_Link", message_id: bytes, body: bytes, attempts: int, timestamp: int
    ) -> None:
        self.link = link
        self.id = message_id
        self.body = body
        self.attempts = attempts
        self.timestamp = timestamp


class _Link:
    """One subscribed connection of a subscription, and the task that reads it."""

    __slots__ = ("target", "connection", "reader", "max_rdy", "rdy", "unfinished", "task")

    def __init__(self, target: Target, connection: Connection, detail: bool, extend: bool) -> None:
        self.target = target
        self.connection = connection
        # Its frames to messages (the ordered detail, the ext header split off) and errors.
        self.reader = SubscriptionReader(detail=detail, extend=extend)
        # An RDY above nsqd's max_rdy_count is a fatal error.
        self.max_rdy = int(connection.identify_reply.get("max_rdy_count", 2500))
        self.rdy = 0
        # The messages nsqd counts in flight to us: delivered, not yet FINished or REQueued.
        self.unfinished: dict[bytes, None] = {}
        self.task: asyncio.Task | None = None

    @property
    def msg_timeout(self) -> float:
        return int(self.connection.identify_reply.get("msg_timeout", 60000)) / 1000


Discover = Callable[[str], Awaitable[Targets]]


class Subscription:
    """One subscriber's consumer: `topic`/`channel` on every target `discover` names, with
    `max_in_flight` spread as RDY over the connections (`ready_counts`).

    Messages are taken in batches (`next_batch`) and answered with `finish`; `close` REQueues
    what is still unfinished, so nsqd gives it to the channel's other subscribers at once
    instead of after `--msg-timeout`. What to be subscribed to and when is the core's
    `SubscriptionPlan`: targets are looked up again every `poll_interval` seconds (every
    IDLE_RETRY_INTERVAL while nothing is connected, and before a lost connection is made
    again, RECONNECT_DELAY after it was lost); a partition whose leader moved is left for its
    new leader.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        discover: Discover,
        *,
        max_in_flight: int,
        identify: dict,
        tls: ssl.SSLContext | None,
        poll_interval: float,
        log: logging.Logger,
        auth_secret: str = "",
        desired_tag: str = "",
        start_from: str | dict[int, str] | None = None,
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.max_in_flight = max_in_flight
        self.finished = 0
        self._discover = discover
        self._tls = tls
        self._auth_secret = auth_secret
        self._log = log
        self._identify = consumer_identify(identify, desired_tag)
        self._plan = consumer_plan(
            start_from,
            poll_interval,
            backoff_initial=RECONNECT_DELAY,
            backoff_max=RECONNECT_DELAY,
            idle_lookup_interval=IDLE_RETRY_INTERVAL,
        )
        self._links: dict[int | str, _Link] = {}
        self._pending: deque[Delivery] = deque()
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._closing = False
        self._stopped = False
        self._supervisor: asyncio.Task | None = None

    # -- the subscriber's side --

    async def start(self) -> None:
        """Look the topic up and subscribe everywhere it is. SubscribeError when it is
        somewhere and no nsqd could be subscribed to; a topic no nsqd has yet is waited for.
        Lookup errors (no nsqlookupd answered) are raised as they are."""
        loop = asyncio.get_running_loop()
        targets = await self._discover(self.topic)
        self._leave(self._plan.looked_up(targets, loop.time()))
        failures = await self._subscribe_due()
        if targets.targets and not self._links:
            raise SubscribeError("; ".join(failures))
        self._supervisor = asyncio.create_task(self._supervise())

    async def next_batch(self) -> list[Delivery]:
        """Every message delivered and not yet taken, once there is at least one; [] once
        `stop` was called."""
        while not self._pending and not self._stopped:
            self._ready.clear()
            await self._ready.wait()
        if self._stopped:
            return []
        batch = list(self._pending)
        self._pending.clear()
        return batch

    def finish(self, batch: list[Delivery]) -> None:
        """FIN these messages: one write per connection."""
        by_link: dict[_Link, list[bytes]] = {}
        for delivery in batch:
            by_link.setdefault(delivery.link, []).append(delivery.id)
        for link, ids in by_link.items():
            if self._links.get(link.target.slot) is not link:
                continue  # its connection is gone: nsqd delivers these again
            unfinished = link.unfinished
            for message_id in ids:
                unfinished.pop(message_id, None)
            link.connection.send(b"".join(encode_fin(message_id) for message_id in ids))
            self.finished += len(ids)

    def touch_unfinished(self) -> None:
        """TOUCH every unfinished message: the subscriber's socket is full and nsqd must not
        time them out (and give them to someone else) while they wait for it."""
        for link in self._links.values():
            if link.unfinished:
                link.connection.send(b"".join(encode_touch(mid) for mid in link.unfinished))

    @property
    def touch_interval(self) -> float:
        """Half the shortest `msg_timeout` nsqd granted."""
        timeouts = [link.msg_timeout for link in self._links.values()]
        return max(min(timeouts, default=60.0) / 2, 0.05)

    @property
    def in_flight(self) -> int:
        return sum(len(link.unfinished) for link in self._links.values())

    @property
    def connections(self) -> int:
        return len(self._links)

    def stop(self) -> None:
        """Make `next_batch` return [] (nsq_pubsub stopping): the stream ends cleanly."""
        self._stopped = True
        self._ready.set()

    async def close(self) -> None:
        """Leave: RDY 0, REQ every unfinished message, CLS; REQ whatever nsqd sent before it
        answered CLOSE_WAIT; close. The REQs are written before anything is awaited, so a
        close that is itself cancelled (nsq_pubsub stopping) has still sent them. Bounded by
        CLOSE_TIMEOUT; a second call returns at once."""
        if self._closing:
            return
        self._closing = True
        self.stop()
        self._pending.clear()
        links = list(self._links.values())
        for link in links:
            requeues = b"".join(encode_req(mid, 0) for mid in link.unfinished)
            link.unfinished.clear()
            link.connection.send(encode_rdy(0) + requeues + CLS)
        tasks = {link.task for link in links if link.task is not None}
        if self._supervisor is not None:
            self._supervisor.cancel()
            tasks.add(self._supervisor)
        try:
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT)
        finally:
            for link in links:
                if link.task is not None:
                    link.task.cancel()
                link.connection.close()
            self._links.clear()

    # -- connections --

    async def _supervise(self) -> None:
        """Look up and subscribe when the plan says so; sleep until then, or until a lost
        connection wakes it."""
        loop = asyncio.get_running_loop()
        plan = self._plan
        while True:
            try:
                async with asyncio.timeout_at(plan.next_wakeup(loop.time())):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if plan.lookup_due(loop.time()):
                try:
                    targets = await self._discover(self.topic)
                except Exception as error:  # lookupd down: keep what we have, try again later
                    self._log.warning("looking up %s failed - %s", self.topic, error)
                    plan.lookup_failed(loop.time())
                    continue
                self._leave(plan.looked_up(targets, loop.time()))
            await self._subscribe_due()

    def _leave(self, moved: list[Target]) -> None:
        for target in moved:
            link = self._links.get(target.slot)
            if link is not None:
                self._log.info(
                    "%s partition %s moved: leaving %s",
                    self.topic,
                    target.partition,
                    target.address,
                )
                self._drop(link)

    async def _subscribe_due(self) -> list[str]:
        """Subscribe to every target the plan says is due (all at once). Returns why each
        failed one failed."""
        loop = asyncio.get_running_loop()
        due = self._plan.due(loop.time())
        results = await asyncio.gather(
            *(self._subscribe(target) for target in due), return_exceptions=True
        )
        failures = []
        for target, result in zip(due, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                self._plan.subscribe_failed(target, loop.time())
                failures.append(f"{target.address}: {result}")
                self._log.warning(
                    "subscribing to %s/%s at %s failed - %s",
                    self.topic,
                    self.channel,
                    target.address,
                    result,
                )
        if due:
            self._rebalance()
        return failures

    async def _subscribe(self, target: Target) -> None:
        """SUB (or SUB_ORDERED) at one target. An nsqd that answers that the topic must be
        read ordered, or with extend_support, is subscribed to again that way (the plan
        learns it when nsqlookupd did not say)."""
        plan = self._plan
        for _attempt in range(3):
            extend = plan.extend
            connection = await Connection.open(
                target.address,
                plan.identify(self._identify),
                self._tls,
                auth_secret=self._auth_secret,
            )
            try:
                command, args, detail = plan.sub_command(target, self.topic, self.channel)
                connection.send(encode_command(command, *args))
                await connection.response()
            except NSQError as error:
                connection.abort()
                if plan.refused(error.code):
                    continue
                raise
            except BaseException:
                connection.abort()
                raise
            if self._closing or not plan.subscribed(target):
                connection.abort()
                return
            link = _Link(target, connection, detail=detail, extend=extend)
            self._links[target.slot] = link
            link.task = asyncio.create_task(self._read(link))
            return
        raise SubscribeError(f"nsqd {target.address} refused every way of subscribing")

    def _rebalance(self) -> None:
        """max_in_flight over the connections (`ready_counts`)."""
        if self._closing or not self._links:
            return
        links = list(self._links.values())
        for link, rdy in zip(
            links, ready_counts(self.max_in_flight, [link.max_rdy for link in links]), strict=True
        ):
            if rdy != link.rdy:
                link.rdy = rdy
                link.connection.send(encode_rdy(rdy))

    async def _read(self, link: _Link) -> None:
        error: BaseException | None = None
        try:
            while True:
                events = link.reader.receive_frames(await link.connection.frames())
                for delivery in events.deliveries:
                    self._deliver(link, delivery)
                for text in events.warnings:
                    # A late FIN/REQ/TOUCH of a message nsqd already timed out: not fatal.
                    self._log.debug("(%s) %s", link.target.address, text)
                if events.closed:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as caught:  # any end of the connection is handled the same way
            error = caught
        finally:
            self._lost(link, error)

    def _deliver(self, link: _Link, message: core.Delivery) -> None:
        if self._closing:
            # Sent before nsqd saw our CLS: back to the channel at once.
            link.connection.send(encode_req(message.id, 0))
            return
        link.unfinished[message.id] = None
        self._pending.append(
            Delivery(link, message.id, message.body, message.attempts, message.timestamp)
        )
        self._ready.set()

    def _lost(self, link: _Link, error: BaseException | None) -> None:
        target = link.target
        if self._links.get(target.slot) is not link:
            link.connection.close()
            return
        del self._links[target.slot]
        link.connection.close()
        if self._closing:
            return
        self._plan.lost(target, asyncio.get_running_loop().time())
        # Its messages will come again from nsqd (after their timeout): not ours to deliver.
        self._pending = deque(d for d in self._pending if d.link is not link)
        self._log.warning(
            "(%s) %s/%s connection lost - %s",
            target.address,
            self.topic,
            self.channel,
            error or "closed",
        )
        self._rebalance()
        self._wake.set()

    def _drop(self, link: _Link) -> None:
        """Leave a connection on purpose (a moved partition): what it had is REQueued."""
        del self._links[link.target.slot]
        self._plan.lost(link.target, asyncio.get_running_loop().time(), retired=True)
        self._pending = deque(d for d in self._pending if d.link is not link)
        requeues = b"".join(encode_req(mid, 0) for mid in link.unfinished)
        link.unfinished.clear()
        link.connection.send(encode_rdy(0) + requeues)
        if link.task is not None:
            link.task.cancel()
        link.connection.close()


# -- publishing -------------------------------------------------------------------------------


class _ProducerLink:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        # The commands sent and not answered yet, in order: nsqd answers them in order.
        self.waiting: deque[asyncio.Future] = deque()
        self.task: asyncio.Task | None = None


class Producer:
    """Publishes to nsqds over TCP: one connection per nsqd, opened on first use, commands
    pipelined on it (nsqd answers in the order it received them). A connection that breaks
    or does not answer within `timeout` is closed; the next command opens a new one."""

    def __init__(
        self,
        identify: dict,
        tls: ssl.SSLContext | None = None,
        *,
        timeout: float = 5.0,
        auth_secret: str = "",
    ) -> None:
        self.identify = identify
        self.tls = tls
        self.auth_secret = auth_secret
        self.timeout = timeout
        self._links: dict[str, _ProducerLink] = {}
        self._connecting: dict[str, asyncio.Lock] = {}

    async def send(self, address: str, command: bytes) -> bytes:
        """Send one publishing command to the nsqd at `address` and return its answer
        (`OK`). NSQError for a refusal; OSError or TimeoutError when the connection failed
        (whether nsqd stored the message is then unknown)."""
        link = await self._link(address)
        future = asyncio.get_running_loop().create_future()
        link.waiting.append(future)
        link.connection.send(command)
        try:
            # Cancelled (its publisher went away, or the timeout), the future is done: the
            # reader skips its answer.
            async with asyncio.timeout(self.timeout):
                return await future
        except TimeoutError:
            self._close(address, link, TimeoutError(f"nsqd {address} did not answer"))
            raise

    async def close(self) -> None:
        for address, link in list(self._links.items()):
            self._close(address, link, ConnectionError("the producer is closed"))

    async def _link(self, address: str) -> _ProducerLink:
        link = self._links.get(address)
        if link is not None:
            return link
        lock = self._connecting.setdefault(address, asyncio.Lock())
        async with lock:
            link = self._links.get(address)
            if link is None:
                connection = await Connection.open(
                    address, self.identify, self.tls, self.timeout, self.auth_secret
                )
                link = _ProducerLink(connection)
                link.task = asyncio.create_task(self._read(address, link))
                self._links[address] = link
        return link

    async def _read(self, address: str, link: _ProducerLink) -> None:
        error: BaseException = ConnectionError(f"nsqd {address} closed the connection")
        try:
            while True:
                for frame in await link.connection.frames():
                    if frame.frame_type == FRAME_TYPE_MESSAGE or not link.waiting:
                        continue
                    future = link.waiting.popleft()
                    if future.done():
                        continue  # its publisher went away; the answer has no one to go to
                    if frame.frame_type == FRAME_TYPE_ERROR:
                        future.set_exception(NSQError(frame.data.decode("utf-8", "replace")))
                    else:
                        future.set_result(frame.data)
        except asyncio.CancelledError:
            raise
        except Exception as caught:
            error = caught
        finally:
            self._close(address, link, error)

    def _close(self, address: str, link: _ProducerLink, error: BaseException) -> None:
        if self._links.get(address) is link:
            del self._links[address]
        link.connection.close()
        if link.task is not None and link.task is not asyncio.current_task():
            link.task.cancel()
        while link.waiting:
            future = link.waiting.popleft()
            if not future.done():
                future.set_exception(
                    error if isinstance(error, OSError) else ConnectionError(str(error))
                )

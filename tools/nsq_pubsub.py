"""nsq_pubsub: a publish/subscribe HTTP interface to the topics of an NSQ cluster, the utility
Go NSQ shipped before 1.0 (`apps/nsq_pubsub`), grown for browsers and `curl` pipes.

* `GET /sub?topic=T&channel=C` streams the channel's messages as they arrive, each body
  followed by a newline on a chunked `text/plain` response, with a `{"_heartbeat_":<unix
  time>}` line (as Go's had) when nothing came for `--heartbeat-interval`. With `Accept:
  text/event-stream` it is a stream of Server-Sent Events instead: `id:` is the message ID,
  each line of the body a `data:` line.
* `GET /ws?topic=T&channel=C` is the same subscription as a WebSocket: one WebSocket message
  per NSQ message, text when the body is UTF-8, binary otherwise.
* `POST /pub?topic=T[&defer=ms]` and `POST /mpub?topic=T[&binary=true]` publish, with nsqd's
  checks, status codes and `{"message": ...}` errors (docs/protocol.md §6.1).
* `GET /stats` (Go's text report, or `?format=json`) lists the subscribers and the messages
  each was sent; `GET /ping` answers `OK`.

Each subscriber is a consumer of its own on its channel: subscribers sharing a channel share
its messages, as NSQ consumers do; without `channel=` each gets a new ephemeral channel
(`pubsub<token>.<n>#ephemeral`), which sees the messages published from then on and
disappears when the subscriber leaves.

Delivery: a message is FINished once its bytes are in the kernel's send buffer of the
subscriber's socket. The response's transport pauses as soon as the kernel does not take a
write whole (its high-water mark is 0), and the stream waits for it to drain before it
FINishes the batch it wrote, so nsq_pubsub holds at most the subscriber's in-flight window
(`--max-in-flight`, its RDY) of messages for it: a slow subscriber slows only itself, its
messages waiting in nsqd. While a write waits, the messages it carries are TOUCHed so that
nsqd does not time them out. A subscriber that goes away has its unfinished messages REQueued
at once (REQ with no delay), not left for nsqd to time out: nsqd keeps a closed connection's
in-flight messages until `--msg-timeout` (60 s by default), and on a shared channel the other
subscribers should get them now. Bytes already in the kernel's buffer of a subscriber that
vanished are lost to it, as with any consumer that FINishes what it has handed on.

The NSQ side is asyncio over the project's codec (nsqpy/client/asyncio.py, which says why not
threads); where topics are and how publishes go, tools/pubsub_cluster.py. With
`--lookupd-http-address` a topic's nsqds come from every nsqlookupd's `/lookup`: every
producer of a classic topic, or the leader of each partition of a partitioned one (more than
one partition, replicated, ordered or ext), read with `SUB <topic> <channel> <partition>`
and published to with the smart client (nsqpy/client/smart.py). A topic no nsqd has yet is
published to an nsqd from nsqlookupd's `/nodes`, which creates it there.
"""

import asyncio
import itertools
import logging
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from nsqpy.client.asyncio import Delivery, SubscribeError, Subscription, Target, Targets
from nsqpy.client.security import NO_SECURITY, Security
from nsqpy.client.smart import LookupUnavailable
from nsqpy.common.command_parser import parse_http_mpub_body
from nsqpy.common.duration import format_duration
from nsqpy.common.errors import ProtocolError
from nsqpy.common.flags import Flag, Kind
from nsqpy.common.goformat import go_atoi, go_json
from nsqpy.common.names import is_valid_name
from nsqpy.common.version import VERSION, version_line
from nsqpy.daemon.http_server import (
    JSON_CONTENT_TYPE,
    NSQ_V1_HEADER,
    TEXT_CONTENT_TYPE,
    HTTPError,
    QueryError,
    parse_query,
)
from nsqpy.daemon.net import format_address, listening_socket
from nsqpy.tools._common import (
    address_flags,
    check_sources,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
)
from nsqpy.tools._options import consumer_settings, nsq_options
from nsqpy.tools.pubsub_cluster import Layouts, Publisher

NAME = "nsq_pubsub"
# Sent first on every event stream: a browser whose stream ended reconnects after 1 s (with
# `Last-Event-ID`) instead of its own default of about 3 s.
SSE_RETRY_MS = 1000
# nsq_pubsub's direct connections are retried this often (go-nsq's reconnect interval).
NSQD_RECONNECT_INTERVAL = 15.0
# A burst of subscribers to one topic shares one lookup.
SUBSCRIBE_LOOKUP_MAX_AGE = 1.0
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


def flags() -> list[Flag]:
    return [
        Flag(
            "http-address",
            Kind.STRING,
            "0.0.0.0:8080",
            "<addr>:<port> to listen on for HTTP clients",
        ),
        Flag(
            "https-address",
            Kind.STRING,
            "",
            "<addr>:<port> to listen on for HTTPS clients (with --tls-cert and --tls-key)",
        ),
        Flag("tls-cert", Kind.STRING, "", "path to certificate file"),
        Flag("tls-key", Kind.STRING, "", "path to key file"),
        Flag("max-in-flight", Kind.INT, 100, "max number of messages to allow in flight"),
        Flag(
            "heartbeat-interval",
            Kind.DURATION,
            "30s",
            "how often a subscriber with nothing to receive is sent a heartbeat (0 disables)",
        ),
        Flag("max-msg-size", Kind.INT64, 1048576, "maximum size of a single message in bytes"),
        Flag("max-body-size", Kind.INT64, 5242880, "maximum size of a single command body"),
        *address_flags(),
        consumer_opt_flag(),
        Flag(
            "producer-opt",
            Kind.STRING_LIST,
            (),
            "option to passthrough to nsq.Producer (may be given multiple times)",
        ),
        *log_flags(NAME),
    ]


# -- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """Everything the server needs, checked; defaults are Go nsq_pubsub's and nsqd's."""

    http_address: str = "0.0.0.0:8080"
    https_address: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    nsqd_tcp_addresses: tuple[str, ...] = ()
    lookupd_http_addresses: tuple[str, ...] = ()
    max_in_flight: int = 100
    heartbeat_interval: float = 30.0
    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    lookupd_poll_interval: float = 60.0
    consumer_identify: dict = field(default_factory=dict)
    producer_identify: dict = field(default_factory=dict)
    consumer_security: Security = NO_SECURITY
    producer_security: Security = NO_SECURITY


def build_options(values: dict, log: logging.Logger) -> Options:
    """Options from the parsed flags; a bad one logs Go's error and exits 1."""
    if values["max_in_flight"] <= 0:
        fatal(log, "--max-in-flight must be > 0")
    check_sources(log, values)
    if bool(values["tls_cert"]) != bool(values["tls_key"]):
        fatal(log, "--tls-cert and --tls-key must be given together")
    if values["https_address"] and not values["tls_cert"]:
        fatal(log, "--https-address needs --tls-cert and --tls-key")
    user_agent = f"{NAME}/nsqpy"
    settings = consumer_settings(log, values, user_agent)
    producer = nsq_options(log, values, "producer-opt")
    return Options(
        http_address=values["http_address"],
        https_address=values["https_address"],
        tls_cert=values["tls_cert"],
        tls_key=values["tls_key"],
        nsqd_tcp_addresses=tuple(values["nsqd_tcp_address"]),
        lookupd_http_addresses=tuple(values["lookupd_http_address"]),
        max_in_flight=settings["max_in_flight"],
        heartbeat_interval=values["heartbeat_interval"],
        max_msg_size=values["max_msg_size"],
        max_body_size=values["max_body_size"],
        lookupd_poll_interval=settings.get("lookupd_poll_interval", 60.0),
        consumer_identify=settings["identify"],
        producer_identify=producer.identify(user_agent),
        consumer_security=settings["security"],
        producer_security=producer.security,
    )


# -- HTTP -------------------------------------------------------------------------------------


def v1_error(status: int, message: str, headers: dict | None = None) -> web.Response:
    """nsqd's error answer (Go's http_api.RespondV1): `{"message": TEXT}`."""
    response = web.Response(status=status, body=go_json({"message": message}))
    response.headers["Content-Type"] = JSON_CONTENT_TYPE
    response.headers[NSQ_V1_HEADER[0]] = NSQ_V1_HEADER[1]
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def v1_text(text: str) -> web.Response:
    response = web.Response(status=200, body=text.encode())
    response.headers["Content-Type"] = TEXT_CONTENT_TYPE
    response.headers[NSQ_V1_HEADER[0]] = NSQ_V1_HEADER[1]
    return response


@web.middleware
async def nsq_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Refusals, unknown paths and wrong methods answered as nsqd's router answers them."""
    try:
        return await handler(request)
    except HTTPError as error:
        return v1_error(error.status, error.message)
    except web.HTTPMethodNotAllowed as error:
        allow = ", ".join(sorted({*error.allowed_methods, "OPTIONS"}))
        return v1_error(405, "METHOD_NOT_ALLOWED", {"Allow": allow})
    except web.HTTPNotFound:
        return v1_error(404, "NOT_FOUND")


def event_id(message_id: bytes) -> bytes:
    """A message ID as an SSE `id:`: Go's IDs are already hex text; Youzan's binary ones
    (partitioned topics) are written in hex."""
    return message_id if message_id.isalnum() else message_id.hex().encode()


def sse_event(delivery: Delivery) -> bytes:
    """One Server-Sent Event: `id:`, then a `data:` line per line of the body (CR, LF and
    CRLF all end an SSE line, so each becomes its own `data:`; the browser joins them with
    LF), then the blank line that ends the event."""
    lines = delivery.body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = b"".join([b"data: " + line + b"\n" for line in lines])
    return b"id: " + event_id(delivery.id) + b"\n" + data + b"\n"


class Subscriber:
    """One HTTP subscriber, for `/stats`."""

    def __init__(self, remote: str, kind: str, subscription: Subscription) -> None:
        self.remote = remote
        self.kind = kind
        self.subscription = subscription
        self.connected_at = time.time()
        self.last_event_id: str | None = None
        self.transport: asyncio.Transport | None = None

    def stats(self, now: float) -> dict:
        subscription = self.subscription
        return {
            "remote_address": self.remote,
            "topic": subscription.topic,
            "channel": subscription.channel,
            "kind": self.kind,
            "messages": subscription.finished,
            "in_flight": subscription.in_flight,
            "nsqd_connections": subscription.connections,
            # Bytes the kernel did not take yet: the subscriber reads slower than it is sent.
            "blocked": bool(self.transport and self.transport.get_write_buffer_size()),
            "connect_ts": int(self.connected_at),
            "connected_seconds": int(now - self.connected_at),
            "last_event_id": self.last_event_id,
        }


WriteBatch = Callable[[list[Delivery]], Awaitable[None]]


class PubSub:
    """The server: subscriptions, publishes and stats behind one aiohttp application."""

    def __init__(self, options: Options, log: logging.Logger) -> None:
        self.options = options
        self.log = log
        self.layouts = (
            Layouts(options.lookupd_http_addresses) if options.lookupd_http_addresses else None
        )
        self.publisher = Publisher(
            nsqd_tcp_addresses=options.nsqd_tcp_addresses,
            layouts=self.layouts,
            identify=options.producer_identify,
            security=options.producer_security,
            lookup_interval=options.lookupd_poll_interval,
        )
        self.subscribers: dict[int, Subscriber] = {}
        self.total_messages = 0
        self.http_address = ""
        self.https_address = ""
        self.start_time = int(time.time())
        self._channel_token = secrets.token_hex(3)
        self._channel_numbers = itertools.count(1)
        self._stopping = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[nsq_errors])
        app.router.add_get("/ping", self.ping)
        app.router.add_get("/stats", self.stats)
        # No HEAD: it would subscribe.
        app.router.add_get("/sub", self.sub, allow_head=False)
        app.router.add_get("/ws", self.ws, allow_head=False)
        app.router.add_post("/pub", self.pub)
        app.router.add_post("/mpub", self.mpub)
        return app

    # -- running --

    async def serve(self) -> None:
        """Listen (logging `HTTP: listening on ...`), serve until `shutdown()`, then end every
        stream (their unfinished messages REQueued) and close."""
        options = self.options
        self.log.info("%s", version_line(NAME))
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            # A subscriber that disconnects cancels its handler, which REQueues its messages.
            handler_cancellation=True,
            shutdown_timeout=2.0,
        )
        await runner.setup()
        try:
            sock = listening_socket(options.http_address, backlog=4096)
            # The listen backlog is the site's (its default, 128, drops bursts of subscribers).
            await web.SockSite(runner, sock, backlog=4096).start()
            self.http_address = format_address(sock.getsockname())
            self.log.info("HTTP: listening on %s", self.http_address)
            if options.https_address:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(options.tls_cert, options.tls_key)
                tls_sock = listening_socket(options.https_address, backlog=4096)
                await web.SockSite(runner, tls_sock, ssl_context=context, backlog=4096).start()
                self.https_address = format_address(tls_sock.getsockname())
                self.log.info("HTTPS: listening on %s", self.https_address)
            await self._stopping.wait()
        finally:
            self.log.info("HTTP: closing %s", self.http_address)
            # Every subscriber leaves first (its unfinished messages REQueued), then its
            # stream ends; one whose socket is full would hold the cleanup up for nothing:
            # what waits for it was requeued, so it is cut off.
            subscribers = list(self.subscribers.values())
            await asyncio.gather(*(s.subscription.close() for s in subscribers))
            for subscriber in subscribers:
                transport = subscriber.transport
                # A transport already closing may have dropped its connection (an SSL one
                # then has no buffer left to ask about); its own close finishes it.
                if (
                    transport is not None
                    and not transport.is_closing()
                    and transport.get_write_buffer_size()
                ):
                    transport.abort()
            await runner.cleanup()
            await self.publisher.close()
            if self.layouts is not None:
                self.layouts.close()

    def shutdown(self) -> None:
        self._stopping.set()

    # -- plain endpoints --

    async def ping(self, request: web.Request) -> web.Response:
        response = web.Response(text="OK")
        response.headers["Content-Type"] = TEXT_CONTENT_TYPE
        return response

    async def stats(self, request: web.Request) -> web.Response:
        params = _query(request)
        now = time.time()
        subscribers = [subscriber.stats(now) for subscriber in self.subscribers.values()]
        if _first(params, "format") == "json":
            document = {
                "version": VERSION,
                "start_time": self.start_time,
                "total_messages": self.total_messages,
                "published_messages": self.publisher.messages,
                "subscribers": subscribers,
            }
            response = web.Response(body=go_json(document))
            response.headers["Content-Type"] = JSON_CONTENT_TYPE
            return response
        # Go nsq_pubsub's report, with each subscriber's messages and in-flight count.
        lines = [f"Total Messages: {self.total_messages}", ""]
        for entry in subscribers:
            lines.append(
                f"[{entry['remote_address']}] [{entry['topic']} : {entry['channel']}]"
                f" {entry['kind']} msgs: {entry['messages']} in-flight: {entry['in_flight']}"
                f" connected: {format_duration(entry['connected_seconds'])}"
            )
        response = web.Response(text="\n".join(lines) + "\n")
        response.headers["Content-Type"] = TEXT_CONTENT_TYPE
        return response

    # -- publishing --

    async def pub(self, request: web.Request) -> web.Response:
        """nsqd's /pub: 413 MSG_TOO_BIG, 400 MSG_EMPTY, the topic, then `defer`."""
        options = self.options
        body = await _read_body(request, options.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        params = _query(request)
        topic = _publish_topic(params)
        defer_ms = None
        defer_text = _first(params, "defer")
        if defer_text is not None:
            try:
                defer_ms = go_atoi(defer_text.encode("utf-8", "surrogateescape"))
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            # The upper bound is the nsqd's --max-req-timeout: it refuses a longer one.
            if defer_ms < 0:
                raise HTTPError(400, "INVALID_DEFER")
        await self.publisher.publish(topic, [body], defer_ms)
        return v1_text("OK")

    async def mpub(self, request: web.Request) -> web.Response:
        """nsqd's /mpub: 413 BODY_TOO_BIG, the topic, then the messages (lines, or `binary`)."""
        options = self.options
        body = await _read_body(request, options.max_body_size, "BODY_TOO_BIG")
        params = _query(request)
        topic = _publish_topic(params)
        binary_text = _first(params, "binary")
        # Text mode is the default; a value other than true/1/false/0 means binary (Go).
        binary = binary_text is not None and _BOOL_PARAMS.get(binary_text, True)
        try:
            bodies = parse_http_mpub_body(body, binary, options.max_msg_size, options.max_body_size)
        except ProtocolError as error:
            raise HTTPError(413, error.code[2:]) from None
        if bodies:
            await self.publisher.publish(topic, bodies, None)
        return v1_text("OK")

    # -- subscribing --

    async def sub(self, request: web.Request) -> web.StreamResponse:
        topic, channel = self._topic_and_channel(request)
        sse = "text/event-stream" in request.headers.get("Accept", "")
        subscriber = await self._subscribe(request, topic, channel, "sse" if sse else "stream")
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream" if sse else TEXT_CONTENT_TYPE,
                "Cache-Control": "no-cache",
                # Proxies such as nginx would otherwise hold the stream back.
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            _unbuffered(request, subscriber)
            if sse:
                subscriber.last_event_id = request.headers.get("Last-Event-ID")
                await response.write(b"retry: %d\n\n" % SSE_RETRY_MS)

                async def write_batch(batch: list[Delivery]) -> None:
                    await response.write(b"".join([sse_event(delivery) for delivery in batch]))

                async def heartbeat() -> None:
                    await response.write(b': {"_heartbeat_":%d}\n\n' % time.time())

            else:

                async def write_batch(batch: list[Delivery]) -> None:
                    parts = []
                    for delivery in batch:
                        parts.append(delivery.body)
                        parts.append(b"\n")
                    await response.write(b"".join(parts))

                async def heartbeat() -> None:
                    await response.write(b'{"_heartbeat_":%d}\n' % time.time())

            await self._stream(request, subscriber, write_batch, heartbeat)
        except ConnectionError:
            pass  # the subscriber went away: aiohttp finds its connection closed
        finally:
            await self._unsubscribe(subscriber)
        return response

    async def ws(self, request: web.Request) -> web.StreamResponse:
        topic, channel = self._topic_and_channel(request)
        socket_response = web.WebSocketResponse(heartbeat=self.options.heartbeat_interval or None)
        if not socket_response.can_prepare(request).ok:
            raise HTTPError(400, "INVALID_REQUEST")
        subscriber = await self._subscribe(request, topic, channel, "websocket")
        try:
            await socket_response.prepare(request)
            _unbuffered(request, subscriber)

            async def write_batch(batch: list[Delivery]) -> None:
                for delivery in batch:
                    try:
                        text = delivery.body.decode("utf-8")
                    except UnicodeDecodeError:
                        await socket_response.send_bytes(delivery.body)
                    else:
                        await socket_response.send_str(text)

            streaming = asyncio.create_task(self._stream(request, subscriber, write_batch, None))
            reading = asyncio.create_task(_read_until_closed(socket_response))
            try:
                await asyncio.wait({streaming, reading}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (streaming, reading):
                    task.cancel()
                await asyncio.wait({streaming, reading})
            for task in (streaming, reading):
                if not task.cancelled() and task.exception() is not None:
                    self.log.debug("websocket subscriber ended - %s", task.exception())
            if not socket_response.closed:
                await socket_response.close()
            return socket_response
        except ConnectionError:
            return socket_response
        finally:
            await self._unsubscribe(subscriber)

    def _topic_and_channel(self, request: web.Request) -> tuple[str, str]:
        """Go's GetTopicChannelArgs, except that a missing channel is a new ephemeral one."""
        params = _query(request)
        topic = _first(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = _first(params, "channel")
        if channel is None:
            number = next(self._channel_numbers)
            return topic, f"pubsub{self._channel_token}.{number}#ephemeral"
        if not is_valid_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    async def _discover(self, topic: str) -> Targets:
        if self.layouts is None:
            return Targets(tuple(Target(address) for address in self.options.nsqd_tcp_addresses))
        view = await self.layouts.get(topic, SUBSCRIBE_LOOKUP_MAX_AGE)
        return view.targets()

    async def _subscribe(
        self, request: web.Request, topic: str, channel: str, kind: str
    ) -> Subscriber:
        """Subscribe before answering: a client that got its response headers is reading
        the channel. 502 UPSTREAM_ERROR when no nsqd could be subscribed to."""
        options = self.options
        subscription = Subscription(
            topic,
            channel,
            self._discover,
            max_in_flight=options.max_in_flight,
            identify=options.consumer_identify,
            tls=options.consumer_security.context(),
            poll_interval=(
                options.lookupd_poll_interval if self.layouts else NSQD_RECONNECT_INTERVAL
            ),
            log=self.log,
            auth_secret=options.consumer_security.auth_secret,
        )
        try:
            await subscription.start()
        except (SubscribeError, LookupUnavailable) as error:
            await subscription.close()
            raise HTTPError(502, f"UPSTREAM_ERROR: {error}") from None
        except BaseException:
            await subscription.close()
            raise
        peer = request.transport.get_extra_info("peername") if request.transport else None
        subscriber = Subscriber(format_address(peer) if peer else "", kind, subscription)
        self.subscribers[id(subscriber)] = subscriber
        self.log.info("[%s] new %s subscriber of %s/%s", subscriber.remote, kind, topic, channel)
        return subscriber

    async def _unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.pop(id(subscriber), None)
        subscription = subscriber.subscription
        in_flight = subscription.in_flight
        await subscription.close()
        self.log.info(
            "[%s] %s subscriber of %s/%s left after %d messages (%d requeued)",
            subscriber.remote,
            subscriber.kind,
            subscription.topic,
            subscription.channel,
            subscription.finished,
            in_flight,
        )

    async def _stream(
        self,
        request: web.Request,
        subscriber: Subscriber,
        write_batch: WriteBatch,
        heartbeat: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """Hand each batch of messages to the subscriber and FIN it once it is in the
        kernel's buffer, until nsq_pubsub stops; heartbeats while there is nothing to send.
        ConnectionError (or cancellation) when the subscriber goes away."""
        subscription = subscriber.subscription
        loop = asyncio.get_running_loop()
        interval = self.options.heartbeat_interval
        beating = heartbeat is not None and interval > 0
        next_beat = loop.time() + interval
        while True:
            if beating:
                try:
                    async with asyncio.timeout_at(next_beat):
                        batch = await subscription.next_batch()
                except TimeoutError:
                    assert heartbeat is not None
                    await heartbeat()
                    await _flushed(request, subscriber)
                    next_beat = loop.time() + interval
                    continue
            else:
                batch = await subscription.next_batch()
            if not batch:
                return
            await write_batch(batch)
            await _flushed(request, subscriber)
            subscription.finish(batch)
            self.total_messages += len(batch)
            next_beat = loop.time() + interval


def _unbuffered(request: web.Request, subscriber: Subscriber) -> None:
    """Make the response's transport keep nothing: it pauses (and drain waits) as soon as
    the kernel does not take a write whole, so a drained writer means delivered bytes."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the subscriber went away")
    transport.set_write_buffer_limits(high=0)
    subscriber.transport = transport


async def _flushed(request: web.Request, subscriber: Subscriber) -> None:
    """Wait until everything written to the subscriber is in the kernel's socket buffer,
    TOUCHing its messages meanwhile so that nsqd keeps them for it. ConnectionResetError when
    the subscriber went away."""
    transport = request.transport
    if transport is not None and transport.get_write_buffer_size():
        subscription = subscriber.subscription
        # A task of its own: cancelling a drain would cancel aiohttp's shared waiter.
        drain = asyncio.ensure_future(request.writer.drain())
        try:
            while True:
                done, _ = await asyncio.wait({drain}, timeout=subscription.touch_interval)
                if done:
                    drain.result()
                    break
                subscription.touch_unfinished()
        finally:
            drain.cancel()
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the subscriber went away")


async def _read_until_closed(socket_response: web.WebSocketResponse) -> None:
    """Read a WebSocket until it closes (aiohttp answers pings and the closing handshake while
    it is read); what a subscriber sends is ignored: it publishes with /pub."""
    async for message in socket_response:
        if message.type == WSMsgType.ERROR:
            return


async def _read_body(request: web.Request, limit: int, too_big: str) -> bytes:
    """The request body, refused with 413 `too_big` as soon as it is known to be longer than
    `limit` (from Content-Length, or while reading a chunked one): never buffered past it."""
    if request.content_length is not None and request.content_length > limit:
        raise HTTPError(413, too_big)
    body = bytearray()
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, too_big)


def _query(request: web.Request) -> dict[str, list[str]]:
    """Go's url.ParseQuery of the raw query string; nsqd answers a bad one 400."""
    try:
        return parse_query(request.rel_url.raw_query_string)
    except QueryError:
        raise HTTPError(400, "INVALID_REQUEST") from None


def _first(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def _publish_topic(params: dict[str, list[str]]) -> str:
    topic = _first(params, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_TOPIC")
    return topic


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    options = build_options(values, log)
    server = PubSub(options, log)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, server.shutdown)
        await server.serve()

    try:
        asyncio.run(run())
    except OSError as error:
        fatal(log, "%s", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())

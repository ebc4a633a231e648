"""The etcd model (`nsqpy/etcd_model.py`) reached as the daemons' etcd client reaches etcd:
an `EtcdNetwork` whose every connection is an in-memory stream pair, the far end served here
with the gateway's HTTP (keep-alive answers, a watch's chunked stream), on trio's clock.

So the production `EtcdClient`, its HTTP codec, pooling, failover and watch included, runs
unchanged on the model in one trio run, under a virtual clock when the run has one. Leases
expire on that clock: a task of the network revokes each at its deadline, as etcd's leader
does, and the watches see the deletions.
"""

import json
import math
import weakref
from typing import Any

import httptools
import trio
import trio.testing

from nsqpy.daemon.http_server import Response, encode_response
from nsqpy.etcd import EtcdNetwork, _Endpoint, _NotSent
from nsqpy.etcd_model import EtcdModel, ModelWatch

# Set on a client's stream whose far end closed: marked on the stream itself, as an `id()`
# kept in a set would be taken for another stream's once the first is gone and its address
# used again.
_ENDED = "_model_ended"

__all__ = ["ModelNetwork"]

RECEIVE_SIZE = 64 * 1024
# What etcd's gateway says of its answers.
_JSON_HEADERS = [("Content-Type", "application/json")]


class ModelNetwork(EtcdNetwork):
    """Connections to `model` served in `nursery` (which also runs the lease clock: start
    it with `nursery.start(network.run)`). Every endpoint URL is a member of the one model.

    Faults, by endpoint URL: `refuse` one (a member down: connections refused, the ones open
    closed), `pause` one (a member stopped: connections accepted, nothing answered, as under
    SIGSTOP) and `resume` it."""

    def __init__(self, model: EtcdModel, nursery: trio.Nursery) -> None:
        self.model = model
        self.nursery = nursery
        self.refused: set[str] = set()
        self.paused: set[str] = set()
        self._changed = trio.Event()
        # Set when a member is refused, paused or resumed: what each connection's guard and
        # a paused member's requests wait for (not every answer's change).
        self._members_changed = trio.Event()

    def refuse(self, endpoint: str) -> None:
        self.refused.add(endpoint)
        self._wake_members()
        self._wake()

    def pause(self, endpoint: str) -> None:
        self.paused.add(endpoint)

    def resume(self, endpoint: str) -> None:
        self.refused.discard(endpoint)
        self.paused.discard(endpoint)
        self._wake_members()
        self._wake()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Revoke each lease when its deadline comes; for ever."""
        task_status.started()
        while True:
            deadline = self.model.next_deadline()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._changed.wait()
            self.model.advance(trio.current_time())
            self._wake()

    # -- EtcdNetwork ----------------------------------------------------------------------

    async def connect(self, endpoint: _Endpoint, ssl_context: Any) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        if endpoint.url in self.refused:
            raise _NotSent("connect failed: Connection refused")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, server, weakref.ref(client), endpoint.url)
        return client

    def dropped(self, stream: trio.abc.Stream) -> bool:
        return getattr(stream, _ENDED, False)

    def close(self, stream: trio.abc.Stream) -> None:
        assert isinstance(stream, trio.StapledStream)
        stream.send_stream.close()
        stream.receive_stream.close()

    # -- the far end ------------------------------------------------------------------------

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _wake_members(self) -> None:
        self._members_changed.set()
        self._members_changed = trio.Event()

    async def _serve(
        self, stream: trio.StapledStream, client: "weakref.ref[trio.StapledStream]", endpoint: str
    ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._close_when_refused, endpoint, nursery.cancel_scope)
                await self._answer(stream, endpoint)
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, httptools.HttpParserError):
            pass
        finally:
            ended = client()
            if ended is not None:
                setattr(ended, _ENDED, True)
            await stream.aclose()

    async def _answer(self, stream: trio.StapledStream, endpoint: str) -> None:
        requests: list[tuple[str, bytes]] = []
        parser = httptools.HttpRequestParser(_Requests(requests))
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            parser.feed_data(data)
            while requests:
                while endpoint in self.paused:
                    await self._members_changed.wait()
                path, body = requests.pop(0)
                document = json.loads(body) if body else {}
                if path == "/v3/watch":
                    await self._stream_watch(stream, document, endpoint)
                    return
                status, answer = self.model.handle(path, document, trio.current_time())
                self._wake()
                response = Response(status, json.dumps(answer).encode(), _JSON_HEADERS)
                await stream.send_all(encode_response(response, close=False))

    async def _close_when_refused(self, endpoint: str, scope: trio.CancelScope) -> None:
        while endpoint not in self.refused:
            await self._members_changed.wait()
        scope.cancel()

    async def _stream_watch(
        self, stream: trio.StapledStream, document: dict, endpoint: str
    ) -> None:
        watch = self.model.watch(document, trio.current_time())
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._until_closed, stream, nursery.cancel_scope)
                await self._send_messages(stream, watch, endpoint)
        finally:
            self.model.close_watch(watch)

    async def _send_messages(
        self, stream: trio.StapledStream, watch: ModelWatch, endpoint: str
    ) -> None:
        while True:
            changed = self._changed
            for message in [] if endpoint in self.paused else watch.take():
                line = json.dumps({"result": message}).encode() + b"\n"
                await stream.send_all(b"%x\r\n%s\r\n" % (len(line), line))
            if watch.canceled:
                await stream.send_all(b"0\r\n\r\n")
                return
            await changed.wait()

    @staticmethod
    async def _until_closed(stream: trio.StapledStream, scope: trio.CancelScope) -> None:
        while await stream.receive_some(RECEIVE_SIZE):
            pass
        scope.cancel()


class _Requests:
    """httptools' callbacks: each complete request's path and body."""

    def __init__(self, requests: list[tuple[str, bytes]]) -> None:
        self.requests = requests
        self.path = ""
        self.body: list[bytes] = []

    def on_url(self, url: bytes) -> None:
        self.path = httptools.parse_url(url).path.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.requests.append((self.path, b"".join(self.body)))
        self.body = []

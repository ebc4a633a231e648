"""A small async V2 client for wire-level tests against the in-process nsqd.

`Wire` talks to the `nsqd` fixture over a real trio TCP stream, with our codec on both sides
of the socket: `nsqpy.common.command` builds the bytes, `nsqpy.common.frame.FrameDecoder`
reads the frames.
Its assertions are the ones every protocol test needs: the exact text of an error frame, and
whether nsqd then closed the connection (a fatal error) or kept it usable (docs/protocol.md §1.3).

Every read is bounded by `trio.fail_after`, so a missing frame fails the test instead of
hanging it; under a MockClock the bound is virtual time.
"""

import dataclasses
import json
from collections import deque

import pytest
import trio

from nsqpy.common.command import MAGIC_V2, encode_fin, encode_identify, encode_rdy, encode_sub
from nsqpy.common.frame import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameDecoder,
)
from nsqpy.common.message import DecodedMessage, decode_message
from tests.support.nsqd import tcp_port

HEARTBEAT = b"_heartbeat_"
# A well-formed message ID no nsqd ever issues: FIN of it is refused, but not fatally.
UNKNOWN_ID = b"0000000000000000"
READ_TIMEOUT = 10.0


# Every connection a test opened, closed at teardown by `close_all_wires`.
_open_wires: list["Wire"] = []


def close_all_wires() -> None:
    """Close the client side of every connection the test opened (an autouse fixture calls
    this in each test module), so no socket outlives its test."""
    while _open_wires:
        _open_wires.pop().stream.socket.close()


class ConnectionClosed(Exception):
    """nsqd closed the connection while a frame was expected."""


def with_options(**changes):
    """Run a test against an nsqd with these options changed (see `override_options`)."""
    label = ",".join(f"{key}={value}" for key, value in changes.items())
    return pytest.mark.parametrize("nsqd_options", [changes], indirect=True, ids=[label])


def override_options(nsqd_options, request):
    """Body of a test module's `nsqd_options` override: `with_options(...)` changes apply."""
    return dataclasses.replace(nsqd_options, **getattr(request, "param", {}))


class Wire:
    """One V2 connection. Messages and responses are read separately: a message that arrives
    while a response is awaited is kept for `read_message`, and the other way round."""

    def __init__(self, stream: trio.SocketStream, *, answer_heartbeats: bool = True) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.answer_heartbeats = answer_heartbeats
        self.heartbeats = 0
        self.closed = False
        self._frames: deque[Frame] = deque()
        self._messages: deque[DecodedMessage] = deque()
        self._responses: deque[Frame] = deque()

    @classmethod
    async def connect(
        cls, nsqd, *, magic: bytes = MAGIC_V2, answer_heartbeats: bool = True
    ) -> "Wire":
        stream = await trio.open_tcp_stream("127.0.0.1", tcp_port(nsqd))
        wire = cls(stream, answer_heartbeats=answer_heartbeats)
        _open_wires.append(wire)
        if magic:
            await wire.send(magic)
        return wire

    async def send(self, *parts: bytes) -> None:
        await self.stream.send_all(b"".join(parts))

    async def send_eof(self) -> None:
        """Half-close: nsqd sees EOF in the middle of whatever was sent last."""
        await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    # -- reading ---------------------------------------------------------------------------

    async def _receive(self) -> None:
        if self.closed:
            raise ConnectionClosed("nsqd closed the connection")
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:  # a reset is a close, too
            data = b""
        if not data:
            self.closed = True
            raise ConnectionClosed("nsqd closed the connection")
        self._frames.extend(self.decoder.receive_data(data))

    async def read_frame(self, timeout: float = READ_TIMEOUT) -> Frame:
        """The next frame of any kind, heartbeats included."""
        with trio.fail_after(timeout):
            while not self._frames:
                await self._receive()
        return self._frames.popleft()

    async def _next(self, wanted: deque, timeout: float):
        """The next item of `wanted` (messages or responses); frames of the other kind that
        arrive first are kept for later, heartbeats are counted and answered."""
        with trio.fail_after(timeout):
            while not wanted:
                frame = await self.read_frame(timeout)
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    self._messages.append(decode_message(frame.data))
                elif frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                    self.heartbeats += 1
                    if self.answer_heartbeats:
                        await self.send(b"NOP\n")
                else:
                    self._responses.append(frame)
                    if wanted is self._messages and frame.frame_type == FRAME_TYPE_ERROR:
                        raise AssertionError(f"error while waiting for a message: {frame.data!r}")
            return wanted.popleft()

    async def read_response(self, timeout: float = READ_TIMEOUT) -> Frame:
        """The next response or error frame; heartbeats are skipped (and answered)."""
        return await self._next(self._responses, timeout)

    async def read_message(self, timeout: float = READ_TIMEOUT) -> DecodedMessage:
        return await self._next(self._messages, timeout)

    async def read_messages(self, count: int, timeout: float = READ_TIMEOUT) -> list:
        with trio.fail_after(timeout):
            return [await self.read_message(timeout) for _ in range(count)]

    def pending_messages(self) -> int:
        """Messages already received but not yet returned by `read_message`."""
        return len(self._messages) + sum(
            1 for frame in self._frames if frame.frame_type == FRAME_TYPE_MESSAGE
        )

    # -- assertions ------------------------------------------------------------------------

    async def expect_response(self, data: bytes) -> None:
        frame = await self.read_response()
        got = (frame.frame_type, frame.data)
        assert got == (FRAME_TYPE_RESPONSE, data), f"expected response {data!r}, got {got}"

    async def expect_ok(self) -> None:
        await self.expect_response(b"OK")

    async def expect_error(self, text: str | bytes, *, fatal: bool = True) -> None:
        """The next response is the error frame `text`; then nsqd closes the connection
        (fatal) or keeps serving it (non-fatal, checked with a FIN probe)."""
        expected = text.encode() if isinstance(text, str) else text
        frame = await self.read_response()
        got = (frame.frame_type, frame.data)
        assert got == (FRAME_TYPE_ERROR, expected), f"expected error {expected!r}, got {got}"
        if fatal:
            await self.expect_closed()
        else:
            await self.expect_open()

    async def expect_open(self) -> None:
        """The connection still reads and answers commands. FIN of an unknown ID is the one
        command that is answered and changes nothing (valid once subscribed)."""
        await self.send(encode_fin(UNKNOWN_ID))
        try:
            frame = await self.read_response()
        except ConnectionClosed:
            raise AssertionError("nsqd closed a connection that should stay open") from None
        expected = b"E_FIN_FAILED FIN " + UNKNOWN_ID + b" failed ID not in flight"
        got = (frame.frame_type, frame.data)
        assert got == (FRAME_TYPE_ERROR, expected), f"probe answered {got}, not {expected!r}"

    async def expect_closed(self, timeout: float = READ_TIMEOUT) -> None:
        """nsqd closes the connection, sending nothing but heartbeats before it does."""
        assert not self._responses, f"unread responses: {list(self._responses)}"
        with trio.fail_after(timeout):
            while True:
                while self._frames:
                    frame = self._frames.popleft()
                    assert frame.data == HEARTBEAT, f"frame before close: {frame}"
                try:
                    await self._receive()
                except ConnectionClosed:
                    return

    # -- conversations -----------------------------------------------------------------------

    async def identify(self, **settings) -> dict | None:
        """IDENTIFY; the negotiated JSON when feature_negotiation is set, else None after OK."""
        await self.send(encode_identify(settings))
        if settings.get("feature_negotiation"):
            frame = await self.read_response()
            assert frame.frame_type == FRAME_TYPE_RESPONSE, f"IDENTIFY failed: {frame}"
            return json.loads(frame.data)
        await self.expect_ok()
        return None

    async def subscribe(self, topic: str, channel: str, rdy: int | None = None) -> None:
        await self.send(encode_sub(topic, channel))
        await self.expect_ok()
        if rdy is not None:
            await self.send(encode_rdy(rdy))

    async def finish(self, *messages: DecodedMessage) -> None:
        await self.send(b"".join(encode_fin(message.id) for message in messages))


async def consumer(nsqd, topic: str, channel: str, rdy: int | None = None, **identify) -> Wire:
    """A connected, optionally IDENTIFYd, subscribed consumer."""
    wire = await Wire.connect(nsqd)
    if identify:
        await wire.identify(**identify)
    await wire.subscribe(topic, channel, rdy)
    return wire

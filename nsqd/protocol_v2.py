"""The V2 protocol over one TCP connection: read loop, command handlers, message pump.

Go's protocol_v2.go, on trio. The connection owns a cancel scope with two tasks: the read loop
(parse every complete command in each receive, answer them with one send) and the message
pump (take as many messages as RDY allows, encode them into one buffer, one send). Either
task ends the connection by cancelling the scope: a fatal error, EOF, a missed heartbeat or a
dead socket.
"""

import json
import math
import os
import re
from typing import TYPE_CHECKING

import trio

from common.command_parser import CommandParser
from common.errors import ProtocolError
from common.frame import (
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_error,
    encode_message_frames,
    encode_response,
)
from common.goformat import go_base10, go_byte_slice, go_quote, go_text
from common.message import MESSAGE_ID_LENGTH
from common.names import is_valid_name
from common.version import VERSION
from nsqd.auth import AuthError, query_any
from nsqd.channel import ChannelError
from nsqd.client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, Client
from nsqd.compression import CompressedStream, PrefixedStream
from nsqd.protocol_youzan import YouzanCommands, encode_binary_id_frames
from nsqd.publish import PublishError, publish
from nsqd.tls import connection_details, peer_common_name

if TYPE_CHECKING:
    from nsqd.server import NSQD

RECEIVE_SIZE = 64 * 1024
# The most messages one pump pass sends; bounds one buffer and lets FINs interleave.
MAX_PUMP_BATCH = 1024
# The most message bytes one send carries (at least one message): a batch of big messages
# goes out in pieces, so a connection's output buffer stays bounded (Go's is the client's
# output_buffer_size) instead of a copy of everything RDY let out at once.
MAX_SEND_BYTES = 256 * 1024
# Go gives the TLS handshake 5 s.
TLS_HANDSHAKE_TIMEOUT = 5.0
# A TLS close_notify to a peer that stopped reading must not hold the connection's task.
CLOSE_TIMEOUT = 1.0


def _split_by_size(messages: list, limit: int) -> list[list]:
    """`messages` in consecutive pieces of at most `limit` body bytes, at least one message
    each; the batch itself when it fits (small messages: one send per batch)."""
    total = 0
    for message in messages:
        total += len(message.body)
    if total <= limit:
        return [messages]
    pieces: list[list] = []
    piece: list = []
    size = 0
    for message in messages:
        length = len(message.body)
        if piece and size + length > limit:
            pieces.append(piece)
            piece, size = [], 0
        piece.append(message)
        size += length
    pieces.append(piece)
    return pieces


class _Upgrade:
    """IDENTIFY's reply when it negotiated TLS or compression: the read loop sends the reply,
    then switches the stream (TLS first, then snappy or deflate)."""

    __slots__ = ("reply", "tls", "snappy", "deflate_level")

    def __init__(self, reply: bytes, tls: bool, snappy: bool, deflate_level: int) -> None:
        self.reply = reply
        self.tls = tls
        self.snappy = snappy
        self.deflate_level = deflate_level


class _IdentifyFields:
    """IDENTIFY's JSON fields and their Go types (identifyDataV2); unknown keys are ignored."""

    INT = {
        "heartbeat_interval",
        "output_buffer_size",
        "output_buffer_timeout",
        "deflate_level",
        "msg_timeout",
    }
    INT32 = {"sample_rate"}
    BOOL = {"feature_negotiation", "tls_v1", "deflate", "snappy"}
    STR = {"client_id", "hostname", "user_agent"}
    ALL = INT | INT32 | BOOL | STR


# A `\ud800` escape in JSON decodes to a lone surrogate, which cannot be encoded as UTF-8
# (/metrics and every other text that showed the client_id failed); Go's decoder turns it
# into U+FFFD.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_identify(body: bytes) -> dict:
    """Decode an IDENTIFY body as Go's json.Unmarshal into identifyDataV2 would.

    A value of the wrong JSON type fails the whole decode (Go's UnmarshalTypeError); keys
    match case-insensitively, null leaves the zero value, invalid UTF-8 is replaced.
    """
    error = ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        raw = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        # Deep nesting: Go's decoder stops at depth 10,000, Python's near 1,000; either way
        # the body is refused, never the connection dropped without a word.
        raise error from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error
    decoded: dict = {}
    for key, value in raw.items():
        name = key.lower()
        if value is None:
            if name not in _IdentifyFields.ALL:
                # Youzan's keys count by their presence (`"ext_filter": null`, §8 #1).
                decoded.setdefault("_extra", {})[key] = value
            continue
        if isinstance(value, str):
            value = _LONE_SURROGATE.sub("\ufffd", value)
        if name in _IdentifyFields.INT or name in _IdentifyFields.INT32:
            if not isinstance(value, int) or isinstance(value, bool):
                raise error
            if name in _IdentifyFields.INT32 and not -(2**31) <= value < 2**31:
                raise error
        elif name in _IdentifyFields.BOOL:
            if not isinstance(value, bool):
                raise error
        elif name in _IdentifyFields.STR:
            if not isinstance(value, str):
                raise error
        else:
            decoded.setdefault("_extra", {})[key] = value
            continue
        decoded[name] = value
    return decoded


class ProtocolV2(YouzanCommands):
    def __init__(self, nsqd: "NSQD", stream: trio.abc.Stream, remote_address: str) -> None:
        options = nsqd.options
        self.nsqd = nsqd
        self.options = options
        self.stream = stream
        self.client = Client(options, remote_address)
        self.parser = CommandParser(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            max_req_timeout_ms=int(options.max_req_timeout * 1000),
            before_body=self._check_body_command,
        )
        self._send_lock = trio.Lock()
        # The descriptor `_send` writes to directly while the connection is a plain socket
        # (-1 once TLS or compression wraps it).
        self._fd = stream.socket.fileno() if type(stream) is trio.SocketStream else -1
        self._cancel_scope = trio.CancelScope()
        self._commands_run = 0
        self._handlers = {
            b"FIN": self.fin,
            b"RDY": self.rdy,
            b"REQ": self.req,
            b"PUB": self.pub,
            b"MPUB": self.mpub,
            b"DPUB": self.dpub,
            b"NOP": self.nop,
            b"TOUCH": self.touch,
            b"SUB": self.sub_family,
            b"CLS": self.cls,
            b"AUTH": self.auth,
            b"IDENTIFY": self.identify,
            # Youzan's commands (docs/protocol.md §3.1); SUB_ORDER is the name Youzan's article
            # uses.
            b"SUB_ORDERED": self.sub_family,
            b"SUB_ORDER": self.sub_family,
            b"SUB_ADVANCED": self.sub_family,
            b"PUB_TRACE": self.pub_trace,
            b"MPUB_TRACE": self.mpub_trace,
            b"PUB_EXT": self.pub_ext,
            b"MPUB_EXT": self.mpub_ext,
            b"INTERNAL_CREATE_TOPIC": self.internal_create_topic,
        }
        self._async_commands = {b"AUTH"}
        self._handlers_unchecked = dict(self._handlers)
        if nsqd.auth_enabled:
            subscribe = (b"SUB", b"SUB_ORDERED", b"SUB_ORDER", b"SUB_ADVANCED")
            publish = (
                b"PUB",
                b"MPUB",
                b"DPUB",
                b"PUB_TRACE",
                b"MPUB_TRACE",
                b"PUB_EXT",
                b"MPUB_EXT",
            )
            for name in subscribe:
                self._handlers[name] = self.sub_authorized
            for name in publish:
                self._handlers[name] = self.pub_authorized
            self._async_commands |= {*subscribe, *publish}
        # Until the connection is on TLS, a TLS-requiring nsqd takes nothing but IDENTIFY.
        self._tls_gate = options.tls_required != "false" and nsqd.tls_context is not None

    # -- connection life ----------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends, from the protocol magic on."""
        client = self.client
        self.nsqd.add_client(client)
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._message_pump)
                    await self._read_loop()
                    nursery.cancel_scope.cancel()
        finally:
            self.nsqd.remove_client(client)
            if client.channel is not None:
                client.channel.remove_client(client)
            with trio.CancelScope(shield=True) as closing:
                closing.deadline = trio.current_time() + CLOSE_TIMEOUT
                await self.stream.aclose()

    def close(self) -> None:
        """Server-side close (shutdown, channel deleted)."""
        self._cancel_scope.cancel()

    async def _read_loop(self) -> None:
        client = self.client
        read_deadline = None
        while True:
            if read_deadline is None:
                heartbeat = client.heartbeat_interval
                # Go sets a read deadline of twice the heartbeat interval before it reads each
                # command, and reads the whole command (line and body) under it: a client
                # dribbling one command a byte at a time (slowloris) is cut off, however
                # often a byte arrives.
                read_deadline = trio.current_time() + heartbeat * 2 if heartbeat > 0 else math.inf
            with trio.move_on_at(read_deadline) as deadline:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            if deadline.cancelled_caught:
                self.nsqd.log.error("[%s] IOLoop error - read deadline exceeded", client)
                return
            if not data:
                try:
                    self.parser.receive_eof()
                except ProtocolError as error:
                    await self._send(encode_error(error.text))
                return
            self.parser.receive_data(data)
            commands_run = self._commands_run
            if not await self._process_commands():
                return
            if self._commands_run != commands_run:
                read_deadline = None  # a command completed: the next one gets a fresh deadline

    async def _process_commands(self) -> bool:
        """Run every complete command, then send all replies at once. False: close."""
        replies: list[bytes] = []
        keep_open = True
        handlers = self._handlers
        parser = self.parser
        while True:
            try:
                command = parser.next_command()
                if command is None:
                    break
                self._commands_run += 1
                name = command.name
                if self._tls_gate:
                    self._enforce_tls_policy(name)
                handler = handlers.get(name)
                if handler is None:
                    raise ProtocolError("E_INVALID", f"invalid command {go_text(name)}")
                if name in self._async_commands:
                    reply = await handler(command)
                else:
                    reply = handler(command)
                if type(reply) is _Upgrade:
                    await self._upgrade(reply, replies)
                    continue
            except ProtocolError as error:
                self.nsqd.log.error("[%s] - %s", self.client, error.text)
                replies.append(encode_error(error.text))
                if error.fatal:
                    keep_open = False
                    break
                continue
            if reply is not None:
                replies.append(reply)
        # Acknowledge publishes only once their writes reached the diskqueue files.
        await self.nsqd.commit_backend_writes()
        if replies:
            await self._send(b"".join(replies) if len(replies) > 1 else replies[0])
        if self.client.closed_by_server:
            return False
        return keep_open

    async def _send(self, data: bytes) -> None:
        fd = self._fd
        if fd >= 0 and not self._send_lock.locked():
            # A plain socket and no send under way: write at once, without trio's socket
            # wrappers and their two scheduler round trips; the socket buffer almost always
            # takes it all. Only what is left waits, under the lock and the write deadline.
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._cancel_scope.cancel()
                return
            if sent == len(data):
                return
            data = data[sent:]
        client = self.client
        try:
            async with self._send_lock:
                # Go sets a write deadline of one heartbeat interval on every write.
                timeout = client.heartbeat_interval if client.heartbeat_interval > 0 else math.inf
                with trio.move_on_after(timeout) as deadline:
                    await self.stream.send_all(data)
                if deadline.cancelled_caught:
                    self.nsqd.log.error("[%s] write deadline exceeded", client)
                    self._cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._cancel_scope.cancel()

    # -- the message pump -----------------------------------------------------------------

    async def _message_pump(self) -> None:
        client = self.client
        last_heartbeat = trio.current_time()
        heartbeat_booked = -math.inf
        while True:
            channel = client.channel
            if channel is not None and client.is_ready():
                room = min(client.ready_count - client.in_flight_count, MAX_PUMP_BATCH)
                if channel.ordered:
                    # One message in flight per ordered channel, whatever RDY says (§3.5).
                    room = 0 if channel.in_flight else 1
                messages = channel.take(room) if room else []
                if messages and client.sample_rate:
                    messages = self._sample(messages)
                if messages:
                    now = trio.current_time()
                    channel.start_in_flight(messages, client.id, client.msg_timeout, now)
                    client.sent_messages(len(messages))
                    if channel.has_messages():
                        channel.notify()
                    limit = max(client.output_buffer_size, MAX_SEND_BYTES)
                    for piece in _split_by_size(messages, limit):
                        if self.youzan:
                            ext = self.extend_support and channel.topic.ext
                            frames = encode_binary_id_frames(piece, self.detail, ext)
                        else:
                            frames = encode_message_frames(piece)
                        await self._send(frames)
                        del frames
                    # A send that fit the socket buffer did not yield: let others run.
                    await trio.lowlevel.checkpoint()
                    continue
                channel.wait_for_messages(client)
            if client.closed_by_server:
                self._cancel_scope.cancel()
                return
            interval = client.heartbeat_interval
            if interval > 0:
                now = trio.current_time()
                due = last_heartbeat + interval
                if now >= due:
                    last_heartbeat = now
                    await self._send(HEARTBEAT_FRAME)
                    continue
                # One wake-up booked at a time: a new one only once the last has fired, or
                # when the heartbeat became due earlier (IDENTIFY shortened the interval).
                if not now < heartbeat_booked <= due:
                    self.nsqd.heartbeats.wake_at(due, client.wakeup)
                    heartbeat_booked = due
            await client.wakeup.wait()

    def _sample(self, messages: list) -> list:
        """Go skips (and so drops for this client) a message when rand(100) > sample_rate."""
        rate = self.client.sample_rate
        randbelow = self.nsqd.random.randrange
        return [message for message in messages if randbelow(100) <= rate]

    # -- state checks ---------------------------------------------------------------------

    def _enforce_tls_policy(self, name: bytes) -> None:
        if self.client.tls:
            self._tls_gate = False
        elif name != b"IDENTIFY":
            raise ProtocolError(
                "E_INVALID", f"cannot {go_text(name)} in current state (TLS required)"
            )

    def _check_body_command(self, name: bytes) -> None:
        """Go checks the TLS policy and IDENTIFY's and AUTH's state before reading bodies."""
        if self._tls_gate:
            self._enforce_tls_policy(name)
        if name == b"IDENTIFY" and self.client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        if name == b"AUTH" and self.client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")

    def _require_message_state(self, label: str) -> None:
        if self.client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", f"cannot {label} in current state")

    def _message_id(self, args: list[bytes], label: str) -> bytes:
        """The in-flight key of FIN, REQ or TOUCH (a Youzan binary ID maps to our hex one)."""
        if self.youzan:
            return self.wire_message_key(args, label)
        if not args:
            raise ProtocolError("E_INVALID", f"{label} insufficient number of params")
        message_id = args[0]
        if len(message_id) != MESSAGE_ID_LENGTH:
            raise ProtocolError("E_INVALID", "invalid message ID")
        return message_id

    def _printed_id(self, wire_id: bytes) -> str:
        """The ID as the failure texts print it: Go's %s of the hex ID, Youzan's byte slice."""
        return go_byte_slice(wire_id) if self.youzan else go_text(wire_id)

    # -- commands -------------------------------------------------------------------------

    def nop(self, command) -> None:
        return None

    def identify(self, command) -> "bytes | _Upgrade":
        client = self.client
        options = self.options
        data = decode_identify(command.body)
        client.client_id = data.get("client_id", "")
        client.hostname = data.get("hostname", "")
        client.user_agent = data.get("user_agent", "")

        heartbeat = data.get("heartbeat_interval", 0)
        max_heartbeat_ms = int(options.max_heartbeat_interval * 1000)
        if heartbeat == -1:
            client.heartbeat_interval = 0
        elif heartbeat == 0:
            pass
        elif 1000 <= heartbeat <= max_heartbeat_ms:
            client.heartbeat_interval = heartbeat / 1000
        else:
            raise ProtocolError(
                "E_BAD_BODY", f"IDENTIFY heartbeat interval ({heartbeat}) is invalid"
            )

        buffer_timeout = data.get("output_buffer_timeout", 0)
        if buffer_timeout == -1:
            client.output_buffer_timeout = 0
        elif buffer_timeout == 0:
            pass
        elif (
            int(options.min_output_buffer_timeout * 1000)
            <= buffer_timeout
            <= int(options.max_output_buffer_timeout * 1000)
        ):
            client.output_buffer_timeout = buffer_timeout / 1000
        else:
            raise ProtocolError(
                "E_BAD_BODY", f"IDENTIFY output buffer timeout ({buffer_timeout}) is invalid"
            )

        buffer_size = data.get("output_buffer_size", 0)
        if buffer_size == -1:
            client.output_buffer_size = 1
            client.output_buffer_timeout = 0
        elif buffer_size == 0:
            pass
        elif 64 <= buffer_size <= options.max_output_buffer_size:
            client.output_buffer_size = buffer_size
        else:
            raise ProtocolError(
                "E_BAD_BODY", f"IDENTIFY output buffer size ({buffer_size}) is invalid"
            )

        sample_rate = data.get("sample_rate", 0)
        if not 0 <= sample_rate <= 99:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY sample rate ({sample_rate}) is invalid")
        client.sample_rate = sample_rate

        msg_timeout = data.get("msg_timeout", 0)
        if msg_timeout == 0:
            pass
        elif 1000 <= msg_timeout <= int(options.max_msg_timeout * 1000):
            client.msg_timeout = msg_timeout / 1000
        else:
            raise ProtocolError("E_BAD_BODY", f"IDENTIFY msg timeout ({msg_timeout}) is invalid")

        self.note_identify_extensions(data.get("_extra", {}))
        # The pump's heartbeat timer follows the new interval at once.
        client.wakeup.set()
        self.nsqd.log.info("[%s] IDENTIFY: %s", client, data)
        if not data.get("feature_negotiation", False):
            return OK_FRAME

        tls = self.nsqd.tls_context is not None and data.get("tls_v1", False)
        deflate = options.deflate and data.get("deflate", False)
        snappy = options.snappy and data.get("snappy", False)
        deflate_level = 6
        requested_level = data.get("deflate_level", 0)
        if deflate and requested_level > 0:
            deflate_level = requested_level
        deflate_level = min(deflate_level, options.max_deflate_level)
        if deflate and snappy:
            raise ProtocolError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        reply = {
            "max_rdy_count": options.max_rdy_count,
            "version": VERSION,
            "max_msg_timeout": int(options.max_msg_timeout * 1000),
            "msg_timeout": int(client.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": options.max_deflate_level,
            "snappy": snappy,
            "sample_rate": client.sample_rate,
            "auth_required": self.nsqd.auth_enabled,
            "output_buffer_size": client.output_buffer_size,
            "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
        }
        if self.desired_tag:
            reply["desired_tag"] = self.desired_tag
        frame = encode_response(json.dumps(reply, separators=(",", ":")).encode())
        if tls or snappy or deflate:
            return _Upgrade(frame, tls, snappy, deflate_level if deflate else 0)
        return frame

    async def _upgrade(self, upgrade: "_Upgrade", replies: list[bytes]) -> None:
        """After the IDENTIFY reply: TLS, then compression, each confirmed by an `OK` sent
        through the new layer (docs/protocol.md §2.1)."""
        client = self.client
        async with self._send_lock:
            self._fd = -1
            await self.stream.send_all(b"".join(replies) + upgrade.reply)
            replies.clear()
            stream = self.stream
            leftover = self.parser.take_buffered()
            if leftover:
                stream = PrefixedStream(stream, leftover)
            try:
                if upgrade.tls:
                    ssl_stream = trio.SSLStream(stream, self.nsqd.tls_context, server_side=True)
                    with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                        await ssl_stream.do_handshake()
                    client.tls = True
                    details = connection_details(ssl_stream)
                    client.tls_version = details["tls_version"]
                    client.tls_cipher_suite = details["tls_cipher_suite"]
                    client.tls_negotiated_protocol = details["tls_negotiated_protocol"]
                    client.tls_negotiated_protocol_is_mutual = True
                    client.tls_common_name = peer_common_name(ssl_stream)
                    stream = ssl_stream
                    await stream.send_all(OK_FRAME)
                if upgrade.snappy:
                    stream = CompressedStream.snappy(stream)
                    client.snappy = True
                    await stream.send_all(OK_FRAME)
                if upgrade.deflate_level:
                    stream = CompressedStream.deflate(stream, upgrade.deflate_level)
                    client.deflate = True
                    client.deflate_level = upgrade.deflate_level
                    await stream.send_all(OK_FRAME)
            except (trio.TooSlowError, trio.BrokenResourceError, OSError) as error:
                raise ProtocolError("E_IDENTIFY_FAILED", f"IDENTIFY failed {error}") from None
            finally:
                self.stream = stream

    async def auth(self, command) -> bytes:
        client = self.client
        if client.auth_state is not None and client.auth_state.authorizations:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth_enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        client.auth_secret = command.body.decode("utf-8", "surrogateescape")
        try:
            await self._query_auth()
        except AuthError as error:
            # Go does not leak auth server errors to untrusted clients; it logs them.
            self.nsqd.log.warning("PROTOCOL(V2): [%s] AUTH failed %s", client, error)
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None
        state = client.auth_state
        if not state.authorizations:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        reply = {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }
        return encode_response(json.dumps(reply, separators=(",", ":")).encode())

    async def _query_auth(self) -> None:
        client = self.client
        options = self.options
        client.auth_state = await query_any(
            options.auth_http_address,
            client.remote_address.rsplit(":", 1)[0].strip("[]"),
            client.tls,
            client.auth_secret,
            client.tls_common_name,
            options.http_client_connect_timeout + options.http_client_request_timeout,
        )

    async def _check_auth(self, label: str, topic: str, channel: str) -> None:
        """Go's CheckAuth: authorizations first, refreshed when their TTL ran out."""
        client = self.client
        state = client.auth_state
        if state is None or not state.authorizations:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {label}")
        if state.is_expired():
            try:
                await self._query_auth()
            except AuthError as error:
                self.nsqd.log.warning("PROTOCOL(V2): [%s] Auth Failed %s", client, error)
                raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None
        if not client.auth_state.is_allowed(topic, channel):
            raise ProtocolError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {label} on {go_quote(topic)} {go_quote(channel)}",
            )

    async def sub_authorized(self, command) -> bytes:
        topic_name, channel_name = self._sub_names(command)
        await self._check_auth("SUB", topic_name, channel_name)
        return self.sub_family(command)

    async def pub_authorized(self, command) -> bytes:
        label = command.name.decode()
        await self._check_auth(label, go_text(command.args[0]), "")
        return self._handlers_unchecked[command.name](command)

    def _sub_names(self, command) -> tuple[str, str]:
        client = self.client
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if client.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        args = command.args
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = go_text(args[0])
        if not is_valid_name(topic_name):
            raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {go_quote(args[0])} is not valid")
        channel_name = go_text(args[1])
        if not is_valid_name(channel_name):
            raise ProtocolError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(args[1])} is not valid"
            )
        return topic_name, channel_name

    def _subscribe_to(self, topic, channel_name: str) -> bytes:
        client = self.client
        if self.nsqd.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed to deleted topic/channel")
        channel = topic.get_channel(channel_name)
        try:
            channel.add_client(client)
        except ChannelError as error:
            raise ProtocolError("E_SUB_FAILED", f"SUB failed {error}") from None
        client.state = STATE_SUBSCRIBED
        client.channel = channel
        client.wakeup.set()
        return OK_FRAME

    def rdy(self, command) -> None:
        client = self.client
        if client.state == STATE_CLOSING:
            return None  # Go ignores RDY after CLS
        if client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        count = 1
        if command.args:
            parsed = go_base10(command.args[0])
            if parsed is None:
                raise ProtocolError(
                    "E_INVALID", f"RDY could not parse count {go_text(command.args[0])}"
                )
            # Go parses a uint64 and stores it in an int64, so huge counts turn negative.
            count = parsed - (1 << 64) if parsed >= 1 << 63 else parsed
        if not 0 <= count <= self.options.max_rdy_count:
            raise ProtocolError(
                "E_INVALID", f"RDY count {count} out of range 0-{self.options.max_rdy_count}"
            )
        client.set_ready_count(count)
        return None

    def fin(self, command) -> None:
        self._require_message_state("FIN")
        message_id = self._message_id(command.args, "FIN")
        client = self.client
        try:
            client.channel.finish(client.id, message_id)
        except ChannelError as error:
            raise ProtocolError(
                "E_FIN_FAILED", f"FIN {self._printed_id(command.args[0])} failed {error}"
            ) from None
        client.finished_message()
        return None

    def req(self, command) -> None:
        self._require_message_state("REQ")
        args = command.args
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "REQ insufficient number of params")
        message_id = self._message_id(args, "REQ")
        timeout_ms = go_base10(args[1])
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {go_text(args[1])}")
        # Go clamps an out-of-range REQ timeout instead of refusing it.
        delay = min(timeout_ms / 1000, self.options.max_req_timeout)
        client = self.client
        try:
            requeued = client.channel.requeue(client.id, message_id, delay, trio.current_time())
        except ChannelError as error:
            raise ProtocolError(
                "E_REQ_FAILED", f"REQ {self._printed_id(args[0])} failed {error}"
            ) from None
        if requeued:
            client.requeued_message()
        return None

    def touch(self, command) -> None:
        self._require_message_state("TOUCH")
        message_id = self._message_id(command.args, "TOUCH")
        client = self.client
        try:
            client.channel.touch(client.id, message_id, client.msg_timeout, trio.current_time())
        except ChannelError as error:
            raise ProtocolError(
                "E_TOUCH_FAILED", f"TOUCH {self._printed_id(command.args[0])} failed {error}"
            ) from None
        return None

    def cls(self, command) -> bytes:
        if self.client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.client.start_close()
        return CLOSE_WAIT_FRAME

    def _publish(self, label: str, code: str, args: list[bytes], bodies: list[bytes], defer=0.0):
        # DPUB's second parameter is its delay, never a partition (Youzan has no DPUB).
        topic = self._publish_target(args if label != "DPUB" else args[:1], label)
        try:
            publish(self.nsqd, topic, bodies, defer=defer)
        except PublishError as error:
            raise self.publish_failed(code, label, error) from None
        self.client.published(topic.name, len(bodies))
        return OK_FRAME

    def pub(self, command) -> bytes:
        return self._publish("PUB", "E_PUB_FAILED", command.args, [command.body])

    def mpub(self, command) -> bytes:
        return self._publish("MPUB", "E_MPUB_FAILED", command.args, command.messages)

    def dpub(self, command) -> bytes:
        defer = go_base10(command.args[1]) / 1000
        return self._publish("DPUB", "E_DPUB_FAILED", command.args, [command.body], defer)

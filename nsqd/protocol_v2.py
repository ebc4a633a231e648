"""The V2 protocol over one TCP connection: read loop, command handlers, message pump.

Go's protocol_v2.go, on trio. The connection owns a cancel scope with two tasks: the read loop
(parse every complete command in each receive, answer them with one send) and the message
pump (take as many messages as RDY allows, encode them into one buffer, one send). Either
task ends the connection by cancelling the scope: a fatal error, EOF, a missed heartbeat or a
dead socket.

This file is Go NSQ's V2. What a Youzan client changes is elsewhere: the dialect the connection
speaks (`nsqd/dialect.py`, switched by `become_youzan`), Youzan's commands
(`nsqd/protocol_youzan.py`, which also take SUB, PUB and MPUB when they name a partition) and
ordered delivery (`nsqd/delivery.py`, the channel's policy). IDENTIFY's settings are negotiated
into the client by `nsqd/identify.py`; every publish goes through `nsqd/publish.py`.
"""

import json
import math
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from nsqpy.common.command import NOP
from nsqpy.common.command_parser import CommandParser, is_partition, named_partition
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import (
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_error,
    encode_response,
)
from nsqpy.common.goformat import go_base10, go_quote, go_text
from nsqpy.common.names import is_valid_name
from nsqpy.daemon.auth import AuthError, ip_of, query_any
from nsqpy.daemon.net import peer_common_name
from nsqpy.nsqd.channel import ChannelError
from nsqpy.nsqd.client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, Client
from nsqpy.nsqd.cluster import NotLedHere
from nsqpy.nsqd.compression import CompressedStream, PrefixedStream
from nsqpy.nsqd.dialect import CLASSIC, ClassicDialect, YouzanDialect
from nsqpy.nsqd.ext_filter import parse_ext_filter
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.identify import Negotiated, decode_identify, negotiate
from nsqpy.nsqd.idle_reads import RECEIVE_SIZE
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.nsqd.placement import Operation
from nsqpy.nsqd.protocol_youzan import YouzanCommands
from nsqpy.nsqd.publish import PublishError, TooMuchWaiting, publish
from nsqpy.nsqd.tls import connection_details
from nsqpy.nsqd.worker_hops import WorkerHops

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD

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
# After a fatal error nsqd reads and drops what the client still sends for this long before
# it closes: closing a socket with unread bytes resets it, and a reset discards the error
# reply on the client's side (a PUB refused as too big is refused before its body is read).
REFUSED_LINGER = 1.0
# The commands that name a topic (its name first): AUTH authorizes them, and `--workers`
# route them to the topic's owner.
SUBSCRIBE_COMMANDS = frozenset((b"SUB", b"SUB_ORDERED", b"SUB_ORDER", b"SUB_ADVANCED"))
PUBLISH_COMMANDS = frozenset(
    (
        b"PUB",
        b"MPUB",
        b"DPUB",
        b"PUB_TRACE",
        b"MPUB_TRACE",
        b"PUB_EXT",
        b"MPUB_EXT",
        b"PUB_SEQ",
        b"MPUB_SEQ",
        b"MPUB_EXT_SEQ",
    )
)
# Under `--workers`, run by the worker owning the partition they name: a connection's first
# topic command moves it there, a later one is forwarded (publishes, and Youzan's command
# that creates a partition).
FORWARDED_COMMANDS = PUBLISH_COMMANDS | {b"INTERNAL_CREATE_TOPIC"}
TOPIC_COMMANDS = SUBSCRIBE_COMMANDS | FORWARDED_COMMANDS


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


class ProtocolV2:
    def __init__(
        self,
        nsqd: "NSQD",
        stream: trio.abc.Stream,
        remote_address: str,
        handoff: Handoff | None = None,
    ) -> None:
        options = nsqd.options
        self.nsqd = nsqd
        self.options = options
        self.stream = stream
        self.client = Client(options, remote_address)
        # `--workers` (`nsqd/worker_hops.py`): a connection handed over by another worker, and
        # its moves and forwarded publishes to the others.
        self.handoff = handoff
        self.hops = WorkerHops(self)
        self._identify_body: bytes | None = None
        self._muted = False
        # A fatal error ended the connection: drain the client's input before closing.
        self._refused = False
        self._internal = handoff is not None and handoff.internal
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
        # The connection's timers (`nsqd/heartbeats.py`): when the clock calls it next, when
        # the command being read must have arrived (Go's read deadline: two heartbeat
        # intervals), when the last heartbeat went out, and what of a heartbeat the clock
        # wrote did not fit the socket (sent first by the next `_send`).
        self.timers_at = math.inf
        self._read_deadline = math.inf
        self._last_heartbeat = 0.0
        self._owed = b""
        # The replies of the batch being run, and where the log publishes among them wait for
        # their group's write: (reply index, group, label, error code).
        self._replies: list[bytes] = []
        self._write_groups: list[tuple] = []
        # Cluster partitions whose channel this batch created (`nsqd/cluster.py`).
        self._new_channels: list = []
        # Classic until the client shows it speaks Youzan's (`become_youzan`).
        self.dialect: ClassicDialect | YouzanDialect = CLASSIC
        self.youzan = YouzanCommands(self)
        # Each returns the reply (None: none), or a Negotiated upgrade; AUTH and the
        # authorized wrappers are coroutines (`_async_commands`).
        self._handlers: dict[bytes, Callable[[Any], Any]] = {
            b"FIN": self.fin,
            b"RDY": self.rdy,
            b"REQ": self.req,
            b"PUB": self.pub,
            b"MPUB": self.mpub,
            b"DPUB": self.dpub,
            # nsqpy's idempotent publishes (docs/protocol.md §3.10).
            b"PUB_SEQ": self.pub_seq,
            b"MPUB_SEQ": self.mpub_seq,
            b"NOP": self.nop,
            b"TOUCH": self.touch,
            b"SUB": self.sub,
            b"CLS": self.cls,
            b"AUTH": self.auth,
            b"IDENTIFY": self.identify,
            # Youzan's commands (docs/protocol.md §3.1).
            **self.youzan.handlers(),
        }
        self._async_commands = {b"AUTH"}
        self._handlers_unchecked = dict(self._handlers)
        if nsqd.auth_enabled and not self._internal:
            for name in SUBSCRIBE_COMMANDS:
                self._handlers[name] = self.sub_authorized
            for name in PUBLISH_COMMANDS:
                self._handlers[name] = self.pub_authorized
            self._handlers[b"INTERNAL_CREATE_TOPIC"] = self.pub_authorized
            self._async_commands |= TOPIC_COMMANDS
        # Until the connection is on TLS, a TLS-requiring nsqd takes nothing but IDENTIFY.
        self._tls_gate = (
            options.tls_required != "false" and nsqd.tls_context is not None and not self._internal
        )

    # -- connection life ----------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends, from the protocol magic on."""
        client = self.client
        if not self._internal:
            self.nsqd.add_client(client)
        self._last_heartbeat = trio.current_time()
        self._arm_read_deadline()
        relay: trio.SocketStream | None = None
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._message_pump)
                    if self.handoff is None or await self._replay(self.handoff):
                        await self._read_loop()
                    nursery.cancel_scope.cancel()
                if self._refused:
                    self._leave()
                    with trio.move_on_after(REFUSED_LINGER):
                        await self._discard_input()
                if self.hops.moving is not None:
                    self.nsqd.heartbeats.forget(self)
                    relay = await self.hops.move(self._fd)
                    if relay is not None:
                        await self.hops.relay(self.stream, relay)
        finally:
            if relay is not None:
                relay.socket.close()
            self._leave()
            with trio.CancelScope(shield=True) as closing:
                closing.deadline = trio.current_time() + CLOSE_TIMEOUT
                await self.stream.aclose()

    def _leave(self) -> None:
        """The client is gone from nsqd's view: no heartbeats, out of /stats, what it had in
        flight back to its channel. Safe to repeat."""
        client = self.client
        self.nsqd.heartbeats.forget(self)
        self.nsqd.remove_client(client)
        if client.channel is not None:
            client.channel.remove_client(client)

    async def _discard_input(self) -> None:
        """Read and drop what the client sends until it closes: its error reply reaches it
        instead of a reset. A plain TCP client is told at once that nothing more comes."""
        if isinstance(self.stream, trio.SocketStream):
            try:
                self.stream.socket.shutdown(socket.SHUT_WR)
            except OSError:
                return
        try:
            while await self.stream.receive_some(RECEIVE_SIZE):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            pass

    async def _replay(self, handoff: Handoff) -> bool:
        """Stand where the worker that handed the connection over stood: run the preamble
        (its replies were sent already), then what the client sent from its topic command
        on. False: the connection is to close."""
        self.hops.restore(self.client, handoff)
        self._muted = True
        try:
            self.parser.receive_data(handoff.preamble)
            if not await self._process_commands():
                return False
        finally:
            self._muted = False
        self.parser.receive_data(handoff.pending)
        return await self._process_commands()

    def close(self) -> None:
        """Server-side close (shutdown, channel deleted)."""
        self._cancel_scope.cancel()

    def _arm_read_deadline(self) -> None:
        """Go sets a read deadline of twice the heartbeat interval before it reads each
        command, and reads the whole command (line and body) under it: a client dribbling one
        command a byte at a time (slowloris) is cut off, however often a byte arrives. The
        clock enforces it (`timers_due`)."""
        heartbeat = self.client.heartbeat_interval
        if heartbeat > 0:
            now = trio.current_time()
            self._read_deadline = now + heartbeat * 2
            self.nsqd.heartbeats.book(
                self, min(self._read_deadline, self._last_heartbeat + heartbeat)
            )
        else:
            self._read_deadline = math.inf

    def timers_due(self, now: float) -> float:
        """The clock's call (`nsqd/heartbeats.py`): end the connection if its read deadline
        passed; send the heartbeat if it is due, from here when the socket is plain and no
        send is under way, else by waking the pump. Returns when to be called next."""
        if now >= self._read_deadline:
            self.nsqd.log.error("[%s] IOLoop error - read deadline exceeded", self.client)
            self._cancel_scope.cancel()
            return math.inf
        interval = self.client.heartbeat_interval
        if interval <= 0:
            return self._read_deadline
        due = self._last_heartbeat + interval
        if now >= due:
            if self._fd >= 0 and not self._send_lock.locked() and not self._owed:
                self._last_heartbeat = now
                self._write_heartbeat()
            else:
                self.client.wakeup.set()
            due = now + interval
        return min(self._read_deadline, due)

    def _write_heartbeat(self) -> None:
        """Write a heartbeat at once; what the socket does not take is owed to the next send,
        which the pump is woken to make."""
        try:
            sent = os.write(self._fd, HEARTBEAT_FRAME)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._cancel_scope.cancel()
            return
        if sent < len(HEARTBEAT_FRAME):
            self._owed = HEARTBEAT_FRAME[sent:]
            self.client.wakeup.set()

    async def _read_loop(self) -> None:
        idle_reads = self.nsqd.idle_reads
        data: bytes | bytearray
        # Whether the client's last bytes were only NOPs: an idle connection, whose next wait
        # goes to the idle reads' poller. A busy one (FINs, publishes) waits in trio, which
        # re-arms a descriptor with one call where the poller takes two.
        idle = False
        while True:
            try:
                if idle and self._fd >= 0 and idle_reads is not None:
                    # Level-triggered: bytes already there are reported at once.
                    data = await idle_reads.receive(self._fd, self)
                else:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            idle = data[:4] == NOP and _only_nops(data)
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
                self._arm_read_deadline()  # a command completed: the next one gets a fresh deadline

    def absorb_nops(self, data: bytes) -> bool:
        """Take `data` when it is whole NOPs and nothing else, with nothing buffered before
        it (`nsqd/idle_reads.py`): a NOP only gives the next command a fresh read deadline.
        False: the read loop runs it."""
        if self._tls_gate or self.parser.buffered or not _only_nops(data):
            return False
        self._commands_run += len(data) // len(NOP)
        self._arm_read_deadline()
        return True

    async def _process_commands(self) -> bool:
        """Run every complete command, then send all replies at once. False: close."""
        replies: list[bytes] = []
        self._replies = replies
        keep_open = True
        handlers = self._handlers
        parser = self.parser
        client = self.client
        placement = self.nsqd.placement
        hops = self.hops
        while True:
            try:
                if client.state == STATE_SUBSCRIBED and not self._tls_gate:
                    fin_ids = parser.take_fin_run()
                    if fin_ids:
                        self._finish_run(fin_ids, replies)
                        continue
                command = parser.next_command()
                if command is None:
                    break
                self._commands_run += 1
                name = command.name
                if self._tls_gate:
                    self._enforce_tls_policy(name)
                if name in TOPIC_COMMANDS and command.args:
                    owner = placement.worker_for(
                        command.args[0], named_partition(name, command.args)
                    )
                    if owner is not None:
                        if hops.moves_for(name in SUBSCRIBE_COMMANDS, client):
                            hops.move_to(owner.index, command, self._identify_body, self._fd)
                            keep_open = False
                            break
                        if name in FORWARDED_COMMANDS:
                            await hops.forward(owner.index, command, replies)
                            continue
                    hops.topic_bound = True
                handler = handlers.get(name)
                if handler is None:
                    raise ProtocolError("E_INVALID", f"invalid command {go_text(name)}")
                if name in self._async_commands:
                    reply = await handler(command)
                else:
                    reply = handler(command)
                if type(reply) is Negotiated:
                    await self._upgrade(reply, replies)
                    continue
            except ProtocolError as error:
                self.nsqd.log.error("[%s] - %s", self.client, error.text)
                replies.append(encode_error(error.text))
                # Another worker's link carries many clients' publishes: one refused closes
                # only its own client, on the worker that forwarded it.
                if error.fatal and not self._internal:
                    keep_open = False
                    self._refused = True
                    break
                continue
            if reply is not None:
                replies.append(reply)
        if hops.forwarded:
            fatal_errors = self.dialect.publish_errors_are_fatal
            keep_open = await hops.answer_forwarded(replies, fatal_errors) and keep_open
        # Acknowledge publishes only once their writes reached the files.
        if self._write_groups:
            await self.nsqd.storage.commit([entry[1] for entry in self._write_groups])
            keep_open = self._refuse_unwritten(replies) and keep_open
        else:
            await self.nsqd.storage.commit()
        if self._new_channels:
            topics, self._new_channels = self._new_channels, []
            for topic in topics:
                await topic.replication.channels_changed()
        if replies and not self._muted:
            await self._send(b"".join(replies) if len(replies) > 1 else replies[0])
        if self.client.closed_by_server:
            return False
        return keep_open

    def _refuse_unwritten(self, replies: list[bytes]) -> bool:
        """A publish whose log group failed to be written gets Go's `<label> failed <error>`
        in place of its OK; when that is fatal, nothing after it is answered. False: close."""
        groups, self._write_groups = self._write_groups, []
        for index, group, label, code in groups:
            if group.error is None or index >= len(replies):
                continue
            error = group.error
            cluster_code = getattr(error, "code", None)
            text = f"{cluster_code} " if cluster_code else f"{code} {label} failed {error}"
            if getattr(error, "maybe_stored", False):
                # Youzan's clients read the code; nsqpy's idempotent ones keep the publish's
                # sequences for its retry (docs/protocol.md §3.10).
                text = f"{cluster_code} MAYBE_STORED sent to followers before the leader gave up"
            self.nsqd.log.error("[%s] - %s", self.client, text)
            replies[index] = encode_error(text)
            if self.dialect.publish_errors_are_fatal and not self._internal:
                del replies[index + 1 :]
                self._refused = True
                return False
        return True

    async def _send(self, data: bytes) -> None:
        if self._owed:
            data, self._owed = self._owed + data, b""
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
        while True:
            channel = client.channel
            # A rate-limited channel in debt sends nothing until its bucket refills.
            held_for = 0.0
            if channel is not None and channel.rate_limit is not None:
                held_for = channel.rate_limit.wait(trio.current_time())
            if channel is not None and not held_for and client.is_ready():
                room = min(client.room(), MAX_PUMP_BATCH)
                if channel.rate_limit is not None:
                    room = channel.rate_limit.affordable(room)
                # The channel's delivery policy may let fewer go (ordered: one in flight).
                messages = channel.take(room, client.desired_tag)
                if messages and client.sample_rate:
                    messages = self._sample(messages)
                if messages and client.ext_filter is not None and channel.topic.ext:
                    accepts = client.ext_filter.accepts
                    sent: list[Message] = []
                    left_out: list[Message] = []
                    for message in messages:
                        (sent if accepts(message.ext_header) else left_out).append(message)
                    if left_out:
                        # Youzan's: what the filter leaves out is finished for the channel.
                        channel.finish_unsent(left_out)
                        if not sent:
                            await trio.lowlevel.checkpoint()
                            continue
                    messages = sent
                if messages:
                    now = trio.current_time()
                    channel.start_in_flight(messages, client.id, client.msg_timeout, now)
                    if channel.rate_limit is not None:
                        channel.rate_limit.spend(messages, now)
                    client.sent_messages(len(messages))
                    if channel.has_messages():
                        channel.notify()
                    limit = max(client.output_buffer_size, MAX_SEND_BYTES)
                    encode_frames = self.dialect.encode_frames
                    for piece in _split_by_size(messages, limit):
                        frames = encode_frames(piece, client, channel.topic)
                        await self._send(frames)
                        del frames
                    # A send that fit the socket buffer did not yield: let others run.
                    await trio.lowlevel.checkpoint()
                    continue
                channel.wait_for_messages(client)
            if client.closed_by_server:
                self._cancel_scope.cancel()
                return
            # The clock (`timers_due`) wakes the pump for a heartbeat it could not write, or
            # could write only part of (`_send` sends the rest first).
            if self._owed:
                await self._send(b"")
                continue
            interval = client.heartbeat_interval
            now = trio.current_time()
            if interval > 0 and now >= self._last_heartbeat + interval:
                self._last_heartbeat = now
                await self._send(HEARTBEAT_FRAME)
                continue
            if held_for:
                with trio.move_on_after(held_for):
                    await client.wakeup.wait()
                continue
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

    def become_youzan(self) -> YouzanDialect:
        """The client showed it is a Youzan client: it speaks Youzan's dialect from now on."""
        dialect = self.dialect
        if not isinstance(dialect, YouzanDialect):
            dialect = self.dialect = YouzanDialect()
            self.parser.binary_ids = True
        return dialect

    # -- commands -------------------------------------------------------------------------

    def nop(self, command) -> None:
        return None

    def identify(self, command) -> "bytes | Negotiated":
        client = self.client
        data = decode_identify(command.body)
        self._identify_body = command.body
        negotiated = negotiate(
            client,
            data,
            self.options,
            tls_available=self.nsqd.tls_context is not None,
            auth_required=self.nsqd.auth_enabled,
        )
        if client.asked_for_youzan:
            self.become_youzan()
        try:
            client.ext_filter = parse_ext_filter(data.get("_extra", {}).get("ext_filter"))
        except ValueError as error:
            # Youzan's nsqd logs a filter it cannot use and delivers unfiltered.
            self.nsqd.log.warning("[%s] ext_filter %s ignored - %s", client, data, error)
        # The timers follow the new interval at once.
        self._arm_read_deadline()
        # Go nsqd logs IDENTIFY at debug: at info, a line per connection cost 10,000 clients
        # connecting at once a sixth of nsqd's CPU.
        self.nsqd.log.debug("PROTOCOL(V2): [%s] %s", client, data)
        if negotiated is None:
            return OK_FRAME
        if negotiated.upgrades:
            return negotiated
        return encode_response(negotiated.reply)

    async def _upgrade(self, upgrade: Negotiated, replies: list[bytes]) -> None:
        """After the IDENTIFY reply: TLS, then compression, each confirmed by an `OK` sent
        through the new layer (docs/protocol.md §2.1)."""
        client = self.client
        async with self._send_lock:
            self._fd = -1
            await self.stream.send_all(b"".join(replies) + encode_response(upgrade.reply))
            replies.clear()
            stream = self.stream
            leftover = self.parser.take_buffered()
            if leftover:
                stream = PrefixedStream(stream, leftover)
            try:
                if upgrade.tls:
                    # Negotiated only when nsqd has a TLS context (`tls_available`).
                    assert self.nsqd.tls_context is not None
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
        if state is None or not state.authorizations:
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
            ip_of(client.remote_address),
            client.tls,
            client.auth_secret,
            client.tls_common_name,
            options.http_client_connect_timeout + options.http_client_request_timeout,
        )

    async def check_auth(self, label: str, topic: str, channel: str) -> None:
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
        state = client.auth_state
        if state is None or not state.is_allowed(topic, channel):
            raise ProtocolError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {label} on {go_quote(topic)} {go_quote(channel)}",
            )

    async def sub_authorized(self, command) -> bytes:
        topic_name, channel_name = self.sub_names(command)
        await self.check_auth("SUB", topic_name, channel_name)
        return self._handlers_unchecked[command.name](command)

    async def pub_authorized(self, command) -> bytes:
        await self.authorize(command)
        return self._handlers_unchecked[command.name](command)

    async def authorize(self, command) -> None:
        """Go's CheckAuth for a publish or Youzan's INTERNAL_CREATE_TOPIC, whether it runs
        here or on another of `--workers` (which takes this worker's word for it)."""
        if command.name == b"INTERNAL_CREATE_TOPIC":
            # Youzan's order: the partition is parsed before the authorization is asked.
            name, _partition = self.youzan.create_topic_target(command.args)
            await self.check_auth("CREATE_TOPIC", name, "")
        else:
            await self.check_auth(command.name.decode(), go_text(command.args[0]), "")

    def sub_names(self, command) -> tuple[str, str]:
        """The topic and channel a SUB-family command names, after Go's state and name checks."""
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

    def sub(self, command) -> bytes:
        """SUB topic channel; with a partition number after them it is Youzan's."""
        args = command.args
        if len(args) >= 3 and is_partition(args[2]):
            return self.youzan.sub(command)
        topic_name, channel_name = self.sub_names(command)
        topic = self._topic_for_client(topic_name, fatal=True)
        self.check_subscription(topic, ordered=False)
        return self.subscribe(topic, channel_name)

    def _topic_for_client(self, name: str, *, fatal: bool):
        try:
            return self.nsqd.topic_for_client(name)
        except NotLedHere:
            # A cluster topic this node does not hold (yet): the client looks it up again.
            raise ProtocolError("E_FAILED_ON_NOT_LEADER", "", fatal=fatal) from None

    def check_subscription(self, topic, *, ordered: bool) -> None:
        """What a topic asks of its subscribers, whatever the SUB's form: ordered topics take
        SUB_ORDERED only, ext topics (docs/protocol.md §3.5) take only clients that IDENTIFYd
        `extend_support`, and only those."""
        client = self.client
        if topic.ordered and not ordered:
            raise ProtocolError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if (
            topic.ext
            and not client.extend_support
            and not self.nsqd.options.allow_sub_ext_compatible
        ):
            raise ProtocolError(
                "E_SUB_EXTEND_NEED", "this topic is extended and should identify as extend support."
            )
        if not topic.ext and client.extend_support:
            raise ProtocolError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        refusal = self.nsqd.placement.refusal(topic, Operation.CONSUME)
        if refusal is not None:
            raise ProtocolError(refusal, "", fatal=True)
        if ordered and client.sample_rate != 0:
            raise ProtocolError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )

    def subscribe(self, topic, channel_name: str) -> bytes:
        """The client joins the topic's channel (created on first use)."""
        client = self.client
        if self.nsqd.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed to deleted topic/channel")
        if not topic.channel_auto_create and channel_name not in topic.channels:
            # Youzan's `disable_channel_auto_create`: channels come from /channel/create.
            raise ProtocolError(
                "E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic."
            )
        version = topic.channels_version
        channel = topic.get_channel(channel_name)
        if topic.channels_version != version:
            # A new channel: a cluster partition's followers get it before the OK.
            self._new_channels.append(topic)
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
        message_id = self.dialect.message_key(command.args, "FIN")
        client = self.client
        channel = client.channel
        assert channel is not None  # _require_message_state: subscribed
        try:
            channel.finish(client.id, message_id)
        except ChannelError as error:
            raise ProtocolError(
                "E_FIN_FAILED", f"FIN {self.dialect.printed_id(command.args[0])} failed {error}"
            ) from None
        client.finished_message()
        return None

    def _finish_run(self, wire_ids: list[bytes], replies: list[bytes]) -> None:
        """A run of FINs read at once (`CommandParser.take_fin_run`): each as `fin` would,
        the failures answered in place, the client counted and woken once."""
        self._commands_run += len(wire_ids)
        client = self.client
        channel = client.channel
        assert channel is not None  # subscribed
        dialect = self.dialect
        message_ids = dialect.message_keys(wire_ids)
        failures = channel.finish_many(client.id, message_ids)
        if failures:
            sent = dict(zip(message_ids, wire_ids, strict=True))
            for message_id, error in failures:
                text = f"E_FIN_FAILED FIN {dialect.printed_id(sent[message_id])} failed {error}"
                self.nsqd.log.error("[%s] - %s", client, text)
                replies.append(encode_error(text))
        finished = len(message_ids) - len(failures)
        if finished:
            client.finished_message(finished)

    def req(self, command) -> None:
        self._require_message_state("REQ")
        args = command.args
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "REQ insufficient number of params")
        message_id = self.dialect.message_key(args, "REQ")
        timeout_ms = go_base10(args[1])
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {go_text(args[1])}")
        # Go clamps an out-of-range REQ timeout instead of refusing it.
        delay = min(timeout_ms / 1000, self.options.max_req_timeout)
        client = self.client
        channel = client.channel
        assert channel is not None  # _require_message_state: subscribed
        try:
            requeued = channel.requeue(client.id, message_id, delay, trio.current_time())
        except ChannelError as error:
            raise ProtocolError(
                "E_REQ_FAILED", f"REQ {self.dialect.printed_id(args[0])} failed {error}"
            ) from None
        if requeued:
            client.requeued_message()
        return None

    def touch(self, command) -> None:
        self._require_message_state("TOUCH")
        message_id = self.dialect.message_key(command.args, "TOUCH")
        client = self.client
        channel = client.channel
        assert channel is not None  # _require_message_state: subscribed
        try:
            channel.touch(client.id, message_id, client.msg_timeout, trio.current_time())
        except ChannelError as error:
            raise ProtocolError(
                "E_TOUCH_FAILED", f"TOUCH {self.dialect.printed_id(command.args[0])} failed {error}"
            ) from None
        return None

    def cls(self, command) -> bytes:
        if self.client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        self.client.start_close()
        return CLOSE_WAIT_FRAME

    def _publish_classic(self, label: str, code: str, args: list[bytes], bodies, defer=0.0):
        """PUB, MPUB and DPUB. A PUB or MPUB with a partition number is Youzan's; without one,
        the topic is created on first use (DPUB's second word is its delay, Youzan has no
        DPUB)."""
        if label != "DPUB" and len(args) == 2 and is_partition(args[1]):
            topic = self.youzan.publish_target(args)
        else:
            topic = self._topic_for_client(
                go_text(args[0]), fatal=self.dialect.publish_errors_are_fatal
            )
            if topic.ordered:
                raise ProtocolError(
                    "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
                )
            self.check_writable(topic)
        self.publish(topic, label, code, bodies, defer=defer)
        return OK_FRAME

    def check_writable(self, topic) -> None:
        """`/disable/write` refuses publishes (Youzan's; docs/protocol.md §8 #4), and so does a
        cluster node that does not lead the partition or cannot replicate it now."""
        refusal = self.nsqd.placement.refusal(topic, Operation.PUBLISH)
        if refusal is not None:
            # Not fatal for Youzan clients (they re-query lookupd), fatal for classic ones.
            raise ProtocolError(refusal, "", fatal=self.dialect.publish_errors_are_fatal)

    def publish(
        self, topic, label: str, code: str, bodies: list[bytes], **kwargs
    ) -> "list[Message] | MessageBatch":
        """Publish through nsqd's one publish path; a refusal is Go's `<label> failed <err>`
        with `code`, fatal as the dialect says. Counted in the client's stats."""
        try:
            messages = publish(self.nsqd, topic, bodies, **kwargs)
        except TooMuchWaiting as error:
            raise ProtocolError("E_PUB_TOO_MUCH_WAITING", str(error), fatal=True) from None
        except PublishError as error:
            raise ProtocolError(
                code, f"{label} failed {error}", fatal=self.dialect.publish_errors_are_fatal
            ) from None
        group = topic.queue.write_group
        if group is not None:
            # Its reply goes next in the batch's replies; the commit may still refuse it.
            self._write_groups.append((len(self._replies), group, label, code))
        self.client.published(topic.name, len(bodies))
        return messages

    def publish_traced(
        self, topic, label: str, code: str, bodies: list[bytes], **kwargs
    ) -> list[Message]:
        """A publish with trace ids (and ext headers): its Messages, for the traced reply
        (such a publish is never kept as a MessageBatch)."""
        messages = self.publish(topic, label, code, bodies, **kwargs)
        assert not isinstance(messages, MessageBatch)
        return messages

    def pub(self, command) -> bytes:
        return self._publish_classic("PUB", "E_PUB_FAILED", command.args, [command.body])

    def mpub(self, command) -> bytes:
        return self._publish_classic("MPUB", "E_MPUB_FAILED", command.args, command.messages)

    def pub_seq(self, command) -> bytes:
        return self.publish_sequenced("PUB_SEQ", "E_PUB_FAILED", command.args, [command.body])

    def mpub_seq(self, command) -> bytes:
        return self.publish_sequenced("MPUB_SEQ", "E_MPUB_FAILED", command.args, command.messages)

    def publish_sequenced(
        self, label: str, code: str, args: list[bytes], bodies, topic=None, **extra
    ) -> bytes:
        """An idempotent publish into a log topic's partition: stored when its first sequence
        is the producer's next one; a repeat of a stored one is answered OK without storing it
        again (once what holds it is written); a gap or a partial overlap is refused
        (nsqd/idempotence.py). Partition forms are Youzan's, so the connection speaks it.
        `extra`: the trace IDs and ext headers of MPUB_EXT_SEQ's messages."""
        if topic is None:
            topic = self.youzan.publish_target(args[:2])
        producers = getattr(topic.queue, "producers", None)
        if producers is None:
            raise ProtocolError(
                "E_NOT_LOG_TOPIC",
                f"{label} needs a log topic: {topic.name} keeps its messages in a diskqueue",
                fatal=False,
            )
        producer_id, first = args[2], int(args[3])
        repeat = producers.check(label, producer_id, first, len(bodies))
        if repeat is None:
            self.publish(topic, label, code, bodies, producer=(producer_id, first), **extra)
        elif repeat.group is not None and not repeat.group.done:
            # Answered with the write that holds it, refused if that write fails.
            self._write_groups.append((len(self._replies), repeat.group, label, code))
        return OK_FRAME

    def dpub(self, command) -> bytes:
        defer_ms = go_base10(command.args[1])
        assert defer_ms is not None  # the parser refused a DPUB without a valid timeout
        defer = defer_ms / 1000
        return self._publish_classic("DPUB", "E_DPUB_FAILED", command.args, [command.body], defer)


def _only_nops(data: bytes | bytearray) -> bool:
    count, rest = divmod(len(data), len(NOP))
    return not rest and data == NOP * count

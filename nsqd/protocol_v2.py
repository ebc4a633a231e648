"""The V2 protocol as a command interpreter: bytes in, replies and effects out.

Go's protocol_v2.go `Exec`, without the I/O (as h11 is HTTP without it). The connection
(`nsqd/connection.py`) feeds what it reads to `receive_data` and drives `batches`, a
generator that runs every complete command and yields what needs the connection
(`nsqd/effects.py`): asking the auth server, upgrading the stream, moving to or forwarding a
publish to another of `--workers`, waiting for the batch's writes; at `BatchDone` the
batch's replies are the connection's to send. The pump's side is `deliveries`: the frames
of the messages RDY lets out now.

Where a topic command is served is asked here once, of the placement (`nsqd/placement.py`):
here, another worker (the connection moves or forwards), or refused (the NSQ error).

This file is Go NSQ's V2. What a Youzan client changes is elsewhere: the dialect the connection
speaks (`nsqd/dialect.py`, switched by `become_youzan`), Youzan's commands
(`nsqd/protocol_youzan.py`, which also take SUB, PUB and MPUB when they name a partition) and
ordered delivery (`nsqd/delivery.py`, the channel's policy). IDENTIFY's settings are negotiated
into the client by `nsqd/identify.py`; every publish goes through `nsqd/publish.py`.
"""

import json
from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from nsqpy.common.command import NOP
from nsqpy.common.command_parser import CommandParser, is_partition, named_partition
from nsqpy.common.errors import ProtocolError, refused_write_text
from nsqpy.common.frame import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    OK_FRAME,
    encode_error,
    encode_frame,
    encode_response,
)
from nsqpy.common.goformat import go_base10, go_quote, go_text
from nsqpy.common.names import is_valid_name
from nsqpy.daemon.auth import AuthError
from nsqpy.nsqd.channel import ChannelError
from nsqpy.nsqd.client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED, Client
from nsqpy.nsqd.cluster_partition import NotLedHere
from nsqpy.nsqd.dialect import CLASSIC, ClassicDialect, YouzanDialect
from nsqpy.nsqd.effects import (
    ANSWER_FORWARDED,
    CLOSE,
    COMMIT_CLOSE,
    COMMIT_KEEP_OPEN,
    KEEP_OPEN,
    Commit,
    Effect,
    Forward,
    MoveTo,
    QueryAuth,
    ReplicateChannels,
    Upgrade,
)
from nsqpy.nsqd.ext_filter import parse_ext_filter
from nsqpy.nsqd.identify import Negotiated, decode_identify, negotiate
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.nsqd.placement import Operation
from nsqpy.nsqd.protocol_youzan import YouzanCommands
from nsqpy.nsqd.publish import PublishError, TooMuchWaiting, publish

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD

# The most messages one pump pass sends; bounds one buffer and lets FINs interleave.
MAX_PUMP_BATCH = 1024
# The most message bytes one send carries (at least one message): a batch of big messages
# goes out in pieces, so a connection's output buffer stays bounded (Go's is the client's
# output_buffer_size) instead of a copy of everything RDY let out at once.
MAX_SEND_BYTES = 256 * 1024
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

# Batches' steps: effects out, their outcomes in, for the connection's life.
Batches = Generator[Effect, Any, None]
# A command that needs effects (AUTH, an authorized one): its reply at the end.
CommandSteps = Generator[Effect, Any, Any]


def split_by_size(messages: list, limit: int) -> list[list]:
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
        remote_address: str,
        clock: Callable[[], float],
        *,
        internal: bool = False,
    ) -> None:
        """`clock`: the time in the channels' timeouts (the connection's event loop's, read
        only when a message goes out or its timeout changes). `internal`: another worker's
        link, carrying its clients' forwarded publishes (they were authorized there, and one
        refused closes only its own client there)."""
        options = nsqd.options
        self.nsqd = nsqd
        self._clock = clock
        self.options = options
        self.client = Client(options, remote_address)
        self.internal = internal
        # IDENTIFY's body, for a move to another worker to replay.
        self.identify_body: bytes | None = None
        # Whether the connection ran a topic command here: under `--workers`, a later one for
        # another worker's topic is forwarded instead of moving the connection.
        self.topic_bound = False
        # A fatal error ended the connection: the connection drains the client's input before
        # closing.
        self.refused = False
        self.commands_run = 0
        # Until the connection is on TLS, a TLS-requiring nsqd takes nothing but IDENTIFY.
        self.client.tls_gate = (
            options.tls_required != "false" and nsqd.tls_context is not None and not internal
        )
        self.parser = CommandParser(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            max_req_timeout_ms=int(options.max_req_timeout * 1000),
            # The client's, not a method of this interpreter: a parser holding one would make
            # a cycle, which only the collector frees (a connection's end frees it at once).
            before_body=partial(check_body_command, self.client),
        )
        # The replies of the batch being run, and where the log publishes among them wait for
        # their group's write: (reply index, group, label, error code).
        self._replies: list[bytes] = []
        self._write_groups: list[tuple] = []
        # Cluster partitions whose channel this batch created (`nsqd/cluster.py`).
        self._new_channels: list = []
        # Classic until the client shows it speaks Youzan's (`become_youzan`).
        self.dialect: ClassicDialect | YouzanDialect = CLASSIC
        self.youzan = YouzanCommands(self)
        # The command table (`HANDLERS`, shared by every connection: bound methods kept on
        # the interpreter would make it a cycle), and the commands that yield effects.
        if nsqd.auth_enabled and not internal:
            self._handlers, self._effectful_commands = AUTHORIZED_HANDLERS, AUTHORIZED_EFFECTFUL
        else:
            self._handlers, self._effectful_commands = HANDLERS, EFFECTFUL

    @property
    def tls_gate(self) -> bool:
        """Whether the connection must upgrade to TLS before anything but IDENTIFY."""
        return self.client.tls_gate

    # -- bytes in -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        self.parser.receive_data(data)

    def receive_eof(self) -> bytes | None:
        """The client closed: the error reply for a command it left unfinished, if any."""
        try:
            self.parser.receive_eof()
        except ProtocolError as error:
            return encode_error(error.text)
        return None

    def absorb_nops(self, data: bytes) -> bool:
        """Take `data` when it is whole NOPs and nothing else, with nothing buffered before
        it (`nsqd/idle_reads.py`): a NOP only gives the next command a fresh read deadline.
        False: the connection runs it as any other read."""
        if self.tls_gate or self.parser.buffered or not only_nops(data):
            return False
        self.commands_run += len(data) // len(NOP)
        return True

    # -- a batch of commands ------------------------------------------------------------------

    def batches(self) -> Batches:
        """The connection's batches of commands, one after another, for its whole life (made
        once: a generator a batch would cost every round trip). Send None to run every
        complete command received so far; each effect yielded needs the connection, and
        `BatchDone` ends the batch: its replies are then `replies()`, and `keep_open` False
        closes the connection once they are sent."""
        parser = self.parser
        client = self.client
        handlers = self._handlers
        while True:
            placement = self.nsqd.placement
            replies: list[bytes] = []
            self._replies = replies
            keep_open = True
            forwarded = False
            while True:
                try:
                    if client.state == STATE_SUBSCRIBED and not client.tls_gate:
                        fin_ids = parser.take_fin_run()
                        if fin_ids:
                            self._finish_run(fin_ids, replies)
                            continue
                    command = parser.next_command()
                    if command is None:
                        break
                    self.commands_run += 1
                    name = command.name
                    if client.tls_gate:
                        enforce_tls_policy(client, name)
                    if name in TOPIC_COMMANDS and command.args:
                        owner = placement.worker_for(
                            command.args[0], named_partition(name, command.args)
                        )
                        if owner is not None:
                            # Before it subscribed, a SUB or a first topic command moves the
                            # connection to the topic's worker; a later publish is forwarded.
                            if client.state == STATE_INIT and (
                                name in SUBSCRIBE_COMMANDS or not self.topic_bound
                            ):
                                yield MoveTo(owner.index, command)
                                keep_open = False
                                break
                            if name in FORWARDED_COMMANDS:
                                if self.nsqd.auth_enabled:
                                    # The owner takes this worker's word for the authorization.
                                    yield from self.authorize(command)
                                yield Forward(owner.index, command, len(replies))
                                replies.append(b"")  # the owner's answer, once it comes
                                forwarded = True
                                continue
                        self.topic_bound = True
                    handler = handlers.get(name)
                    if handler is None:
                        raise ProtocolError("E_INVALID", f"invalid command {go_text(name)}")
                    if name in self._effectful_commands:
                        reply = yield from handler(self, command)
                    else:
                        reply = handler(self, command)
                    if type(reply) is Negotiated:
                        before = b"".join(replies)
                        replies.clear()
                        yield Upgrade(reply, before)
                        continue
                except ProtocolError as error:
                    self.nsqd.log.error("[%s] - %s", client, error.text)
                    replies.append(encode_error(error.text))
                    # Another worker's link carries many clients' publishes: one refused closes
                    # only its own client, on the worker that forwarded it.
                    if error.fatal and not self.internal:
                        keep_open = False
                        self.refused = True
                        break
                    continue
                if reply is not None:
                    replies.append(reply)
            if forwarded:
                answers = yield ANSWER_FORWARDED
                keep_open = self._place_forwarded(replies, answers) and keep_open
            # Acknowledge publishes only once their writes reached the files.
            groups = self._write_groups
            if not groups and not self._new_channels:
                yield COMMIT_KEEP_OPEN if keep_open else COMMIT_CLOSE
                continue
            yield Commit([entry[1] for entry in groups])
            if groups:
                keep_open = self._refuse_unwritten(replies) and keep_open
            if self._new_channels:
                topics, self._new_channels = self._new_channels, []
                yield ReplicateChannels(topics)
            yield KEEP_OPEN if keep_open else CLOSE

    def replies(self) -> bytes:
        """The replies of the batch just run, in one buffer."""
        replies = self._replies
        return b"".join(replies) if len(replies) > 1 else replies[0] if replies else b""

    def _place_forwarded(self, replies: list[bytes], answers: list) -> bool:
        """Put the owners' answers to the batch's forwarded publishes (`AnswerForwarded`) in
        their places; a refused one is answered as a refusal here would be (closing, when
        that is fatal, with nothing after it answered). False: close."""
        fatal_errors = self.dialect.publish_errors_are_fatal
        for index, command, answer in answers:
            try:
                if isinstance(answer, ProtocolError):
                    raise answer
                frame_type, data = answer
                if frame_type == FRAME_TYPE_ERROR:
                    text = data.decode("utf-8", "surrogateescape")
                    code, separator, description = text.partition(" ")
                    fatal = None if fatal_errors else False
                    raise ProtocolError(code, description if separator else None, fatal=fatal)
            except ProtocolError as error:
                self.nsqd.log.error("[%s] - %s", self.client, error.text)
                replies[index] = encode_error(error.text)
                if error.fatal:
                    del replies[index + 1 :]
                    return False
                continue
            count = len(command.messages) if command.messages is not None else 1
            self.client.published(go_text(command.args[0]), count)
            replies[index] = encode_frame(frame_type, data)
        return True

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
            if cluster_code and getattr(error, "maybe_stored", False):
                # Youzan's clients read the code; nsqpy's idempotent ones keep the publish's
                # sequences for its retry (docs/protocol.md §3.10).
                text = refused_write_text(cluster_code, maybe_stored=True)
            self.nsqd.log.error("[%s] - %s", self.client, text)
            replies[index] = encode_error(text)
            if self.dialect.publish_errors_are_fatal and not self.internal:
                del replies[index + 1 :]
                self.refused = True
                return False
        return True

    # -- messages out -------------------------------------------------------------------------

    def deliveries(self) -> tuple[Iterable[bytes] | None, float]:
        """What the pump sends now: the frames of the messages RDY lets out (in pieces of at
        most the client's output buffer, encoded as they are sent), nothing when the
        channel's filter left every one out (look again), or None when there is nothing to
        send; and how long a rate-limited channel in debt holds the client. The clock is read
        only when the time matters (a message goes out, a rate limit)."""
        clock = self._clock
        client = self.client
        channel = client.channel
        if channel is None:
            return None, 0.0
        # A rate-limited channel in debt sends nothing until its bucket refills.
        rate_limit = channel.rate_limit
        if rate_limit is not None:
            held_for = rate_limit.wait(clock())
            if held_for:
                return None, held_for
        if not client.is_ready():
            return None, 0.0
        room = min(client.room(), MAX_PUMP_BATCH)
        if rate_limit is not None:
            room = rate_limit.affordable(room)
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
                    return (), 0.0
            messages = sent
        if not messages:
            channel.wait_for_messages(client)
            return None, 0.0
        now = clock()
        channel.start_in_flight(messages, client.id, client.msg_timeout, now)
        if rate_limit is not None:
            rate_limit.spend(messages, now)
        client.sent_messages(len(messages))
        if channel.has_messages():
            channel.notify()
        limit = max(client.output_buffer_size, MAX_SEND_BYTES)
        encode_frames = self.dialect.encode_frames
        topic = channel.topic
        pieces = split_by_size(messages, limit)
        if len(pieces) == 1:
            return (encode_frames(messages, client, topic),), 0.0
        return (encode_frames(piece, client, topic) for piece in pieces), 0.0

    def _sample(self, messages: list) -> list:
        """Go skips (and so drops for this client) a message when rand(100) > sample_rate."""
        rate = self.client.sample_rate
        randbelow = self.nsqd.random.randrange
        return [message for message in messages if randbelow(100) <= rate]

    # -- state checks ---------------------------------------------------------------------

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
        self.identify_body = command.body
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
        # Go nsqd logs IDENTIFY at debug: at info, a line per connection cost 10,000 clients
        # connecting at once a sixth of nsqd's CPU.
        self.nsqd.log.debug("PROTOCOL(V2): [%s] %s", client, data)
        if negotiated is None:
            return OK_FRAME
        if negotiated.upgrades:
            return negotiated
        return encode_response(negotiated.reply)

    def auth(self, command) -> CommandSteps:
        client = self.client
        if client.auth_state is not None and client.auth_state.authorizations:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self.nsqd.auth_enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        client.auth_secret = command.body.decode("utf-8", "surrogateescape")
        try:
            yield QueryAuth()
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

    def check_auth(self, label: str, topic: str, channel: str) -> Generator[Effect, Any, None]:
        """Go's CheckAuth: authorizations first, refreshed when their TTL ran out."""
        client = self.client
        state = client.auth_state
        if state is None or not state.authorizations:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {label}")
        if state.is_expired():
            try:
                yield QueryAuth()
            except AuthError as error:
                self.nsqd.log.warning("PROTOCOL(V2): [%s] Auth Failed %s", client, error)
                raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None
        state = client.auth_state
        if state is None or not state.is_allowed(topic, channel):
            raise ProtocolError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {label} on {go_quote(topic)} {go_quote(channel)}",
            )

    def sub_authorized(self, command) -> CommandSteps:
        topic_name, channel_name = self.sub_names(command)
        yield from self.check_auth("SUB", topic_name, channel_name)
        return HANDLERS[command.name](self, command)

    def pub_authorized(self, command) -> CommandSteps:
        yield from self.authorize(command)
        return HANDLERS[command.name](self, command)

    def authorize(self, command) -> Generator[Effect, Any, None]:
        """Go's CheckAuth for a publish or Youzan's INTERNAL_CREATE_TOPIC, whether it runs
        here or on another of `--workers` (which takes this worker's word for it)."""
        if command.name == b"INTERNAL_CREATE_TOPIC":
            # Youzan's order: the partition is parsed before the authorization is asked.
            name, _partition = self.youzan.create_topic_target(command.args)
            yield from self.check_auth("CREATE_TOPIC", name, "")
        else:
            yield from self.check_auth(command.name.decode(), go_text(command.args[0]), "")

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
        if topic.channels_version != version and topic.replication.info is not None:
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
        self.commands_run += len(wire_ids)
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
            requeued = channel.requeue(client.id, message_id, delay, self._clock())
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
            channel.touch(client.id, message_id, client.msg_timeout, self._clock())
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


def only_nops(data: bytes | bytearray) -> bool:
    """Whether `data` is whole NOPs and nothing else."""
    count, rest = divmod(len(data), len(NOP))
    return not rest and data == NOP * count


def enforce_tls_policy(client: Client, name: bytes) -> None:
    """Before TLS a TLS-requiring nsqd takes IDENTIFY alone; on TLS the gate opens."""
    if client.tls:
        client.tls_gate = False
    elif name != b"IDENTIFY":
        raise ProtocolError("E_INVALID", f"cannot {go_text(name)} in current state (TLS required)")


def check_body_command(client: Client, name: bytes) -> None:
    """Go checks the TLS policy and IDENTIFY's and AUTH's state before reading bodies."""
    if client.tls_gate:
        enforce_tls_policy(client, name)
    if name == b"IDENTIFY" and client.state != STATE_INIT:
        raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
    if name == b"AUTH" and client.state != STATE_INIT:
        raise ProtocolError("E_INVALID", "cannot AUTH in current state")


Handler = Callable[[ProtocolV2, Any], Any]


def _youzan(command: Callable[[YouzanCommands, Any], Any]) -> Handler:
    """A Youzan command (docs/protocol.md §3.1) as the interpreter's table calls it."""

    def handler(protocol: ProtocolV2, received: Any) -> Any:
        return command(protocol.youzan, received)

    return handler


# Each returns the reply (None: none), or a Negotiated upgrade; AUTH and the authorized
# wrappers are generators of effects (`EFFECTFUL`, `AUTHORIZED_EFFECTFUL`).
HANDLERS: dict[bytes, Handler] = {
    b"FIN": ProtocolV2.fin,
    b"RDY": ProtocolV2.rdy,
    b"REQ": ProtocolV2.req,
    b"PUB": ProtocolV2.pub,
    b"MPUB": ProtocolV2.mpub,
    b"DPUB": ProtocolV2.dpub,
    # nsqpy's idempotent publishes (docs/protocol.md §3.10).
    b"PUB_SEQ": ProtocolV2.pub_seq,
    b"MPUB_SEQ": ProtocolV2.mpub_seq,
    b"NOP": ProtocolV2.nop,
    b"TOUCH": ProtocolV2.touch,
    b"SUB": ProtocolV2.sub,
    b"CLS": ProtocolV2.cls,
    b"AUTH": ProtocolV2.auth,
    b"IDENTIFY": ProtocolV2.identify,
    **{name: _youzan(command) for name, command in YouzanCommands.HANDLERS.items()},
}
EFFECTFUL = frozenset({b"AUTH"})
# With `--auth-http-address`, subscribes and publishes ask the auth server first.
AUTHORIZED_HANDLERS: dict[bytes, Handler] = {
    **HANDLERS,
    **dict.fromkeys(SUBSCRIBE_COMMANDS, ProtocolV2.sub_authorized),
    **dict.fromkeys(PUBLISH_COMMANDS, ProtocolV2.pub_authorized),
    b"INTERNAL_CREATE_TOPIC": ProtocolV2.pub_authorized,
}
AUTHORIZED_EFFECTFUL = EFFECTFUL | TOPIC_COMMANDS

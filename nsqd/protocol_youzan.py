"""Youzan's commands on a V2 connection (docs/protocol.md §3, §8).

`YouzanCommands` is an extension the V2 interpreter (`ProtocolV2`) is built with: it adds
Youzan's command names to the interpreter's table, and takes over the classic SUB, PUB and MPUB
when they name a partition. It works through the interpreter's small API (`become_youzan`,
`check_subscription`, `subscribe`, `check_writable`, `publish`), never its internals; the
dialect the connection then speaks (binary IDs, DETAIL and EXT sections, which failures are
fatal) is `nsqd/dialect.py`.
"""

import struct
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from nsqpy.common.command import split_ext_body, split_trace_body
from nsqpy.common.command_parser import parse_partition
from nsqpy.common.consume_offset import parse_consume_offset
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import OK_FRAME, encode_response
from nsqpy.common.goformat import go_quote, go_text
from nsqpy.common.names import is_valid_name
from nsqpy.nsqd.ext_header import ExtHeaderError, only_internal_keys, parse_fields, trace_id_of
from nsqpy.partition_log import record_size

if TYPE_CHECKING:
    from nsqpy.nsqd.protocol_v2 import ProtocolV2

_TRACE_REPLY = struct.Struct(">2sQQQI")


def trace_reply(internal_id: int, trace_id: int, offset: int, size: int) -> bytes:
    """PUB_TRACE's 30-byte response: `OK`, id, trace id, offset, raw size (docs/protocol.md
    §3.6)."""
    return encode_response(_TRACE_REPLY.pack(b"OK", internal_id, trace_id, offset, size))


def _go_parse_bool(raw: bytes) -> bool:
    text = go_text(raw)
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(raw)}: invalid syntax")


class YouzanCommands:
    """Youzan's commands for one connection."""

    # The command names Youzan adds, and their methods (the interpreter's table calls them);
    # SUB_ORDER is the name Youzan's article uses. Set below the class.
    HANDLERS: dict[bytes, Callable]

    def __init__(self, protocol: "ProtocolV2") -> None:
        # A weak reference: the interpreter holds this object, and a strong one back would
        # make the pair a cycle, which only the collector frees.
        self.protocol = weakref.proxy(protocol)
        self.nsqd = protocol.nsqd

    # -- partitions ---------------------------------------------------------------------

    def _partition(self, name: str, raw: bytes | None):
        """The partition a command names, which must exist; none named (`raw` None) or -1 is
        the topic's default one (docs/protocol.md §8 #2, #3). Youzan's commands never create a
        topic."""
        partition = -1 if raw is None else parse_partition(raw)
        topic = self.nsqd.get_partition(name, partition)
        if topic is None:
            raise ProtocolError("E_TOPIC_NOT_EXIST", "")
        return topic

    def create_topic_target(self, args: list[bytes]) -> tuple[str, int]:
        """The topic and partition INTERNAL_CREATE_TOPIC names, checked in Youzan's order up to
        its authorization (under AUTH, the right to publish to the topic, as `CREATE_TOPIC`:
        `ProtocolV2.authorize`)."""
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        name = go_text(args[0])
        if not is_valid_name(name):
            raise ProtocolError("E_BAD_TOPIC", f"topic name {go_quote(args[0])} is not valid")
        return name, parse_partition(args[1])

    def internal_create_topic(self, command) -> bytes:
        args = command.args
        name, partition = self.create_topic_target(args)
        if partition < 0:
            raise ProtocolError("E_BAD_PARTITION", "partition should not less than 0")
        ext = False
        if len(args) > 2:
            try:
                ext = _go_parse_bool(args[2])
            except ValueError as error:
                raise ProtocolError("E_BAD_EXT", f"topic ext is not valid: {error}") from None
        self.nsqd.create_partition(name, partition, partitioned=True, ext=ext)
        return OK_FRAME

    # -- subscribing --------------------------------------------------------------------

    def sub(self, command) -> bytes:
        """SUB with a partition, SUB_ORDERED (and its alias SUB_ORDER), SUB_ADVANCED."""
        name = command.name
        protocol = self.protocol
        ordered = name in (b"SUB_ORDERED", b"SUB_ORDER")
        advanced = name == b"SUB_ADVANCED"
        args = command.args
        topic_name, channel_name = protocol.sub_names(command)
        # The partition is parsed whenever it is there (Youzan ignores it when a SUB_ADVANCED
        # start follows, a bug docs/protocol.md §3.3 says not to copy).
        raw_partition = args[2] if len(args) >= 3 else None
        dialect = protocol.become_youzan()
        topic = self._partition(topic_name, raw_partition)
        protocol.check_subscription(topic, ordered=ordered)
        start = None
        if advanced and len(args) >= 4:
            try:
                start = parse_consume_offset(go_text(args[3]))
            except ValueError as error:
                raise ProtocolError("E_INVALID", str(error)) from None
            if not topic.queue.seekable and start != ("special", -1):
                raise ProtocolError(
                    "E_INVALID",
                    f"consume start {go_text(args[3])} is not supported yet (only special:-1)",
                )
        dialect.detail = ordered or advanced
        reply = protocol.subscribe(topic, channel_name)
        channel = protocol.client.channel
        assert channel is not None  # subscribed
        if ordered:
            channel.deliver_in_order()
        if start is not None and len(channel.clients) == 1:
            try:
                channel.seek(*start)
            except ValueError as error:
                raise ProtocolError("E_INVALID", str(error)) from None
        return reply

    # -- publishing ---------------------------------------------------------------------

    def publish_target(self, args: list[bytes]):
        """The partition a Youzan publish names: `t p`, or `t` for the default partition,
        which an ordered topic does not have (docs/protocol.md §3.3). Youzan's publishes never
        create a topic, and their topic names are not even validated."""
        self.protocol.become_youzan()
        raw = args[1] if len(args) == 2 else None
        topic = self._partition(go_text(args[0]), raw)
        if topic.ordered and raw is None:
            raise ProtocolError(
                "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
            )
        self.protocol.check_writable(topic)
        return topic

    def pub_trace(self, command) -> bytes:
        topic = self.publish_target(command.args)
        trace_id, data = split_trace_body(command.body)
        (message,) = self.protocol.publish_traced(
            topic, "PUB", "E_PUB_FAILED", [data], trace_ids=[trace_id]
        )
        return trace_reply(
            int(message.id, 16), trace_id, message.offset, record_size(message, topic.ext)
        )

    def mpub_trace(self, command) -> bytes:
        topic = self.publish_target(command.args)
        traced = [split_trace_body(body) for body in command.messages]
        messages = self.protocol.publish_traced(
            topic,
            "MPUB",
            "E_MPUB_FAILED",
            [d for _t, d in traced],
            trace_ids=[t for t, _d in traced],
        )
        total = sum(record_size(m, topic.ext) for m in messages)
        # Youzan's reply to MPUB_TRACE: the first id, a zero trace id, the first offset and
        # the size of the whole batch (docs/protocol.md §3.6).
        return trace_reply(int(messages[0].id, 16), 0, messages[0].offset, total)

    def _ext_header(self, header: bytes, topic) -> int | None:
        """Check a PUB_EXT JSON header; the `##trace_id` it carries, if any."""
        try:
            fields = parse_fields(header)
            trace_id = trace_id_of(fields)
        except ExtHeaderError as error:
            raise ProtocolError(error.code, error.detail, fatal=False) from None
        if not topic.ext and not (
            self.nsqd.options.allow_ext_compatible and only_internal_keys(fields)
        ):
            # (With --allow-ext-compatible a header of internal keys is dropped: a topic that
            # is not ext stores none.)
            raise ProtocolError(
                "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic.name}", fatal=False
            )
        return trace_id

    def pub_ext(self, command) -> bytes:
        topic = self.publish_target(command.args)
        header, data = split_ext_body(command.body)
        trace_id = self._ext_header(header, topic)
        (message,) = self.protocol.publish_traced(
            topic, "PUB", "E_PUB_FAILED", [data], trace_ids=[trace_id or 0], ext_headers=[header]
        )
        if trace_id is None:
            return OK_FRAME
        return trace_reply(
            int(message.id, 16), trace_id, message.offset, record_size(message, topic.ext)
        )

    def mpub_ext(self, command) -> bytes:
        topic = self.publish_target(command.args)
        bodies, trace_ids, headers = self._ext_messages(command.messages, topic)
        self.protocol.publish(
            topic, "MPUB", "E_MPUB_FAILED", bodies, trace_ids=trace_ids, ext_headers=headers
        )
        return OK_FRAME

    def mpub_ext_seq(self, command) -> bytes:
        """nsqpy's idempotent MPUB_EXT (docs/protocol.md §3.10)."""
        topic = self.publish_target(command.args[:2])
        bodies, trace_ids, headers = self._ext_messages(command.messages, topic)
        return self.protocol.publish_sequenced(
            "MPUB_EXT_SEQ",
            "E_MPUB_FAILED",
            command.args,
            bodies,
            topic,
            trace_ids=trace_ids,
            ext_headers=headers,
        )

    def _ext_messages(
        self, messages: list[bytes], topic
    ) -> tuple[list[bytes], list[int], list[bytes]]:
        """MPUB_EXT's messages split: their data, trace IDs and JSON headers, each checked."""
        bodies = []
        trace_ids = []
        headers = []
        for body in messages:
            if len(body) < 2 or len(body) <= 2 + int.from_bytes(body[:2], "big"):
                raise ProtocolError(
                    "E_BAD_BODY", f"invalid body size {len(body)} in ext json header content length"
                )
            header, data = split_ext_body(body)
            trace_ids.append(self._ext_header(header, topic) or 0)
            headers.append(header)
            bodies.append(data)
        return bodies, trace_ids, headers


YouzanCommands.HANDLERS = {
    b"SUB_ORDERED": YouzanCommands.sub,
    b"SUB_ORDER": YouzanCommands.sub,
    b"SUB_ADVANCED": YouzanCommands.sub,
    b"PUB_TRACE": YouzanCommands.pub_trace,
    b"MPUB_TRACE": YouzanCommands.mpub_trace,
    b"PUB_EXT": YouzanCommands.pub_ext,
    b"MPUB_EXT": YouzanCommands.mpub_ext,
    b"MPUB_EXT_SEQ": YouzanCommands.mpub_ext_seq,
    b"INTERNAL_CREATE_TOPIC": YouzanCommands.internal_create_topic,
}

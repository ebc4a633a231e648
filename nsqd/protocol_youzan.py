"""Youzan's extensions of the V2 protocol, on the same connection handler (docs/protocol.md §3, §8).

A connection becomes a Youzan connection when it shows it is one (docs/protocol.md §8 #1): a SUB
family command with a partition, SUB_ORDERED or SUB_ADVANCED, or an IDENTIFY with
`extend_support`, `desired_tag` or `ext_filter`. From then on its message IDs are Youzan's
binary `[8 internal id][8 trace id]` (the internal id is our message id's 64-bit value, so
FIN/REQ/TOUCH map back to it), FIN/REQ/TOUCH are read at fixed offsets, and publish failures
are not fatal. Classic connections never see any of this.
"""

import json
import struct

from common.command import split_ext_body, split_trace_body
from common.command_parser import parse_partition
from common.errors import ProtocolError
from common.frame import FRAME_TYPE_MESSAGE, OK_FRAME, encode_response
from common.goformat import go_quote, go_text
from common.message import MESSAGE_ID_LENGTH
from common.names import is_valid_name
from nsqd.message import RECORD_OVERHEAD
from nsqd.publish import PublishError, publish

# [frame size][frame type][timestamp][attempts][internal id][trace id]
_BINARY_FRAME_HEADER = struct.Struct(">IiqHQQ")
_DETAIL = struct.Struct(">QI")
_TRACE_REPLY = struct.Struct(">2sQQQI")

SUB_FAMILY = (b"SUB", b"SUB_ORDERED", b"SUB_ORDER", b"SUB_ADVANCED")
YOUZAN_IDENTIFY_KEYS = ("extend_support", "desired_tag", "ext_filter")


def ext_section(message) -> bytes:
    """`[1 ext_ver]`, plus `[2 length][header]` when the message has a JSON header (ext_ver 4):
    what an ext topic's messages carry for `extend_support` clients (docs/protocol.md §3.5)."""
    header = message.ext_header
    if not header:
        return b"\x00"
    return b"\x04" + len(header).to_bytes(2, "big") + header


def encode_binary_id_frames(messages, detail: bool, ext: bool = False) -> bytes:
    """Message frames with Youzan's binary IDs, the EXT section (ext topics, `extend_support`
    clients) and the DETAIL section `[8 offset][4 size]` for SUB_ORDERED/SUB_ADVANCED
    connections, in that order (docs/protocol.md §3.5)."""
    pack = _BINARY_FRAME_HEADER.pack
    pack_detail = _DETAIL.pack
    overhead = _BINARY_FRAME_HEADER.size - 4 + (_DETAIL.size if detail else 0)
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        body = message.body
        extension = ext_section(message) if ext else b""
        append(
            pack(
                len(body) + len(extension) + overhead,
                FRAME_TYPE_MESSAGE,
                message.timestamp,
                message.attempts,
                int(message.id, 16),
                message.trace_id,
            )
        )
        if extension:
            append(extension)
        if detail:
            append(pack_detail(message.offset, RECORD_OVERHEAD + len(body)))
        append(body)
    return b"".join(parts)


def message_key(wire_id: bytes) -> bytes:
    """The in-flight key of a binary ID: its internal id as our 16 hex digits. Youzan reads
    only the first 8 bytes; the trace half is ignored."""
    return b"%016x" % int.from_bytes(wire_id[:8], "big")


def trace_reply(internal_id: int, trace_id: int, offset: int, size: int) -> bytes:
    """PUB_TRACE's 30-byte response: `OK`, id, trace id, offset, raw size (docs/protocol.md
    §3.6)."""
    return encode_response(_TRACE_REPLY.pack(b"OK", internal_id, trace_id, offset, size))


def _is_partition(raw: bytes) -> bool:
    digits = raw[1:] if raw[:1] in (b"-", b"+") else raw
    return digits.isdigit()


def _go_parse_bool(raw: bytes) -> bool:
    text = go_text(raw)
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(raw)}: invalid syntax")


class YouzanCommands:
    """The Youzan half of ProtocolV2 (mixed into it)."""

    youzan = False  # binary IDs and Youzan error fatality
    detail = False  # DETAIL section on messages (SUB_ORDERED / SUB_ADVANCED)
    extend_support = False
    desired_tag = ""

    def become_youzan(self) -> None:
        self.youzan = True
        self.parser.binary_ids = True

    def note_identify_extensions(self, extra: dict) -> None:
        if any(key in extra for key in YOUZAN_IDENTIFY_KEYS):
            self.become_youzan()
        self.extend_support = extra.get("extend_support") is True
        tag = extra.get("desired_tag")
        self.desired_tag = tag if isinstance(tag, str) else ""

    # -- partitions ---------------------------------------------------------------------

    def _resolve_partition(self, name: str, raw: bytes | None, *, create: bool):
        """The partition a command names. `raw` None: the classic form, which creates the
        topic's partition 0 on first use when `create`; otherwise an explicit partition that
        must exist, -1 meaning the default one (docs/protocol.md §8 #2, #3)."""
        nsqd = self.nsqd
        if raw is None:
            if create:
                return nsqd.get_topic(name)
            partition = -1
        else:
            partition = parse_partition(raw)
        topic = nsqd.get_partition(name, partition)
        if topic is None:
            raise ProtocolError("E_TOPIC_NOT_EXIST", "")
        return topic

    def internal_create_topic(self, command) -> bytes:
        args = command.args
        if len(args) < 2:
            raise ProtocolError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        name = go_text(args[0])
        if not is_valid_name(name):
            raise ProtocolError("E_BAD_TOPIC", f"topic name {go_quote(args[0])} is not valid")
        partition = parse_partition(args[1])
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

    def sub_family(self, command) -> bytes:
        """SUB with a partition, SUB_ORDERED (and its alias SUB_ORDER), SUB_ADVANCED."""
        name = command.name
        client = self.client
        ordered = name in (b"SUB_ORDERED", b"SUB_ORDER")
        advanced = name == b"SUB_ADVANCED"
        args = command.args
        topic_name, channel_name = self._sub_names(command)
        # The partition is parsed whenever it is there (Youzan ignores it when a SUB_ADVANCED start
        # follows, a bug docs/protocol.md §3.3 says not to copy). A plain SUB whose third word is
        # not a number is an official client's SUB with an extra word, which official nsqd ignores
        # (docs/protocol.md §2.3).
        raw_partition = args[2] if len(args) >= 3 else None
        if name == b"SUB" and raw_partition is not None and not _is_partition(raw_partition):
            raw_partition = None
        classic = name == b"SUB" and raw_partition is None
        if not classic:
            self.become_youzan()
        topic = self._resolve_partition(topic_name, raw_partition, create=classic)
        if topic.ordered and not ordered:
            raise ProtocolError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if topic.ext and not self.extend_support:
            raise ProtocolError(
                "E_SUB_EXTEND_NEED", "this topic is extended and should identify as extend support."
            )
        if not topic.ext and self.extend_support:
            raise ProtocolError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if ordered and client.sample_rate != 0:
            raise ProtocolError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        start = None
        if advanced and len(args) >= 4:
            start = go_text(args[3])
            kind, _, value = start.partition(":")
            if kind not in ("special", "timestamp", "virtual_queue", "msgcount"):
                raise ProtocolError("E_INVALID", f"invalid consume offset:{start}")
            if kind != "special" or value != "-1":
                raise ProtocolError(
                    "E_INVALID", f"consume start {start} is not supported yet (only special:-1)"
                )
        self.detail = ordered or advanced
        reply = self._subscribe_to(topic, channel_name)
        channel = client.channel
        if ordered:
            channel.ordered = True
        if start is not None and len(channel.clients) == 1:
            # special:-1 starts at the end: what is queued now is skipped.
            channel.skip_queued()
        return reply

    # -- publishing ---------------------------------------------------------------------

    def _publish_target(self, args: list[bytes], label: str):
        """The partition of a PUB-family command: classic form or `t p` (docs/protocol.md §3.3)."""
        name = go_text(args[0])
        # As for SUB: a second word that is no number is an official client's extra word.
        raw = args[1] if len(args) == 2 else None
        if raw is not None and label in ("PUB", "MPUB") and not _is_partition(raw):
            raw = None
        if raw is not None:
            self.become_youzan()
        # Only the official commands in their classic form create a topic (docs/protocol.md §8 #2);
        # Youzan's never do, and their topic names are not even validated (§3.3).
        classic = raw is None and label in ("PUB", "MPUB", "DPUB")
        topic = self._resolve_partition(name, raw, create=classic)
        if topic.ordered and raw is None:
            raise ProtocolError(
                "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
            )
        if self.nsqd.write_disabled_for(topic):
            # Not fatal for Youzan clients (they re-query lookupd), fatal for classic ones.
            raise ProtocolError("E_FAILED_ON_NOT_WRITABLE", "", fatal=not self.youzan)
        return topic

    def publish_failed(self, code: str, label: str, reason: PublishError) -> ProtocolError:
        """Go's `<label> failed <err>`: `exiting`, or a diskqueue write error such as
        `write <file>: no space left on device`. Official nsqd closes on a failed publish;
        Youzan's keeps the connection (§8 #4)."""
        return ProtocolError(code, f"{label} failed {reason}", fatal=not self.youzan)

    def pub_trace(self, command) -> bytes:
        self.become_youzan()
        topic = self._publish_target(command.args, "PUB_TRACE")
        trace_id, data = split_trace_body(command.body)
        try:
            (message,) = publish(self.nsqd, topic, [data], trace_ids=[trace_id])
        except PublishError as error:
            raise self.publish_failed("E_PUB_FAILED", "PUB", error) from None
        self.client.published(topic.name, 1)
        return trace_reply(
            int(message.id, 16), trace_id, message.offset, RECORD_OVERHEAD + len(data)
        )

    def mpub_trace(self, command) -> bytes:
        self.become_youzan()
        topic = self._publish_target(command.args, "MPUB_TRACE")
        traced = [split_trace_body(body) for body in command.messages]
        try:
            messages = publish(
                self.nsqd, topic, [d for _t, d in traced], trace_ids=[t for t, _d in traced]
            )
        except PublishError as error:
            raise self.publish_failed("E_MPUB_FAILED", "MPUB", error) from None
        self.client.published(topic.name, len(messages))
        total = sum(RECORD_OVERHEAD + len(m.body) for m in messages)
        # Youzan's reply to MPUB_TRACE: the first id, a zero trace id, the first offset and
        # the size of the whole batch (docs/protocol.md §3.6).
        return trace_reply(int(messages[0].id, 16), 0, messages[0].offset, total)

    def _ext_header(self, header: bytes, topic) -> int | None:
        """Check a PUB_EXT JSON header; the `##trace_id` it carries, if any."""
        try:
            fields = json.loads(header)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as error:
            # RecursionError: nesting deeper than Python's decoder goes; refused all the same.
            raise ProtocolError(
                "E_INVALID_JSON_HEADER", f"fail to parse json header:{error}", fatal=False
            ) from None
        trace = fields.get("##trace_id")
        trace_id = None
        if trace is not None:
            if not isinstance(trace, str):
                raise ProtocolError(
                    "INVALID_TRACE_ID", "passin trace id should be string", fatal=False
                )
            # Youzan parses it with strconv.ParseUint(…, 10, 64): ASCII digits, below 2^64.
            if not (trace.isascii() and trace.isdigit()) or int(trace) >= 1 << 64:
                raise ProtocolError("INVALID_TRACE_ID", "invalid trace id", fatal=False)
            trace_id = int(trace)
        if not topic.ext:
            raise ProtocolError(
                "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic.name}", fatal=False
            )
        return trace_id

    def pub_ext(self, command) -> bytes:
        self.become_youzan()
        topic = self._publish_target(command.args, "PUB_EXT")
        header, data = split_ext_body(command.body)
        trace_id = self._ext_header(header, topic)
        try:
            (message,) = publish(
                self.nsqd, topic, [data], trace_ids=[trace_id or 0], ext_headers=[header]
            )
        except PublishError as error:
            raise self.publish_failed("E_PUB_FAILED", "PUB", error) from None
        self.client.published(topic.name, 1)
        if trace_id is None:
            return OK_FRAME
        return trace_reply(
            int(message.id, 16), trace_id, message.offset, RECORD_OVERHEAD + len(data)
        )

    def mpub_ext(self, command) -> bytes:
        self.become_youzan()
        topic = self._publish_target(command.args, "MPUB_EXT")
        bodies = []
        trace_ids = []
        headers = []
        for body in command.messages:
            if len(body) < 2 or len(body) <= 2 + int.from_bytes(body[:2], "big"):
                raise ProtocolError(
                    "E_BAD_BODY", f"invalid body size {len(body)} in ext json header content length"
                )
            header, data = split_ext_body(body)
            trace_ids.append(self._ext_header(header, topic) or 0)
            headers.append(header)
            bodies.append(data)
        try:
            publish(self.nsqd, topic, bodies, trace_ids=trace_ids, ext_headers=headers)
        except PublishError as error:
            raise self.publish_failed("E_MPUB_FAILED", "MPUB", error) from None
        self.client.published(topic.name, len(bodies))
        return OK_FRAME

    # -- FIN, REQ, TOUCH with binary IDs -------------------------------------------------

    def wire_message_key(self, args: list[bytes], label: str) -> bytes:
        """The in-flight key of a Youzan FIN/REQ/TOUCH."""
        if not args:
            raise ProtocolError("E_INVALID", f"{label} insufficient number of params")
        wire_id = args[0]
        if len(wire_id) != MESSAGE_ID_LENGTH:
            raise ProtocolError("E_INVALID", "Invalid Message ID")
        # Youzan's FIN also refuses an internal id that is not positive (a signed int64).
        if label == "FIN" and int.from_bytes(wire_id[:8], "big", signed=True) <= 0:
            raise ProtocolError("E_INVALID", "Invalid Message ID")
        return message_key(wire_id)

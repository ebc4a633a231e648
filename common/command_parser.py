"""The sans-IO V2 command parser: bytes in, `Command` objects out (docs/protocol.md §1.2, §2, §3).

Like h11, it owns no socket: nsqd feeds it what `receive_some()` returned and takes out every
complete command. Everything that decides how many bytes a command spans is checked here, in
the order Go nsqd checks it, so a bad command is refused with Go's exact text before its body
is buffered:

* the parameters a body command needs before its body (`PUB` topic name, `DPUB` timeout, ...)
* the 4-byte body size against `max_msg_size` / `max_body_size`
* the MPUB message list inside the body

Checks that do not change the framing (state, RDY count, message ids of FIN, ...) belong to
nsqd, which can then apply them in Go's order (state first). For body commands nsqd's state
checks must run before the size checks, so the parser calls `before_body(name)` first.
"""

import re
import struct
from collections.abc import Callable, Iterator

from nsqpy.common.command import MAGIC_V2, Command
from nsqpy.common.errors import ProtocolError
from nsqpy.common.goformat import go_atoi, go_base10, go_quote, go_text
from nsqpy.common.names import is_valid_name

_SIZE = struct.Struct(">i")
# `FIN ` + a 16-byte message ID + `\n`.
_FIN_LINE_SIZE = 21
_NEWLINE = ord("\n")
_JSON_LENGTH = struct.Struct(">H")

# Go nsqd reads commands with a 16 KiB bufio.Reader, so the longest line it takes is 16383
# bytes plus the newline; a longer one makes ReadSlice fail and the connection close.
DEFAULT_MAX_LINE_LENGTH = 16 * 1024 - 1

TRACE_ID_LENGTH = 8

# FIN/REQ/TOUCH are read at fixed offsets on connections that use Youzan's binary IDs, which
# may contain '\n' and ' ' (docs/protocol.md §1.2): the line cannot end before the 16 ID bytes.
_FIXED_ID_END = {b"FIN ": 20, b"REQ ": 20, b"TOUCH ": 22}


class _BodyCommand:
    """How one body-carrying command is framed and what errors its framing can raise."""

    def check_args(self, name: bytes, args: list[bytes], parser: "CommandParser") -> None:
        """Parameter checks Go makes before it reads the body size."""

    def check_size(self, size: int, parser: "CommandParser") -> None:
        raise NotImplementedError

    def truncated_size_error(self) -> ProtocolError:
        raise NotImplementedError

    def truncated_body_error(self, partial: bytes, parser: "CommandParser") -> ProtocolError:
        raise NotImplementedError

    def build(
        self, name: bytes, args: list[bytes], body: bytes, parser: "CommandParser"
    ) -> Command:
        return Command(name, args, body)


class _IdentifyOrAuth(_BodyCommand):
    """IDENTIFY and AUTH: E_BAD_BODY errors prefixed by the command, bounded by max-body-size."""

    def __init__(self, label: str) -> None:
        self.label = label

    def check_args(self, name, args, parser):
        # Go's AUTH insists on exactly one parameter (the command itself); IDENTIFY ignores extras.
        if self.label == "AUTH" and args:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")

    def check_size(self, size, parser):
        if size > parser.max_body_size:
            raise ProtocolError(
                "E_BAD_BODY", f"{self.label} body too big {size} > {parser.max_body_size}"
            )
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"{self.label} invalid body size {size}")

    def truncated_size_error(self):
        return ProtocolError("E_BAD_BODY", f"{self.label} failed to read body size")

    def truncated_body_error(self, partial, parser):
        return ProtocolError("E_BAD_BODY", f"{self.label} failed to read body")


class _Pub(_BodyCommand):
    """PUB and DPUB: one message, E_BAD_MESSAGE errors, bounded by max-msg-size."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.min_args = 2 if label == "DPUB" else 1

    def check_args(self, name, args, parser):
        if len(args) < self.min_args:
            raise ProtocolError("E_INVALID", f"{self.label} insufficient number of parameters")
        if not is_valid_name(go_text(args[0])):
            raise ProtocolError(
                "E_BAD_TOPIC", f"{self.label} topic name {go_quote(args[0])} is not valid"
            )
        if self.label == "DPUB":
            timeout_ms = go_base10(args[1])
            if timeout_ms is None:
                raise ProtocolError("E_INVALID", f"DPUB could not parse timeout {go_text(args[1])}")
            if timeout_ms > parser.max_req_timeout_ms:
                raise ProtocolError(
                    "E_INVALID",
                    f"DPUB timeout {timeout_ms} out of range 0-{parser.max_req_timeout_ms}",
                )

    def check_size(self, size, parser):
        if size <= 0:
            raise ProtocolError("E_BAD_MESSAGE", f"{self.label} invalid message body size {size}")
        if size > parser.max_msg_size:
            raise ProtocolError(
                "E_BAD_MESSAGE", f"{self.label} message too big {size} > {parser.max_msg_size}"
            )

    def truncated_size_error(self):
        return ProtocolError("E_BAD_MESSAGE", f"{self.label} failed to read message body size")

    def truncated_body_error(self, partial, parser):
        return ProtocolError("E_BAD_MESSAGE", f"{self.label} failed to read message body")


class _Mpub(_BodyCommand):
    """MPUB: a body of `[4-byte count]([4-byte size][message])*`, bounded by max-body-size."""

    def check_args(self, name, args, parser):
        if not args:
            raise ProtocolError("E_INVALID", "MPUB insufficient number of parameters")
        if not is_valid_name(go_text(args[0])):
            # Go nsqd really repeats the code in the description (docs/protocol.md §2.8).
            raise ProtocolError(
                "E_BAD_TOPIC", f"E_BAD_TOPIC MPUB topic name {go_quote(args[0])} is not valid"
            )

    def check_size(self, size, parser):
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > parser.max_body_size:
            raise ProtocolError("E_BAD_BODY", f"MPUB body too big {size} > {parser.max_body_size}")

    def truncated_size_error(self):
        return ProtocolError("E_BAD_BODY", "MPUB failed to read body size")

    def truncated_body_error(self, partial, parser):
        return _mpub_truncation_error(partial, parser)

    def build(self, name, args, body, parser):
        return Command(
            name, args, body, parse_mpub_body(body, parser.max_msg_size, parser.max_body_size)
        )


class _YouzanPub(_BodyCommand):
    """PUB_TRACE and PUB_EXT (docs/protocol.md §3.3, §3.6): Youzan's texts, no topic-name check."""

    def __init__(self, label: str) -> None:
        self.label = label

    def check_args(self, name, args, parser):
        _check_youzan_pub_args(args)

    def check_size(self, size, parser):
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"invalid body size {size}")
        if size > parser.max_msg_size:
            raise ProtocolError("E_BAD_MESSAGE", f"message too big {size} > {parser.max_msg_size}")
        if self.label == "PUB_TRACE" and size <= TRACE_ID_LENGTH:
            raise ProtocolError("E_BAD_BODY", f"invalid body size {size} with trace id enabled")
        if self.label == "PUB_EXT" and size <= 2:
            raise ProtocolError(
                "E_BAD_BODY", f"invalid body size {size} with ext json header enabled"
            )

    def truncated_size_error(self):
        return ProtocolError("E_BAD_BODY", "failed to read body size")

    def truncated_body_error(self, partial, parser):
        return ProtocolError("E_BAD_MESSAGE", "failed to read message body")

    def build(self, name, args, body, parser):
        if self.label == "PUB_EXT":
            (json_length,) = _JSON_LENGTH.unpack_from(body)
            if len(body) <= 2 + json_length:
                raise ProtocolError(
                    "E_BAD_BODY", f"invalid body size {len(body)} in ext json header content length"
                )
        return Command(name, args, body)


class _YouzanMpub(_BodyCommand):
    """MPUB_TRACE and MPUB_EXT: MPUB's layout with Youzan's unprefixed body-size texts."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.min_message_size = TRACE_ID_LENGTH + 1 if label == "MPUB_TRACE" else 1

    def check_args(self, name, args, parser):
        _check_youzan_pub_args(args)

    def check_size(self, size, parser):
        if size <= 0:
            raise ProtocolError("E_BAD_BODY", f"invalid body size {size}")
        if size > parser.max_body_size:
            raise ProtocolError("E_BAD_BODY", f"body too big {size} > {parser.max_body_size}")

    def truncated_size_error(self):
        return ProtocolError("E_BAD_BODY", "failed to read body size")

    def truncated_body_error(self, partial, parser):
        return _mpub_truncation_error(partial, parser, self.min_message_size)

    def build(self, name, args, body, parser):
        messages = parse_mpub_body(
            body, parser.max_msg_size, parser.max_body_size, self.min_message_size
        )
        return Command(name, args, body, messages)


def _check_youzan_pub_args(args: list[bytes]) -> None:
    if not args:
        raise ProtocolError("E_INVALID", "insufficient number of parameters")
    # Youzan parses the partition only when it is the last of exactly three params.
    if len(args) == 2:
        parse_partition(args[1])


def is_partition(raw: bytes) -> bool:
    """Whether a SUB's third or PUB's second word is a partition number: an official
    client's extra word that is no number is ignored, as official nsqd does (docs/protocol.md
    §2.3)."""
    digits = raw[1:] if raw[:1] in (b"-", b"+") else raw
    return digits.isdigit()


# Where a topic command names its partition: SUB's third word, a Youzan publish's second
# (PUB and MPUB only when it is a number, DPUB's is its delay), the sequenced publishes' and
# INTERNAL_CREATE_TOPIC's second always. Values: (the word's position, the number of words
# the command then has, or 0 for any number above the position).
_PARTITION_WORD = {
    **dict.fromkeys((b"SUB", b"SUB_ORDERED", b"SUB_ORDER", b"SUB_ADVANCED"), (2, 0)),
    **dict.fromkeys(
        (b"PUB", b"MPUB", b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT", b"MPUB_EXT"), (1, 2)
    ),
    **dict.fromkeys((b"PUB_SEQ", b"MPUB_SEQ", b"MPUB_EXT_SEQ", b"INTERNAL_CREATE_TOPIC"), (1, 0)),
}


def named_partition(name: bytes, args: list[bytes]) -> int:
    """The partition a topic command names, -1 for none (the topic's default partition, or
    a word that is no partition number, which its handler refuses or ignores)."""
    word = _PARTITION_WORD.get(name)
    if word is None:
        return -1
    position, words = word
    if len(args) <= position or (words and len(args) != words):
        return -1
    raw = args[position]
    if raw.isdigit():
        return int(raw)
    if raw[:1] == b"+" and raw[1:].isdigit():
        return int(raw[1:])
    return -1


def parse_partition(raw: bytes) -> int:
    """A partition argument as Youzan nsqd reads it (strconv.Atoi), or E_BAD_PARTITION."""
    try:
        return go_atoi(raw)
    except ValueError as error:
        raise ProtocolError("E_BAD_PARTITION", f"topic partition is not valid: {error}") from None


# An idempotent producer's ID (docs/protocol.md §3.10): 1-64 of a channel name's characters.
_PRODUCER_ID = re.compile(rb"[.a-zA-Z0-9_-]{1,64}")
_MAX_SEQUENCE = (1 << 63) - 1


def _check_sequenced_args(label: str, args: list[bytes]) -> None:
    """`<topic> <partition> <producer id> <first sequence>` of PUB_SEQ, MPUB_SEQ and
    MPUB_EXT_SEQ."""
    if len(args) != 4:
        raise ProtocolError(
            "E_INVALID", f"{label} needs <topic> <partition> <producer id> <sequence>"
        )
    if not is_valid_name(go_text(args[0])):
        raise ProtocolError("E_BAD_TOPIC", f"{label} topic name {go_quote(args[0])} is not valid")
    parse_partition(args[1])
    if not _PRODUCER_ID.fullmatch(args[2]):
        raise ProtocolError(
            "E_BAD_PRODUCER", f"{label} producer id {go_quote(args[2])} is not valid"
        )
    raw = args[3]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= _MAX_SEQUENCE):
        raise ProtocolError("E_BAD_SEQUENCE", f"{label} sequence {go_quote(args[3])} is not valid")


class _PubSeq(_Pub):
    """PUB_SEQ: PUB's body and texts, with a producer and a sequence."""

    def __init__(self) -> None:
        super().__init__("PUB_SEQ")

    def check_args(self, name, args, parser):
        _check_sequenced_args(self.label, args)


class _MpubSeq(_Mpub):
    """MPUB_SEQ: MPUB's body and texts, with a producer and the first message's sequence."""

    def check_args(self, name, args, parser):
        _check_sequenced_args("MPUB_SEQ", args)


class _MpubExtSeq(_YouzanMpub):
    """MPUB_EXT_SEQ: MPUB_EXT's messages (each `[2 json length][json][data]`) and texts, with
    a producer and the first message's sequence."""

    def __init__(self) -> None:
        super().__init__("MPUB_EXT_SEQ")

    def check_args(self, name, args, parser):
        _check_sequenced_args(self.label, args)


BODY_COMMANDS: dict[bytes, _BodyCommand] = {
    b"IDENTIFY": _IdentifyOrAuth("IDENTIFY"),
    b"AUTH": _IdentifyOrAuth("AUTH"),
    b"PUB": _Pub("PUB"),
    b"DPUB": _Pub("DPUB"),
    b"MPUB": _Mpub(),
    b"PUB_TRACE": _YouzanPub("PUB_TRACE"),
    b"PUB_EXT": _YouzanPub("PUB_EXT"),
    b"MPUB_TRACE": _YouzanMpub("MPUB_TRACE"),
    b"MPUB_EXT": _YouzanMpub("MPUB_EXT"),
    b"PUB_SEQ": _PubSeq(),
    b"MPUB_SEQ": _MpubSeq(),
    b"MPUB_EXT_SEQ": _MpubExtSeq(),
}


def parse_mpub_body(
    body: bytes,
    max_msg_size: int,
    max_body_size: int,
    min_message_size: int = 1,
    *,
    exact: bool = True,
) -> list[bytes]:
    """The message bodies of an MPUB body, with Go's readMPUB checks and texts (docs/protocol.md
    §2.8).

    Go reads the messages straight off the socket; we have the whole body, so running out of it
    reports the same "failed to read" errors Go reports when the stream ends. A body longer than
    its messages is refused too: Go would have parsed the rest as the next command. HTTP
    /mpub?binary=true passes `exact=False`: there Go stops reading after the last message.
    """
    end = len(body)
    if end < 4:
        raise ProtocolError("E_BAD_BODY", "MPUB failed to read message count")
    (count,) = _SIZE.unpack_from(body)
    # 4 bytes of count, then at least 4 bytes of size and 1 byte of body per message.
    max_messages = (max_body_size - 4) // 5
    if count <= 0 or count > max_messages:
        raise ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")
    messages: list[bytes] = []
    append = messages.append
    unpack_from = _SIZE.unpack_from
    position = 4
    # The common case in one pass with one test per message; anything amiss is looked at
    # again by `_mpub_error`, which finds the first fault and raises Go's text for it.
    try:
        for _ in range(count):
            (size,) = unpack_from(body, position)
            position += 4
            following = position + size
            if size < min_message_size or size > max_msg_size or following > end:
                break
            append(body[position:following])
            position = following
        else:
            if exact and position != end:
                raise ProtocolError(
                    "E_BAD_BODY",
                    f"MPUB body size {end} does not match its {count} messages ({position} bytes)",
                )
            return messages
    except struct.error:
        pass
    raise _mpub_error(body, count, max_msg_size, min_message_size)


def _mpub_error(body: bytes, count: int, max_msg_size: int, min_message_size: int) -> ProtocolError:
    """The first fault of an MPUB body that `parse_mpub_body` could not split, in Go's words."""
    end = len(body)
    unpack_from = _SIZE.unpack_from
    position = 4
    for index in range(count):
        if end - position < 4:
            return ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({index}) body size")
        (size,) = unpack_from(body, position)
        if size < min_message_size:
            # Youzan checks `<= 0` first with the official text, and only then the trace id
            # length, with " for tracing" (docs/protocol.md §3.3, §3.6).
            suffix = " for tracing" if size > 0 else ""
            return ProtocolError(
                "E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}{suffix}"
            )
        if size > max_msg_size:
            return ProtocolError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        position += 4
        if end - position < size:
            return ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")
        position += size
    raise AssertionError("parse_mpub_body found a fault that _mpub_error did not")


def _mpub_truncation_error(
    partial: bytes, parser: "CommandParser", min_message_size: int = 1
) -> ProtocolError:
    """The error Go reports when the stream ends inside an MPUB body."""
    try:
        parse_mpub_body(partial, parser.max_msg_size, parser.max_body_size, min_message_size)
    except ProtocolError as error:
        if error.code != "E_BAD_BODY" or "does not match" not in (error.description or ""):
            return error
    return ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body")


class CommandParser:
    """Feed bytes with `receive_data`, take commands with `next_command` or by iterating.

    Commands come out one at a time so nsqd can act on each before the next is parsed: a SUB
    with a partition switches the connection to Youzan's binary IDs (`binary_ids`), which
    changes how the FIN that follows is framed.

    What stays buffered once every complete command is taken is at most `buffer_limit`
    bytes: one line, one size prefix and one body of the largest allowed size.
    """

    def __init__(
        self,
        *,
        max_msg_size: int = 1024 * 1024,
        max_body_size: int = 5 * 1024 * 1024,
        max_req_timeout_ms: int = 60 * 60 * 1000,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        expect_magic: bool = True,
        before_body: Callable[[bytes], None] | None = None,
    ) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_req_timeout_ms = max_req_timeout_ms
        self.max_line_length = max_line_length
        self.before_body = before_body
        self.binary_ids = False
        self.magic_received = not expect_magic
        self._data = b""
        self._position = 0
        # Bytes received while a command still needs more than that; joined only once enough
        # has arrived, so a large body arriving in many pieces is copied once, not per piece.
        self._chunks: list[bytes | bytearray] = []
        self._chunks_length = 0
        self._wanted = 0
        # A body command whose line was parsed and checked, waiting for its size and body.
        self._pending: tuple[_BodyCommand, bytes, list[bytes]] | None = None

    @property
    def buffer_limit(self) -> int:
        return self.max_line_length + 1 + 4 + max(self.max_body_size, self.max_msg_size)

    @property
    def buffered(self) -> int:
        return len(self._data) - self._position + self._chunks_length

    def receive_data(self, data: bytes | bytearray) -> None:
        if data:
            self._chunks.append(data)
            self._chunks_length += len(data)

    def __iter__(self) -> Iterator[Command]:
        while (command := self.next_command()) is not None:
            yield command

    def next_command(self) -> Command | None:
        """The next complete command, None when more bytes are needed, or ProtocolError."""
        if not self._gathered():
            return None
        if not self.magic_received:
            if not self._read_magic():
                return None
        pending = self._pending
        if pending is not None:
            return self._read_body(pending)
        data = self._data
        position = self._position
        newline = data.find(b"\n", position)
        if self.binary_ids and newline >= 0:
            newline = self._fixed_id_line_end(data, position, newline)
        if newline < 0:
            unparsed = len(data) - position
            if unparsed > self.max_line_length:
                raise self._line_too_long()
            self._wanted = unparsed + 1
            return None
        if newline - position > self.max_line_length:
            raise self._line_too_long()
        line = data[position:newline]
        self._position = newline + 1
        if self.binary_ids and line.startswith((b"FIN ", b"REQ ", b"TOUCH ")):
            command = self._fixed_id_command(line)
        else:
            # Go trims one trailing '\r' (docs/protocol.md §1.2).
            if line.endswith(b"\r"):
                line = line[:-1]
            name, *args = line.split(b" ")
            body_command = BODY_COMMANDS.get(name)
            if body_command is None:
                command = Command(name, args)
            else:
                if self.before_body is not None:
                    self.before_body(name)
                body_command.check_args(name, args, self)
                pending = self._pending = (body_command, name, args)
                return self._read_body(pending)
        self._compact()
        return command

    def take_fin_run(self) -> list[bytes]:
        """The IDs of the `FIN <16 bytes>\n` lines at the front of what was received, consumed
        as `next_command` would have read them one by one; [] when the next command is any
        other (or needs more bytes). A consumer FINs in batches: read as a run, each costs a
        slice instead of a parsed command. Hex IDs are 16 letters or digits; Youzan's binary
        ones (`binary_ids`) any 16 bytes whose internal id (the first 8, a signed int64) is
        positive, as Youzan's FIN asks."""
        if not self._gathered():
            return []
        if self._pending is not None or not self.magic_received:
            return []
        data = self._data
        position = self._position
        end = len(data) - _FIN_LINE_SIZE
        ids: list[bytes] = []
        append = ids.append
        startswith = data.startswith
        binary = self.binary_ids
        while position <= end and startswith(b"FIN ", position):
            if data[position + _FIN_LINE_SIZE - 1] != _NEWLINE:
                break
            message_id = data[position + 4 : position + _FIN_LINE_SIZE - 1]
            if binary:
                # One that is not positive is left to `next_command` and Youzan's error.
                if message_id[0] >= 0x80 or not any(message_id[:8]):
                    break
            elif not message_id.isalnum():
                # Anything else (a space, a '\r') is left to next_command and its error texts.
                break
            append(message_id)
            position += _FIN_LINE_SIZE
        if ids:
            self._position = position
            self._compact()
        return ids

    def _gathered(self) -> bool:
        """Join the chunks received since the last command into one buffer, once what the
        command being read needs has arrived; False while it has not."""
        if self._chunks:
            if self.buffered < self._wanted:
                return False
            self._data = b"".join([self._data[self._position :], *self._chunks])
            self._position = 0
            self._chunks.clear()
            self._chunks_length = 0
        return True

    def _line_too_long(self) -> ProtocolError:
        # Go closes without a word; a one-line reason is kinder and costs nothing.
        return ProtocolError("E_INVALID", f"command line longer than {self.max_line_length} bytes")

    def take_buffered(self) -> bytes:
        """Hand over every byte not parsed yet (the connection is switching to TLS or
        compression, and those bytes belong to the new layer)."""
        data = self._data[self._position :] + b"".join(self._chunks)
        self._data = b""
        self._position = 0
        self._chunks.clear()
        self._chunks_length = 0
        self._wanted = 0
        return data

    def receive_eof(self) -> None:
        """The peer closed its side. Raise the error Go sends when a command is cut short."""
        if self._pending is None:
            return
        body_command = self._pending[0]
        remaining = self._data[self._position :] + b"".join(self._chunks)
        if len(remaining) < 4:
            raise body_command.truncated_size_error()
        raise body_command.truncated_body_error(remaining[4:], self)

    def _read_magic(self) -> bool:
        if len(self._data) - self._position < len(MAGIC_V2):
            self._wanted = len(MAGIC_V2)
            return False
        magic = self._data[self._position : self._position + len(MAGIC_V2)]
        if magic != MAGIC_V2:
            # Go sends exactly `E_BAD_PROTOCOL`, not the usual "CODE description" form.
            raise ProtocolError("E_BAD_PROTOCOL", None)
        self._position += len(MAGIC_V2)
        self.magic_received = True
        return True

    def _read_body(self, pending: tuple["_BodyCommand", bytes, list[bytes]]) -> Command | None:
        """The body of the `pending` command, whose header was read."""
        body_command, name, args = pending
        data = self._data
        start = self._position
        if len(data) - start < 4:
            self._wanted = 4
            return None
        (size,) = _SIZE.unpack_from(data, start)
        body_command.check_size(size, self)
        end = start + 4 + size
        if end > len(data):
            self._wanted = 4 + size
            return None
        self._pending = None
        self._position = end
        command = body_command.build(name, args, data[start + 4 : end], self)
        self._compact()
        return command

    @staticmethod
    def _fixed_id_line_end(data: bytes, position: int, newline: int) -> int:
        for prefix, id_end in _FIXED_ID_END.items():
            if data.startswith(prefix, position):
                if newline < position + id_end:
                    return data.find(b"\n", position + id_end)
                break
        return newline

    @staticmethod
    def _fixed_id_command(line: bytes) -> Command:
        # The 16 ID bytes sit at fixed offsets and are taken as they are, '\r' included; only
        # REQ has anything after them, its timeout, where Go's '\r' trimming still applies.
        if line.startswith(b"TOUCH "):
            return Command(b"TOUCH", [line[6:22]])
        name = line[:3]
        if name == b"REQ" and len(line) > 21:
            timeout = line[21:]
            if timeout.endswith(b"\r"):
                timeout = timeout[:-1]
            return Command(name, [line[4:20], timeout])
        return Command(name, [line[4:20]])

    def _compact(self) -> None:
        if self._position == len(self._data):
            self._data = b""
            self._position = 0
        self._wanted = 0


def parse_http_mpub_body(
    body: bytes, binary: bool, max_msg_size: int, max_body_size: int
) -> list[bytes]:
    """The messages of an HTTP `/mpub` body: binary (`parse_mpub_body`, stopping after the last
    message as Go does) or one per line, where Go drops empty lines. ProtocolError whose code
    without its `E_` is the 413's text (`BAD_BODY`, `BAD_MESSAGE`, `MSG_TOO_BIG`)."""
    if binary:
        return parse_mpub_body(body, max_msg_size, max_body_size, exact=False)
    bodies = []
    for line in body.split(b"\n"):
        if not line:
            continue
        if len(line) > max_msg_size:
            raise ProtocolError("E_MSG_TOO_BIG", f"message too big {len(line)} > {max_msg_size}")
        bodies.append(line)
    return bodies

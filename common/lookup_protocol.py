"""The nsqlookupd "V1" TCP protocol, sans-IO (docs/protocol.md §4): bytes in, commands out.

Server side (nsqlookupd): `LookupServerConnection` turns what an nsqd sends into
`LookupCommand`s, checking everything Go's `lookup_protocol_v1.go` checks, in the same order
and with the same error texts; `encode_response`, `encode_error` and `identify_reply` build
the replies. Client side (nsqd's lookupd peer, tests): the `encode_*` functions build requests
and `LookupClientConnection` splits the length-prefixed replies.

Wire format: the client opens with the magic `"  V1"`, then sends lines `CMD [params]\\n`;
IDENTIFY's line is followed by `[4-byte BE int32 size][JSON]`. Every reply, errors included, is
`[4-byte BE uint32 size][data]` with no frame type. Every nsqlookupd error is fatal.
"""

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nsqpy.common.errors import ProtocolError
from nsqpy.common.goformat import go_json as _go_json
from nsqpy.common.names import is_valid_name

MAGIC_V1 = b"  V1"
OK = b"OK"

# Go's nsqlookupd reads lines with bufio.ReadString, which grows without bound. A valid line is
# under 160 bytes (`UNREGISTER`, two 64-char names, a partition), so anything near 4 KiB (the
# size of Go's default bufio buffer) is garbage; refusing it bounds what one peer can make us hold.
DEFAULT_MAX_LINE_LENGTH = 4096
# Go allocates whatever int32 size the peer declares (and panics on a negative one). A real
# IDENTIFY body is ~250 bytes; 1 MiB leaves room for any future field while bounding memory.
DEFAULT_MAX_IDENTIFY_BODY_SIZE = 1024 * 1024
# nsqd reads lookupd replies with readResponseBounded(conn, --max-body-size), default 5 MiB.
DEFAULT_MAX_RESPONSE_SIZE = 5 * 1024 * 1024

# Youzan's OLD_VERSION_PID, and its MAX_PARTITION_NUM (valid ids are [0, 255)).
OLD_VERSION_PARTITION = -11
MAX_PARTITION_NUM = 255

_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")

# Go's strings.TrimSpace trims unicode.IsSpace runes: the Unicode White_Space property. Python's
# str.strip() also strips \x1c-\x1f, which Go keeps, so the set is spelled out.
_GO_WHITESPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)
# strconv.Atoi in base 10: an optional sign and ASCII digits, nothing else (no spaces, no "_").
_GO_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class Registration:
    """What a REGISTER or UNREGISTER names.

    `partition` is None for the classic grammar (official nsqd); `channel` is None for a
    topic-only registration.
    """

    topic: str
    partition: int | None = None
    channel: str | None = None


@dataclass(frozen=True, slots=True)
class LookupCommand:
    """One complete request from an nsqd.

    `name` is PING, IDENTIFY, REGISTER or UNREGISTER; `params` are the words after it, as sent.
    IDENTIFY carries `identify`, the decoded body (see `decode_identify_body`); REGISTER and
    UNREGISTER carry the parsed `registration`.
    """

    name: str
    params: tuple[str, ...] = ()
    identify: dict[str, Any] | None = None
    registration: Registration | None = None


class BadProtocolError(ProtocolError):
    """The peer did not open with `"  V1"`.

    Go's nsqlookupd tcp.go sends the bare code `E_BAD_PROTOCOL`: no description and, unlike
    every other error, no trailing space.
    """

    def __init__(self) -> None:
        super().__init__("E_BAD_PROTOCOL", "", fatal=True)

    @property
    def text(self) -> str:
        return self.code


class LookupResponseError(Exception):
    """An nsqlookupd reply nsqd must not accept; Go's lookupPeer closes the connection."""


# ---------------------------------------------------------------------------------------------
# Validation shared by the server connection (and usable on its own)


def _fatal(code: str, description: str) -> ProtocolError:
    # docs/protocol.md §4.1: every nsqlookupd error closes the connection, E_*_FAILED codes
    # included.
    return ProtocolError(code, description, fatal=True)


def is_partitioned_peer(identify_body: Mapping[str, Any]) -> bool:
    """True when the peer speaks Youzan's `REGISTER t p [c]` grammar (docs/protocol.md §8 row 7).

    The negation of Youzan's PeerInfo.IsOldPeer: a non-empty `distributed_id`, or "HA" in
    `version` (Youzan's standalone nsqd sends an empty distributed_id but an -HA version).
    """
    distributed_id = identify_body.get("distributed_id") or ""
    version = identify_body.get("version") or ""
    return distributed_id != "" or "HA" in version


def parse_partition(text: str) -> int | None:
    """Youzan's GetValidPartitionID: a strconv.Atoi decimal in [0, 255), or -11; else None."""
    if _GO_ATOI.fullmatch(text) is None:
        return None
    partition = int(text)  # Atoi accepts "+5" and "007"; so do we.
    if 0 <= partition < MAX_PARTITION_NUM or partition == OLD_VERSION_PARTITION:
        return partition
    return None


def parse_registration(command: str, params: list[str], partitioned: bool) -> Registration:
    """Apply the REGISTER/UNREGISTER grammar of the peer's kind; raise the Go error if it fails.

    Classic (official getTopicChan): `t [c]`. Partitioned (Youzan getTopicChan): `t p [c]`.
    Extra words are ignored and an empty channel means "no channel", as in Go. The checks run
    in Go's order: count, topic, channel, then partition.
    """
    minimum = 2 if partitioned else 1
    if len(params) < minimum:
        raise _fatal("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel_index = 2 if partitioned else 1
    channel = params[channel_index] if len(params) > channel_index else ""
    if not is_valid_name(topic):
        raise _fatal("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel != "" and not is_valid_name(channel):
        raise _fatal("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    partition = None
    if partitioned:
        partition = parse_partition(params[1])
        if partition is None:
            raise _fatal("E_BAD_PARTITIONID", f"{command} partition id '{params[1]}' is not valid")
    return Registration(topic=topic, partition=partition, channel=channel or None)


# The fields of Go's PeerInfo (official and Youzan together) with their Go types. json.Unmarshal
# fails on a wrong type for any of them; every other key is ignored.
_IDENTIFY_FIELDS: dict[str, type] = {
    "broadcast_address": str,
    "hostname": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
    "distributed_id": str,
    "topology_zone": str,
    "topology_region": str,
    # Decoded (so type-checked) by Go, then overwritten with the connection's address.
    "remote_address": str,
}
_IDENTIFY_DROPPED = frozenset({"remote_address"})


class _JSONObject(list):
    """A JSON object as its (key, value) pairs, in wire order, so duplicates resolve like Go."""


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; Go's is strict JSON.
    raise ValueError(f"invalid JSON constant {name}")


def _go_fold(key: str) -> str:
    # Go's json matches keys to fields case-insensitively with simple case folding
    # (bytes.EqualFold), so "TCP_PORT" and even the Kelvin sign in "\u212a" hit a field.
    return "".join(ch.casefold() if len(ch.casefold()) == 1 else ch for ch in key)


def _go_decode_value(value: Any, field_type: type) -> Any:
    if value is None:
        return None  # Go leaves the field at its zero value.
    if field_type is str and type(value) is str:
        # Go turns a lone surrogate escape into U+FFFD; Python keeps it and could not encode it.
        return _SURROGATE.sub("\ufffd", value)
    if field_type is int and type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    raise ValueError(f"cannot unmarshal {type(value).__name__} into {field_type.__name__}")


def decode_identify_body(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body the way Go's json.Unmarshal into PeerInfo does.

    Returns every PeerInfo field (Go's zero value when absent or null): broadcast_address,
    hostname, tcp_port, http_port, version, distributed_id, topology_zone, topology_region.
    Raises `E_BAD_BODY IDENTIFY failed to decode JSON body` for invalid JSON, a top level that
    is not an object (a bare `null` passes, as in Go) or a wrongly typed field, and then
    `E_BAD_BODY IDENTIFY missing fields` unless broadcast_address, tcp_port, http_port and
    version are all non-zero.
    """
    decoded = {
        name: ("" if field_type is str else 0)
        for name, field_type in _IDENTIFY_FIELDS.items()
        if name not in _IDENTIFY_DROPPED
    }
    try:
        # Go replaces invalid UTF-8 inside strings with U+FFFD and rejects it elsewhere;
        # decoding with "replace" and then parsing does the same.
        document = json.loads(
            body.decode("utf-8", "replace"),
            object_pairs_hook=_JSONObject,
            parse_constant=_reject_constant,
        )
        if document is not None and not isinstance(document, _JSONObject):
            raise ValueError("IDENTIFY body is not a JSON object")
        for key, value in document or ():
            name = _go_fold(key)
            field_type = _IDENTIFY_FIELDS.get(name)
            if field_type is None:
                continue
            field_value = _go_decode_value(value, field_type)
            if field_value is not None and name not in _IDENTIFY_DROPPED:
                decoded[name] = field_value
    except (ValueError, RecursionError) as exc:
        # RecursionError: 1 MiB of "[" nests deeper than Python's json can go (Go: 10000).
        raise _fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from exc
    if (
        decoded["broadcast_address"] == ""
        or decoded["tcp_port"] == 0
        or decoded["http_port"] == 0
        or decoded["version"] == ""
    ):
        raise _fatal("E_BAD_BODY", "IDENTIFY missing fields")
    return decoded


# ---------------------------------------------------------------------------------------------
# Server side


_AWAIT_MAGIC = "magic"
_AWAIT_LINE = "line"
_AWAIT_BODY_SIZE = "body size"
_AWAIT_BODY = "body"


class LookupServerConnection:
    """nsqlookupd's view of one nsqd connection: bytes in, `LookupCommand`s out.

    The connection applies every check of Go's LookupProtocolV1 itself, because some depend on
    what came before on the wire: IDENTIFY twice fails before its body is read, REGISTER needs
    an IDENTIFY first, and the REGISTER grammar follows the peer's IDENTIFY (docs/protocol.md §8
    row 7).
    Since every error is fatal, a command returned is one the server should answer; an
    IDENTIFY returned means the peer is identified from then on.

    Usage::

        try:
            commands = conn.receive_data(data)
            while commands:
                for command in commands:
                    ...  # answer with encode_response(...)
                commands = conn.receive_data(b"")  # raises an error that followed them
        except ProtocolError as err:
            send(encode_error(err)); close()
    """

    def __init__(
        self,
        *,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        max_identify_body_size: int = DEFAULT_MAX_IDENTIFY_BODY_SIZE,
    ) -> None:
        self.max_line_length = max_line_length
        self.max_identify_body_size = max_identify_body_size
        self.identify: dict[str, Any] | None = None
        self._state = _AWAIT_MAGIC
        self._buffer = bytearray()
        self._body_size = 0
        self._identify_params: tuple[str, ...] = ()
        self._error: ProtocolError | None = None

    @property
    def identified(self) -> bool:
        return self.identify is not None

    @property
    def partitioned(self) -> bool:
        """True once the peer has IDENTIFYed as a Youzan (partitioned) nsqd."""
        return self.identify is not None and is_partitioned_peer(self.identify)

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an incomplete command: never more than the larger of the two limits."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray) -> list[LookupCommand]:
        """Buffer `data` and return every command it completes, in order.

        Raises ProtocolError (always fatal) when the bytes break the protocol. When complete
        commands precede the bad bytes, those are returned first and the error is raised by the
        next call, so the server answers them before the error, as Go does; call
        `receive_data(b"")` after answering to surface it. Once raised, it is raised again by
        every later call.
        """
        if self._error is not None:
            raise self._error
        self._buffer += data
        commands: list[LookupCommand] = []
        position = 0
        try:
            while True:
                command, position = self._next_command(position)
                if command is None:
                    break
                commands.append(command)
        except ProtocolError as err:
            self._error = err
            self._buffer.clear()
            if not commands:
                raise
            return commands
        del self._buffer[:position]
        return commands

    def receive_eof(self) -> None:
        """The peer closed its side. Raises the error Go would still send, if there is one.

        Go's IDENTIFY reads the size and body with binary.Read and io.ReadFull, so EOF there is
        `E_BAD_BODY IDENTIFY failed to read body size` / `... failed to read body`. EOF anywhere
        else (before the magic, inside a line) closes quietly, as Go's ReadString loop does.
        """
        if self._error is not None:
            raise self._error
        if self._state == _AWAIT_BODY_SIZE:
            self._error = _fatal("E_BAD_BODY", "IDENTIFY failed to read body size")
        elif self._state == _AWAIT_BODY:
            self._error = _fatal("E_BAD_BODY", "IDENTIFY failed to read body")
        else:
            return
        self._buffer.clear()
        raise self._error

    def _next_command(self, position: int) -> tuple[LookupCommand | None, int]:
        """Parse one command from `position`; (None, position) when more bytes are needed."""
        buffer = self._buffer
        while True:
            available = len(buffer) - position
            if self._state == _AWAIT_MAGIC:
                if available < len(MAGIC_V1):
                    return None, position
                # Go reads exactly four bytes before judging them (io.ReadFull in tcp.go).
                if buffer[position : position + 4] != MAGIC_V1:
                    raise BadProtocolError()
                position += 4
                self._state = _AWAIT_LINE
            elif self._state == _AWAIT_LINE:
                end = buffer.find(b"\n", position, position + self.max_line_length + 1)
                if end < 0:
                    if available > self.max_line_length:
                        raise _fatal(
                            "E_INVALID", f"command line longer than {self.max_line_length} bytes"
                        )
                    return None, position
                line = bytes(buffer[position:end])
                position = end + 1
                command = self._line_command(line)
                if command is not None:
                    return command, position
            elif self._state == _AWAIT_BODY_SIZE:
                if available < _INT32.size:
                    return None, position
                (size,) = _INT32.unpack_from(buffer, position)
                # Go would panic on a negative size (make([]byte, -1)) and allocate any positive
                # one; both are refused here before a byte of the body is buffered.
                if size < 0 or size > self.max_identify_body_size:
                    raise _fatal("E_BAD_BODY", "IDENTIFY failed to read body size")
                position += _INT32.size
                self._body_size = size
                self._state = _AWAIT_BODY
            else:  # _AWAIT_BODY
                if available < self._body_size:
                    return None, position
                body = bytes(buffer[position : position + self._body_size])
                position += self._body_size
                self.identify = decode_identify_body(body)
                self._state = _AWAIT_LINE
                return LookupCommand("IDENTIFY", self._identify_params, self.identify), position

    def _line_command(self, line: bytes) -> LookupCommand | None:
        """Dispatch one line like Go's Exec; None when IDENTIFY still needs its body."""
        # surrogateescape keeps arbitrary bytes, so error texts echo them exactly (encode_error).
        text = line.decode("utf-8", "surrogateescape").strip(_GO_WHITESPACE)
        # strings.Split on one space: "A  B" has an empty word, and an empty line is [""].
        name, *params = text.split(" ")
        if name == "PING":
            return LookupCommand("PING", tuple(params))
        if name == "IDENTIFY":
            # Checked before the body is read, as in Go; the params are ignored there too.
            if self.identify is not None:
                raise _fatal("E_INVALID", "cannot IDENTIFY again")
            self._identify_params = tuple(params)
            self._state = _AWAIT_BODY_SIZE
            return None
        if name in ("REGISTER", "UNREGISTER"):
            if self.identify is None:
                raise _fatal("E_INVALID", "client must IDENTIFY")
            registration = parse_registration(name, params, self.partitioned)
            return LookupCommand(name, tuple(params), registration=registration)
        raise _fatal("E_INVALID", f"invalid command {name}")


def encode_response(data: bytes) -> bytes:
    """Frame a reply as `[4-byte BE size][data]`: Go's protocol.SendResponse, no frame type."""
    return _UINT32.pack(len(data)) + data


def encode_error(err: ProtocolError) -> bytes:
    """Frame an error reply; the text's bytes are exactly those the peer sent (see above)."""
    return encode_response(err.text.encode("utf-8", "surrogateescape"))


def go_json(value: Any) -> bytes:
    """JSON the way Go's json.Marshal writes a map: sorted keys, no spaces, HTML-safe escapes."""
    return _go_json(value, sort_keys=True)


def identify_reply(
    broadcast_address: str, hostname: str, http_port: int, tcp_port: int, version: str
) -> bytes:
    """nsqlookupd's IDENTIFY reply body; frame it with `encode_response`.

    Go builds it as a map, so json.Marshal sorts the keys:
    `{"broadcast_address":..,"hostname":..,"http_port":..,"tcp_port":..,"version":..}`.
    """
    return go_json(
        {
            "broadcast_address": broadcast_address,
            "hostname": hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": version,
        }
    )


# ---------------------------------------------------------------------------------------------
# Client side


def encode_magic() -> bytes:
    return MAGIC_V1


def encode_identify(info: Mapping[str, Any]) -> bytes:
    """`IDENTIFY\\n[4-byte BE size][JSON]`.

    go-nsq's Identify marshals nsqd's map, so the keys go out sorted whatever order nsqd/lookup.go
    fills them in: broadcast_address, [distributed_id,] hostname, http_port, tcp_port, version.
    """
    body = go_json(dict(info))
    return b"IDENTIFY\n" + _UINT32.pack(len(body)) + body


def _encode_line(name: str, params: list[str]) -> bytes:
    for param in params:
        # A space or newline would shift every later word and command on the connection.
        if param == "" or any(ch in param for ch in " \n"):
            raise ValueError(f"{name} parameter {param!r} cannot go on the wire")
    return " ".join([name, *params]).encode("utf-8") + b"\n"


def _registration_params(topic: str, channel: str | None, partition: int | None) -> list[str]:
    params = [topic]
    if partition is not None:
        params.append(str(partition))
    # go-nsq's Register/UnRegister drop an empty channel: that is a topic registration.
    if channel:
        params.append(channel)
    return params


def encode_register(topic: str, channel: str | None = None, partition: int | None = None) -> bytes:
    """`REGISTER t [c]` (classic) or `REGISTER t p [c]` (partitioned, when `partition` is set)."""
    return _encode_line("REGISTER", _registration_params(topic, channel, partition))


def encode_unregister(
    topic: str, channel: str | None = None, partition: int | None = None
) -> bytes:
    """`UNREGISTER t [c]` or `UNREGISTER t p [c]`; without a channel it drops the whole topic."""
    return _encode_line("UNREGISTER", _registration_params(topic, channel, partition))


def encode_ping() -> bytes:
    return b"PING\n"


class LookupClientConnection:
    """nsqd's view of one nsqlookupd connection: bytes in, reply bodies out.

    Replies carry no frame type, so an error is told apart only by its text (`E_...`). Go's nsqd
    compares the IDENTIFY reply with exactly `E_INVALID` and otherwise parses it as JSON.
    """

    def __init__(self, *, max_response_size: int = DEFAULT_MAX_RESPONSE_SIZE) -> None:
        self.max_response_size = max_response_size
        self._buffer = bytearray()

    @property
    def pending_bytes(self) -> int:
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray) -> list[bytes]:
        """Buffer `data` and return every complete reply body, in order.

        Raises LookupResponseError for a size over the limit (Go's readResponseBounded text)
        or a negative one (on which Go would panic).
        """
        self._buffer += data
        replies: list[bytes] = []
        position = 0
        while len(self._buffer) - position >= _INT32.size:
            (size,) = _INT32.unpack_from(self._buffer, position)
            if size < 0 or size > self.max_response_size:
                self._buffer.clear()
                raise LookupResponseError(
                    f"response body size ({size}) is greater than limit ({self.max_response_size})"
                    if size >= 0
                    else f"response body size ({size}) is negative"
                )
            end = position + _INT32.size + size
            if end > len(self._buffer):
                break
            replies.append(bytes(self._buffer[position + _INT32.size : end]))
            position = end
        del self._buffer[:position]
        return replies

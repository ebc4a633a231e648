"""IDENTIFY: the body's decoding and what a client may negotiate with it (docs/protocol.md §2.1).

Sans-IO: `decode_identify` reads the JSON as Go's json.Unmarshal into identifyDataV2 would, and
`negotiate` checks each setting against nsqd's limits and writes it into the client, which owns
its negotiated state from then on. The connection only sends the reply and, when TLS or
compression was negotiated, switches its stream.
"""

import json
import re
from typing import TYPE_CHECKING

from nsqpy.common.errors import ProtocolError
from nsqpy.common.goformat import go_json
from nsqpy.common.version import VERSION

if TYPE_CHECKING:
    from nsqpy.nsqd.client import Client
    from nsqpy.nsqd.options import Options

# The IDENTIFY keys by which a client shows it speaks Youzan's dialect (docs/protocol.md §8 #1).
YOUZAN_IDENTIFY_KEYS = ("extend_support", "desired_tag", "ext_filter")


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


# The last IDENTIFY bodies decoded, and the last replies encoded: clients that connect and
# close by the thousand (a producer's connection a publish) send the same IDENTIFY each time,
# and its JSON was a fifth of what nsqd did for each (bench/RESULTS.md). Small bodies only;
# emptied when full.
_DECODED: dict[bytes, dict] = {}
_REPLIES: dict[tuple, bytes] = {}
_REMEMBERED = 256
_REMEMBERED_BODY = 2048


def decode_identify(body: bytes) -> dict:
    """Decode an IDENTIFY body as Go's json.Unmarshal into identifyDataV2 would. The dict may
    be another connection's too: read it, never change it.

    A value of the wrong JSON type fails the whole decode (Go's UnmarshalTypeError); keys
    match case-insensitively, null leaves the zero value, invalid UTF-8 is replaced.
    """
    body = bytes(body)  # the parser's bytes (a copy only of another buffer)
    decoded = _DECODED.get(body)
    if decoded is None:
        decoded = _decode_identify(body)
        if len(body) <= _REMEMBERED_BODY:
            if len(_DECODED) >= _REMEMBERED:
                _DECODED.clear()
            _DECODED[body] = decoded
    return decoded


def _reply_json(reply: dict) -> bytes:
    key = tuple(reply.items())
    encoded = _REPLIES.get(key)
    if encoded is None:
        encoded = go_json(reply)
        if len(_REPLIES) >= _REMEMBERED:
            _REPLIES.clear()
        _REPLIES[key] = encoded
    return encoded


def _decode_identify(body: bytes) -> dict:
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


class Negotiated:
    """What IDENTIFY with `feature_negotiation` agreed: the JSON reply, and the stream layers the
    connection switches to after sending it (TLS first, then snappy or deflate)."""

    __slots__ = ("reply", "tls", "snappy", "deflate_level")

    def __init__(self, reply: bytes, tls: bool, snappy: bool, deflate_level: int) -> None:
        self.reply = reply
        self.tls = tls
        self.snappy = snappy
        self.deflate_level = deflate_level

    @property
    def upgrades(self) -> bool:
        return self.tls or self.snappy or bool(self.deflate_level)


def negotiate(
    client: "Client",
    data: dict,
    options: "Options",
    *,
    tls_available: bool,
    auth_required: bool,
) -> Negotiated | None:
    """Apply a decoded IDENTIFY to `client` with Go's checks and texts (ProtocolError when a
    setting is out of range). None when the client did not ask for feature negotiation: the
    answer is then a plain OK."""
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
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({heartbeat}) is invalid")

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
        raise ProtocolError("E_BAD_BODY", f"IDENTIFY output buffer size ({buffer_size}) is invalid")

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

    extra = data.get("_extra", {})
    client.asked_for_youzan = any(key in extra for key in YOUZAN_IDENTIFY_KEYS)
    client.extend_support = extra.get("extend_support") is True
    tag = extra.get("desired_tag")
    client.desired_tag = tag if isinstance(tag, str) else ""

    if not data.get("feature_negotiation", False):
        return None
    tls = tls_available and data.get("tls_v1", False)
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
        "auth_required": auth_required,
        "output_buffer_size": client.output_buffer_size,
        "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
    }
    if client.desired_tag:
        reply["desired_tag"] = client.desired_tag
    if extra.get("idempotent_publish") is True:
        # nsqpy's: PUB_SEQ and MPUB_SEQ are served (docs/protocol.md §3.10). Said only to a
        # client that asks, so every other answer stays Go's.
        reply["idempotent_publish"] = True
    return Negotiated(
        _reply_json(reply),  # Go's json.Marshal: a desired_tag's <, > and & escaped, as Go does
        tls,
        snappy,
        deflate_level if deflate else 0,
    )

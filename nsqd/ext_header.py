"""Youzan ext topics' JSON message headers (docs/protocol.md §3.6): checked the same way for
TCP `PUB_EXT`/`MPUB_EXT` and HTTP `/pub_ext`, and read for `##client_dispatch_tag`, which
decides which consumers of a channel may receive a message (tag dispatch, `nsqd/channel.py`).

Sans-IO: bytes in, values or `ExtHeaderError` out; each protocol maps the error to its wire
form (a non-fatal error frame, an HTTP 400).
"""

import json
from functools import lru_cache

TRACE_ID_KEY = "##trace_id"
DISPATCH_TAG_KEY = "##client_dispatch_tag"
# /pub_ext: request headers `X-Nsqext-<Key>: value` become `<key>: value` in the JSON header.
HTTP_HEADER_PREFIX = "x-nsqext-"


class ExtHeaderError(Exception):
    """A header Youzan refuses: `code` is its error code, `detail` the text after it on TCP."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code} {detail}")
        self.code = code
        self.detail = detail


def parse_fields(header: bytes | str) -> dict:
    """The header's JSON object; E_INVALID_JSON_HEADER if it is not one."""
    try:
        fields = json.loads(header)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as error:
        # RecursionError: nesting deeper than Python's decoder goes; refused all the same.
        detail = f"fail to parse json header:{error}"
        raise ExtHeaderError("E_INVALID_JSON_HEADER", detail) from None
    return fields


def only_internal_keys(fields: dict) -> bool:
    """Whether a header holds only keys Youzan's nsqd may drop on a topic that is not ext
    (with --allow-ext-compatible): its own `##` keys, and `zan_test`."""
    return all(key.startswith("##") or key == "zan_test" for key in fields)


def trace_id_of(fields: dict) -> int | None:
    """The `##trace_id` a header carries: a decimal string below 2^64 (Youzan parses it with
    strconv.ParseUint(…, 10, 64)); None when absent; INVALID_TRACE_ID otherwise."""
    trace = fields.get(TRACE_ID_KEY)
    if trace is None:
        return None
    if not isinstance(trace, str):
        raise ExtHeaderError("INVALID_TRACE_ID", "passin trace id should be string")
    if not (trace.isascii() and trace.isdigit()) or int(trace) >= 1 << 64:
        raise ExtHeaderError("INVALID_TRACE_ID", "invalid trace id")
    return int(trace)


def encode_fields(fields: dict) -> bytes:
    """A header as Go's json.Marshal writes a map: keys sorted, no spaces, UTF-8 kept."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def with_http_headers(fields: dict, headers: dict[str, str]) -> dict:
    """`X-Nsqext-<Key>` request headers merged into the fields, their keys lower-cased; a
    request header wins over the same key in the query's JSON (Youzan's /pub_ext)."""
    for name, value in headers.items():
        if name.lower().startswith(HTTP_HEADER_PREFIX):
            fields[name[len(HTTP_HEADER_PREFIX) :].lower()] = value
    return fields


@lru_cache(maxsize=1024)
def dispatch_tag(header: bytes) -> str:
    """The `##client_dispatch_tag` of a stored header; "" when it has none (or is no JSON
    object: such a message is untagged). Cached: a tagged stream repeats a few headers."""
    if not header:
        return ""
    try:
        fields = parse_fields(header)
    except ExtHeaderError:
        return ""
    tag = fields.get(DISPATCH_TAG_KEY, "")
    return tag if isinstance(tag, str) else ""

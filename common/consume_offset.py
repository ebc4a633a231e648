"""Youzan's consume offsets, `<type>:<int64>` (docs/protocol.md §3.8): SUB_ADVANCED's fourth
word and the body of `/channel/setoffset`."""

from nsqpy.common.goformat import go_parse_int

CONSUME_OFFSET_TYPES = ("timestamp", "special", "virtual_queue", "msgcount")


def parse_consume_offset(text: str) -> tuple[str, int]:
    """Youzan's `<type>:<int64>` (setoffset's body, SUB_ADVANCED's fourth word); ValueError with
    Youzan's text."""
    parts = text.split(":")
    if len(parts) != 2 or parts[0] not in CONSUME_OFFSET_TYPES:
        raise ValueError(f"invalid consume offset:{text}")
    return parts[0], go_parse_int(parts[1])

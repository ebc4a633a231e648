"""Youzan's consume offsets, `<type>:<int64>` (docs/protocol.md §3.8): SUB_ADVANCED's fourth
word and the body of `/channel/setoffset`."""

from nsqpy.common.goformat import go_quote

CONSUME_OFFSET_TYPES = ("timestamp", "special", "virtual_queue", "msgcount")


def parse_consume_offset(text: str) -> tuple[str, int]:
    """Youzan's `<type>:<int64>` (setoffset's body, SUB_ADVANCED's fourth word); ValueError with
    Youzan's text."""
    parts = text.split(":")
    if len(parts) != 2 or parts[0] not in CONSUME_OFFSET_TYPES:
        raise ValueError(f"invalid consume offset:{text}")
    digits = parts[1]
    unsigned = digits[1:] if digits[:1] in ("+", "-") else digits
    if not (unsigned.isascii() and unsigned.isdigit()):
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(digits)}: invalid syntax")
    value = int(digits)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(digits)}: value out of range")
    return parts[0], value

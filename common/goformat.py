"""Go's text formatting where NSQ error texts use it, so our errors read byte for byte like Go's."""

import json
import math
import re
from decimal import Decimal
from typing import Any

import orjson

_GO_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x5C: "\\\\",
    0x22: '\\"',
}


def go_quote(raw: bytes | str) -> str:
    """Go's `%q` of a string (strconv.Quote): printable runes kept, the rest escaped.

    nsqd formats bad names with `%q` (`E_BAD_TOPIC PUB topic name "a b" is not valid`), and
    names arrive as raw bytes that may not even be UTF-8; Go escapes each invalid byte as `\\xNN`.
    """
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    out = ['"']
    text = data.decode("utf-8", "surrogateescape")
    for char in text:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not valid UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code in _GO_ESCAPES:
            out.append(_GO_ESCAPES[code])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_byte_slice(raw: bytes) -> str:
    """Go's `%v` of a []byte (`[70 73 78]`), which Youzan nsqd prints in some error texts."""
    return "[" + " ".join(str(b) for b in raw) + "]"


def go_text(raw: bytes) -> str:
    """Go's `%s` of a []byte: the bytes as they are. Invalid UTF-8 survives a round trip."""
    return raw.decode("utf-8", "surrogateescape")


_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


def go_atoi(raw: bytes) -> int:
    """Go's strconv.Atoi on 64-bit: optional sign then ASCII digits, nothing else.

    Raises ValueError with Go's error text (`strconv.Atoi: parsing "x": invalid syntax`),
    which Youzan nsqd puts in `E_BAD_PARTITION` replies. Python's int() would also accept
    spaces and underscores, which Go refuses.
    """
    digits = raw[1:] if raw[:1] in (b"+", b"-") else raw
    leading = digits[: len(digits) - len(digits.lstrip(b"0123456789"))]
    # Go's ParseUint reads left to right and reports overflow past uint64 as soon as it
    # happens, so `99999999999999999999x` is out of range, not invalid syntax. Leading zeros
    # are dropped before int(), which refuses strings of more than 4300 digits.
    significant = leading.lstrip(b"0")
    if len(significant) > 20 or (significant and int(significant) > _UINT64_MAX):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(raw)}: value out of range")
    if not digits or len(leading) != len(digits):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(raw)}: invalid syntax")
    value = int(significant or b"0")
    if raw[:1] == b"-":
        value = -value
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"strconv.Atoi: parsing {go_quote(raw)}: value out of range")
    return value


def go_base10(raw: bytes) -> int | None:
    """nsqd's protocol.ByteToBase10: ASCII digits only, no sign; empty is 0. None if invalid.

    Go accumulates in a uint64 that silently wraps, so the result is taken modulo 2**64. The
    digits are converted in pieces because int() refuses strings of more than 4300 digits.
    """
    if raw and not (raw.isdigit() and raw.isascii()):
        return None
    value = 0
    for start in range(0, len(raw), 4000):
        piece = raw[start : start + 4000]
        value = (value * 10 ** len(piece) + int(piece)) & _UINT64_MAX
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
# Go escapes these inside strings, where alone they can appear in JSON text.
_GO_STRING_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def go_parse_int(text: str) -> int:
    """Go's `strconv.ParseInt(text, 10, 64)`: the value, or ValueError with Go's text."""
    unsigned = text[1:] if text[:1] in ("+", "-") else text
    if not (unsigned.isascii() and unsigned.isdigit()):
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: value out of range")
    return value


def go_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """JSON as Go's encoding/json writes it: compact; `<`, `>`, `&`, U+2028 and U+2029
    escaped; invalid UTF-8 as `\\ufffd`; numbers as Go writes them (`1`, not `1.0`; `1e-7`).
    Go sorts the keys of a map (`sort_keys`) and keeps a struct's field order (a dict's order
    here). orjson does the work (eleven times json's C encoder on a /stats of 5,000 topics);
    only floats are rewritten first, and what orjson refuses (an integer past 64 bits, a lone
    surrogate) goes through `json` instead."""
    normalized, plain = _go_numbers(value)
    if not plain:
        return _escaped(_encode_slowly(value, sort_keys))
    try:
        data = orjson.dumps(normalized, option=_ORJSON_SORTED if sort_keys else _ORJSON)
    except TypeError:
        return _escaped(_encode_slowly(value, sort_keys))
    for raw, escape in _GO_BYTE_ESCAPES:
        if raw in data:
            data = data.replace(raw, escape)
    return data


def _escaped(text: str) -> bytes:
    """Go's bytes for JSON text whose strings are escaped already: a lone surrogate, which
    no UTF-8 holds, as U+FFFD."""
    if text.isascii():
        return text.encode("ascii")
    return _SURROGATE.sub(lambda _: "\\ufffd", text).encode("utf-8")


_ORJSON = orjson.OPT_NON_STR_KEYS
_ORJSON_SORTED = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS
# `_GO_STRING_ESCAPES` on orjson's UTF-8: none of these bytes can be part of another character.
_GO_BYTE_ESCAPES = [
    (raw.encode(), escape.encode())
    for raw, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    )
]


class GoNumbers(list):
    """A list whose floats are all as Go writes them already (whole ones are ints, none needs
    an exponent): `go_json` writes it as a list without looking through it (the topics of a
    `/stats` at thousands of topics)."""

    __slots__ = ()


# What `_go_numbers` never changes: checked by type inline, without a call for each.
_NOT_FLOAT = frozenset({str, int, bool, type(None), GoNumbers})


_EXACT_INTEGERS = float(2**53)


def _go_numbers(value: Any) -> tuple[Any, bool]:
    """`value` with every whole float turned into an int, as Go writes them; the same object
    when nothing changed. False when a float needs Go's exponent form, which `json` cannot
    write."""
    kind = type(value)
    if kind is float:
        negative_zero = value == 0 and math.copysign(1.0, value) < 0
        magnitude = abs(value)
        # Past 2**53 a whole float's exact integer is not Go's shortest digits padded with
        # zeros (4.277868496852601e+16 is Go's 42778684968526010).
        if value.is_integer() and magnitude < _EXACT_INTEGERS and not negative_zero:
            return int(value), True
        # Below 1e-4 orjson (as Python's repr) writes an exponent, where Go's goes only below
        # 1e-6: 1.5e-05 is Go's 0.000015.
        return value, not (magnitude < 1e-4 or magnitude >= _EXACT_INTEGERS or math.isnan(value))
    if kind in _NOT_FLOAT:
        return value, True
    if isinstance(value, dict):
        changed = {}
        for key, item in value.items():
            if type(item) in _NOT_FLOAT:
                continue
            new, plain = _go_numbers(item)
            if not plain:
                return value, False
            if new is not item:
                changed[key] = new
        return ({**value, **changed} if changed else value), True
    if isinstance(value, list | tuple):
        items = []
        differs = False
        for item in value:
            if type(item) in _NOT_FLOAT:
                items.append(item)
                continue
            new, plain = _go_numbers(item)
            if not plain:
                return value, False
            differs = differs or new is not item
            items.append(new)
        return (items if differs else value), True
    return value, True


def _encode_slowly(value: Any, sort_keys: bool) -> str:
    """The whole value written piece by piece, for the rare float Go and orjson write
    differently (below 1e-4, from 2**53)."""
    if isinstance(value, dict):
        keys = sorted(value, key=str) if sort_keys else list(value)  # Go sorts keys as text
        inner = ",".join(
            json.dumps(str(k), ensure_ascii=False).translate(_GO_STRING_ESCAPES)
            + ":"
            + _encode_slowly(value[k], sort_keys)
            for k in keys
        )
        return "{" + inner + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_encode_slowly(item, sort_keys) for item in value) + "]"
    if type(value) is float:
        return go_float(value)
    return json.dumps(value, ensure_ascii=False).translate(_GO_STRING_ESCAPES)


def go_float(value: float) -> str:
    """encoding/json's floatEncoder: 'f' format with the shortest digits, 'e' below 1e-6 or
    from 1e21, where Go trims the exponent's leading zero (1e-7, 1e+21)."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value}")
    if value == 0:
        return "0" if math.copysign(1.0, value) > 0 else "-0"
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        mantissa, _, exponent = repr(value).partition("e")  # shortest round-trip digits
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0')}"
    return format(Decimal(repr(value)), "f").removesuffix(".0")

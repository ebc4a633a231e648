"""JSON the way Go's encoding/json writes it, so `/api/*` bodies match Go nsqadmin's byte for
byte: no spaces, `<`, `>` and `&` escaped as `\\u003c`..., U+2028/U+2029 escaped, non-ASCII
kept, floats in the shortest form without a needless `.0` (`1234`, `0.99`, `1e-7`).

Objects keep the order their dict was built in (Go writes struct fields in declaration
order); build Go maps with sorted keys, as Go writes them.
"""

import json
import math
from decimal import Decimal
from typing import Any

_STRING_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def dumps(value: Any) -> str:
    parts: list[str] = []
    _encode(value, parts)
    return "".join(parts)


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False).translate(_STRING_ESCAPES))
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(go_float(value))
    elif isinstance(value, dict):
        out.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                out.append(",")
            _encode(str(key), out)
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


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

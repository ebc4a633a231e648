"""Go's formatting where NSQ error texts use it: %q, %v of []byte, strconv.Atoi, ByteToBase10."""

import json
import math
import re
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nsqpy.common.goformat import (
    GoNumbers,
    go_atoi,
    go_base10,
    go_byte_slice,
    go_json,
    go_quote,
    go_text,
)

# What Go's strconv.Quote (fmt's %q) prints for each input, byte for byte.
GO_QUOTES = [
    (b"", '""'),
    (b"a b", '"a b"'),
    (b'a"b', '"a\\"b"'),
    (b"'", '"\'"'),
    (b"\\", '"\\\\"'),
    (b"\n", '"\\n"'),
    (b"\x00", '"\\x00"'),
    (b"\x07\x08\x0c\r\t\x0b", '"\\a\\b\\f\\r\\t\\v"'),
    (b"\x1b", '"\\x1b"'),
    (b"\x7f", '"\\x7f"'),
    ("é".encode(), '"é"'),
    ("日本".encode(), '"日本"'),
    ("😀".encode(), '"😀"'),
    ("\ufffd".encode(), '"\ufffd"'),  # a real U+FFFD is printable
    # invalid UTF-8: each bad byte as \xNN
    (b"\xff", '"\\xff"'),
    (b"a\xffb", '"a\\xffb"'),
    (b"\xc3", '"\\xc3"'),  # truncated 2-byte sequence
    (b"\xe2\x82a", '"\\xe2\\x82a"'),  # truncated 3-byte sequence
    (b"\xc0\x80", '"\\xc0\\x80"'),  # overlong NUL
    (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # UTF-16 surrogate
    (b"\xf4\x90\x80\x80", '"\\xf4\\x90\\x80\\x80"'),  # beyond U+10FFFF
    # valid but not printable: \u or \U
    ("\u0085".encode(), '"\\u0085"'),  # C1 control
    ("\u00a0".encode(), '"\\u00a0"'),  # no-break space
    ("\u00ad".encode(), '"\\u00ad"'),  # soft hyphen
    ("\u200b".encode(), '"\\u200b"'),
    ("\u2028".encode(), '"\\u2028"'),
    ("\ufeff".encode(), '"\\ufeff"'),
    ("\ue000".encode(), '"\\ue000"'),  # private use
    ("\u0378".encode(), '"\\u0378"'),  # unassigned
    ("\U000e0001".encode(), '"\\U000e0001"'),
]


@pytest.mark.parametrize(("raw", "quoted"), GO_QUOTES)
def test_go_quote(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted
    # The str a parser gets from go_text() quotes the same.
    assert go_quote(go_text(raw)) == quoted


def test_go_quote_of_plain_str() -> None:
    assert go_quote("a b") == '"a b"'
    assert go_quote("é") == '"é"'
    assert go_quote('x"\n') == '"x\\"\\n"'


def test_go_byte_slice() -> None:
    assert go_byte_slice(b"FIN") == "[70 73 78]"
    assert go_byte_slice(b"") == "[]"
    assert go_byte_slice(b"\x00\xff") == "[0 255]"


def test_go_text_round_trips_any_bytes() -> None:
    assert go_text(b"abc") == "abc"
    assert go_text("é".encode()) == "é"
    raw = b"a\xff\xfe\n"
    assert go_text(raw).encode("utf-8", "surrogateescape") == raw


@given(st.binary(max_size=64))
def test_go_text_round_trip_property(raw: bytes) -> None:
    assert go_text(raw).encode("utf-8", "surrogateescape") == raw


@given(st.binary(max_size=64))
def test_go_quote_is_ascii_safe_and_quoted(raw: bytes) -> None:
    quoted = go_quote(raw)
    assert quoted.startswith('"') and quoted.endswith('"')
    # Nothing unprintable survives, so the text always encodes as UTF-8.
    quoted.encode("utf-8")
    assert "\n" not in quoted and "\x00" not in quoted


# -- strconv.Atoi ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"0", 0),
        (b"7", 7),
        (b"-1", -1),
        (b"+42", 42),
        (b"-0", 0),
        (b"007", 7),
        (b"9223372036854775807", 2**63 - 1),
        (b"-9223372036854775808", -(2**63)),
        (b"0" * 5000 + b"12", 12),  # leading zeros, beyond int()'s 4300-digit limit
    ],
)
def test_go_atoi_values(raw: bytes, value: int) -> None:
    assert go_atoi(raw) == value


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"", 'strconv.Atoi: parsing "": invalid syntax'),
        (b"x", 'strconv.Atoi: parsing "x": invalid syntax'),
        (b"+", 'strconv.Atoi: parsing "+": invalid syntax'),
        (b"-", 'strconv.Atoi: parsing "-": invalid syntax'),
        (b"+-1", 'strconv.Atoi: parsing "+-1": invalid syntax'),
        (b"1.0", 'strconv.Atoi: parsing "1.0": invalid syntax'),
        (b"1_000", 'strconv.Atoi: parsing "1_000": invalid syntax'),
        (b" 1", 'strconv.Atoi: parsing " 1": invalid syntax'),
        (b"1\r", 'strconv.Atoi: parsing "1\\r": invalid syntax'),
        (b"0x10", 'strconv.Atoi: parsing "0x10": invalid syntax'),
        ("١".encode(), 'strconv.Atoi: parsing "١": invalid syntax'),
        (b"\xff", 'strconv.Atoi: parsing "\\xff": invalid syntax'),
        (b"9223372036854775808", 'strconv.Atoi: parsing "9223372036854775808": value out of range'),
        (b"-9223372036854775809",
         'strconv.Atoi: parsing "-9223372036854775809": value out of range'),
        (b"18446744073709551616",
         'strconv.Atoi: parsing "18446744073709551616": value out of range'),
        # ParseUint reports overflow when it happens, before it reaches the bad byte ...
        (b"99999999999999999999x",
         'strconv.Atoi: parsing "99999999999999999999x": value out of range'),
        # ... but a bad byte reached while the value still fits a uint64 is a syntax error.
        (b"18446744073709551615x",
         'strconv.Atoi: parsing "18446744073709551615x": invalid syntax'),
        (b"9223372036854775808x",
         'strconv.Atoi: parsing "9223372036854775808x": invalid syntax'),
        (b"1" * 5000, f'strconv.Atoi: parsing "{"1" * 5000}": value out of range'),
    ],
)  # fmt: skip
def test_go_atoi_errors(raw: bytes, text: str) -> None:
    with pytest.raises(ValueError) as caught:
        go_atoi(raw)
    assert str(caught.value) == text


@given(st.integers(-(2**63), 2**63 - 1))
def test_go_atoi_of_any_int64(value: int) -> None:
    assert go_atoi(str(value).encode()) == value


# -- protocol.ByteToBase10 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"", 0),  # Go's loop never runs
        (b"0", 0),
        (b"123", 123),
        (b"000", 0),
        (b"3600000", 3_600_000),
        (b"18446744073709551615", 2**64 - 1),
        # Go accumulates in a uint64 that wraps silently.
        (b"18446744073709551616", 0),
        (b"18446744073709551621", 5),
        (b"9" * 5000, (10**5000 - 1) % 2**64),
    ],
)
def test_go_base10_values(raw: bytes, value: int) -> None:
    assert go_base10(raw) == value


@pytest.mark.parametrize("raw", [b"-1", b"+1", b" 1", b"1 ", b"1a", b"x", "١".encode(), b"\xff"])
def test_go_base10_invalid(raw: bytes) -> None:
    assert go_base10(raw) is None


@given(st.integers(0, 2**70))
def test_go_base10_wraps_like_a_uint64(value: int) -> None:
    assert go_base10(str(value).encode()) == value % 2**64


def test_go_json_writes_numbers_as_go_does():
    """One encoder for nsqd, nsqlookupd and nsqadmin: Go writes a whole float without `.0`."""
    body = {"quantile": 1.0, "p": 0.99, "n": 5, "tiny": 1e-7, "neg_zero": -0.0, "big": 1e16}
    assert go_json(body) == (
        b'{"quantile":1,"p":0.99,"n":5,"tiny":1e-7,"neg_zero":-0,"big":10000000000000000}'
    )
    # Python writes an exponent from 1e-4 down, Go only below 1e-6.
    assert go_json([1.633201177143211e-06, 1.5e-05]) == b"[0.000001633201177143211,0.000015]"
    # Past 2**53, Go's shortest digits padded with zeros, not the float's exact integer.
    assert go_json({"big": 4.277868496852601e16}) == b'{"big":42778684968526010}'
    assert go_json([{"a": [0.5, 2.0]}], sort_keys=True) == b'[{"a":[0.5,2]}]'


def test_go_json_escapes_strings_as_go_does():
    assert go_json({"k": "<a&b>\u2028", "bad": "\udcff"}) == (
        b'{"k":"\\u003ca\\u0026b\\u003e\\u2028","bad":"\\ufffd"}'
    )


def test_go_json_refuses_what_go_refuses():
    with pytest.raises(ValueError, match="unsupported value"):
        go_json({"x": float("nan")})


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)


def _json_module_go_json(value, sort_keys: bool) -> bytes:
    """What Go writes, by the json module alone (the encoder go_json had before orjson)."""
    if isinstance(value, float):
        return go_json(value).decode().encode()  # a lone float: the same path either way
    text = json.dumps(
        _whole_floats(value), sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False
    )
    text = text.translate(
        {
            ord("<"): "\\u003c",
            ord(">"): "\\u003e",
            ord("&"): "\\u0026",
            0x2028: "\\u2028",
            0x2029: "\\u2029",
        }
    )
    text = text.replace(json.dumps(_NEGATIVE_ZERO), "-0")
    return re.sub("[\ud800-\udfff]", "\\\\ufffd", text).encode("utf-8")


# What `_whole_floats` puts for -0.0, for the oracle to write as Go does.
_NEGATIVE_ZERO = "\x00negative zero\x00"


def _whole_floats(value):
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        # Go writes -0.0 as -0 (strconv's 'f' format keeps the sign); json would write 0.
        if value == 0 and math.copysign(1, value) < 0:
            return _NEGATIVE_ZERO
        return int(Decimal(repr(value)))  # Go's shortest digits, padded with zeros
    if isinstance(value, dict):
        # Keys as their text first: Go sorts a map's keys by it (json would sort ints apart).
        return {_key_text(key): _whole_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_floats(item) for item in value]
    return value


def _key_text(key) -> str:
    return key if isinstance(key, str) else json.dumps(key)


def _mixed_keys(value) -> bool:
    """A map whose keys are of two types, which Go's never are."""
    if isinstance(value, dict):
        return len({type(key) for key in value}) > 1 or any(map(_mixed_keys, value.values()))
    if isinstance(value, list):
        return any(map(_mixed_keys, value))
    return False


def _written_apart(value) -> bool:
    """A float the json module writes with an exponent or Go does (below 1e-4, from 1e21)."""
    if isinstance(value, float):
        return value != 0 and not 1e-4 <= abs(value) < 1e21
    if isinstance(value, dict):
        return any(_written_apart(item) for item in value.values())
    if isinstance(value, list):
        return any(_written_apart(item) for item in value)
    return False


@given(_JSON_VALUES, st.booleans())
@example([-0.0], False)  # Go writes -0, as orjson's path does
def test_go_json_writes_what_the_json_module_would(value, sort_keys):
    """orjson writes it; the json module, with Go's escapes and whole floats, is the oracle
    (integers past 64 bits and lone surrogates, which orjson refuses, included)."""
    if _written_apart(value):
        return  # Go's form is not the json module's: test_go_json_writes_numbers_as_go_does
    if sort_keys and _mixed_keys(value):
        return
    try:
        expected = _json_module_go_json(value, sort_keys)
    except TypeError:
        return
    assert go_json(value, sort_keys=sort_keys) == expected


def test_go_numbers_lists_are_written_as_lists():
    assert (
        go_json({"topics": GoNumbers([{"a": 1}, {"b": "x"}])}) == b'{"topics":[{"a":1},{"b":"x"}]}'
    )

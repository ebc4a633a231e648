"""Go time.ParseDuration / Duration.String() parity (values checked against Go 1.21)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.common.duration import (
    MAX_DURATION_NS,
    MIN_DURATION_NS,
    DurationError,
    format_duration,
    format_duration_ns,
    parse_duration,
    parse_duration_ns,
)

NS = 1
US = 1000 * NS
MS = 1000 * US
S = 1000 * MS
M = 60 * S
H = 60 * M

# From Go's time_test.go parseDurationTests, plus the nsqd defaults.
PARSE_CASES = [
    ("0", 0),
    ("5s", 5 * S),
    ("30s", 30 * S),
    ("1478s", 1478 * S),
    ("-5s", -5 * S),
    ("+5s", 5 * S),
    ("-0", 0),
    ("+0", 0),
    ("5.0s", 5 * S),
    ("5.6s", 5 * S + 600 * MS),
    ("5.s", 5 * S),
    (".5s", 500 * MS),
    ("1.0s", 1 * S),
    ("1.00s", 1 * S),
    ("1.004s", 1 * S + 4 * MS),
    ("1.0040s", 1 * S + 4 * MS),
    ("100.00100s", 100 * S + 1 * MS),
    ("10ns", 10 * NS),
    ("11us", 11 * US),
    ("12µs", 12 * US),  # U+00B5 micro sign
    ("12μs", 12 * US),  # U+03BC Greek mu
    ("13ms", 13 * MS),
    ("14s", 14 * S),
    ("15m", 15 * M),
    ("16h", 16 * H),
    ("3h30m", 3 * H + 30 * M),
    ("10.5s4m", 4 * M + 10 * S + 500 * MS),
    ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
    ("1h2m3s4ms5us6ns", 1 * H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
    ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
    ("52763797000ns", 52763797000 * NS),
    ("0.3333333333333333333h", 20 * M),
    ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", MAX_DURATION_NS),
    ("9223372036854775.807us", MAX_DURATION_NS),
    ("9223372036s854ms775us807ns", MAX_DURATION_NS),
    ("-9223372036854775808ns", MIN_DURATION_NS),
    ("-9223372036854775.808us", MIN_DURATION_NS),
    ("-2562047h47m16.854775808s", MIN_DURATION_NS),
    ("0.100000000000000000000h", 6 * M),
    ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
    ("1.0000000001s", 1 * S),  # Go truncates the float64 fraction
    ("300ms", 300 * MS),
    ("-1.5h", -(90 * M)),
    ("2h45m", 2 * H + 45 * M),
    ("1m0s", 1 * M),
    ("1.5us", 1500 * NS),
]


@pytest.mark.parametrize(("text", "ns"), PARSE_CASES)
def test_parse_like_go(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / 1e9


PARSE_ERRORS = [
    ("", 'time: invalid duration ""'),
    ("3", 'time: missing unit in duration "3"'),
    ("5", 'time: missing unit in duration "5"'),
    ("-", 'time: invalid duration "-"'),
    ("s", 'time: invalid duration "s"'),
    (".", 'time: invalid duration "."'),
    ("-.", 'time: invalid duration "-."'),
    (".s", 'time: invalid duration ".s"'),
    ("+.s", 'time: invalid duration "+.s"'),
    ("x", 'time: invalid duration "x"'),
    ("1d", 'time: unknown unit "d" in duration "1d"'),
    ("5q", 'time: unknown unit "q" in duration "5q"'),
    ("0.0", 'time: missing unit in duration "0.0"'),
    ("1s ", 'time: unknown unit "s " in duration "1s "'),
    (" 1s", 'time: invalid duration " 1s"'),
    # Undecodable argv bytes arrive as surrogateescape code points; Go sees the raw bytes.
    ("\udc85\udc85", 'time: invalid duration "\\x85\\x85"'),
    ("\udcffff", 'time: invalid duration "\\xffff"'),
    ("\x85\x85", 'time: invalid duration "\\xc2\\x85\\xc2\\x85"'),
    ("\xffff", 'time: invalid duration "\\xc3\\xbfff"'),
    ("hello \xffff world", 'time: invalid duration "hello \\xc3\\xbfff world"'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("9223372036854775.808us", 'time: invalid duration "9223372036854775.808us"'),
    ("9223372036854ms775us808ns", 'time: invalid duration "9223372036854ms775us808ns"'),
    ("-9223372036854775809ns", 'time: invalid duration "-9223372036854775809ns"'),
    ("3000000h", 'time: invalid duration "3000000h"'),
    ('1"s', 'time: unknown unit "\\"s" in duration "1\\"s"'),
]


@pytest.mark.parametrize(("text", "message"), PARSE_ERRORS)
def test_parse_errors_like_go(text: str, message: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration_ns(text)
    assert str(caught.value) == message


# From Go's time_test.go durationTests, plus the values nsqd prints in --help.
FORMAT_CASES = [
    ("0s", 0),
    ("1ns", 1 * NS),
    ("1.1µs", 1100 * NS),
    ("1.5µs", 1500 * NS),
    ("2.2ms", 2200 * US),
    ("25ms", 25 * MS),
    ("250ms", 250 * MS),
    ("2s", 2 * S),
    ("30s", 30 * S),
    ("45s", 45 * S),
    ("3.3s", 3300 * MS),
    ("1m0s", 1 * M),
    ("5m0s", 5 * M),
    ("10m0s", 10 * M),
    ("15m0s", 15 * M),
    ("4m5s", 4 * M + 5 * S),
    ("4m5.001s", 4 * M + 5001 * MS),
    ("1h0m0s", 1 * H),
    ("5h6m7.001s", 5 * H + 6 * M + 7001 * MS),
    ("8m0.000000001s", 8 * M + 1 * NS),
    ("-1m30s", -(90 * S)),
    ("-1ns", -1),
    ("2562047h47m16.854775807s", MAX_DURATION_NS),
    ("-2562047h47m16.854775808s", MIN_DURATION_NS),
]


@pytest.mark.parametrize(("text", "ns"), FORMAT_CASES)
def test_format_like_go(text: str, ns: int) -> None:
    assert format_duration_ns(ns) == text
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(60.0, "1m0s"), (0.25, "250ms"), (900, "15m0s"), (3600, "1h0m0s"), (2, "2s"), (0, "0s")],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_rejects_what_go_cannot_hold() -> None:
    with pytest.raises(OverflowError):
        format_duration_ns(MAX_DURATION_NS + 1)


@given(st.integers(min_value=MIN_DURATION_NS, max_value=MAX_DURATION_NS))
def test_round_trip_exact_nanoseconds(ns: int) -> None:
    text = format_duration_ns(ns)
    assert parse_duration_ns(text) == ns
    # Go's output uses µ, never "us", and always carries a unit.
    assert text.endswith("s")
    assert "us" not in text


@given(st.integers(min_value=-(2**52), max_value=2**52))
def test_round_trip_through_float_seconds(ns: int) -> None:
    text = format_duration_ns(ns)
    assert format_duration(parse_duration(text)) == text

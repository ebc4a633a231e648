"""Go's `time.ParseDuration` and `time.Duration.String()`, exactly.

nsqd's flags (`--msg-timeout=60s`), its TOML config (`msg_timeout = "1m"`) and its replies
(`--help` defaults, `/config/...`) all speak Go durations, so we parse and print them the way
Go does, including Go's error texts and its rounding of fractions.

A Go duration is an int64 count of nanoseconds. The `*_ns` functions work on that integer and
are exact; `parse_duration` / `format_duration` are the float-seconds convenience forms the rest
of nsqpy uses; a duration survives the trip through float seconds to the nanosecond up to 2**52 ns
(about 52 days), and to float64 precision beyond.
"""

from fractions import Fraction

__all__ = [
    "DurationError",
    "MAX_DURATION_NS",
    "MIN_DURATION_NS",
    "format_duration",
    "format_duration_ns",
    "parse_duration",
    "parse_duration_ns",
]

MAX_DURATION_NS = (1 << 63) - 1
MIN_DURATION_NS = -(1 << 63)

_NANOSECOND = 1
_MICROSECOND = 1000 * _NANOSECOND
_MILLISECOND = 1000 * _MICROSECOND
_SECOND = 1000 * _MILLISECOND
_MINUTE = 60 * _SECOND
_HOUR = 60 * _MINUTE

# Go's unitMap (time/format.go): both the micro sign U+00B5 and Greek mu U+03BC are accepted.
_UNITS = {
    "ns": _NANOSECOND,
    "us": _MICROSECOND,
    "\u00b5s": _MICROSECOND,
    "\u03bcs": _MICROSECOND,
    "ms": _MILLISECOND,
    "s": _SECOND,
    "m": _MINUTE,
    "h": _HOUR,
}

_U63 = 1 << 63


class DurationError(ValueError):
    """A string Go's `time.ParseDuration` would reject; `str()` is Go's error text."""


def _is_digit(c: str) -> bool:
    # Not str.isdigit(): that accepts other scripts' digits, which Go does not.
    return "0" <= c <= "9"


def _quote(s: str) -> str:
    """Go's `time.quote`: like strconv.Quote for ASCII, but every byte of a non-ASCII or
    control character is written as `\\xNN` (time avoids importing strconv)."""
    out = ['"']
    for c in s:
        if ord(c) >= 0x80 or c < " ":
            # A lone surrogate is how Python carries an undecodable argv byte
            # (surrogateescape); Go would see that raw byte.
            if 0xDC80 <= ord(c) <= 0xDCFF:
                raw = bytes([ord(c) - 0xDC00])
            else:
                raw = c.encode("utf-8", "surrogatepass")
            out.extend(f"\\x{b:02x}" for b in raw)
        else:
            if c in '"\\':
                out.append("\\")
            out.append(c)
    out.append('"')
    return "".join(out)


def _invalid(orig: str) -> DurationError:
    return DurationError(f"time: invalid duration {_quote(orig)}")


def parse_duration_ns(text: str) -> int:
    """Parse like Go's `time.ParseDuration`, returning integer nanoseconds.

    Grammar `[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+` with units ns, us/µs/μs, ms, s, m, h; a bare
    `0` (optionally signed) needs no unit. Raises DurationError with Go's exact message.
    """
    orig = text
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    # Go special-cases "0" so that the most common zero needs no unit.
    if s == "0":
        return 0
    if s == "":
        raise _invalid(orig)

    total = 0
    while s:
        if not (s[0] == "." or _is_digit(s[0])):
            raise _invalid(orig)

        # Integer part, [0-9]*; Go's leadingInt fails once it passes 1<<63.
        i = 0
        whole = 0
        while i < len(s) and _is_digit(s[i]):
            if whole > _U63 // 10:
                raise _invalid(orig)
            whole = whole * 10 + ord(s[i]) - 48
            if whole > _U63:
                raise _invalid(orig)
            i += 1
        had_whole = i > 0
        s = s[i:]

        # Fraction, (\.[0-9]*)?; Go's leadingFraction stops gaining precision on overflow
        # instead of failing, and keeps `scale` as a float64.
        frac = 0
        scale = 1.0
        had_frac = False
        if s and s[0] == ".":
            s = s[1:]
            i = 0
            overflow = False
            while i < len(s) and _is_digit(s[i]):
                if not overflow:
                    if frac > (_U63 - 1) // 10:
                        overflow = True
                    else:
                        y = frac * 10 + ord(s[i]) - 48
                        if y > _U63:
                            overflow = True
                        else:
                            frac = y
                            scale *= 10
                i += 1
            had_frac = i > 0
            s = s[i:]
        if not had_whole and not had_frac:
            # "." or ".s": a dot with no digits on either side.
            raise _invalid(orig)

        # Unit: everything up to the next digit or dot.
        i = 0
        while i < len(s) and not (s[i] == "." or _is_digit(s[i])):
            i += 1
        if i == 0:
            raise DurationError(f"time: missing unit in duration {_quote(orig)}")
        unit_text = s[:i]
        s = s[i:]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError(
                f"time: unknown unit {_quote(unit_text)} in duration {_quote(orig)}"
            )

        if whole > _U63 // unit:
            raise _invalid(orig)
        value = whole * unit
        if frac > 0:
            # Go computes the fraction in float64 ("to be nanosecond accurate for fractions
            # of hours") and truncates; doing the same keeps e.g. "1.0000000001s" identical.
            value += int(float(frac) * (float(unit) / scale))
            if value > _U63:
                raise _invalid(orig)
        total += value
        if total > _U63:
            raise _invalid(orig)

    if neg:
        return -total
    if total > MAX_DURATION_NS:
        # 1<<63 is only representable as a negative duration.
        raise _invalid(orig)
    return total


def parse_duration(text: str) -> float:
    """Parse a Go duration string into seconds (`"1m30s"` -> 90.0, `"250ms"` -> 0.25)."""
    return parse_duration_ns(text) / _SECOND


def _fmt_frac(digits: list[str], v: int, prec: int) -> int:
    """Go's fmtFrac: prepend `.ddd` (trailing zeros dropped) of v / 10**prec to `digits`,
    which is built right-to-left, and return v // 10**prec."""
    printed = False
    for _ in range(prec):
        digit = v % 10
        printed = printed or digit != 0
        if printed:
            digits.append(chr(48 + digit))
        v //= 10
    if printed:
        digits.append(".")
    return v


def _fmt_int(digits: list[str], v: int) -> None:
    if v == 0:
        digits.append("0")
        return
    while v > 0:
        digits.append(chr(48 + v % 10))
        v //= 10


def format_duration_ns(ns: int) -> str:
    """Go's `time.Duration.String()` for an int64 nanosecond count.

    `0s`, `1.5µs`, `250ms`, `2s`, `1m0s`, `1h0m0s`: sub-second values use the largest unit
    below a second; longer ones are h/m/s with the seconds carrying any fraction.
    """
    if not MIN_DURATION_NS <= ns <= MAX_DURATION_NS:
        raise OverflowError(f"duration {ns}ns does not fit in Go's int64 time.Duration")
    neg = ns < 0
    u = -ns if neg else ns
    # Built backwards, as Go fills its buffer from the end.
    out: list[str] = ["s"]
    if u < _SECOND:
        if u == 0:
            return "0s"
        if u < _MICROSECOND:
            prec = 0
            out.append("n")
        elif u < _MILLISECOND:
            prec = 3
            out.append("\u00b5")  # Go prints the micro sign U+00B5, never "us".
        else:
            prec = 6
            out.append("m")
        u = _fmt_frac(out, u, prec)
        _fmt_int(out, u)
    else:
        u = _fmt_frac(out, u, 9)
        _fmt_int(out, u % 60)
        u //= 60
        if u > 0:
            out.append("m")
            _fmt_int(out, u % 60)
            u //= 60
            # Go stops at hours: days are not all the same length.
            if u > 0:
                out.append("h")
                _fmt_int(out, u)
    if neg:
        out.append("-")
    return "".join(reversed(out))


def format_duration(seconds: float) -> str:
    """Go's `Duration.String()` for a duration given in seconds (0.25 -> `250ms`)."""
    # Fraction multiplies exactly, so parse_duration's float comes back as the same
    # nanosecond count (seconds * 1e9 in floats can land one nanosecond off).
    return format_duration_ns(round(Fraction(seconds) * _SECOND))

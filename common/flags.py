"""Command-line flags and TOML config the way Go nsqd, nsqlookupd and nsqadmin read them.

Clients' test harnesses start the daemons with Go `flag` syntax (`-tcp-address=127.0.0.1:0`,
`-lookupd-tcp-address 127.0.0.1:4160`, `--snappy`), which argparse does not speak, so this is a
small port of Go's `flag` package (Go 1.21 `flag/flag.go`, FlagSet with ExitOnError, as
`nsqdFlagSet` creates it) plus mreiferson/go-options' `Resolve`, which lays a `--config` TOML
file under the flags.

A daemon declares a table and never touches argv itself::

    FLAGS = FlagSet("nsqd", [
        Flag("config", Kind.STRING, "", "path to config file", config_key=None),
        Flag("mem-queue-size", Kind.INT64, 10000, "number of messages to keep in memory"),
        Flag("lookupd-tcp-address", Kind.STRING_LIST, (), "lookupd TCP address",
             config_key="nsqlookupd_tcp_addresses"),
    ])
    values, explicitly_set, _args = FLAGS.parse_or_exit(sys.argv[1:])
    if values["config"]:
        values = merge(values, explicitly_set, read_config(values["config"], FLAGS), FLAGS)

Values are keyed by the flag name with `-` replaced by `_` (`values["mem_queue_size"]`),
whatever the flag's config key is. Durations are float seconds.
"""

import enum
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple, TextIO

from nsqpy.common.duration import (
    MAX_DURATION_NS,
    MIN_DURATION_NS,
    DurationError,
    format_duration,
    parse_duration,
)
from nsqpy.common.goformat import go_quote

__all__ = [
    "ConfigError",
    "Flag",
    "FlagError",
    "FlagSet",
    "HelpRequested",
    "Kind",
    "Parsed",
    "go_quote",
    "load_config",
    "merge",
    "parse_go_bool",
    "parse_go_float",
    "parse_go_int",
]

# Go's flag package wraps every strconv failure into one of these two (flag.go numError).
_ERR_PARSE = "parse error"
_ERR_RANGE = "value out of range"

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1


class Kind(enum.Enum):
    """What a flag holds; each mirrors one Go flag.Value type."""

    STRING = "string"
    INT = "int"  # Go `int`: 64-bit on every platform NSQ ships for
    INT64 = "int64"
    FLOAT = "float"
    BOOL = "bool"
    DURATION = "duration"  # Go time.Duration; held as float seconds
    STRING_LIST = "string-list"  # nsq's app.StringArray: each use appends one item
    FLOAT_LIST = "float-list"  # nsq's app.FloatArray: comma-separated, kept sorted descending
    VALUE = "value"  # any other flag.Value: the flag supplies `parse`


# The type word Go's PrintDefaults shows after the flag name (flag.UnquoteUsage); bool flags
# show none and every flag.Value that is not a builtin shows "value".
_TYPE_WORDS = {
    Kind.STRING: "string",
    Kind.INT: "int",
    Kind.INT64: "int",
    Kind.FLOAT: "float",
    Kind.BOOL: "",
    Kind.DURATION: "duration",
    Kind.STRING_LIST: "value",
    Kind.FLOAT_LIST: "value",
    Kind.VALUE: "value",
}


# --------------------------------------------------------------------------------------------
# Go strconv, as far as flags need it


class _NumError(ValueError):
    """A strconv failure; `reason` is the text Go's flag package prints for it."""

    def __init__(self, func: str, text: str, reason: str) -> None:
        self.func = func
        self.text = text
        self.reason = reason
        syntax = "invalid syntax" if reason == _ERR_PARSE else reason
        # strconv.NumError.Error(), which go-options passes through in its config errors.
        super().__init__(f"strconv.{func}: parsing {go_quote(text)}: {syntax}")


def _lower(c: str) -> str:
    # Go's strconv `lower`: sets the 0x20 bit, which lowercases ASCII letters only.
    return chr(ord(c) | 0x20)


def _underscore_ok(s: str) -> bool:
    """Go's strconv.underscoreOK: `_` only between digits, or after a base prefix."""
    saw = "^"
    i = 0
    if s and s[0] in "+-":
        s = s[1:]
    hexadecimal = False
    if len(s) >= 2 and s[0] == "0" and _lower(s[1]) in "box":
        i = 2
        saw = "0"  # a base prefix counts as a digit
        hexadecimal = _lower(s[1]) == "x"
    while i < len(s):
        c = s[i]
        i += 1
        if "0" <= c <= "9" or (hexadecimal and "a" <= _lower(c) <= "f"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def _parse_uint(text: str, base: int, func: str, whole: str) -> int:
    """Go's strconv.ParseUint for bitSize 64 (base 0 or 2..36); `whole` is the text named
    in errors (ParseInt reports the signed original)."""
    if text == "":
        raise _NumError(func, whole, _ERR_PARSE)
    base0 = base == 0
    s = text
    if base0:
        # Go literal prefixes: 0b, 0o, 0x, and a bare leading 0 for octal.
        base = 10
        if s[0] == "0":
            if len(s) >= 3 and _lower(s[1]) == "b":
                base, s = 2, s[2:]
            elif len(s) >= 3 and _lower(s[1]) == "o":
                base, s = 8, s[2:]
            elif len(s) >= 3 and _lower(s[1]) == "x":
                base, s = 16, s[2:]
            else:
                base, s = 8, s[1:]
    cutoff = _UINT64_MAX // base + 1
    n = 0
    underscores = False
    for c in s:
        if c == "_" and base0:
            underscores = True
            continue
        if "0" <= c <= "9":
            digit = ord(c) - 48
        elif "a" <= _lower(c) <= "z":
            digit = ord(_lower(c)) - ord("a") + 10
        else:
            raise _NumError(func, whole, _ERR_PARSE)
        if digit >= base:
            raise _NumError(func, whole, _ERR_PARSE)
        # Go reports overflow as soon as it happens, before looking at later characters.
        if n >= cutoff:
            raise _NumError(func, whole, _ERR_RANGE)
        n = n * base + digit
        if n > _UINT64_MAX:
            raise _NumError(func, whole, _ERR_RANGE)
    if underscores and not _underscore_ok(text):
        raise _NumError(func, whole, _ERR_PARSE)
    return n


def parse_go_int(text: str, base: int = 0) -> int:
    """Go's strconv.ParseInt(text, base, 64). Flags use base 0, so `0x1f`, `0o17`, `017`
    (octal!), `0b101` and `1_000` are all accepted, as with Go nsqd; config strings use 10.

    Raises ValueError whose `.reason` is "parse error" or "value out of range"."""
    if text == "":
        raise _NumError("ParseInt", text, _ERR_PARSE)
    unsigned = text
    negative = False
    if text[0] == "+":
        unsigned = text[1:]
    elif text[0] == "-":
        negative = True
        unsigned = text[1:]
    try:
        magnitude = _parse_uint(unsigned, base, "ParseInt", text)
    except _NumError as err:
        if err.reason != _ERR_RANGE:
            raise
        magnitude = _UINT64_MAX
    if not negative and magnitude > _INT64_MAX:
        raise _NumError("ParseInt", text, _ERR_RANGE)
    if negative and magnitude > -_INT64_MIN:
        raise _NumError("ParseInt", text, _ERR_RANGE)
    return -magnitude if negative else magnitude


_TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """Go's strconv.ParseBool: exactly 1 t T TRUE true True / 0 f F FALSE false False."""
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise _NumError("ParseBool", text, _ERR_PARSE)


def _float_special(s: str) -> tuple[float, int] | None:
    """Go's strconv.special: [+-]inf, [+-]infinity, nan (no sign), any case; returns the
    value and how many characters it used."""
    if not s:
        return None
    sign, n_sign = 1.0, 0
    rest = s
    if s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        n_sign = 1
        rest = s[1:]
    elif s[0] in "nN":
        return (math.nan, 3) if s[:3].lower() == "nan" else None
    if not rest or rest[0] not in "iI":
        return None
    common = 0
    for a, b in zip(rest.lower(), "infinity", strict=False):
        if a != b:
            break
        common += 1
    # "inf" or "infinity"; anything in between is "inf" followed by junk.
    if 3 < common < 8:
        common = 3
    if common in (3, 8):
        return sign * math.inf, n_sign + common
    return None


def _float_syntax_ok(s: str) -> bool:
    """Whether Go's strconv.readFloat accepts all of s (decimal or 0x hex with p exponent)."""
    n = len(s)
    i = 0
    if n == 0:
        return False
    if s[0] in "+-":
        i += 1
    base = 10
    exp_char = "e"
    if i + 2 < n and s[i] == "0" and _lower(s[i + 1]) == "x":
        base = 16
        exp_char = "p"
        i += 2
    saw_dot = saw_digits = underscores = False
    while i < n:
        c = s[i]
        if c == "_":
            underscores = True
        elif c == ".":
            if saw_dot:
                break
            saw_dot = True
        elif "0" <= c <= "9" or (base == 16 and "a" <= _lower(c) <= "f"):
            saw_digits = True
        else:
            break
        i += 1
    if not saw_digits:
        return False
    if i < n and _lower(s[i]) == exp_char:
        i += 1
        if i < n and s[i] in "+-":
            i += 1
        if i >= n or not "0" <= s[i] <= "9":
            return False
        while i < n and ("0" <= s[i] <= "9" or s[i] == "_"):
            underscores = underscores or s[i] == "_"
            i += 1
    elif base == 16:
        return False  # Go requires the p exponent on hex floats
    if underscores and not _underscore_ok(s[:i]):
        return False
    return i == n


def parse_go_float(text: str) -> float:
    """Go's strconv.ParseFloat(text, 64): Go float literals, inf/infinity/nan, no spaces.
    Overflow is an error ("value out of range"), as in Go, not a silent infinity."""
    special = _float_special(text)
    if special is not None:
        value, used = special
        if used == len(text):
            return value
        raise _NumError("ParseFloat", text, _ERR_PARSE)
    if not _float_syntax_ok(text):
        raise _NumError("ParseFloat", text, _ERR_PARSE)
    digits = text.replace("_", "")
    try:
        if "x" in digits or "X" in digits:
            value = float.fromhex(digits)
        else:
            value = float(digits)
    except OverflowError:
        raise _NumError("ParseFloat", text, _ERR_RANGE) from None
    if math.isinf(value):
        raise _NumError("ParseFloat", text, _ERR_RANGE)
    return value


def format_go_float(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 64), which is also what `%v` prints:
    shortest digits, exponent form below 1e-4 and from 1e+06 (`1e+06`, `0.25`, `100000`)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # value = 0.DIGITS * 10**point
    prefix = "-" if sign else ""
    exp10 = point - 1
    if exp10 < -4 or exp10 >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{prefix}{digits}{'0' * (point - len(digits))}"
    return f"{prefix}{digits[:point]}.{digits[point:]}"


def _go_v(value: Any) -> str:
    """Go's `%v` of a value decoded from TOML, for messages and for VALUE flags' config."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_go_float(value)
    if isinstance(value, list):
        return "[" + " ".join(_go_v(v) for v in value) + "]"
    return str(value)


# --------------------------------------------------------------------------------------------
# Flags


class FlagError(Exception):
    """A command line Go's flag package rejects; `str()` is Go's exact message. Go prints it,
    then the usage, and exits 2 (FlagSet.parse_or_exit does that)."""


class HelpRequested(Exception):
    """`-h`, `-help`, `--help` (when not defined as flags): Go prints the usage and exits 0."""


class ConfigError(ValueError):
    """A config file that cannot be read, or a key whose value cannot become its flag's type.
    Go nsqd logs these as FATAL and exits 1; `str()` is one line naming the key."""


class Parsed(NamedTuple):
    values: dict[str, Any]
    """Every flag's value, keyed by `Flag.dest`; defaults for those not given."""
    explicitly_set: set[str]
    """`Flag.dest` of each flag given on the command line (Go's FlagSet.Visit)."""
    args: list[str]
    """What follows the flags: after `--`, or from the first argument not starting with `-`."""


@dataclass(frozen=True)
class Flag:
    """One flag, as Go's `flagSet.Int64("mem-queue-size", 10000, "...")` declares it.

    `default` is an int, float, bool, str, a sequence for the list kinds, or for DURATION
    float seconds or a Go duration string (`"1m"`).

    `config_key` is the TOML key (go-options' `cfg` tag); "" means the flag name with `-`
    turned into `_`, None means the config file cannot set it (`config`, `version`: Go's
    Resolve only fills Options fields, and those two are not fields).

    For Kind.VALUE, `parse` turns the text into the value or raises ValueError whose text Go
    would print as the Set error; `bool_flag` makes it take no argument (Go's IsBoolFlag, as
    nsqd's `--tls-required`).

    `default_text` overrides what `--help` shows as `(default ...)`; "" shows none. VALUE
    flags show none unless they give it, since only their own String() would know.
    """

    name: str
    kind: Kind
    default: Any
    help: str
    config_key: str | None = ""
    parse: Callable[[str], Any] | None = None
    bool_flag: bool = False
    default_text: str | None = None
    dest: str = field(init=False)

    def __post_init__(self) -> None:
        if not self.name or self.name[0] == "-" or "=" in self.name:
            raise ValueError(f"flag name {self.name!r} is not valid")  # Go panics likewise
        if self.kind is Kind.VALUE and self.parse is None:
            raise ValueError(f"flag {self.name}: Kind.VALUE needs a parse function")
        if self.bool_flag and self.kind is not Kind.VALUE:
            raise ValueError(f"flag {self.name}: bool_flag is for Kind.VALUE (use Kind.BOOL)")
        object.__setattr__(self, "dest", self.name.replace("-", "_"))
        if self.config_key == "":
            object.__setattr__(self, "config_key", self.dest)
        object.__setattr__(self, "default", _normalize_default(self))

    @property
    def takes_no_argument(self) -> bool:
        return self.kind is Kind.BOOL or self.bool_flag

    def initial(self) -> Any:
        """A fresh copy of the default (lists are copied so that appends stay local)."""
        if self.kind in (Kind.STRING_LIST, Kind.FLOAT_LIST):
            return list(self.default)
        return self.default

    def default_string(self) -> str:
        """Go's DefValue: the default through the flag.Value's String()."""
        if self.default_text is not None:
            return self.default_text
        return _value_string(self.kind, self.default)

    def help_default(self) -> str:
        """The ` (default ...)` suffix of PrintDefaults, or "" when Go omits it: when the
        default prints the same as the type's zero value (flag.isZeroValue)."""
        text = self.default_string()
        if self.default_text is None:
            zero = "" if self.kind is Kind.VALUE else _value_string(self.kind, _ZEROS[self.kind])
            if text == zero:
                return ""
        elif text == "":
            return ""
        if self.kind is Kind.STRING:
            return f" (default {go_quote(text)})"
        return f" (default {text})"


_ZEROS: dict[Kind, Any] = {
    Kind.STRING: "",
    Kind.INT: 0,
    Kind.INT64: 0,
    Kind.FLOAT: 0.0,
    Kind.BOOL: False,
    Kind.DURATION: 0.0,
    Kind.STRING_LIST: (),
    Kind.FLOAT_LIST: (),
    Kind.VALUE: None,
}


def _value_string(kind: Kind, value: Any) -> str:
    """The String() of Go's flag.Value for this kind."""
    if kind is Kind.BOOL:
        return "true" if value else "false"
    if kind is Kind.DURATION:
        return format_duration(value)
    if kind is Kind.FLOAT:
        return format_go_float(value)
    if kind is Kind.STRING_LIST:
        return ",".join(value)  # app.StringArray.String
    if kind is Kind.FLOAT_LIST:
        return ",".join(f"{v:f}" for v in value)  # app.FloatArray.String uses %f
    if kind is Kind.VALUE:
        return ""
    return str(value)


def _normalize_default(flag: Flag) -> Any:
    kind, default = flag.kind, flag.default
    if kind is Kind.DURATION:
        return parse_duration(default) if isinstance(default, str) else float(default)
    if kind is Kind.FLOAT:
        return float(default)
    if kind is Kind.STRING_LIST:
        return tuple(str(v) for v in default)
    if kind is Kind.FLOAT_LIST:
        return tuple(float(v) for v in default)
    if kind in (Kind.INT, Kind.INT64) and (
        isinstance(default, bool) or not isinstance(default, int)
    ):
        raise TypeError(f"flag {flag.name}: default {default!r} is not an int")
    if kind is Kind.BOOL and not isinstance(default, bool):
        raise TypeError(f"flag {flag.name}: default {default!r} is not a bool")
    if kind is Kind.STRING and not isinstance(default, str):
        raise TypeError(f"flag {flag.name}: default {default!r} is not a str")
    return default


def _set_value(flag: Flag, current: Any, text: str) -> Any:
    """Go's flag.Value.Set: the flag's new value from one command-line occurrence.
    Raises ValueError whose str() Go would print after `invalid value ... :`."""
    kind = flag.kind
    try:
        if kind is Kind.STRING:
            return text
        if kind in (Kind.INT, Kind.INT64):
            return parse_go_int(text, 0)
        if kind is Kind.FLOAT:
            return parse_go_float(text)
        if kind is Kind.BOOL:
            return parse_go_bool(text)
        if kind is Kind.DURATION:
            try:
                return parse_duration(text)
            except DurationError:
                # Go's durationValue.Set replaces time's message with errParse.
                raise ValueError(_ERR_PARSE) from None
        if kind is Kind.STRING_LIST:
            return [*current, text]
        if kind is Kind.FLOAT_LIST:
            # app.FloatArray.Set: split on commas (no trimming), append, sort descending.
            added = [parse_go_float(part) for part in text.split(",")]
            return sorted([*current, *added], reverse=True)
    except _NumError as err:
        raise ValueError(err.reason) from None
    assert flag.parse is not None
    return flag.parse(text)


class FlagSet:
    """A named set of flags: Go's `flag.NewFlagSet(name, flag.ExitOnError)` plus its table."""

    def __init__(self, name: str, flags: Iterable[Flag]) -> None:
        self.name = name
        self.flags: dict[str, Flag] = {}
        dests: set[str] = set()
        for flag in flags:
            if flag.name in self.flags:
                raise ValueError(f"{name} flag redefined: {flag.name}")  # Go's panic text
            if flag.dest in dests:
                raise ValueError(f"flags of {name} collide on the key {flag.dest!r}")
            self.flags[flag.name] = flag
            dests.add(flag.dest)

    def __getitem__(self, name: str) -> Flag:
        return self.flags[name]

    def defaults(self) -> dict[str, Any]:
        return {flag.dest: flag.initial() for flag in self.flags.values()}

    def usage(self) -> str:
        """Go's defaultUsage: `Usage of NAME:` and then flag.PrintDefaults, flags sorted."""
        lines = [f"Usage of {self.name}:\n" if self.name else "Usage:\n"]
        for name in sorted(self.flags):
            flag = self.flags[name]
            type_word, text = _unquote_usage(flag)
            head = f"  -{name}"
            if type_word:
                head += " " + type_word
            # Go puts a one-letter bool flag's help on the same line ("  -x\thelp").
            if len(head.encode()) <= 4:
                head += "\t"
            else:
                head += "\n    \t"
            text = text.replace("\n", "\n    \t")
            lines.append(f"{head}{text}{flag.help_default()}\n")
        return "".join(lines)

    def parse(self, argv: Iterable[str]) -> Parsed:
        """Parse like Go's FlagSet.Parse; raise FlagError or HelpRequested where Go would
        print and exit. Unlike argparse, parsing stops at the first non-flag argument."""
        values = self.defaults()
        explicitly_set: set[str] = set()
        args = list(argv)
        while args:
            arg = args[0]
            if len(arg) < 2 or arg[0] != "-":
                break  # the first non-flag (including a lone "-") ends the flags
            dashes = 1
            if arg[1] == "-":
                dashes = 2
                if len(arg) == 2:
                    args.pop(0)  # "--" ends the flags and is consumed
                    break
            name = arg[dashes:]
            if not name or name[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            args.pop(0)
            has_value = False
            value = ""
            eq = name.find("=", 1)
            if eq > 0:
                name, value, has_value = name[:eq], name[eq + 1 :], True
            flag = self.flags.get(name)
            if flag is None:
                if name in ("help", "h"):
                    raise HelpRequested(self.usage())
                raise FlagError(f"flag provided but not defined: -{name}")
            current = values[flag.dest]
            if flag.takes_no_argument:
                # A bool flag never takes the next argument: `-snappy false` leaves snappy
                # true and stops parsing at "false". Only `-snappy=false` turns it off.
                if has_value:
                    try:
                        values[flag.dest] = _set_value(flag, current, value)
                    except ValueError as err:
                        raise FlagError(
                            f"invalid boolean value {go_quote(value)} for -{name}: {err}"
                        ) from None
                else:
                    try:
                        values[flag.dest] = _set_value(flag, current, "true")
                    except ValueError as err:
                        raise FlagError(f"invalid boolean flag {name}: {err}") from None
            else:
                if not has_value and args:
                    # Taken even if it looks like a flag: `-data-path -x` sets "-x".
                    value = args.pop(0)
                    has_value = True
                if not has_value:
                    raise FlagError(f"flag needs an argument: -{name}")
                try:
                    values[flag.dest] = _set_value(flag, current, value)
                except ValueError as err:
                    raise FlagError(
                        f"invalid value {go_quote(value)} for flag -{name}: {err}"
                    ) from None
            explicitly_set.add(flag.dest)
        return Parsed(values, explicitly_set, args)

    def parse_or_exit(
        self, argv: Iterable[str], *, allow_args: bool = True, stderr: TextIO | None = None
    ) -> Parsed:
        """parse(), with Go's ExitOnError handling: for an error print it and the usage to
        stderr and exit 2; for -h/-help print the usage to stderr and exit 0.

        Go nsqd silently ignores arguments after the flags; `allow_args=False` instead treats
        them as an error (exit 2)."""
        out = sys.stderr if stderr is None else stderr
        try:
            parsed = self.parse(argv)
            if parsed.args and not allow_args:
                raise FlagError(f"unexpected argument: {parsed.args[0]}")
        except HelpRequested as help_text:
            out.write(str(help_text))
            out.flush()
            sys.exit(0)
        except FlagError as err:
            out.write(f"{err}\n{self.usage()}")
            out.flush()
            sys.exit(2)
        return parsed

    def unknown_config_keys(self, config: Mapping[str, Any]) -> list[str]:
        """Config keys no flag reads (Go nsqd would ignore them silently)."""
        known = {flag.config_key for flag in self.flags.values()}
        return sorted(key for key in config if key not in known)

    def describe_unknown_config_key(self, key: str) -> str:
        """`"key"`, with what was probably meant when it is a flag's name rather than its
        config key (`lookupd_tcp_address` for `nsqlookupd_tcp_addresses`)."""
        flag = self.flags.get(key.replace("_", "-"))
        if flag is None:
            return f'"{key}"'
        if flag.config_key is None:
            return f'"{key}" (--{flag.name} cannot be set in a config file)'
        return f'"{key}" (the config key of --{flag.name} is "{flag.config_key}")'


def _unquote_usage(flag: Flag) -> tuple[str, str]:
    """Go's flag.UnquoteUsage: a `back-quoted` word in the help names the argument (and loses
    its quotes); otherwise the type word."""
    text = flag.help
    start = text.find("`")
    if start >= 0:
        end = text.find("`", start + 1)
        if end >= 0:
            word = text[start + 1 : end]
            return word, text[:start] + word + text[end + 1 :]
    if flag.takes_no_argument:
        return "", text
    return _TYPE_WORDS[flag.kind], text


# --------------------------------------------------------------------------------------------
# Config file


def load_config(path: str) -> dict[str, Any]:
    """Read a TOML config file (Go nsqd uses BurntSushi/toml into map[string]interface{})."""
    import tomllib  # only with --config: half a MiB resident otherwise

    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as err:
        # Go: logFatal("failed to load config file %s - %s", configFile, err)
        raise ConfigError(f"failed to load config file {path} - {err}") from None


def read_config(path: str, flagset: FlagSet) -> dict[str, Any]:
    """`load_config`, refusing a key that no flag reads: a misspelt or misplaced key would
    otherwise be ignored silently (as Go does) and the daemon run with a setting nobody chose.
    ConfigError names every such key."""
    config = load_config(path)
    unknown = flagset.unknown_config_keys(config)
    if unknown:
        described = ", ".join(flagset.describe_unknown_config_key(key) for key in unknown)
        noun = "key" if len(unknown) == 1 else "keys"
        raise ConfigError(f"failed to load config file {path} - unknown {noun} {described}")
    return config


def merge(
    values: Mapping[str, Any],
    explicitly_set: Iterable[str],
    config: Mapping[str, Any],
    flagset: FlagSet,
) -> dict[str, Any]:
    """Lay a config file under the command line, as go-options' Resolve does: a flag given on
    the command line wins, else the config key, else the flag default. Keys that no flag
    reads are ignored (as Go does). Returns a new dict; raises ConfigError."""
    explicit = set(explicitly_set)
    merged = dict(values)
    for flag in flagset.flags.values():
        key = flag.config_key
        if key is None or flag.dest in explicit or key not in config:
            continue
        merged[flag.dest] = _coerce_config(flag, key, config[key])
    return merged


_GO_TYPE_NAMES = {
    bool: "bool",
    int: "int64",
    float: "float64",
    str: "string",
    list: "[]interface {}",
}


def _go_type(value: Any) -> str:
    return _GO_TYPE_NAMES.get(
        type(value), "map[string]interface {}" if isinstance(value, dict) else type(value).__name__
    )


def _coerce_config(flag: Flag, key: str, value: Any) -> Any:
    """go-options' coerce(): turn a TOML value into the flag's type, or ConfigError.

    Where Go accepts a value we give it the same meaning; where Go fails, panics or silently
    makes nonsense of it (an int for a string, a non-list for a list) we refuse, except for
    ints where a float is wanted, which mean the same number."""

    def fail(reason: str) -> ConfigError:
        return ConfigError(f"failed to coerce config value {_go_v(value)} for {key} - {reason}")

    kind = flag.kind
    try:
        if kind is Kind.STRING:
            if isinstance(value, str):
                return value
        elif kind in (Kind.INT, Kind.INT64):
            if isinstance(value, str):
                return parse_go_int(value, 10)  # Go: strconv.ParseInt(v, 10, 64), no 0x
            if isinstance(value, int) and not isinstance(value, bool):
                if not _INT64_MIN <= value <= _INT64_MAX:
                    raise fail("value out of range")
                return value
            raise fail(f"invalid int64 value type {_go_type(value)}")
        elif kind is Kind.FLOAT:
            if isinstance(value, str):
                return parse_go_float(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
            raise fail(f"invalid float64 value type {_go_type(value)}")
        elif kind is Kind.BOOL:
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                return parse_go_bool(value)
            if isinstance(value, int):
                # go-options coerceBool returns `v == 0` for an int, so Go reads 1 as false.
                # Rather than copy that, refuse it.
                raise fail("an integer is ambiguous for a boolean; use true or false")
            raise fail(f"invalid bool value type {_go_type(value)}")
        elif kind is Kind.DURATION:
            if isinstance(value, str):
                return parse_duration(value)
            if isinstance(value, int) and not isinstance(value, bool):
                # go-options coerceDuration: "treat like ms" (msg_timeout = 60000 is 1m0s).
                ns = value * 1_000_000
                if not MIN_DURATION_NS <= ns <= MAX_DURATION_NS:
                    raise fail("value out of range")
                return ns / 1e9
            raise fail(f"invalid time.Duration value type {_go_type(value)}")
        elif kind is Kind.STRING_LIST:
            if isinstance(value, str):
                return value.split(",")  # go-options coerceStringSlice
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return list(value)
        elif kind is Kind.FLOAT_LIST:
            if isinstance(value, str):
                # go-options coerceFloat64Slice trims each part (the flag does not).
                return [parse_go_float(part.strip()) for part in value.split(",")]
            if isinstance(value, list) and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in value
            ):
                return [float(v) for v in value]
        elif kind is Kind.VALUE:
            # nsqd's cfg.Validate feeds fmt.Sprintf("%v", v) to the option's Set.
            if isinstance(value, str | int | float):
                assert flag.parse is not None
                return flag.parse(_go_v(value))
    except ConfigError:
        raise
    except (ValueError, OverflowError) as err:
        raise fail(str(err)) from None
    raise fail(f"invalid {kind.value} value type {_go_type(value)}")

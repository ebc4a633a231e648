"""go-nsq Config passthrough: the tools' repeatable `--consumer-opt` and `--producer-opt`.

Each value is go-nsq's `ConfigFlag` syntax, `key,value` (`key` alone sets a boolean option to
true; `key=value` is accepted too when there is no comma), with go-nsq's option names (`-` may
stand for `_`), types, ranges and error texts (`invalid option <key>`, `invalid <key> ! v > max`,
`failed to coerce option ...`). What this blocking client can honour is applied: IDENTIFY fields
(`client_id`, `hostname`, `user_agent`, `heartbeat_interval`, `sample_rate`,
`output_buffer_size`, `output_buffer_timeout`, `msg_timeout`), `max_in_flight` (RDY),
`lookupd_poll_interval`, and TLS and AUTH (`tls_v1`, `tls_root_ca_file`, `tls_cert`,
`tls_key`, `tls_insecure_skip_verify`, `tls_min_version`, `auth_secret`: `security`, an
nsqpy.client.security.Security). The other options go-nsq knows (backoff, timeouts, requeue
delays, jitter, `max_attempts`, ...) are accepted and have no effect; deflate and snappy,
which this client does not speak, and `tls_config` (a Go value) are refused unless given
their "off" value.
"""

import logging
from collections.abc import Iterable
from typing import Any

from nsqpy.client.security import TLS_VERSIONS, Security, SecurityError
from nsqpy.common.duration import DurationError, format_duration_ns, parse_duration_ns
from nsqpy.common.flags import parse_go_bool, parse_go_float, parse_go_int

__all__ = ["NsqOptions", "OptionError", "consumer_settings", "nsq_options"]

_MS = 1_000_000  # nanoseconds
_SECOND = 1_000_000_000
_MINUTE = 60 * _SECOND
_HOUR = 60 * _MINUTE


class OptionError(ValueError):
    """An option go-nsq's Config.Set (or this client) refuses; the text is Go's."""


# go-nsq (v1.1) Config: option -> (type, min, max). Types: "duration" (ns), "int", "uint",
# "float", "bool", "string", "backoff", "addr" (net.Addr: go-nsq cannot coerce a string).
_GO_NSQ_OPTIONS: dict[str, tuple[str, int | float | None, int | float | None]] = {
    "dial_timeout": ("duration", None, None),
    "read_timeout": ("duration", 100 * _MS, 5 * _MINUTE),
    "write_timeout": ("duration", 100 * _MS, 5 * _MINUTE),
    "local_addr": ("addr", None, None),
    "lookupd_poll_interval": ("duration", 10 * _MS, 5 * _MINUTE),
    "lookupd_poll_jitter": ("float", 0.0, 1.0),
    "max_requeue_delay": ("duration", 0, _HOUR),
    "default_requeue_delay": ("duration", 0, _HOUR),
    "backoff_strategy": ("backoff", None, None),
    "max_backoff_duration": ("duration", 0, _HOUR),
    "backoff_multiplier": ("duration", 0, _HOUR),
    "max_attempts": ("uint", 0, 65535),
    "low_rdy_idle_timeout": ("duration", _SECOND, 5 * _MINUTE),
    "low_rdy_timeout": ("duration", _SECOND, 5 * _MINUTE),
    "rdy_redistribute_interval": ("duration", _MS, 5 * _SECOND),
    "client_id": ("string", None, None),
    "hostname": ("string", None, None),
    "user_agent": ("string", None, None),
    "heartbeat_interval": ("duration", None, None),
    "sample_rate": ("int", 0, 99),
    "tls_v1": ("bool", None, None),
    "tls_config": ("string", None, None),  # a *tls.Config in go-nsq
    "tls_root_ca_file": ("string", None, None),
    "tls_insecure_skip_verify": ("bool", None, None),
    "tls_cert": ("string", None, None),
    "tls_key": ("string", None, None),
    "tls_min_version": ("string", None, None),
    "deflate": ("bool", None, None),
    "deflate_level": ("int", 1, 9),
    "snappy": ("bool", None, None),
    "output_buffer_size": ("int", None, None),
    "output_buffer_timeout": ("duration", None, None),
    "max_in_flight": ("int", 0, None),
    "msg_timeout": ("duration", 0, None),
    "auth_secret": ("string", None, None),
}

# Sent in IDENTIFY: strings and integers as they are, durations in milliseconds (as go-nsq).
_IDENTIFY_OPTIONS = (
    "client_id",
    "hostname",
    "user_agent",
    "heartbeat_interval",
    "sample_rate",
    "output_buffer_size",
    "output_buffer_timeout",
    "msg_timeout",
)
# Valid for go-nsq but needing compression, which this client does not speak, or a Go value:
# refused unless given their "off" value.
_UNSUPPORTED = {"tls_config": "", "deflate": False, "snappy": False}
# go-nsq's TLS and AUTH options, the fields of a Security.
_SECURITY_OPTIONS = (
    "tls_v1",
    "tls_root_ca_file",
    "tls_cert",
    "tls_key",
    "tls_insecure_skip_verify",
    "tls_min_version",
    "auth_secret",
)


def _go_value(kind: str, value) -> str:
    """A coerced value the way go-nsq's errors print it (%v)."""
    if kind == "duration":
        return format_duration_ns(value)
    if kind == "float":
        return repr(value).removesuffix(".0")
    return str(value)


def _coerce(option: str, kind: str, raw: str | None):
    """go-nsq's coerce() of a ConfigFlag value: a string, or boolean true when no value."""
    shown = "true" if raw is None else raw

    def fail(reason: str) -> OptionError:
        return OptionError(f"failed to coerce option {option} ({shown}) - {reason}")

    if kind == "addr":
        raise fail("invalid type net.Addr")
    if kind == "bool":
        if raw is None:
            return True
        try:
            return parse_go_bool(raw)
        except ValueError as error:
            raise fail(str(error)) from None
    if kind == "string":
        return "%!s(bool=true)" if raw is None else raw
    if raw is None:
        raise fail("invalid value type")
    try:
        if kind == "duration":
            return parse_duration_ns(raw)
        if kind == "float":
            return parse_go_float(raw)
        if kind == "uint" and raw.startswith(("-", "+")):
            raise ValueError(f'strconv.ParseUint: parsing "{raw}": invalid syntax')
        if kind in ("int", "uint"):
            return parse_go_int(raw, 10)
        if raw not in ("exponential", "full_jitter"):  # backoff
            raise ValueError(f"invalid backoff strategy ({raw})")
        return raw
    except (ValueError, DurationError) as error:
        raise fail(str(error)) from None


class NsqOptions:
    """The options of one `--consumer-opt`/`--producer-opt` list, checked as go-nsq does."""

    def __init__(self, options: Iterable[str] = (), flag: str = "consumer-opt") -> None:
        self.settings: dict[str, Any] = {}
        for text in options:
            try:
                self._set(text)
            except OptionError as error:
                # Go's flag package wraps a flag.Value's Set error this way.
                raise OptionError(f'invalid value "{text}" for flag -{flag}: {error}') from None
        try:
            self.security = Security(
                **{name: self.settings[name] for name in _SECURITY_OPTIONS if name in self.settings}
            ).check()
        except SecurityError as error:
            raise OptionError(f"-{flag}: {error}") from None
        heartbeat = self.settings.get("heartbeat_interval", 30 * _SECOND)
        read_timeout = self.settings.get("read_timeout", 60 * _SECOND)
        if heartbeat > read_timeout:  # go-nsq's Config.Validate
            raise OptionError(
                f"HeartbeatInterval {format_duration_ns(heartbeat)} must be less than "
                f"ReadTimeout {format_duration_ns(read_timeout)}"
            )

    def _set(self, text: str) -> None:
        if "," in text:
            key, raw = text.split(",", 1)
        elif "=" in text:
            key, raw = text.split("=", 1)
        else:
            key, raw = text, None
        option = key.replace("-", "_")
        if option not in _GO_NSQ_OPTIONS:
            raise OptionError(f"invalid option {option}")
        kind, low, high = _GO_NSQ_OPTIONS[option]
        value = _coerce(option, kind, raw)
        if low is not None and value < low:
            raise OptionError(
                f"invalid {option} ! {_go_value(kind, value)} < {_go_value(kind, low)}"
            )
        if high is not None and value > high:
            raise OptionError(
                f"invalid {option} ! {_go_value(kind, value)} > {_go_value(kind, high)}"
            )
        if option == "tls_min_version" and value not in TLS_VERSIONS:
            raise OptionError(f"ERROR: {value} is not a tls version")
        if option in _UNSUPPORTED and value != _UNSUPPORTED[option]:
            raise OptionError(f"option {option} is not supported by this client")
        self.settings[option] = value

    def identify(self, user_agent: str = "") -> dict:
        """The IDENTIFY fields: `user_agent` (the tool's, unless an option sets one), then
        every IDENTIFY option given; durations in milliseconds, as go-nsq sends them."""
        fields: dict[str, object] = {"user_agent": user_agent} if user_agent else {}
        for option in _IDENTIFY_OPTIONS:
            if option in self.settings:
                value = self.settings[option]
                if _GO_NSQ_OPTIONS[option][0] == "duration":
                    value = value // _MS
                fields[option] = value
        return fields

    @property
    def max_in_flight(self) -> int | None:
        return self.settings.get("max_in_flight")

    @property
    def lookupd_poll_interval(self) -> float | None:
        interval = self.settings.get("lookupd_poll_interval")
        return None if interval is None else interval / _SECOND


def nsq_options(log: logging.Logger, values: dict, flag: str = "consumer-opt") -> NsqOptions:
    """The parsed --consumer-opt (or --producer-opt) values; logs and exits 1 on a bad one."""
    from nsqpy.tools._common import fatal

    try:
        return NsqOptions(values.get(flag.replace("-", "_")) or (), flag)
    except OptionError as error:
        fatal(log, "%s", error)
        raise  # not reached: fatal() exits


def consumer_settings(log: logging.Logger, values: dict, user_agent: str) -> dict:
    """ConsumerGroup keyword arguments from --max-in-flight and --consumer-opt. An explicit
    --max-in-flight wins over a `max_in_flight` option (Go sets it after the options)."""
    options = nsq_options(log, values, "consumer-opt")
    max_in_flight = values.get("max_in_flight", 200)
    explicit = values.get("_explicit", ())
    if options.max_in_flight is not None and "max_in_flight" not in explicit:
        max_in_flight = options.max_in_flight
    settings: dict = {
        "max_in_flight": max_in_flight,
        "identify": options.identify(user_agent),
        "security": options.security,
    }
    if options.lookupd_poll_interval is not None:
        settings["lookupd_poll_interval"] = options.lookupd_poll_interval
    return settings

"""Go `flag` parity for nsqpy.common.flags, against nsqd v1.3.0's real flag table and help text."""

import io
import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.common.flags import (
    ConfigError,
    Flag,
    FlagError,
    FlagSet,
    HelpRequested,
    Kind,
    go_quote,
    load_config,
    merge,
    parse_go_bool,
    read_config,
)
from tests.reference import REFERENCE_DIR

REFERENCE = REFERENCE_DIR
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def parse_log_level(text: str) -> str:
    # A stand-in for nsqd's lg.LogLevel.Set; the daemon owns the real one.
    level = text.lower()
    if level not in ("debug", "info", "warn", "error", "fatal"):
        raise ValueError(f"invalid log level '{text}'")
    return level


def parse_tls_required(text: str) -> str:
    # nsqd's tlsRequiredOption.Set: "tcp-https" or anything strconv.ParseBool takes.
    if text.lower() == "tcp-https":
        return "tcp-https"
    return "true" if parse_go_bool(text.lower()) else "false"


def parse_tls_min_version(text: str) -> str:
    versions = ("tls1.0", "tls1.1", "tls1.2", "tls1.3")
    if text.lower() not in versions:
        raise ValueError(f"unknown tlsVersionOption {go_quote(text.lower())}")
    return text.lower()


def nsqd_flagset() -> FlagSet:
    """nsqd v1.3.0's nsqdFlagSet, with the reference machine's hostname "vm" (node-id 617)."""
    INT, I64, S, B, D = Kind.INT, Kind.INT64, Kind.STRING, Kind.BOOL, Kind.DURATION
    return FlagSet(
        "nsqd",
        [
            Flag("version", B, False, "print version string", config_key=None),
            Flag("config", S, "", "path to config file", config_key=None),
            Flag(
                "log-level",
                Kind.VALUE,
                "info",
                "set log verbosity: debug, info, warn, error, or fatal",
                parse=parse_log_level,
                default_text="INFO",
            ),
            Flag("log-prefix", S, "[nsqd] ", "log message prefix"),
            Flag("verbose", B, False, "[deprecated] has no effect, use --log-level"),
            Flag(
                "node-id",
                I64,
                617,
                "unique part for message IDs, (int) in range [0,1024) "
                "(default is hash of hostname)",
                config_key="id",
            ),
            Flag("worker-id", B, False, "[deprecated] use --node-id"),
            Flag(
                "https-address",
                S,
                "0.0.0.0:4152",
                "<addr>:<port> to listen on for HTTPS clients",
            ),
            Flag(
                "http-address",
                S,
                "0.0.0.0:4151",
                "address to listen on for HTTP clients (<addr>:<port> for TCP/IP or <path> for "
                "unix socket)",
            ),
            Flag(
                "tcp-address",
                S,
                "0.0.0.0:4150",
                "address to listen on for TCP clients (<addr>:<port> for TCP/IP or <path> for "
                "unix socket)",
            ),
            Flag(
                "auth-http-address",
                Kind.STRING_LIST,
                (),
                "<addr>:<port> or a full url to query auth server (may be given multiple times)",
                config_key="auth_http_addresses",
            ),
            Flag(
                "broadcast-address",
                S,
                "vm",
                "address that will be registered with lookupd (defaults to the OS hostname)",
            ),
            Flag(
                "broadcast-tcp-port",
                INT,
                0,
                "TCP port that will be registered with lookupd (defaults to the TCP port that "
                "this nsqd is listening on)",
            ),
            Flag(
                "broadcast-http-port",
                INT,
                0,
                "HTTP port that will be registered with lookupd (defaults to the HTTP port that "
                "this nsqd is listening on)",
            ),
            Flag(
                "lookupd-tcp-address",
                Kind.STRING_LIST,
                (),
                "lookupd TCP address (may be given multiple times)",
                config_key="nsqlookupd_tcp_addresses",
            ),
            Flag("http-client-connect-timeout", D, "2s", "timeout for HTTP connect"),
            Flag("http-client-request-timeout", D, "5s", "timeout for HTTP request"),
            Flag("data-path", S, "", "path to store disk-backed messages"),
            Flag(
                "mem-queue-size",
                I64,
                10000,
                "number of messages to keep in memory (per topic/channel)",
            ),
            Flag(
                "max-bytes-per-file",
                I64,
                104857600,
                "number of bytes per diskqueue file before rolling",
            ),
            Flag("sync-every", I64, 2500, "number of messages per diskqueue fsync"),
            Flag("sync-timeout", D, 2.0, "duration of time per diskqueue fsync"),
            Flag(
                "queue-scan-worker-pool-max",
                INT,
                4,
                "max concurrency for checking in-flight and deferred message timeouts",
            ),
            Flag(
                "queue-scan-selection-count",
                INT,
                20,
                "number of channels to check per cycle (every 100ms) for in-flight and "
                "deferred timeouts",
            ),
            Flag(
                "msg-timeout",
                D,
                "1m",
                "default duration to wait before auto-requeing a message",
            ),
            Flag("max-msg-timeout", D, "15m", "maximum duration before a message will timeout"),
            Flag("max-msg-size", I64, 1048576, "maximum size of a single message in bytes"),
            Flag("max-req-timeout", D, "1h", "maximum requeuing timeout for a message"),
            Flag("max-body-size", I64, 5242880, "maximum size of a single command body"),
            Flag(
                "max-heartbeat-interval",
                D,
                60,
                "maximum client configurable duration of time between client heartbeats",
            ),
            Flag("max-rdy-count", I64, 2500, "maximum RDY count for a client"),
            Flag(
                "max-output-buffer-size",
                I64,
                65536,
                "maximum client configurable size (in bytes) for a client output buffer",
            ),
            Flag(
                "max-output-buffer-timeout",
                D,
                "30s",
                "maximum client configurable duration of time between flushing to a client",
            ),
            Flag(
                "min-output-buffer-timeout",
                D,
                "25ms",
                "minimum client configurable duration of time between flushing to a client",
            ),
            Flag(
                "output-buffer-timeout",
                D,
                0.25,
                "default duration of time between flushing data to clients",
            ),
            Flag(
                "max-channel-consumers",
                INT,
                0,
                "maximum channel consumer connection count per nsqd instance (default 0, i.e., "
                "unlimited)",
            ),
            Flag(
                "statsd-address",
                S,
                "",
                "UDP <addr>:<port> of a statsd daemon for pushing stats",
            ),
            Flag("statsd-interval", D, "1m", "duration between pushing to statsd"),
            Flag("statsd-mem-stats", B, True, "toggle sending memory and GC stats to statsd"),
            Flag(
                "statsd-prefix",
                S,
                "nsq.%s",
                "prefix used for keys sent to statsd (%s for host replacement)",
            ),
            Flag(
                "statsd-udp-packet-size",
                INT,
                508,
                "the size in bytes of statsd UDP packets",
            ),
            Flag(
                "statsd-exclude-ephemeral",
                B,
                False,
                "Skip ephemeral topics and channels when sending stats to statsd",
            ),
            Flag(
                "e2e-processing-latency-percentile",
                Kind.FLOAT_LIST,
                (),
                "message processing time percentiles (as float (0, 1.0]) to track (can be "
                "specified multiple times or comma separated '1.0,0.99,0.95', default none)",
                config_key="e2e_processing_latency_percentiles",
            ),
            Flag(
                "e2e-processing-latency-window-time",
                D,
                "10m",
                "calculate end to end latency quantiles for this duration of time (ie: 60s "
                "would only show quantile calculations from the past 60 seconds)",
            ),
            Flag("tls-cert", S, "", "path to certificate file"),
            Flag("tls-key", S, "", "path to key file"),
            Flag(
                "tls-client-auth-policy",
                S,
                "",
                "client certificate auth policy ('require' or 'require-verify')",
            ),
            Flag("tls-root-ca-file", S, "", "path to certificate authority file"),
            Flag(
                "tls-required",
                Kind.VALUE,
                "false",
                "require TLS for client connections (true, false, tcp-https)",
                parse=parse_tls_required,
                bool_flag=True,
            ),
            Flag(
                "tls-min-version",
                Kind.VALUE,
                "tls1.0",
                "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or "
                "'tls1.3')",
                parse=parse_tls_min_version,
                default_text="tls1.0",
            ),
            Flag(
                "deflate",
                B,
                True,
                "enable deflate feature negotiation (client compression)",
            ),
            Flag(
                "max-deflate-level",
                INT,
                6,
                "max deflate compression level a client can negotiate (> values == > nsqd CPU "
                "usage)",
            ),
            Flag("snappy", B, True, "enable snappy feature negotiation (client compression)"),
        ],
    )


@pytest.fixture
def flags() -> FlagSet:
    return nsqd_flagset()


def parse(flags: FlagSet, *argv: str) -> tuple[dict, set, list]:
    values, explicitly_set, args = flags.parse(argv)
    return values, explicitly_set, args


def flag_error(flags: FlagSet, *argv: str) -> str:
    with pytest.raises(FlagError) as caught:
        flags.parse(argv)
    return str(caught.value)


# --- help ------------------------------------------------------------------------------------


def test_usage_matches_go_nsqd_help_byte_for_byte(flags: FlagSet) -> None:
    reference = (REFERENCE / "nsqd_help.txt").read_text()
    reference = reference.removesuffix("# exit status: 0\n")
    assert flags.usage() == reference


def test_usage_matches_go_nsqlookupd_help() -> None:
    flags = FlagSet(
        "nsqlookupd",
        [
            Flag("version", Kind.BOOL, False, "print version string", config_key=None),
            Flag("config", Kind.STRING, "", "path to config file", config_key=None),
            Flag(
                "log-level",
                Kind.VALUE,
                "info",
                "set log verbosity: debug, info, warn, error, or fatal",
                parse=parse_log_level,
                default_text="INFO",
            ),
            Flag("log-prefix", Kind.STRING, "[nsqlookupd] ", "log message prefix"),
            Flag("verbose", Kind.BOOL, False, "[deprecated] has no effect, use --log-level"),
            Flag(
                "tcp-address",
                Kind.STRING,
                "0.0.0.0:4160",
                "<addr>:<port> to listen on for TCP clients",
            ),
            Flag(
                "http-address",
                Kind.STRING,
                "0.0.0.0:4161",
                "<addr>:<port> to listen on for HTTP clients",
            ),
            Flag(
                "broadcast-address",
                Kind.STRING,
                "vm",
                "address of this lookupd node, (default to the OS hostname)",
            ),
            Flag(
                "inactive-producer-timeout",
                Kind.DURATION,
                300,
                "duration of time a producer will remain in the active list since its last ping",
            ),
            Flag(
                "tombstone-lifetime",
                Kind.DURATION,
                "45s",
                "duration of time a producer will remain tombstoned if registration remains",
            ),
        ],
    )
    reference = (REFERENCE / "nsqlookupd_help.txt").read_text()
    assert flags.usage() == reference.removesuffix("# exit status: 0\n")


@pytest.mark.parametrize("argv", [["-h"], ["-help"], ["--help"], ["--h"], ["-help=false"]])
def test_help_flags(flags: FlagSet, argv: list[str]) -> None:
    with pytest.raises(HelpRequested) as caught:
        flags.parse(argv)
    assert str(caught.value) == flags.usage()


def test_help_prints_usage_to_stderr_and_exits_0(flags: FlagSet) -> None:
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        flags.parse_or_exit(["-mem-queue-size=5", "--help", "-nonsense"], stderr=stderr)
    assert caught.value.code == 0
    assert stderr.getvalue() == flags.usage()


def test_flags_are_parsed_in_order_so_an_error_before_help_wins(flags: FlagSet) -> None:
    assert flag_error(flags, "-nonsense", "-h") == "flag provided but not defined: -nonsense"


def test_help_can_be_a_real_flag() -> None:
    flags = FlagSet("x", [Flag("h", Kind.BOOL, False, "my own h")])
    assert flags.parse(["-h"]).values == {"h": True}


def test_help_format_rules() -> None:
    flags = FlagSet(
        "tool",
        [
            Flag("v", Kind.BOOL, False, "one-letter bool: help on the same line"),
            Flag("n", Kind.INT, 3, "one-letter int keeps its type word"),
            Flag("dir", Kind.STRING, 'a\tb"c', "search `directory` for files"),
            Flag("ratio", Kind.FLOAT, 1e6, "ratio\nsecond line"),
            Flag("zero-ratio", Kind.FLOAT, 0, "zero float"),
            Flag("quarter", Kind.FLOAT, 0.25, "quarter"),
            Flag("peer", Kind.STRING_LIST, ["a", "b"], "list default"),
            Flag("pct", Kind.FLOAT_LIST, [0.5, 0.99], "float list default"),
            Flag("wait", Kind.DURATION, 0, "zero duration"),
            Flag("neg", Kind.DURATION, -1.5, "negative duration"),
            Flag("forced", Kind.INT, 0, "default_text wins", default_text="auto"),
        ],
    )
    assert flags.usage() == (
        "Usage of tool:\n"
        "  -dir directory\n"
        '    \tsearch directory for files (default "a\\tb\\"c")\n'
        "  -forced int\n"
        "    \tdefault_text wins (default auto)\n"
        "  -n int\n"
        "    \tone-letter int keeps its type word (default 3)\n"
        "  -neg duration\n"
        "    \tnegative duration (default -1.5s)\n"
        "  -pct value\n"
        "    \tfloat list default (default 0.500000,0.990000)\n"
        "  -peer value\n"
        "    \tlist default (default a,b)\n"
        "  -quarter float\n"
        "    \tquarter (default 0.25)\n"
        "  -ratio float\n"
        "    \tratio\n"
        "    \tsecond line (default 1e+06)\n"
        "  -v\tone-letter bool: help on the same line\n"
        "  -wait duration\n"
        "    \tzero duration\n"
        "  -zero-ratio float\n"
        "    \tzero float\n"
    )


def test_unnamed_flagset_usage_header() -> None:
    assert FlagSet("", []).usage() == "Usage:\n"


# --- syntax ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-mem-queue-size", "42"],
        ["-mem-queue-size=42"],
        ["--mem-queue-size", "42"],
        ["--mem-queue-size=42"],
    ],
)
def test_four_spellings_of_a_valued_flag(flags: FlagSet, argv: list[str]) -> None:
    values, explicitly_set, args = parse(flags, *argv)
    assert values["mem_queue_size"] == 42
    assert explicitly_set == {"mem_queue_size"}
    assert args == []


def test_harness_style_command_lines(flags: FlagSet) -> None:
    # gnsq's and ansq's command lines, mixing single- and double-dash (docs/design.md §11).
    values, explicitly_set, args = parse(
        flags,
        "--broadcast-address",
        "127.0.0.1",
        "--tcp-address",
        "127.0.0.1:0",
        "-http-address=127.0.0.1:0",
        "-lookupd-tcp-address",
        "127.0.0.1:4160",
        "--verbose",
        "--snappy",
        "--tls-cert=/tmp/cert.pem",
        "--data-path",
        "/tmp/x",
        "-msg-timeout=90s",
    )
    assert values["broadcast_address"] == "127.0.0.1"
    assert values["tcp_address"] == "127.0.0.1:0"
    assert values["http_address"] == "127.0.0.1:0"
    assert values["lookupd_tcp_address"] == ["127.0.0.1:4160"]
    assert values["verbose"] is True
    assert values["snappy"] is True
    assert values["tls_cert"] == "/tmp/cert.pem"
    assert values["data_path"] == "/tmp/x"
    assert values["msg_timeout"] == 90.0
    assert values["mem_queue_size"] == 10000
    assert explicitly_set == {
        "broadcast_address",
        "tcp_address",
        "http_address",
        "lookupd_tcp_address",
        "verbose",
        "snappy",
        "tls_cert",
        "data_path",
        "msg_timeout",
    }
    assert args == []


def test_defaults(flags: FlagSet) -> None:
    values, explicitly_set, args = parse(flags)
    assert explicitly_set == set()
    assert values["msg_timeout"] == 60.0
    assert values["output_buffer_timeout"] == 0.25
    assert values["snappy"] is True
    assert values["lookupd_tcp_address"] == []
    assert values["e2e_processing_latency_percentile"] == []
    assert values["log_prefix"] == "[nsqd] "
    assert values["tls_min_version"] == "tls1.0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("True", True),
        ("TRUE", True),
        ("t", True),
        ("T", True),
        ("1", True),
        ("false", False),
        ("False", False),
        ("FALSE", False),
        ("f", False),
        ("F", False),
        ("0", False),
    ],
)
def test_bool_values_like_strconv_parsebool(flags: FlagSet, text: str, expected: bool) -> None:
    for dashes in ("-", "--"):
        assert parse(flags, f"{dashes}snappy={text}")[0]["snappy"] is expected
        assert (
            parse(flags, f"{dashes}statsd-exclude-ephemeral={text}")[0]["statsd_exclude_ephemeral"]
            is expected
        )


@pytest.mark.parametrize("text", ["x", "tRUE", "yes", "on", "", "2"])
def test_bad_bool_values(flags: FlagSet, text: str) -> None:
    assert (
        flag_error(flags, f"--snappy={text}")
        == f'invalid boolean value "{text}" for -snappy: parse error'
    )


def test_bool_flag_does_not_consume_the_next_argument(flags: FlagSet) -> None:
    # Go: `-snappy false` sets snappy and stops at "false", so -deflate=false is NOT parsed.
    values, explicitly_set, args = parse(flags, "-snappy", "false", "-deflate=false")
    assert values["snappy"] is True
    assert values["deflate"] is True
    assert explicitly_set == {"snappy"}
    assert args == ["false", "-deflate=false"]


def test_valued_flag_consumes_the_next_argument_even_if_it_looks_like_a_flag(
    flags: FlagSet,
) -> None:
    values, _, args = parse(flags, "-data-path", "-snappy=false")
    assert values["data_path"] == "-snappy=false"
    assert values["snappy"] is True
    assert args == []


def test_negative_numbers_are_values(flags: FlagSet) -> None:
    assert parse(flags, "-mem-queue-size", "-1")[0]["mem_queue_size"] == -1


def test_equals_splits_at_the_first_equals(flags: FlagSet) -> None:
    assert parse(flags, "--statsd-prefix=a=b")[0]["statsd_prefix"] == "a=b"
    assert parse(flags, "--statsd-prefix=")[0]["statsd_prefix"] == ""


def test_repeated_list_flags_append_and_scalars_take_the_last(flags: FlagSet) -> None:
    values, explicitly_set, _ = parse(
        flags,
        "-lookupd-tcp-address=127.0.0.1:4160",
        "--lookupd-tcp-address",
        "127.0.0.1:4162",
        "-lookupd-tcp-address=a,b",  # StringArray does not split on commas
        "-mem-queue-size=1",
        "-mem-queue-size=2",
        "-snappy=false",
        "-snappy",
    )
    assert values["lookupd_tcp_address"] == ["127.0.0.1:4160", "127.0.0.1:4162", "a,b"]
    assert values["mem_queue_size"] == 2
    assert values["snappy"] is True
    assert explicitly_set == {"lookupd_tcp_address", "mem_queue_size", "snappy"}


def test_float_list_splits_commas_and_sorts_descending(flags: FlagSet) -> None:
    values, _, _ = parse(
        flags,
        "--e2e-processing-latency-percentile=0.5,1.0",
        "--e2e-processing-latency-percentile",
        "0.99",
    )
    assert values["e2e_processing_latency_percentile"] == [1.0, 0.99, 0.5]


def test_float_list_bad_item(flags: FlagSet) -> None:
    # FloatArray does not trim, so the space makes " 0.5" a parse error.
    assert flag_error(flags, "-e2e-processing-latency-percentile=0.9, 0.5") == (
        'invalid value "0.9, 0.5" for flag -e2e-processing-latency-percentile: parse error'
    )


def test_results_do_not_share_lists(flags: FlagSet) -> None:
    first = parse(flags, "-lookupd-tcp-address=a")[0]
    first["lookupd_tcp_address"].append("mutated")
    assert parse(flags)[0]["lookupd_tcp_address"] == []


def test_double_dash_ends_flags(flags: FlagSet) -> None:
    values, explicitly_set, args = parse(flags, "-snappy=false", "--", "-deflate=false", "x")
    assert values["snappy"] is False
    assert values["deflate"] is True
    assert explicitly_set == {"snappy"}
    assert args == ["-deflate=false", "x"]


def test_first_non_flag_ends_parsing(flags: FlagSet) -> None:
    # Go nsqd silently ignores everything after a stray word, flags included.
    values, _, args = parse(flags, "-snappy=false", "oops", "-mem-queue-size=5")
    assert values["mem_queue_size"] == 10000
    assert args == ["oops", "-mem-queue-size=5"]
    assert parse(flags, "-", "-snappy")[2] == ["-", "-snappy"]


def test_positional_args_can_be_rejected(flags: FlagSet) -> None:
    stderr = io.StringIO()
    assert flags.parse_or_exit(["x"], stderr=stderr).args == ["x"]
    with pytest.raises(SystemExit) as caught:
        flags.parse_or_exit(["x"], allow_args=False, stderr=stderr)
    assert caught.value.code == 2
    assert stderr.getvalue().startswith("unexpected argument: x\nUsage of nsqd:\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0x10", 16), ("0X10", 16), ("010", 8), ("0o10", 8), ("0b101", 5), ("1_000", 1000)],
)
def test_int_flags_take_go_literals(flags: FlagSet, text: str, expected: int) -> None:
    # strconv.ParseInt(s, 0, 64): note a leading 0 means octal.
    assert parse(flags, f"-mem-queue-size={text}")[0]["mem_queue_size"] == expected


def test_durations(flags: FlagSet) -> None:
    values, _, _ = parse(
        flags,
        "-msg-timeout=1m30s",
        "-sync-timeout",
        "1.5us",
        "-max-req-timeout=-1h",
        "--statsd-interval=0",
    )
    assert values["msg_timeout"] == 90.0
    assert values["sync_timeout"] == 1.5e-6
    assert values["max_req_timeout"] == -3600.0
    assert values["statsd_interval"] == 0.0


def test_value_flags(flags: FlagSet) -> None:
    values, _, _ = parse(flags, "-log-level=DEBUG", "--tls-min-version", "TLS1.2")
    assert values["log_level"] == "debug"
    assert values["tls_min_version"] == "tls1.2"


def test_bool_like_value_flag(flags: FlagSet) -> None:
    assert parse(flags, "-tls-required")[0]["tls_required"] == "true"
    assert parse(flags, "-tls-required=tcp-https")[0]["tls_required"] == "tcp-https"
    assert parse(flags, "-tls-required=false")[0]["tls_required"] == "false"
    # Like a bool, it does not take the next argument.
    assert parse(flags, "-tls-required", "tcp-https")[2] == ["tcp-https"]


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-foo"], "flag provided but not defined: -foo"),
        (["--foo=1"], "flag provided but not defined: -foo"),
        (["-Snappy"], "flag provided but not defined: -Snappy"),
        (["-tcp-address"], "flag needs an argument: -tcp-address"),
        (["--lookupd-tcp-address"], "flag needs an argument: -lookupd-tcp-address"),
        (["-mem-queue-size=x"], 'invalid value "x" for flag -mem-queue-size: parse error'),
        (["-mem-queue-size", "1.5"], 'invalid value "1.5" for flag -mem-queue-size: parse error'),
        (["-mem-queue-size="], 'invalid value "" for flag -mem-queue-size: parse error'),
        (
            ["-mem-queue-size=9223372036854775808"],
            'invalid value "9223372036854775808" for flag -mem-queue-size: value out of range',
        ),
        (["-max-deflate-level=0x"], 'invalid value "0x" for flag -max-deflate-level: parse error'),
        (["-msg-timeout=abc"], 'invalid value "abc" for flag -msg-timeout: parse error'),
        (["-msg-timeout=5"], 'invalid value "5" for flag -msg-timeout: parse error'),
        (["--msg-timeout", "1d"], 'invalid value "1d" for flag -msg-timeout: parse error'),
        (["-snappy=x"], 'invalid boolean value "x" for -snappy: parse error'),
        (
            ["-log-level=loud"],
            "invalid value \"loud\" for flag -log-level: invalid log level 'loud'",
        ),
        (
            ["-tls-required=maybe"],
            'invalid boolean value "maybe" for -tls-required: '
            'strconv.ParseBool: parsing "maybe": invalid syntax',
        ),
        (["---snappy"], "bad flag syntax: ---snappy"),
        (["-=x"], "bad flag syntax: -=x"),
        (["--=x"], "bad flag syntax: --=x"),
    ],
)
def test_error_messages_like_go(flags: FlagSet, argv: list[str], message: str) -> None:
    assert flag_error(flags, *argv) == message


def test_error_quotes_values_like_go(flags: FlagSet) -> None:
    assert flag_error(flags, '-mem-queue-size=a"\n\x01é') == (
        'invalid value "a\\"\\n\\x01é" for flag -mem-queue-size: parse error'
    )


def test_error_prints_message_and_usage_and_exits_2(flags: FlagSet) -> None:
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        flags.parse_or_exit(["-mem-queue-size=abc"], stderr=stderr)
    assert caught.value.code == 2
    assert stderr.getvalue() == (
        'invalid value "abc" for flag -mem-queue-size: parse error\n' + flags.usage()
    )


def test_exit_codes_of_a_real_process() -> None:
    program = (
        "import sys\n"
        "from nsqpy.common.flags import Flag, FlagSet, Kind\n"
        "flags = FlagSet('nsqd', [Flag('msg-timeout', Kind.DURATION, '1m', 'timeout')])\n"
        "values, _, _ = flags.parse_or_exit(sys.argv[1:])\n"
        "print(values['msg_timeout'])\n"
    )

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", program, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = run("-msg-timeout=2s")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "2.0\n", "")

    bad = run("--msg-timeout=abc")
    usage = "Usage of nsqd:\n  -msg-timeout duration\n    \ttimeout (default 1m0s)\n"
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr == 'invalid value "abc" for flag -msg-timeout: parse error\n' + usage

    helped = run("-help")
    assert (helped.returncode, helped.stdout, helped.stderr) == (0, "", usage)


# --- declaring flags -------------------------------------------------------------------------


def test_flag_keys(flags: FlagSet) -> None:
    assert flags["lookupd-tcp-address"].dest == "lookupd_tcp_address"
    assert flags["lookupd-tcp-address"].config_key == "nsqlookupd_tcp_addresses"
    assert flags["mem-queue-size"].config_key == "mem_queue_size"
    assert flags["config"].config_key is None


@pytest.mark.parametrize("name", ["", "-x", "a=b"])
def test_bad_flag_names(name: str) -> None:
    with pytest.raises(ValueError):
        Flag(name, Kind.STRING, "", "")


def test_redefined_flag() -> None:
    with pytest.raises(ValueError, match="flag redefined: x"):
        FlagSet("t", [Flag("x", Kind.BOOL, False, ""), Flag("x", Kind.INT, 0, "")])


def test_value_flag_needs_parse() -> None:
    with pytest.raises(ValueError):
        Flag("v", Kind.VALUE, None, "")


def test_wrongly_typed_defaults() -> None:
    with pytest.raises(TypeError):
        Flag("n", Kind.INT, "5", "")
    with pytest.raises(TypeError):
        Flag("b", Kind.BOOL, 1, "")


# --- config file -----------------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


def test_config_applies_under_explicit_flags(flags: FlagSet, tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
mem_queue_size = 5000
max_msg_size = "2048"
nsqlookupd_tcp_addresses = ["127.0.0.1:4160", "127.0.0.1:4162"]
lookupd_tcp_address = ["ignored: the flag name is not the config key"]
e2e_processing_latency_percentiles = [1, 0.99]
msg_timeout = "2s"
sync_timeout = 500
snappy = false
deflate = "false"
tcp_address = "0.0.0.0:5150"
http_address = "0.0.0.0:5151"
id = 42
log_level = "warn"
tls_required = true
tls_min_version = "tls1.2"
config = "ignored.cfg"
version = true
unknown_key = "ignored, as Go does"
""",
    )
    values, explicitly_set, _ = flags.parse(
        ["-config", path, "-tcp-address=127.0.0.1:4150", "-snappy=true", "-mem-queue-size=10000"]
    )
    merged = merge(values, explicitly_set, load_config(values["config"]), flags)
    # Given on the command line: the flag wins, even when it equals the default.
    assert merged["tcp_address"] == "127.0.0.1:4150"
    assert merged["snappy"] is True
    assert merged["mem_queue_size"] == 10000
    # Otherwise the file.
    assert merged["http_address"] == "0.0.0.0:5151"
    assert merged["max_msg_size"] == 2048
    assert merged["lookupd_tcp_address"] == ["127.0.0.1:4160", "127.0.0.1:4162"]
    assert merged["e2e_processing_latency_percentile"] == [1.0, 0.99]
    assert merged["msg_timeout"] == 2.0
    assert merged["sync_timeout"] == 0.5  # an integer duration is milliseconds (go-options)
    assert merged["deflate"] is False
    assert merged["node_id"] == 42
    assert merged["log_level"] == "warn"
    assert merged["tls_required"] == "true"
    assert merged["tls_min_version"] == "tls1.2"
    # config and version are not options: the file cannot set them.
    assert merged["config"] == path
    assert merged["version"] is False
    # Untouched.
    assert merged["max_rdy_count"] == 2500
    # The inputs are not modified.
    assert values["http_address"] == "0.0.0.0:4151"
    assert flags.unknown_config_keys(load_config(path)) == [
        "config",
        "lookupd_tcp_address",
        "unknown_key",
        "version",
    ]


def test_config_list_from_comma_string(flags: FlagSet) -> None:
    merged = merge(
        flags.defaults(),
        set(),
        {
            "nsqlookupd_tcp_addresses": "a:1,b:2",
            "e2e_processing_latency_percentiles": "0.5, 0.99",
        },
        flags,
    )
    assert merged["lookupd_tcp_address"] == ["a:1", "b:2"]
    assert merged["e2e_processing_latency_percentile"] == [0.5, 0.99]


def test_explicit_list_flag_replaces_config_list(flags: FlagSet) -> None:
    values, explicitly_set, _ = flags.parse(["-lookupd-tcp-address=c:3"])
    merged = merge(values, explicitly_set, {"nsqlookupd_tcp_addresses": ["a:1"]}, flags)
    assert merged["lookupd_tcp_address"] == ["c:3"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"mem_queue_size": 5000.5},
            "failed to coerce config value 5000.5 for mem_queue_size - "
            "invalid int64 value type float64",
        ),
        (
            {"mem_queue_size": True},
            "failed to coerce config value true for mem_queue_size - invalid int64 value type bool",
        ),
        (
            {"mem_queue_size": "0x10"},
            "failed to coerce config value 0x10 for mem_queue_size - "
            'strconv.ParseInt: parsing "0x10": invalid syntax',
        ),
        (
            {"mem_queue_size": 2**63},
            "failed to coerce config value 9223372036854775808 for mem_queue_size - "
            "value out of range",
        ),
        (
            {"msg_timeout": "5"},
            'failed to coerce config value 5 for msg_timeout - time: missing unit in duration "5"',
        ),
        (
            {"msg_timeout": 1.5},
            "failed to coerce config value 1.5 for msg_timeout - "
            "invalid time.Duration value type float64",
        ),
        (
            {"snappy": "yes"},
            'failed to coerce config value yes for snappy - strconv.ParseBool: parsing "yes": '
            "invalid syntax",
        ),
        (
            {"snappy": 1},
            "failed to coerce config value 1 for snappy - "
            "an integer is ambiguous for a boolean; use true or false",
        ),
        (
            {"tcp_address": 4150},
            "failed to coerce config value 4150 for tcp_address - invalid string value type int64",
        ),
        (
            {"nsqlookupd_tcp_addresses": ["a", 1]},
            "failed to coerce config value [a 1] for nsqlookupd_tcp_addresses - "
            "invalid string-list value type []interface {}",
        ),
        (
            {"e2e_processing_latency_percentiles": ["0.5"]},
            "failed to coerce config value [0.5] for e2e_processing_latency_percentiles - "
            "invalid float-list value type []interface {}",
        ),
        (
            {"log_level": "loud"},
            "failed to coerce config value loud for log_level - invalid log level 'loud'",
        ),
        (
            {"tls_min_version": ["tls1.2"]},
            "failed to coerce config value [tls1.2] for tls_min_version - "
            "invalid value value type []interface {}",
        ),
    ],
)
def test_config_type_errors_name_the_key(flags: FlagSet, config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        merge(flags.defaults(), set(), config, flags)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_config_errors_do_not_matter_for_explicit_flags(flags: FlagSet) -> None:
    values, explicitly_set, _ = flags.parse(["-mem-queue-size=7"])
    merged = merge(values, explicitly_set, {"mem_queue_size": "not a number"}, flags)
    assert merged["mem_queue_size"] == 7


def test_load_config_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.cfg")
    with pytest.raises(ConfigError, match=f"^failed to load config file {missing} - "):
        load_config(missing)
    broken = write_config(tmp_path, "mem_queue_size = = 1\n")
    with pytest.raises(ConfigError, match=f"^failed to load config file {broken} - "):
        load_config(broken)


def test_go_quote() -> None:
    assert go_quote("[nsqd] ") == '"[nsqd] "'
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("\t\n\r\a\b\f\v\x00\x7f") == '"\\t\\n\\r\\a\\b\\f\\v\\x00\\x7f"'
    assert go_quote("µs é") == '"µs é"'
    assert go_quote("\u00a0\u2028") == '"\\u00a0\\u2028"'
    assert go_quote("\udcff") == '"\\xff"'


# -- unknown config keys end the start ---------------------------------------------------------


def test_read_config_names_every_unknown_key_and_what_was_meant(tmp_path, flags) -> None:
    path = tmp_path / "nsqd.cfg"
    path.write_text('mem_queue_size = 5\nmem_queue_sise = 6\nlookupd_tcp_address = ["a:1"]\n')
    with pytest.raises(ConfigError) as caught:
        read_config(str(path), flags)
    assert str(caught.value) == (
        f"failed to load config file {path} - unknown keys "
        '"lookupd_tcp_address" (the config key of --lookupd-tcp-address is '
        '"nsqlookupd_tcp_addresses"), "mem_queue_sise"'
    )


def test_read_config_accepts_a_file_of_known_keys(tmp_path, flags) -> None:
    path = tmp_path / "nsqd.cfg"
    path.write_text('mem_queue_size = 5\nnsqlookupd_tcp_addresses = ["a:1"]\n')
    assert read_config(str(path), flags) == {
        "mem_queue_size": 5,
        "nsqlookupd_tcp_addresses": ["a:1"],
    }


@pytest.mark.parametrize("daemon", ["nsqd", "nsqlookupd", "nsqadmin"])
def test_a_daemon_given_an_unknown_config_key_exits_1_naming_it(tmp_path, daemon) -> None:
    path = tmp_path / f"{daemon}.cfg"
    path.write_text('log_level = "info"\nversion = true\n')
    result = subprocess.run(
        [str(BIN / daemon), f"-config={path}", "-http-address=127.0.0.1:0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].endswith(
        f"FATAL: failed to instantiate {daemon} - failed to load config file {path} - "
        'unknown key "version" (--version cannot be set in a config file)'
    )
    assert "listening" not in result.stderr

"""nsq_stat: poll `/stats` of every nsqd that has a topic and print the channel's aggregate
rates and depths every `--interval`, in Go `nsq_stat`'s table format (a header every 25
reports, the first report only primes the rates).
"""

import sys
import time
import urllib.error

from nsqpy.client.blocking import http_json
from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import StopFlag, fatal, log_flags, make_logger, parse_args

NAME = "nsq_stat"

# Go's Printf formats, kept as they are so the table lines up the same.
HEADER = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    + "%7s %7s | %7s %7s %7s %5s %5s | %7s %7s %12s %7s\n"  # noqa: UP031
    % ("ingress", "egress", "total", "mem", "disk", "inflt", "def", "req", "t-o", "msgs", "clients")
)
ROW = "%7d %7d | %7d %7d %7d %5d %5d | %7d %7d %12d %7d\n"


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "NSQ topic"),
        Flag("channel", Kind.STRING, "", "NSQ channel"),
        Flag("interval", Kind.DURATION, 2.0, "duration of time between polling/printing output"),
        Flag("http-client-connect-timeout", Kind.DURATION, 2.0, "timeout for HTTP connect"),
        Flag("http-client-request-timeout", Kind.DURATION, 5.0, "timeout for HTTP request"),
        Flag("count", Kind.INT, 0, "number of reports"),
        Flag(
            "nsqd-http-address",
            Kind.STRING_LIST,
            (),
            "nsqd HTTP address (may be given multiple times)",
        ),
        Flag(
            "lookupd-http-address",
            Kind.STRING_LIST,
            (),
            "lookupd HTTP address (may be given multiple times)",
        ),
        *log_flags(NAME),
    ]


FIELDS = (
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
)


def topic_producers(topic: str, nsqd_http: list[str], lookupd_http: list[str]) -> list[str]:
    """The HTTP addresses of the nsqds to ask: given, or every producer lookupd knows."""
    if not lookupd_http:
        return list(nsqd_http)
    producers: list[str] = []
    for lookupd in lookupd_http:
        try:
            document = http_json(lookupd, "/lookup", topic=topic)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue
            raise
        for producer in document.get("producers") or []:
            address = f"{producer['broadcast_address']}:{producer['http_port']}"
            if address not in producers:
                producers.append(address)
    return producers


def channel_stats(producers: list[str], topic: str, channel: str) -> dict | None:
    """The channel's stats summed over `producers`, with `memory_depth` and `client_count`;
    None when no nsqd has the channel."""
    total: dict | None = None
    for address in producers:
        stats = http_json(address, "/stats", format="json", topic=topic, channel=channel)
        for topic_stats in stats.get("topics") or []:
            if topic_stats["topic_name"] != topic:
                continue
            for stats_of_channel in topic_stats.get("channels") or []:
                if stats_of_channel["channel_name"] != channel:
                    continue
                if total is None:
                    total = dict.fromkeys((*FIELDS, "client_count"), 0)
                for field in FIELDS:
                    total[field] += stats_of_channel.get(field, 0)
                total["client_count"] += len(stats_of_channel.get("clients") or [])
    if total is not None:
        total["memory_depth"] = total["depth"] - total["backend_depth"]
    return total


def report(current: dict, previous: dict, interval: float) -> str:
    messages = current["message_count"] - previous["message_count"]
    depth_change = current["depth"] - previous["depth"]
    return ROW % (
        int(messages / interval),
        int((messages - depth_change) / interval),
        current["depth"],
        current["memory_depth"],
        current["backend_depth"],
        current["in_flight_count"],
        current["deferred_count"],
        current["requeue_count"],
        current["timeout_count"],
        current["message_count"],
        current["client_count"],
    )


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    topic, channel = values["topic"], values["channel"]
    if not topic or not channel:
        fatal(log, "--topic and --channel are required")
    interval = values["interval"]
    if interval <= 0:
        fatal(log, "--interval should be positive")
    if values["count"] < 0:
        fatal(log, "--count should be positive")
    nsqd_http, lookupd_http = values["nsqd_http_address"], values["lookupd_http_address"]
    if not nsqd_http and not lookupd_http:
        fatal(log, "--nsqd-http-address or --lookupd-http-address required")
    if nsqd_http and lookupd_http:
        fatal(log, "use --nsqd-http-address or --lookupd-http-address not both")
    for flag, addresses in (("nsqd", nsqd_http), ("lookupd", lookupd_http)):
        if any(address.startswith("http") for address in addresses):
            fatal(log, "--%s-http-address error - address should not contain scheme", flag)

    stop = StopFlag()
    count = values["count"]
    previous = None
    i = 0
    # Go's loop: `for i := 0; !countNum.isSet || countNum.value >= i; i++` -- the first
    # iteration only primes the rates, so --count N prints N rows.
    while not stop and (not count or count >= i):
        try:
            producers = topic_producers(topic, nsqd_http, lookupd_http)
        except (OSError, ValueError) as error:
            fatal(log, "ERROR: failed to get topic producers - %s", error)
        try:
            current = channel_stats(producers, topic, channel)
        except (OSError, ValueError) as error:
            fatal(log, "ERROR: failed to get nsqd stats - %s", error)
        if current is None:
            fatal(
                log,
                "ERROR: failed to find channel(%s) in stats metadata for topic(%s)",
                channel,
                topic,
            )
        if i % 25 == 0:
            sys.stdout.write(HEADER)
        if previous is not None:
            sys.stdout.write(report(current, previous, interval))
        sys.stdout.flush()
        previous = current
        i += 1
        if count and i > count:
            break
        # The report period itself, not a wait for a condition.
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

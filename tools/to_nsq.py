"""to_nsq: publish stdin to a topic, one message per `--delimiter`-separated record, as Go's
`to_nsq` does: every record goes to every `--nsqd-tcp-address`, empty records are skipped,
and `--rate N` throttles to N messages a second. `--ext-header '<json>'` publishes each record
with that JSON header (Youzan's PUB_EXT, to an ext topic: `##client_dispatch_tag`,
`##trace_id`, or any key; docs/protocol.md §3.6). `--lookupd-http-address` (nsqpy's) publishes
each record once to a partitioned topic, round-robin over its writable partitions at their
leaders, following them when they move (the smart client, docs/client.md).
"""

import json
import signal
import sys
import time

from nsqpy.client.blocking import NSQError, Producer
from nsqpy.client.security import Security
from nsqpy.client.smart import SmartClientError, SmartProducer
from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import Progress, fatal, log_flags, make_logger, parse_args
from nsqpy.tools._options import nsq_options

NAME = "to_nsq"


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "NSQ topic to publish to"),
        Flag(
            "delimiter",
            Kind.STRING,
            "\n",
            "character to split input from stdin",
        ),
        Flag(
            "nsqd-tcp-address",
            Kind.STRING_LIST,
            (),
            "destination nsqd TCP address (may be given multiple times)",
        ),
        Flag(
            "lookupd-http-address",
            Kind.STRING_LIST,
            (),
            "[nsqpy] publish to the leaders of a partitioned topic's partitions, found through"
            " these nsqlookupds and followed when they move (may be given multiple times)",
        ),
        Flag("rate", Kind.INT, 0, "Throttle messages to n/second. 0 to disable"),
        Flag(
            "ext-header",
            Kind.STRING,
            "",
            "JSON object sent as each message's header (PUB_EXT, for Youzan ext topics)",
        ),
        Flag(
            "producer-opt",
            Kind.STRING_LIST,
            (),
            "option to passthrough to nsq.Producer (may be given multiple times)",
        ),
        *log_flags(NAME),
    ]


class _Interrupted(Exception):
    pass


class LeaderProducer:
    """`Producer`'s publishing side over the smart client (docs/client.md): round-robin over
    a partitioned topic's writable partitions, each at its current leader."""

    def __init__(
        self, lookupd_http_addresses: list[str], identify: dict, security: Security
    ) -> None:
        self.producer = SmartProducer(lookupd_http_addresses, identify=identify, security=security)

    def publish(self, topic: str, body: bytes) -> None:
        try:
            self.producer.publish(topic, body)
        except SmartClientError as error:
            raise NSQError(str(error)) from None

    def publish_ext(self, topic: str, header: bytes, body: bytes) -> None:
        raise NSQError("--ext-header is not supported with --lookupd-http-address")

    def close(self) -> None:
        self.producer.close()


class Throttle:
    """At most `rate` calls of `wait()` a second (0: no limit); sleeps off the surplus."""

    def __init__(self, rate: int) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next_at = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next_at > now:
            time.sleep(self.next_at - now)
        self.next_at = max(self.next_at, now) + self.interval


def records(stream, delimiter: bytes, chunk_size: int = 64 * 1024):
    """The non-empty records of `stream` split on `delimiter` (a trailing record without a
    delimiter counts too)."""
    pending = b""
    while True:
        chunk = stream.read1(chunk_size) if hasattr(stream, "read1") else stream.read(chunk_size)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(delimiter)
        for record in complete:
            if record:
                yield record
    if pending:
        yield pending


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    topic = values["topic"]
    if not topic:
        fatal(log, "--topic required")
    delimiter = values["delimiter"].encode()
    if len(delimiter) != 1:
        fatal(log, "--delimiter must be a single byte")
    if values["nsqd_tcp_address"] and values["lookupd_http_address"]:
        fatal(log, "use --nsqd-tcp-address or --lookupd-http-address not both")
    if not values["nsqd_tcp_address"] and not values["lookupd_http_address"]:
        fatal(log, "--nsqd-tcp-address or --lookupd-http-address required")
    if values["rate"] < 0:
        fatal(log, "--rate must be >= 0")
    producer_options = nsq_options(log, values, "producer-opt")
    identify = producer_options.identify(f"{NAME}/nsqpy")
    security = producer_options.security
    ext_header = None
    if values["ext_header"]:
        try:
            fields = json.loads(values["ext_header"])
        except ValueError as error:
            fatal(log, "--ext-header is not JSON - %s", error)
        if not isinstance(fields, dict):
            fatal(log, "--ext-header must be a JSON object")
        ext_header = values["ext_header"].encode()

    # A signal while we wait on stdin ends the reading; one during a publish lets it finish
    # (nsqd's OK arrives) before we stop.
    state = {"publishing": False, "stop": False}

    def on_signal(signum, frame) -> None:
        state["stop"] = True
        if not state["publishing"]:
            raise _Interrupted

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    producers: list[Producer | LeaderProducer] = []
    try:
        for address in values["nsqd_tcp_address"]:
            producers.append(Producer(address, identify=identify, security=security))
        if values["lookupd_http_address"]:
            producers.append(LeaderProducer(values["lookupd_http_address"], identify, security))
    except (OSError, NSQError) as error:
        fatal(log, "failed to create nsq.Producer - %s", error)
    throttle = Throttle(values["rate"])
    progress = Progress()
    status = 0
    try:
        for record in records(sys.stdin.buffer, delimiter):
            throttle.wait()
            state["publishing"] = True
            for producer in producers:
                if ext_header is None:
                    producer.publish(topic, record)
                else:
                    producer.publish_ext(topic, ext_header, record)
            state["publishing"] = False
            progress.add()
            if state["stop"]:
                break
    except _Interrupted:
        pass
    except (OSError, NSQError) as error:
        log.critical("%s", error)
        status = 1
    finally:
        progress.close()
        for producer in producers:
            producer.close()
    return status


if __name__ == "__main__":
    sys.exit(main())

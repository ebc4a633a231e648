"""nsq_to_nsq: copy a topic's messages to another topic or cluster, as Go's `nsq_to_nsq`.

Each message is published to one `--destination-nsqd-tcp-address` (`--mode round-robin`, or
`hostpool`/`epsilon-greedy`, which also fall back to the next nsqd when one fails) on
`--destination-topic` (the source topic by default), and FINished once the destination
answered `OK`; a failed publish REQueues it.
"""

import itertools
import sys

from nsqpy.client.blocking import NSQError, Producer
from nsqpy.client.security import Security
from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import (
    ConsumerGroup,
    Progress,
    StopFlag,
    address_flags,
    check_sources,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
    settle,
)
from nsqpy.tools._options import consumer_settings, nsq_options

NAME = "nsq_to_nsq"
MODES = ("round-robin", "hostpool", "epsilon-greedy")


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "nsq topic"),
        Flag("channel", Kind.STRING, "nsq_to_nsq", "nsq channel"),
        Flag(
            "destination-topic",
            Kind.STRING,
            "",
            "use this destination topic for all consumed topics (default is consumed topic name)",
        ),
        Flag("max-in-flight", Kind.INT, 200, "max number of messages to allow in flight"),
        Flag(
            "mode",
            Kind.STRING,
            "hostpool",
            "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
        ),
        Flag(
            "status-every",
            Kind.INT,
            250,
            "the # of requests between logging status (per destination), 0 disables",
        ),
        Flag(
            "destination-nsqd-tcp-address",
            Kind.STRING_LIST,
            (),
            "destination nsqd TCP address (may be given multiple times)",
        ),
        *address_flags(),
        consumer_opt_flag(),
        Flag(
            "producer-opt",
            Kind.STRING_LIST,
            (),
            "option to passthrough to nsq.Producer (may be given multiple times)",
        ),
        *log_flags(NAME),
    ]


class Destinations:
    """Producers to the destination nsqds, reconnected when a connection breaks."""

    def __init__(
        self, addresses: list[str], mode: str, log, identify: dict, security: Security
    ) -> None:
        self.addresses = addresses
        self.identify = identify
        self.security = security
        self.mode = mode
        self.log = log
        self.producers: dict[str, Producer] = {}
        self._turn = itertools.cycle(range(len(addresses)))

    def publish(self, topic: str, body: bytes) -> str | None:
        """Publish `body`; None once an nsqd answered OK, else why not."""
        first = next(self._turn)
        tries = 1 if self.mode == "round-robin" else len(self.addresses)
        error = None
        for offset in range(tries):
            address = self.addresses[(first + offset) % len(self.addresses)]
            try:
                producer = self.producers.get(address)
                if producer is None:
                    producer = Producer(address, identify=self.identify, security=self.security)
                    self.producers[address] = producer
                producer.publish(topic, body)
                return None
            except (OSError, NSQError) as failure:
                error = f"{address}: {failure}"
                broken = self.producers.pop(address, None)
                if broken is not None:
                    broken.close()
        return error

    def close(self) -> None:
        for producer in self.producers.values():
            producer.close()


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    topic = values["topic"]
    if not topic:
        fatal(log, "--topic is required")
    check_sources(log, values)
    settings = consumer_settings(log, values, f"{NAME}/nsqpy")
    if not values["destination_nsqd_tcp_address"]:
        fatal(log, "--destination-nsqd-tcp-address required")
    if values["mode"] not in MODES:
        fatal(log, "invalid --mode %r (one of %s)", values["mode"], ", ".join(MODES))
    destination_topic = values["destination_topic"] or topic
    producer_options = nsq_options(log, values, "producer-opt")
    destinations = Destinations(
        list(values["destination_nsqd_tcp_address"]),
        values["mode"],
        log,
        producer_options.identify(f"{NAME}/nsqpy"),
        producer_options.security,
    )
    stop = StopFlag()
    group = ConsumerGroup(
        [topic],
        values["channel"],
        nsqd_tcp_addresses=values["nsqd_tcp_address"],
        lookupd_http_addresses=values["lookupd_http_address"],
        log=log,
        **settings,
    )
    progress = Progress()

    def copy(message) -> None:
        error = destinations.publish(destination_topic, message.body)
        settle(
            group,
            message,
            None if error is None else f"publish failed - {error}",
            progress=progress,
            log=log,
            status_every=values["status_every"],
            done="copied",
        )

    try:
        while not stop:
            message = group.receive()
            if message is not None:
                copy(message)
        group.start_close()
        for message in group.drain():
            copy(message)
    finally:
        progress.close()
        group.close()
        destinations.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

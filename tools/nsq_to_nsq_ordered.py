"""nsq_to_nsq_ordered: Youzan's ordered copy of a topic to another (or another cluster's).

It reads `--topic`/`--channel` in order (SUB_ORDERED on every partition, through
`--lookupd-http-address`) and publishes each message to `--destination-topic` (the same name
by default) through `--destination-lookupd-address` (the same nsqlookupds by default) on the
partition its key says, so the messages of one key keep their order. The key is the JSON
body's `--order-json-key` value; when that is an object, its `key2` (Youzan's tool reads only
that); a number counts as its decimal text. A message without one is requeued and logged, as
Youzan's handler refuses it. Each message is FINished once the destination answered OK, and
requeued when the publish failed. `--parall-num` is taken for Youzan's scripts: one handler
copies the messages one after another, which is what keeps their order.
"""

import json
import sys

from nsqpy.client.smart import PublishFailed, SmartConsumer, SmartProducer
from nsqpy.common.flags import Flag, Kind
from nsqpy.common.names import is_valid_name
from nsqpy.tools._common import (
    Progress,
    StopFlag,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
)
from nsqpy.tools._options import nsq_options

NAME = "nsq_to_nsq_ordered"
REQUEUE_DELAY_MS = 1000


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "nsq topic"),
        Flag("channel", Kind.STRING, "nsq_to_nsq", "nsq channel"),
        Flag("destination-topic", Kind.STRING, "", "destination nsq topic"),
        Flag("max-in-flight", Kind.INT, 200, "max number of messages to allow in flight"),
        Flag("parall-num", Kind.INT, 100, "number of parallel run"),
        Flag("order-json-key", Kind.STRING, "testkey", "json key to ordered sharding"),
        Flag(
            "status-every",
            Kind.INT,
            250,
            "the # of requests between logging status (per destination), 0 disables",
        ),
        Flag(
            "lookupd-http-address",
            Kind.STRING_LIST,
            (),
            "lookupd HTTP address (may be given multiple times)",
        ),
        Flag(
            "destination-lookupd-address",
            Kind.STRING_LIST,
            (),
            "destination address (may be given multiple times)",
        ),
        consumer_opt_flag(),
        Flag(
            "producer-opt",
            Kind.STRING_LIST,
            (),
            "option to passthrough to nsq.Producer (may be given multiple times)",
        ),
        *log_flags(NAME),
    ]


def order_key(body: bytes, name: str) -> str | None:
    """The ordering key of a JSON body (see the module docstring), or None."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    value = document.get(name) if isinstance(document, dict) else None
    if isinstance(value, dict):
        value = value.get("key2")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | str):
        return str(value)
    return None


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    topic, channel = values["topic"], values["channel"]
    if not topic or not channel:
        fatal(log, "--topic and --channel are required")
    destination = values["destination_topic"] or topic
    if not is_valid_name(topic):
        fatal(log, "--topic is invalid")
    if not is_valid_name(destination):
        fatal(log, "--destination-topic is invalid")
    if not is_valid_name(channel):
        fatal(log, "--channel is invalid")
    lookupds = list(values["lookupd_http_address"])
    if not lookupds:
        fatal(log, "--lookupd-http-address required")
    destination_lookupds = list(values["destination_lookupd_address"]) or lookupds
    consumer_options = nsq_options(log, values)
    producer_options = nsq_options(log, values, "producer-opt")
    stop = StopFlag()
    producer = SmartProducer(
        destination_lookupds,
        identify=producer_options.identify(f"{NAME}/nsqpy"),
        security=producer_options.security,
    )
    consumer = SmartConsumer(
        lookupds,
        topic,
        channel,
        max_in_flight=values["max_in_flight"],
        ordered=True,
        identify=consumer_options.identify(f"{NAME}/nsqpy"),
        security=consumer_options.security,
    )
    progress = Progress()
    copied = 0
    key_name = values["order_json_key"]
    try:
        while not stop:
            message = consumer.receive(timeout=0.25)
            if message is None:
                continue
            key = order_key(message.body, key_name)
            if key is None:
                log.error("no %r key in the message body: %r", key_name, message.body[:200])
                message.requeue(REQUEUE_DELAY_MS)
                continue
            try:
                producer.publish(destination, message.body, key=key)
            except PublishFailed as error:
                log.error("publish failed - %s", error)
                message.requeue(REQUEUE_DELAY_MS)
                continue
            message.finish()
            copied += 1
            progress.add(1)
            if values["status_every"] and copied % values["status_every"] == 0:
                log.info("copied %d messages", copied)
    finally:
        progress.close()
        consumer.close()
        producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

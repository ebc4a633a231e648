"""nsq_tail: print the messages of one or more topics to stdout, as Go's `nsq_tail` does.

Each body is written followed by a newline (with `--print-topic`, prefixed by `topic | `);
`-n N` exits after N messages. Without `--channel` it reads through an ephemeral channel
`tail<6 digits>#ephemeral`, so it never leaves a channel behind.

For Youzan ext topics (docs/protocol.md §3.6): `--ext` reads them (IDENTIFY with
`extend_support`) and prints each message's JSON header before its body (`header | body`,
`{}` for none); `--desired-tag T` receives only the messages dispatched to tag T.

`--partitioned` (nsqpy's) reads every partition of partitioned topics at their leaders, found
through `--lookupd-http-address` and followed when they move (the smart client,
docs/client.md).
"""

import random
import sys

from nsqpy.client.core import split_ext_section
from nsqpy.client.smart import SmartConsumer
from nsqpy.common.flags import Flag, Kind
from nsqpy.tools._common import (
    ConsumerGroup,
    StopFlag,
    address_flags,
    check_sources,
    consumer_opt_flag,
    fatal,
    log_flags,
    make_logger,
    parse_args,
)
from nsqpy.tools._options import consumer_settings

NAME = "nsq_tail"


def flags() -> list[Flag]:
    return [
        Flag("channel", Kind.STRING, "", "NSQ channel"),
        Flag("topic", Kind.STRING_LIST, (), "NSQ topic (may be given multiple times)"),
        Flag("max-in-flight", Kind.INT, 200, "max number of messages to allow in flight"),
        Flag("n", Kind.INT, 0, "total messages to show (will wait if starved)"),
        Flag("print-topic", Kind.BOOL, False, "print topic name where message was received"),
        Flag(
            "ext",
            Kind.BOOL,
            False,
            "read Youzan ext topics and print each message's JSON header before its body",
        ),
        Flag(
            "desired-tag",
            Kind.STRING,
            "",
            "ext topics: receive only the messages whose ##client_dispatch_tag is this (implies"
            " --ext)",
        ),
        Flag(
            "partitioned",
            Kind.BOOL,
            False,
            "[nsqpy] read every partition of partitioned topics from their leaders, found"
            " through --lookupd-http-address and followed when they move",
        ),
        *address_flags(),
        consumer_opt_flag(),
        *log_flags(NAME),
    ]


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, values)
    channel = values["channel"] or f"tail{random.randrange(999999):06d}#ephemeral"
    topics = list(values["topic"])
    if not topics:
        fatal(log, "--topic is required")
    check_sources(log, values)
    settings = consumer_settings(log, values, f"{NAME}/nsqpy")
    ext = values["ext"] or bool(values["desired_tag"])
    if ext:
        settings["identify"]["extend_support"] = True
        if values["desired_tag"]:
            settings["identify"]["desired_tag"] = values["desired_tag"]
    total = values["n"]
    # Don't ask for more messages than we want (Go does the same).
    if 0 < total < settings["max_in_flight"]:
        settings["max_in_flight"] = total
    stop = StopFlag()
    if values["partitioned"]:
        if not values["lookupd_http_address"]:
            fatal(log, "--partitioned needs --lookupd-http-address")
        return tail_partitions(values, topics, channel, settings, ext, total, stop)
    group = ConsumerGroup(
        topics,
        channel,
        nsqd_tcp_addresses=values["nsqd_tcp_address"],
        lookupd_http_addresses=values["lookupd_http_address"],
        log=log,
        **settings,
    )
    out = sys.stdout.buffer
    shown = 0

    def show(message) -> None:
        nonlocal shown
        if values["print_topic"]:
            out.write(message.consumer.topic.encode() + b" | ")
        body = message.body
        if ext:
            header, body = split_ext_section(body)
            out.write((header or b"{}") + b" | ")
        out.write(body + b"\n")
        out.flush()
        group.finish(message)
        shown += 1

    try:
        while not stop and not (total and shown >= total):
            message = group.receive()
            if message is not None:
                show(message)
        group.start_close()
        for message in group.drain():
            if total and shown >= total:
                group.requeue(message)
            else:
                show(message)
    except BrokenPipeError:
        pass
    finally:
        group.close()
    return 0


def tail_partitions(values, topics, channel, settings, ext, total, stop) -> int:
    """`--partitioned`: one smart consumer per topic (docs/client.md), each reading every
    partition at its leader."""
    out = sys.stdout.buffer
    shown = 0
    consumers = [
        SmartConsumer(
            values["lookupd_http_address"],
            topic,
            channel,
            max_in_flight=settings["max_in_flight"],
            identify=settings["identify"],
            security=settings["security"],
        )
        for topic in topics
    ]
    try:
        while not stop and not (total and shown >= total):
            for consumer in consumers:
                message = consumer.receive(timeout=0.1)
                if message is None:
                    continue
                if values["print_topic"]:
                    out.write(consumer.topic.encode() + b" | ")
                if ext:
                    out.write((message.ext_header or b"{}") + b" | ")
                out.write(message.body + b"\n")
                out.flush()
                message.finish()
                shown += 1
                if total and shown >= total:
                    break
    except BrokenPipeError:
        pass
    finally:
        for consumer in consumers:
            consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

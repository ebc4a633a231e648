"""Which reader a topic gets: the replayable one for log topics, the classic one otherwise.

The `source` option says it outright ("log" or "classic"); by default ("auto") the nsqds are
asked: a log topic answers `/partition/offsets`, a classic one says `NOT_A_LOG_TOPIC`, and a
topic nobody has yet is classic (NSQ creates classic topics when a consumer subscribes).
"""

from collections.abc import Mapping

from nsqpy.spark import options as opts
from nsqpy.spark.partition_directory import NotALogTopic, PartitionDirectory

KINDS = ("auto", "log", "classic")


def reads_a_log(options: Mapping[str, str]) -> bool:
    kind = (options.get("source") or "auto").lower()
    if kind not in KINDS:
        raise ValueError(f'the nsq option "source" is one of {", ".join(KINDS)}, not {kind!r}')
    if kind != "auto":
        return kind == "log"
    lookupd = opts.address_list(options.get("lookupd"))
    nsqd_http = opts.address_list(options.get("nsqd_http"))
    if not lookupd and not nsqd_http:
        return False
    directory = PartitionDirectory(
        opts.required(options, "topic"),
        lookupd=lookupd,
        nsqd_http=nsqd_http,
        security=opts.security(options),
    )
    try:
        return bool(directory.partitions())
    except NotALogTopic:
        return False

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
    """Whether the source's topics are log topics: `subscribePattern` and `assign` read log
    topics only; the topics of `topic` or `subscribe` are asked about, and must be all of one
    kind."""
    kind = (options.get("source") or "auto").lower()
    if kind not in KINDS:
        raise ValueError(f'the nsq option "source" is one of {", ".join(KINDS)}, not {kind!r}')
    selection = opts.topic_selection(options)
    if selection.pattern is not None or selection.assigned is not None:
        if kind == "classic":
            raise ValueError(
                'the nsq options "subscribePattern" and "assign" read log topics, not classic ones'
            )
        return True
    if kind != "auto":
        return kind == "log"
    lookupd = opts.address_list(options.get("lookupd"))
    nsqd_http = opts.address_list(options.get("nsqd_http"))
    if not lookupd and not nsqd_http:
        return False
    # True: a log topic; False: a classic one; None: no nsqd holds it yet.
    kinds: dict[str, bool | None] = {}
    for topic in selection.topics:
        directory = PartitionDirectory(
            topic, lookupd=lookupd, nsqd_http=nsqd_http, security=opts.security(options)
        )
        try:
            kinds[topic] = True if directory.partitions() else None
        except NotALogTopic:
            kinds[topic] = False
    found = set(kinds.values()) - {None}
    if len(found) > 1:
        logs = ", ".join(repr(topic) for topic, log in kinds.items() if log)
        classic = ", ".join(repr(topic) for topic, log in kinds.items() if log is False)
        raise ValueError(
            f"nsq: one query reads log topics or classic topics, not both: {logs} are log"
            f" topics, {classic} classic"
        )
    return found == {True}

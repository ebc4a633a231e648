"""nsq_data_tool: Youzan's offline reader of a partition's data, for nsqpy's log layout. It
reads the files of one partition in an nsqd data directory, read only (nsqd may run or not),
and prints, as Youzan's does:

* `-view=commitlog`: the commit-log index entries from a message on (`-search_mode` count, id,
  virtual_offset or nsqpy's timestamp), each as Go prints the entry struct,
  `{LogID Epoch LastMsgLogID MsgOffset MsgSize MsgCnt MsgNum}`;
* `-view=topicdata`: the messages from there on, `offset:size` then `id:trace id:timestamp:
  attempts, body: <body>` (the ID in decimal, as Youzan's clients see it);
* `-view=delayedqueue`: the delay queue's count per channel, and the entries of
  `-view_channel` (every channel's without it) soonest due first;
* `-view=channels` (nsqpy's): each channel's confirmed position, the ranges it acknowledged
  beyond it and what it deferred in memory;
* `-view=check` (nsqpy's): every group of the retained log against its index entry, one line
  per corrupt group (what nsqd's `/topic/fixdata?checkcorrupt=true` finds), and the exit
  status 1 when there is one.
"""

import sys
import time

from nsqpy.common.flags import Flag, Kind
from nsqpy.partition_log.index import ENTRY
from nsqpy.partition_log.records import Position
from nsqpy.partition_log.view import LogView
from nsqpy.tools._common import fatal, make_logger, parse_args

NAME = "nsq_data_tool"
VIEWS = ("commitlog", "topicdata", "delayedqueue", "channels", "check")
MAX_VIEW_COUNT = 1_000_000


def flags() -> list[Flag]:
    return [
        Flag("topic", Kind.STRING, "", "NSQ topic"),
        Flag("partition", Kind.INT, -1, "NSQ topic partition"),
        Flag("data_path", Kind.STRING, "", "the data path of nsqd"),
        Flag(
            "view",
            Kind.STRING,
            "commitlog",
            "commitlog | topicdata | delayedqueue | channels | check",
        ),
        Flag(
            "search_mode",
            Kind.STRING,
            "count",
            "the view start of mode. (count|id|timestamp|virtual_offset)",
        ),
        Flag("view_start", Kind.INT64, 0, "the start count of message."),
        Flag("view_start_id", Kind.INT64, 0, "the start id of message."),
        Flag("view_start_timestamp", Kind.INT64, 0, "the start timestamp of message."),
        Flag("view_offset", Kind.INT64, 0, "the virtual offset of the queue"),
        Flag(
            "view_cnt",
            Kind.INT,
            1,
            "the total count need to be viewed. should less than 1,000,000",
        ),
        Flag("view_channel", Kind.STRING, "", "channel detail need to view"),
        Flag("level", Kind.INT, 3, "log level"),
        Flag("ext", Kind.BOOL, False, "is there extension for message (read from each record)"),
    ]


def go_entry(entry) -> str:
    return "{" + " ".join(str(field) for field in entry) + "}"


def search_value(values: dict) -> tuple[str, int]:
    mode = values["search_mode"]
    if mode == "count":
        return mode, values["view_start"]
    if mode == "id":
        return mode, values["view_start_id"]
    if mode == "virtual_offset":
        # Youzan's reads `view_start_id` here; nsqpy the flag the help names.
        return mode, values["view_offset"]
    if mode == "timestamp":
        return mode, values["view_start_timestamp"] * 1_000_000_000
    raise ValueError("not supported search mode")


def main(argv: list[str] | None = None) -> int:
    values = parse_args(NAME, flags(), argv)
    log = make_logger(NAME, {"log_prefix": f"[{NAME}] "})
    if not values["topic"]:
        fatal(log, "--topic is required")
    if values["partition"] == -1:
        fatal(log, "--partition is required")
    if not values["data_path"]:
        fatal(log, "--data_path is required")
    if values["view_cnt"] > MAX_VIEW_COUNT:
        fatal(log, "--view_cnt is too large")
    if values["view"] not in VIEWS:
        fatal(log, "--view must be one of %s", " | ".join(VIEWS))
    try:
        view = LogView(values["data_path"], values["topic"], values["partition"])
    except OSError as error:
        fatal(log, "loading commit log failed: %s", error)
    try:
        status = show(view, values)
    except (OSError, ValueError) as error:
        fatal(log, "%s", error)
    finally:
        view.close()
    return status


def show(view: LogView, values: dict) -> int:
    out = sys.stdout
    count = values["view_cnt"]
    last = view.last_entry
    if last is not None:
        position = view.active_entries - 1 if view.active_entries else 0
        out.write(
            f"topic last commit log at {view.index_number}:{position * ENTRY.size} is :"
            f" {go_entry(last)}\n"
        )
    if values["view"] == "delayedqueue":
        counts, rows = view.delayed(values["view_channel"], count)
        for channel, number in sorted(counts.items()):
            out.write(f"channel {channel} cnt : {number}\n")
        now_ms = int(time.time() * 1000)
        for channel, message_id, offset, record_count, due in rows:
            state = "out" if due >= 1 << 52 else f"due in {(due - now_ms) / 1000:.1f}s"
            out.write(
                f"peeked channel msg : {channel} {message_id} at {offset}:{record_count}, {state}\n"
            )
        return 0
    if values["view"] == "check":
        corrupt = 0
        for fault in view.faults():
            corrupt += 1
            out.write(f"corrupt group {go_entry(fault.entry)}: {fault.reason}\n")
        checked = view.index.total - view.first_retained
        out.write(f"checked {checked} groups: {corrupt} corrupt\n")
        return 1 if corrupt else 0
    if values["view"] == "channels":
        start, end = view.start, view.end
        out.write(f"log start {start.offset}:{start.count}, end {end.offset}:{end.count}\n")
        for kept in view.channels():
            if values["view_channel"] and kept.name != values["view_channel"]:
                continue
            confirmed = (
                f"{kept.confirmed.offset}:{kept.confirmed.count}"
                if kept.confirmed is not None
                else "-"
            )
            out.write(
                f"channel {kept.name} confirmed {confirmed},"
                f" acknowledged ranges {kept.ranges}, deferred {len(kept.deferred)}\n"
            )
        return 0
    mode, value = search_value(values)
    first = view.entry_at(mode, value)
    entry = view.index.entry(first)
    out.write(f"topic read at: {first}:{first * ENTRY.size}, {go_entry(entry)}\n")
    if values["view"] == "commitlog":
        for entry in view.index.entries(first, count):
            out.write(go_entry(entry) + "\n")
        return 0
    start = Position(entry[3], entry[5] - 1)
    if mode == "virtual_offset" and value != entry[3]:
        start = Position(value, entry[5] - 1)
    for message in view.records(start, count + _before(view, start, mode, value)):
        if mode == "count" and message.count < value:
            continue
        if mode == "id" and int(message.id, 16) < value:
            continue
        if mode == "timestamp" and message.timestamp < value:
            continue
        out.write(f"{message.offset}:{message.count}\n")
        out.write(
            f"{int(message.id, 16)}:{message.trace_id}:{message.timestamp}:{message.attempts},"
            f" body: {message.body.decode('utf-8', 'replace')}\n"
        )
        count -= 1
        if count <= 0:
            break
    return 0


def _before(view: LogView, start: Position, mode: str, value: int) -> int:
    """How many messages of the group come before the one searched for (read and passed)."""
    if mode == "count":
        return max(value - start.count, 0)
    return 0 if mode == "virtual_offset" else MAX_VIEW_COUNT


if __name__ == "__main__":
    sys.exit(main())

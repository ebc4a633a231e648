"""Youzan's `/topic/fixdata`: a partition's log checked against its commit-log index, and
what is wrong with it repaired (docs/operations.md, "Corrupt data").

The check reads the files on their own (`LogView`, in a worker thread) while the partition
goes on taking publishes and retention goes on removing old segments: what it finds before
the retained start by the time it ends is retention's, not a fault. A group whose bytes do
not hold the records its index entry names is then, in this order:

1. **written again from another replica's copy** (a cluster's leader or ISR member:
   followers write their leader's groups byte for byte, so the copy is the group itself);
2. **cut off**, when no copy exists and it and everything after it are corrupt (a torn or
   zeroed tail): the log ends before it, and channels that had read past it read on from
   there;
3. **skipped** otherwise: a channel that meets it goes on right after it, and one ERROR line
   says so (without fixdata, a reader skips to the next segment).
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from nsqpy.nsqd.message_queue import LogTopicQueue
from nsqpy.partition_log import Position
from nsqpy.partition_log.index import entry_end
from nsqpy.partition_log.view import GroupFault, LogView

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic


@dataclass
class DataFix:
    """What one `/topic/fixdata` found and did on one partition."""

    checked: int = 0
    faults: list[GroupFault] = field(default_factory=list)
    repaired: int = 0
    cut_back_to: Position | None = None
    skipped: int = 0


async def fix_partition(nsqd: "NSQD", topic: "Topic", *, check_corrupt: bool) -> DataFix:
    """Check every group from the retained start (`check_corrupt`), or the first and the
    last ones (where a crash or a lost disk leaves its marks), and repair what is wrong."""
    queue = topic.queue
    fix = DataFix()
    if not isinstance(queue, LogTopicQueue):
        return fix  # a classic topic's diskqueue is checked as it is read
    log = queue.log

    def check() -> tuple[list[GroupFault], int, Position]:
        view = LogView(nsqd.data_path, topic.name, topic.partition)
        try:
            first, total = view.first_retained, view.index.total
            positions: range | list[int] = range(first, total)
            if not check_corrupt and total - first > 2:
                positions = [first, total - 1]
            return list(view.faults(positions)), len(positions), view.end
        finally:
            view.close()

    faults, fix.checked, checked_end = await trio.to_thread.run_sync(check)
    # Retention may have removed the first of them meanwhile.
    fix.faults = [fault for fault in faults if fault.entry[3] >= log.start.offset]
    left: list[GroupFault] = []
    for fault in fix.faults:
        nsqd.log.error(
            "TOPIC(%s) partition %d: the group at offset %d (%d messages from count %d) is"
            " corrupt - %s",
            topic.name,
            topic.partition,
            fault.entry[3],
            fault.entry[6],
            fault.entry[5] - 1,
            fault.reason,
        )
        copy = None
        if nsqd.cluster.enabled:
            copy = await nsqd.cluster.sync.copy_of_group(topic, fault.entry)
        if copy is not None and not topic.deleted:
            log.repair_group(fault.entry, copy)
            fix.repaired += 1
            nsqd.log.warning(
                "TOPIC(%s) partition %d: the group at offset %d written again from another"
                " replica's copy",
                topic.name,
                topic.partition,
                fault.entry[3],
            )
        else:
            left.append(fault)
    if not left or topic.deleted:
        return fix
    # The corrupt groups that run to the end of what was checked: the tail.
    tail = len(left)
    if Position(*entry_end(left[-1].entry)) == checked_end:
        tail -= 1
        while tail > 0 and left[tail - 1].position == left[tail].position - 1:
            tail -= 1
    if tail < len(left) and log.written == checked_end and queue.writer.idle:
        first = left[tail]
        cut = Position(first.entry[3], first.entry[5] - 1)
        try:
            log.truncate_to(cut)
        except ValueError as error:
            nsqd.log.error(
                "TOPIC(%s) partition %d: the corrupt tail stays - %s",
                topic.name,
                topic.partition,
                error,
            )
        else:
            fix.cut_back_to = cut
            left = left[:tail]
            for cursor in queue.open_cursors():
                if cursor.read_position.offset > cut.offset:
                    cursor.set_position(min(cursor.confirmed, cut, key=lambda p: p.offset))
    for fault in left:
        log.skip_corrupt_group(fault.entry)
        fix.skipped += 1
    return fix
